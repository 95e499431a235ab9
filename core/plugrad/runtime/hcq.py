"""HCQ: the hardware-command-queue layer GPU plugins build on.

A device exposes queues that the host fills with commands and submits; completion is tracked with `Signal`s
(a 64-bit value plus the time it was written) that both sides can read and write. The same API fits:
  - ioctl drivers (NV, AMD): `_encode` turns commands into packet words once, remembering where each `Var` lands;
    `_submit` patches those words with the submit-time values and rings the doorbell;
  - a vendor runtime (CUDA/HIP streams): `_submit` walks `resolved()` commands and issues stream calls
    (signal = stream write-value/event record, wait = stream wait-value/event wait, exec = launch, copy = memcpyAsync);
  - the pure-software reference in `plugrad.runtime.softhcq`.

Values patchable at submit: any integer argument (signal values, sizes, addresses, byte counts) may be a `Var`.
A queue is recorded once and submitted many times with `submit(dev, {"name": value})` (or defaults from `bind`).
"""
from __future__ import annotations
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union
from plugrad.device import BufferOptions, Compiled, CompilerArg, LRUAllocator, Program
from plugrad.runtime.renderer import Renderer

# ---------------------------------------------------------------------------- patchable values

@dataclass(frozen=True)
class Var:
  """A named integer filled in at submit time; `Var("t") + 1` is the same variable plus a constant."""
  name: str
  offset: int = 0
  def __add__(self, k: int) -> Var: return Var(self.name, self.offset + k)
  def __sub__(self, k: int) -> Var: return Var(self.name, self.offset - k)
  def resolve(self, var_vals: dict[str, int]) -> int: return var_vals[self.name] + self.offset

Value = Union[int, Var]

def resolve(x: Any, var_vals: dict[str, int]) -> Any:
  """Replace Vars (also inside tuples/lists) by their values."""
  if isinstance(x, Var): return x.resolve(var_vals)
  if isinstance(x, (tuple, list)): return type(x)(resolve(y, var_vals) for y in x)
  return x

def _vars_in(x: Any) -> set[str]:
  if isinstance(x, Var): return {x.name}
  if isinstance(x, (tuple, list)): return set().union(*(_vars_in(y) for y in x)) if x else set()
  return set()

def _check_value(what: str, v: Any, minimum: int = 0) -> None:
  if isinstance(v, Var): return
  if not isinstance(v, int) or isinstance(v, bool) or v < minimum: raise ValueError(f"{what} must be an int >= {minimum} or a Var, got {v!r}")

# ---------------------------------------------------------------------------- signals

class Signal:
  """A monotonically increasing value in memory shared by host and device, plus the timestamp of its last write.

  Backends implement `_read_value`, `_write_value` and `_read_timestamp` (raw ticks; `ticks_per_second` converts).
  """
  ticks_per_second: float = 1e9

  def __init__(self, dev: HCQCompiled | None = None, value: int = 0) -> None:
    self.dev = dev
    self.value = value

  @property
  def value(self) -> int: return self._read_value()
  @value.setter
  def value(self, v: int) -> None: self._write_value(v)
  @property
  def timestamp(self) -> float:
    """Seconds (device clock) at which the signal was last written by a signal or timestamp command."""
    return self._read_timestamp() / self.ticks_per_second

  def wait(self, value: int, timeout_ms: int = 30000) -> None:
    """Block until value >= `value`; TimeoutError after `timeout_ms` milliseconds. Device faults surface here."""
    deadline, spins = time.monotonic() + timeout_ms / 1000, 0
    while (cur := self.value) < value:
      if self.dev is not None: self.dev.check_fault()
      if time.monotonic() > deadline:
        raise TimeoutError(f"{self!r} did not reach {value} within {timeout_ms} ms (current value {cur}); "
                           "the device may be hung or the queue that signals it was never submitted")
      spins += 1
      if spins > 100: time.sleep(0.0001)

  def __repr__(self) -> str: return f"<{type(self).__name__} value={self.value}{' on ' + self.dev.device if self.dev else ''}>"

  def _read_value(self) -> int: raise NotImplementedError
  def _write_value(self, v: int) -> None: raise NotImplementedError
  def _read_timestamp(self) -> int: raise NotImplementedError

# ---------------------------------------------------------------------------- queues

@dataclass(frozen=True)
class Command:
  """One recorded command: `op` in signal/wait/timestamp/memory_barrier/exec/copy and its arguments (may hold Vars)."""
  op: str
  args: tuple[Any, ...]

