"""Kernel optimizations: rewrites of the kernel AST (docs/kernel_ir.md, form 2) applied before linearizing.

Every optimization splits one loop, `RANGE r` of size N (a constant, or a symbolic size that k divides for every value
of its variables, such as `8*T`), into an outer loop `r'` of size N/k and an inner part `r = r'*k + i`:

- UPCAST a global range: the kernel's STOREs are replicated k times (k outputs per loop iteration). Loads that
  don't depend on the range are shared by hash-consing, so upcasting two output axes of a matmul gives a
  register-blocked kernel (a 4x16 tile of accumulators with the reduce loop inside).
- SPLIT a reduce range: REDUCE(x, r) becomes op(REDUCE(x[i=0], r'), ..., REDUCE(x[i=k-1], r')): k accumulators
  that break the add dependency chain (the linearizer runs REDUCEs over the same ranges in one loop).
- UNROLL a small reduce range (k = N): the REDUCE disappears into an op chain.
- VECTOR a global or reduce range: the inner part becomes a new RANGE `i` of size k marked as a vector lane
  (arg `(id, kind, "vector")`). The AST stays scalar and valid for every renderer (a lane range is an ordinary
  loop); renderers with vector types (`vector_lanes` > 0) turn it into SIMD values with codegen/vectorize.py.
  VECTOR goes first on its range, so later UPCAST/SPLIT copies of `r'` sit outside the contiguous lanes.

UPCAST/SPLIT/UNROLL produce plain scalar code that any renderer (and the PYTHON device) runs unchanged.
`choose_opts` picks the optimizations from the renderer's capabilities: `upcast_max` (accumulators/outputs per loop
iteration; 0 or missing disables all of this), `vectorizes_reductions` (the compiler vectorizes a plain reduce
loop, so streaming ADD/MUL reductions aren't split), `vector_lanes`/`vector_regs` (explicit SIMD: the lanes of one
float vector and the number of vector registers); GPU renderers get theirs from codegen/gpuopt.py (LOCAL, GROUP,
GROUPTOP, GROUPOUT, TC). Every kind is registered in codegen/optops.py, whose `apply_opt` applies any of them. NOOPT=1
turns everything off.
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

from plugrad.codegen.optops import ANY_RANGE, GLOBAL, REDUCE, Opt, OptKind, apply_opt, is_vector_range, register, split_amounts
from plugrad.codegen.pack import _mul_operands, _stride_one, pack_candidate, split_packs
from plugrad.dtype import dtypes
from plugrad.helpers import getenv
from plugrad.runtime.renderer import Capabilities
from plugrad.uop.ops import GroupOp, Ops, UOp, exec_alu
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import _collect, _sum, pm_symbolic
from plugrad.uop.upat import PatternMatcher, UPat
from plugrad.viz import capture


def ranges_of(ast: UOp) -> dict[int, UOp]:
  return {n.arg[0]: n for n in ast.toposort() if n.op is Ops.RANGE}


def _const_end(r: UOp) -> int | None: return r.src[0].arg if r.src[0].op is Ops.CONST else None


def div_end(end: UOp, k: int) -> UOp | None:
  """`end / k` when k divides `end` for every value of its variables: a constant, `c*v` with k | c, a product with
  such a factor, or a sum of such terms (None otherwise)."""
  if k < 1: return None
  if k == 1: return end
  if end.op is Ops.CONST: return UOp.const(dtypes.index, end.arg // k) if end.arg % k == 0 else None
  if end.op is Ops.MUL:
    for a, b in (end.src, end.src[::-1]):
      if (q := div_end(a, k)) is not None: return b if q.op is Ops.CONST and q.arg == 1 else q * b
  if end.op is Ops.ADD and (a := div_end(end.src[0], k)) is not None and (b := div_end(end.src[1], k)) is not None: return a + b
  return None


def _outer(rng: UOp, k: int) -> UOp:
  """The range `rng` of size N/k, keeping its id and kind (raises when k doesn't divide N)."""
  if (n := div_end(rng.src[0], k)) is None: raise ValueError(f"can't split range {rng.arg} of size {rng.src[0].render()} by {k}")
  return UOp(Ops.RANGE, rng.dtype, (n,), rng.arg)


def _copies(rng: UOp, k: int) -> tuple[UOp | None, list[dict[UOp, UOp]]]:
  """The outer range (None when fully unrolled) and the k substitutions r -> r'*k + i."""
  if k == _const_end(rng): return None, [{rng: UOp.const(dtypes.index, i)} for i in range(k)]
  outer = _outer(rng, k)
  return outer, [{rng: outer * k + i} if i else {rng: outer * k} for i in range(k)]


def _split_reduce(ctx: tuple[UOp, UOp | None, list[dict[UOp, UOp]]], red: UOp) -> UOp | None:
  rng, outer, subs = ctx
  if rng not in red.src[1:]: return None
  rngs = tuple(outer for r in red.src[1:] if r is rng and outer is not None) + tuple(r for r in red.src[1:] if r is not rng)
  parts = [red.src[0].substitute(m, walk=True) for m in subs]
  parts = [UOp(Ops.REDUCE, red.dtype, (p, *rngs), red.arg) for p in parts] if rngs else parts
  return functools.reduce(lambda a, b: UOp(red.arg, red.dtype, (a, b)), parts)


def _vector_reduce(ctx: tuple[UOp, UOp, UOp], red: UOp) -> UOp | None:
  rng, outer, lane = ctx
  if rng not in red.src[1:]: return None
  rngs = tuple(x for r in red.src[1:] for x in ((outer, lane) if r is rng else (r,)))
  return UOp(Ops.REDUCE, red.dtype, (red.src[0].substitute({rng: outer * lane.src[0].arg + lane}, walk=True), *rngs), red.arg)


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
pm_opt_symbolic = pm_symbolic + pm_low_terms  # the simplifier used on optimized kernels
pm_split_reduce = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _split_reduce)])
pm_vector_reduce = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _vector_reduce)])


