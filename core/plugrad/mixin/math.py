"""MathOps: arithmetic, comparisons, unary ALU math and the axis reduction, written once for Tensor and UOp.

The primitive interface a class provides (besides `MovementOps`'s):
- `_operands(x, reverse)`: (self, x) as two objects of the class that an ALU op can combine (x may be a Python number;
  Tensor broadcasts and promotes dtypes, UOp makes a constant of its own dtype), swapped when `reverse`;
- `_alu(op, *srcs, dtype=None)`: the ALU node; its dtype defaults to bool for comparisons, else self's;
- `cast(dtype)`, `dtype`, `shape`;
- `_rop(op, axes)`: a REDUCE_AXIS of op over axes (kept as size 1), same dtype;
- `_full(shape, value, dtype)`: a constant of that shape on self's device; `contiguous()`.
"""
from __future__ import annotations

from typing import Any, Sequence, TypeVar

from plugrad.dtype import DType, dtypes, least_upper_float
from plugrad.errors import TensorError
from plugrad.uop.enums import Ops

T = TypeVar("T", bound="MathOps")


class MathOps:
  __slots__ = ()
  dtype: Any
  shape: Any

  # ----- primitives (each class implements these) -----
  def _operands(self: T, x: Any, reverse: bool = False) -> tuple[T, T]: raise NotImplementedError(f"{type(self).__name__} must implement _operands")
  def _alu(self: T, op: Ops, *srcs: T, dtype: DType | None = None) -> T: raise NotImplementedError(f"{type(self).__name__} must implement _alu")
  def cast(self: T, dtype: Any) -> T: raise NotImplementedError(f"{type(self).__name__} must implement cast")
  def _rop(self: T, op: Ops, axes: tuple[int, ...]) -> T: raise NotImplementedError(f"{type(self).__name__} must implement _rop")
  def _full(self: T, shape: tuple, value: Any, dtype: DType) -> T: raise NotImplementedError(f"{type(self).__name__} must implement _full")
  def contiguous(self: T) -> T: raise NotImplementedError(f"{type(self).__name__} must implement contiguous")

  # ----- binary ops -----
  def _binop(self: T, op: Ops, x: Any, reverse: bool = False) -> T:
    a, b = self._operands(x, reverse)
    return a._alu(op, b)
  def add(self: T, x: Any, reverse: bool = False) -> T: return self._binop(Ops.ADD, x, reverse)
  def mul(self: T, x: Any, reverse: bool = False) -> T: return self._binop(Ops.MUL, x, reverse)
  def sub(self: T, x: Any, reverse: bool = False) -> T:
    a, b = self._operands(x, reverse)
    return a._alu(Ops.ADD, -b)
  def maximum(self: T, x: Any) -> T:
    """Elementwise max; nan in either input gives nan (as numpy; Ops.MAX propagates nan)."""
    return self._binop(Ops.MAX, x)
  def eq(self: T, x: Any) -> T: return self._binop(Ops.CMPEQ, x)
  def ne(self: T, x: Any) -> T: return self._binop(Ops.CMPNE, x)

  def __add__(self, x): return self._binop(Ops.ADD, x)
  def __radd__(self, x): return self._binop(Ops.ADD, x, True)
  def __sub__(self, x): return self.sub(x)
  def __rsub__(self, x): return self.sub(x, True)
  def __mul__(self, x): return self._binop(Ops.MUL, x)
  def __rmul__(self, x): return self._binop(Ops.MUL, x, True)
  def __lt__(self, x): return self._binop(Ops.CMPLT, x)
  def __gt__(self, x): return self._binop(Ops.CMPLT, x, True)

  # ----- unary ops -----
  def neg(self: T) -> T:
    if self.dtype.scalar() == dtypes.bool: return self.logical_not()
    return self._alu(Ops.NEG) if dtypes.is_float(self.dtype) else self * -1
  def __neg__(self): return self.neg()
  def logical_not(self: T) -> T: return self._binop(Ops.CMPNE, True) if self.dtype.scalar() == dtypes.bool else self.cast(dtypes.bool).logical_not()
  def exp2(self: T) -> T: return self.cast(least_upper_float(self.dtype))._alu(Ops.EXP2)
  def log2(self: T) -> T: return self.cast(least_upper_float(self.dtype))._alu(Ops.LOG2)
  def sqrt(self: T) -> T: return self.cast(least_upper_float(self.dtype))._alu(Ops.SQRT)

  # ----- reduction -----
  def _reduce(self: T, op: Ops, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> T:
    """Reduce with ADD, MUL or MAX over `axis` (None: all axes). Empty axes give the identity (MAX: an error)."""
    shape = self.shape
    ndim = len(shape)
    if type(axis) is int and -ndim <= axis < ndim: axis_list = [axis + ndim if axis < 0 else axis]  # (one valid axis: the common case)
    else:
      axis_list = [] if ndim == 0 and axis in (0, -1, (), None) else \
        list(range(ndim)) if axis is None else [self._axis(a) for a in ((axis,) if isinstance(axis, int) else axis)]  # type: ignore[attr-defined]
    if len(set(axis_list)) != len(axis_list): raise TensorError(f"duplicate axis in {axis} for shape {shape}")
    axes = tuple(sorted(axis_list))
    new_shape = tuple([s for i, s in enumerate(shape) if i not in axes])
    if not axes: return self
    for a in axes:
      if shape[a] == 0:
        if op is Ops.MAX: raise RuntimeError(f"max/min of an empty axis {a} of shape {shape}")
        out = self._full(tuple(1 if i in axes else s for i, s in enumerate(shape)), 0 if op is Ops.ADD else 1, self.dtype)
        return out if keepdim else out.reshape(new_shape)  # type: ignore[attr-defined]
    if (ret := self._split_full_reduce(op, axes)) is None: ret = self._rop(op, axes)
    return ret if keepdim else ret.reshape(new_shape)  # type: ignore[attr-defined]

  def _split_full_reduce(self: T, op: Ops, axes: tuple[int, ...]) -> T | None:
    """A full reduction of many elements as two: p partial reductions over contiguous runs (one kernel whose p
    outputs a device spreads over its cores or threads; a single output would run on one), then one over the partials.
    None when the reduction is partial, symbolic or small (< 2**16 elements)."""
    if len(axes) != len(shape := self.shape): return None
    n = 1
    for s in shape: n = n * s
    if not isinstance(n, int) or n < (1 << 16): return None
    if (p := next((p for p in (256, 128, 64, 32, 16, 8, 4, 2) if n % p == 0 and n // p >= 1024), None)) is None: return None
    part = self.reshape(p, n // p)._rop(op, (1,)).reshape(p).contiguous()  # type: ignore[attr-defined]
    return part._rop(op, (0,)).reshape((1,) * len(self.shape))