class HWQueue:
  """A recordable, replayable command queue. Methods are fluent; `submit` can be called many times.

  Backends override `_submit(dev, encoded, var_vals)` and optionally `_encode(cmds)` (run once, cached until the
  queue changes). Simple backends call `self.resolved(var_vals)` inside `_submit`.
  """
  def __init__(self) -> None:
    self.cmds: list[Command] = []
    self._binds: dict[str, int] = {}
    self._encoded: Any = None

  def _add(self, op: str, *args: Any) -> HWQueue:
    self.cmds.append(Command(op, args))
    self._encoded = None
    return self

  def signal(self, sig: Signal, value: Value) -> HWQueue:
    """Write `value` to `sig` (and its timestamp) once all previous commands are done."""
    if not isinstance(sig, Signal): raise TypeError(f"signal() needs a Signal, got {sig!r}")
    _check_value("signal value", value)
    return self._add("signal", sig, value)

  def wait(self, sig: Signal, value: Value) -> HWQueue:
    """Stall the queue until `sig` >= `value`."""
    if not isinstance(sig, Signal): raise TypeError(f"wait() needs a Signal, got {sig!r}")
    _check_value("wait value", value)
    return self._add("wait", sig, value)

  def timestamp(self, sig: Signal) -> HWQueue:
    """Record the device time into `sig`'s timestamp (its value is unchanged)."""
    if not isinstance(sig, Signal): raise TypeError(f"timestamp() needs a Signal, got {sig!r}")
    return self._add("timestamp", sig)

  def memory_barrier(self) -> HWQueue:
    """Make writes by earlier commands visible to later ones (cache flush/invalidate)."""
    return self._add("memory_barrier")

  def exec(self, prg: HCQProgram, args_state: HCQArgsState, global_size: Sequence[Value], local_size: Sequence[Value]) -> HWQueue:
    """Launch `prg` with its prepared arguments on a grid of `global_size` workgroups of `local_size` threads."""
    for what, dims in (("global_size", global_size), ("local_size", local_size)):
      if not isinstance(dims, (tuple, list)) or not 1 <= len(dims) <= 3: raise ValueError(f"exec {what} must be 1 to 3 dims, got {dims!r}")
      for d in dims: _check_value(f"exec {what} entry", d, 1)
    return self._add("exec", prg, args_state, tuple(global_size), tuple(local_size))

  def copy(self, dest: Value, src: Value, nbytes: Value) -> HWQueue:
    """Copy `nbytes` from device address `src` to `dest`."""
    _check_value("copy dest", dest); _check_value("copy src", src); _check_value("copy nbytes", nbytes)
    return self._add("copy", dest, src, nbytes)

  def variables(self) -> set[str]:
    """Names of the Vars this queue needs at submit."""
    return set().union(*(_vars_in(c.args) for c in self.cmds)) if self.cmds else set()

  def bind(self, **var_vals: int) -> HWQueue:
    """Default values for Vars, used when `submit` does not give them."""
    self._binds.update(var_vals)
    return self

  def resolved(self, var_vals: dict[str, int]) -> list[Command]:
    """The commands with every Var replaced by its value."""
    return [Command(c.op, resolve(c.args, var_vals)) for c in self.cmds]

  def submit(self, dev: HCQCompiled, var_vals: dict[str, int] | None = None) -> HWQueue:
    """Hand the recorded commands to `dev`, with Vars taking values from `var_vals`, then `bind` defaults."""
    vals = {**self._binds, **(var_vals or {})}
    if (missing := self.variables() - vals.keys()): raise ValueError(f"submit: no value for queue variable(s) {sorted(missing)}")
    if self._encoded is None: self._encoded = self._encode(self.cmds)
    self._submit(dev, self._encoded, vals)
    return self

  def _encode(self, cmds: list[Command]) -> Any:
    """Backend hook: translate commands once (e.g. to packet words plus patch locations). Default: keep them."""
    return cmds

  def _submit(self, dev: HCQCompiled, encoded: Any, var_vals: dict[str, int]) -> None:
    raise NotImplementedError(f"{type(self).__name__}._submit is not implemented")

# ---------------------------------------------------------------------------- memory and programs

@dataclass
class HCQBuffer:
  """Device memory: its GPU virtual address, size, an optional CPU mapping `view`, and backend data in `meta`."""
  va_addr: int
  size: int
  view: memoryview | None = None
  meta: Any = field(default=None, repr=False)

  def offset(self, offset: int, size: int) -> HCQBuffer:
    if offset < 0 or offset + size > self.size: raise ValueError(f"offset view [{offset}, {offset + size}) outside buffer of {self.size} bytes")
    view = self.view[offset:offset + size] if self.view is not None else None
    return HCQBuffer(self.va_addr + offset, size, view, self.meta)