def _block(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  """Cache blocking: r = r_o*k + r_i, r_o the outermost global loop, r_i in r's place."""
  rngs = ranges_of(ast)
  if (n := _const_end(rng)) is None or opt.amount < 2 or n % opt.amount or n == opt.amount:
    raise ValueError(f"{opt}: BLOCK of range {opt.rid} (size {rng.src[0].render()}) needs a constant size that {opt.amount} divides")
  inner = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, opt.amount),), rng.arg)
  outer = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, n // opt.amount),), (max(rngs) + 1, "global"))
  ast = ast.substitute({rng: outer * opt.amount + inner}, walk=True)
  glbl = sorted((r for r in ranges_of(ast).values() if r.arg[1] == "global" and not is_vector_range(r)), key=lambda r: r.arg[0])
  order = [outer] + [r for r in glbl if r is not outer]
  ids = sorted(r.arg[0] for r in glbl)
  ast = ast.substitute({r: r.replace(arg=(i, *r.arg[1:])) for r, i in zip(order, ids) if r.arg[0] != i}, walk=True)
  return graph_rewrite(ast, pm_opt_symbolic, name="simplify after opt")


def _outer_loop(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  """Loop order: range rid becomes the outermost global loop (the one split across cores)."""
  glbl = sorted((r for r in ranges_of(ast).values() if r.arg[1] == "global" and not is_vector_range(r)), key=lambda r: r.arg[0])
  order = [rng] + [r for r in glbl if r is not rng]
  return ast.substitute({r: r.replace(arg=(g.arg[0], *r.arg[1:])) for r, g in zip(order, glbl) if r is not g}, walk=True)


def _vector(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  rngs = ranges_of(ast)
  if opt.amount < 2 or opt.amount & (opt.amount - 1): raise ValueError(f"{opt}: vector lanes must be a power of two >= 2")
  if any(is_vector_range(r) and (r.arg[1] == "global" or rng.arg[1] == "global" or any(r in t and rng in t for t in _reduce_ranges(ast)))
         for r in rngs.values()): raise ValueError(f"{opt}: the kernel has a vector lane range where range {opt.rid} is used")
  outer = _outer(rng, opt.amount)
  lane = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, opt.amount),), (max(rngs) + 1, rng.arg[1], "vector"))
  if rng.arg[1] == "global": ast = ast.substitute({rng: outer * opt.amount + lane}, walk=True)
  else: ast = graph_rewrite(ast, pm_vector_reduce, ctx=(rng, outer, lane), name="vector reduce")
  return graph_rewrite(ast, pm_opt_symbolic, name="simplify after opt")


def _upcast(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  _, subs = _copies(rng, opt.amount)
  stores = [st.substitute(m, walk=True) for st in ast.src for m in subs] if all(rng in st.toposort() for st in ast.src) else None
  if stores is None: raise ValueError(f"{opt}: a store of the kernel doesn't use range {opt.rid}")
  return graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(stores)), pm_opt_symbolic, name="simplify after opt")


def _split(ast: UOp, rng: UOp, opt: Opt, caps: Capabilities | None) -> UOp:
  """SPLIT (k accumulators) and UNROLL (k = the whole range)."""
  if opt.kind == "UNROLL" and opt.amount != _const_end(rng): raise ValueError(f"{opt}: UNROLL must cover the whole range")
  outer, subs = _copies(rng, opt.amount)
  ast = graph_rewrite(ast, pm_split_reduce, ctx=(rng, outer, subs), name=f"{opt.kind.lower()} reduce")
  return graph_rewrite(ast, pm_opt_symbolic, name="simplify after opt")


register(OptKind("UPCAST", _upcast, GLOBAL, beam=split_amounts))
register(OptKind("SPLIT", _split, REDUCE, beam=split_amounts))
register(OptKind("UNROLL", _split, REDUCE, beam=lambda n: (n,)))
register(OptKind("VECTOR", _vector, ANY_RANGE))
register(OptKind("OUTER", _outer_loop, GLOBAL, device="cpu", beam=lambda n: (0,)))
register(OptKind("BLOCK", _block, GLOBAL, device="cpu", beam=split_amounts))
register(OptKind("PACK", None, GLOBAL, device="cpu", adds_kernel=True))  # BEAM proposes it on the unoptimized kernel (engine/search.py)


def _reduce_ranges(ast: UOp) -> list[set[UOp]]:
  """For each REDUCE, every range its value uses (nested reduces included): two vector lanes may not meet in one."""
  return [{x for x in n.toposort() if x.op is Ops.RANGE} for n in ast.toposort() if n.op is Ops.REDUCE]


def _divides(r: UOp, a: int, whole: bool = False) -> bool:
  """Whether `a` splits range `r` (covering all of it only if `whole`)."""
  n = _const_end(r)
  return (n % a == 0 and (n > a or whole)) if n is not None else div_end(r.src[0], a) is not None


def _unrollable(r: UOp) -> bool:
  """A reduce loop short enough to be unrolled (`choose_opts`: a 3x3 window)."""
  return (n := _const_end(r)) is not None and n <= UNROLL_MAX


def _pick(r: UOp | None, amounts: tuple[int, ...], budget: int, whole: bool = False) -> int:
  """The first of `amounts` within `budget` that splits `r` (or covers it exactly, if `whole`); 0 if none does."""
  return next((a for a in amounts if r is not None and a <= budget and _divides(r, a, whole)), 0)


def eval_index(x: UOp, env: dict[UOp, int]) -> int:
  """The value of index/bool expression `x` with ranges and variables set by `env` (memoized in `env`)."""
  if (v := env.get(x)) is not None: return v
  if x.op is Ops.CONST: v = x.arg
  elif x.op is Ops.DEFINE_VAR: v = x.arg[1]
  elif x.op is Ops.RANGE: v = 0
  elif x.op is Ops.CAST: v = eval_index(x.src[0], env)
  elif x.op in GroupOp.ALU: v = exec_alu(x.op, x.dtype, [eval_index(s, env) for s in x.src])
  else: raise ValueError(f"can't evaluate {x.op} statically")  # e.g. an index loaded from memory (a gather)
  env[x] = v
  return v


def lane_pattern(idx: UOp, lane: UOp, samples: int = 3) -> str:
  """How `idx` moves across the lanes of vector range `lane`, judged at a few sample points of the other ranges and
  variables: "broadcast" (the same for every lane), "contiguous" (lane i reads base + i), "tile2"/"tile4" (lane i
  reads base + i % g: a group of g repeated, a group dot's factor that doesn't move with the lanes) or "gather"."""
  if lane not in idx.toposort(): return "broadcast"
  k, rnd = lane.src[0].arg, random.Random(0)
  free = [n for n in idx.toposort() if n.op in (Ops.RANGE, Ops.DEFINE_VAR) and n is not lane]
  try: return _lane_pattern(idx, lane, k, rnd, free, samples)
  except (ValueError, ZeroDivisionError): return "gather"


