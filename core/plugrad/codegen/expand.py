"""The expand pass: ranges an optimization marked as copies become the copies, after every optimization is applied.

UPCAST, UPCAST_OVERLAP, SPLIT and UNROLL (codegen/opt.py) and GROUPOUT (codegen/gpuopt.py) only split a range and
retype its inner part, a new RANGE of size k whose arg is `(id, kind, mark)`:

  (id, "global", "upcast")   the kernel's STOREs are replicated k times, the range replaced by 0..k-1 in each copy
                             (k outputs a loop iteration: a register tile's rows or columns);
  (id, "reduce", "unroll")   each REDUCE over it becomes op(REDUCE(x[0]), ..., REDUCE(x[k-1])) over its other ranges,
                             or the op chain itself when none is left (SPLIT: k accumulators; UNROLL: no loop);
  (id, "reduce", "fold")     each REDUCE over it becomes REDUCE(op(x[0], ..., x[k-1])) over its other ranges (FOLD:
                             one accumulator that takes the k copies each trip), or the op chain when none is left.

`expand` turns the marks into copies in the order they were made (copy ranges are numbered -1, -2, ...), then
simplifies, so the kernel is what applying the same Opts one by one with their copies made at once gave (byte for byte
in bench/codegen_corpus.py, every renderer). GROUP and GROUPTOP leave a reduce across the group's threads, which
`expand` lowers after making the copies (codegen/group.py: local memory, barriers; each copy's reduce its own buffer).
TC's mark is lowered after this pass (codegen/gpuopt.py: `lower_tensor_cores`). `pm_opt_symbolic`, the
simplifier used on optimized kernels, lives here because both the marking and the expanding use it; so does
`store_group` + `pm_flatten_stores`, how a rule (here, the vectorize and tensor-core passes) replaces one STORE by
several.
"""
from __future__ import annotations

import functools
import math
from typing import Iterable

from plugrad.codegen.group import lower_groups
from plugrad.dtype import dtypes
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import _collect, _sum, pm_symbolic
from plugrad.uop.upat import PatternMatcher, UPat

COPY_MARKS = ("upcast", "unroll", "fold")   # range marks the expand pass replaces by copies ("vector" lanes: codegen/vectorize.py)


def is_copy_range(r: UOp) -> bool: return r.op is Ops.RANGE and len(r.arg) > 2 and r.arg[2] in COPY_MARKS


def copy_range(ast: UOp, rng: UOp, k: int, mark: str) -> UOp:
  """A new range of size k marked `mark`. Copy ranges are numbered -1, -2, ... in the order they are marked, apart from
  the loops' ids, so marking one doesn't renumber the ranges later optimizations make (Opts and BEAM's cache name them)."""
  nid = min([0] + [n.arg[0] for n in ast.toposort() if is_copy_range(n)]) - 1
  return UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, k),), (nid, rng.arg[1], mark))


