"""Indexing: turn "tensor x at indices idxs" (AT nodes) into scalar kernel expressions, one rule per tensor op.

A kernel is built by asking for its output at loop indices (RANGEs) and pushing AT down the tensor graph with
`pm_index`: movement ops become index arithmetic, PAD adds a validity gate, REDUCE_AXIS opens new ranges and a
REDUCE node, and realized buffers become gated LOADs from kernel parameters (DEFINE_GLOBAL).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from plugrad.dtype import dtypes
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.symbolic import sint, ssimplify
from plugrad.uop.upat import PatternMatcher, UPat

TRUE = UOp.const(dtypes.bool, True)


def idx_const(v: int) -> UOp: return UOp.const(dtypes.index, v)
def as_index(x: sint) -> UOp: return x if isinstance(x, UOp) else idx_const(x)


@dataclass
class KernelContext:
  """What one kernel collects while it is built: its buffer parameters, loop ranges and bound variables."""
  bufs: list[UOp] = field(default_factory=list)  # BUFFER uops; the position is the DEFINE_GLOBAL slot
  n_ranges: int = 0
  var_vals: dict[UOp, int] = field(default_factory=dict)

  def new_range(self, size: sint, kind: str) -> UOp:
    self.n_ranges += 1
    return UOp(Ops.RANGE, dtypes.index, (as_index(size),), arg=(self.n_ranges - 1, kind))

  def param(self, buf: UOp) -> UOp:
    """The DEFINE_GLOBAL for a BUFFER (or a scheduler placeholder PARAM, whose arg is (kind, i, size, device))."""
    if buf not in self.bufs: self.bufs.append(buf)
    size = buf.arg if buf.op is Ops.BUFFER else buf.arg[0] if buf.op is Ops.BUFFER_VIEW else buf.arg[2]
    return UOp(Ops.DEFINE_GLOBAL, buf.dtype.ptr(size), arg=self.bufs.index(buf))


def strides_for(shape: tuple) -> tuple:
  """Contiguous (row-major) strides of `shape`."""
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc)
    acc = acc * s
  return tuple(reversed(out))


def flatten(idxs: tuple[UOp, ...], shape: tuple) -> UOp:
  """The row-major linear index of `idxs` in `shape`."""
  ret = idx_const(0)
  for i, st in zip(idxs, strides_for(shape)): ret = ret + i * st
  return ret


def same_size(a: sint, b: sint) -> bool:
  """Whether two (possibly symbolic) sizes are provably equal."""
  if isinstance(a, int) and isinstance(b, int): return a == b
  return a is b or (isinstance(d := ssimplify(_as_sym(a) - b), int) and d == 0)


def _as_sym(x: sint) -> UOp: return x if isinstance(x, UOp) else idx_const(x)


def _monomial(x: sint) -> tuple[int, tuple[UOp, ...]]:
  """A size as const * product of symbols (a symbolic factor that isn't a MUL by a constant is one opaque symbol)."""
  if isinstance(x, int): return x, ()
  if x.op is Ops.CONST: return x.arg, ()
  if x.op is Ops.MUL:
    (ca, sa), (cb, sb) = _monomial(x.src[0]), _monomial(x.src[1])
    return ca * cb, tuple(sorted(sa + sb, key=id))
  return 1, (x,)


def _mono_mul(a: tuple[int, tuple], b: tuple[int, tuple]) -> tuple[int, tuple]: return a[0] * b[0], tuple(sorted(a[1] + b[1], key=id))


def _smaller(a: tuple[int, tuple], b: tuple[int, tuple]) -> bool | None:
  """Which run to grow: True when monomial a is the smaller (its symbols a sub-multiset of b's, and the smaller
  constant when the symbols are the same), False when b is, None when they can't be ordered."""
  ca, cb = list(a[1]), list(b[1])
  if ca == cb: return a[0] < b[0]
  if all(ca.count(s) <= cb.count(s) for s in ca): return True
  if all(cb.count(s) <= ca.count(s) for s in cb): return False
  return None


def _reshape_groups(new: tuple, old: tuple) -> list[tuple[range, range]] | None:
  """Split a reshape into runs of new dims and old dims with equal products (e.g. (T, 576) vs (T, 9, 64) is
  [T]~[T], [576]~[9, 64]; symbolic sizes are compared as const * symbols, so (3, 8*T) ~ (24*T) too), so index math
  stays local to each run; None when the runs can't be found."""
  groups, i, j = [], 0, 0
  while i < len(new) and j < len(old):
    i0, j0, pn, po, rn, ro = i, j, _monomial(new[i]), _monomial(old[j]), new[i], old[j]
    i, j = i + 1, j + 1
    while pn != po:
      if (grow_new := _smaller(pn, po)) is None:
        if same_size(rn, ro): break   # equal sizes written differently (e.g. start+T vs T+start)
        return None
      if grow_new and i < len(new): pn, rn, i = _mono_mul(pn, _monomial(new[i])), rn * new[i], i + 1
      elif not grow_new and j < len(old): po, ro, j = _mono_mul(po, _monomial(old[j])), ro * old[j], j + 1
      else: return None
    groups.append((range(i0, i), range(j0, j)))
  if any(s != 1 for s in new[i:]) or any(s != 1 for s in old[j:]): return None
  if groups:  # trailing size-1 dims join the last run
    groups[-1] = (range(groups[-1][0].start, len(new)), range(groups[-1][1].start, len(old)))
  return groups


def _reshape_idxs(idxs: tuple[UOp, ...], new: tuple, old: tuple) -> tuple[UOp, ...]:
  # fast path: only size-1 dims added or removed
  if [s for s in new if s != 1] == [s for s in old if s != 1]:
    it = iter(i for i, s in zip(idxs, new) if s != 1)
    return tuple(idx_const(0) if s == 1 else next(it) for s in old)
  if (groups := _reshape_groups(new, old)) is None: groups = [(range(len(new)), range(len(old)))]
  out: list[UOp] = []
  for gn, go in groups:  # flatten and unflatten each run on its own
    nshape, oshape = tuple(new[k] for k in gn), tuple(old[k] for k in go)
    if len(gn) == 1 and len(go) == 1: out.append(idxs[gn[0]]); continue
    flat = flatten(tuple(idxs[k] for k in gn), nshape)
    # the run's first old dim needs no modulo: flat < product of the run
    out.extend(idx_const(0) if sz == 1 else flat // st if k == 0 else (flat // st) % sz
               for k, (sz, st) in enumerate(zip(oshape, strides_for(oshape))))
  return tuple(out)


def _at(x: UOp, gate: UOp, idxs) -> UOp: return UOp(Ops.AT, x.dtype, (x, gate, *idxs))


def push_at(ctx: KernelContext, at: UOp) -> UOp | None:
  """One step of indexing: AT(x, gate, *idxs) rewritten according to x's op."""
  x, gate, idxs = at.src[0], at.src[1], at.src[2:]
  op, s = x.op, x.src
  if op in (Ops.BUFFER, Ops.PARAM):
    size = x.arg if op is Ops.BUFFER else x.arg[2]
    return UOp(Ops.LOAD, x.dtype, (UOp(Ops.INDEX, x.dtype.ptr(size), (ctx.param(x), idxs[0]) + (() if gate is TRUE else (gate,))),))
  if op is Ops.BUFFER_VIEW:  # a reinterpreting view (bitcast to another itemsize) is its own kernel parameter
    return UOp(Ops.LOAD, x.dtype, (UOp(Ops.INDEX, x.dtype.ptr(x.arg[0]), (ctx.param(x), idxs[0]) + (() if gate is TRUE else (gate,))),))
  if op is Ops.CONST: return UOp.const(x.dtype, x.arg)
  if op is Ops.BIND:
    var, val = x.unbind()
    if ctx.var_vals.setdefault(var, val) != val: raise RuntimeError(f"bind mismatch on {var.arg[0]}: {ctx.var_vals[var]} != {val}")
    return var
  if op is Ops.DEFINE_VAR: return x
  if op is Ops.RESHAPE: return _at(s[0], gate, _reshape_idxs(idxs, x.shape, s[0].shape))
  if op is Ops.PERMUTE:
    src_idx = [None] * len(idxs)
    for i, o in enumerate(x.arg): src_idx[o] = idxs[i]
    return _at(s[0], gate, src_idx)
  if op is Ops.EXPAND: return _at(s[0], gate, tuple(idx_const(0) if so == 1 else i for i, so in zip(idxs, s[0].shape)))
  if op is Ops.SHRINK: return _at(s[0], gate, tuple(i + b if b != 0 else i for i, (b, _) in zip(idxs, x.arg)))
  if op is Ops.FLIP: return _at(s[0], gate, tuple((sz - 1) - i if f else i for i, f, sz in zip(idxs, x.arg, x.shape)))
  if op is Ops.PAD:
    valid, new_idx = TRUE, []
    for i, (b, a), sz in zip(idxs, x.arg, s[0].shape):
      if b != 0 or a != 0: valid = valid & (i < b).ne(True) & (i < b + sz)
      new_idx.append(i - b if b != 0 else i)
    return valid.where(_at(s[0], gate & valid, new_idx), UOp.const(x.dtype, 0))
  if op is Ops.REDUCE_AXIS:
    rop, axes = x.arg
    src_idx, ranges = list(idxs), []
    for a in axes:
      if s[0].shape[a] == 1: src_idx[a] = idx_const(0)
      else: ranges.append(ctx.new_range(s[0].shape[a], "reduce")); src_idx[a] = ranges[-1]
    inner = _at(s[0], gate, src_idx)
    return UOp(Ops.REDUCE, x.dtype, (inner, *ranges), arg=rop) if ranges else inner
  if op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST):
    return UOp(op, x.dtype, tuple(_at(v, gate, idxs if v.shape else ()) for v in s), x.arg)
  if op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.AFTER, Ops.CONTIGUOUS_BACKWARD, Ops.CUSTOM_GRAD):  # AFTER only orders: its deps run first
    return _at(s[0], gate, idxs)  # (the autograd markers' other sources are gradients, no part of the value)
  raise RuntimeError(f"the scheduler can't index {op} (shape {x.shape}) inside a kernel")


pm_index = PatternMatcher([(UPat(Ops.AT, name="at"), push_at)])
