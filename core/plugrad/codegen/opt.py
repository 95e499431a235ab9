"""Kernel optimizations: rewrites of the kernel AST (docs/kernel_ir.md, form 2) applied before linearizing.

Every optimization splits one loop, `RANGE r` of size N (a constant, or a symbolic size that k divides for every value
of its variables, such as `8*T`), into an outer loop `r'` of size N/k and an inner part `r = r'*k + i`:

- UPCAST a global range: k outputs per loop iteration. The inner part becomes a new range of size k marked "upcast"
  (arg `(id, "global", "upcast")`), and the expand pass (codegen/expand.py) replicates the kernel's STOREs k times,
  one per value of it. Loads that don't depend on the range are shared by hash-consing, so upcasting two output axes
  of a matmul gives a register-blocked kernel (a 4x16 tile of accumulators with the reduce loop inside).
- SPLIT a reduce range: REDUCE(x, r) becomes REDUCE(x, r', i) with i marked "unroll"; the expand pass makes it
  op(REDUCE(x[i=0], r'), ..., REDUCE(x[i=k-1], r')): k accumulators that break the add dependency chain (the
  linearizer runs REDUCEs over the same ranges in one loop).
- UNROLL a small reduce range (k = N): the range is marked "unroll" whole, and the REDUCE becomes an op chain (with
  other reduce ranges left: k REDUCEs over them, k accumulators, as SPLIT).
- FOLD a small reduce range (k = N) into the body of the REDUCE over its other ranges, marked "fold": one REDUCE of the
  op chain of the k copies, so one accumulator takes k updates a trip (a convolution's innermost taps: each of a
  register tile's accumulators gets the 3 taps' FMAs a trip, where UNROLL would give each tap its own accumulator,
  3x the tile's registers).
- VECTOR a global or reduce range: the inner part becomes a new RANGE `i` of size k marked as a vector lane
  (arg `(id, kind, "vector")`). The AST stays scalar and valid for every renderer (a lane range is an ordinary
  loop); renderers with vector types (`vector_lanes` > 0) turn it into SIMD values with codegen/vectorize.py.
  VECTOR goes first on its range, so later UPCAST/SPLIT copies of `r'` sit outside the contiguous lanes.

- UPCAST_OVERLAP: UPCAST by a k that doesn't divide a constant N; the last block of copies starts at N-k and overlaps the
  one before (a 6-row tile on 1024 rows).

So UPCAST/UPCAST_OVERLAP/SPLIT/UNROLL only split and retype ranges; once expanded they are plain scalar code that any
renderer (and the PYTHON device) runs unchanged. OUTER and BLOCK
reorder and block the global loops (cache blocking on CPU targets). Every kind is registered in codegen/optops.py, whose
`apply_opt` applies any of them; which ones a kernel gets is decided by codegen/heuristic.py (from the renderer's
capability record) or BEAM; what they read off the kernel (range sizes, splits) comes from codegen/facts.py.
"""
from __future__ import annotations

from plugrad.codegen.expand import copy_range, pm_opt_symbolic, simplify
from plugrad.codegen.facts import const_end, div_end, global_ranges, outer_range, ranges_of, unrollable
from plugrad.codegen.optops import ANY_RANGE, GLOBAL, REDUCE, Opt, OptKind, apply_opt, is_vector_range, register, split_amounts
from plugrad.dtype import dtypes
from plugrad.runtime.renderer import Capabilities
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.upat import PatternMatcher, UPat

# names other code imports from here (tests, vectorize, gpuopt)
__all__ = ["Opt", "apply_opt", "div_end", "is_vector_range", "pm_opt_symbolic", "ranges_of"]

def _marked_split(ast: UOp, rng: UOp, k: int, mark: str) -> tuple[UOp | None, UOp, UOp]:
  """Range `rng` split by k for copies: (the outer range, None when k covers it; the new range of the k copies, marked
  `mark` for the expand pass; what `rng` becomes: outer*k + copy, or the copy range alone)."""
  copy = copy_range(ast, rng, k, mark)
  if k == const_end(rng): return None, copy, copy
  outer = outer_range(rng, k)
  return outer, copy, outer * k + copy


def _split_reduce(ctx: tuple[UOp, UOp | None, UOp, UOp], red: UOp) -> UOp | None:
  """A REDUCE over `rng` reduces over (outer, copy) instead, outer first (the order the copies' REDUCEs keep)."""
  rng, outer, copy, sub = ctx
  if rng not in red.src[1:]: return None
  rngs = ((outer,) if outer is not None else ()) + (copy,) + tuple(r for r in red.src[1:] if r is not rng)
  return UOp(Ops.REDUCE, red.dtype, (red.src[0].substitute({rng: sub}, walk=True), *rngs), red.arg)


