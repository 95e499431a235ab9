"""What VIZ=1 and PROFILE=1 record while a program runs (standard library only: the rewrite engine and the runtime
import this module, so it must stay below them).

VIZ=1: every `graph_rewrite` call becomes a `RewriteRecord` (input graph, each rule application as
(rule function, node before, node after), output) inside a `Group` naming what ran it: `group(kind, name)` is a
context manager the scheduler ("schedule") and the engine (one "kernel" group per compiled kernel, with its AST,
optimizations, linear program and source in `info`) open; a rewrite outside any group lands in a "symbolic" group
(the symbolic simplifier's `simplify`) or a "rewrite" group named after the call.

PROFILE=1: every kernel launch, copy and JIT replay is a `ProfileEvent` (device, start/end on the host's
perf_counter clock, bytes, FLOPs, and the device-measured seconds when the backend returns them), and every buffer
allocation or free moves a per-device "bytes in use" counter sampled over time.

When a flag is off the hooks cost one module-attribute test each (`if capture.VIZ:` / `if capture.PROFILE:`). When on,
recording is bounded: past VIZ_MAX_REWRITES rewrites, VIZ_MAX_STEPS rule applications or PROFILE_MAX_EVENTS events,
nothing more is kept and the trace is marked truncated (the viewer shows "trace truncated").
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from plugrad.helpers import getenv

VIZ: bool = getenv("VIZ", False)
PROFILE: bool = getenv("PROFILE", False)
MAX_REWRITES: int = getenv("VIZ_MAX_REWRITES", 20000)
MAX_STEPS: int = getenv("VIZ_MAX_STEPS", 200000)
MAX_EVENTS: int = getenv("PROFILE_MAX_EVENTS", 1_000_000)
SYMBOLIC_NAMES = frozenset({"simplify", "stride", "lane", "lane stride"})


@dataclass
class RewriteRecord:
  """One graph_rewrite call: `steps` are (rule function or matcher name, node before, node after) in applied order."""
  name: str
  sink: Any
  walk: bool
  enter_calls: bool
  steps: list[tuple[Any, Any, Any]] = field(default_factory=list)
  out: Any = None
  truncated: bool = False


@dataclass
class Group:
  """The rewrites one piece of work ran, in order; kernels keep their codegen results in `info`."""
  kind: str
  name: str
  rewrites: list[RewriteRecord] = field(default_factory=list)
  info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProfileEvent:
  """A kernel launch ("kernel"), buffer copy ("copy") or JIT replay ("jit"); times in perf_counter nanoseconds."""
  kind: str
  name: str
  device: str
  st: int
  en: int
  nbytes: int = 0
  flops: int = 0
  device_s: float | None = None


@dataclass(frozen=True)
class WaveInst:
  """One instruction a traced wave issued: its byte offset in the kernel's code, its disassembly, the cycle it issued
  at, the cycles until the wave's next instruction issued (its stalls included), and its kind ("VALU", "SALU", "SMEM",
  "VMEM", "LDS", "BRANCH", "WAIT", "BARRIER", "OTHER")."""
  pc: int
  text: str
  cycle: int
  duration: int
  kind: str


@dataclass
class WaveTrace:
  """One wave's life: where it ran (shader engine, CU, SIMD, wave slot), the cycles it started and ended at, and the
  instructions traced for it (empty for a wave on a SIMD whose instructions were not traced)."""
  se: int
  cu: int
  simd: int
  slot: int
  start: int
  end: int
  insts: list[WaveInst] = field(default_factory=list)


@dataclass
class KernelTrace:
  """A kernel launch's device-side instruction trace (SQTT on AMD): its waves on the device's clock (`clock_hz`), the
  host perf_counter time (ns) its launch was submitted at, and whether the device dropped part of it (buffer full)."""
  device: str
  kernel: str
  st: int
  clock_hz: float
  waves: list[WaveTrace]
  truncated: bool = False


class Trace:
  """Everything recorded in this process (one instance, `TRACE`)."""
  def __init__(self) -> None: self.clear()

  def clear(self) -> None:
    self.groups: list[Group] = []
    self.stack: list[Group] = []
    self.n_rewrites = self.n_steps = 0
    self.truncated = False
    self.events: list[ProfileEvent] = []
    self.mem: list[tuple[int, str, int]] = []  # (time ns, device, bytes in use after the change)
    self.in_use: dict[str, int] = {}
    self.mem_epoch = getattr(self, "mem_epoch", 0) + 1   # buffers counted in by this recording (see mem_change)
    self.profile_truncated = False
    self.kernel_traces: list[KernelTrace] = []
    self.n_trace_items = 0
    self.t0 = time.perf_counter_ns()

  def _group_for(self, name: str) -> Group:
    if self.stack: return self.stack[-1]
    kind = "symbolic" if name in SYMBOLIC_NAMES else "rewrite"
    gname = "symbolic simplifier" if kind == "symbolic" else name
    if not self.groups or self.groups[-1].kind != kind or self.groups[-1].name != gname: self.groups.append(Group(kind, gname))
    return self.groups[-1]

  def begin_rewrite(self, name: str, sink: Any, walk: bool, enter_calls: bool) -> RewriteRecord | None:
    """A record for a starting graph_rewrite (None once the cap is reached)."""
    if self.n_rewrites >= MAX_REWRITES:
      self.truncated = True
      return None
    self.n_rewrites += 1
    rec = RewriteRecord(name, sink, walk, enter_calls)
    self._group_for(name).rewrites.append(rec)
    return rec

  def step(self, rec: RewriteRecord, rule: Any, before: Any, after: Any) -> None:
    if rec.truncated: return
    if self.n_steps >= MAX_STEPS:
      rec.truncated = self.truncated = True
      return
    self.n_steps += 1
    rec.steps.append((rule, before, after))

  def event(self, ev: ProfileEvent) -> None:
    if len(self.events) >= MAX_EVENTS: self.profile_truncated = True
    else: self.events.append(ev)

  def kernel_trace(self, kt: KernelTrace) -> None:
    """Keep a device's instruction trace of one launch (bounded like events: by PROFILE_MAX_EVENTS instructions)."""
    n = sum(len(w.insts) + 1 for w in kt.waves)
    if self.n_trace_items + n > MAX_EVENTS: self.profile_truncated = True
    else: self.kernel_traces.append(kt); self.n_trace_items += n

  def mem_change(self, device: str, delta: int) -> None:
    """Bytes allocated (delta > 0) or freed on `device`. Callers report a free only for a buffer whose allocation this
    recording counted (its `mem_epoch`): one allocated before would take the counter below zero."""
    now = self.in_use[device] = self.in_use.get(device, 0) + delta
    if len(self.mem) >= MAX_EVENTS: self.profile_truncated = True
    else: self.mem.append((time.perf_counter_ns(), device, now))


