"""MovementOps: the six movement ops and broadcasting, written once for Tensor and UOp.

The primitive interface a class provides: `shape` (a tuple of ints or symbolic index UOps), `dtype`, and
`_mop(op, arg)` returning a new object of the same class that applies movement op `op` with argument `arg`
(RESHAPE/EXPAND: the new shape, PERMUTE: the order, PAD: ((before, after), ...), SHRINK: ((start, end), ...),
FLIP: a bool per axis). Arguments are validated here, so both classes raise the same `TensorError`s.
"""
from __future__ import annotations

import abc
from typing import Any, Sequence, TypeVar

from plugrad.errors import TensorError
from plugrad.uop.enums import Ops

T = TypeVar("T", bound="MovementOps")


class SymbolicDim(abc.ABC):
  """The type of a symbolic dimension; `plugrad.uop.ops` registers UOp (this module can't import it)."""


def argshape(shape: tuple) -> tuple:
  """`f(2, 3)` and `f((2, 3))` both as (2, 3)."""
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): return tuple(shape[0])
  return tuple(shape)


def check_shape(shape: Sequence) -> tuple:
  """`shape` as a tuple, or a TensorError if a dimension isn't a non-negative int (or a symbolic dimension)."""
  for s in shape:
    if isinstance(s, bool) or not isinstance(s, (int, SymbolicDim)) or (isinstance(s, int) and s < 0):
      raise TensorError(f"invalid shape {tuple(shape)}: dimensions must be non-negative ints")
  return tuple(shape)


def _prod(xs) -> Any:
  ret = 1
  for x in xs: ret = ret * x
  return ret