class HCQAllocator(LRUAllocator):
  """Allocator base for HCQ devices: copies go through a host-visible staging buffer and the device's copy queue.

  Subclasses implement `_alloc(size, options) -> HCQBuffer` (with `view` set when options.host) and `_free`.
  """
  dev: HCQCompiled

  def __init__(self, dev: HCQCompiled, staging_size: int = 2 << 20) -> None:
    super().__init__(dev)
    self.staging_size = staging_size
    self._staging: HCQBuffer | None = None

  def staging(self) -> HCQBuffer:
    if self._staging is None:
      self._staging = self._alloc(self.staging_size, BufferOptions(host=True, nolru=True))
      if self._staging.view is None: raise RuntimeError(f"{type(self).__name__}: host=True allocation has no CPU view")
    return self._staging

  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    d = self.dev
    d.hw_copy_queue_t().wait(d.timeline_signal, d.timeline_value - 1).copy(dest, src, nbytes) \
      .signal(d.timeline_signal, d.next_timeline()).submit(d)

  def _copyin(self, dest: HCQBuffer, src: memoryview) -> None:
    st = self.staging()
    for off in range(0, src.nbytes, self.staging_size):
      n = min(self.staging_size, src.nbytes - off)
      self.dev.synchronize()  # staging buffer is free again
      st.view[:n] = src[off:off + n]
      self._copy(dest.va_addr + off, st.va_addr, n)
    self.dev.synchronize()

  def _copyout(self, dest: memoryview, src: HCQBuffer) -> None:
    st = self.staging()
    for off in range(0, dest.nbytes, self.staging_size):
      n = min(self.staging_size, dest.nbytes - off)
      self._copy(st.va_addr, src.va_addr + off, n)
      self.dev.synchronize()
      dest[off:off + n] = st.view[:n]

  def _offset(self, opaque: HCQBuffer, size: int, offset: int) -> HCQBuffer: return opaque.offset(offset, size)

  def _transfer(self, dest: HCQBuffer, src: HCQBuffer, nbytes: int, src_dev: Compiled, dest_dev: Compiled) -> None:
    """Copy on the source device's copy queue; the destination device's timeline then waits for it."""
    assert isinstance(src_dev, HCQCompiled) and isinstance(dest_dev, HCQCompiled)
    src_dev.hw_copy_queue_t().wait(src_dev.timeline_signal, src_dev.timeline_value - 1) \
      .wait(dest_dev.timeline_signal, dest_dev.timeline_value - 1).copy(dest.va_addr, src.va_addr, nbytes) \
      .signal(src_dev.timeline_signal, src_dev.next_timeline()).submit(src_dev)
    dest_dev.hw_compute_queue_t().wait(src_dev.timeline_signal, src_dev.timeline_value - 1) \
      .signal(dest_dev.timeline_signal, dest_dev.next_timeline()).submit(dest_dev)

class HCQArgsState:
  """A program's launch arguments prepared for the device (backends write kernarg memory here)."""
  def __init__(self, prg: HCQProgram, bufs: tuple[HCQBuffer, ...], vals: tuple[int, ...]) -> None:
    self.prg, self.bufs, self.vals = prg, bufs, vals

class HCQProgram(Program):
  """Program base for HCQ devices: a launch is wait(timeline) -> [timestamp] -> exec -> [timestamp] -> signal(timeline)."""
  dev: HCQCompiled

  def fill_kernargs(self, bufs: tuple[HCQBuffer, ...], vals: tuple[int, ...]) -> HCQArgsState:
    """Prepare arguments; backends override to write kernarg buffers."""
    return HCQArgsState(self, bufs, vals)

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    local_size = local_size or (1,) * len(global_size)
    self.check_launch(global_size, local_size)
    d = self.dev
    q = d.hw_compute_queue_t().wait(d.timeline_signal, d.timeline_value - 1).memory_barrier()
    if wait: q.timestamp(d.timing_start)
    q.exec(self, self.fill_kernargs(bufs, tuple(vals)), global_size, local_size)
    if wait: q.timestamp(d.timing_end)
    q.signal(d.timeline_signal, d.next_timeline()).submit(d)
    if not wait: return None
    d.synchronize()
    return d.timing_end.timestamp - d.timing_start.timestamp

class HCQCompiled(Compiled):
  """Device base for HCQ backends: a timeline signal orders all work; `synchronize` waits for its latest value."""
  def __init__(self, device: str, allocator: HCQAllocator | Callable[[HCQCompiled], HCQAllocator], renderers: Sequence[type[Renderer]],
               compiler: CompilerArg, runtime: Callable[..., HCQProgram], signal_t: Callable[..., Signal],
               compute_queue_t: Callable[[], HWQueue], copy_queue_t: Callable[[], HWQueue] | None = None, timeout_ms: int = 30000) -> None:
    self.signal_t, self.timeout_ms = signal_t, timeout_ms
    self.hw_compute_queue_t, self.hw_copy_queue_t = compute_queue_t, copy_queue_t or compute_queue_t
    self.timeline_signal, self.timeline_value = signal_t(self, 0), 1
    self.timing_start, self.timing_end = signal_t(self, 0), signal_t(self, 0)
    alloc = allocator if isinstance(allocator, HCQAllocator) else allocator(self)
    super().__init__(device, alloc, renderers, compiler, runtime)

  def next_timeline(self) -> int:
    """Reserve the next timeline value (the one a queue being built will signal)."""
    self.timeline_value += 1
    return self.timeline_value - 1

  def synchronize(self) -> None:
    self.timeline_signal.wait(self.timeline_value - 1, self.timeout_ms)

  def check_fault(self) -> None:
    """Raise if the device reported an error (MMU fault, hang); called while waiting on signals."""
