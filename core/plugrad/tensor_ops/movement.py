"""Tensor ops mixin: movement and indexing. Methods here are written only in terms of Tensor's primitives (see plugrad/tensor.py).

Basic indexing (ints, slices with any step, None, Ellipsis) is pure movement ops: no kernel. Advanced indexing
(int/bool tensors, lists) follows numpy's rules, except that ints select first (as torch and tinygrad: `x[1, :, t]` puts
t's dims after the slice, numpy would put them first), and is built as one-hot comparisons against an arange and a
sum, which fuses. `__setitem__` stores into the realized buffer through an ASSIGN node, or rebuilds an unrealized tensor
functionally with `where`.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from plugrad.errors import TensorError, TensorIndexError, TensorModeError, TensorTypeError
from plugrad.live import all_tensors
from plugrad.uop.buffers import buffer_of, is_buffer_view
from plugrad.dtype import dtypes, least_upper_dtype
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.symbolic import ssimplify


def _ints(args: tuple) -> tuple:
  return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _tensor_list(first: Any, rest: tuple, name: str) -> list:
  """The tensors of cat/stack called as a method (x.cat(y)) or on the class with a sequence (Tensor.cat((x, y)))."""
  if isinstance(first, (list, tuple)) and rest:  # Tensor.stack((a, b), c): the sequence form takes one argument
    raise TensorTypeError(f"{name} takes the tensors as arguments or as one sequence, not both: got a {type(first).__name__} and "
                          f"{len(rest)} more argument(s) ({', '.join(type(t).__name__ for t in rest)}); dim is a keyword argument")
  ts = [*first] if isinstance(first, (list, tuple)) else [first, *rest]
  if not ts: raise TensorTypeError(f"{name} needs at least one tensor")
  kind = next((type(t) for t in ts if not isinstance(t, (list, tuple, int, float, bool))), None)
  if kind is None or not all(isinstance(t, kind) for t in ts):
    raise TensorTypeError(f"{name} takes tensors, got {[type(t).__name__ for t in ts]}")
  return ts


def _check_size(size: Any, name: str) -> int:
  if not isinstance(size, int) or isinstance(size, bool) or size < 0: raise TensorError(f"{name} size must be an int >= 0, got {size!r}")
  return size


def _first_true(flags: Any, size: int) -> Any:
  """(n, size) bool: flags[i] is the (r+1)-th True of the 1-D bool tensor `flags` (r < size): which output each fills."""
  pos = flags.cast(dtypes.int32).cumsum(0) - 1
  out = type(flags).arange(size, device=flags.device).reshape(1, size)
  return flags.unsqueeze(1)._binop(Ops.AND, pos.unsqueeze(1)._binop(Ops.CMPEQ, out))


def _has_tensor(e: Any) -> bool:
  return any(_has_tensor(v) if isinstance(v, (list, tuple)) else not isinstance(v, (int, float, bool, np.generic)) for v in e)


def _stack_index(e: Any, Tensor: Any, device: str) -> Any:
  """A (nested) list of ints and int tensors as one int32 index tensor (numpy's rule: the list is an array)."""
  if not isinstance(e, (list, tuple)): return e.cast(dtypes.int32) if isinstance(e, Tensor) else Tensor(e, device=device, dtype=dtypes.int32)
  parts = [_stack_index(v, Tensor, device) for v in e]
  if not parts: return Tensor.zeros(0, dtype=dtypes.int32, device=device)
  return parts[0].stack(*parts[1:])


def _combine(a: Any, b: Any) -> Any:
  """a + b of two same-dtype tensors where at most one is nonzero at every position (OR for bool)."""
  return a._alu(Ops.OR if a.dtype == dtypes.bool else Ops.ADD, b)


def _not_bits(x: Any) -> Any:
  """An order-reversing bijection: -x for floats, ~x for ints (min(x) = f(max(f(x))))."""
  if dtypes.is_float(x.dtype): return x._alu(Ops.NEG)
  return x._alu(Ops.XOR, x._const_like(-1 if not dtypes.is_unsigned(x.dtype) else dtypes.max(x.dtype)))


def _rearrange_side(side: str, formula: str) -> list[list[str]]:
  """One side of an einops formula as groups of atoms: `a (b c) 1 ...` -> [["a"], ["b", "c"], [], ["..."]]. A bare
  name is a group of one, `1` and `()` are empty groups (a unit axis); a bare `...` is the group ["..."] and `(...)`
  (merged) is ["...", ""] so the two stay apart."""
  groups: list[list[str]] = []
  cur: list[str] | None = None
  for tok in side.replace("…", "...").replace("(", " ( ").replace(")", " ) ").split():
    if tok == "(":
      if cur is not None: raise TensorError(f"rearrange: nested parentheses in {formula!r}")
      cur = []
    elif tok == ")":
      if cur is None: raise TensorError(f"rearrange: unbalanced ')' in {formula!r}")
      groups.append(cur + [""] if cur == ["..."] else cur)
      cur = None
    elif tok == "1":
      if cur is not None: raise TensorError(f"rearrange: '1' inside parentheses in {formula!r}")
      groups.append([])
    elif tok == "..." or (tok.isidentifier() and not tok.startswith("_") and not tok.endswith("_")):
      if cur is not None: cur.append(tok)
      else: groups.append([tok])
    else: raise TensorError(f"rearrange: invalid axis name {tok!r} in {formula!r} (identifiers not starting or ending with '_', '...', '1')")
  if cur is not None: raise TensorError(f"rearrange: unbalanced '(' in {formula!r}")
  atoms = [a for g in groups for a in g if a]
  if len(atoms) != len(set(atoms)): raise TensorError(f"rearrange: an axis name appears twice on one side of {formula!r}")
  return groups


def _expand_ellipsis(groups: list[list[str]], ell: list[str]) -> list[list[str]]:
  """Groups with a bare `...` replaced by one group per ellipsis dim and `...` inside a group by all of them."""
  out: list[list[str]] = []
  for g in groups:
    if g == ["..."]: out += [[x] for x in ell]
    else: out.append([x for a in g if a for x in (ell if a == "..." else [a])])
  return out

class MovementMixin:
  __slots__ = ()

  # ***** shape views *****
  def view(self, shape, *args) -> Any: return self.reshape(shape, *args)

  def transpose(self, dim0: int = 1, dim1: int = 0) -> Any:
    order = list(range(self.ndim))
    a, b = self._axis(dim0), self._axis(dim1)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  @property
  def T(self) -> Any: return self if self.ndim < 2 else self.transpose()

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Any:
    if self.ndim == 0: return self.reshape(1)
    s, e = self._axis(start_dim), self._axis(end_dim)
    if s > e: raise TensorError(f"flatten start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
    return self.reshape(self.shape[:s] + (math.prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

  def unflatten(self, dim: int, sizes: Sequence[int]) -> Any:
    d = self._axis(dim)
    sizes = tuple(sizes)
    if sizes.count(-1) == 1:
      known = math.prod(s for s in sizes if s != -1)
      if known == 0 or self.shape[d] % known: raise TensorError(f"unflatten: can't split dim {dim} of size {self.shape[d]} into {sizes}")
      sizes = tuple(self.shape[d] // known if s == -1 else s for s in sizes)
    if math.prod(sizes) != self.shape[d]: raise TensorError(f"unflatten: sizes {sizes} don't multiply to dim {dim} of size {self.shape[d]}")
    return self.reshape(self.shape[:d] + sizes + self.shape[d + 1:])

  def rearrange(self, formula: str, **sizes: int) -> Any:
    """einops' rearrange: `"b (h w) c -> b c h w"` splits, permutes and merges axes by name (`...` stands for the
    axes not named, `1`/`()` for a unit axis); `sizes` gives the sizes a split needs beyond the one it can infer.
    Only movement ops: reshape, permute, reshape."""
    if not isinstance(formula, str) or formula.count("->") != 1: raise TensorError(f"rearrange needs one '->' in the formula, got {formula!r}")
    lhs, rhs = (_rearrange_side(s, formula) for s in formula.split("->"))
    if any("..." in g and len(g) > 1 for g in lhs): raise TensorError(f"rearrange: '...' can't be inside parentheses on the left of {formula!r}")
    left, right = [a for g in lhs for a in g if a], [a for g in rhs for a in g if a]
    if set(left) != set(right): raise TensorError(f"rearrange: axes {sorted(set(left) ^ set(right))} appear on only one side of {formula!r}")
    if (extra := [n for n in sizes if n not in left]): raise TensorError(f"rearrange: sizes given for axes {extra} not on the left of {formula!r}")
    if (bad := {n: v for n, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}):
      raise TensorError(f"rearrange: axis sizes must be non-negative ints, got {bad}")
    if "..." in left:  # the ellipsis is one group of the left side: it covers every dim the named groups don't
      if (n_ell := self.ndim - (len(lhs) - 1)) < 0:
        raise TensorError(f"rearrange: {formula!r} names {len(lhs) - 1} dims besides '...' but the tensor has shape {self.shape}")
      ell = [f"...{i}" for i in range(n_ell)]
      lhs, rhs = _expand_ellipsis(lhs, ell), _expand_ellipsis(rhs, ell)
    else: lhs, rhs = _expand_ellipsis(lhs, []), _expand_ellipsis(rhs, [])
    if len(lhs) != self.ndim:
      raise TensorError(f"rearrange: the left of {formula!r} has {len(lhs)} dims, the tensor {self.ndim} (shape {self.shape})")
    known: dict[str, int] = dict(sizes)
    for g, dim in zip(lhs, self.shape):
      unknown = [a for a in g if a not in known]
      k = math.prod(known[a] for a in g if a in known)
      if len(unknown) > 1: raise TensorError(f"rearrange: can't infer the sizes of {unknown} in {formula!r}: give all but one as keywords")
      if unknown:
        if k == 0 or dim % k: raise TensorError(f"rearrange: dim of size {dim} can't split into {g} with known sizes {[known.get(a) for a in g]}")
        known[unknown[0]] = dim // k
      elif k != dim: raise TensorError(f"rearrange: dim of size {dim} doesn't match {'(' + ' '.join(g) + ')' if g else '1'} = {k} in {formula!r}")
    atoms = [a for g in lhs for a in g]
    t = self.reshape(tuple(known[a] for a in atoms))
    t = t.permute(tuple(atoms.index(a) for g in rhs for a in g))
    return t.reshape(tuple(math.prod(known[a] for a in g) for g in rhs))

  def squeeze(self, dim: int | Sequence[int] | None = None) -> Any:
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    dims = {self._axis(d) for d in ((dim,) if isinstance(dim, int) else dim)}  # a 0-d tensor takes dim 0 or -1, as torch
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in dims and s == 1)))

  def unsqueeze(self, dim: int) -> Any:
    d = self._axis(dim, self.ndim + 1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

  # ***** padding *****
  def _pad_pairs(self, padding) -> list[tuple[int, int]]:
    padding = tuple(padding)
    if padding and all(p is None or isinstance(p, (tuple, list)) for p in padding):
      if len(padding) != self.ndim: raise TensorError(f"pad: {len(padding)} (before, after) pairs for a tensor of shape {self.shape}")
      pairs = [(0, 0) if p is None else tuple(p) for p in padding]
      if any(len(p) != 2 for p in pairs): raise TensorError(f"pad: each entry must be a (before, after) pair, got {padding}")
    else:
      if len(padding) % 2 or len(padding) // 2 > self.ndim:
        raise TensorError(f"pad: flat padding {padding} must have an even length <= 2*ndim for shape {self.shape}")
      pairs = [(0, 0)] * self.ndim
      for i in range(len(padding) // 2): pairs[self.ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
    for p in pairs:
      if any(isinstance(v, bool) or not isinstance(v, int) for v in p): raise TypeError(f"pad amounts must be ints, got {padding}")
    return [tuple(p) for p in pairs]

  def pad(self, padding, mode: str = "constant", value: float = 0.0) -> Any:
    """Pad with torch's flat format (last dim first) or a tuple of (before, after) pairs per dim; negative pads shrink."""
    if mode not in ("constant", "reflect", "replicate", "circular"):
      raise TensorModeError(f"pad mode {mode!r} is not one of constant, reflect, replicate, circular")
    pairs = self._pad_pairs(padding)
    for (b, a), s in zip(pairs, self.shape):
      if -b - a > s or -b > s or -a > s: raise TensorError(f"pad {pairs} shrinks a dim of shape {self.shape} below zero")
    shrink = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape))
    # as torch: constant and circular padding crop the negative pads first (circular then wraps what is left), reflect
    # and replicate pad the whole tensor and crop after
    crop_first = mode in ("constant", "circular")
    x = self.shrink(shrink) if crop_first else self
    pos = [(max(0, b), max(0, a)) for b, a in pairs]
    if mode == "constant":
      ret = x._pad(tuple(pos))
      if value != 0 and any(b or a for b, a in pos):
        mask = type(self).ones(x.shape, dtype=dtypes.bool, device=x.device)._pad(tuple(pos))
        ret = mask.where(ret, value)
      return ret
    for d, (b, a) in enumerate(pos):
      if not b and not a: continue
      s = x.shape[d]
      if mode == "reflect" and (b >= s or a >= s): raise TensorError(f"reflect pad ({b}, {a}) must be smaller than dim {d} of size {s}")
      if mode == "circular" and (b > s or a > s):
        raise TensorError(f"circular pad ({b}, {a}) would wrap around dim {d} (size {s} after negative pads) more than once")
      if s == 0: raise TensorError(f"can't {mode}-pad dim {d} of size 0")
      def sl(lo, hi, d=d): return x.shrink(tuple((lo, hi) if i == d else None for i in range(x.ndim)))
      if mode == "reflect": left, right = sl(1, b + 1).flip(d), sl(s - a - 1, s - 1).flip(d)
      elif mode == "replicate":
        left = sl(0, 1).expand(tuple(b if i == d else n for i, n in enumerate(x.shape)))
        right = sl(s - 1, s).expand(tuple(a if i == d else n for i, n in enumerate(x.shape)))
      else: left, right = sl(s - b, s), sl(0, a)
      x = left.cat(x, right, dim=d)
    if crop_first: return x
    return x.shrink(tuple((lo, lo + s - max(0, -b) - max(0, -a) + pb + pa) for (lo, _), (b, a), s, (pb, pa) in zip(shrink, pairs, self.shape, pos)))

  # ***** joining and splitting *****
  def cat(self, *args, dim: int = 0) -> Any:
    """Concatenate along `dim`; `Tensor.cat((a, b))` and `Tensor.cat([a, b])` work too."""
    ts = _tensor_list(self, args, "cat")
    self = ts[0]
    if any(t.ndim == 0 for t in ts):  # tinygrad: IndexError (no dim to join on), torch: RuntimeError; this is both
      raise TensorIndexError(f"cat: zero-dimensional tensors can't be concatenated, got {[tuple(x.shape) for x in ts]}")
    d = self._axis(dim)
    for t in ts:
      if t.ndim != self.ndim or any(i != d and a != b for i, (a, b) in enumerate(zip(t.shape, self.shape))):
        raise TensorError(f"cat: shapes {[tuple(x.shape) for x in ts]} must match except in dim {dim}")
    dt = least_upper_dtype(*(t.dtype for t in ts))
    ts = [t.cast(dt) for t in ts]
    total, off, ret = sum(t.shape[d] for t in ts), 0, None
    for t in ts:
      p = t._pad(tuple((off, total - off - t.shape[d]) if i == d else (0, 0) for i in range(t.ndim)))
      off += t.shape[d]
      ret = p if ret is None else _combine(ret, p)
    return ret

  def stack(self, *args, dim: int = 0) -> Any:
    """Stack equal-shaped tensors along a new `dim`; `Tensor.stack((a, b))` and `Tensor.stack([a, b])` work too."""
    ts = _tensor_list(self, args, "stack")
    self = ts[0]
    for t in ts:
      if t.shape != self.shape: raise TensorError(f"stack: all shapes must be equal, got {[tuple(x.shape) for x in ts]}")
    d = self._axis(dim, self.ndim + 1)
    return ts[0].unsqueeze(d).cat(*[t.unsqueeze(d) for t in ts[1:]], dim=d)

  def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple:
    d = self._axis(dim)
    n = self.shape[d]
    if isinstance(sizes, int):
      if sizes <= 0: raise TensorError(f"split size must be positive, got {sizes}")
      sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
    if sum(sizes) != n: raise TensorError(f"split sizes {list(sizes)} must sum to dim {dim} of size {n}")
    out, off = [], 0
    for s in sizes:
      out.append(self.shrink(tuple((off, off + s) if i == d else None for i in range(self.ndim))))
      off += s
    return tuple(out)

  def chunk(self, chunks: int, dim: int = 0) -> tuple:
    if not isinstance(chunks, int) or chunks <= 0: raise TensorError(f"chunk count must be a positive int, got {chunks!r}")
    d = self._axis(dim)
    return self.split(max(1, -(-self.shape[d] // chunks)), d)

  def repeat(self, repeats, *args) -> Any:
    reps = _ints((repeats, *args))
    if len(reps) < self.ndim: raise TensorError(f"repeat needs at least {self.ndim} repeats for shape {self.shape}, got {reps}")
    base = self.reshape((1,) * (len(reps) - self.ndim) + self.shape)
    inter = tuple(v for s in base.shape for v in (1, s))
    exp = tuple(v for r, s in zip(reps, base.shape) for v in (r, s))
    return base.reshape(inter).expand(exp).reshape(tuple(r * s for r, s in zip(reps, base.shape)))

  def repeat_interleave(self, repeats: int, dim: int | None = None) -> Any:
    if not isinstance(repeats, int) or repeats < 0: raise TensorError(f"repeat_interleave needs an int repeats >= 0, got {repeats!r}")
    x, d = (self.flatten(), 0) if dim is None else (self, self._axis(dim))
    x = x.unsqueeze(d + 1)
    return x.expand(x.shape[:d + 1] + (repeats,) + x.shape[d + 2:]).flatten(d, d + 1)

  def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Any:
    if dims is None: return self.flatten().roll(shifts, 0).reshape(self.shape)
    shifts, dims = (shifts,) if isinstance(shifts, int) else tuple(shifts), (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims): raise TensorError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
    x = self
    for sh, dm in zip(shifts, dims):
      d = x._axis(dm)
      s = x.shape[d]
      if s == 0 or sh % s == 0: continue
      k = sh % s
      rep = x.repeat(tuple(2 if i == d else 1 for i in range(x.ndim)))
      x = rep.shrink(tuple((s - k, 2 * s - k) if i == d else None for i in range(x.ndim)))
    return x

  # ***** gather / scatter *****
  def _onehot(self, idx: Any, n: int) -> Any:
    """idx[..., None] == arange(n) with negative indices wrapped."""
    idx = idx.cast(dtypes.int32) if idx.dtype != dtypes.int32 else idx
    idx = (idx < 0).where(idx + n, idx)
    return idx.unsqueeze(-1)._binop(Ops.CMPEQ, type(self).arange(n, device=self.device))

  def _check_index_tensor(self, name: str, index: Any, dim: int) -> None:
    if not dtypes.is_int(index.dtype): raise TypeError(f"{name}: index must be an int tensor, got {index.dtype}")
    if index.ndim != self.ndim: raise TensorError(f"{name}: index {index.shape} must have as many dims as input {self.shape}")
    for i, (a, b) in enumerate(zip(index.shape, self.shape)):
      if i != dim and a > b: raise TensorError(f"{name}: index {index.shape} is larger than input {self.shape} in dim {i}")

  def gather(self, dim: int, index: Any) -> Any:
    """out[i][j] = self[index[i][j]][j] (dim 0); index may be smaller than self outside `dim`."""
    d = self._axis(dim)
    self._check_index_tensor("gather", index, d)
    x = self.shrink(tuple(None if i == d else (0, s) for i, s in enumerate(index.shape)))
    x = x.unsqueeze(-1).transpose(d, -1)  # self's `dim` moved last, size 1 left in its place
    return self._onehot(index, self.shape[d]).where(x, 0).sum(-1, dtype=x.dtype) if self.dtype != dtypes.bool else \
      self._onehot(index, self.shape[d]).where(x, False).max(-1)

  def _scatter_parts(self, dim: int, index: Any, src: Any):
    """(mask, srcv, hit): mask[..., s] says index picks target s, srcv is src cut to index's shape with a trailing 1."""
    d = self._axis(dim)
    self._check_index_tensor("scatter", index, d)
    if not isinstance(src, type(self)): srcv = type(self).full(index.shape, src, self.dtype, self.device)
    else:
      if src.dtype != self.dtype:  # tinygrad and torch refuse too: a silent cast would hide a narrowing
        raise TensorTypeError(f"scatter: src dtype {src.dtype} must equal the input's {self.dtype} (cast one first)")
      if src.ndim != index.ndim or any(a > b for a, b in zip(index.shape, src.shape)):
        raise TensorError(f"scatter: index {index.shape} must not be larger than src {src.shape}")
      srcv = src.shrink(tuple((0, s) for s in index.shape))
    return d, self._onehot(index, self.shape[d]), srcv.unsqueeze(-1)

  def _scatter_back(self, d: int, red: Any, index_shape: tuple, fill: Any) -> Any:
    """A tensor reduced over index's `d` (trailing axis = target position) moved into self's layout, padded with fill."""
    red = red.unsqueeze(d).transpose(d, -1).squeeze(-1)
    pads = tuple((0, 0) if i == d else (0, s - n) for i, (n, s) in enumerate(zip(red.shape, self.shape)))
    if fill == 0 or red.dtype == dtypes.bool and not fill: return red._pad(pads)
    return red.pad(pads, value=fill)

  def scatter(self, dim: int, index: Any, src: Any, reduce: str | None = None) -> Any:
    """self[index[i][j]][j] = src[i][j] (dim 0); with duplicate targets the last one wins. src: a tensor of self's dtype
    or a Python scalar. reduce ('add', 'multiply') takes a scalar src only, as tinygrad (torch deprecates it): a tensor
    src with a reduction is scatter_reduce."""
    if reduce is not None:
      if reduce not in ("add", "multiply"): raise TensorTypeError(f"scatter reduce must be None, 'add' or 'multiply', got {reduce!r}")
      if isinstance(src, type(self)):
        raise TensorTypeError(f"scatter with reduce={reduce!r} takes a scalar src; for a tensor src use "
                              f"scatter_reduce(dim, index, src, {'sum' if reduce == 'add' else 'prod'!r})")
      return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
    d, m, srcv = self._scatter_parts(dim, index, src)
    pos = type(self).arange(1, index.shape[d] + 1, device=self.device).reshape(tuple(-1 if i == d else 1 for i in range(index.ndim)) + (1,))
    last = m.where(pos, 0).max(d, keepdim=True)
    sel = m._alu(Ops.AND, pos._binop(Ops.CMPEQ, last))
    val = sel.where(srcv, 0).sum(d, dtype=self.dtype) if self.dtype != dtypes.bool else sel.where(srcv, False).max(d)
    hit = m.max(d)
    return self._scatter_back(d, hit, index.shape, False).where(self._scatter_back(d, val, index.shape, 0), self)

  def scatter_reduce(self, dim: int, index: Any, src: Any, reduce: str, include_self: bool = True) -> Any:
    """Reduce src values into self at index along dim: 'sum', 'prod', 'mean', 'amax', 'amin' (torch semantics)."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise TensorError(f"scatter_reduce reduce must be sum/prod/mean/amax/amin, got {reduce!r}")
    d, m, srcv = self._scatter_parts(dim, index, src)
    hit = self._scatter_back(d, m.max(d), index.shape, False)
    if reduce in ("sum", "mean"):
      red = self._scatter_back(d, m.where(srcv, 0).sum(d, dtype=self.dtype), index.shape, 0)
      ret = red + self if include_self else red
      if reduce == "mean":
        cnt = self._scatter_back(d, m.cast(dtypes.int32).sum(d), index.shape, 0) + (1 if include_self else 0)
        ret = ret / cnt.maximum(1)
        ret = ret.cast(self.dtype) if dtypes.is_float(self.dtype) else ret.cast(dtypes.float64).cast(self.dtype)
    elif reduce == "prod":
      red = self._scatter_back(d, m.where(srcv, 1).prod(d), index.shape, 1)
      ret = red * self if include_self else red
    else:
      f = (lambda t: t) if reduce == "amax" else _not_bits
      lo = dtypes.min(self.dtype)
      red = f(self._scatter_back(d, m.where(f(srcv), lo).max(d), index.shape, lo))
      ret = red.maximum(self) if reduce == "amax" and include_self else f(f(red).maximum(f(self))) if include_self else red
    return hit.where(ret.cast(self.dtype), self)

  def masked_fill(self, mask: Any, value: Any) -> Any:
    if self._broadcast_shape(mask) != self.shape: raise TensorError(f"masked_fill: mask {mask.shape} can't broadcast to {self.shape}")
    if isinstance(value, type(self)): value = value.cast(self.dtype)
    return mask.where(value, self)

  def masked_select(self, mask: Any, size: int | None = None, fill_value: Any = 0) -> Any:
    """The elements where `mask` (broadcast with self) is True, as a 1-D tensor in row-major order. Without `size` the
    length is the count of Trues (the mask is read to the host); with `size` the result has exactly `size` elements:
    the first ones selected, then `fill_value` (cast to self's dtype), computed on the device (jittable), as tinygrad."""
    m = mask if isinstance(mask, type(self)) else type(self)(mask, device=self.device)
    if m.dtype != dtypes.bool: raise TensorTypeError(f"masked_select needs a bool mask, got {m.dtype}")
    shape = self._broadcast_shape(m)
    x, m = self._expand_to(shape).flatten(), m._expand_to(shape).flatten()
    if size is None: return x[m]
    sel = _first_true(m, _check_size(size, "masked_select"))  # (n, size): element i is output r
    got = sel.where(x.unsqueeze(1), False).max(0) if x.dtype == dtypes.bool else sel.where(x.unsqueeze(1), 0).sum(0, dtype=x.dtype)
    if sel.shape[0] == 0 or size == 0: return type(self).full((size,), fill_value, x.dtype, x.device)
    return sel.max(0).where(got, type(self).full((), fill_value, x.dtype, x.device))

  def nonzero(self, size: int | None = None, fill_value: Any = 0) -> Any:
    """The int32 indices of the nonzero elements, shape (count, ndim), in row-major order. Without `size` the count is
    learned by reading the data to the host; with `size` the shape is (size, ndim): the first indices found, then rows
    of `fill_value` (cast to int32), computed on the device (jittable), as tinygrad and jax."""
    if size is None:
      found = np.argwhere(self.numpy()).astype(np.int32)
      return type(self)(found.reshape(len(found), self.ndim), device=self.device)
    nz = (self if self.dtype == dtypes.bool else self != 0).flatten()
    sel = _first_true(nz, _check_size(size, "nonzero"))
    Tensor, n = type(self), nz.shape[0]
    if n == 0 or size == 0 or self.ndim == 0: return Tensor.full((size, self.ndim), fill_value, dtypes.int32, self.device)
    flat = Tensor.arange(n, device=self.device)
    strides = [math.prod(self.shape[d + 1:]) for d in range(self.ndim)]
    coords = Tensor.stack(*[flat // st % s for st, s in zip(strides, self.shape)], dim=1)
    rows = sel.unsqueeze(-1).where(coords.unsqueeze(1), 0).sum(0, dtype=dtypes.int32)  # (size, ndim)
    return sel.max(0).unsqueeze(-1).where(rows, Tensor.full((), fill_value, dtypes.int32, self.device))

  # ***** diagonals and grids *****
  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    """The diagonal over dims dim1 and dim2, shifted by `offset` (> 0 above), moved to the last dim (torch.diagonal)."""
    a, b = self._axis(dim1), self._axis(dim2)
    if a == b: raise TensorError(f"diagonal: dim1 and dim2 are both {a}")
    x = self.permute(*[i for i in range(self.ndim) if i not in (a, b)], a, b)
    r, c = x.shape[-2], x.shape[-1]
    lead = [None] * (x.ndim - 2)
    x = x.shrink(lead + [(0, r), (min(offset, c), c)]) if offset >= 0 else x.shrink(lead + [(min(-offset, r), r), (0, c)])
    n = min(x.shape[-2], x.shape[-1])
    if n == 0: return type(self).zeros(*x.shape[:-2], 0, dtype=self.dtype, device=self.device)
    x = x.shrink(lead + [(0, n), (0, n)]).reshape(*x.shape[:-2], n * n)
    x = x._pad(tuple((0, 0) for _ in lead) + ((0, n),)).reshape(*x.shape[:-1], n, n + 1)
    return x.shrink(lead + [None, (0, 1)]).reshape(*x.shape[:-2], n)

  def diag(self, diagonal: int = 0) -> Any:
    """1-D input: a square matrix with it on the `diagonal`-th diagonal; 2-D input: that diagonal (torch.diag)."""
    if self.ndim == 2: return self.diagonal(diagonal)
    if self.ndim != 1: raise TensorError(f"diag needs a 1-D or 2-D tensor, got shape {self.shape}")
    n, k = self.shape[0], abs(diagonal)
    m = type(self).eye(n, dtype=dtypes.bool, device=self.device).where(self.reshape(n, 1), 0)
    return m._pad(((0, k), (k, 0)) if diagonal > 0 else ((k, 0), (0, k)))

  def meshgrid(self, *args: Any, indexing: str = "ij") -> tuple:
    """Coordinate grids from 1-D tensors: indexing "ij" (matrix, the default) or "xy" (cartesian, first two dims swapped)."""
    if indexing not in ("ij", "xy"): raise TensorError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = _tensor_list(self, args, "meshgrid")
    if any(t.ndim > 1 for t in ts): raise TensorError(f"meshgrid takes 0-d or 1-D tensors, got shapes {[t.shape for t in ts]}")
    ts = [t.reshape(-1) for t in ts]
    shape = tuple(t.shape[0] for t in ts)
    grids = [t.reshape(tuple(-1 if i == j else 1 for j in range(len(ts)))).expand(shape) for i, t in enumerate(ts)]
    return tuple(g.transpose(0, 1) for g in grids) if indexing == "xy" and len(ts) >= 2 else tuple(grids)

  def unfold(self, dim: int, size: int, step: int) -> Any:
    """Sliding windows of `size` elements every `step` along `dim`, as a new last dim (torch.Tensor.unfold); movement
    ops only."""
    d = self._axis(dim) if self.ndim else 0
    n = self.shape[d] if self.ndim else 1
    if not isinstance(size, int) or not isinstance(step, int) or size < 0 or step <= 0 or size > n:
      raise TensorError(f"unfold: size {size!r} must be in [0, {n}] and step {step!r} positive (dim {dim} of shape {self.shape})")
    if self.ndim == 0: return self.reshape(1)
    w = (n - size) // step + 1
    x = self.transpose(d, -1) if d != self.ndim - 1 else self
    rows = [x.shrink(tuple((i * step, i * step + size) if j == x.ndim - 1 else None for j in range(x.ndim))) for i in range(w)] \
      if w <= 16 else None
    if rows is not None: win = rows[0].unsqueeze(-2).cat(*[r.unsqueeze(-2) for r in rows[1:]], dim=-2)
    else:
      idx = type(self).arange(w, device=self.device).reshape(w, 1) * step + type(self).arange(size, device=self.device).reshape(1, size)
      win = x[(Ellipsis, idx)]
    if d != self.ndim - 1: win = win.transpose(d, -2)
    return win

  # ***** indexing *****
  def _parse_index(self, index: Any) -> tuple[list, bool]:
    """Index entries with Ellipsis expanded and bool masks turned into int tensors; and whether any tensor index is present."""
    Tensor = type(self)
    entries = list(index) if isinstance(index, tuple) else [index]
    out = []
    for e in entries:
      if isinstance(e, np.integer): e = int(e)
      if isinstance(e, (list, tuple)) and _has_tensor(e): e = _stack_index(e, Tensor, self.device)  # [0, Tensor(1)], [[t]]
      if isinstance(e, (list, tuple, np.ndarray)):
        arr = np.asarray(e)
        if arr.size == 0: arr = arr.astype(np.int32)
        if arr.dtype.kind not in "biu": raise IndexError(f"only int or bool arrays are valid indices, got {arr.dtype}")
        e = Tensor(arr.astype(np.bool_ if arr.dtype.kind == "b" else np.int32), device=self.device)
        e = (e, arr) if arr.dtype.kind != "b" else e
      elif isinstance(e, Tensor):
        if not (dtypes.is_int(e.dtype) or e.dtype == dtypes.bool): raise IndexError(f"tensors used as indices must be int or bool, got {e.dtype}")
      elif isinstance(e, UOp):  # a bound Variable (or an expression of them): a symbolic int index
        if e.dtype != dtypes.index: raise IndexError(f"a symbolic index must be an index expression, got dtype {e.dtype}")
        if e.vmin < 0: raise IndexError(f"a symbolic index must be non-negative, {e} can be {e.vmin}")
      elif isinstance(e, bool) or not (e is None or e is Ellipsis or isinstance(e, (int, slice))):
        raise IndexError(f"only ints, slices, None, Ellipsis, int/bool tensors and lists are valid indices, got {e!r}")
      out.append(e)
    if sum(e is Ellipsis for e in out) > 1: raise IndexError("an index can only have a single ellipsis (...)")
    def ndims(e): return e.ndim if isinstance(e, Tensor) and e.dtype == dtypes.bool else 0 if e is None or e is Ellipsis else 1
    used = sum(ndims(e) for e in out)
    if used > self.ndim: raise IndexError(f"too many indices for tensor of dimension {self.ndim} (shape {self.shape}): {used} indexed")
    fill = [slice(None)] * (self.ndim - used)
    out = [x for e in out for x in (fill if e is Ellipsis else [e])] + ([] if any(e is Ellipsis for e in out) else fill)
    res, d = [], 0
    for e in out:
      if isinstance(e, Tensor) and e.dtype == dtypes.bool:  # a mask: realize it to learn the count, index with its nonzeros
        if tuple(e.shape) != tuple(self.shape[d:d + e.ndim]):
          raise IndexError(f"boolean index of shape {e.shape} doesn't match the indexed dims {self.shape[d:d + e.ndim]} of {self.shape}")
        res.extend(Tensor(nz.astype(np.int32), device=self.device) for nz in np.nonzero(e.numpy()))
        d += e.ndim
        continue
      if isinstance(e, tuple):  # int array from the host: bounds are known now
        e, arr = e
        if arr.size and (arr.max() >= self.shape[d] or arr.min() < -self.shape[d]):
          bad = arr.max() if arr.max() >= self.shape[d] else arr.min()
          raise IndexError(f"index {bad} is out of bounds for dimension {d} with size {self.shape[d]}")
      res.append(e)
      d += e is not None
    return res, any(isinstance(e, Tensor) for e in res)

  def _basic_view(self, entries: list) -> tuple[Any, list, list, int]:
    """Apply ints/slices/None as movement ops. Returns (view, ops for the inverse, view axes of tensor indices, where B goes)."""
    x, ops, d = self, [], 0
    def do(op, arg):
      nonlocal x
      ops.append((op, arg, x.shape))
      x = x.shrink(arg) if op == "shrink" else x.flip(arg) if op == "flip" else x._pad(arg) if op == "pad" else x.reshape(arg)
    final, adv_axes = [], []
    for e in entries:
      if e is None: final.append(1); continue
      size = x.shape[d]
      def rng(lo, hi, d=d): return tuple((lo, hi) if i == d else None for i in range(x.ndim))
      if isinstance(e, int):
        if not -size <= e < size: raise IndexError(f"index {e} is out of bounds for dimension {d} with size {size}")
        do("shrink", rng(e % size, e % size + 1))
      elif isinstance(e, UOp):  # symbolic int: in bounds if its largest value is (checked against the bound value too)
        top = e.src[1].arg if e.op is Ops.BIND else e.vmax  # a bound variable is checked at its value, as tinygrad
        if isinstance(size, int) and top >= size: raise IndexError(f"symbolic index {e} ({top}) is out of bounds for dimension {d} with size {size}")
        do("shrink", rng(e, e + 1))
      elif isinstance(e, slice) and any(isinstance(v, UOp) for v in (e.start, e.stop, e.step, size)):
        # symbolic bounds (e.g. buf[:, :v.bind(n)]): step 1, non-negative bounds, no clamping
        if e.step not in (None, 1): raise IndexError(f"a symbolic slice needs step 1, got {e.step}")
        start, stop = 0 if e.start is None else e.start, size if e.stop is None else e.stop
        for b in (start, stop):
          if isinstance(b, int) and b < 0: raise IndexError(f"negative bound {b} in a symbolic slice of dimension {d}")
        do("shrink", rng(start, stop))
        final.append(ssimplify(stop - start))
      elif isinstance(e, slice):
        start, stop, step = e.indices(size)
        c = len(range(start, stop, step))
        if c == 0: do("shrink", rng(0, 0))
        else:
          if step < 0: do("flip", d); start, step = size - 1 - start, -step
          if step == 1: do("shrink", rng(start, start + c))
          else:
            end = min(start + c * step, size)
            do("shrink", rng(start, end))
            if end < start + c * step: do("pad", tuple((0, start + c * step - end) if i == d else (0, 0) for i in range(x.ndim)))
            do("reshape", x.shape[:d] + (c, step) + x.shape[d + 1:])
            do("shrink", tuple((0, 1) if i == d + 1 else None for i in range(x.ndim)))
            do("reshape", x.shape[:d] + (c,) + x.shape[d + 2:])
        final.append(c)
      else:
        adv_axes.append(len(final))
        final.append(size)
      d += 1
    if not isinstance(final, tuple) and tuple(final) != x.shape: do("reshape", tuple(final))
    # ints select first (torch and tinygrad; numpy counts them as advanced indices): the tensor indices' result goes
    # where they are when they are next to each other in the view, else first
    adjacent = adv_axes == list(range(adv_axes[0], adv_axes[-1] + 1)) if adv_axes else True
    return x, ops, adv_axes, adv_axes[0] if adjacent and adv_axes else 0

  @staticmethod
  def _invert(t: Any, ops: list) -> Any:
    """Map a tensor shaped like the basic view back to the original shape (zeros/False where the view didn't look)."""
    for op, arg, shape in reversed(ops):
      if op == "shrink": t = t._pad(tuple((0, 0) if a is None else (a[0], s - a[1]) for a, s in zip(arg, shape)))
      elif op == "pad": t = t.shrink(tuple((b, b + s) for (b, _), s in zip(arg, shape)))
      elif op == "flip": t = t.flip(arg)
      else: t = t.reshape(shape)
    return t

  def _adv_masks(self, x: Any, idx: list, axes: list) -> tuple[Any, tuple, tuple]:
    """(one-hot mask of shape B + sizes of the indexed axes, B, rest axes of x)."""
    bshape = idx[0]._broadcast_shape(*idx[1:]) if len(idx) > 1 else idx[0].shape
    sizes = tuple(x.shape[a] for a in axes)
    mask = None
    for j, (t, s) in enumerate(zip(idx, sizes)):
      oh = self._onehot(t._expand_to(bshape), s).reshape(bshape + tuple(s if i == j else 1 for i in range(len(sizes))))
      mask = oh if mask is None else mask._alu(Ops.AND, oh._expand_to(mask._broadcast_shape(oh))) if oh.shape == mask.shape else \
        mask._binop(Ops.AND, oh)
    return mask, bshape, tuple(i for i in range(x.ndim) if i not in axes)

  def __getitem__(self, index: Any) -> Any:
    entries, has_tensor = self._parse_index(index)
    x, _, axes, bpos = self._basic_view(entries)
    if not has_tensor: return x
    Tensor = type(self)
    idx = [e for e in entries if isinstance(e, Tensor)]
    mask, bshape, rest = self._adv_masks(x, idx, axes)
    k, nb, nr = len(axes), len(bshape), len(rest)
    out_shape = tuple(x.shape[r] for r in rest[:bpos]) + bshape + tuple(x.shape[r] for r in rest[bpos:])
    if math.prod(out_shape) == 0 or math.prod(x.shape) == 0:
      if math.prod(bshape) and math.prod(x.shape[a] for a in axes) == 0: raise IndexError(f"index into a zero-size dim of shape {self.shape}")
      return Tensor.zeros(out_shape, dtype=self.dtype, device=self.device)
    xe = x.permute(rest + tuple(axes)).reshape(tuple(x.shape[r] for r in rest) + (1,) * nb + tuple(x.shape[a] for a in axes))
    red = tuple(range(nr + nb, nr + nb + k))
    sel = mask.reshape((1,) * nr + mask.shape)._expand_to(xe._broadcast_shape(mask.reshape((1,) * nr + mask.shape)))
    ret = sel.where(xe, False).max(red) if self.dtype == dtypes.bool else sel.where(xe, 0).sum(red, dtype=self.dtype)
    order = tuple(range(bpos)) + tuple(range(nr, nr + nb)) + tuple(range(bpos, nr))  # (rest..., B...) -> B at bpos
    return ret.permute(order)

  def __setitem__(self, index: Any, value: Any) -> None:
    """Store `value` at `index`. A realized tensor is written in place (other views of its buffer see it); an unrealized
    one is rebuilt functionally. A tensor value must cast to self's dtype without loss (lists, arrays and Python scalars
    are cast). `t.detach()[i] = v` writes t's storage (detach shares it, as in torch and tinygrad). Gradients: with a
    requires_grad tensor involved the update is functional (gradients w.r.t. the value before); with gradient-eligible
    tensors (requires_grad None) in the value, the in-place write stays in the graph until realized, so backward reaches
    them (tinygrad's `z[:2] += x`)."""
    Tensor = type(self)
    if isinstance(value, Tensor) and value.dtype != self.dtype and not _casts_safely(value.dtype, self.dtype):
      raise TensorTypeError(f"setitem: a {value.dtype} value can't be stored in a {self.dtype} tensor without loss; "
                            f"cast it first (value.cast({self.dtype}))")
    if isinstance(value, (list, tuple, np.ndarray)): value = Tensor(np.asarray(value), device=self.device)
    v = value.cast(self.dtype) if isinstance(value, Tensor) else Tensor.full((), value, self.dtype, self.device)
    if (src := self._detached_from()) is not None: return self._write_through(src, index, v)
    realized = is_buffer_view(self.uop)
    if realized: self._own_buffer()  # copy-on-write if another tensor shares this exact view
    lazy = False
    if _needs_grad(self) or _needs_grad(v):  # functional update, so gradients flow to both the old value and `value`
      if self.requires_grad and _has_other_uses(self, v):
        raise RuntimeError("can't setitem on a tensor that already has other uses and requires grad")
      if self.requires_grad and self._ctx is None: self._ctx = self.uop  # gradients of this tensor are w.r.t. its value before
      realized = False
    elif realized and self._keeps_grad_path(v, value):
      lazy = True  # a pending in-place ASSIGN (as Tensor.assign): written at the next realize, differentiable until then
      if self._ctx is None: self._ctx = self.uop
    if realized:  # the caller's index and value tensors that read this buffer keep the values from before the write
      for e in _index_tensors(index) + ([value] if isinstance(value, Tensor) and not lazy else []):
        if _reads_buffer(e, self.uop): e.realize()
      if isinstance(value, Tensor): v = value.cast(self.dtype)
      _refuse_stale_readers(self, v)
    else: _refuse_stale_views(self, v)
    self._store(index, v, realized, lazy)

  def _store(self, index: Any, v: Any, realized: bool, lazy: bool = False) -> None:
    """The write of __setitem__: into the realized buffer now (or, lazy, as a pending assign), else functionally."""
    Tensor = type(self)
    if realized and buffer_of(self.uop) in v.uop.toposort(): v = v.contiguous()  # value reads the target: compute it first
    if isinstance(index, Tensor) and index.dtype == dtypes.bool and index.shape == self.shape and v.numel() == 1:
      new = index.where(v.reshape(()), self)  # x[mask] = scalar: a where, no need to count the mask
      if lazy: self.assign(new)
      elif realized: Tensor(UOp(Ops.ASSIGN, self.dtype, (self.uop, new.uop))).realize()
      else: self.uop = new.uop
      return
    entries, has_tensor = self._parse_index(index)
    x, ops, axes, bpos = self._basic_view(entries)
    if has_tensor:
      idx = [e for e in entries if isinstance(e, Tensor)]
      mask, bshape, rest = self._adv_masks(x, idx, axes)
      nb, nr = len(bshape), len(rest)
      out_shape = tuple(x.shape[r] for r in rest[:bpos]) + bshape + tuple(x.shape[r] for r in rest[bpos:])
      v = v._expand_to(v._broadcast_shape(Tensor.empty(out_shape, dtype=self.dtype, device=self.device))) if v.shape != out_shape else v
      if v.shape != out_shape: raise TensorError(f"can't assign a value of shape {v.shape} to an index result of shape {out_shape}")
      if math.prod(out_shape) == 0: return
    else:
      try: v = v._expand_to(x.shape)
      except ValueError: raise TensorError(f"can't assign a value of shape {v.shape} to an index result of shape {x.shape}") from None
      if v.shape != x.shape: raise TensorError(f"can't assign a value of shape {v.shape} to an index result of shape {x.shape}")
      if x.numel() == 0: return
    if realized and not lazy and not has_tensor and all(op != "pad" for op, _, _ in ops):
      Tensor(UOp(Ops.ASSIGN, self.dtype, (x.uop, v.uop))).realize()
      return
    if has_tensor:
      vr = v.permute(tuple(range(bpos)) + tuple(range(bpos + nb, nr + nb)) + tuple(range(bpos, bpos + nb)))  # -> (rest..., B...)
      ve = vr.reshape(vr.shape + (1,) * len(axes))
      m = mask.reshape((1,) * nr + mask.shape)
      pos = Tensor.arange(1, math.prod(bshape) + 1, device=self.device).reshape((1,) * nr + bshape + (1,) * len(axes))
      baxes = tuple(range(nr, nr + nb))
      last = m.where(pos, 0).max(baxes, keepdim=True)
      sel = m._binop(Ops.AND, pos._binop(Ops.CMPEQ, last))
      val = sel.where(ve, False).max(baxes) if self.dtype == dtypes.bool else sel.where(ve, 0).sum(baxes, dtype=self.dtype)
      hit = m.max(baxes)._expand_to(val.shape)
      inv = [0] * x.ndim
      for i, a in enumerate(rest + tuple(axes)): inv[a] = i
      val, hit = val.permute(inv), hit.permute(inv)
    else: val, hit = v, Tensor.full(x.shape, True, dtypes.bool, self.device)
    new = self._invert(hit, ops).where(self._invert(val, ops), self)
    if lazy: self.assign(new)
    elif realized: Tensor(UOp(Ops.ASSIGN, self.dtype, (self.uop, new.uop))).realize()
    else: self.uop = new.uop

  def _write_through(self, src: Any, index: Any, v: Any) -> None:
    """`src.detach()[index] = v`: write src's buffer in place (no gradient: detach), then view it again."""
    if not is_buffer_view(src.uop):
      raise TensorError("setitem on t.detach() writes t's storage, but t is not realized (its value is still a graph); "
                        "realize t first, or clone() the detached tensor for a separate copy")
    src._own_buffer()  # copy-on-write against tensors that only share the buffer by computing the same thing
    for e in _index_tensors(index) + [v]:
      if _reads_buffer(e, src.uop): e.realize()
    _refuse_stale_readers(src, v, also=self)
    if buffer_of(src.uop) in v.uop.toposort(): v = v.contiguous()
    src._store(index, v.detach(), realized=True)
    self.uop = UOp(Ops.DETACH, self.dtype, (src.uop,))


def _base_buffer(u: UOp) -> UOp:
  b = buffer_of(u)
  while b.op is Ops.BUFFER_VIEW: b = b.src[0]
  return b


def _index_tensors(index: Any) -> list:
  """The tensors of a setitem index (top level and in lists)."""
  parts = index if isinstance(index, (tuple, list)) else (index,)
  return [x for e in parts for x in (_index_tensors(e) if isinstance(e, (tuple, list)) else [e]) if hasattr(x, "uop")]


def _pure_view(u: UOp) -> bool:
  """A buffer seen through movement ops and detach only: it shares the buffer's storage (sees writes by design)."""
  while u.op in GroupOp.Movement or u.op is Ops.DETACH: u = u.src[0]
  return u.op in (Ops.BUFFER, Ops.BUFFER_VIEW, Ops.PARAM)


def _reads_buffer(x: Any, target: UOp) -> bool:
  """Whether tensor x is an unrealized computation that reads the buffer under `target` (a buffer view)."""
  buf = _base_buffer(target)
  return not _pure_view(x.uop) and any(n.op in (Ops.BUFFER, Ops.BUFFER_VIEW) and _base_buffer(n) is buf for n in x.uop.toposort())


def _refuse_stale_readers(t: Any, v: Any, also: Any = None) -> None:
  """Raise when a live tensor not yet realized reads t's buffer: built before this in-place write, it would see the
  write when realized later (torch computed it before; tinygrad raises too). Views of the buffer (movement ops, detach)
  are exempt: they share the storage by design. `also` is another tensor exempt (the detached one written through)."""
  own = set(v.uop.toposort())
  for x in list(all_tensors):
    if x is t or x is also or x.uop in own: continue
    if _reads_buffer(x, t.uop):
      raise TensorError(f"can't setitem on a realized tensor that an unrealized tensor of shape {x.shape} was computed from: "
                        "realized after the write it would see it; realize that tensor first, or setitem on a clone()")


def _refuse_stale_views(t: Any, v: Any) -> None:
  """Raise when another live tensor is a view (movement ops, detach) or an alias of unrealized t's value: t is rebuilt
  functionally, so the view would keep the value before the write, where an eager framework's view sees it."""
  own = set(v.uop.toposort())
  for x in list(all_tensors):
    if x is t or x.uop in own: continue
    u = x.uop
    while u is not t.uop and (u.op in GroupOp.Movement or u.op is Ops.DETACH): u = u.src[0]
    if u is t.uop:
      raise TensorError(f"can't setitem on an unrealized tensor that a live tensor of shape {x.shape} is a view or alias of: the "
                        "view would keep the old value; realize the tensor first (then views share its buffer), or drop the view")


def _casts_safely(src: Any, dst: Any) -> bool:
  """Every value of dtype `src` is exactly a value of `dst` (numpy's "safe" casting, extended to bfloat16 and fp8 by
  exponent and mantissa widths): bool into anything, ints into wider ints or floats whose significand holds them."""
  if src == dst or src == dtypes.bool: return True
  if dst == dtypes.bool: return False
  if dtypes.is_float(src):
    if not dtypes.is_float(dst): return False
    (es, ms), (ed, md) = dtypes.finfo(src), dtypes.finfo(dst)
    return ed >= es and md >= ms
  if dtypes.is_float(dst): return dtypes.finfo(dst)[1] + 1 >= src.itemsize * 8 - (0 if dtypes.is_unsigned(src) else 1)
  return dtypes.min(dst) <= dtypes.min(src) and dtypes.max(src) <= dtypes.max(dst)


def _needs_grad(t: Any) -> bool:
  """True if t requires grad or its graph contains a live tensor that does."""
  if t.requires_grad: return True
  leaves = {x.uop for x in list(all_tensors) if x.requires_grad}
  return bool(leaves) and any(n in leaves for n in t.uop.toposort())


def _has_other_uses(t: Any, value: Any) -> bool:
  """True if a live tensor other than t, the value being assigned and the parts of that value uses t's current value."""
  own = value.uop.toposort()
  return any(x is not t and x.uop not in own and t.uop in x.uop.toposort() for x in list(all_tensors))
