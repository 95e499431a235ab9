"""TinyJit: capture the kernels a function runs, then replay them with new input buffers and variable values.

Call 1 runs the function normally (compiling its kernels). Call 2 runs it again while recording every kernel and
copy it executes (ExecItems). From call 3 on, the function is not called at all: the recorded kernels run with the
new inputs' buffers swapped in and the new values of bound Variables, and the returned tensors are the same
objects as the capture's (their buffers hold the new results). JIT=0 turns capturing off.

Arguments that are not Tensors (or bound Variables) can't change a replay: their values were baked into the captured
kernels. So a capture is keyed on them: numbers, strings, None, dtypes, enums and tuples/lists/dicts of these by value
(floats bit-exactly: -0.0 and 0.0 differ), any other object (a model, a function) by identity, and the positions and
keyword names of the tensor arguments. A call with another key gets its own capture (run, capture, replay); the
MAX_CAPTURES most recently used are kept, and dropping one warns once (JitWarning), since a value that changes on every
call never replays: pass it as a Tensor or a bound Variable. A numpy array argument is a JitError (it is neither a value
nor safely an identity: pass a Tensor). A tensor input whose shape, dtype or device differs from the capture's is a
JitError, as in tinygrad (tinygrad bakes non-tensor arguments silently; plugrad does not).

Inputs may be multi-device tensors (each device's buffer is an input slot), and captured kernels and copies may read
views of input buffers (the same view of the new input is swapped in).

Replay runs each maximal stretch of compiled kernels on one device through that device's `batch_runner(items)` when
it offers one (e.g. CPU: one C call for the stretch, no Python per kernel); copies and the rest run item by item.
JIT_BATCH=0 turns batching off.

A capture's internal buffers (intermediates no tensor sees) are moved into the TinyJit's `JitArena` (engine/memory.py),
where buffers whose lifetimes in the capture don't overlap share memory; TinyJits that never run at the same time may
share one arena (`TinyJit(fn, arena=a)`). JIT_ARENA=0 keeps the buffers the capture ran with.
"""
from __future__ import annotations

import enum
import functools
import gc
import numbers
import warnings
from collections import OrderedDict
from typing import Any, Callable, Generic, TypeVar

import numpy as np

from plugrad.device import Device
from plugrad.dtype import DType
from plugrad.engine.memory import JitArena
from plugrad.engine.realize import CAPTURING, ExecItem, GlobalCounters, buffer_for
from plugrad.helpers import getenv, trim_heap
from plugrad.schedule.kernelize import SCHEDULES_USED, forget_schedules, rebind_view
from plugrad.uop.buffers import buffer_of
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp, ucache_compact
from plugrad.viz import capture, profile

R = TypeVar("R")


class JitError(RuntimeError):
  """A jitted function was called in a way its capture can't serve."""


class JitWarning(UserWarning):
  """A TinyJit dropped a capture: its non-tensor arguments took more than MAX_CAPTURES values."""


MAX_CAPTURES = 16  # captures kept per TinyJit (least recently used dropped first)


def _unbind(u: UOp) -> UOp:
  return u.substitute({n: n.src[0] for n in u.toposort() if n.op is Ops.BIND})


def _arg_key(x: Any, keep: list) -> Any:
  """What a capture is keyed on for one argument (see the module docstring); objects keyed by identity go in `keep`, so
  their ids can't be reused while the capture lives."""
  if isinstance(x, Tensor): return Tensor
  if isinstance(x, UOp): return ("uop", _unbind(x))
  if x is None or isinstance(x, (bool, str, bytes, DType, enum.Enum)): return (type(x), x)
  if isinstance(x, np.ndarray): raise JitError("a numpy array argument can't be keyed by a TinyJit capture; pass a Tensor")
  if isinstance(x, numbers.Number):
    if isinstance(x, numbers.Integral): return (type(x), int(x))
    if isinstance(x, numbers.Real): return (type(x), float(x).hex())
    return (type(x), complex(x).real.hex(), complex(x).imag.hex())
  if isinstance(x, (tuple, list)): return (type(x), tuple(_arg_key(v, keep) for v in x))
  if isinstance(x, dict): return (type(x), tuple((_arg_key(k, keep), _arg_key(v, keep)) for k, v in x.items()))
  if isinstance(x, slice): return (slice, _arg_key((x.start, x.stop, x.step), keep))
  keep.append(x)
  return ("id", id(x))


def _tensors_in(x: Any) -> list:
  if isinstance(x, Tensor): return [x]
  if isinstance(x, (list, tuple)): return [t for v in x for t in _tensors_in(v)]
  if isinstance(x, dict): return [t for v in x.values() for t in _tensors_in(v)]
  return []