def _divmod_low_terms(x: UOp, d: UOp, op: Ops) -> UOp | None:
  """(a*g + b) // (g*m) -> a // m and (a*g + b) % (g*m) -> (a % m)*g + b when 0 <= b < g and a >= 0: the low terms
  an optimization splits off (`16*r + lane`, `32*r + 17`) fall out of block indices, so lanes and copies see that
  they read the same block (pm_symbolic only folds remainders that stay below the divisor)."""
  c = d.arg
  if x.dtype != dtypes.index or c <= 1 or x.vmin < 0: return None
  parts, const = _collect(x)
  for g in sorted({math.gcd(c, f) for f in parts.values()} - {1, c}, reverse=True):
    hi = {b: f // g for b, f in parts.items() if f % g == 0}
    lo = _sum(x.dtype, {b: f for b, f in parts.items() if f % g}, const)
    if not hi or lo.vmin < 0 or lo.vmax >= g or _sum(x.dtype, hi, 0).vmin < 0: continue
    a = _sum(x.dtype, hi, 0)
    return a // (c // g) if op is Ops.IDIV else (a % (c // g)) * g + lo
  return None


pm_low_terms = PatternMatcher([(UPat((Ops.IDIV, Ops.MOD), src=(UPat.var("x"), UPat.cvar("d", vec=False)), name="n"),
                                lambda x, d, n: _divmod_low_terms(x, d, n.op))])
# a gate that folded to true (GROUPOUT's copies short of the last) is no gate; a load whose gate folded to false is 0
pm_true_gate = PatternMatcher([
  (UPat(Ops.INDEX, src=(UPat.var("b"), UPat.var("i"), UPat.cvar("g", vec=False)), name="x"),
   lambda x, b, i, g: x.replace(src=(b, i)) if g.dtype == dtypes.bool and g.arg else None),
  (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, src=(UPat(), UPat(), UPat.cvar("g", vec=False))),), allow_any_len=True, name="ld"),
   lambda ld, g: UOp.const(ld.dtype, 0) if g.dtype == dtypes.bool and not g.arg else None)])


def _conjuncts(x: UOp) -> list[UOp]: return _conjuncts(x.src[0]) + _conjuncts(x.src[1]) if x.op is Ops.AND else [x]
def _upper_bound(t: UOp) -> bool: return t.op is Ops.CMPLT and t.src[1].op is Ops.CONST and t.src[0].dtype in (dtypes.index, dtypes.int32)


def _upper_bounds(terms: list[UOp]) -> dict[UOp, int]:
  """integer -> the tightest constant upper bound `x < c` among `terms`."""
  bound: dict[UOp, int] = {}
  for t in filter(_upper_bound, terms): bound[t.src[0]] = min(bound.get(t.src[0], t.src[1].arg), t.src[1].arg)
  return bound


def _and_bounds(x: UOp) -> UOp | None:
  """A chain of ANDs with repeated terms dropped and the upper bounds of one integer merged (`i < 28 & i < 29` ->
  `i < 28`): a partial workgroup's gate (LOCAL) meeting the padding gates of unrolled taps. None when nothing goes."""
  terms = _conjuncts(x)
  bound = _upper_bounds(terms)
  out: list[UOp] = []
  for t in terms:   # each bound at its first place, tightened; a term met again (a looser bound, once tightened) dropped
    if _upper_bound(t): t = t.src[0] < bound[t.src[0]]
    if t not in out: out.append(t)
  return None if len(out) == len(terms) else functools.reduce(lambda a, b: a & b, out)


pm_and_bounds = PatternMatcher([(UPat(Ops.AND, dtypes.bool, name="x"), _and_bounds)])


def _implies(g: UOp, c: UOp) -> bool:
  """Whether gate `g` implies condition `c` (chains of ANDs): every term of c is a term of g, or an upper bound
  `x < a` where g bounds x by `x < b`, b <= a."""
  gs = _conjuncts(g)
  ub = _upper_bounds(gs)
  return all(t in gs or (_upper_bound(t) and t.src[0] in ub and ub[t.src[0]] <= t.src[1].arg) for t in _conjuncts(c))


def _gated_select(c: UOp, ld: UOp, z: UOp) -> UOp | None:
  """where(c, load(gate g), 0) -> the load when g implies c: a gated load is 0 wherever its gate is false. (A padding's
  select around a load that a partial workgroup's gate, LOCAL, also gates: the select's `x < 29` under the gate's
  `x < 28`.)"""
  idx = ld.src[0]
  if z.arg != 0 or math.copysign(1.0, z.arg) < 0 or idx.op is not Ops.INDEX or len(idx.src) != 3 or not _implies(idx.src[2], c): return None
  return ld


pm_gated_select = PatternMatcher([(UPat(Ops.WHERE, src=(UPat.var("c", dtypes.bool), UPat(Ops.LOAD, name="ld"), UPat.cvar("z", vec=False))),
                                   _gated_select)])
