"""Tensor ops mixin: nn. Linear algebra (dot/matmul/einsum), activations, normalization, convolution and pooling,
attention, losses and interpolation, written in terms of Tensor's primitives (see plugrad/tensor.py) plus a few
elementwise/reduce/creation ops of the other mixins (tanh, erf, mean, arange).

Convolution and pooling share one trick: `_pool_view` turns the trailing spatial dims into (outputs..., window...)
with pad/reshape/expand/shrink/permute only, so a conv is a broadcast-multiply and one reduce (one kernel).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from plugrad.errors import TensorError, TensorTypeError
from plugrad.dtype import DType, dtypes, least_upper_dtype, least_upper_float, to_dtype
from plugrad.uop.buffers import is_buffer_view
from plugrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
  from plugrad.tensor import Tensor


# ***** private helpers *****
def _float(x: Tensor) -> Tensor: return x.cast(least_upper_float(x.dtype))
def _recip(x: Tensor) -> Tensor: return _float(x)._alu(Ops.RECIPROCAL)
def _sigmoid(x: Tensor) -> Tensor:
  """1 / (1 + exp(-x)) from e = exp(-|x|) in (0, 1]: no inf anywhere, so the gradient e / (1 + e)**2 is finite (0, not
  nan, at +-1000) and exp saturates to exactly 0/1."""
  x = _float(x)
  pos = x >= 0
  e = (pos.where(-x, x) * (1 / math.log(2))).exp2()
  return pos.where(_recip(1 + e), e * _recip(1 + e))  # exp2 saturates: no nan at +-inf


def _softplus(x: Tensor, beta: float = 1.0) -> Tensor:
  """log(1 + exp(beta*x)) / beta as max(z,0) + log1p(exp(-|z|)): never overflows, keeps relative precision for z << 0."""
  # z.maximum(0), not relu(): its tie gradient 0.5 at 0 pairs with max(z, -z)'s to give the exact slope sigmoid(0) = 0.5
  z = _float(x) * beta
  u = (-z.maximum(-z)).exp()
  return (z.maximum(0) + (u < 1e-4).where(u * (1 - 0.5 * u), (1 + u).log())) * (1 / beta)


def _linear_weights(n_in: int, n_out: int, align_corners: bool) -> np.ndarray:
  """(n_out, n_in) float64 weights of linear resampling (torch's source positions: half-pixel centers, clamped at 0)."""
  W = np.zeros((n_out, n_in))
  for o in range(n_out):
    if align_corners: pos = o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else: pos = max((o + 0.5) * n_in / n_out - 0.5, 0.0)
    lo = min(int(pos), n_in - 1)
    W[o, lo] += 1 - (pos - lo)
    W[o, min(lo + 1, n_in - 1)] += pos - lo
  return W


def _uint8_linear_pass(x: Tensor, ax: int, n_out: int, align_corners: bool) -> Tensor:
  """One dim of uint8 linear resampling as torch computes it: the weights as 16-bit fixed point (the most fraction bits
  p that keep 2 * max weight below 2^15), sum(w * x) + 2^(p-1) shifted right by p and clamped to 0..255, per dim."""
  W = _linear_weights(x.shape[ax], n_out, align_corners)
  p = next((q for q in range(22) if int(0.5 + W.max() * (1 << (q + 1))) >= 1 << 15), 22)
  Wi = type(x)(np.floor(0.5 + W * (1 << p)).astype(np.int32), device=x.device)  # weights are >= 0: round half up
  moved = x.transpose(ax, -1)
  y = (moved.cast(dtypes.int32).unsqueeze(-2) * Wi).sum(-1, dtype=dtypes.int32)
  return ((y + (1 << (p - 1))) >> p).clip(0, 255).cast(dtypes.uint8).transpose(ax, -1)


def _arange(like: Tensor, n: int, dtype: DType = dtypes.int32) -> Tensor:
  """arange(n) on the device (and of the class) of tensor `like`."""
  return type(like).arange(n, dtype=dtype, device=like.device)


def _tuple(v: Any, n: int, name: str) -> tuple[int, ...]:
  t = (v,) * n if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
  if len(t) != n or not all(isinstance(i, int) and not isinstance(i, bool) for i in t):
    raise TensorError(f"{name} must be an int or a tuple of {n} ints, got {v!r}")
  return t


def _resolve_pads(padding: int | Sequence[int], dims: int) -> list[tuple[int, int]]:
  """(before, after) per spatial dim. An int pads all sides; `dims` values pad both sides of each dim; 2*dims values are
  flat (left, right) pairs starting from the LAST dim, like torch.nn.functional.pad."""
  if isinstance(padding, int) and not isinstance(padding, bool): return [(padding, padding)] * dims
  p = tuple(padding)
  if not all(isinstance(i, int) and not isinstance(i, bool) for i in p): raise TensorError(f"padding must be ints, got {padding!r}")
  if len(p) == dims: return [(i, i) for i in p]
  if len(p) == 2 * dims: return [(p[2 * i], p[2 * i + 1]) for i in range(dims)][::-1]
  raise TensorError(f"padding {padding!r} must be an int or have {dims} or {2 * dims} values for {dims} spatial dims")


def _pad_spatial(x: Tensor, pads: Sequence[tuple[int, int]], value: Any = 0.0) -> Tensor:
  """Pad (negative: crop) the trailing len(pads) dims of x, filling with `value`."""
  lead = [(0, 0)] * (x.ndim - len(pads))
  pos = lead + [(max(b, 0), max(a, 0)) for b, a in pads]
  if any(b or a for b, a in pos):
    padded = x._pad(tuple(pos))
    if value != 0:
      inside = x._const_like(True, dtypes.bool)._pad(tuple(pos))
      padded = inside.where(padded, padded._const_like(value))
    x = padded
  if any(b < 0 or a < 0 for b, a in pads):
    x = x.shrink([None] * len(lead) + [(-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pads, x.shape[len(lead):])])
  return x


def _out_size(i: int, k: int, s: int, d: int) -> int: return (i - d * (k - 1) - 1) // s + 1


def _pool_view(x: Tensor, k: Sequence[int], s: Sequence[int], d: Sequence[int]) -> Tensor:
  """Sliding windows over the trailing len(k) dims: (..., i_1, ..., i_n) -> (..., o_1, ..., o_n, k_1, ..., k_n) with
  view[..., o, w] = x[..., o*s + w*d]. Built from movement ops only, so consumers fuse into one kernel."""
  n, pre = len(k), x.shape[:x.ndim - len(k)]
  ins, lead = x.shape[len(pre):], [None] * len(pre)
  o = [_out_size(i, kk, ss, dd) for i, kk, ss, dd in zip(ins, k, s, d)]
  def inter(*lists): return [v for t in zip(*lists) for v in t]  # (a1, b1, a2, b2, ...)
  if all(kk <= ss and (dd == 1 or kk == 1) for kk, ss, dd in zip(k, s, d)):  # disjoint windows: fit to o*s, split, crop
    x = _pad_spatial(x, [(0, oo * ss - i) for oo, ss, i in zip(o, s, ins)]).reshape(*pre, *inter(o, s))
    x = x.shrink(lead + inter([(0, oo) for oo in o], [(0, kk) for kk in k]))
    return x.permute(*range(len(pre)), *[len(pre) + 2 * j for j in range(n)], *[len(pre) + 2 * j + 1 for j in range(n)])
  # repeat each dim e times and cut rows of length R = m*i + d (R >= o*s): row w then starts at input index w*d
  rows = [max(1, -(-(oo * ss - dd) // i)) * i + dd for oo, ss, dd, i in zip(o, s, d, ins)]
  reps = [-(-(kk * r) // i) for kk, r, i in zip(k, rows, ins)]
  x = x.reshape(*pre, *inter([1] * n, ins)).expand(*pre, *inter(reps, ins)).reshape(*pre, *[e * i for e, i in zip(reps, ins)])
  x = x.shrink(lead + [(0, kk * r) for kk, r in zip(k, rows)]).reshape(*pre, *inter(k, rows))
  x = x.shrink(lead + inter([(0, kk) for kk in k], [(0, oo * ss) for oo, ss in zip(o, s)])).reshape(*pre, *[v for t in zip(k, o, s) for v in t])
  x = x.shrink(lead + [q for kk, oo in zip(k, o) for q in ((0, kk), (0, oo), (0, 1))]).reshape(*pre, *inter(k, o))
  return x.permute(*range(len(pre)), *[len(pre) + 2 * j + 1 for j in range(n)], *[len(pre) + 2 * j for j in range(n)])


def _reduction(x: Tensor, reduction: str, count: Tensor | None = None) -> Tensor:
  if reduction == "none": return x
  if reduction == "sum": return x.sum()
  if reduction == "mean": return x.sum() / count if count is not None else x.mean()
  raise TensorError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def _check_smoothing(label_smoothing: float) -> None:
  if not 0.0 <= label_smoothing <= 1.0: raise TensorError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


_ELL0 = 0x3B1  # '...' dims get the letters alpha, beta, ... so they can't clash with a-zA-Z


def _parse_einsum(formula: str, shapes: list[tuple]) -> tuple[list[str], str]:
  """Operand subscripts with any '...' replaced by fresh non-ASCII letters, and the output subscripts."""
  f = formula.replace(" ", "")
  lhs, arrow, out = f.partition("->")
  ins = lhs.split(",")
  if len(ins) != len(shapes): raise TensorError(f"einsum {formula!r} names {len(ins)} operands but got {len(shapes)}")
  nell = 0
  for sub, sh in zip(ins, shapes):
    letters = sub.replace("...", "")
    if letters and not (letters.isascii() and letters.isalpha()): raise TensorError(f"einsum subscripts must be a-z or A-Z, got {sub!r}")
    if sub.count("...") > 1: raise TensorError(f"einsum operand {sub!r} has more than one '...'")
    want = len(letters)
    if ("..." in sub and len(sh) < want) or ("..." not in sub and len(sh) != want):
      raise TensorError(f"einsum operand {sub!r} doesn't match its shape {sh}")
    if "..." in sub: nell = max(nell, len(sh) - want)
  ell = "".join(chr(_ELL0 + i) for i in range(nell))
  subs = [s.replace("...", ell[nell - (len(sh) - len(s.replace('...', ''))):] if nell else "") for s, sh in zip(ins, shapes)]
  if arrow:
    if out.count("...") > 1: raise TensorError(f"einsum output {out!r} has more than one '...'")
    out = out.replace("...", ell)
    if len(set(out)) != len(out): raise TensorError(f"einsum output {out!r} repeats a subscript")
    if any(c not in "".join(subs) for c in out): raise TensorError(f"einsum output {out!r} uses a subscript no operand has")
  else: out = ell + "".join(sorted(c for c in set("".join(subs)) if c.isascii() and "".join(subs).count(c) == 1))
  return subs, out


def _diagonal(x: Tensor, a: int, b: int) -> Tensor:
  """Diagonal over axes a < b (equal sizes), put where axis a was; axis b disappears."""
  n = x.shape[a]
  if x.shape[b] != n: raise TensorError(f"einsum repeated subscript needs equal dims, got {x.shape[a]} and {x.shape[b]} in shape {x.shape}")
  rest = [i for i in range(x.ndim) if i not in (a, b)]
  y = x.permute(*rest, a, b).reshape(*[x.shape[i] for i in rest], n * n)
  y = y._pad(((0, 0),) * len(rest) + ((0, n),)).reshape(*[x.shape[i] for i in rest], n, n + 1)
  y = y.shrink([None] * len(rest) + [None, (0, 1)]).reshape(*[x.shape[i] for i in rest], n)
  order = list(range(len(rest)))
  order.insert(a, len(rest))
  return y.permute(*order)


def _conv(x: Tensor, weight: Tensor, groups: int, stride: Sequence[int], dilation: Sequence[int], pads: Sequence[tuple[int, int]],
          dtype: DType | str | None) -> Tensor:
  """The cross-correlation itself (arguments validated): pad (negative pads crop), the window view, one multiply-reduce."""
  nd = weight.ndim - 2
  (bs, _), (cout, cin), ks = x.shape[:2], weight.shape[:2], weight.shape[2:]
  x = _pad_spatial(x, pads)
  o = [_out_size(i, k, s, d) for i, k, s, d in zip(x.shape[2:], ks, stride, dilation)]
  x = _pool_view(x, ks, stride, dilation)  # (bs, cin_all, *o, *k)
  rc = cout // groups
  x = x.reshape(bs, groups, cin, 1, *o, *ks).expand(bs, groups, cin, rc, *o, *ks)
  x = x.permute(0, 1, 3, *range(4, 4 + nd), 2, *range(4 + nd, 4 + 2 * nd))  # (bs, groups, rc, *o, cin, *k)
  w = weight.reshape(1, groups, rc, *[1] * nd, cin, *ks)
  out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(x.dtype, weight.dtype)
  return (x * w).sum(tuple(range(-1 - nd, 0)), dtype=dtype).cast(out_dt).reshape(bs, cout, *o)


def _every(w: Tensor, axis: int, start: int, step: int, count: int) -> Tensor:
  """w[..., start::step][:count] along `axis` (movement ops only)."""
  n = w.shape[axis]
  w = w.shrink([None] * axis + [(start, min(n, start + (count - 1) * step + 1))] + [None] * (w.ndim - axis - 1))
  if step == 1: return w
  w = w._pad(tuple((0, 0) if i != axis else (0, count * step - w.shape[axis]) for i in range(w.ndim)))
  w = w.reshape(*w.shape[:axis], count, step, *w.shape[axis + 1:])
  return w.shrink([None] * (axis + 1) + [(0, 1)] + [None] * (w.ndim - axis - 2)).reshape(*w.shape[:axis], count, *w.shape[axis + 2:])


def _conv_input_grad(dy: Tensor, weight: Tensor, groups: int, stride: Sequence[int], dilation: Sequence[int],
                     pads: Sequence[tuple[int, int]], in_shape: Sequence[int], dtype: DType | str | None) -> Tensor:
  """d conv / d x for output gradient dy: stride-1 convolutions of dy with the flipped, in/out-swapped kernel.

  Input position i (in the padded input's coordinates i + pb) takes the taps k with i + pb - k*d = o*s. Split i by its
  phase rho = i % s: the phase's taps are every (s/g)-th one from its first (g = gcd(s, d)), and output position
  i' = i // s reads o = i' + c0 - j*(d/g) for its j-th tap, a stride-1 correlation of dy with the reversed sub-kernel at
  dilation d/g. Stride 1 is one phase (the whole kernel, pads d*(k-1) - p); stride s > 1 is s**nd such convolutions
  (every multiply-add useful, unlike zero-stuffing dy), each its own kernel, interleaved by one elementwise kernel."""
  nd = weight.ndim - 2
  cout, cin, ks = weight.shape[0], weight.shape[1], weight.shape[2:]
  rc, bs, O = cout // groups, dy.shape[0], dy.shape[2:]
  wt = weight.reshape(groups, rc, cin, *ks).permute(0, 2, 1, *range(3, 3 + nd)).reshape(groups * cin, rc, *ks)
  dims = []  # per spatial dim: for each phase (positions, first tap, tap step, taps, dilation, left pad, right pad)
  for I, o, k, s, d, (pb, _) in zip(in_shape, O, ks, stride, dilation, pads):
    g = math.gcd(s, d)
    phases = []
    for rho in range(s):
      n = -(-(I - rho) // s)
      taps = [kk for kk in range(k) if (rho + pb - kk * d) % s == 0]
      if n <= 0: continue
      if not taps: phases.append((rho, n, None)); continue
      J, dd, c0 = len(taps), d // g, (rho + pb - taps[0] * d) // s
      left = (J - 1) * dd - c0
      phases.append((rho, n, (taps[0], s // g, J, dd, left, n + (J - 1) * dd - o - left)))
    dims.append(phases)
  out_dt = least_upper_dtype(dy.dtype, weight.dtype) if dtype is None else to_dtype(dtype)
  parts = []
  for combo in _product(dims):
    shape = (bs, groups * cin, *[n for _, n, _ in combo])
    if any(t is None for _, _, t in combo):  # a phase no tap reaches: zero gradient
      parts.append((combo, type(dy).zeros(*shape, dtype=out_dt, device=dy.device)))
      continue
    w = wt
    for ax, (_, _, (k0, step, J, _, _, _)) in enumerate(combo): w = _every(w, 2 + ax, k0, step, J)
    w = w.flip(*range(2, 2 + nd))
    cpads = [(t[4], t[5]) for _, _, t in combo]
    parts.append((combo, _conv(dy, w, groups, (1,) * nd, tuple(t[3] for _, _, t in combo), cpads, dtype)))
  if all(s == 1 for s in stride): return parts[0][1]
  # each phase its own kernel (a plain convolution the conv tile fits), then one elementwise kernel interleaves them
  full = [-(-I // s) for I, s in zip(in_shape, stride)]
  ret = None
  for combo, p in parts:  # phase rho of dim j goes to positions i' * s + rho
    p = p.contiguous()._pad(((0, 0), (0, 0), *[(0, f - n) for f, (_, n, _) in zip(full, combo)]))
    p = p.reshape(bs, groups * cin, *[v for f in full for v in (f, 1)])
    p = p._pad(((0, 0), (0, 0), *[q for (rho, _, _), s in zip(combo, stride) for q in ((0, 0), (rho, s - 1 - rho))]))
    ret = p if ret is None else ret + p
  assert ret is not None
  ret = ret.reshape(bs, groups * cin, *[f * s for f, s in zip(full, stride)])
  return ret.shrink([None, None, *[(0, I) for I in in_shape]])


def _product(lists: list[list]) -> list[tuple]:
  out: list[tuple] = [()]
  for lst in lists: out = [t + (v,) for t in out for v in lst]
  return out


def _conv_weight_grad(dy: Tensor, x: Tensor, groups: int, stride: Sequence[int], dilation: Sequence[int],
                      pads: Sequence[tuple[int, int]], ks: Sequence[int], dtype: DType | str | None) -> Tensor:
  """d conv / d weight: the correlation of the padded input's windows with dy, summed over the batch and the outputs."""
  nd = len(ks)
  bs, cin_all, O = x.shape[0], x.shape[1], dy.shape[2:]
  cout, cin = dy.shape[1], cin_all // groups
  rc = cout // groups
  xv = _pool_view(_pad_spatial(x, pads), ks, stride, dilation)  # (bs, cin_all, *O', *k), O' >= O
  xv = xv.shrink([None, None, *[(0, o) for o in O], *[None] * nd]).reshape(bs, groups, 1, cin, *O, *ks)
  g = dy.reshape(bs, groups, rc, 1, *O, *[1] * nd)
  out_dt = least_upper_dtype(dy.dtype, x.dtype) if dtype is None else to_dtype(dtype)
  red = (0, *range(4, 4 + nd))
  return (xv * g).sum(red, dtype=dtype).cast(out_dt).reshape(cout, cin, *ks)


def _unscaled(g: UOp) -> UOp:
  """`g` without a product by a broadcast 1 (the gradient of a sum: (y * dy).sum() hands y the gradient 1 * dy)."""
  if g.op is not Ops.MUL: return g
  for one, x in (g.src, g.src[::-1]):
    while one.op in (Ops.RESHAPE, Ops.EXPAND): one = one.src[0]
    if one.op is Ops.CONST and one.arg == 1: return x
  return g


def grad_once(cls: type, ctx: UOp) -> Tensor:
  """A custom gradient's output gradient `ctx` as a Tensor of class `cls` that its consumers read as a plain operand:
  in place when it is a buffer already (or one times a broadcast 1), else written once into a buffer (an expression,
  e.g. a fused BatchNorm/ReLU backward, would be evaluated again by every kernel reading it, per tile row and tap)."""
  return cls(g) if is_buffer_view(g := _unscaled(ctx)) else cls(ctx).contiguous()


@dataclass(frozen=True)
class _ConvVJP:
  """The vector-Jacobian product of a convolution (the arg of its CUSTOM_GRAD node, whose sources are the value, x and
  the weight): called by autograd with the output's gradient, it returns (None, d x, d weight) as convolutions."""
  cls: type
  groups: int
  stride: tuple
  dilation: tuple
  pads: tuple
  dtype: DType | None
  def __call__(self, ctx: UOp, ret: UOp) -> tuple:
    T, (x, w) = self.cls, ret.src[1:]
    dy = grad_once(T, ctx)
    dx = _conv_input_grad(dy, T(w), self.groups, self.stride, self.dilation, self.pads, x.shape[2:], self.dtype).cast(x.dtype)
    dw = _conv_weight_grad(dy, T(x), self.groups, self.stride, self.dilation, self.pads, w.shape[2:], self.dtype).cast(w.dtype)
    return None, dx.uop, dw.uop


class NnMixin:
  __slots__ = ()

  # ***** linear algebra *****
  def dot(self, w: Tensor, dtype: DType | str | None = None, acc_dtype: DType | str | None = None) -> Tensor:
    """Matrix product with torch.matmul's shape rules (1-D operands, batch broadcasting); one multiply+sum kernel.
    `dtype` (alias `acc_dtype`) is the accumulation and output dtype."""
    x: Tensor = self  # type: ignore[assignment]
    w = x._to_tensor(w) if not isinstance(w, type(x)) else w
    if dtype is not None and acc_dtype is not None and to_dtype(dtype) != to_dtype(acc_dtype):
      raise TensorError(f"dtype={dtype} and acc_dtype={acc_dtype} disagree")
    dtype = dtype if dtype is not None else acc_dtype
    xs, ws = x.shape, w.shape
    if dtype is None and len(xs) == 2 and len(ws) == 2 and xs[1] == ws[0] and (fast := x._dot2d(w)) is not None: return fast
    if len(xs) == 0 or len(ws) == 0: raise RuntimeError(f"matmul needs tensors of at least 1 dim, got shapes {xs} and {ws}")
    kax = -min(len(ws), 2)
    if xs[-1] != ws[kax]:
      raise RuntimeError(f"matmul shape mismatch: {xs} @ {ws} (contracted dims {xs[-1]} != {ws[kax]})")
    xb, wb = xs[:-2], ws[:-2]
    for a, b in zip(xb[::-1], wb[::-1]):
      if a != b and a != 1 and b != 1: raise RuntimeError(f"matmul batch dims don't broadcast: {xs} @ {ws}")
    one = (1,) if len(xs) > 1 and len(ws) > 1 else ()
    xr = x.reshape((*xs[:-1], *one, xs[-1]))
    wr = w.reshape((*ws[:-2], *one, *ws[kax:]))
    if len(ws) > 1: wr = wr.permute(*range((n := len(ws) + len(one)) - 2), n - 1, n - 2)
    out = to_dtype(dtype) if dtype is not None else least_upper_dtype(x.dtype, w.dtype)
    if dtype is not None:  # products in the accumulation dtype (16-bit inputs, float32 accumulation: exact products)
      xr, wr = xr.cast(dtype), wr.cast(dtype)
    return (xr * wr).sum(-1, dtype=dtype).cast(out)

  def matmul(self, x: Tensor, reverse: bool = False, dtype: DType | str | None = None, acc_dtype: DType | str | None = None) -> Tensor:
    """self @ x (x @ self with reverse=True); see `dot`."""
    a: Tensor = self  # type: ignore[assignment]
    x = a._to_tensor(x) if not isinstance(x, type(a)) else x
    return x.dot(a, dtype, acc_dtype) if reverse else a.dot(x, dtype, acc_dtype)

  def linear(self, weight: Tensor, bias: Tensor | None = None, dtype: DType | str | None = None) -> Tensor:
    """self @ weight + bias with weight (in, out) like tinygrad (a 1-D weight scales elementwise)."""
    x = self * weight if weight.ndim == 1 else self.dot(weight, dtype)
    return x + bias if bias is not None else x

  def __matmul__(self, x) -> Tensor: return self.matmul(x)
  def __rmatmul__(self, x) -> Tensor: return self.matmul(x, True)

  @staticmethod
  def einsum(formula: str, *operands, dtype: DType | str | None = None, acc_dtype: DType | str | None = None) -> Tensor:
    """Einstein summation like numpy.einsum: explicit ('ij,jk->ik') or implicit output (letters seen once, sorted),
    repeated subscripts (traces/diagonals) and '...'. All operands are broadcast-multiplied and summed in one reduce."""
    ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
    if not ops: raise TensorError("einsum needs at least one operand")
    subs, out = _parse_einsum(formula, [o.shape for o in ops])
    views, sizes = [], {}
    for sub, t in zip(subs, ops):
      sub = list(sub)
      while len(set(sub)) != len(sub):  # repeated subscript: take the diagonal
        c = next(c for c in sub if sub.count(c) > 1)
        i = sub.index(c)
        t = _diagonal(t, i, sub.index(c, i + 1))
        del sub[sub.index(c, i + 1)]
      for c, s in zip(sub, t.shape):
        if not c.isascii() and s == 1: continue  # '...' dims broadcast
        if sizes.setdefault(c, s) != s:
          what = f"subscript {c!r}" if c.isascii() else "'...' dim"
          raise TensorError(f"einsum {what} has size {sizes[c]} in one operand and {s} in another ({formula!r})")
      views.append((sub, t))
    letters = list(out) + sorted(c for c in sizes if c not in out)
    for c in letters: sizes.setdefault(c, 1)
    aligned = []
    for sub, t in views:
      t = t.permute(*[sub.index(c) for c in letters if c in sub]) if sub else t
      dims = iter(t.shape)
      aligned.append(t.reshape(*[next(dims) if c in sub else 1 for c in letters]) if letters else t)
    prodt = aligned[0]
    for t in aligned[1:]: prodt = prodt * t
    prodt = prodt.expand(*[sizes[c] for c in letters]) if letters else prodt
    red = tuple(range(len(out), len(letters)))
    res_dtype = to_dtype(dtype or acc_dtype) if (dtype or acc_dtype) is not None else least_upper_dtype(*[o.dtype for o in ops])
    return (prodt.sum(red, dtype=dtype or acc_dtype) if red else prodt).cast(res_dtype)

  def sequential(self, ll: list) -> Tensor:
    """Apply the callables in `ll` in order."""
    x: Tensor = self  # type: ignore[assignment]
    for f in ll: x = f(x)
    return x

  # ***** activations *****
  def sigmoid(self) -> Tensor:
    """1 / (1 + exp(-x)); saturates to exactly 0/1 for large |x| (no overflow to nan)."""
    return _sigmoid(self)
  def logsigmoid(self) -> Tensor: return -_softplus(-self)
  def leaky_relu(self, neg_slope: float = 0.01) -> Tensor: return (self < 0).where(self * neg_slope, self)
  def relu6(self) -> Tensor: return self.relu() - (self - 6).relu()
  def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor: return -((-self.maximum(min_val)).maximum(-max_val))
  def elu(self, alpha: float = 1.0) -> Tensor: return (self > 0).where(self, alpha * (_float(self).exp() - 1))
  def celu(self, alpha: float = 1.0) -> Tensor: return (self > 0).where(self, alpha * ((_float(self) / alpha).exp() - 1))
  def selu(self, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor: return gamma * self.elu(alpha)
  def gelu(self, approximate: str = "tanh") -> Tensor:
    """GELU. approximate="tanh" (tinygrad's default): 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))); "none": x*Phi(x) via erf."""
    x = _float(self)
    if approximate == "tanh": return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    if approximate == "none": return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())
    raise TensorError(f"gelu approximate must be 'tanh' or 'none', got {approximate!r}")
  def quick_gelu(self) -> Tensor: return self * _sigmoid(self * 1.702)
  def silu(self) -> Tensor: return self * _sigmoid(self)
  def swish(self) -> Tensor: return self.silu()
  def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor: return (alpha * self + beta).relu() - (alpha * self + beta - 1).relu()
  def hardswish(self) -> Tensor: return self * (self + 3).relu6() * (1 / 6)
  def softplus(self, beta: float = 1.0) -> Tensor: return _softplus(self, beta)
  def mish(self) -> Tensor: return self * _softplus(self).tanh()
  def softsign(self) -> Tensor: return self / (1 + self.maximum(-self))

  def _softmax(self, axis: int, dtype: DType | str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    x: Tensor = self.cast(dtype) if dtype is not None else self  # type: ignore[attr-defined]
    x = _float(x)
    m = x - x._reduce(Ops.MAX, axis, keepdim=True).detach()  # raw max: a nan still makes the whole row nan, one kernel less
    e = m.exp()
    return m, e, e.sum(axis, keepdim=True)
  def softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along `axis`: three kernels (max, sum, divide). A 0-d tensor is one element."""
    if self.ndim == 0: return self.reshape(1).softmax(0, dtype).reshape(())
    if self.shape[self._axis(axis)] == 0: return _float(self.cast(dtype) if dtype is not None else self)  # nothing to normalize
    _, e, ss = self._softmax(axis, dtype)
    return e / ss
  def log_softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
    if self.ndim == 0: return self.reshape(1).log_softmax(0, dtype).reshape(())
    if self.shape[self._axis(axis)] == 0: return _float(self.cast(dtype) if dtype is not None else self)
    m, _, ss = self._softmax(axis, dtype)
    return m - ss.log()

  def softmin(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
    """softmax(-x) along `axis`."""
    return (-self).softmax(axis, dtype)

  # ***** normalization *****
  def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """x / max(||x||_p, eps) along `dim` (torch.nn.functional.normalize); p may be 0 (count of nonzeros) or +-inf. A zero
    vector stays zero, with finite gradients (torch)."""
    x = _float(self)
    if p == 0: norm = (x != 0).sum(dim, keepdim=True, dtype=x.dtype)  # the count of nonzeros (torch's 0-"norm")
    elif p in (math.inf, -math.inf): norm = x.abs().max(dim, keepdim=True) if p > 0 else x.abs().min(dim, keepdim=True)
    elif p == 2:  # a zero vector's norm is 0 with a zero (not nan) slope: sqrt is taken of 1 there
      ss = (x * x).sum(dim, keepdim=True)
      norm = (ss > 0).where((ss > 0).where(ss, 1).sqrt(), 0)
    else: norm = x.abs().pow(p).sum(dim, keepdim=True).pow(1 / p)
    return x / norm.maximum(eps)

  def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) over `axis` (biased variance), no affine."""
    y = self - self.mean(axis, keepdim=True)
    return y * _recip(((y * y).mean(axis, keepdim=True) + eps).sqrt())

  def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor, axis: int | Sequence[int] = 1) -> Tensor:
    """(x - mean) * weight * invstd + bias with the 1-D parameters laid along `axis` (channels, default 1)."""
    x: Tensor = self  # type: ignore[assignment]
    axes = tuple(x._axis(a) for a in ((axis,) if isinstance(axis, int) else axis))
    shape = tuple(s if i in axes else 1 for i, s in enumerate(x.shape))
    def lay(t: Tensor) -> Tensor: return t.reshape(shape) if t.ndim == len(axes) else t
    x = x - lay(mean)
    if weight is not None: x = x * lay(weight)
    x = x * lay(invstd)
    return x + lay(bias) if bias is not None else x

  # ***** convolution *****
  def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride=1, dilation=1, padding=0,
             dtype: DType | str | None = None) -> Tensor:
    """Cross-correlation like torch's conv2d over the trailing weight.ndim-2 dims (so also 1-D/3-D): x (N, Cin, *spatial),
    weight (Cout, Cin/groups, *kernel). padding: int, one per dim, or 2 per dim in torch's F.pad order (last dim first)."""
    x: Tensor = self  # type: ignore[assignment]
    nd = weight.ndim - 2
    if nd < 1: raise RuntimeError(f"conv weight needs at least 3 dims, got shape {weight.shape}")
    if x.ndim != weight.ndim: raise RuntimeError(f"conv: expected {weight.ndim}-D input for weight of shape {weight.shape}, got shape {x.shape}")
    if not isinstance(groups, int) or groups < 1: raise TensorError(f"conv groups must be a positive int, got {groups!r}")
    (_, cin_all), (cout, cin), ks = x.shape[:2], weight.shape[:2], weight.shape[2:]
    if cin * groups != cin_all:
      raise RuntimeError(f"conv: input {x.shape} has {cin_all} channels but weight {weight.shape} with groups={groups} expects {cin * groups}")
    if cout % groups: raise RuntimeError(f"conv: out channels {cout} of weight {weight.shape} not divisible by groups={groups}")
    if bias is not None and tuple(bias.shape) != (cout,): raise RuntimeError(f"conv: bias shape {bias.shape} should be ({cout},)")
    stride, dilation = _tuple(stride, nd, "stride"), _tuple(dilation, nd, "dilation")
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation): raise TensorError(f"conv stride {stride} and dilation {dilation} must be >= 1")
    if isinstance(padding, str):
      if padding not in ("same", "valid"): raise TensorError(f"conv padding string must be 'same' or 'valid', got {padding!r}")
      if padding == "same" and any(s != 1 for s in stride): raise TensorError(f"conv padding='same' needs stride 1, got {stride}")
      tot = [d * (k - 1) if padding == "same" else 0 for k, d in zip(ks, dilation)]
      pads = [(t // 2, t - t // 2) for t in tot]
    else: pads = _resolve_pads(padding, nd)
    if any(_out_size(i + pb + pa, k, 1, d) < 1 for i, (pb, pa), k, d in zip(x.shape[2:], pads, ks, dilation)) or any(k < 1 for k in ks):
      raise RuntimeError(f"conv: kernel {tuple(ks)} (dilation {dilation}) is larger than the padded input "
                         f"{tuple(i + pb + pa for i, (pb, pa) in zip(x.shape[2:], pads))}")
    out_dt = to_dtype(dtype) if dtype is not None else least_upper_dtype(x.dtype, weight.dtype)
    ret = _conv(x, weight, groups, stride, dilation, pads, dtype)
    if dtypes.is_float(out_dt) and x.uop.op is not Ops.MULTI and weight.uop.op is not Ops.MULTI:
      # torch's derivatives as convolutions (_ConvVJP) instead of the adjoint of the window view (a masked gather)
      vjp = _ConvVJP(type(x), groups, stride, dilation, tuple(pads), None if dtype is None else to_dtype(dtype))
      ret = type(x)(UOp(Ops.CUSTOM_GRAD, ret.dtype, (ret.uop, x.uop, weight.uop), vjp))
    return ret if bias is None else ret + bias.reshape(1, cout, *[1] * nd)

  def conv1d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride=1, dilation=1, padding=0,
             dtype: DType | str | None = None) -> Tensor:
    """torch's conv1d: x (N, Cin, L), weight (Cout, Cin/groups, K)."""
    if weight.ndim != 3: raise RuntimeError(f"conv1d weight must be 3-D (Cout, Cin/groups, K), got shape {weight.shape}")
    return self.conv2d(weight, bias, groups, stride, dilation, padding, dtype)

  def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride=1, dilation=1, padding=0,
                       output_padding=0) -> Tensor:
    """Transposed conv like torch's: weight (Cin, Cout/groups, *kernel). Zero-stuffs the input by `stride` and runs conv2d
    with the flipped, in/out-swapped kernel and padding d*(k-1) - p (+ output_padding at the end)."""
    x: Tensor = self  # type: ignore[assignment]
    nd = weight.ndim - 2
    if nd < 1 or x.ndim != weight.ndim:
      raise RuntimeError(f"conv_transpose: weight {weight.shape} and input {x.shape} need the same number (>=3) of dims")
    if not isinstance(groups, int) or groups < 1: raise TensorError(f"conv groups must be a positive int, got {groups!r}")
    cin, rc, ks = weight.shape[0], weight.shape[1], weight.shape[2:]
    if x.shape[1] != cin: raise RuntimeError(f"conv_transpose: input {x.shape} has {x.shape[1]} channels, weight {weight.shape} expects {cin}")
    if cin % groups: raise RuntimeError(f"conv_transpose: in channels {cin} of weight {weight.shape} not divisible by groups={groups}")
    stride, dilation, opad = _tuple(stride, nd, "stride"), _tuple(dilation, nd, "dilation"), _tuple(output_padding, nd, "output_padding")
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation): raise TensorError(f"conv stride {stride} and dilation {dilation} must be >= 1")
    if any(not 0 <= op < max(s, d) for op, s, d in zip(opad, stride, dilation)):
      raise TensorError(f"output_padding {opad} must be smaller than stride {stride} or dilation {dilation}")
    w = weight.reshape(groups, cin // groups, rc, *ks).permute(0, 2, 1, *range(3, 3 + nd)).flip(*range(3, 3 + nd))
    w = w.reshape(groups * rc, cin // groups, *ks)
    if any(s > 1 for s in stride):  # insert s-1 zeros between input elements
      bs, c, ins = x.shape[0], x.shape[1], x.shape[2:]
      x = x.reshape(bs, c, *[v for i in ins for v in (i, 1)])._pad(((0, 0), (0, 0), *[p for s in stride for p in ((0, 0), (0, s - 1))]))
      x = x.reshape(bs, c, *[i * s for i, s in zip(ins, stride)]).shrink([None, None, *[(0, i * s - s + 1) for i, s in zip(ins, stride)]])
    pads = [((k - 1) * d - pb, (k - 1) * d - pa + op) for k, d, (pb, pa), op in zip(ks, dilation, _resolve_pads(padding, nd), opad)]
    flat = tuple(v for pb, pa in pads[::-1] for v in (pb, pa))
    return x.conv2d(w, bias, groups=groups, dilation=dilation, padding=flat)

  # ***** pooling *****
  def _pool_setup(self, kernel_size, stride, dilation, padding, ceil_mode: bool, name: str):
    """Validated (kernel, stride, dilation, explicit pads, extra right pads for ceil_mode, output sizes)."""
    x: Tensor = self  # type: ignore[assignment]
    nd = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    k = _tuple(kernel_size, nd, "kernel_size")
    s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else _tuple(stride, nd, "stride")
    d, pads = _tuple(dilation, nd, "dilation"), _resolve_pads(padding, nd)
    if x.ndim < nd: raise RuntimeError(f"{name}: kernel {k} needs an input of at least {nd} dims, got shape {x.shape}")
    if any(v < 1 for v in k + s + d): raise TensorError(f"{name}: kernel_size {k}, stride {s} and dilation {d} must be >= 1")
    eff = [dd * (kk - 1) + 1 for kk, dd in zip(k, d)]
    if any(p < 0 or 2 * p > e for pp, e in zip(pads, eff) for p in pp):
      raise TensorError(f"{name}: padding {padding} must be >= 0 and at most half the (dilated) kernel size {k}")
    outs, extra = [], []
    for i, (pb, pa), e, ss in zip(x.shape[x.ndim - nd:], pads, eff, s):
      span = i + pb + pa - e
      if span < 0: raise RuntimeError(f"{name}: kernel {k} (dilation {d}) is larger than the padded input {x.shape[x.ndim - nd:]}")
      o = (-(-span // ss) if ceil_mode else span // ss) + 1
      if ceil_mode and (o - 1) * ss >= i + pb: o -= 1  # the last window must start inside the input or left padding
      outs.append(o)
      extra.append(max(0, (o - 1) * ss + e - (i + pb + pa)))
    return k, s, d, pads, extra

  def avg_pool2d(self, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """Average over windows of the trailing len(kernel_size) dims (torch semantics for padding, ceil_mode and the divisor)."""
    x: Tensor = self  # type: ignore[assignment]
    k, s, d, pads, extra = x._pool_setup(kernel_size, stride, dilation, padding, ceil_mode, "avg_pool2d")
    nd = len(k)
    full = [(pb, pa + e) for (pb, pa), e in zip(pads, extra)]
    summed = _pool_view(_pad_spatial(_float(x), full), k, s, d).sum(tuple(range(-nd, 0)))
    if not any(e for e in extra) and (count_include_pad or not any(p for pp in pads for p in pp)):
      return (summed / math.prod(k)).cast(least_upper_float(x.dtype))
    ones = x._const_like(1.0, dtypes.float32).shrink([(0, 1)] * (x.ndim - nd) + [None] * nd).reshape(x.shape[x.ndim - nd:])
    if count_include_pad: ones = _pad_spatial(ones, pads, 1.0)
    cnt = _pool_view(_pad_spatial(ones, [(0, e) for e in extra] if count_include_pad else full), k, s, d).sum(tuple(range(-nd, 0)))
    return summed / cnt.cast(summed.dtype)

  def max_pool2d(self, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode: bool = False, return_indices: bool = False):
    """Max over windows of the trailing len(kernel_size) dims; padding never wins (it is the dtype's minimum).
    return_indices=True also returns, like torch, the int32 index of the (first) max in the flattened pooled dims."""
    x: Tensor = self  # type: ignore[assignment]
    k, s, d, pads, extra = x._pool_setup(kernel_size, stride, dilation, padding, ceil_mode, "max_pool2d")
    nd, full = len(k), [(pb, pa + e) for (pb, pa), e in zip(pads, extra)]
    win = _pool_view(_pad_spatial(x, full, dtypes.min(x.dtype)), k, s, d)
    out = win.max(tuple(range(-nd, 0)))
    if not return_indices: return out
    sp = x.shape[x.ndim - nd:]
    idx = _pool_view(_pad_spatial(_arange(x, math.prod(sp)).reshape(sp), full), k, s, d)
    big = math.prod(sp) + 1
    hit = win == out.reshape(*out.shape, *[1] * nd)
    first = -(hit.where(-idx, -big)).max(tuple(range(-nd, 0)))  # smallest index among the maxima
    return out, first

  def max_unpool2d(self, indices: Tensor, kernel_size=(2, 2), stride=None, dilation=1, padding=0, output_size=None) -> Tensor:
    """The inverse of max_pool2d(return_indices=True): each value goes to its index in the flattened output plane,
    zeros elsewhere. output_size defaults to (in - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1 per dim."""
    x: Tensor = self  # type: ignore[assignment]
    k = _tuple(kernel_size, 2, "kernel_size")
    s, d, p = _tuple(k if stride is None else stride, 2, "stride"), _tuple(dilation, 2, "dilation"), _tuple(padding, 2, "padding")
    if x.ndim < 2 or indices.shape != x.shape: raise TensorError(f"max_unpool2d: indices {indices.shape} must match input {x.shape} (>= 2 dims)")
    if output_size is None: out = tuple((i - 1) * ss - 2 * pp + dd * (kk - 1) + 1 for i, kk, ss, dd, pp in zip(x.shape[-2:], k, s, d, p))
    else: out = tuple(output_size)[-2:]
    n_in, n_out = x.shape[-2] * x.shape[-1], out[0] * out[1]
    hit = indices.reshape(*x.shape[:-2], n_in, 1) == _arange(x, n_out, indices.dtype).reshape(1, n_out)
    ret = hit.where(x.reshape(*x.shape[:-2], n_in, 1), 0).sum(-2, dtype=x.dtype)
    return ret.reshape(*x.shape[:-2], *out)

  # ***** attention *****
  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                   is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
    """softmax(q @ k^T / sqrt(d) + mask) @ v. A bool mask keeps True entries; a float mask is added. is_causal keeps
    key j <= query i (top-left aligned lower triangle)."""
    q: Tensor = self  # type: ignore[assignment]
    if q.ndim < 2 or key.ndim < 2 or value.ndim < 2:
      raise RuntimeError(f"sdpa needs >= 2-D query/key/value, got {q.shape}, {key.shape}, {value.shape}")
    if q.shape[-1] != key.shape[-1]: raise RuntimeError(f"sdpa: query {q.shape} and key {key.shape} have different embedding dims")
    if key.shape[-2] != value.shape[-2]: raise RuntimeError(f"sdpa: key {key.shape} and value {value.shape} have different lengths")
    if enable_gqa and key.ndim >= 3 and q.ndim >= 3 and key.shape[-3] != q.shape[-3]:
      hq, hk = q.shape[-3], key.shape[-3]
      if hq % hk: raise RuntimeError(f"sdpa enable_gqa: {hq} query heads not a multiple of {hk} key heads ({q.shape}, {key.shape})")
      def rep(t: Tensor) -> Tensor:
        return t.reshape(*t.shape[:-2], 1, *t.shape[-2:]).expand(*t.shape[:-2], hq // hk, *t.shape[-2:]).reshape(*t.shape[:-3], hq, *t.shape[-2:])
      key, value = rep(key), rep(value)
    kt = key.permute(*range(key.ndim - 2), key.ndim - 1, key.ndim - 2)
    qk = q.matmul(kt, dtype=least_upper_dtype(q.dtype, key.dtype, dtypes.float32)) * (1 / math.sqrt(q.shape[-1]))
    if is_causal:
      if attn_mask is not None: raise RuntimeError("sdpa: can't set attn_mask when is_causal=True")
      L, S = qk.shape[-2:]
      attn_mask = _arange(q, L).reshape(L, 1) >= _arange(q, S).reshape(1, S)
    if attn_mask is not None:
      if attn_mask.dtype == dtypes.bool: attn_mask = attn_mask.where(0.0, -math.inf)
      qk = qk + attn_mask
    return qk.cast(q.dtype).softmax(-1).dropout(dropout_p) @ value

  def dropout(self, p: float = 0.5) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) when Tensor.training; identity otherwise."""
    if not 0.0 <= p <= 1.0: raise TensorError(f"dropout probability must be in [0, 1], got {p}")
    x: Tensor = self  # type: ignore[assignment]
    T = type(x)
    if not T.training or p == 0: return x
    if p == 1: return x * 0
    if not hasattr(T, "rand"): raise RuntimeError("dropout in training mode needs Tensor.rand, which this build doesn't have")
    return (T.rand(*x.shape, device=x.device) >= p).where(x, 0) * (1 / (1 - p))

  # ***** losses *****
  def one_hot(self, num_classes: int) -> Tensor:
    """int32 tensor with a trailing axis of `num_classes` holding 1 at each index (a value outside 0..num_classes-1 gives
    a row of zeros). As tinygrad (and jax), num_classes is given: torch's -1 would read the data to infer it."""
    x: Tensor = self  # type: ignore[assignment]
    if not dtypes.is_int(x.dtype): raise TensorTypeError(f"one_hot needs an integer tensor, got {x.dtype}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 0:
      hint = " (it is not inferred: pass int(t.max().item()) + 1 for torch's -1)" if num_classes == -1 else ""
      raise TensorError(f"one_hot num_classes must be a non-negative int, got {num_classes!r}{hint}")
    return (x.reshape(*x.shape, 1) == _arange(x, num_classes, x.dtype)).where(1, 0)

  def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """torch's cross_entropy on logits with classes on axis 1 (axis 0 for 1-D input). Y: class indices (one dim less)
    or class probabilities (same shape)."""
    x: Tensor = self  # type: ignore[assignment]
    _check_smoothing(label_smoothing)
    cax = 1 if x.ndim > 1 else 0
    C = x.shape[cax]
    if Y.ndim == x.ndim - 1:
      if tuple(Y.shape) != tuple(x.shape[:cax] + x.shape[cax + 1:]): raise TensorError(f"cross_entropy: target {Y.shape} doesn't fit input {x.shape}")
      Y = Y.one_hot(C)
      Y = Y.permute(*range(cax), Y.ndim - 1, *range(cax, Y.ndim - 1)) if cax else Y
    elif tuple(Y.shape) != tuple(x.shape): raise TensorError(f"cross_entropy: target {Y.shape} must be class indices or match input {x.shape}")
    Y = Y.cast(least_upper_float(x.dtype)) * (1 - label_smoothing) + label_smoothing / C
    return _reduction(-(x.log_softmax(cax) * Y).sum(cax), reduction)

  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """Cross entropy of logits with classes on the LAST axis and integer labels Y (self.shape[:-1]); labels equal to
    ignore_index contribute nothing, and "mean" divides by the number of other labels."""
    x: Tensor = self  # type: ignore[assignment]
    _check_smoothing(label_smoothing)
    if tuple(Y.shape) != tuple(x.shape[:-1]): raise TensorError(f"sparse_categorical_crossentropy: labels {Y.shape} should have shape {x.shape[:-1]}")
    logp = x.log_softmax(-1)
    keep = Y != ignore_index
    y = Y.one_hot(x.shape[-1]) * keep.reshape(*Y.shape, 1)
    nll = -(logp * y).sum(-1)
    smooth = -logp.mean(-1) * keep
    loss = (1 - label_smoothing) * nll + label_smoothing * smooth
    return _reduction(loss, reduction, keep.sum() if reduction == "mean" else None)

  def nll_loss(self, Y: Tensor, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """torch's nll_loss: self holds log-probabilities with classes on axis 1 (axis 0 for 1-D), Y the class indices.
    "mean" divides by the summed weights of the targets that aren't ignore_index."""
    x: Tensor = self  # type: ignore[assignment]
    cax = 1 if x.ndim > 1 else 0
    want = x.shape[:cax] + x.shape[cax + 1:]
    if tuple(Y.shape) != want: raise TensorError(f"nll_loss: target shape {Y.shape} must be {want} for input {x.shape}")
    n = x.shape[cax]
    xm = x.permute(*[i for i in range(x.ndim) if i != cax], cax)
    hit = Y.reshape(*Y.shape, 1) == _arange(x, n, Y.dtype)
    w = hit.where(1.0, 0.0).cast(xm.dtype) if weight is None else hit.where(weight.cast(xm.dtype), 0.0)
    w = (Y != ignore_index).reshape(*Y.shape, 1).where(w, 0.0)
    loss = -(w * xm).sum(-1)
    if reduction == "mean": return loss.sum() / w.sum()
    return _reduction(loss, reduction)

  def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
    """-(y log p + (1-y) log(1-p)) with the logs clamped at -100 like torch."""
    p: Tensor = _float(self)  # type: ignore[arg-type]
    return _reduction(-(Y * p.log().maximum(-100.0) + (1 - Y) * (1 - p).log().maximum(-100.0)), reduction)

  def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """binary_crossentropy(sigmoid(x), Y) computed stably from logits."""
    x: Tensor = _float(self)  # type: ignore[arg-type]
    logp, log1mp = -_softplus(-x), -_softplus(x)
    return _reduction(-((1 if pos_weight is None else pos_weight) * Y * logp + (1 - Y) * log1mp), reduction)

  # ***** resampling *****
  def interpolate(self, size: Sequence[int], mode: str = "linear", align_corners: bool = False) -> Tensor:
    """Resize the trailing len(size) dims. mode "linear" (also "bilinear"/"trilinear") interpolates along each of them
    like torch (half-pixel centers unless align_corners); "nearest" and "nearest-exact" pick floor(o*in/out) and
    floor((o+0.5)*in/out). Each dim is one small matrix contraction. uint8 input resamples as torch's uint8 bilinear does
    (16-bit fixed-point weights, rounded and clamped after each dim, the last dim first): the same bytes."""
    x: Tensor = self  # type: ignore[assignment]
    size = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    if not size or len(size) > x.ndim or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size):
      raise TensorError(f"interpolate size {size} must be 1..{x.ndim} positive ints for input {x.shape}")
    need = {"bilinear": 2, "trilinear": 3}.get(mode)
    if need is not None and len(size) != need: raise TensorError(f"interpolate mode {mode!r} needs {need} sizes, got {size}")
    if mode not in ("linear", "bilinear", "trilinear", "nearest", "nearest-exact"): raise TensorError(f"interpolate: unknown mode {mode!r}")
    if align_corners and mode.startswith("nearest"): raise TensorError("align_corners only applies to linear modes")
    out_dt = x.dtype if mode.startswith("nearest") else least_upper_float(x.dtype)
    res = x
    if x.dtype == dtypes.uint8 and not mode.startswith("nearest"):  # torch's fixed-point uint8 path, last dim first
      for ax, n_out in reversed(list(zip(range(x.ndim - len(size), x.ndim), size))):
        if x.shape[ax] != n_out: res = _uint8_linear_pass(res, ax, n_out, align_corners)
      return res
    for ax, n_out in zip(range(x.ndim - len(size), x.ndim), size):
      n_in = x.shape[ax]
      if n_in == n_out: continue  # every mode maps an axis onto itself identically
      src = _arange(x, n_in).reshape(1, n_in)
      o = _arange(x, n_out).reshape(n_out, 1)
      if mode.startswith("nearest"):
        idx = (o * n_in) // n_out if mode == "nearest" else ((2 * o + 1) * n_in) // (2 * n_out)
        W = (idx == src).cast(x.dtype)  # idx < n_in always
      else:
        of = o.cast(out_dt)
        if align_corners: pos = of * ((n_in - 1) / (n_out - 1)) if n_out > 1 else of * 0.0
        else: pos = ((of + 0.5) * (n_in / n_out) - 0.5).maximum(0.0)
        lo = pos.cast(dtypes.int32)
        lo = (lo < n_in - 1).where(lo, n_in - 1)
        hi = (lo + 1 < n_in - 1).where(lo + 1, n_in - 1)
        frac = pos - lo.cast(out_dt)
        W = (lo == src).where(1 - frac, 0.0) + (hi == src).where(frac, 0.0)
        W = W.cast(out_dt)
      perm = [i for i in range(res.ndim) if i != ax] + [ax]
      moved = res.permute(*perm)
      y = (moved.reshape(*moved.shape[:-1], 1, n_in).cast(W.dtype) * W).sum(-1)
      inv = [0] * res.ndim
      for i, p in enumerate(perm): inv[p] = i
      res = y.permute(*inv)
    if dtypes.is_int(x.dtype) and not mode.startswith("nearest"): return res.round().clip(dtypes.min(x.dtype), dtypes.max(x.dtype)).cast(x.dtype)
    return res.cast(out_dt)
