"""Tensor: the lazy user-facing array. Every operation builds UOps; `realize()` schedules, compiles and runs them.

This module holds the Tensor class with its construction, realization, autograd entry points and the primitives the
shared op mixins need (`_mop`, `_alu`, `_operands` with broadcasting and dtype promotion, `_rop`, `_full`, `cast`).
The movement ops, arithmetic and `_reduce` are written once in `plugrad.mixin` (shared with UOp); composite ops live in
the mixin modules of plugrad/tensor_ops/ and only call these primitives.
"""
from __future__ import annotations

import itertools
import math
import os
import pathlib
import weakref
from typing import Any, Sequence

import numpy as np

from plugrad.device import MAX_BUFFER_BYTES, BufferOptions, Device, canonicalize, human_bytes
from plugrad.download import fetch
from plugrad.dtype import ConstType, DType, dtypes, least_upper_dtype, least_upper_float, sum_acc_dtype, to_dtype
from plugrad.engine import plan
from plugrad.engine.inline import inline_calls
from plugrad.engine.realize import CAPTURING, buffer_for, run_schedule
from plugrad.schedule.multi import lower_multi, multi, needs_lowering
from plugrad.schedule.kernelize import create_schedule, is_storage, range_view
from plugrad.uop.buffers import buffer_of, contiguous_range, is_buffer_view, new_buffer
from plugrad.uop.shape import device_of
from plugrad.errors import TensorError
from plugrad.gradient import compute_gradient
from plugrad.live import all_tensors as _all_tensors
from plugrad.mixin.math import MathOps
from plugrad.mixin.movement import MovementOps, argshape, check_shape
from plugrad.uop.ops import GroupOp, Ops, UOp, elementwise
from plugrad.tensor_ops.creation import CreationMixin
from plugrad.tensor_ops.elementwise import ElementwiseMixin
from plugrad.tensor_ops.linalg import LinalgMixin
from plugrad.tensor_ops.movement import MovementMixin
from plugrad.tensor_ops.multi import MultiMixin
from plugrad.tensor_ops.nn import NnMixin
from plugrad.tensor_ops.reduce import ReduceMixin
from plugrad.uop.symbolic import prod, sint, sym_infer

class _PendingAssigns:
  """buffer -> the unrealized ASSIGNs into it. Each list lives in its buffer node's cache (as the device Buffer does)
  and the table holds the buffers weakly: an assign's target view references its buffer, so a table owning the lists
  would keep every written buffer alive for good. Held this way, a buffer that only its own pending writes reference
  is a cycle the garbage collector frees, with the writes, which nothing can read any more."""
  def __init__(self) -> None:
    self._bufs: weakref.WeakSet[UOp] = weakref.WeakSet()
    self.data = self._bufs.data  # the weak references themselves: empty exactly when no write is pending (a cheap test)
  def __len__(self) -> int: return len(self._bufs)   # (also its truth value)
  def __getitem__(self, b: UOp) -> list[UOp]: return b._cache["pending"]
  def get(self, b: UOp, default: Any = ()) -> list[UOp]:
    return c.get("pending", default) if (c := b._cache) is not None else default
  def __setitem__(self, b: UOp, assigns: list[UOp]) -> None:
    b._cached()["pending"] = assigns
    self._bufs.add(b)
  def __delitem__(self, b: UOp) -> None:
    if b._cache is not None: b._cache.pop("pending", None)
    self._bufs.discard(b)
  def keys(self) -> list[UOp]: return list(self._bufs)
  def append(self, b: UOp, assign: UOp) -> None: self[b] = [*self.get(b), assign]
  def clear(self) -> None:
    for b in self.keys(): del self[b]


_pending_assigns = _PendingAssigns()


_assign_order: weakref.WeakKeyDictionary[UOp, int] = weakref.WeakKeyDictionary()  # creation order of pending assigns
# id(t.detach()) -> (weakrefs to it and to t); keyed by id because Tensor's == is elementwise (no weak-keyed dict)
_detach_sources: dict[int, tuple[weakref.ref[Tensor], weakref.ref[Tensor]]] = {}
_assign_counter = itertools.count()


def _buffers_read(u: UOp) -> list[UOp]:
  """The buffers `u` reads, in first-read (post-order) order. Memoized per node: pending KV-cache assigns have
  overlapping value graphs, and the order of the merged children's lists equals that of a fresh walk."""
  stack: list[tuple[UOp, bool]] = [(u, False)]
  while stack:
    n, merge = stack.pop()
    if (c := n._cache) is not None and "bufs_read" in c: continue
    if merge:
      parts = [s._cache["bufs_read"] for s in n.src]
      parts = [p for i, p in enumerate(parts) if p and all(p is not q for q in parts[:i])]
      n._cached()["bufs_read"] = () if not parts else parts[0] if len(parts) == 1 else tuple(dict.fromkeys(b for p in parts for b in p))
    elif is_buffer_view(n): n._cached()["bufs_read"] = (buffer_of(n),)
    else:
      stack.append((n, True))
      stack.extend((s, False) for s in reversed(n.src) if s._cache is None or "bufs_read" not in s._cache)
  return list(u._cache["bufs_read"])


def _pending_writes(targets: list[UOp]) -> list[UOp]:
  """Unrealized assigns that must run before `targets`: those into buffers the targets read, and (transitively) those
  into buffers their values read, ordered so each runs after the earlier assigns its value depends on."""
  if not _pending_assigns: return []
  out: list[UOp] = []
  seen: set[UOp] = set(targets)
  def visit(a: UOp) -> None:
    if a in seen: return
    seen.add(a)
    me = _assign_order.get(a, 0)
    for b in _buffers_read(a.src[1]):  # earlier writes into what this value reads go first
      for dep in _pending_assigns.get(b, ()):
        if _assign_order.get(dep, 0) < me: visit(dep)
    out.append(a)
  for t in targets:
    lim = _assign_order.get(t, math.inf)  # realizing an assign itself runs only the writes made before it
    for b in _buffers_read(t):
      for a in _pending_assigns.get(b, ()):
        if _assign_order.get(a, 0) < lim: visit(a)
  return out


def _reads_no_pending(leaves: tuple[UOp, ...] | None) -> bool:
  """Whether a graph with these plan leaves (its BUFFERs and BINDs; None: the graph is its own leaf) reads no buffer
  that a pending write goes into: then no write must run first, and the realize may take its cached plan."""
  if not _pending_assigns.data: return True
  if leaves is None: return False
  return {b.src[0] if b.op is Ops.BUFFER_VIEW else b for b in _pending_assigns.keys()}.isdisjoint(leaves)