def _bound_vars(args: list, tensors: list) -> dict[str, int]:
  """Variable values given to this call: BIND uops passed as arguments or found in input tensors' shapes."""
  out: dict[str, int] = {}
  def add(u: UOp) -> None:
    for n in u.toposort():
      if n.op is Ops.BIND:
        name, val = n.src[0].arg[0], n.src[1].arg
        if out.setdefault(name, val) != val: raise JitError(f"bind mismatch on {name}: {out[name]} != {val} in one call")
  for a in args:
    if isinstance(a, UOp): add(a)
  for t in tensors:
    for s in t.shape:
      if isinstance(s, UOp): add(s)
  return out


def _input_buffers(inputs: list) -> list:
  """The base Buffers of the (realized) input tensors; a multi-device tensor gives one per device."""
  return [buffer_for(buffer_of(u)).base for t in inputs for u in (t.uop.src if t.uop.op is Ops.MULTI else (t.uop,))]


class _Compaction:
  """The collection and hash-cons compaction a capture leaves owed: any capture sets `pending`, the next replay of any
  TinyJit pays it, once for a burst of captures (the LLM's warm-up captures four graphs; a collection of its object
  graph takes ~130 ms, which each graph's first replay used to pay, on the first requests)."""
  pending = False


class _Capture:
  """One capture of a TinyJit: the call count for its key, the recorded kernels, input slots and outputs."""

  def __init__(self, keep: list, arena: JitArena | None = None) -> None:
    self.keep, self.cnt, self.arena = keep, 0, arena
    self.captured: list[ExecItem] = []
    self._views: dict[tuple[int, int], tuple] = {}
    self.input_slots: list[tuple[int, int, int]] = []
    self.signature: list[tuple] = []
    self.ret: Any = None
    self.plan: list[tuple[Any, list[ExecItem], list[tuple[int, int]]]] = []  # (batch runner or None, items, input slots)

  def call(self, fn: Callable, inputs: list, args: tuple, kwargs: dict, var_vals: dict[str, int]) -> Any:
    if self.cnt == 0:
      ret = fn(*args, **kwargs)
      Tensor.realize_all(*_tensors_in(ret))
      self.cnt = 1
      return ret
    if self.cnt == 1: return self._capture(fn, inputs, args, kwargs)
    return self._replay(fn, inputs, var_vals)

  def _signature(self, inputs: list) -> list[tuple]:
    """(shape, dtype, device) per input, with bound variables in shapes replaced by the variables themselves."""
    return [(tuple(_unbind(s) if isinstance(s, UOp) else s for s in t.shape), t.dtype, t.device) for t in inputs]

  def _capture(self, fn: Callable, inputs: list, args: tuple, kwargs: dict) -> Any:
    CAPTURING.append([])
    SCHEDULES_USED.append(set())
    try:
      ret = fn(*args, **kwargs)
      Tensor.realize_all(*_tensors_in(ret))
    finally: items, used = CAPTURING.pop(), SCHEDULES_USED.pop()
    forget_schedules(used)   # replays never schedule: the (large) graphs the capture scheduled aren't needed any more
    in_bufs = _input_buffers(inputs)
    # a kernel or copy may read an input's whole buffer or a view of it (e.g. a chunk a ring allreduce sends): replay
    # swaps in the new input's buffer, or the same view of it
    self.input_slots = [(i, j, k) for i, ei in enumerate(items) for j, b in enumerate(ei.bufs) for k, ib in enumerate(in_bufs) if b.base is ib]
    self._views = {(i, j): (b.size, b.dtype, b.offset) for i, j, _ in self.input_slots if (b := items[i].bufs[j]) is not b.base}
    self.captured, self.signature, self.ret, self.cnt = items, self._signature(inputs), ret, 2
    if self.arena is not None and getenv("JIT_ARENA", 1):
      keep = {id(b) for b in in_bufs} | {id(b) for b in _input_buffers(_tensors_in(ret))}
      self.arena.adopt(self, items, keep)
    self.rebind()
    _Compaction.pending = True   # the graphs this capture built die once its caller lets go of them: the next replay compacts
    trim_heap()
    return ret

  def rebind(self) -> None:
    """Rebuild the batched replay plan from the captured items' buffers (after they were moved into an arena)."""
    self.plan = self._plan(self.captured) if getenv("JIT_BATCH", 1) else []

  def _plan(self, items: list[ExecItem]) -> list[tuple[Any, list[ExecItem], list[tuple[int, int]]]]:
    """Split the capture into stretches of kernels on one device (batched when the device offers `batch_runner`) and
    single items; each with the (index in stretch, buffer index) input slots it reads."""
    plan: list[tuple[Any, list[ExecItem], list[tuple[int, int]]]] = []
    i = 0
    while i < len(items):
      j, dev = i + 1, items[i].runner.device if items[i].runner is not None else None
      while dev is not None and j < len(items) and items[j].runner is not None and items[j].runner.device == dev: j += 1
      make = getattr(Device[dev], "batch_runner", None) if dev is not None and j - i > 1 else None
      batch = make(items[i:j]) if make is not None else None
      plan.append((batch, items[i:j] if batch is not None else [items[i]], []))
      i = j if batch is not None else i + 1
    start = 0
    for _, its, slots in plan:
      slots += sorted({(a - start, b) for a, b, _ in self.input_slots if start <= a < start + len(its)})
      start += len(its)
    return plan

  def _replay(self, fn: Callable, inputs: list, var_vals: dict[str, int]) -> Any:
    sig = self._signature(inputs)
    for i, (now, was) in enumerate(zip(sig, self.signature)):
      if now != was: raise JitError(f"input {i} changed from (shape, dtype, device) {was} to {now}; the capture can't serve it (reset() the jit)")
    st = capture.now() if capture.PROFILE else 0
    if _Compaction.pending:  # the hash-cons table shrinks after the capture's peak, once the graphs it built are freed
      _Compaction.pending = False
      gc.collect()           # (tensor graphs hold reference cycles: without a collection, when they die is up to chance)
      ucache_compact()
    bufs = _input_buffers(inputs)
    for i, j, k in self.input_slots:
      v = self._views.get((i, j)) if self._views else None
      self.captured[i].bufs[j] = bufs[k] if v is None else bufs[k].view(*v).ensure_allocated()
    if self.plan:
      for batch, its, slots in self.plan:
        if batch is None: its[0].run(var_vals if its[0].runner is not None and its[0].runner.spec.vars else None)
        elif capture.PROFILE: profile.run_batch(batch, its, var_vals, slots); GlobalCounters["kernels"] += len(its)
        else: batch(var_vals, slots); GlobalCounters["kernels"] += len(its)
    else:
      for ei in self.captured: ei.run(var_vals if ei.runner is not None and ei.runner.spec.vars else None)
    if var_vals:  # outputs with symbolic shapes take this call's sizes
      for t in _tensors_in(self.ret): t.uop = rebind_view(t.uop, var_vals)
    if st: profile.jit_replay(getattr(fn, "__name__", "fn"), bufs[0].device if bufs else "JIT", st)
    return self.ret


