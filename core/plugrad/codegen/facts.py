"""Kernel facts: what the optimizations' rewrites (codegen/opt.py, codegen/gpuopt.py) and the heuristic that picks
them (codegen/heuristic.py) read off a kernel AST, each defined once here so that imports point one way (facts <- rewrites,
facts <- heuristic).

- ranges: `ranges_of`, `global_ranges` (the output ranges in loop order), `const_end` (a constant size or None),
  `range_size` (a symbolic size at its upper bound), `div_end`/`divides`/`outer_range` (splitting a size by k for
  every value of its variables);
- how an index moves along a range: `stride` (the symbolic step when the range moves by one; `contiguous` is a step
  of 1), `lane_pattern` (across a vector lane range, judged by evaluating at sample points with `eval_index`);
- loop lengths: `unrollable`, with the unroll limits UNROLL_MAX and UNROLL_BUDGET;
- tiles: `row_blocks` (how many row tiles UPCASTs make; a symbolic size counts as the caller's stated `unknown`);
- reduces and loads: `reduce_loads`, `global_loads`, `nested_reduces`, `in_loop`, `tc_match` (a matmul a tensor core
  fits), and integer dot products (`Dots`, `group_dot_range`, `group_lane`, `fits`).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from plugrad.codegen.expand import is_copy_range
from plugrad.codegen.optops import Opt, is_vector_range
from plugrad.codegen.tc import TensorCore
from plugrad.dtype import dtypes
from plugrad.runtime.renderer import Capabilities
from plugrad.uop.ops import GroupOp, Ops, UOp, exec_alu
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import pm_symbolic

def ranges_of(ast: UOp) -> dict[int, UOp]:
  """The kernel's ranges by id."""
  return {n.arg[0]: n for n in ast.toposort() if n.op is Ops.RANGE}


def global_ranges(ast: UOp, lanes: bool = True) -> list[UOp]:
  """The kernel's global (output) ranges in id order (outermost first), without vector lane ranges unless `lanes`, and
  never an UPCAST's copies (a range marked for the expand pass, codegen/expand.py: not a loop)."""
  rngs = (n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "global" and (lanes or not is_vector_range(n)) and not is_copy_range(n))
  return sorted(rngs, key=lambda r: r.arg[0])


def const_end(r: UOp) -> int | None:
  """The size of range `r` when it is a constant, None when it is symbolic (depends on a variable)."""
  return r.src[0].arg if r.src[0].op is Ops.CONST else None


def range_size(r: UOp) -> int:
  """The size of range `r`, a symbolic size at its upper bound (the most trips the loop can take)."""
  return r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0].vmax


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


def outer_range(rng: UOp, k: int) -> UOp:
  """The range `rng` of size N/k, keeping its id and kind (raises when k doesn't divide N)."""
  if (n := div_end(rng.src[0], k)) is None: raise ValueError(f"can't split range {rng.arg} of size {rng.src[0].render()} by {k}")
  return UOp(Ops.RANGE, rng.dtype, (n,), rng.arg)


def divides(r: UOp, a: int, whole: bool = False) -> bool:
  """Whether `a` splits range `r` (covering all of it only if `whole`)."""
  n = const_end(r)
  return (n % a == 0 and (n > a or whole)) if n is not None else div_end(r.src[0], a) is not None


UNROLL_MAX = 4  # a reduce loop this short is unrolled outright (a 3x3 window), by the CPU and the GPU heuristic
UNROLL_BUDGET = 16  # the most copies of a loop body that unrolling makes (several short loops together, a group's partials)


def unrollable(r: UOp, limit: int = UNROLL_MAX) -> bool:
  """Whether range `r` has a constant size of at most `limit` (UNROLL_MAX: a loop the heuristics unroll outright)."""
  return (n := const_end(r)) is not None and n <= limit


def stride(idx: UOp, rng: UOp) -> int | None:
  """How far index expression `idx` moves when range `rng` moves by one, for every value of the other ranges and
  variables: 0 when `idx` doesn't use `rng`, the constant step when the symbolic engine proves one, else None (a step
  that varies: a division, a modulo wrapping, a gather)."""
  if rng not in idx.toposort(): return 0
  d = graph_rewrite(idx.substitute({rng: rng + 1}, walk=True) - idx, pm_symbolic, name="stride")
  return d.arg if d.op is Ops.CONST else None


def contiguous(idx: UOp, rng: UOp) -> bool:
  """Whether consecutive values of `rng` read consecutive elements through `idx` (a stride of exactly 1)."""
  return stride(idx, rng) == 1