def _update_pending_assigns(becomes: dict[UOp, UOp]) -> None:
  """After a realize: drop pending assigns that ran, and point the others at the realized parts of their graphs."""
  for b in list(_pending_assigns.keys()):
    left = [a if not becomes else a.substitute(becomes, walk=True) for a in _pending_assigns[b] if a not in becomes]
    if left: _pending_assigns[b] = left
    else: del _pending_assigns[b]


def _forget_assigns(done: list[UOp]) -> None:
  """Drop assigns that were realized (or failed) from the pending lists."""
  if not _pending_assigns: return
  gone = {u for u in done if u.op is Ops.ASSIGN}
  for b in list(_pending_assigns.keys()):
    left = [a for a in _pending_assigns[b] if a not in gone]
    if left: _pending_assigns[b] = left
    else: del _pending_assigns[b]


def _canon_device(device: str | tuple[str, ...] | None) -> str | tuple[str, ...]:
  """The canonical device name; a tuple (a multi-device tensor's device set) canonicalizes each name."""
  if isinstance(device, (tuple, list)):
    if not device: raise ValueError("a multi-device tensor needs at least one device, got an empty device tuple")
    return tuple(canonicalize(d) for d in device)
  return canonicalize(device) if device is not None else canonicalize(Device.DEFAULT)


def _flat_targets(uops: list[UOp]) -> list[UOp]:
  """Multi-device tensors realize as their per-device graphs."""
  return [s for u in uops for s in (u.src if u.op is Ops.MULTI else (u,))]


def _np_to_uop(arr: np.ndarray, device: str) -> UOp:
  """A realized buffer on `device` holding a copy of `arr`, viewed in arr's shape (one per device for a device tuple)."""
  if isinstance(device, tuple): return multi([_np_to_uop(arr, d) for d in device], None)
  dt = dtypes.from_np(arr.dtype)
  buf = new_buffer(device, max(arr.size, 1) if arr.ndim == 0 else arr.size, dt)
  if arr.size: buffer_for(buf).copyin(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
  return _view(buf, arr.shape)


def _view(u: UOp, shape: tuple) -> UOp: return u if u.shape == tuple(shape) else UOp(Ops.RESHAPE, u.dtype, (u,), tuple(shape))


_const_ids = itertools.count()


def _const_uop(value: ConstType, dtype: DType, device: str, shape: tuple, unique: bool = False) -> UOp:
  """A constant tensor. `unique` makes a distinct node (a UNIQUE source) for tensors the user creates, so two equal
  `Tensor.zeros(3)` are different tensors (separate buffers once realized, separate gradients)."""
  if isinstance(device, tuple): return multi([_const_uop(value, dtype, d, shape, unique) for d in device], None)
  srcs = (UOp(Ops.DEVICE, arg=device),) + ((UOp(Ops.UNIQUE, arg=("const", next(_const_ids))),) if unique else ())
  c = UOp(Ops.CONST, dtype, srcs, dtypes.as_const(value, dtype))
  if not shape: return c
  c = UOp(Ops.RESHAPE, dtype, (c,), (1,) * len(shape))
  return c if all(s == 1 for s in shape) else UOp(Ops.EXPAND, dtype, (c,), tuple(shape))


_SCALARS: dict[tuple, UOp] = {}  # (value's type, value, dtype, cast dtype, device, shape) -> the broadcast constant
MAX_SCALARS = 1024  # scalar constants kept (the oldest is dropped first)


def _scalar_const(value: ConstType, dtype: DType, device: str, shape: tuple, cast: DType | None = None) -> UOp:
  """The constant `value` of `dtype` broadcast to `shape` on `device`: the node the general path makes for a Python
  scalar operand, `_const_uop(value, dtype, device, ())` (cast to `cast` when given) reshaped and expanded to `shape`.
  Kept in a small table: programs combine tensors of a few shapes with a few constants over and over, and building
  the three nodes (and truncating the value to the dtype) was most of an elementwise op's cost."""
  kv = value if type(value) is not float or (value == value and value != 0.0) else repr(value)  # -0.0, 0.0, nan kept apart
  key = (type(value), kv, dtype._key, None if cast is None else cast._key, device, shape)  # (dtype keys: DType hashes in Python)
  if (u := _SCALARS.get(key)) is not None: return u
  c = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), dtypes.as_const(value, dtype))
  if cast is not None and cast != dtype: c = UOp(Ops.CAST, cast, (c,))
  if shape:
    c = UOp(Ops.RESHAPE, c.dtype, (c,), (1,) * len(shape))
    if not all(isinstance(s, int) and s == 1 for s in shape): c = UOp(Ops.EXPAND, c.dtype, (c,), shape)
  if len(_SCALARS) >= MAX_SCALARS: del _SCALARS[next(iter(_SCALARS))]
  _SCALARS[key] = c
  return c


_SCALAR_DTYPES: dict[tuple, DType] = {}  # (scalar's type, tensor dtype key) -> _scalar_dtype


def _scalar_dtype(x: ConstType, dt: DType) -> DType:
  """The dtype a Python scalar takes next to a tensor of dtype `dt` (before promotion): `dt` itself, except a float
  next to an int/bool tensor (the default float) and an int next to a bool tensor (the default int). Memoized per
  (type, dtype, the default dtypes): it is asked for every scalar operand."""
  if (r := _SCALAR_DTYPES.get(key := (type(x), dt._key, dtypes.default_float._key, dtypes.default_int._key))) is not None: return r
  if type(x) is float and not dtypes.is_float(dt): r = least_upper_float(dt)
  elif type(x) is int and dt == dtypes.bool: r = dtypes.default_int
  else: r = dt
  if len(_SCALAR_DTYPES) > 256: _SCALAR_DTYPES.clear()
  _SCALAR_DTYPES[key] = r
  return r


_new_tensor = object.__new__
_live_add, _live_drop = _all_tensors.hooks()
_weakref = weakref.ref
_BINARY, _COMPARISON = GroupOp.Binary, GroupOp.Comparison


def _node(op: Ops, dtype: DType, src: tuple[UOp, ...], shape: tuple | None, device: str, arg: Any = None) -> UOp:
  """The node `UOp(op, dtype, src, arg)` of `shape` (None: computed when asked) on `device` (the caller checked the
  operands and arg); a new node gets its shape, device and (when its sources' are known) realize-plan signature
  memoized now, one step each, instead of by walks later."""
  u, c = elementwise(op, dtype, src, shape, device, arg)
  if c is not None:
    if len(src) == 2: plan.seed_binary(u, c)
    else: plan.seed(u, c)
  return u


