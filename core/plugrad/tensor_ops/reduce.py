"""Tensor ops mixin: reductions and cumulative ops, written in Tensor's primitives (see plugrad/tensor.py).

Cumulative ops (cumsum, cumprod, cummax, cummin, logcumsumexp) are blocked scans: within blocks of `SCAN_BLOCK`
elements a triangular mask over an expanded view reduces every prefix in one fused kernel (O(n * block) work), and the
block totals are scanned the same way recursively and added back, so long axes stay fast.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from plugrad.errors import TensorError
from plugrad.dtype import DType, dtypes, least_upper_float, sum_acc_dtype

if TYPE_CHECKING:
  from plugrad.tensor import Tensor

SCAN_BLOCK = 256


def _identity(op: str, dt: DType) -> Any:
  if op == "add": return 0
  if op == "mul": return 1
  if op == "lse": return -math.inf
  return dtypes.min(dt)  # max


def _tri_mask(t: Tensor, n: int) -> Tensor:
  """An (n, n) bool tensor with mask[i, j] = j <= i, made by tiling one row: no index arithmetic needed."""
  v = type(t).full((n,), True, dtypes.bool, t.device)._pad(((0, n - 1),))
  m = v.reshape(1, 2 * n - 1).expand(n, 2 * n - 1).reshape(n * (2 * n - 1)).shrink(((0, n * (2 * n - 2)),))
  return m.reshape(n, 2 * n - 2).shrink(((0, n), (0, n))).permute(1, 0)


def _combine(a: Tensor, b: Tensor, op: str) -> Tensor:
  if op == "add": return a + b
  if op == "mul": return a * b
  if op == "max": return a.maximum(b)
  mx = a.maximum(b)
  mn = (a < b).where(a, b)
  return (mx == -math.inf).where(mx, mx + (mn - mx).exp().add(1).log())


def _tri_scan(x: Tensor, op: str) -> Tensor:
  n = x.shape[-1]
  if n == 1: return x
  xe = x.reshape(*x.shape[:-1], 1, n).expand(*x.shape[:-1], n, n)
  masked = _tri_mask(x, n).where(xe, _identity(op, x.dtype))
  if op == "add": return masked.sum(-1, dtype=x.dtype)
  if op == "mul": return masked.prod(-1)
  if op == "max": return masked.max(-1)
  return masked.logsumexp(-1)


def _scan(x: Tensor, op: str) -> Tensor:
  """Inclusive scan along the last axis."""
  n, lead = x.shape[-1], x.shape[:-1]
  if n <= SCAN_BLOCK: return _tri_scan(x, op)
  nb = -(-n // SCAN_BLOCK)
  pad = nb * SCAN_BLOCK - n
  xp = x._pad(((0, 0),) * len(lead) + ((0, pad),))
  if op != "add" and pad:
    valid = type(x).full((n,), True, dtypes.bool, x.device)._pad(((0, pad),))
    xp = valid.where(xp, _identity(op, x.dtype))
  loc = _tri_scan(xp.reshape(*lead, nb, SCAN_BLOCK), op)
  tot = loc.shrink(tuple((0, s) for s in lead) + ((0, nb), (SCAN_BLOCK - 1, SCAN_BLOCK))).reshape(*lead, nb)
  pre = _scan(tot, op).shrink(tuple((0, s) for s in lead) + ((0, nb - 1),))
  excl = pre._pad(((0, 0),) * len(lead) + ((1, 0),))
  if op != "add":
    first = type(x).full((nb,), True, dtypes.bool, x.device).shrink(((1, nb),))._pad(((1, 0),))
    excl = first.where(excl, _identity(op, x.dtype))
  out = _combine(loc, excl.reshape(*lead, nb, 1), op).reshape(*lead, nb * SCAN_BLOCK)
  return out.shrink(tuple((0, s) for s in lead) + ((0, n),))


def _last_hit(x: Tensor, values: Tensor, axis: int) -> Tensor:
  """For a running max/min: the index of the last element (up to each position) equal to the running value. The last
  position where x equals its own running value is where it was last reached, since the running value only changes there."""
  ax = x._axis(axis) if x.ndim else 0
  if x.ndim == 0: return x._const_like(0, dtypes.int32)
  n = x.shape[ax]
  pos = type(x).arange(n, device=x.device).reshape(tuple(n if i == ax else 1 for i in range(x.ndim)))
  same = x == values
  if dtypes.is_float(x.dtype): same = same.logical_or(x.isnan())
  return same.where(pos._expand_to(x.shape), -1)._cum("max", ax)


def _sorts_before(b: Tensor, a: Tensor, descending: bool) -> Tensor:
  """b strictly before a in the order (nan is the largest value)."""
  if descending: b, a = a, b
  lt = b < a
  return lt.logical_or(a.isnan().logical_and(b.isnan().logical_not())) if dtypes.is_float(a.dtype) else lt


class ReduceMixin:
  __slots__ = ()

  def _red_axes(self: Any, axis: int | Sequence[int] | None) -> tuple[int, ...]:
    """Normalized, sorted reduce axes; duplicates are a ValueError (numpy), out of range an IndexError."""
    if axis is None: return tuple(range(self.ndim))
    raw = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = [self._axis(a) for a in raw]
    if len(set(axes)) != len(axes): raise TensorError(f"duplicate value in axis {tuple(raw)} for shape {self.shape}")
    return tuple(sorted(axes)) if self.ndim else ()  # a 0-d tensor accepts axis 0/-1 (torch) and reduces nothing

  def _red_count(self: Any, axes: tuple[int, ...]) -> int:
    n = 1
    for a in axes: n *= self.shape[a]
    return n

  def _empty_red(self: Any, axes: tuple[int, ...], keepdim: bool, value: Any, dtype: DType) -> Tensor:
    shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
    out = type(self).full(shape, value, dtype, self.device)
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def min(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    """Minimum over `axis` (None: all); an empty axis is a RuntimeError like max."""
    axes = self._red_axes(axis)
    if dtypes.is_float(self.dtype): return -((-self).max(axes, keepdim))
    return self.bitwise_not().max(axes, keepdim).bitwise_not()

  def any(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    axes = self._red_axes(axis)
    if self._red_count(axes) == 0 and axes: return self._empty_red(axes, keepdim, False, dtypes.bool)
    return self.bool().max(axes, keepdim)

  def all(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return self.bool().logical_not().any(axis, keepdim).logical_not()

  def mean(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    """Arithmetic mean in the input's float type (ints -> default float); nan for an empty reduction."""
    axes = self._red_axes(axis)
    out = least_upper_float(self.dtype)
    s = self.cast(out).sum(axes, keepdim)
    n = self._red_count(axes)
    return s / n if n else s * math.nan

  def var(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: int | float = 1) -> Tensor:
    """Variance with `correction` subtracted from the count (1: unbiased, like torch; numpy's ddof)."""
    axes = self._red_axes(axis)
    x = self.cast(least_upper_float(self.dtype))
    d = x - x.mean(axes, keepdim=True)
    return (d * d).sum(axes, keepdim) / max(0, self._red_count(axes) - correction)

  def std(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: int | float = 1) -> Tensor:
    """sqrt(var); where var is 0 the gradient is 0 (as torch), not 0 * inf = nan."""
    v = self.var(axis, keepdim, correction)
    zero = v == 0
    return zero.where(0.0, zero.where(1.0, v).sqrt())

  def var_mean(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: int | float = 1) -> tuple[Tensor, Tensor]:
    return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

  def std_mean(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: int | float = 1) -> tuple[Tensor, Tensor]:
    return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

  def logsumexp(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) computed around the maximum (stable for large values); -inf for an empty reduction."""
    axes = self._red_axes(axis)
    x = self.cast(least_upper_float(self.dtype))
    if self._red_count(axes) == 0 and axes: return x._empty_red(axes, keepdim, -math.inf, x.dtype)
    m = x.max(axes, keepdim=True)
    m = m.isinf().where(0, m)
    ret = (x - m).exp().sum(axes, keepdim=True).log() + m
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  # ***** arg reductions *****
  def argmax(self: Any, axis: int | None = None, keepdim: bool = False) -> Tensor:
    """Index (int32) of the first maximum along `axis` (None: of the flattened tensor); the first nan wins, like numpy."""
    if axis is None:
      ret = self.reshape(-1).argmax(0)
      return ret.reshape((1,) * self.ndim) if keepdim else ret
    ax = self._axis(axis)
    x = self.reshape(1) if self.ndim == 0 else self
    n = x.shape[ax]
    if n == 0: raise TensorError(f"argmax/argmin of an empty axis {axis} of shape {self.shape}")
    if x.dtype == dtypes.bool: x = x.cast(dtypes.uint8)
    shape = tuple(n if i == ax else 1 for i in range(x.ndim))
    rev = (n - type(self).arange(n, device=x.device)).reshape(shape)  # reduce-free arange: fuses into the final kernel
    if dtypes.is_float(x.dtype):
      # one reduce for the max ignoring nans, one for the answer: a nan scores above any max (n + its reversed index)
      nan = x.isnan()
      m = nan.where(-math.inf, x).max(ax, keepdim=True)
      score = nan.where(rev + n, (x == m).where(rev, 0)).max(ax, keepdim=True)
      ret = (score > n).where(2 * n - score, n - score)
    else: ret = n - (x == x.max(ax, keepdim=True)).where(rev, 0).max(ax, keepdim=True)
    if self.ndim == 0: return ret.reshape(())
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(x.shape) if i != ax))

  def argmin(self: Any, axis: int | None = None, keepdim: bool = False) -> Tensor:
    """Index (int32) of the first minimum along `axis` (None: of the flattened tensor)."""
    return ((-self) if dtypes.is_float(self.dtype) else self.bitwise_not()).argmax(axis, keepdim)

  # ***** cumulative ops *****
  def _cum(self: Any, op: str, axis: int) -> Tensor:
    ax = self._axis(axis)
    if self.ndim == 0: return self.reshape(1)._cum(op, 0).reshape(())
    if self.numel() == 0: return self
    order = [i for i in range(self.ndim) if i != ax] + [ax]
    inv = [order.index(i) for i in range(self.ndim)]
    return _scan(self.permute(order), op).permute(inv)

  def cumsum(self: Any, axis: int = 0) -> Tensor:
    """Inclusive prefix sums along `axis`, accumulated in `sum_acc_dtype` (ints -> at least int32, half -> float32 then back)."""
    acc = sum_acc_dtype(self.dtype)
    ret = self.cast(acc)._cum("add", axis)
    return ret.cast(self.dtype) if dtypes.is_float(self.dtype) else ret

  def cumprod(self: Any, axis: int = 0) -> Tensor:
    """Inclusive prefix products along `axis` in the input's dtype (ints wrap)."""
    x = self.cast(dtypes.int32) if self.dtype == dtypes.bool else self
    return x._cum("mul", axis)

  def cummax(self: Any, axis: int = 0) -> tuple[Tensor, Tensor]:
    """(running maximum, int32 index where it was last reached) along `axis`, as torch.cummax."""
    values = self._cum("max", axis)
    return values, _last_hit(self, values, axis)

  def cummin(self: Any, axis: int = 0) -> tuple[Tensor, Tensor]:
    """(running minimum, int32 index where it was last reached) along `axis`, as torch.cummin."""
    if dtypes.is_float(self.dtype): values = -((-self)._cum("max", axis))
    elif self.dtype == dtypes.bool: values = self.logical_not()._cum("max", axis).logical_not()
    else: values = self.bitwise_not()._cum("max", axis).bitwise_not()
    return values, _last_hit(self, values, axis)

  # ***** sorting *****
  def sort(self: Any, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """(sorted values, int32 indices) along `dim`, stable (equal values keep their order), nan sorted as the largest
    value, as torch.sort(stable=True). Each element's rank is counted against the others: O(n**2) work per row, in
    fused kernels."""
    if self.ndim == 0: return self, self._const_like(0, dtypes.int32)
    d = self._axis(dim)
    n = self.shape[d]
    if n == 0: return self, self.cast(dtypes.int32)
    x = self.transpose(d, -1) if d != self.ndim - 1 else self
    a, b = x.unsqueeze(-1), x.unsqueeze(-2)  # a[..., i, 1], b[..., 1, j]
    before = _sorts_before(b, a, descending)  # element j goes before element i
    pos = type(self).arange(n, device=self.device)
    tie = (a == b).logical_or(a.isnan().logical_and(b.isnan()) if dtypes.is_float(self.dtype) else False)
    earlier = tie.logical_and(pos.reshape(1, n) < pos.reshape(n, 1))
    rank = before.logical_or(earlier).cast(dtypes.int32).sum(-1)  # [..., i]: where element i lands
    hit = rank.unsqueeze(-1) == pos  # [..., i, r]
    values = hit.where(x.unsqueeze(-1), 0).sum(-2, dtype=x.dtype) if x.dtype != dtypes.bool else hit.where(x.unsqueeze(-1), False).max(-2)
    indices = hit.where(pos.reshape(n, 1), 0).sum(-2, dtype=dtypes.int32)
    if d != self.ndim - 1: values, indices = values.transpose(d, -1), indices.transpose(d, -1)
    return values, indices

  def argsort(self: Any, dim: int = -1, descending: bool = False) -> Tensor:
    """int32 indices that sort `dim` (stable)."""
    return self.sort(dim, descending)[1]

  def topk(self: Any, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
    """(the k largest (or smallest) values along `dim`, their int32 indices), in sorted order."""
    d = self._axis(dim) if self.ndim else 0
    n = self.shape[d] if self.ndim else 1
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= n:
      raise TensorError(f"topk: k={k!r} must be in [0, {n}] for shape {self.shape}")
    values, indices = self.sort(dim, descending=largest)
    if self.ndim == 0: return values, indices
    sl = tuple((0, k) if i == d else None for i in range(self.ndim))
    return values.shrink(sl), indices.shrink(sl)

  def logcumsumexp(self: Any, axis: int = 0) -> Tensor:
    """log(cumsum(exp(x))) along `axis`, stable: every prefix is shifted by its own maximum."""
    return self.cast(least_upper_float(self.dtype))._cum("lse", axis)