def row_blocks(rngs: dict[int, UOp], rows: list[Opt], unknown: float, axes: list[UOp] | None = None) -> float:
  """How many row tiles the UPCASTs `rows` cut the row axes into: the product over `axes` (default: the ranges `rows`
  upcast; `rngs` maps ids to ranges) of the axis size divided by the amounts upcast on it (an UPCAST's amount divides
  its axis, or it is refused; an UPCAST_OVERLAP's last block is counted). A symbolic axis size (a prefill of any
  length) makes the count `unknown`, which every caller states: 0 where the count must prove that a copy pays for
  itself (an unknown count can't), math.inf where a long axis is what makes it pay (an expression packed once instead
  of per row block)."""
  axes = list(dict.fromkeys(rngs[o.rid] for o in rows)) if axes is None else axes
  if any(const_end(a) is None for a in axes): return unknown
  return math.prod(-(-const_end(a) // math.prod(o.amount for o in rows if o.rid == a.arg[0])) for a in axes)


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


def reduce_loads(ast: UOp) -> list[UOp]:
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
  n = const_end(p := red.src[-1])
  if n == 2 and dots.pair and all(fits16(s) for s in body.src): return p
  return p if n == 4 and dots.quad and dot4_factors(body, dots.quad) is not None else None


def group_lane(lane: UOp, g: int) -> UOp:
  """The vector range of g*k lanes that runs over vector range `lane` (k) and a group range p of g together:
  lane = w // g, p = w % g."""
  return UOp(Ops.RANGE, lane.dtype, (UOp.const(dtypes.index, g * lane.src[0].arg),), (-1 - lane.arg[0], lane.arg[1], "vector"))


def global_loads(ast: UOp) -> list[UOp]: return [n.src[0] for n in ast.toposort() if n.op is Ops.LOAD and n.src[0].src[0].op is Ops.DEFINE_GLOBAL]


def nested_reduces(ast: UOp) -> set[UOp]:
  """REDUCEs that sit inside the value of another REDUCE."""
  out: set[UOp] = set()
  for n in ast.toposort():
    if n.op is Ops.REDUCE: out.update(x for x in n.src[0].toposort() if x.op is Ops.REDUCE)
  return out


def in_loop(ast: UOp) -> set[UOp]:
  """REDUCEs whose value uses a reduce range they don't close: they run inside another reduce's loop."""
  free: dict[UOp, frozenset[UOp]] = {}
  for n in ast.toposort():
    f = frozenset().union(*(free[s] for s in n.src)) if n.src else frozenset()
    if n.op is Ops.RANGE: f = f | {n}
    if n.op is Ops.REDUCE: f = f - set(n.src[1:])
    free[n] = f
  return {n for n in free if n.op is Ops.REDUCE and any(r.arg[1] == "reduce" for r in free[n])}


def strip_cast(x: UOp) -> UOp: return x.src[0] if x.op is Ops.CAST else x


def tc_match(ast: UOp, tc: TensorCore) -> tuple[UOp, UOp, UOp, UOp, UOp, UOp] | None:
  """(reduce, A operand, B operand, i, j, k) when `ast` has a top-level ADD reduce of a product A*B in `tc`'s dtypes where
  A uses output range i (not j), B uses j (not i), both the reduce range k, and the tile divides every size."""
  n, m, kk = tc.dims
  nested = nested_reduces(ast)
  for red in (x for x in ast.toposort() if x.op is Ops.REDUCE and x not in nested):
    if red.arg is not Ops.ADD or red.dtype != tc.dtype_out or len(red.src) != 2: continue
    mul = strip_cast(red.src[0])
    if mul.op is not Ops.MUL: continue
    a, b = (x if x.dtype == tc.dtype_in else strip_cast(x) for x in mul.src)
    if a.dtype != tc.dtype_in or b.dtype != tc.dtype_in: continue
    k = red.src[1]
    ra = {x for x in a.toposort() if x.op is Ops.RANGE}
    rb = {x for x in b.toposort() if x.op is Ops.RANGE}
    for a_, b_, ra_, rb_ in ((a, b, ra, rb), (b, a, rb, ra)):
      i = [r for r in ra_ - rb_ if r.arg[1] == "global"]
      j = [r for r in rb_ - ra_ if r.arg[1] == "global"]
      if len(i) == 1 and len(j) == 1 and k in ra_ and k in rb_ and \
         all(r.src[0].op is Ops.CONST and r.src[0].arg % d == 0 for r, d in ((i[0], m), (j[0], n), (k, kk))):
        return red, a_, b_, i[0], j[0], k
  return None