def _tensor(uop: UOp) -> Tensor:
  """Tensor(uop) for a node built by Tensor's own primitives from single-device sources (no data to convert, nothing
  to check or lower)."""
  if (c := uop._cache) is None or "plan" not in c: plan.seed(uop)
  t = _new_tensor(Tensor)
  t.uop, t.requires_grad, t.grad, t._ctx = uop, None, None, None
  _live_add(_weakref(t, _live_drop))  # (_all_tensors.add(t))
  return t


def _wrap(uop: UOp) -> Tensor:
  """Tensor(uop) for a node built by Tensor's own primitives: lowered first when it is an op over multi-device tensors."""
  return _tensor(lower_multi(uop) if needs_lowering(uop) else uop)


def _check_size(shape: tuple, dt: DType, device: str | tuple) -> None:
  """TensorError at once for a tensor of more bytes than any device can address (it would fail only when realized)."""
  if not all(isinstance(s, int) for s in shape) or (n := prod(shape) * dt.itemsize) <= MAX_BUFFER_BYTES: return
  where = device if isinstance(device, str) else ", ".join(device)
  raise TensorError(f"a tensor of shape {shape} {dt.name} is {human_bytes(n)} ({n} bytes) on {where}, more than any device can "
                    f"address ({MAX_BUFFER_BYTES + 1} bytes)")


def _from_data(data: Any, device: str, dtype: DType | None) -> UOp:
  if isinstance(data, np.generic): data = np.asarray(data)
  if isinstance(data, (bool, int, float)):
    return _const_uop(data, dtype or _int_dtype_for(data) or dtypes.from_py(data), device, (), unique=True)
  if isinstance(data, (bytes, bytearray, memoryview)): return _np_to_uop(np.frombuffer(bytes(data), np.uint8), device)
  if isinstance(data, pathlib.PurePath):  # the file's bytes as a uint8 tensor on DISK (memory-mapped, nothing read yet)
    n = os.path.getsize(data)
    return _view(new_buffer(canonicalize(f"DISK:{os.path.abspath(data)}"), n, dtypes.uint8), (n,))
  if isinstance(data, (list, tuple)):
    try:
      want = dtype or dtypes.from_py(data)
      if dtype is None and want == dtypes.default_int: want = _int_dtype_for(data) or want
    except RecursionError:  # a list nested thousands deep (or containing itself): no tensor has that many dims
      raise TensorError("can't make a tensor from a list nested this deep: a tensor has at most 64 dims") from None
    try: arr = np.array(data, dtype=want.np if want.np is not None else np.float32)
    except ValueError as e: raise TensorError(f"can't make a tensor from a ragged or malformed nested list: {e}") from None
    except OverflowError: raise TensorError(f"value {_int_out_of(data, want)} is out of range for dtype {want}") from None
    return _cast_np(arr, want, device)
  if isinstance(data, np.ndarray):
    if data.dtype == np.float16 or data.dtype.kind in "biuf":
      return _cast_np(data, dtype or dtypes.from_np(data.dtype), device)
    raise TypeError(f"can't make a tensor from a numpy array of dtype {data.dtype}")
  raise TypeError(f"can't make a tensor from {type(data).__name__}")


def _ints_in(data: Any):
  if isinstance(data, (list, tuple)):
    for v in data: yield from _ints_in(v)
  elif isinstance(data, int) and not isinstance(data, bool): yield data


def _int_dtype_for(data: Any) -> DType | None:
  """default_int, or int64 for Python ints past its range (as torch); a value past int64 and uint64 is an error."""
  ints = list(_ints_in(data))
  if not ints: return None
  lo, hi = min(ints), max(ints)
  if dtypes.min(dtypes.default_int) <= lo and hi <= dtypes.max(dtypes.default_int): return dtypes.default_int
  if dtypes.min(dtypes.int64) <= lo and hi <= dtypes.max(dtypes.int64): return dtypes.int64
  if lo >= 0 and hi <= dtypes.max(dtypes.uint64): return dtypes.uint64
  raise TensorError(f"value {hi if hi > dtypes.max(dtypes.int64) else lo} is out of range for every integer dtype (int64, uint64)")


def _int_out_of(data: Any, dt: DType) -> int | str:
  """The first int in `data` that doesn't fit `dt`, for the error message."""
  return next((v for v in _ints_in(data) if not dtypes.min(dt) <= v <= dtypes.max(dt)), "in the data") if dtypes.is_int(dt) else "in the data"


def _cast_np(arr: np.ndarray, dtype: DType, device: str) -> UOp:
  if dtype.np is not None: return _np_to_uop(arr.astype(dtype.np, copy=False), device)
  return Tensor(_np_to_uop(arr.astype(np.float32), device)).cast(dtype).uop


