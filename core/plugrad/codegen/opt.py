"""Kernel optimizations: rewrites of the kernel AST (docs/kernel_ir.md, form 2) applied before linearizing.

Every optimization splits one loop, `RANGE r` of constant size N, into an outer loop `r'` of size N/k and k
copies of the code with `r = r'*k + i` (i = 0..k-1), so the result is still a plain scalar AST that any renderer
(and the PYTHON device) runs unchanged:

- UPCAST a global range: the kernel's STOREs are replicated k times (k outputs per loop iteration). Loads that
  don't depend on the range are shared by hash-consing, so upcasting two output axes of a matmul gives a
  register-blocked kernel (a 4x16 tile of accumulators with the reduce loop inside).
- SPLIT a reduce range: REDUCE(x, r) becomes op(REDUCE(x[i=0], r'), ..., REDUCE(x[i=k-1], r')): k accumulators
  that break the add dependency chain (the linearizer runs REDUCEs over the same ranges in one loop).
- UNROLL a small reduce range (k = N): the REDUCE disappears into an op chain.

Only ranges with a constant size that k divides are touched, so symbolic (DEFINE_VAR) sizes and gated loads keep
their exact semantics. `choose_opts` picks the optimizations from the renderer's capabilities:
`upcast_max` (accumulators/outputs per loop iteration; 0 or missing disables all of this), `vectorizes_reductions`
(the compiler vectorizes a plain reduce loop, so streaming ADD/MUL reductions aren't split), and `has_local` /
`has_shared` (GPU renderers: local memory and grouped reductions are hooks, not implemented; see `local_opts`).
NOOPT=1 turns everything off.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from plugrad.dtype import dtypes
from plugrad.helpers import getenv
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import pm_symbolic
from plugrad.uop.upat import PatternMatcher, UPat


@dataclass(frozen=True)
class Opt:
  """One optimization: `kind` is "UPCAST" (global range), "SPLIT" or "UNROLL" (reduce range); `rid` the range id."""
  kind: str
  rid: int
  amount: int


def ranges_of(ast: UOp) -> dict[int, UOp]:
  return {n.arg[0]: n for n in ast.toposort() if n.op is Ops.RANGE}


def _const_end(r: UOp) -> int | None: return r.src[0].arg if r.src[0].op is Ops.CONST else None


def _copies(rng: UOp, k: int) -> tuple[UOp | None, list[dict[UOp, UOp]]]:
  """The outer range (None when fully unrolled) and the k substitutions r -> r'*k + i."""
  n = _const_end(rng)
  if n is None or k < 1 or n % k: raise ValueError(f"can't split range {rng.arg} of size {rng.src[0].render()} by {k}")
  if k == n: return None, [{rng: UOp.const(dtypes.index, i)} for i in range(k)]
  outer = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, n // k),), rng.arg)
  return outer, [{rng: outer * k + i} if i else {rng: outer * k} for i in range(k)]


def _split_reduce(ctx: tuple[UOp, UOp | None, list[dict[UOp, UOp]]], red: UOp) -> UOp | None:
  rng, outer, subs = ctx
  if rng not in red.src[1:]: return None
  rngs = tuple(outer for r in red.src[1:] if r is rng and outer is not None) + tuple(r for r in red.src[1:] if r is not rng)
  parts = [red.src[0].substitute(m, walk=True) for m in subs]
  parts = [UOp(Ops.REDUCE, red.dtype, (p, *rngs), red.arg) for p in parts] if rngs else parts
  return functools.reduce(lambda a, b: UOp(red.arg, red.dtype, (a, b)), parts)


pm_split_reduce = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _split_reduce)])


def apply_opt(ast: UOp, opt: Opt) -> UOp:
  """`ast` with one optimization applied (raises ValueError if it doesn't fit the kernel)."""
  rng = ranges_of(ast).get(opt.rid)
  if rng is None: raise ValueError(f"{opt}: the kernel has no range {opt.rid}")
  want = "global" if opt.kind == "UPCAST" else "reduce"
  if rng.arg[1] != want: raise ValueError(f"{opt}: range {opt.rid} is a {rng.arg[1]} range, {opt.kind} needs a {want} range")
  if opt.kind == "UNROLL" and opt.amount != _const_end(rng): raise ValueError(f"{opt}: UNROLL must cover the whole range")
  outer, subs = _copies(rng, opt.amount)
  if opt.kind == "UPCAST":
    stores = [st.substitute(m, walk=True) for st in ast.src for m in subs] if all(rng in st.toposort() for st in ast.src) else None
    if stores is None: raise ValueError(f"{opt}: a store of the kernel doesn't use range {opt.rid}")
    ast = UOp(Ops.SINK, dtypes.void, tuple(stores))
  else: ast = graph_rewrite(ast, pm_split_reduce, ctx=(rng, outer, subs), name=f"{opt.kind.lower()} reduce")
  return graph_rewrite(ast, pm_symbolic, name="simplify after opt")