def _vector_reduce(ctx: tuple[UOp, UOp, UOp], red: UOp) -> UOp | None:
  rng, outer, lane = ctx
  if rng not in red.src[1:]: return None
  rngs = tuple(x for r in red.src[1:] for x in ((outer, lane) if r is rng else (r,)))
  return UOp(Ops.REDUCE, red.dtype, (red.src[0].substitute({rng: outer * lane.src[0].arg + lane}, walk=True), *rngs), red.arg)


pm_split_reduce = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _split_reduce)])
pm_vector_reduce = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _vector_reduce)])


def _overlap_start(ast: UOp, rng: UOp, opt: Opt, outer: UOp) -> UOp:
  """Where block `outer` of k = opt.amount copies of range `rng` (constant size N that k doesn't divide) starts:
  outer*k, except the last block, which starts at N-k and overlaps the one before. The overlapped outputs are computed
  again exactly as before and stored with the same value, so it is refused where a second store could differ: a kernel
  that also reads a buffer it writes (an in-place update would read its own first store), or a store not indexed by
  the range (every block would write it)."""
  n, k = const_end(rng), opt.amount
  written = {st.src[0].src[0] for st in ast.src if st.op is Ops.STORE and st.src[0].op is Ops.INDEX}
  if any(x.op is Ops.LOAD and x.src[0].op is Ops.INDEX and x.src[0].src[0] in written for x in ast.toposort()):
    raise ValueError(f"{opt}: the kernel reads a buffer it writes; overlapping blocks would read their own stores")
  if not all(rng in st.toposort() for st in ast.src): raise ValueError(f"{opt}: a store of the kernel doesn't use range {opt.rid}")
  return (outer * k < n - k).where(outer * k, n - k)


def _block(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  """Cache blocking: r = r_o*k + r_i, r_o the outermost global loop, r_i in r's place. A k that doesn't divide the
  size makes ceil(N/k) blocks, the last one overlapping the one before (`_overlap_start`)."""
  rngs = ranges_of(ast)
  if (n := const_end(rng)) is None or opt.amount < 2 or n <= opt.amount:
    raise ValueError(f"{opt}: BLOCK of range {opt.rid} (size {rng.src[0].render()}) needs a constant size over {opt.amount}")
  inner = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, opt.amount),), rng.arg)
  outer = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, -(-n // opt.amount)),), (max(rngs) + 1, "global"))
  start = outer * opt.amount if n % opt.amount == 0 else _overlap_start(ast, rng, opt, outer)
  ast = ast.substitute({rng: start + inner}, walk=True)
  glbl = global_ranges(ast, lanes=False)
  order = [outer] + [r for r in glbl if r is not outer]
  ids = sorted(r.arg[0] for r in glbl)
  ast = ast.substitute({r: r.replace(arg=(i, *r.arg[1:])) for r, i in zip(order, ids) if r.arg[0] != i}, walk=True)
  return simplify(ast)


def _outer_loop(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  """Loop order: range rid becomes the outermost global loop (the one split across cores)."""
  glbl = global_ranges(ast, lanes=False)
  order = [rng] + [r for r in glbl if r is not rng]
  return ast.substitute({r: r.replace(arg=(g.arg[0], *r.arg[1:])) for r, g in zip(order, glbl) if r is not g}, walk=True)


def _vector(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  rngs = ranges_of(ast)
  if opt.amount < 2 or opt.amount & (opt.amount - 1): raise ValueError(f"{opt}: vector lanes must be a power of two >= 2")
  if any(is_vector_range(r) and (r.arg[1] == "global" or rng.arg[1] == "global" or any(r in t and rng in t for t in _reduce_ranges(ast)))
         for r in rngs.values()): raise ValueError(f"{opt}: the kernel has a vector lane range where range {opt.rid} is used")
  outer = outer_range(rng, opt.amount)
  lane = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, opt.amount),), (max(rngs) + 1, rng.arg[1], "vector"))
  if rng.arg[1] == "global": ast = ast.substitute({rng: outer * opt.amount + lane}, walk=True)
  else: ast = graph_rewrite(ast, pm_vector_reduce, ctx=(rng, outer, lane), name="vector reduce")
  return simplify(ast)