TRACE = Trace()


class _GroupContext:
  __slots__ = ("group",)
  def __init__(self, g: Group) -> None: self.group = g
  def __enter__(self) -> Group:
    TRACE.groups.append(self.group)
    TRACE.stack.append(self.group)
    return self.group
  def __exit__(self, *exc: Any) -> None: TRACE.stack.remove(self.group)


class _NullContext:
  __slots__ = ()
  def __enter__(self) -> None: return None
  def __exit__(self, *exc: Any) -> None: return None


_NULL = _NullContext()


def group(kind: str, name: str | Callable[[], str]) -> Any:
  """`with group("schedule", "...") as g:` puts the rewrites run inside into a new group (g is None when VIZ is
  off; `name` may be a callable, evaluated only when VIZ is on)."""
  if not VIZ: return _NULL
  return _GroupContext(Group(kind, name() if callable(name) else name))


def annotate(key: str, value: Any) -> None:
  """Attach `value` to the innermost open group's info (e.g. the optimizations a kernel got); no-op when VIZ is off."""
  if VIZ and TRACE.stack: TRACE.stack[-1].info[key] = value


def now() -> int: return time.perf_counter_ns()


def enable(viz: bool | None = None, profile: bool | None = None) -> None:
  """Turn recording on or off in-process (tests; the VIZ/PROFILE environment variables set the start state)."""
  global VIZ, PROFILE
  if viz is not None: VIZ = viz
  if profile is not None: PROFILE = profile