def _lane_pattern(idx: UOp, lane: UOp, k: int, rnd: random.Random, free: list[UOp], samples: int) -> str:
  kinds = set()
  for _ in range(samples):
    env: dict[UOp, int] = {}
    for n in free:  # variables first (range sizes may depend on them), then each range inside its size
      if n.op is Ops.DEFINE_VAR: env[n] = rnd.randint(n.arg[1], n.arg[2])
    for n in free:
      if n.op is Ops.RANGE: env[n] = rnd.randrange(max(1, eval_index(n.src[0], dict(env))))
    vals = [eval_index(idx, {**env, lane: i}) for i in range(k)]
    kinds.add("broadcast" if all(v == vals[0] for v in vals) else "contiguous" if all(v - vals[0] == i for i, v in enumerate(vals)) else
              next((f"tile{g}" for g in (2, 4) if k > g and all(v - vals[0] == i % g for i, v in enumerate(vals))), "gather"))
  return "gather" if "gather" in kinds or len(kinds) > 1 else kinds.pop()


def _reduce_loads(ast: UOp) -> list[UOp]:
  """The INDEX nodes of the loads inside reduce loops."""
  topo = ast.toposort()
  red_rngs = {r for n in topo if n.op is Ops.REDUCE for r in n.src[1:]}
  return [n.src[0] for n in topo if n.op is Ops.LOAD and n.src[0].op is Ops.INDEX and any(r in n.src[0].toposort() for r in red_rngs)]


def fits(x: UOp, lo: int, hi: int) -> bool:
  """An integer value within [lo, hi] (range analysis)."""
  return (dtypes.is_int(x.dtype) or x.dtype == dtypes.index) and lo <= x.vmin and x.vmax <= hi


def fits16(x: UOp) -> bool:
  """An integer value that int16 holds (range analysis)."""
  return fits(x, -32768, 32767)


@dataclass(frozen=True)
class Dots:
  """A renderer's integer dot products on vectors, as codegen reads them (`Renderer.dot2`, `Renderer.dot4`): `pair`,
  WMMA "DOT2": lane i = a[2i]*b[2i] + a[2i+1]*b[2i+1] + c[i] with int16 a and b; `quad`, WMMA "DOT4": lane i = the sum
  over j < 4 of a[4i+j]*b[4i+j], + c[i], with uint8 a at most `quad` (0: no DOT4) and int8 b; int32 lanes."""
  pair: bool = False
  quad: int = 0

  @staticmethod
  def of(caps: Capabilities) -> Dots: return Dots(caps.dot2, caps.dot4)

  def __bool__(self) -> bool: return self.pair or self.quad > 0


NO_DOTS = Dots()


def dot4_factors(mul: UOp, quad: int) -> tuple[UOp, UOp] | None:
  """The factors of product `mul` as (unsigned in [0, quad], int8), the order WMMA "DOT4" takes them; None if they
  don't fit."""
  for u, s in (mul.src, mul.src[::-1]):
    if fits(u, 0, quad) and fits(s, -128, 127): return u, s
  return None


def group_dot_range(red: UOp, dots: Dots) -> UOp | None:
  """The innermost range p of REDUCE(a*b, ..., p) when a renderer with `dots` may compute it as one integer dot per
  group of p's size (codegen/vectorize.py): an int32 sum, p of 2 with both factors in int16 (DOT2), or p of 4 with one
  factor in [0, dots.quad] and the other in int8 (DOT4)."""
  if red.op is not Ops.REDUCE or red.arg is not Ops.ADD or red.dtype != dtypes.int32 or len(red.src) < 2: return None
  if (body := red.src[0]).op is not Ops.MUL: return None
  n = _const_end(p := red.src[-1])
  if n == 2 and dots.pair and all(fits16(s) for s in body.src): return p
  return p if n == 4 and dots.quad and dot4_factors(body, dots.quad) is not None else None


def group_lane(lane: UOp, g: int) -> UOp:
  """The vector range of g*k lanes that runs over vector range `lane` (k) and a group range p of g together:
  lane = w // g, p = w % g."""
  return UOp(Ops.RANGE, lane.dtype, (UOp.const(dtypes.index, g * lane.src[0].arg),), (-1 - lane.arg[0], lane.arg[1], "vector"))


