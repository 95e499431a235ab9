"""Run a schedule: allocate buffers, compile kernels (cached per device and AST), launch them, copy between devices.

BUFFER uops map to device Buffers through `BUFFERS` (weakly: a Buffer lives as long as its uop is referenced).
DEBUG=1 prints each schedule's kernel count and time; DEBUG=2 each kernel with its time, GFLOPS and GB/s;
DEBUG=4 the generated source; DEBUG=5 each kernel's AST; DEBUG=6 also its linearized program.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from plugrad.codegen import ProgramSpec, get_program, kernel_name
from plugrad.codegen.gpudims import uses_gpudims
from plugrad.codegen.heuristic import heuristic_opts
from plugrad.codegen.pack import split_packs
from plugrad.device import Buffer, Device, Program
from plugrad.dtype import DType, dtypes
from plugrad.engine.search import beam_opts
from plugrad.helpers import getenv
from plugrad.schedule.kernelize import ScheduleItem
from plugrad.uop.ops import Ops, UOp, pretty
from plugrad.viz import capture, profile

def buffer_for(u: UOp) -> Buffer:
  """The device Buffer behind a BUFFER uop (created, unallocated, on first use). It is kept in the uop's cache, so it
  lives exactly as long as the uop."""
  if (c := u._cache) is not None and (b := c.get("buffer")) is not None: return b
  if u.op is Ops.BUFFER:
    b = Buffer(u.src[1].arg, u.arg, u.dtype)
    if c is not None and c.get("internal"): b.internal = True
  elif u.op is Ops.BUFFER_VIEW: b = buffer_for(u.src[0]).view(u.arg[0], u.dtype, u.arg[1])
  else: raise TypeError(f"buffer_for needs a BUFFER or BUFFER_VIEW uop, got {u.op}")
  u._cached()["buffer"] = b
  return b


def set_buffer(u: UOp, b: Buffer) -> Buffer:
  """Make `b` the Buffer behind BUFFER uop `u` (a fresh output whose Buffer the caller built)."""
  if u.op is not Ops.BUFFER or b.size != u.arg or b.dtype != u.dtype: raise ValueError(f"buffer {b!r} doesn't match {u.op} {u.dtype} {u.arg}")
  u._cached()["buffer"] = b
  return b


@dataclass
class PackStep:
  """A packing kernel that runs before its main kernel (codegen/pack.py): computes from slots `srcs` of the schedule
  item's buffers into `scratch`, a (size, dtype) view of `pool`. The pair always runs back to back, so the packs at one
  position of their kernels share one pool on a device: the next pair's pack overwrites it only after this main kernel
  read it (kernels of a device run in order; one kernel run concurrently from two threads would race on its own
  scratch anyway)."""
  runner: CompiledRunner
  srcs: tuple[int, ...]
  size: int
  dtype: DType
  pool: PackScratch

  @property
  def scratch(self) -> Buffer: return self.pool.view(self.size, self.dtype)


@dataclass
class CompiledRunner:
  spec: ProgramSpec
  prg: Program
  device: str
  packs: tuple[PackStep, ...] = ()
  slots: tuple[int, ...] | None = None  # with packs: each parameter's buffer (>= 0: the item's slot, -1-j: packs[j].scratch)


class PackScratch:
  """The memory of the `nth` pack of a kernel on a device, shared by every such pack whatever its size and dtype (see
  PackStep): one buffer of the largest reserved size (a 135M-parameter LLM's prefill packs four weight shapes: 3.5 MB
  instead of 8.9). A larger reservation replaces the buffer; views handed out before keep the old one alive while
  ExecItems hold them. Devices without offset views get a buffer per (size, dtype)."""

  def __init__(self, device: str) -> None:
    self.device, self.nbytes, self.base = device, 0, None
    self._views: dict[tuple[int, DType], Buffer] = {}

  def reserve(self, nbytes: int) -> None:
    if nbytes > self.nbytes: self.nbytes, self.base, self._views = nbytes, None, {}

  def view(self, size: int, dtype: DType) -> Buffer:
    if (v := self._views.get((size, dtype))) is None:
      if not Device[self.device].allocator.supports_offset: v = Buffer(self.device, size, dtype).ensure_allocated()
      else:
        if self.base is None: self.base = Buffer(self.device, self.nbytes, dtypes.uint8).ensure_allocated()
        v = self.base.view(size, dtype).ensure_allocated()
      self._views[(size, dtype)] = v
    return v


_RUNNERS: dict[tuple[str, UOp], CompiledRunner] = {}
_PACK_SCRATCH: dict[tuple[str, int], PackScratch] = {}


def pack_scratch(device: str, nth: int, nbytes: int) -> PackScratch:
  """The pool of the `nth` pack of a kernel on `device` (a kernel packing two operands needs two), reserved to hold
  at least `nbytes`."""
  if (p := _PACK_SCRATCH.get(key := (device, nth))) is None: p = _PACK_SCRATCH[key] = PackScratch(device)
  p.reserve(nbytes)
  return p


GlobalCounters = {"kernels": 0, "compiles": 0}


def get_runner(device: str, ast: UOp) -> CompiledRunner:
  """The compiled program for `ast` on `device` (compiled once per process, and cached on disk by the compiler)."""
  if (r := _RUNNERS.get((device, ast))) is not None: return r
  dev = Device[device]
  plan = None
  with capture.group("kernel", lambda: f"{kernel_name(ast)} {device}") as g:  # VIZ=1: codegen passes grouped per kernel
    opts = beam_opts(ast, device)  # searched (BEAM) or cached by an earlier search; None: the heuristic
    if opts is None and dev.renderer.caps.vector_lanes and not uses_gpudims(dev.renderer.caps) and not getenv("NOOPT", 0):
      heur = heuristic_opts(ast, dev.renderer.caps)  # PACK (a kernel of its own, codegen/pack.py) is only chosen with vector lanes
      if any(o.kind == "PACK" for o in heur): opts = heur
    if opts is not None and any(o.kind == "PACK" for o in opts):
      capture.annotate("opts", opts)  # VIZ=1: shown with the kernel
      plan = split_packs(ast, opts)
      spec = get_program(plan.ast, dev.renderer, plan.opts)
    else: spec = get_program(ast, dev.renderer) if opts is None else get_program(ast, dev.renderer, opts)
    if g is not None: g.info.update(name=spec.name, device=device, ast=ast, spec=spec)
  if (debug := getenv("DEBUG", 0)) >= 5:
    print(f"kernel {spec.name} AST:\n{pretty(ast, max_lines=1 << 30)}")
    if debug >= 6: print("linearized:\n" + "\n".join(f"  {i:4d} {u.op.name:14s} {u.dtype!r:40s} {u.arg!r}" for i, u in enumerate(spec.uops)))
  if debug >= 4: print(spec.src)
  lib = dev.compiler.compile_cached(spec.src)
  GlobalCounters["compiles"] += 1
  packs: tuple[PackStep, ...] = ()
  if plan is not None:
    packs = tuple(PackStep(get_runner(device, pk.ast), pk.srcs, pk.size, pk.dtype, pack_scratch(device, nth, pk.size * pk.dtype.itemsize))
                  for nth, pk in enumerate(plan.packs))
  # the runner keeps its spec without the linear uops (the source holds the program; VIZ's record and DEBUG>=6 saw
  # them above): runners live as long as the process, and their uops were ~6,000 of a 135M LLM's ~21,000 live UOps, 4.9 MB
  r = _RUNNERS[(device, ast)] = CompiledRunner(replace(spec, uops=[]), dev.load(spec.name, lib), device, packs,
                                               None if plan is None else tuple(plan.slots))
  return r


@dataclass
class ExecItem:
  """One runnable step: a compiled kernel over Buffers (runner set) or a buffer copy (runner None)."""
  runner: CompiledRunner | None
  bufs: list[Buffer]
  var_vals: dict[str, int]
  pre: list[ExecItem] = field(default_factory=list)  # packing kernels run first (codegen/pack.py)

  def run(self, var_vals: dict[str, int] | None = None, wait: bool = False) -> float | None:
    pre = sum(p.run(var_vals, wait) or 0.0 for p in self.pre) if self.pre else 0.0
    if capture.PROFILE: return profile.run_item(self, var_vals)  # PROFILE=1: timed and recorded (plugrad/viz/profile.py)
    et = self._run(var_vals, wait)
    return et + pre if et is not None else None

  def _run(self, var_vals: dict[str, int] | None, wait: bool) -> float | None:
    if self.runner is None:
      self.bufs[0].copy_from(self.bufs[1])
      return None
    spec = self.runner.spec
    if spec.vars:
      vv = self.var_vals if var_vals is None else var_vals
      vals = tuple(vv[v.arg[0]] if v.arg[0] in vv else _missing(v) for v in spec.vars)
    else: vals = ()
    GlobalCounters["kernels"] += 1
    if spec.local_size is None: return self.runner.prg(*[b._buf for b in self.bufs], vals=vals, wait=wait)  # loops (CPU): its own mapping
    glb, lcl = spec.launch_dims({v.arg[0]: x for v, x in zip(spec.vars, vals)})
    return self.runner.prg(*[b._buf for b in self.bufs], global_size=glb, local_size=lcl, vals=vals, wait=wait)


CAPTURING: list[list[ExecItem]] = []  # TinyJit pushes a list here to record the ExecItems that run


def exec_item(runner: CompiledRunner | None, bufs: list[Buffer], vv: dict[str, int]) -> ExecItem:
  """The ExecItem of `runner` (None: a copy) over allocated `bufs`; a runner with packing kernels gets them as `pre`."""
  if runner is None or runner.slots is None: return ExecItem(runner, bufs, vv)
  pre = [ExecItem(p.runner, [p.scratch.ensure_allocated(), *[bufs[s] for s in p.srcs]], vv) for p in runner.packs]
  return ExecItem(runner, [bufs[s] if s >= 0 else runner.packs[-1 - s].scratch for s in runner.slots], vv, pre)


def lower_item(it: ScheduleItem) -> ExecItem:
  """The ExecItem for a schedule item: allocate its buffers and get (compile) its program."""
  bufs = [buffer_for(b).ensure_allocated() for b in it.bufs]
  runner = None if it.ast.op is Ops.COPY else get_runner(bufs[0].device, it.ast)
  return exec_item(runner, bufs, {v.arg[0]: val for v, val in it.var_vals.items()})


def _run_one(ei: ExecItem, debug: int) -> None:
  et = ei.run(wait=debug >= 2)
  if CAPTURING: CAPTURING[-1].extend([*ei.pre, ExecItem(ei.runner, ei.bufs, ei.var_vals)] if ei.pre else [ei])
  if debug >= 2 and et is not None and ei.runner is not None:
    spec = ei.runner.spec
    flops = profile.kernel_flops(spec, ei.var_vals)
    print(f"  {ei.runner.device:8s} {spec.name:30s} {et * 1e6:9.1f} us  {flops / max(et, 1e-9) / 1e9:8.2f} GFLOPS "
          f"{spec.mem_bytes / max(et, 1e-9) / 1e9:8.2f} GB/s")


def run_schedule(items: list[ScheduleItem]) -> None:
  """Execute schedule items in order (recording them when a TinyJit is capturing)."""
  debug = getenv("DEBUG", 0)
  st = time.perf_counter()
  for it in items: _run_one(lower_item(it), debug)
  if debug >= 1 and items:
    print(f"schedule: {len(items)} items in {(time.perf_counter() - st) * 1e3:.2f} ms")


def run_exec_items(eis: list[ExecItem], debug: int) -> None:
  """Run ExecItems lowered already (a cached plan, engine/plan.py) exactly as run_schedule runs its items."""
  st = time.perf_counter() if debug >= 1 else 0.0
  for ei in eis: _run_one(ei, debug)
  if debug >= 1 and eis:
    print(f"schedule: {len(eis)} items in {(time.perf_counter() - st) * 1e3:.2f} ms")


def _missing(v: UOp):
  raise RuntimeError(f"kernel needs a value for variable {v.arg[0]!r}, which was not bound")