pm_opt_symbolic = pm_symbolic + pm_low_terms + pm_true_gate + pm_and_bounds + pm_gated_select  # the simplifier used on optimized kernels


def simplify(ast: UOp, name: str = "simplify after opt") -> UOp: return graph_rewrite(ast, pm_opt_symbolic, name=name)


def _unroll_reduce(ctx: UOp, red: UOp) -> UOp | None:
  """A REDUCE over the marked range `ctx` as the op of its k copies (REDUCEs over its other ranges, if any)."""
  m = ctx
  if m not in red.src[1:]: return None
  rest = tuple(r for r in red.src[1:] if r is not m)
  parts = [red.src[0].substitute({m: UOp.const(dtypes.index, i)}, walk=True) for i in range(m.src[0].arg)]
  def chain(xs: list[UOp]) -> UOp: return functools.reduce(lambda a, b: UOp(red.arg, red.dtype, (a, b)), xs)
  if rest and m.arg[2] == "fold": return UOp(Ops.REDUCE, red.dtype, (chain(parts), *rest), red.arg)   # one accumulator
  return chain([UOp(Ops.REDUCE, red.dtype, (p, *rest), red.arg) for p in parts] if rest else parts)


pm_unroll_reduce = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _unroll_reduce)])  # ctx: the marked range


STORES = "stores"  # the tag of a GROUP of STOREs that a rule made for one STORE: the SINK takes them in its place


def store_group(stores: Iterable[UOp]) -> UOp:
  """The STOREs a rule makes for one STORE of the kernel, in order (`pm_flatten_stores` puts them in the SINK)."""
  return UOp(Ops.GROUP, dtypes.void, tuple(stores), None, STORES)


def _flatten_stores(s: UOp) -> UOp | None:
  if not any(x.op is Ops.GROUP and x.tag == STORES for x in s.src): return None
  return s.replace(src=tuple(y for x in s.src for y in (x.src if x.op is Ops.GROUP and x.tag == STORES else (x,))))


pm_flatten_stores = PatternMatcher([(UPat(Ops.SINK, name="s"), _flatten_stores)])


def _copy_store(ctx: UOp, st: UOp) -> UOp | None:
  """A STORE that uses the marked "upcast" range `ctx`: its k copies (UPCAST marks a range every store uses; a store
  that doesn't is written once)."""
  if ctx not in st.toposort(): return None
  return store_group(st.substitute({ctx: UOp.const(dtypes.index, i)}, walk=True) for i in range(ctx.src[0].arg))


pm_copy_stores = PatternMatcher([(UPat(Ops.STORE, name="st"), _copy_store)])  # ctx: the marked range


def _expand_one(ast: UOp, m: UOp) -> UOp:
  """`ast` with the marked range `m` replaced by its copies (see the module docstring)."""
  if m.arg[2] in ("unroll", "fold"): return graph_rewrite(ast, pm_unroll_reduce, ctx=m, name=f"{m.arg[2]} reduce")
  return graph_rewrite(ast, pm_flatten_stores, ctx=m, bpm=pm_copy_stores, walk=True, name="copy stores")


def expand(ast: UOp) -> UOp:
  """`ast` with every copy mark (UPCAST, UPCAST_OVERLAP, SPLIT, UNROLL, GROUPOUT) made into copies, in the order made,
  then the grouped reduces (GROUP, GROUPTOP) lowered (codegen/group.py: each copy's reduce with its own local buffer),
  then simplified (once: the same kernel as simplifying after each, in the codegen corpus)."""
  marks = [n for n in ast.toposort() if is_copy_range(n)]
  copied = ast
  while marks:
    copied = _expand_one(copied, max(marks, key=lambda r: r.arg[0]))   # -1 first: the first marked
    marks = [n for n in copied.toposort() if is_copy_range(n)]
  out = lower_groups(copied)
  return ast if out is ast else simplify(out, "simplify after expand")