def _stride_one(idx: UOp, rng: UOp) -> bool:
  """Whether `idx` moves by exactly 1 when `rng` moves by 1 (contiguous along rng)."""
  if rng not in idx.toposort(): return False
  d = graph_rewrite(idx.substitute({rng: rng + 1}, walk=True) - idx, pm_symbolic, name="stride")
  return d.op is Ops.CONST and d.arg == 1


def _pick(n: int | None, amounts: tuple[int, ...], budget: int) -> int:
  return next((a for a in amounts if n is not None and n % a == 0 and n > a and a <= budget), 0)


def choose_opts(ast: UOp, upcast_max: int, split_reduce: bool = True) -> list[Opt]:
  """Heuristic optimizations for a CPU-like target with `upcast_max` registers' worth of accumulators. `split_reduce=False`
  leaves streaming reductions to the compiler (a renderer whose compiler vectorizes reduce loops itself)."""
  topo = ast.toposort()
  glbl = sorted((n for n in topo if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda r: r.arg[0])
  reduces = [n for n in topo if n.op is Ops.REDUCE]
  if not reduces or upcast_max < 2: return []
  red_rngs = sorted({r for n in reduces for r in n.src[1:]}, key=lambda r: r.arg[0])
  loads = [n.src[0].src[1] for n in topo if n.op is Ops.LOAD and any(r in n.toposort() for r in red_rngs)]
  opts: list[Opt] = []
  budget = upcast_max
  split_reduce = split_reduce or any(n.arg is Ops.MAX for n in reduces)  # compilers don't vectorize a NaN-aware max loop
  # register blocking: upcast output axes that some reduce-loop load doesn't depend on (that load is reused k times)
  # the second axis is picked to reuse the loads the first one doesn't (matmul: rows of A, columns of B)
  reuse = [g for g in reversed(glbl) if any(g not in ld.toposort() for ld in loads) and _const_end(g) is not None]
  for amounts in ((16, 8, 4), (4, 2)):
    left = [ld for ld in loads if all(o.kind != "UPCAST" or ranges_of(ld).get(o.rid) is not None for o in opts)]
    g = next((g for g in reuse if all(o.rid != g.arg[0] for o in opts) and any(g not in ld.toposort() for ld in left)
              and _pick(_const_end(g), amounts, budget)), None)
    if g is None: break
    opts.append(Opt("UPCAST", g.arg[0], k := _pick(_const_end(g), amounts, budget)))
    budget //= k
  if not opts:  # streaming reduce: more accumulators, contiguous along whichever loop walks memory with stride 1
    inner = red_rngs[-1]
    if any(_stride_one(ld, inner) for ld in loads) or not glbl:
      if split_reduce and (k := _pick(_const_end(inner), (16, 8, 4), budget)): opts.append(Opt("SPLIT", inner.arg[0], k)); budget //= k
    elif (k := _pick(_const_end(glbl[-1]), (16, 8, 4), budget)): opts.append(Opt("UPCAST", glbl[-1].arg[0], k)); budget //= k
  unroll = 1
  for r in red_rngs:  # small reduce loops (e.g. a 3x3 window) are unrolled
    if (n := _const_end(r)) is not None and n <= 4 and unroll * n <= 16 and all(o.rid != r.arg[0] for o in opts):
      opts.append(Opt("UNROLL", r.arg[0], n))
      unroll *= n
  return opts


def local_opts(ast: UOp, renderer) -> list[Opt]:
  """Hook for GPU renderers (`has_local`/`has_shared`): local (workgroup) axes and grouped reductions through shared
  memory. The CPU has neither, so nothing is chosen yet; a GPU renderer's issue fills this in."""
  if not (getattr(renderer, "has_local", False) and getattr(renderer, "has_shared", False)): return []
  return []


def optimize(ast: UOp, renderer) -> UOp:
  """Apply the optimizations `renderer` asks for (see the module docstring)."""
  upcast_max = getattr(renderer, "upcast_max", 0)
  if getenv("NOOPT", False) or not upcast_max: return ast
  split = not getattr(renderer, "vectorizes_reductions", False)
  for opt in choose_opts(ast, upcast_max, split) + local_opts(ast, renderer): ast = apply_opt(ast, opt)
  return ast