class Tensor(CreationMixin, MovementMixin, ElementwiseMixin, ReduceMixin, NnMixin, LinalgMixin, MultiMixin, MathOps, MovementOps):
  """A lazily evaluated n-dimensional array on a device."""
  __slots__ = ("uop", "requires_grad", "grad", "_ctx", "__weakref__")
  training: bool = False
  no_grad: bool = False

  def __init__(self, data: Any, device: str | None = None, dtype: DType | str | None = None, requires_grad: bool | None = None):
    dt = to_dtype(dtype) if dtype is not None else None
    if isinstance(data, UOp): uop = data
    else:
      uop = _from_data(data, _canon_device(device), dt)
      if dt is not None and uop.dtype != dt: uop = UOp(Ops.CAST, dt, (uop,))
    if needs_lowering(uop): uop = lower_multi(uop)  # an op over multi-device tensors becomes one op per device
    if (c := uop._cache) is None or "plan" not in c: plan.seed(uop)  # (its realize-plan signature, when its sources' are known)
    self.uop: UOp = uop
    self.requires_grad, self.grad, self._ctx = requires_grad, None, None
    _all_tensors.add(self)

  # ***** properties *****
  @property
  def shape(self) -> tuple[sint, ...]: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def device(self) -> str: return device_of(self.uop)
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> sint: return prod(self.shape)
  def nbytes(self) -> sint: return self.numel() * self.dtype.itemsize
  def element_size(self) -> int: return self.dtype.itemsize
  def size(self, dim: int | None = None) -> sint | tuple[sint, ...]:
    """The shape, or one dim of it (torch's size)."""
    return self.shape if dim is None else self.shape[self._axis(dim)]
  def is_floating_point(self) -> bool: return dtypes.is_float(self.dtype)
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]
  def __iter__(self):
    """Iterate over the first dimension (a 0-d tensor isn't iterable, as in numpy and torch)."""
    if not self.shape: raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))
  def __repr__(self) -> str: return f"<Tensor {self.shape} {self.dtype!r} on {self.device}{' realized' if is_buffer_view(self.uop) else ''}>"
  __hash__ = object.__hash__  # identity (C-level: the live-tensor set hashes every new tensor)
  def __getattr__(self, name: str) -> Any:  # only reached when normal lookup fails: Tensor methods that plugins add
    if name.startswith("_") or hasattr(type(self), name): return object.__getattribute__(self, name)  # the real error
    # lazy plugin loading (documented in docs/architecture.md): plugin Tensor methods resolve on first use
    from plugrad.plugins.loader import tensor_method
    return tensor_method(self, name)

  # ***** realization *****
  def schedule(self, *others: Tensor, optimize: bool = True):
    """The schedule items (kernels and copies) that would realize these tensors, without running them: each kernel
    with the optimizations it would compile with, and the packing kernels they add (schedule/optimize.py).
    `optimize=False`: the kernels as the scheduler builds them, before their optimizations are chosen."""
    uops = _flat_targets([inline_calls(t.uop) for t in (self, *others)])
    targets = list(dict.fromkeys(_pending_writes(uops) + [u for u in uops if not is_buffer_view(u)]))
    return create_schedule(targets, optimize=optimize)[0] if targets else []

  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor (and `others`) into device buffers."""
    if not others and (u := self.uop).op is not Ops.MULTI:  # (realize_all's common case, inlined)
      if (c := u._cache) is not None and (sig := c.get("plan")) is not None and sig[0] == plan._gen[0] and sig[1] >= 0 and sig[2] \
         and (not _pending_assigns.data or _reads_no_pending(sig[2])):
        if not is_buffer_view(u): Tensor._realize_targets([u], (sig[1], sig[2]))  # (a memoized signature, not a leaf's)
        return self
      if (sig := plan.signature(u)) is not None and (not _pending_assigns.data or _reads_no_pending(sig[2])):
        if not is_buffer_view(u): Tensor._realize_targets([u], (sig[1], sig[2]))
        return self
    Tensor.realize_all(self, *others)
    return self

  @staticmethod
  def realize_all(*tensors: Tensor) -> None:
    # (`_pending_assigns.data`: a WeakSet's truth value is a Python-level __len__; a dead reference left in its set only
    # costs a `_reads_no_pending`)
    if len(tensors) == 1 and (u := tensors[0].uop).op is not Ops.MULTI and (sig := plan.signature(u)) is not None and \
       (not _pending_assigns.data or _reads_no_pending(sig[2])):  # one tensor, no CALLs, no writes to run first: the common case
      if not is_buffer_view(u): Tensor._realize_targets([u], (sig[1], sig[2]))
      return
    for t in tensors:  # @function calls run as their bodies (the schedule cache dedups them); a planned graph has none
      if plan.signature(t.uop) is None: t.uop = inline_calls(t.uop)
    uops = _flat_targets([t.uop for t in tensors])
    # assigns into buffers these tensors read go first (also when a tensor is itself a view of such a buffer)
    targets = list(dict.fromkeys(_pending_writes(uops) + [u for u in uops if not is_buffer_view(u)]))
    if not targets: return
    try: Tensor._realize_targets(targets)
    except Exception:
      for t in tensors:  # a failed assign is dropped, so it doesn't poison later work on its buffer
        if t.uop.op is Ops.ASSIGN and t.uop in targets: t.uop = t.uop.src[0]
      _forget_assigns(targets)
      raise

  @staticmethod
  def _realize_targets(targets: list[UOp], key: tuple | None = None) -> list[UOp]:
    """Schedule and run `targets`, point every live tensor at the results; returns the nodes that were realized.
    A structure realized before runs its cached plan (engine/plan.py): no scheduling, no walk over the live tensors.
    `key`: the targets' `plan.targets_signature` when the caller has it (and they read no buffer a pending write goes into)."""
    if key is None and (key := plan.targets_signature(targets)) is not None and not _reads_no_pending(key[1]): key = None
    if (p := plan.lookup(key)) is not None and (views := plan.run(p, key[1])) is not None:
      if len(targets) == 1 and not _pending_assigns.data:  # (the loop below for one realized node)
        u0, v0 = targets[0], views[0]
        for t in _all_tensors:
          if (u := t.uop) is u0: t.uop = v0
          elif u.seq >= u0.seq and not is_buffer_view(u) and u0 in u.toposort(): t.uop = u.substitute({u0: v0}, walk=True)
        return targets
      becomes = dict(zip(targets, views))
    else:
      tset = set(targets)
      keep: set[UOp] = set()  # nodes other live tensors still reference: their buffers must not be reused
      for t in list(_all_tensors):
        if t.uop not in tset and not is_buffer_view(t.uop): keep.update(t.uop.toposort(gate=lambda x: not is_buffer_view(x)))
      info: dict = {}
      items, becomes = create_schedule(targets, keep, info)
      run_schedule(items)
      if plan.wants(key): plan.build(key, targets, info, items)
    first = min([n.seq for n in becomes]) if becomes else 0  # a graph whose root is older than every realized node has none of them
    for t in _all_tensors:
      if (u := t.uop).seq >= first and not is_buffer_view(u):
        if (b := becomes.get(u)) is not None: t.uop = b
        elif len(becomes) >= 64 or not u.toposort().keys().isdisjoint(becomes):  # (toposort is memoized)
          t.uop = u.substitute(becomes, walk=True)
    if _pending_assigns.data: _update_pending_assigns(becomes)
    return list(becomes)
  def _host_view(self) -> tuple[Any, tuple]:
    """A realized contiguous Buffer for this tensor and its shape."""
    self.realize()
    t = self if _is_contiguous(self.uop) else self.contiguous().realize()
    return buffer_for(buffer_of(t.uop)), t.shape

  def numpy(self) -> np.ndarray:
    """The values as a numpy array (a copy). Symbolic dimensions must be bound (they take their bound values)."""
    shape = tuple(_bound_value(s, self.shape) for s in self.shape)
    if isinstance(self.device, tuple): return self.to(self.device[0]).numpy()  # a multi-device tensor: gathered first
    if self.dtype.np is None: return self.cast(dtypes.float32).numpy()
    if prod(shape) == 0: return np.zeros(shape, self.dtype.np)
    buf, _ = self._host_view()
    out = np.empty(shape, self.dtype.np)
    if buf.nbytes == out.nbytes: buf.copyout(out)  # one copy, into memory nobody zeroed first
    else: out[...] = buf.numpy()[:prod(shape)].reshape(shape)
    return out

  def tolist(self) -> Any: return self.numpy().tolist()
  def data(self) -> memoryview:
    """The values as a memoryview shaped like the tensor."""
    arr = self.numpy()
    return memoryview(arr).cast(arr.dtype.char, arr.shape) if arr.ndim else memoryview(arr.reshape(1)).cast(arr.dtype.char)
  def item(self) -> ConstType:
    if self.numel() != 1: raise TensorError(f"item() needs a tensor with one element, got shape {self.shape}")
    return self.numpy().reshape(()).item()

  def to(self, device: str | None) -> Tensor:
    """This tensor on `device` (itself if it is there already); a tuple of devices replicates it on each (see shard)."""
    device = _canon_device(device)
    if device == self.device: return self
    return Tensor(UOp(Ops.COPY, self.dtype, (self.uop, UOp(Ops.DEVICE, arg=device))))

  def assign(self, x: Any) -> Tensor:
    """Write `x` into this tensor and return it. A realized tensor is updated in place (its buffer is written when
    the assign is realized, so other views of the buffer see it); an unrealized one simply takes x's value."""
    x = x if isinstance(x, Tensor) else Tensor.full(self.shape, x, self.dtype, self.device)
    if self.uop.op is Ops.MULTI or x.uop.op is Ops.MULTI: return self._assign_multi(x)
    if x.shape != self.shape and len(x.shape) <= self.ndim:
      try: x = x._expand_to(self.shape)
      except ValueError: pass
    if x.shape != self.shape: raise TensorError(f"assign: value of shape {x.shape} doesn't match the target shape {self.shape}")
    if x.dtype != self.dtype: raise TypeError(f"assign: value dtype {x.dtype} doesn't match the target dtype {self.dtype}")
    if x.device != self.device: raise RuntimeError(f"assign: value on {x.device} but the target is on {self.device}")
    self._own_buffer()
    if is_buffer_view(self.uop): self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, x.uop))
    elif self.uop.op is Ops.ASSIGN: self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop.src[0], x.uop))
    else:
      self.uop = x.uop
      return self
    # a later realize that reads this buffer (e.g. the whole KV cache after a slice of it was assigned) runs this write first
    _pending_assigns.append(buffer_of(self.uop.src[0]), self.uop)
    _assign_order[self.uop] = next(_assign_counter)
    return self

  def _own_buffer(self) -> None:
    """Copy-on-write before an in-place write: a realized tensor whose view is identical to another live tensor's
    (equal computations share one buffer) first gets a private copy, so the write doesn't change the other tensor."""
    if not is_buffer_view(self.uop) or not any(t.uop is self.uop and t is not self for t in list(_all_tensors)): return
    self.uop = Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,))).realize().uop

  def contiguous(self) -> Tensor: return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))
  def contiguous_backward(self) -> Tensor:
    """The same values; the gradient flowing back through this point is made contiguous (its own buffer), so a
    backward pass computes it once instead of fusing it into every consumer (tinygrad's contiguous_backward)."""
    return Tensor(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)), requires_grad=self.requires_grad)
  def replace(self, x: Tensor) -> Tensor:
    """Make this tensor compute `x` (same shape and dtype) and return it (tinygrad's replace)."""
    if x.shape != self.shape or x.dtype != self.dtype:
      raise TensorError(f"replace: {x.shape} {x.dtype} doesn't match this tensor's {self.shape} {self.dtype}")
    self.uop = x.uop
    return self

  def to_(self, device: str | None) -> Tensor:
    """Move this tensor to `device` in place."""
    self.uop = self.to(device).uop
    return self

  def clone(self) -> Tensor:
    """A copy with its own buffer once realized (gradients flow through, as torch's clone)."""
    return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)), requires_grad=self.requires_grad)

  def detach(self) -> Tensor:
    """The same values with no gradient flowing back through them. It shares this tensor's storage, as in torch and
    tinygrad: a setitem on it writes this tensor (which must be realized then)."""
    ret = Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)), requires_grad=False)
    _detach_sources[id(ret)] = (weakref.ref(ret), weakref.ref(self))
    weakref.finalize(ret, _detach_sources.pop, id(ret), None)
    return ret

  def _detached_from(self) -> Tensor | None:
    """The live tensor this one is the detach() of, while its value is still that tensor's (DETACH of its uop)."""
    refs = _detach_sources.get(id(self))
    src = refs[1]() if refs is not None and refs[0]() is self else None
    return src if src is not None and self.uop.op is Ops.DETACH and self.uop.src[0] is src.uop else None

  def _keeps_grad_path(self, v: Tensor, value: Any) -> bool:
    """Whether a setitem of `v` into this realized tensor stays a pending in-place assign, so that backward reaches the
    gradient-eligible tensors (requires_grad None: tinygrad's rule) `v` is computed from. Not under no_grad, not while
    TinyJit captures (the capture must run the write), float tensors only."""
    if Tensor.no_grad or CAPTURING or not dtypes.is_float(self.dtype): return False
    nodes = set(v.uop.toposort())
    return any(t.requires_grad is None and t is not self and t is not v and t is not value and dtypes.is_float(t.dtype)
               and t.uop in nodes for t in list(_all_tensors))

  # ***** autograd *****
  def gradient(self, *targets: Tensor, gradient: Tensor | None = None, materialize_grads: bool = False) -> list[Tensor]:
    """Gradients of this tensor with respect to `targets` (lazy tensors). A non-scalar tensor needs `gradient`.
    A target this tensor doesn't depend on (or whose use folded away, as in x**0) gets zeros, as in tinygrad and torch;
    `materialize_grads` is kept for compatibility."""
    if Tensor.no_grad: raise RuntimeError("gradients are disabled inside Tensor.no_grad")
    if gradient is None:
      if self.shape != (): raise RuntimeError(f"gradient of a non-scalar tensor (shape {self.shape}) needs gradient=")
      gradient = Tensor(1.0, device=self.device, dtype=self.dtype)
    if gradient.shape != self.shape: raise TensorError(f"gradient shape {gradient.shape} doesn't match tensor shape {self.shape}")
    if not dtypes.is_float(self.dtype): raise RuntimeError(f"only float tensors have gradients, this is {self.dtype}")
    grads = compute_gradient(inline_calls(self.uop), gradient.cast(self.dtype).uop, [t._grad_uop() for t in targets])
    out = []
    for t in targets:
      out.append(Tensor(g) if (g := grads.get(t._grad_uop())) is not None else Tensor.zeros(t.shape, dtype=t.dtype, device=t.device))
    return out

  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(self)/d(t) into `t.grad` for every live float tensor t that self depends on and whose requires_grad
    isn't False (tinygrad's rule: None, the default, means "not decided" and is eligible)."""
    nodes = inline_calls(self.uop).toposort()
    wanted = [t for t in list(_all_tensors) if t.requires_grad is not False and t is not self and dtypes.is_float(t.dtype)
              and (t._grad_uop() in nodes or (t._grad_uop().op is Ops.MULTI and any(s in nodes for s in t._grad_uop().src)))]
    if not wanted: raise RuntimeError("backward: no tensor in this graph can have a gradient (all have requires_grad=False)")
    for t, g in zip(wanted, self.gradient(*wanted, gradient=gradient, materialize_grads=True)):
      t.grad = g if t.grad is None else t.grad + g
    return self

  def _grad_uop(self) -> UOp:
    """The node gradients of this tensor are taken with respect to: its value before any setitem (kept in _ctx)."""
    return self._ctx if self._ctx is not None else self.uop

  class train:
    """`with Tensor.train():` (or as a decorator) sets Tensor.training (dropout, batchnorm statistics) for the block."""
    def __init__(self, mode: bool = True): self.mode = mode
    def __enter__(self): self.prev, Tensor.training = Tensor.training, self.mode
    def __exit__(self, *exc): Tensor.training = self.prev
    def __call__(self, fn):
      def wrapper(*args, **kwargs):
        with Tensor.train(self.mode): return fn(*args, **kwargs)
      return wrapper

  @staticmethod
  def test() -> Tensor.train: return Tensor.train(False)

  class inference_mode:
    """`with Tensor.inference_mode():` sets Tensor.no_grad: gradient()/backward() raise inside the block."""
    def __enter__(self): self.prev, Tensor.no_grad = Tensor.no_grad, True
    def __exit__(self, *exc): Tensor.no_grad = self.prev
    def __call__(self, fn):
      def wrapper(*args, **kwargs):
        with Tensor.inference_mode(): return fn(*args, **kwargs)
      return wrapper

  # ***** creation helpers *****
  @staticmethod
  def full(shape: Sequence[sint] | int, fill_value: ConstType, dtype: DType | str | None = None, device: str | None = None, **kw) -> Tensor:
    shape = check_shape((shape,) if isinstance(shape, int) else tuple(shape))
    dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
    _check_size(shape, dt, dev := _canon_device(device))
    return Tensor(_const_uop(fill_value, dt, dev, shape, unique=True), **kw)
  @staticmethod
  def zeros(*shape, dtype: DType | str | None = None, device: str | None = None, **kw) -> Tensor:
    return Tensor.full(argshape(shape), 0, dtype or dtypes.default_float, device, **kw)
  @staticmethod
  def ones(*shape, dtype: DType | str | None = None, device: str | None = None, **kw) -> Tensor:
    return Tensor.full(argshape(shape), 1, dtype or dtypes.default_float, device, **kw)
  @staticmethod
  def empty(*shape, dtype: DType | str | None = None, device: str | None = None, **kw) -> Tensor:
    shape = check_shape(argshape(shape))
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    _check_size(shape, dt, dev := _canon_device(device))
    if isinstance(dev, tuple): return Tensor(multi([_view(new_buffer(d, prod(shape), dt), shape) for d in dev], None), **kw)
    return Tensor(_view(new_buffer(dev, prod(shape), dt), shape), **kw)

  @staticmethod
  def from_blob(ptr: int, shape: Sequence[int], dtype: DType | str | None = None, device: str | None = None, **kw) -> Tensor:
    """A tensor over memory someone else owns at address `ptr` (e.g. `numpy_array.ctypes.data`), not a copy: writes
    show in it, and the memory must outlive the tensor (tinygrad's from_blob). Host-memory devices only (CPU, PYTHON)."""
    if not isinstance(ptr, int) or isinstance(ptr, bool) or ptr <= 0: raise TensorError(f"from_blob needs a non-null integer pointer, got {ptr!r}")
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
      raise TensorError(f"from_blob needs a shape of ints >= 0, got {shape}")
    t = Tensor.empty(*shape, dtype=dtype, device=device, **kw)
    buf = buffer_for(buffer_of(t.uop))
    if not getattr(buf.allocator, "external_memory", False):
      raise TensorError(f"from_blob: device {t.device} can't wrap external memory (its allocator has no external_ptr support); use CPU or PYTHON")
    buf.options = BufferOptions(external_ptr=ptr)
    buf.allocate()
    return t

  @staticmethod
  def from_url(url: str, gunzip: bool = False, device: str | None = None, **fetch_kw: Any) -> Tensor:
    """The bytes at `url` (http(s):// or file://; gunzipped when `gunzip`) as a uint8 tensor: on DISK, memory-mapped
    from the downloaded file in $PLUGRAD_CACHE_DIR/downloads (tinygrad's from_url), or copied to `device`. Only this
    call downloads; `fetch_kw` (name, timeout, size, sha256, use_cache) go to plugrad.download.fetch."""
    t = Tensor(fetch(url, gunzip=gunzip, **fetch_kw))
    return t if device is None else t.to(device)

  @staticmethod
  def from_sint(x: sint, device: str | None = None) -> Tensor:
    """A 0-d index tensor holding a (possibly symbolic, bound) integer such as a sequence length."""
    if isinstance(x, int): return Tensor(x, device=device)
    if x.dtype != dtypes.index: raise TypeError(f"from_sint needs an index expression, got dtype {x.dtype}")
    zero = UOp(Ops.CONST, dtypes.index, (UOp(Ops.DEVICE, arg=_canon_device(device)),), 0)
    if needs_lowering(zero): zero = lower_multi(zero)
    return Tensor(UOp(Ops.ADD, dtypes.index, (zero, x)))  # the CONST carries the device; indexing folds the +0

  def _const_like(self, v: ConstType, dtype: DType | None = None) -> Tensor:
    return Tensor(_const_uop(v, dtype or self.dtype, self.device, self.shape))

  # ***** primitives of the shared op mixins (plugrad/mixin) *****
  def _mop(self, op: Ops, arg: Any) -> Tensor:
    xu = self.uop  # (arg is validated by MovementOps; a single-device source: the node is built, memoized and seeded directly)
    if (c := xu._cache) is not None and type(dev := c.get("device")) is str and xu.op is not Ops.MULTI:
      return _tensor(_node(op, xu.dtype, (xu,), arg if op is Ops.RESHAPE or op is Ops.EXPAND else None, dev, arg))
    return _wrap(UOp(op, xu.dtype, (xu,), arg))
  def _dot2d(self, w: Tensor) -> Tensor | None:
    """self @ w for two 2-D single-device tensors of one float dtype that accumulates in itself (M, K, N > 1): the
    very nodes `dot`'s general path builds (reshape, expand, permute, multiply, sum, reshape), made directly without its
    six intermediate Tensors and checks (a warm matmul 256's graph build: 70 -> ~20 us). None: take the general path."""
    xu, wu = self.uop, w.uop
    if xu.op is Ops.MULTI or wu.op is Ops.MULTI or (dt := xu.dtype) != wu.dtype or not dtypes.is_float(dt) or sum_acc_dtype(dt) != dt or \
       type(dev := device_of(xu)) is not str or device_of(wu) != dev: return None
    (M, K), (_, N) = self.shape, w.shape
    if type(M) is not int or type(K) is not int or type(N) is not int or min(M, K, N) < 2: return None
    def mk(op: Ops, src: UOp, shape: tuple | None, arg: Any) -> UOp: return _node(op, dt, (src,), shape, dev, arg)
    xe = mk(Ops.EXPAND, mk(Ops.RESHAPE, xu, (M, 1, K), (M, 1, K)), (M, N, K), (M, N, K))
    we = mk(Ops.EXPAND, mk(Ops.PERMUTE, mk(Ops.RESHAPE, wu, (1, K, N), (1, K, N)), None, (0, 2, 1)), (M, N, K), (M, N, K))
    red = mk(Ops.REDUCE_AXIS, _node(Ops.MUL, dt, (xe, we), (M, N, K), dev), None, (Ops.ADD, (2,)))
    return _tensor(mk(Ops.RESHAPE, red, (M, N), (M, N)))
  def _rop(self, op: Ops, axes: tuple[int, ...]) -> Tensor: return _wrap(UOp(Ops.REDUCE_AXIS, self.uop.dtype, (self.uop,), (op, axes)))
  def _full(self, shape: tuple, value: ConstType, dtype: DType) -> Tensor: return Tensor.full(shape, value, dtype, self.device)
  def _operands(self, x: Any, reverse: bool = False) -> tuple[Tensor, Tensor]: return self._broadcasted(x, reverse)

  # ***** elementwise primitives *****
  def _to_tensor(self, x: Any, reverse_dtype: bool = False) -> Tensor:
    if isinstance(x, Tensor): return x
    if isinstance(x, UOp): return Tensor.from_sint(x, self.device).cast(self.dtype if dtypes.is_int(self.dtype) else dtypes.default_int)
    if isinstance(x, (bool, int, float)):
      if isinstance(x, float) and not dtypes.is_float(self.dtype): dt = least_upper_float(self.dtype)
      elif isinstance(x, int) and not isinstance(x, bool) and self.dtype == dtypes.bool: dt = dtypes.default_int
      else: dt = self.dtype
      return Tensor(_const_uop(x, dt, self.device, ()))
    return Tensor(x, device=self.device)

  def _fast_operands(self, y: Any, reverse: bool) -> tuple[UOp, UOp, str, tuple] | None:
    """(operand node, operand node, device, shape) of an elementwise op with `y` when nothing needs promoting,
    broadcasting or lowering (a single-device tensor and a tensor of the same dtype and shape, or a Python scalar of
    this tensor's dtype): the nodes the general path of `_broadcasted` builds, without its intermediate tensors.
    None: take that path. (Shape and device are read from the nodes' caches where they are memoized.)"""
    xu, ty = self.uop, type(y)
    if (c := xu._cache) is None or (dev := c.get("device")) is None: dev = device_of(xu)
    if type(dev) is not str: return None
    if (shape := xu._cache.get("shape")) is None: shape = xu.shape
    if ty is Tensor:
      yu = y.uop
      if yu.dtype is not xu.dtype or yu.op is Ops.MULTI: return None
      if ((c := yu._cache) is None or (ys := c.get("shape")) is None) and (ys := yu.shape) is None: return None
      if ys != shape: return None
    elif ty is float or ty is int or ty is bool:
      if _scalar_dtype(y, dt := xu.dtype) is not dt: return None
      yu = _scalar_const(y, dt, dev, shape)
    else: return None
    return (yu, xu, dev, shape) if reverse else (xu, yu, dev, shape)

  def _binop(self, op: Ops, x: Any, reverse: bool = False) -> Tensor:
    if op not in _BINARY or (r := self._fast_operands(x, reverse)) is None: return MathOps._binop(self, op, x, reverse)
    a, b, dev, shape = r
    return _tensor(_node(op, dtypes.bool if op in _COMPARISON else a.dtype, (a, b), shape, dev))

  def _broadcasted(self, y: Any, reverse: bool = False, match_dtype: bool = True) -> tuple[Tensor, Tensor]:
    if (r := self._fast_operands(y, reverse)) is not None:
      other = y if type(y) is Tensor else _tensor(r[0] if reverse else r[1])
      return (other, self) if reverse else (self, other)
    x, y = self, self._to_tensor(y)
    if reverse: x, y = y, x
    if match_dtype and x.dtype != y.dtype:
      out = least_upper_dtype(x.dtype, y.dtype)
      x, y = x.cast(out), y.cast(out)
    shape = x._broadcast_shape(y)
    return x._expand_to(shape), y._expand_to(shape)

  def _alu(self, op: Ops, *srcs: Tensor, dtype: DType | None = None) -> Tensor:
    out = dtype or (dtypes.bool if op in GroupOp.Comparison else self.uop.dtype)
    return _wrap(UOp(op, out, (self.uop, *[s.uop for s in srcs])))

  def cast(self, dtype: DType | str) -> Tensor:
    dt = dtype if type(dtype) is DType else to_dtype(dtype)
    if dt is (xu := self.uop).dtype or dt == xu.dtype: return self
    if (c := xu._cache) is not None and type(dev := c.get("device")) is str and xu.op is not Ops.MULTI:  # (as in _mop)
      u, nc = elementwise(Ops.CAST, dt, (xu,), c.get("shape"), dev)
      if nc is not None: plan.seed(u, nc)
      return _tensor(u)
    return _wrap(UOp(Ops.CAST, dt, (xu,)))

  def bitcast(self, dtype: DType | str) -> Tensor:
    dt = to_dtype(dtype)
    if dt == self.dtype: return self
    if dt.itemsize != self.dtype.itemsize:
      if not self.shape: raise TensorError(f"can't bitcast a 0-d {self.dtype} tensor to {dt} of another size")
      last = self.shape[-1] * self.dtype.itemsize
      if last % dt.itemsize: raise TensorError(f"can't bitcast last dim of {self.shape} ({self.dtype}) to {dt}")
      raw = self if is_buffer_view(self.uop) and contiguous_range(self.uop)[2] is self.uop else self.contiguous().realize()
      return Tensor(_view(raw._bytes_as(dt), (*self.shape[:-1], last // dt.itemsize)))
    if is_buffer_view(self.uop) and contiguous_range(self.uop)[2] is self.uop and is_storage(self.device):
      return Tensor(_view(self._bytes_as(dt), self.shape))  # storage can't run a BITCAST kernel: view the bytes instead
    return Tensor(UOp(Ops.BITCAST, dt, (self.uop,)))

  def _bytes_as(self, dt: DType) -> UOp:
    """A BUFFER_VIEW of dtype `dt` over the bytes of this contiguous buffer range."""
    base, off, _ = contiguous_range(self.uop)
    return range_view(base, off, self.nbytes() // dt.itemsize, dt)

  # ***** reductions (over MathOps._reduce) *****
  def sum(self, axis=None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
    acc = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
    ret = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
    return ret.cast(self.dtype) if dtype is None and dtypes.is_float(self.dtype) and self.dtype != acc else ret

  def max(self, axis=None, keepdim: bool = False) -> Tensor:
    """Maximum over axis; a nan anywhere in the reduced elements gives nan (as numpy)."""
    return self._reduce(Ops.MAX, axis, keepdim)
  def prod(self, axis=None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
    return self.cast(to_dtype(dtype) if dtype is not None else self.dtype)._reduce(Ops.MUL, axis, keepdim)

  # ***** operators *****
  def div(self, x, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
    a, b = self._broadcasted(x, reverse, match_dtype=False)
    if rounding_mode is None:
      out = least_upper_float(least_upper_dtype(a.dtype, b.dtype))
      return a.cast(out)._alu(Ops.FDIV, b.cast(out))
    if rounding_mode == "floor": return self.floordiv(x, reverse)
    if rounding_mode == "trunc": return self.idiv(x, reverse) if not dtypes.is_float(least_upper_dtype(a.dtype, b.dtype)) else a.div(b).trunc()
    raise TensorError(f"div rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")
  def exp(self) -> Tensor: return (self.cast(least_upper_float(self.dtype)) * (1 / math.log(2))).exp2()
  def log(self) -> Tensor: return self.log2() * math.log(2)
  def relu(self) -> Tensor:
    """max(x, 0) with nan kept and a zero gradient at 0 (as torch)."""
    xu = self.uop
    if (dt := xu.dtype) is not dtypes.bool and dt != dtypes.bool and type(dev := device_of(xu)) is str:  # the graph of the line below, built directly
      shape, b = xu.shape, dtypes.bool
      z = _scalar_const(0, dt, dev, shape)
      le = _node(Ops.OR, b, (_node(Ops.CMPLT, b, (xu, z), shape, dev), _node(Ops.CMPEQ, b, (xu, z), shape, dev)), shape, dev)
      return _tensor(_node(Ops.WHERE, dt, (le, _scalar_const(0, dtypes.default_int, dev, shape, dt), xu), shape, dev))
    return (self <= 0).where(0, self)
  def where(self, x, y) -> Tensor:
    cond = self.cast(dtypes.bool)
    cu, tx, ty = cond.uop, type(x), type(y)
    if (tx is Tensor) != (ty is Tensor) and type(dev := device_of(cu)) is str:  # one tensor branch of the condition's shape, one scalar
      t, v = (x, y) if tx is Tensor else (y, x)
      if type(v) in (bool, int, float) and t.uop.shape == cu.shape:  # the general path's graph, without its intermediate tensors
        c = _scalar_const(v, _scalar_dtype(v, dtypes.bool), dev, cu.shape, t.uop.dtype)
        return _wrap(_node(Ops.WHERE, t.uop.dtype, (cu, t.uop, c) if tx is Tensor else (cu, c, t.uop), cu.shape, dev))
    xt, yt = cond._to_tensor(x), cond._to_tensor(y)
    if xt.dtype != yt.dtype:
      out = least_upper_dtype(xt.dtype, yt.dtype) if isinstance(x, Tensor) and isinstance(y, Tensor) else (xt if isinstance(x, Tensor) else yt).dtype
      xt, yt = xt.cast(out), yt.cast(out)
    shape = cond._broadcast_shape(xt, yt)
    return cond._expand_to(shape)._alu(Ops.WHERE, xt._expand_to(shape), yt._expand_to(shape), dtype=xt.dtype)

  def __truediv__(self, x): return self.div(x)
  def __rtruediv__(self, x): return self.div(x, True)
  def __ge__(self, x): return self._binop(Ops.CMPLT, x, True) | self._binop(Ops.CMPEQ, x)  # nan compares false, unlike not(<)
  def __le__(self, x): return self._binop(Ops.CMPLT, x) | self._binop(Ops.CMPEQ, x)
  def __eq__(self, x): return self._binop(Ops.CMPEQ, x)  # type: ignore[override]
  def __ne__(self, x): return self._binop(Ops.CMPNE, x)  # type: ignore[override]
  def __bool__(self): raise TypeError("the truth value of a Tensor is ambiguous; use .item() or .numpy()")


def _is_contiguous(u: UOp) -> bool:
  """A BUFFER (or BUFFER_VIEW) seen through reshapes (and a leading 1-D shrink from 0, as symbolic sizes use): its
  memory starts with the tensor in row-major order."""
  while u.op is Ops.RESHAPE: u = u.src[0]
  if u.op is Ops.SHRINK and len(u.arg) == 1 and u.arg[0][0] == 0: u = u.src[0]
  return u.op in (Ops.BUFFER, Ops.BUFFER_VIEW)


def _bound_value(s: sint, shape: tuple) -> int:
  """A dimension's concrete value: ints as they are, symbolic ones from the values their variables are bound to."""
  if isinstance(s, int): return s
  vals = {n.src[0].arg[0]: n.src[1].arg for n in s.toposort() if n.op is Ops.BIND}
  if any(n.op is Ops.DEFINE_VAR and n.arg[0] not in vals for n in s.toposort()):
    raise TensorError(f"tensor of shape {shape} has an unbound symbolic dimension; bind its variables first")
  return sym_infer(s, vals)