class MovementOps:
  __slots__ = ()
  shape: Any
  dtype: Any

  def _mop(self: T, op: Ops, arg: Any) -> T: raise NotImplementedError(f"{type(self).__name__} must implement _mop")

  @property
  def ndim(self) -> int: return len(self.shape)

  def reshape(self: T, shape, *args) -> T:
    """A view with a new shape: -1 infers one dimension, None keeps that dimension's size."""
    new = argshape((shape, *args) if args else (shape,) if isinstance(shape, (int, type(None))) else shape)
    for s in new:  # the common case first: every dimension a plain int >= 0 (no -1 to infer, no None to keep)
      if type(s) is not int or s < 0: break
    else:
      if new == (sh := self.shape): return self
      if isinstance(numel := _prod(sh), int) and _prod(new) != numel:
        raise TensorError(f"can't reshape tensor of shape {sh} ({numel} elements) to {new}")
      return self._mop(Ops.RESHAPE, new)
    if any(s is None for s in new):  # None at position i keeps self.shape[i] (tinygrad's rule)
      if any(s is None and i >= self.ndim for i, s in enumerate(new)): raise TensorError(f"reshape: None at a dim {self.shape} doesn't have: {new}")
      new = tuple(self.shape[i] if s is None else s for i, s in enumerate(new))
    if new.count(-1) > 1: raise TensorError(f"reshape can infer only one dimension, got {new}")
    numel = _prod(self.shape)
    if -1 in new:
      known = _prod([s for s in new if s != -1])
      if known == 0 or numel % known != 0: raise TensorError(f"can't reshape {self.shape} to {new}")
      new = tuple(numel // known if s == -1 else s for s in new)
    new = check_shape(new)
    if isinstance(n := _prod(new), int) and isinstance(numel, int) and n != numel:
      raise TensorError(f"can't reshape tensor of shape {self.shape} ({numel} elements) to {new}")
    return self if new == self.shape else self._mop(Ops.RESHAPE, new)

  def permute(self: T, order, *args) -> T:
    order = tuple(self._axis(a) for a in ((order, *args) if args or isinstance(order, int) else order))
    if sorted(order) != list(range(self.ndim)): raise TensorError(f"permute order {order} is not a permutation of {self.ndim} axes")
    return self if order == tuple(range(self.ndim)) else self._mop(Ops.PERMUTE, order)

  def expand(self: T, shape, *args) -> T:
    new = argshape((shape, *args) if args else (shape,) if isinstance(shape, int) else shape)
    if len(new) == len(sh := self.shape):  # the common case first: plain int sizes, each one equal or from a 1
      for o, n in zip(sh, new):
        if type(n) is not int or n < 0 or (o != n and o != 1): break
      else: return self if new == sh else self._mop(Ops.EXPAND, new)
    if len(new) < self.ndim: raise TensorError(f"can't expand {self.shape} to fewer dims {new}")
    x = self.reshape((1,) * (len(new) - self.ndim) + self.shape) if len(new) > self.ndim else self
    new = tuple(o if n == -1 else n for o, n in zip(x.shape, new))
    for o, n in zip(x.shape, new):
      if o != n and o != 1: raise TensorError(f"can't expand {self.shape} to {new}: dims must match or be 1")
    return x if new == x.shape else x._mop(Ops.EXPAND, check_shape(new))

  def _pad(self: T, pads: tuple) -> T:
    """Zero padding by ((before, after), ...) per axis, all non-negative (negative pads are shrinks)."""
    if all(b == 0 and a == 0 for b, a in pads): return self
    if any(isinstance(v, int) and v < 0 for p in pads for v in p): raise TensorError(f"negative padding {pads} (use shrink)")
    return self._mop(Ops.PAD, tuple(pads))

  def shrink(self: T, arg: Sequence) -> T:
    """The sub-box [start, end) per axis (None keeps an axis whole)."""
    if len(arg) != self.ndim: raise TensorError(f"shrink needs {self.ndim} (start, end) pairs, got {len(arg)}")
    bounds = tuple((0, s) if a is None else tuple(a) for a, s in zip(arg, self.shape))
    for (b, e), s in zip(bounds, self.shape):
      if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
        raise TensorError(f"shrink {bounds} out of range for shape {self.shape}")
    if all(b == 0 and e == s for (b, e), s in zip(bounds, self.shape)): return self
    return self._mop(Ops.SHRINK, bounds)

  def flip(self: T, axis, *args) -> T:
    axes_list = [self._axis(a) for a in ((axis, *args) if args or isinstance(axis, int) else axis)]
    if len(set(axes_list)) != len(axes_list): raise TensorError(f"flip: dim {axes_list} repeats an axis (shape {self.shape})")
    axes = set(axes_list)
    return self._mop(Ops.FLIP, tuple(i in axes for i in range(self.ndim))) if axes else self

  def _axis(self, a: int, ndim: int | None = None) -> int:
    """Axis `a` normalized to [0, ndim) (negative counts from the end); IndexError out of range."""
    n = self.ndim if ndim is None else ndim
    if not isinstance(a, int) or isinstance(a, bool): raise TypeError(f"axis must be an int, got {a!r}")
    if not -max(n, 1) <= a < max(n, 1): raise IndexError(f"axis {a} is out of range for a tensor of {n} dims (shape {self.shape})")
    return a + n if a < 0 else a

  def _broadcast_shape(self, *others: Any) -> tuple:
    """The numpy broadcast of self's shape and the others' shapes (TensorError if they don't broadcast)."""
    if len(others) == 1 and len(a := self.shape) == len(b := others[0].shape):  # two shapes of one rank: the common case
      out = []
      for x, y in zip(a, b):
        if x is y or (type(x) is int and type(y) is int and x == y) or (type(y) is int and y == 1): out.append(x)
        elif type(x) is int and x == 1: out.append(y)
        else: break
      else: return tuple(out)
    shapes = [self.shape, *(o.shape for o in others)]
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
      big = [d for d in dims if not (isinstance(d, int) and d == 1)]
      if any(d is not big[0] and d != big[0] for d in big[1:]):
        raise TensorError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} can't be broadcast together")
      out.append(big[0] if big else 1)
    return tuple(out)

  def _expand_to(self: T, shape: tuple) -> T:
    """self broadcast to `shape` (leading 1s added first)."""
    if self.shape == shape: return self
    return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape) if self.ndim < len(shape) else self.expand(shape)