def _upcast(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  """k outputs a loop iteration: the range's inner part is marked "upcast", and the expand pass copies the stores."""
  if not all(rng in st.toposort() for st in ast.src): raise ValueError(f"{opt}: a store of the kernel doesn't use range {opt.rid}")
  _, _, sub = _marked_split(ast, rng, opt.amount, "upcast")
  return simplify(ast.substitute({rng: sub}, walk=True))


def _upcast_overlap(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  """UPCAST by a k that doesn't divide the range's constant size N: ceil(N/k) blocks of k copies, the last block
  starting at N-k (`_overlap_start`), so a few outputs are computed twice (a 6-row tile on 1024 rows)."""
  n, k = const_end(rng), opt.amount
  if n is None or n <= k or n % k == 0:
    raise ValueError(f"{opt}: UPCAST_OVERLAP needs a constant range size that {k} doesn't divide, over {k} (else UPCAST)")
  outer = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, -(-n // k)),), rng.arg)
  start = _overlap_start(ast, rng, opt, outer)
  return simplify(ast.substitute({rng: start + copy_range(ast, rng, k, "upcast")}, walk=True))


def _overlap_amounts(n: int) -> tuple[int, ...]:
  """BEAM's amounts for UPCAST_OVERLAP: 3 and 6 where they don't divide a range at least 4 blocks long."""
  return tuple(a for a in (3, 6) if n % a and n >= 4 * a)


def _split(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  """SPLIT (k accumulators), UNROLL and FOLD (k = the whole range): the inner part is marked "unroll" ("fold" for
  FOLD), and the expand pass makes each REDUCE over it k REDUCEs, or the op chain (unrolled; folded: inside one REDUCE
  over the other ranges)."""
  if opt.kind != "SPLIT" and opt.amount != const_end(rng): raise ValueError(f"{opt}: {opt.kind} must cover the whole range")
  ctx = (rng, *_marked_split(ast, rng, opt.amount, "fold" if opt.kind == "FOLD" else "unroll"))
  return simplify(graph_rewrite(ast, pm_split_reduce, ctx=ctx, name=f"{opt.kind.lower()} reduce"))


register(OptKind("UPCAST", _upcast, GLOBAL, beam=split_amounts))
register(OptKind("UPCAST_OVERLAP", _upcast_overlap, GLOBAL, device="cpu", min_amount=2, beam=_overlap_amounts))
register(OptKind("SPLIT", _split, REDUCE, beam=split_amounts))
register(OptKind("UNROLL", _split, REDUCE, beam=lambda n: (n,)))
register(OptKind("FOLD", _split, REDUCE))   # (not a BEAM action: on a kernel's only reduce range it is UNROLL)
register(OptKind("VECTOR", _vector, ANY_RANGE))
register(OptKind("OUTER", _outer_loop, GLOBAL, device="cpu", beam=lambda n: (0,)))
register(OptKind("BLOCK", _block, GLOBAL, device="cpu", beam=split_amounts))
register(OptKind("PACK", None, GLOBAL, device="cpu", adds_kernel=True))  # BEAM proposes it on the unoptimized kernel (codegen/search.py)


def merge_reduce_ranges(ast: UOp) -> UOp:
  """`ast` with each pair of reduce ranges a (size na) and b (size nb, the next reduce range) that every REDUCE takes together
  and every index reads as one run, a*nb + b, merged into one range of size na*nb (a's id): a BatchNorm's per-channel
  sum over 32x32 pixels becomes one loop of 1024 instead of 32 loops of 32, which the compiler would unroll into a
  chain of scalar adds (4.3 GB/s). A pair is merged only if, with a = r // nb and b = r % nb, no division or modulo
  of r is left after simplifying (else the kernel would pay for them), and neither range is short enough to be
  unrolled (`unrollable`: a quantized block's pairs of sub-blocks and a group dot's 2 or 4 bytes are structure the
  heuristic reads)."""
  while True:
    reds = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    order = sorted({r for n in reds for r in n.src[1:]}, key=lambda r: r.arg[0])
    for a, b in zip(order, order[1:]):
      if (na := const_end(a)) is None or (nb := const_end(b)) is None or unrollable(a) or unrollable(b): continue
      if is_vector_range(a) or is_vector_range(b) or any((a in n.src[1:]) != (b in n.src[1:]) for n in reds): continue
      r = UOp(Ops.RANGE, a.dtype, (UOp.const(dtypes.index, na * nb),), a.arg)
      hi, lo = r // nb, r % nb
      merged = ast.substitute({a: hi, b: lo}, walk=True)   # then each REDUCE over (hi, lo) reduces over r
      merged = merged.substitute({n: UOp(Ops.REDUCE, n.dtype, (n.src[0], *(r if x is hi else x for x in n.src[1:] if x is not lo)), n.arg)
                                  for n in merged.toposort() if n.op is Ops.REDUCE and hi in n.src[1:]}, walk=True)
      merged = simplify(merged, "merge reduce ranges")
      if not any(n.op in (Ops.IDIV, Ops.MOD) and r in n.toposort() for n in merged.toposort()):
        ast = merged
        break
    else: return ast


def _reduce_ranges(ast: UOp) -> list[set[UOp]]:
  """For each REDUCE, every range its value uses (nested reduces included): two vector lanes may not meet in one."""
  return [{x for x in n.toposort() if x.op is Ops.RANGE} for n in ast.toposort() if n.op is Ops.REDUCE]