def _vector_score(ast: UOp, dots: Dots = NO_DOTS) -> int:
  """Contiguous reduce-loop loads count +1, gathers -2 (lane by lane loads and inserts), broadcasts 0. With `dots`, a
  load of a group dot's factor (`group_dot_range`) counts as contiguous when the lanes and the group together read
  contiguous memory."""
  score, topo = 0, ast.toposort()
  groups = {p for n in topo if (p := group_dot_range(n, dots)) is not None} if dots else set()
  for lane in (r for r in ranges_of(ast).values() if is_vector_range(r)):
    for ix in _reduce_loads(ast):
      kind = "gather" if len(ix.src) > 2 and lane_pattern(ix.src[2], lane) != "broadcast" else lane_pattern(ix.src[1], lane)
      if kind == "gather" and len(ix.src) == 2 and (p := next((p for p in groups if p in ix.toposort()), None)) is not None:
        w = group_lane(lane, g := _const_end(p))
        kind = lane_pattern(ix.src[1].substitute({lane: w // g, p: w % g}, walk=True), w)
      score += {"contiguous": 1, "broadcast": 0, "tile2": 0, "tile4": 0, "gather": -2}[kind]
  return score


def vector_opts(ast: UOp, lanes: int, regs: int, dots: Dots = NO_DOTS) -> list[Opt] | None:
  """Explicit SIMD for a reducing kernel: VECTOR the axis (a global one or the innermost reduce one) along which the
  reduce loop's loads are contiguous (`lanes` wide), then register-block with UPCAST/SPLIT within `regs` vector
  registers for accumulators. None when no axis vectorizes well (the scalar heuristics apply)."""
  topo = ast.toposort()
  reduces = [n for n in topo if n.op is Ops.REDUCE]
  if not reduces or any(n.dtype.scalar() in (dtypes.bool, dtypes.float16, dtypes.bfloat16) for n in reduces): return None
  glbl = sorted((n for n in topo if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda r: r.arg[0])
  best: tuple[int, int, int, list[UOp], UOp] | None = None
  inner = sorted({n.src[-1] for n in reduces}, key=lambda r: r.arg[0])  # the innermost range of each reduce
  # a short inner reduce nested in a longer one is unrolled (choose_opts): the lanes go along the enclosing reduce's
  # innermost range (a blockwise-quantized matvec: sum over (block, lane) of scale * sum over 4 chunks of x * q)
  # (a group dot's range of 2 or 4 is not an innermost range: its group of lanes sits inside the vector lanes)
  groups = {p for n in reduces if (p := group_dot_range(n, dots)) is not None} if dots else set()
  if groups: inner = [r for r in inner if r not in groups] or inner
  inner = [r for r in inner if not _unrollable(r)] or inner
  widths = (lanes, lanes // 2, lanes // 4) if dots.quad and groups else (lanes, lanes // 2)   # DOT4: 4 bytes a lane
  cands = [(pref, cs, n) for n in widths if n >= 4 for pref, cs in enumerate([inner, *([g] for g in glbl)])
           if all(_divides(c, n, whole=True) for c in cs)]  # ties go to wider vectors, then to global axes (vector stores, no horizontal sum)
  for pref, cs, n in cands:
    try:
      a = ast
      for c in cs: a = apply_opt(a, Opt("VECTOR", c.arg[0], n))
    except ValueError: continue
    if (sc := _vector_score(a, dots)) > 0 and (best is None or (sc, n, pref) > best[:3]): best = (sc, n, pref, cs, a)
  if best is None: return None
  _, lanes, _, cs, a = best
  opts = []
  for c in cs:
    opts.append(Opt("VECTOR", c.arg[0], lanes))
    if c.arg[1] == "reduce" and _divides(_outer(c, lanes), 2): opts.append(Opt("SPLIT", c.arg[0], 2))  # two accumulator chains
  vr = ranges_of(ast)[opts[0].rid]
  loads = _reduce_loads(a)
  reuse = [g for g in reversed(glbl) if g is not vr and any(g not in ix.toposort() for ix in loads)]
  if vr.arg[1] == "global" and groups:   # a group dot with output rows in its lanes (quant.rows_linear): the rows of x
    # (the axes the dot's vector loads don't move with) upcast whole, each unpacked code vector multiplied with all of
    # them; no second vector of rows (measured on a 4-bit group dot with 4 rows of x: 4x1 23 us, 2x2 27-31 us)
    vloads = [ix for ix in loads if any(is_vector_range(r) for r in ranges_of(ix).values())]
    budget = regs // 4
    for g in reuse:
      if not any(g in ix.toposort() for ix in vloads) and (k := _pick(g, (8, 4, 2), budget, whole=True)):
        opts.append(Opt("UPCAST", g.arg[0], k))
        budget //= k
  elif vr.arg[1] == "global":  # matmul-like: a tile of (rows x 2 vectors) accumulators, the broadcast loads reused
    budget = regs * 3 // 4
    # rows first: the axes the vector operand doesn't move with (each copy reuses its vector loads), then the others
    # (an attention projection's heads: only the broadcasts are reused, the vector loads of every head differ)
    vloads = [ix for ix in loads if vr.arg[0] in ranges_of(ix)]   # (the vector axis is a new range in `a`: by id)
    reuse.sort(key=lambda g: any(g in ix.toposort() for ix in vloads))
    if _divides(_outer(vr, lanes), 2) and reuse: opts.append(Opt("UPCAST", vr.arg[0], 2)); budget //= 2
    # a small axis may be upcast whole (attention's 3 or 7 query heads of a KV head: the keys are read once for all);
    # not when short reduce loops will be unrolled too (a convolution's weight gradient: 3x3 window axes upcast whole
    # times a 4x4 unrolled window made 288 copies of a fused expression, 54k uops that clang compiled for 20+ minutes)
    rngs = ranges_of(ast)
    may_whole = not any(_unrollable(r) for r in rngs.values() if r.arg[1] == "reduce")
    for g in reuse:
      if (k := _pick(g, (8, 6, 4, 3, 2), budget, whole=may_whole) or (n if may_whole and (n := _const_end(g)) in (5, 7) and n <= budget else 0)):
        opts.append(Opt("UPCAST", g.arg[0], k)); budget //= k
    # the column panel loop outermost: the panel of the contiguous operand stays in cache while the rows stream by;
    # also when the loop that would be outermost is too short to split across cores (3 KV heads on 2 cores) and the
    # columns are many (a symbolic number of key positions)
    whole = {o.rid for o in opts if o.kind == "UPCAST" and o.amount == _const_end(rngs[o.rid])}
    first = next((g for g in glbl if g.arg[0] not in whole), None)
    vtrips = _const_end(vr) // lanes if _const_end(vr) is not None else vr.src[0].vmax // lanes
    if reuse and first is not None and vr is not first and vtrips >= 16 and \
       (_const_end(vr) is not None or ((fe := _const_end(first)) is not None and fe < OUTER_MIN_TRIPS)): opts.append(Opt("OUTER", vr.arg[0], 0))
    if (pk := _pack_opt(ast, vr, opts, lanes)) is not None: opts[:0] = pk
  else:  # matvec-like: a few rows share the loads of the vector operand (more rows means more prefetch streams)
    if (r := _shared_split(ast, a, cs, lanes)) is not None: opts.append(Opt("SPLIT", r.arg[0], 2))
    budget = max(1, regs // 2 // max((o.amount for o in opts if o.kind == "SPLIT"), default=1))
    # the axis whose copies share the most loads first (prefill: tokens share a dequantized weight row, rows share x)
    # a whole axis of 2 or 4 may be upcast (a batched decode step's 4 rows: each weight is read and dequantized once
    # for all of them, and the cores split the columns)
    # (ties: the shorter axis, upcast whole: a batched decode step's rows share the weight stream, not x's)
    # not an axis whose copies share only the smaller operand while each streams its own part of the larger one (a
    # decode matvec's weight rows: the copies share x, already in L1, and each adds a weight stream; measured on an
    # 8-bit matvec streaming 145 MB from DRAM: 4 rows 6.5-7.8 ms, 1 row 3.9-4.1 ms)
    for g in sorted(reuse, key=lambda g: (-sum(g not in ix.toposort() for ix in loads), _const_end(g) or 1 << 30)):
      if _shares_only_the_smaller(g, loads): continue
      if (k := _pick(g, (4, 2), min(4, budget), whole=True)): opts.append(Opt("UPCAST", g.arg[0], k)); budget //= k
    if all(o.kind != "UPCAST" for o in opts) and not _streams_against_shared(loads, glbl):  # streaming: four accumulator chains
      # (not a matvec's rows: two chains keep its weight stream's steps prefetchable, <= 128 bytes a trip)
      opts = [Opt("SPLIT", o.rid, 4) if o.kind == "SPLIT" and o.rid == vr.arg[0] and _divides(_outer(ranges_of(ast)[o.rid], lanes), 4) else o
              for o in opts]   # (the vector range's own SPLIT; a shared SPLIT of sub-block pairs stays 2)
  return opts


def _streams_against_shared(loads: list[UOp], glbl: list[UOp]) -> bool:
  """A matvec-like reduce: one of its loop's `loads` moves with an output range and another doesn't (rows against x)."""
  return any(any(g in ix.toposort() for ix in loads) and any(g not in ix.toposort() for ix in loads) for g in glbl)


def _span(ix: UOp) -> int:
  """The elements an INDEX can reach: the product of its ranges' trip counts (symbolic ones at their bound)."""
  return math.prod(int(r.src[0].vmax) for r in ix.toposort() if r.op is Ops.RANGE)


def _shares_only_the_smaller(g: UOp, loads: list[UOp]) -> bool:
  """Whether upcasting range `g` shares only loads that reach fewer elements than the ones that move with it."""
  shared, moving = [_span(ix) for ix in loads if g not in ix.toposort()], [_span(ix) for ix in loads if g in ix.toposort()]
  return bool(shared and moving) and max(shared) < max(moving)


def _shared_split(ast: UOp, a: UOp, cs: list[UOp], lanes: int) -> UOp | None:
  """A reduce range to SPLIT by 2 when the lanes span a whole reduce range (its outer loop has one trip, so it gets
  no SPLIT of its own) and both copies read every weight (each vector load that moves with an output axis) from
  the same place: two sub-blocks whose codes are the low and high fields of the same bytes are then unpacked from one
  load, with constant shifts (measured on such a 4-bit matvec with AVX2 code: 200 -> 150 us)."""
  if any(c.arg[1] != "reduce" or _const_end(_outer(c, lanes)) != 1 for c in cs): return None
  glbl = [r for r in ranges_of(a).values() if r.arg[1] == "global"]
  if not glbl: return None
  out = max(glbl, key=lambda r: _const_end(r) or 1 << 30)   # the weight's rows (not a batched step's few rows of x)
  def weights(x: UOp) -> int:
    return len({ix for ix in _reduce_loads(x) if out in ix.toposort() and any(is_vector_range(n) for n in ix.toposort() if n.op is Ops.RANGE)})
  if (n := weights(a)) == 0: return None
  for r in sorted((r for r in ranges_of(a).values() if r.arg[1] == "reduce" and not is_vector_range(r)), key=lambda r: -r.arg[0]):
    if _unrollable(r) or not _divides(r, 2): continue
    try: b = apply_opt(a, Opt("SPLIT", r.arg[0], 2))
    except ValueError: continue
    if weights(b) == n: return ranges_of(ast).get(r.arg[0])
  return None


UNROLL_MAX = 4  # reduce loops this short are unrolled (a 3x3 window)
OUTER_MIN_TRIPS = 8  # an outermost loop with fewer trips splits badly across cores (3 trips on 2 cores: 2 + 1)
PACK_MIN_ROW_BLOCKS = 4  # a packed panel must be reused by at least this many row blocks to pay for its copy
PACK_MIN_REDUCE = 16  # and be at least this long along the reduce axis
PACK_MIN_EXPR_BLOCKS = 8  # an expression operand (a dequantized weight) is packed when this many row blocks reuse it


def _pack_opt(ast: UOp, vr: UOp, opts: list[Opt], lanes: int) -> list[Opt] | None:
  """PACK (codegen/pack.py) of the column panel of a register-blocked matmul: when the panel loop is outermost and the
  panel is reused by enough row blocks (PACK=0 turns it off)."""
  if not getenv("PACK", 1) or not any(o.kind == "OUTER" for o in opts): return None
  P = lanes * math.prod(o.amount for o in opts if o.kind == "UPCAST" and o.rid == vr.arg[0])
  rows = [o for o in opts if o.kind == "UPCAST" and o.rid != vr.arg[0]]
  rngs = ranges_of(ast)
  blocks = math.prod((_const_end(rngs[o.rid]) or 0) // o.amount for o in rows)
  if not rows or blocks < PACK_MIN_ROW_BLOCKS: return None
  red = math.prod(_const_end(r) or 0 for r in {r for n in ast.toposort() if n.op is Ops.REDUCE for r in n.src[1:]})
  if red < PACK_MIN_REDUCE: return None  # a short panel (e.g. K = 10) stays in L1 as it is: the copy can't pay
  if pack_candidate(ast, vr, P, [rngs[o.rid] for o in rows]) is None: return None
  out = [Opt("PACK", vr.arg[0], P)]
  # the row operand too when it is read across rows (A.T: each k step a new line, a row apart) or PACK_A=1 (the R
  # broadcasts of a k step become R consecutive floats); PACK_A=0 never
  if len(rows) == 1 and (val := pack_candidate(ast, r := rngs[rows[0].rid], rows[0].amount, [vr])) is not None and \
     getenv("PACK_A", -1) != 0 and (getenv("PACK_A", -1) == 1 or not _plain_load_along(val, "reduce")):
    out.append(Opt("PACK", r.arg[0], rows[0].amount))
  return out


def _plain_load_along(val: UOp, kind: str, rng: UOp | None = None) -> bool:
  """Whether an operand is a single load that walks memory with stride 1 along `rng` (or along some range of `kind`):
  anything else (an expression recomputed per column block, a transposed read) is worth packing."""
  if val.op is not Ops.LOAD or val.src[0].op is not Ops.INDEX: return False
  rs = [rng] if rng is not None else [n for n in val.toposort() if n.op is Ops.RANGE and n.arg[1] == kind]
  return any(_stride_one(val.src[0].src[1], r) for r in rs)


def phase_opts(ast: UOp, budget: int = 16) -> list[Opt]:
  """An elementwise kernel that reads its output position modulo a small constant (the phases a stride-2 input
  gradient interleaves, any cat-like sum of strided pieces): each such global range is unrolled by that constant, so in
  every copy `r % c` and `r // c` fold to constants and only the piece the copy's phase selects is loaded (rolled,
  every element tested and loaded all of them). At most `budget` copies in all."""
  opts: list[Opt] = []
  for n in ast.toposort():
    if n.op is not Ops.MOD or n.src[1].op is not Ops.CONST: continue
    r, c = n.src[0], n.src[1].arg
    while r.op is Ops.CAST: r = r.src[0]   # an arange's int32 view of the range
    if r.op is not Ops.RANGE or r.arg[1] != "global": continue
    if not 2 <= c <= 4 or (end := _const_end(r)) is None or end % c or end == c or any(o.rid == r.arg[0] for o in opts): continue
    if c > budget: break
    opts.append(Opt("UPCAST", r.arg[0], c))
    budget //= c
  return opts


def choose_opts(ast: UOp, upcast_max: int, split_reduce: bool = True, lanes: int = 0, regs: int = 16, dots: Dots = NO_DOTS) -> list[Opt]:
  """Heuristic optimizations for a CPU-like target with `upcast_max` registers' worth of accumulators. `split_reduce=False`
  leaves streaming reductions to the compiler (a renderer whose compiler vectorizes reduce loops itself); `lanes` > 0
  allows explicit SIMD (VECTOR) of that many float32 lanes with `regs` vector registers; `dots`: the renderer's
  integer dot products (a group dot's range of 2 or 4 then stays a range, for codegen/vectorize.py)."""
  topo = ast.toposort()
  glbl = sorted((n for n in topo if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda r: r.arg[0])
  reduces = [n for n in topo if n.op is Ops.REDUCE]
  if not reduces and upcast_max >= 2: return phase_opts(ast, min(upcast_max, 16))
  if not reduces or upcast_max < 2: return []
  red_rngs = sorted({r for n in reduces for r in n.src[1:]}, key=lambda r: r.arg[0])
  opts: list[Opt] = (vector_opts(ast, lanes, regs, dots) or []) if lanes >= 2 else []
  if not split_reduce and all(o.kind in ("VECTOR", "SPLIT") and ranges_of(ast)[o.rid].arg[1] == "reduce" for o in opts) and \
     not (dots and any(group_dot_range(n, dots) is not None for n in reduces)) and not _streams_against_shared(_reduce_loads(ast), glbl):
    opts = []  # a streaming reduce (nothing to register-block): the compiler's loop vectorizer does the same, and better
    #          (not a group dot's: the compiler has no DOT2/DOT4; nor a matvec's: its scalar upcasts ran 4x slower)
  if not opts: opts = _scalar_opts(ast, upcast_max, split_reduce, glbl, reduces, red_rngs)
  unroll = 1
  groups = {p for n in reduces if (p := group_dot_range(n, dots)) is not None} if dots and any(o.kind == "VECTOR" for o in opts) else set()
  for r in red_rngs:  # small reduce loops (e.g. a 3x3 window) are unrolled
    if _unrollable(r) and r not in groups and unroll * (n := _const_end(r)) <= 16 and all(o.rid != r.arg[0] for o in opts):
      opts.append(Opt("UNROLL", r.arg[0], n))
      unroll *= n
  return opts


def _scalar_opts(ast: UOp, upcast_max: int, split_reduce: bool, glbl: list[UOp], reduces: list[UOp], red_rngs: list[UOp]) -> list[Opt]:
  """Register blocking by scalar copies (the compiler's SLP vectorizer packs them) for renderers without vectors."""
  loads = [n.src[0].src[1] for n in ast.toposort() if n.op is Ops.LOAD and any(r in n.toposort() for r in red_rngs)]
  opts: list[Opt] = []
  budget = upcast_max
  split_reduce = split_reduce or any(n.arg is Ops.MAX for n in reduces)  # compilers don't vectorize a NaN-aware max loop
  # register blocking: upcast output axes that some reduce-loop load doesn't depend on (that load is reused k times)
  # the second axis is picked to reuse the loads the first one doesn't (matmul: rows of A, columns of B)
  reuse = [g for g in reversed(glbl) if any(g not in ld.toposort() for ld in loads)]
  for amounts in ((16, 8, 4), (4, 2)):
    left = [ld for ld in loads if all(o.kind != "UPCAST" or ranges_of(ld).get(o.rid) is not None for o in opts)]
    g = next((g for g in reuse if all(o.rid != g.arg[0] for o in opts) and any(g not in ld.toposort() for ld in left)
              and _pick(g, amounts, budget)), None)
    if g is None: break
    opts.append(Opt("UPCAST", g.arg[0], k := _pick(g, amounts, budget)))
    budget //= k
  if not opts:  # streaming reduce: more accumulators, contiguous along whichever loop walks memory with stride 1
    inner = red_rngs[-1]
    if any(_stride_one(ld, inner) for ld in loads) or not glbl:
      if split_reduce and (k := _pick(inner, (16, 8, 4), budget)): opts.append(Opt("SPLIT", inner.arg[0], k))
    elif (k := _pick(glbl[-1], (16, 8, 4), budget)): opts.append(Opt("UPCAST", glbl[-1].arg[0], k))
  return opts


def heuristic_opts(ast: UOp, caps: Capabilities) -> list[Opt]:
  """The optimizations the CPU heuristic picks for `ast` on a target with capabilities `caps` (none without `upcast_max`)."""
  if not (upcast_max := caps.upcast_max): return []
  split, lanes, regs = not caps.vectorizes_reductions, caps.vector_lanes, caps.vector_regs
  if lanes >= 2 and (co := conv_opts(ast, lanes, regs)) is not None: return co
  opts = choose_opts(ast, upcast_max, split, lanes, regs, Dots.of(caps))
  if lanes >= 2 and (po := _operand_pack_opts(ast, upcast_max, split, lanes, regs, opts)): opts = po
  if (blk := row_block_opt(ast, opts, caps.cache_bytes[2])) is not None: opts = opts + [blk]
  return opts


ROW_CHUNK_L3_PART = 8  # a row chunk of a blocked matmul holds this part of L3 (the other cores' chunks and the panels share it)


def row_block_opt(ast: UOp, opts: list[Opt], l3: int) -> Opt | None:
  """Cache blocking of a big column-panel matmul (OUTER: each packed panel of B, K x P, sits in L2 while all rows
  of A stream past it). When A (M x K) is over half of L3, every panel re-reads it from DRAM; BLOCK the row axis into
  chunks of at most L3/ROW_CHUNK_L3_PART bytes of A, outermost, so the panels meet a chunk that is in L3 and each
  panel is re-read once per chunk instead (4096^2 on one core: 135 -> 170 GFLOPS). `l3`: the L3 bytes (0: unknown,
  nothing); ROW_BLOCK=0 turns it off. The BLOCK's rid is the row range's id after the OUTER relabelling."""
  if not l3 or not getenv("ROW_BLOCK", 1) or (outer := next((o for o in opts if o.kind == "OUTER"), None)) is None: return None
  rngs = ranges_of(ast)
  glbl = sorted((r for r in rngs.values() if r.arg[1] == "global" and not is_vector_range(r)), key=lambda r: r.arg[0])
  rows = [o for o in opts if o.kind == "UPCAST" and o.rid != outer.rid]
  red = [r for r in rngs.values() if r.arg[1] == "reduce"]
  if len(glbl) != 2 or len(rows) != 1 or len(red) != 1 or any(_const_end(r) is None for r in (*glbl, *red)): return None
  row = rngs[rows[0].rid]
  item = max((n.dtype.itemsize for n in ast.toposort() if n.op is Ops.LOAD), default=4)
  a_bytes, row_bytes = _const_end(row) * _const_end(red[0]) * item, rows[0].amount * _const_end(red[0]) * item
  if a_bytes * 2 <= l3: return None
  blocks, chunk = _const_end(row) // rows[0].amount, 1
  while blocks % (chunk * 2) == 0 and chunk * 2 < blocks and chunk * 2 * row_bytes * ROW_CHUNK_L3_PART <= l3: chunk *= 2
  return Opt("BLOCK", glbl[1].arg[0] if row is glbl[0] else row.arg[0], chunk) if chunk >= 2 else None


def _operand_pack_opts(ast: UOp, upcast_max: int, split: bool, lanes: int, regs: int, chosen: list[Opt]) -> list[Opt] | None:
  """PACK for matmuls whose operands `choose_opts` can't tile well as they are: the column operand not contiguous
  along the output's columns (x @ W.T reads W along the reduce axis: reduce-axis lanes and horizontal sums), or an
  operand that is an expression (a fused activation, normalization or gradient's elementwise part, which the kernel
  would evaluate again for every output column block). Those are packed first (codegen/pack.py), then the heuristic
  runs on the packed kernel. Used when an expression is packed, or when the packed kernel gets the column-panel tile
  (OUTER) that `chosen` (the heuristic on the kernel as it is) lacks."""
  if not getenv("PACK", 1) or not any(n.op is Ops.REDUCE for n in ast.toposort()): return None
  glbl = sorted((n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda r: r.arg[0])
  if len(glbl) < 2 or (nsz := _const_end(glbl[-1])) is None or nsz % (2 * lanes): return None
  col, others = glbl[-1], glbl[:-1]
  first: list[Opt] = []
  expr = False
  red = {r for n in ast.toposort() if n.op is Ops.REDUCE for r in n.src[1:]}
  operands = [(v, {n for n in v.toposort() if n.op is Ops.RANGE}) for v in _mul_operands(ast)]
  # the global ranges the operands without the column range move with: the column operand's panel is reused along
  # those it doesn't move with itself (rows); ranges both move with are batch axes (attention's batch and heads), and
  # ranges only it moves with are columns too (a column axis split in two: an attention projection's heads x head_dim)
  row_rngs = {r for _, rs in operands if col not in rs for r in rs} & set(others)
  for v, rs in operands:  # one PACK per operand that needs it (a sum of products has several)
    if not rs & red: continue
    if col in rs and row_rngs - rs:  # the column operand: transposed or an expression
      if not _plain_load_along(v, "global", col): first.append(Opt("PACK", col.arg[0], 2 * lanes)); expr |= v.op is not Ops.LOAD
    elif col not in rs and v.op is not Ops.LOAD and getenv("PACK_A", -1) != 0:  # a row operand that is an expression
      if (r := next((r for r in reversed(others) if r in rs and _const_end(r) is not None and _const_end(r) % 8 == 0), None)) is not None:
        first.append(Opt("PACK", r.arg[0], 8)); expr = True
  if not first: return None
  try: plan = split_packs(ast, first)
  except ValueError: return None
  packed = {o.rid for o in first}
  opts = [o for o in choose_opts(plan.ast, upcast_max, split, lanes, regs) if o.kind != "PACK" or o.rid not in packed]
  # a column-panel tile the kernel as it is lacks: the panel loop outermost (OUTER), or the lanes along the columns where
  # `chosen` has them along the reduce axis (horizontal sums; a column axis split in two has too few panels for OUTER)
  def panel(os_: list[Opt]) -> bool: return any(o.kind == "OUTER" for o in os_)
  def col_lanes(os_: list[Opt]) -> bool: return any(o.kind == "VECTOR" and o.rid == col.arg[0] for o in os_)
  if not expr and not ((panel(opts) and not panel(chosen)) or (col_lanes(opts) and not col_lanes(chosen))): return None
  rows = [o for o in opts if o.kind == "UPCAST" and o.rid != col.arg[0]]
  if not expr and (not rows or math.prod((_const_end(ranges_of(ast)[o.rid]) or 0) // o.amount for o in rows) < PACK_MIN_ROW_BLOCKS):
    return None
  # an expression (a dequantized weight) is packed once instead of evaluated once per row block: with few row blocks
  # (a batched decode step's 4 rows) the float32 scratch written and read back costs more than the evaluations it saves;
  # only the row axes reuse it: a column axis split in two (an attention projection's heads x head_dim) doesn't
  if expr and _row_blocks(ast, [r for r in others if r in row_rngs], rows) < PACK_MIN_EXPR_BLOCKS: return None
  return first + opts


def _row_blocks(ast: UOp, others: list[UOp], rows: list[Opt]) -> float:
  """How many row tiles (`rows`: the UPCASTs of the output's non-column axes) cover the axes `others` (a symbolic
  size counts as unbounded: a prefill of any length)."""
  rngs = ranges_of(ast)
  total = math.prod(_const_end(r) or math.inf for r in others)
  return total / math.prod(o.amount for o in rows if rngs[o.rid] in others)


def _gated_or_strided(v: UOp, glbl: list[UOp], lanes: int) -> bool:
  """Whether operand `v` can't be read as whole vectors along any global range: anything but an ungated load that walks
  memory with stride 1 along a global range of a size the lanes divide (which the matmul tile would vectorize), also
  through a CAST (16-bit matmul inputs)."""
  while v.op is Ops.CAST: v = v.src[0]
  if v.op is not Ops.LOAD or v.src[0].op is not Ops.INDEX or len(v.src[0].src) > 2: return True
  return not any(_stride_one(v.src[0].src[1], g) and (_const_end(g) or 0) % lanes == 0 for g in glbl)


def _ranges_in(u: UOp) -> set[UOp]: return {n for n in u.toposort() if n.op is Ops.RANGE}


def conv_opts(ast: UOp, lanes: int, regs: int) -> list[Opt] | None:
  """A direct convolution (or one of its gradients) as a register-blocked matmul with the channels in the vector lanes:
  out[.., c, .., spatial] = sum over (channels, taps) of f[c, reduce..] * g[spatial.., reduce..], where the channel
  operand f moves with one global range c (the output or input channels: the weights, or the output gradient in the
  weight gradient) that it doesn't read contiguously, and the other operand is a gated window (padding) or strided, so
  no axis of the output vectorizes as it is. f is packed panel-major along c (PACK, codegen/pack.py), its panels of
  `lanes` x u channels are read as u vectors per reduce step, and the innermost other output axes (the output row,
  then the ones above it: the spatial rows in a forward conv, the kernel taps in a weight gradient) are the tile's rows,
  each a broadcast of g. A whole small axis is upcast so its padding gates fold to constants. The reduce loops stay
  loops (unrolling the 3x3 taps or splitting the channel loop measured slower: a bigger body, more live registers).
  None when the kernel isn't shaped like that (PACK=0 or CONV_OPT=0 turns it off; CONV_OUTER=0 keeps a weight gradient's
  channel panels outermost, see below)."""
  if not getenv("PACK", 1) or not getenv("CONV_OPT", 1): return None
  topo = ast.toposort()
  reduces = [n for n in topo if n.op is Ops.REDUCE]
  if not reduces or any(n.dtype.scalar() != dtypes.float32 for n in reduces) or len(ast.src) != 1: return None
  glbl = sorted((n for n in topo if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda r: r.arg[0])
  red = {r for n in reduces for r in n.src[1:]}
  main = max(reduces, key=lambda n: math.prod(_const_end(r) or 1 for r in n.src[1:]))
  if any(r.src[0].op is not Ops.CONST for r in (*glbl, *red)) or len(glbl) < 2: return None
  ops = _mul_operands(UOp(Ops.SINK, dtypes.void, (main,)))
  if len(ops) != 2: return None
  cands: list[tuple[UOp, set[UOp], set[UOp]]] = []   # (channel range, ranges of f, ranges of g)
  for f, g in (ops, ops[::-1]):
    fr, gr = _ranges_in(f), _ranges_in(g)
    fg = [r for r in glbl if r in fr]
    if len(fg) != 1 or not fr & red or (c := fg[0]) in gr or c is glbl[-1] or (_const_end(c) or 0) % lanes: continue
    if _plain_load_along(f, "global", c) or not _gated_or_strided(g, glbl, lanes): continue
    if not set(glbl) - {c} <= gr | fr: continue
    cands.append((c, fr, gr))
  if len(cands) != 1: return None
  c, fr, gr = cands[0]
  u = 2 if (_const_end(c) // lanes) % 2 == 0 else 1
  opts = [Opt("PACK", c.arg[0], lanes * u), Opt("VECTOR", c.arg[0], lanes)]
  if u > 1: opts.append(Opt("UPCAST", c.arg[0], u))
  budget = max(1, (regs * 3 // 4) // u)  # output rows of the tile: u accumulators each
  for gr_ in reversed([r for r in glbl if r is not c]):
    n = _const_end(gr_)
    k = n if n <= budget else next((a for a in (8, 7, 6, 5, 4, 3, 2) if a <= budget and n % a == 0), 1)
    if k < 2: continue
    opts.append(Opt("UPCAST", gr_.arg[0], k))
    budget //= k
    if budget < 2: break
  # the channel range outermost (a weight gradient: dW[cout, cin, taps]) re-streams the whole window operand for
  # every channel panel, as scalar broadcasts the prefetchers follow badly; the first global range only the window
  # operand moves with goes outermost instead, so its windows stay in L2 across the panels, which stream in order
  if c is glbl[0] and getenv("CONV_OUTER", 1):
    upcast = {o.rid for o in opts if o.kind == "UPCAST"}
    gonly = [r for r in glbl if r is not c and r in gr and r not in fr and r.arg[0] not in upcast]
    if gonly and (_const_end(gonly[0]) or 0) >= OUTER_MIN_TRIPS: opts.append(Opt("OUTER", gonly[0].arg[0], 0))
  return opts


def optimize(ast: UOp, caps: Capabilities) -> UOp:
  """Apply the optimizations a target with capabilities `caps` asks for (see the module docstring). PACK is left out: it adds a kernel, which
  the engine runs (codegen/pack.py); the kernel is correct without it."""
  if getenv("NOOPT", False): return ast
  opts = [o for o in heuristic_opts(ast, caps) if o.kind != "PACK"]
  capture.annotate("opts", opts)  # VIZ=1: shown with the kernel
  for opt in opts: ast = apply_opt(ast, opt)
  return ast