def _delegate(name: str) -> property:
  """A TinyJit attribute that reads (and sets) the most recently used capture's."""
  return property(lambda self: getattr(self._last, name), lambda self, v: setattr(self._last, name, v))


class TinyJit(Generic[R]):
  """Decorate a function of Tensors (or call TinyJit(fn)); see the module docstring. `cnt`, `captured`, `plan`, `ret`,
  `signature` and `input_slots` are those of the most recently used capture."""

  cnt, captured, plan, ret, signature, input_slots, _views = map(_delegate, ("cnt", "captured", "plan", "ret", "signature", "input_slots", "_views"))

  def __init__(self, fn: Callable[..., R], arena: JitArena | None = None):
    if not callable(fn): raise TypeError(f"TinyJit needs a callable, got {type(fn).__name__}")
    if arena is not None and not isinstance(arena, JitArena): raise TypeError(f"arena must be a JitArena, got {type(arena).__name__}")
    self.fn, self.arena = fn, arena if arena is not None else JitArena()
    self.reset()
    functools.update_wrapper(self, fn)

  def __get__(self, obj, objtype=None):  # a jitted method binds like a function
    return self if obj is None else functools.partial(self.__call__, obj)

  @property
  def captures(self) -> list[_Capture]:
    """The captures held (one per key of non-tensor arguments): the owners of their memory in the arena."""
    return list(self._captures.values())

  def reset(self) -> None:
    """Forget every capture: the next call runs normally again."""
    self._captures: OrderedDict[Any, _Capture] = OrderedDict()
    self._last, self._warned = _Capture([], self.arena), False
    self.arena.trim()   # the memory of the dropped captures (other TinyJits sharing the arena keep theirs)

  def __call__(self, *args, **kwargs) -> R:
    all_args = list(args) + list(kwargs.values())
    inputs = _tensors_in(all_args)
    if not getenv("JIT", 1): return self.fn(*args, **kwargs)
    Tensor.realize_all(*inputs)
    var_vals = _bound_vars(all_args, inputs)
    self._last = self._capture_for(args, kwargs)
    return self._last.call(self.fn, inputs, args, kwargs, var_vals)

  def _capture_for(self, args: tuple, kwargs: dict) -> _Capture:
    """The capture keyed on this call's non-tensor arguments (a new one, dropping the least recently used past MAX_CAPTURES)."""
    keep: list = []
    key = (_arg_key(args, keep), tuple((k, _arg_key(v, keep)) for k, v in kwargs.items()))
    if (c := self._captures.get(key)) is not None:
      self._captures.move_to_end(key)
      return c
    if len(self._captures) >= MAX_CAPTURES:
      self._captures.popitem(last=False)
      self.arena.trim()
      if not self._warned:
        self._warned = True
        warnings.warn(f"TinyJit({getattr(self.fn, '__name__', 'fn')}): non-tensor arguments took more than {MAX_CAPTURES} values, "
                      "so captures are dropped and calls rarely replay; pass values that change as Tensors or bound Variables",
                      JitWarning, stacklevel=3)
    c = self._captures[key] = _Capture(keep, self.arena)
    return c
