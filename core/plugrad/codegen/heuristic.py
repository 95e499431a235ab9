"""The optimization heuristic: which registered optimizations (codegen/optops.py) a kernel gets on a target, for every
device, read only from the renderer's declared capability record (`Renderer.caps`, plugrad.runtime.renderer.Capabilities).

`optimize` applies them (the "optimize" pass of codegen, NOOPT=1: none); `heuristic_opts` is the choice for a target
without GPU launch dimensions, `choose_gpu_opts` for one with them (BEAM, codegen/search.py, starts from either). What
the choice reads off the kernel (ranges, strides, loops, row tiles) comes from codegen/facts.py; the rewrites that apply
the chosen kinds live in codegen/opt.py (UPCAST, SPLIT, UNROLL, VECTOR, OUTER, BLOCK), codegen/gpuopt.py (LOCAL, GROUP,
GROUPTOP, GROUPOUT, TC) and codegen/pack.py (PACK), registered in codegen/optops.py. This module imports neither opt.py
nor gpuopt.py (it tries a kind through `apply_opt`); of pack.py it uses the planning (`pack_candidate`, `split_packs`)
to look at a kernel as it would be packed.

CPU (`heuristic_opts`): from `upcast_max` (accumulators/outputs per loop iteration; 0 disables everything),
`vectorizes_reductions` (the compiler vectorizes a plain reduce loop, so streaming ADD/MUL reductions aren't split),
`vector_lanes`/`vector_regs` (explicit SIMD: the lanes of one float vector and the vector registers), `dot2`/`dot4`
(integer dot products) and `cache_bytes` (L3: row blocking of big matmuls).
GPU (`choose_gpu_opts`): from `tensor_cores`, `has_shared`, `shared_max`, `local_max_threads`, `local_max` and
`warp_size`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

from plugrad.codegen.expand import expand
from plugrad.codegen.facts import (NO_DOTS, UNROLL_BUDGET, Dots, const_end, contiguous, divides, global_loads, global_ranges, group_dot_range,
                                   group_lane, in_loop, lane_pattern, outer_range, range_size, ranges_of, reduce_loads, row_blocks, tc_match,
                                   unrollable)
from plugrad.codegen.gpudims import uses_gpudims
from plugrad.codegen.optops import UPCASTS, Opt, apply_opt, is_vector_range
from plugrad.codegen.pack import _mul_operands, affine_step, chunk_reduce, pack_candidate, split_packs
from plugrad.codegen.tc import TensorCore
from plugrad.dtype import dtypes
from plugrad.helpers import getenv
from plugrad.runtime.renderer import Capabilities
from plugrad.uop.ops import Ops, UOp
from plugrad.viz import capture


# ---- targets without GPU launch dimensions (CPU-like: loops, SIMD vectors, caches) ----

OUTER_MIN_TRIPS = 8  # an outermost loop with fewer trips splits badly across cores (3 trips on 2 cores: 2 + 1)
PACK_MIN_ROW_BLOCKS = 4  # a packed panel must be reused by at least this many row blocks to pay for its copy
PACK_MIN_REDUCE = 16  # and be at least this long along the reduce axis
PACK_MIN_EXPR_BLOCKS = 8  # an expression operand (a dequantized weight) is packed when this many row blocks reuse it
LONG_FMA_CHAIN = 16384  # a streaming sum of products this long is vectorized by the heuristic, not left to the compiler
TILE_OVERLAP_WASTE = 16  # a tile's rows may overlap the block before when at most this part of the rows is computed twice
PACK_CHUNK_L3_PART = 8  # a packed column operand over L3/2 is packed and used in chunks of at most this part of L3 (as ROW_CHUNK_L3_PART)
ALIASED_ROW_BYTES = 4096  # a row operand whose rows are a multiple of this apart (a page: same cache sets) is packed too
PACK_CHUNK_MIN_REDUCE = 64  # and of at least this many reduce steps (each chunk is two launches)
ROW_BLOCK_L3_PART = 4  # a column-panel matmul whose row operand is over L3 / this is row-blocked (row_block_opt): the L3 holds A
#                        alongside the B panels and output columns streaming through it (and other cores' data): 2048^2, A half of a 32 MB L3,
#                        ran 96-115 ms unblocked against 78-83 blocked (AVX2 code: 163-169 against 83-87) on a Zen 4 VM
ROW_CHUNK_L3_PART = 8  # a row chunk of a blocked matmul holds this part of L3 (the other cores' chunks and the panels share it)


def _pick(r: UOp | None, amounts: tuple[int, ...], budget: int, whole: bool = False) -> int:
  """The first of `amounts` within `budget` that splits `r` (or covers it exactly, if `whole`); 0 if none does."""
  return next((a for a in amounts if r is not None and a <= budget and divides(r, a, whole)), 0)


def _vector_score(ast: UOp, dots: Dots = NO_DOTS) -> int:
  """Contiguous reduce-loop loads count +1, gathers -2 (lane by lane loads and inserts), broadcasts 0. With `dots`, a
  load of a group dot's factor (`group_dot_range`) counts as contiguous when the lanes and the group together read
  contiguous memory."""
  score, topo = 0, ast.toposort()
  groups = {p for n in topo if (p := group_dot_range(n, dots)) is not None} if dots else set()
  for lane in (r for r in ranges_of(ast).values() if is_vector_range(r)):
    for ix in reduce_loads(ast):
      kind = "gather" if len(ix.src) > 2 and lane_pattern(ix.src[2], lane) != "broadcast" else lane_pattern(ix.src[1], lane)
      if kind == "gather" and len(ix.src) == 2 and (p := next((p for p in groups if p in ix.toposort()), None)) is not None:
        w = group_lane(lane, g := const_end(p))
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
  glbl = global_ranges(ast)
  best: tuple[int, int, int, list[UOp], UOp] | None = None
  inner = sorted({n.src[-1] for n in reduces}, key=lambda r: r.arg[0])  # the innermost range of each reduce
  # a short inner reduce nested in a longer one is unrolled (choose_opts): the lanes go along the enclosing reduce's
  # innermost range (a blockwise-quantized matvec: sum over (block, lane) of scale * sum over 4 chunks of x * q)
  # (a group dot's range of 2 or 4 is not an innermost range: its group of lanes sits inside the vector lanes)
  groups = {p for n in reduces if (p := group_dot_range(n, dots)) is not None} if dots else set()
  if groups: inner = [r for r in inner if r not in groups] or inner
  inner = [r for r in inner if not unrollable(r)] or inner
  widths = (lanes, lanes // 2, lanes // 4) if dots.quad and groups else (lanes, lanes // 2)   # DOT4: 4 bytes a lane
  cands = [(pref, cs, n) for n in widths if n >= 4 for pref, cs in enumerate([inner, *([g] for g in glbl)])
           if all(divides(c, n, whole=True) for c in cs)]  # ties go to wider vectors, then to global axes (vector stores, no horizontal sum)
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
    if c.arg[1] == "reduce" and divides(outer_range(c, lanes), 2): opts.append(Opt("SPLIT", c.arg[0], 2))  # two accumulator chains
  vr = ranges_of(ast)[opts[0].rid]
  loads = reduce_loads(a)
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
    cols = panel_vectors(outer_range(vr, lanes)) if reuse else 1
    vtrips = range_size(vr) // lanes
    # a short vector axis read by a few rows (attention's values: 3 query heads over a head of 64 float16 dims): the
    # panel takes the whole axis where its vectors fit the accumulators, the rows what is left, so each row of the
    # streamed operand is read in one pass over the reduce loop (4 slots x 3 KV heads x 3 x 64 over 400 keys: AVX-512's
    # 4 vectors beside the 3 rows 39.6 -> 30.6 us; AVX2's 8 vectors, one row a pass, 42.8 us against 50.7 for 2 vectors
    # beside the 3 rows and 46.5 for 4)
    if reuse and const_end(vr) is not None and vtrips <= 8 and (rows := math.prod(const_end(g) or budget + 1 for g in reuse)) <= 4:
      cols = vtrips if vtrips <= budget else max(c for c in range(1, vtrips + 1) if vtrips % c == 0 and c * rows <= budget)
    budget //= cols
    # a small axis may be upcast whole (attention's 3 or 7 query heads of a KV head: the keys are read once for all);
    # not when short reduce loops will be unrolled too (a convolution's weight gradient: 3x3 window axes upcast whole
    # times a 4x4 unrolled window made 288 copies of a fused expression, 54k uops that clang compiled for 20+ minutes)
    rngs = ranges_of(ast)
    may_whole = not any(unrollable(r) for r in rngs.values() if r.arg[1] == "reduce")
    for g in reuse:
      if (o := _tile_rows(a, g, budget, may_whole)) is not None: opts.append(o); budget //= o.amount
    if cols > 1: opts.append(Opt("UPCAST", vr.arg[0], cols))
    # the column panel loop outermost: the panel of the contiguous operand stays in cache while the rows stream by;
    # also when the loop that would be outermost is too short to split across cores (3 KV heads on 2 cores) and the
    # columns are many (a symbolic number of key positions)
    whole = {o.rid for o in opts if o.kind == "UPCAST" and o.amount == const_end(rngs[o.rid])}
    first = next((g for g in glbl if g.arg[0] not in whole), None)
    if reuse and first is not None and vr is not first and vtrips >= 16 and \
       (const_end(vr) is not None or ((fe := const_end(first)) is not None and fe < OUTER_MIN_TRIPS)): opts.append(Opt("OUTER", vr.arg[0], 0))
    if (pk := _pack_opt(ast, vr, opts, lanes)) is not None: opts[:0] = pk
  elif (tile := _dot_tile(loads, glbl, regs)) is not None:   # x @ y.T, both read along the lanes and both reused
    opts = [o for o in opts if o.kind != "SPLIT"] + tile
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
    # an axis of exactly 3 is upcast whole too (attention scores of 3 query heads a KV head: each key row loaded and
    # converted once for the three; 4 slots x 3 KV heads x 3 over 400 float16 keys, AVX2 code: 47.9 -> 36.7 us)
    for g in sorted(reuse, key=lambda g: (-sum(g not in ix.toposort() for ix in loads), const_end(g) or 1 << 30)):
      if _shares_only_the_smaller(g, loads): continue
      if (k := _pick(g, (4, 3, 2) if const_end(g) == 3 else (4, 2), min(4, budget), whole=True)):
        opts.append(Opt("UPCAST", g.arg[0], k))
        budget //= k
    if all(o.kind != "UPCAST" for o in opts) and not _streams_against_shared(loads, glbl):  # streaming: four accumulator chains
      # (not a matvec's rows: two chains keep its weight stream's steps prefetchable, <= 128 bytes a trip)
      opts = [Opt("SPLIT", o.rid, 4) if o.kind == "SPLIT" and o.rid == vr.arg[0] and divides(outer_range(ranges_of(ast)[o.rid], lanes), 4) else o
              for o in opts]   # (the vector range's own SPLIT; a shared SPLIT of sub-block pairs stays 2)
  return opts


def panel_vectors(vr: UOp, whole: bool = False) -> int:
  """The vectors a row of a matmul tile holds along the column axis whose vectors range `vr` counts: 2, or 3 where 2
  doesn't divide their count and 3 does (a 4 x 3 tile, 12 accumulators as 6 x 2: attention scores over 456 keys, 57
  vectors, took 2.42-2.77 ms packed in panels of 3 vectors against 2.96-3.06 for the 4 x 2 dot tile), else 1. `whole`:
  a panel may hold every vector of the axis."""
  return 2 if divides(vr, 2, whole) else 3 if divides(vr, 3, whole) else 1


DOT_TILE_MIN_REUSE = 16   # `_dot_tile`: both operands reused by at least this many outputs


def _dot_tile(loads: list[UOp], glbl: list[UOp], regs: int) -> list[Opt] | None:
  """The register tile of x @ y.T whose two operands are both read along the reduce lanes and each reused by at least
  DOT_TILE_MIN_REUSE outputs (attention's scores: a query row by every key, a key by every query of its heads): an
  axis only one operand moves with times an axis only the other moves with, 4 x 4 on 32 registers and 4 x 2 on 16,
  so each of a reduce step's a + b vector loads feeds b or a of the a*b accumulators (8 or more chains: no SPLIT). The
  longest such axis of each side (the most reuse). Measured on attention scores of 4 heads x 456 x 456 over 256:
  3.80 -> 2.06 ms with AVX-512 code, 4.08 -> 2.38 with AVX2's, against SPLIT 2 x 4 keys. None for anything else: a
  matvec's weights are read once per output (a batched decode step's 4 rows reuse them 4 times), and keep the matvec
  rules."""
  if len(loads) != 2: return None
  sides = [[g for g in glbl if g in ix.toposort() and g not in other.toposort()] for ix, other in (loads, loads[::-1])]
  reuse = [math.prod(int(range_size(g)) for g in glbl if g not in ix.toposort()) for ix in loads]
  if not all(sides) or min(reuse) < DOT_TILE_MIN_REUSE: return None
  picks = [max(side, key=lambda g: int(range_size(g))) for side in sides]
  for amounts in ((4, 4), (4, 2), (2, 4), (2, 2)):
    if math.prod(amounts) <= regs // 2 and all(divides(g, k) for g, k in zip(picks, amounts)):
      return [Opt("UPCAST", g.arg[0], k) for g, k in zip(picks, amounts)]
  return None


def _tile_rows_within(budget: int) -> int:
  """The rows a matmul tile takes within `budget` rows of accumulators: 8 or 6 (fewer leave the FMA chains of a k step
  too few to hide the FMA latency), 0 when the budget holds neither."""
  return next((x for x in (8, 6) if x <= budget), 0)


def tile_height(regs: int) -> int:
  """The rows of a matmul tile of 2 vectors a row on `regs` vector registers (3/4 of them accumulators): 8 on 32, 6 on
  16, 4 below."""
  return _tile_rows_within(regs * 3 // 4 // 2) or 4


def _tiles_well(n: int | None, k: int) -> bool:
  """Whether tiles of k rows cover n rows with at most 1/TILE_OVERLAP_WASTE of them computed twice (k divides n, or
  the overlapping last tile wastes little)."""
  return n is not None and n >= k and (n % k == 0 or (k - n % k) * TILE_OVERLAP_WASTE <= n)


def _trips(red: UOp) -> int:
  """The iterations of a REDUCE (its ranges' sizes multiplied, symbolic ones at their bound)."""
  return math.prod(int(range_size(r)) for r in red.src[1:])


def _tile_rows(a: UOp, g: UOp, budget: int, may_whole: bool) -> Opt | None:
  """The UPCAST of row axis `g` in a matmul tile of at most `budget` rows: the most rows the budget holds (8 or 6: with
  fewer, the FMA chains of a k step are too few to hide the FMA latency; 4x2 tiles of 8-lane vectors measured 99 against
  107 GFLOPS for 6x2 on one core). When that amount doesn't divide the axis, UPCAST_OVERLAP takes it anyway (the last
  block overlaps the one before) if the rows computed twice are at most 1/TILE_OVERLAP_WASTE of the axis; else the
  largest amount that divides, or a whole small axis. (A packed row operand's last panel is padded: codegen/pack.py.)"""
  want = _tile_rows_within(budget)
  k = _pick(g, (8, 6, 4, 3, 2), budget, whole=may_whole) or (n if may_whole and (n := const_end(g)) in (5, 7) and n <= budget else 0)
  if want > k and (n := const_end(g)) is not None and n > want and _tiles_well(n, want):
    try: apply_opt(a, o := Opt("UPCAST_OVERLAP", g.arg[0], want))
    except ValueError: pass
    else: return o
  return Opt("UPCAST", g.arg[0], k) if k else None


def _streams_against_shared(loads: list[UOp], glbl: list[UOp]) -> bool:
  """A matvec-like reduce: one of its loop's `loads` moves with an output range and another doesn't (rows against x)."""
  return any(any(g in ix.toposort() for ix in loads) and any(g not in ix.toposort() for ix in loads) for g in glbl)


def _span(ix: UOp) -> int:
  """The elements an INDEX can reach: the product of its ranges' trip counts (symbolic ones at their bound)."""
  return math.prod(int(range_size(r)) for r in ix.toposort() if r.op is Ops.RANGE)


def _shares_only_the_smaller(g: UOp, loads: list[UOp]) -> bool:
  """Whether upcasting range `g` shares only loads that reach fewer elements than the ones that move with it."""
  shared, moving = [_span(ix) for ix in loads if g not in ix.toposort()], [_span(ix) for ix in loads if g in ix.toposort()]
  return bool(shared and moving) and max(shared) < max(moving)


def _shared_split(ast: UOp, a: UOp, cs: list[UOp], lanes: int) -> UOp | None:
  """A reduce range to SPLIT by 2 when the lanes span a whole reduce range (its outer loop has one trip, so it gets
  no SPLIT of its own) and both copies read every weight (each vector load that moves with an output axis) from
  the same place: two sub-blocks whose codes are the low and high fields of the same bytes are then unpacked from one
  load, with constant shifts (measured on such a 4-bit matvec with AVX2 code: 200 -> 150 us)."""
  if any(c.arg[1] != "reduce" or const_end(outer_range(c, lanes)) != 1 for c in cs): return None
  glbl = [r for r in ranges_of(a).values() if r.arg[1] == "global"]
  if not glbl: return None
  out = max(glbl, key=lambda r: const_end(r) or 1 << 30)   # the weight's rows (not a batched step's few rows of x)
  def weights(x: UOp) -> int:
    return len({ix for ix in reduce_loads(x) if out in ix.toposort() and any(is_vector_range(n) for n in ix.toposort() if n.op is Ops.RANGE)})
  if (n := weights(a)) == 0: return None
  for r in sorted((r for r in ranges_of(a).values() if r.arg[1] == "reduce" and not is_vector_range(r)), key=lambda r: -r.arg[0]):
    if unrollable(r) or not divides(r, 2): continue
    try: b = expand(apply_opt(a, Opt("SPLIT", r.arg[0], 2)))
    except ValueError: continue
    if weights(b) == n: return ranges_of(ast).get(r.arg[0])
  return None


def _pack_opt(ast: UOp, vr: UOp, opts: list[Opt], lanes: int) -> list[Opt] | None:
  """PACK (codegen/pack.py) of the column panel of a register-blocked matmul: when the panel loop is outermost and the
  panel is reused by enough row blocks (PACK=0 turns it off)."""
  if not getenv("PACK", 1) or not any(o.kind == "OUTER" for o in opts): return None
  P = lanes * math.prod(o.amount for o in opts if o.kind == "UPCAST" and o.rid == vr.arg[0])
  rows = [o for o in opts if o.kind in UPCASTS and o.rid != vr.arg[0]]
  rngs = ranges_of(ast)
  blocks = row_blocks(rngs, rows, unknown=0)
  if not rows or blocks < PACK_MIN_ROW_BLOCKS: return None
  red = math.prod(const_end(r) or 0 for r in {r for n in ast.toposort() if n.op is Ops.REDUCE for r in n.src[1:]})
  if red < PACK_MIN_REDUCE: return None  # a short panel (e.g. K = 10) stays in L1 as it is: the copy can't pay
  if pack_candidate(ast, vr, P, [rngs[o.rid] for o in rows]) is None: return None
  out = [Opt("PACK", vr.arg[0], P)]
  # the row operand too (the R broadcasts of a k step become R consecutive floats) when it is read across rows (A.T:
  # each k step a new line, a row apart) or its rows are a multiple of ALIASED_ROW_BYTES apart, or PACK_A=1; PACK_A=0 never
  if len(rows) == 1 and (val := pack_candidate(ast, r := rngs[rows[0].rid], rows[0].amount, [vr], pad=True)) is not None and \
     getenv("PACK_A", -1) != 0 and (getenv("PACK_A", -1) == 1 or not _plain_load_along(val, "reduce") or _aliased_rows(val, r)):
    out.append(Opt("PACK", r.arg[0], rows[0].amount))
  return out


def _aliased_rows(val: UOp, r: UOp) -> bool:
  """Whether the rows of a row operand (a load moving with row range `r`) start a multiple of ALIASED_ROW_BYTES apart:
  the tile's rows then fall into the same few cache sets (of L1 and L2 alike) and the prefetchers see that many
  streams a page apart. Measured on Zen 3 (AVX2, 6-row tile; pack and product kernels alternating in one process):
  1024^2 1.04-1.11x, 2048^2 1.09-1.16x as fast."""
  if val.op is not Ops.LOAD or val.src[0].op is not Ops.INDEX or (step := affine_step(val.src[0].src[1], r)) is None: return False
  return step * val.dtype.itemsize % ALIASED_ROW_BYTES == 0


def _plain_load_along(val: UOp, kind: str, rng: UOp | None = None) -> bool:
  """Whether an operand is a single load that walks memory with stride 1 along `rng` (or along some range of `kind`):
  anything else (an expression recomputed per column block, a transposed read) is worth packing."""
  if val.op is not Ops.LOAD or val.src[0].op is not Ops.INDEX: return False
  rs = [rng] if rng is not None else [n for n in val.toposort() if n.op is Ops.RANGE and n.arg[1] == kind]
  return any(contiguous(val.src[0].src[1], r) for r in rs)


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
    if not 2 <= c <= 4 or (end := const_end(r)) is None or end % c or end == c or any(o.rid == r.arg[0] for o in opts): continue
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
  glbl = global_ranges(ast)
  reduces = [n for n in topo if n.op is Ops.REDUCE]
  if not reduces and upcast_max >= 2: return phase_opts(ast, min(upcast_max, 16))
  if not reduces or upcast_max < 2: return []
  red_rngs = sorted({r for n in reduces for r in n.src[1:]}, key=lambda r: r.arg[0])
  opts: list[Opt] = (vector_opts(ast, lanes, regs, dots) or []) if lanes >= 2 else []
  if not split_reduce and all(o.kind in ("VECTOR", "SPLIT") and ranges_of(ast)[o.rid].arg[1] == "reduce" for o in opts) and \
     not (dots and any(group_dot_range(n, dots) is not None for n in reduces)) and not _streams_against_shared(reduce_loads(ast), glbl) \
     and not any(n.arg is Ops.ADD and n.src[0].op is Ops.MUL and _trips(n) >= LONG_FMA_CHAIN for n in reduces) \
     and not any(n.arg is Ops.MAX for n in reduces):
    opts = []  # a streaming reduce (nothing to register-block): the compiler's loop vectorizer does the same, and better
    #          (not a group dot's: the compiler has no DOT2/DOT4; nor a matvec's: its scalar upcasts ran 4x slower; nor a
    #          sum of products: the renderer contracts it into an fma chain, which the vectorizer may not reorder: a
    #          BatchNorm's per-channel sum of x*x over 64x64x32x32 took 4.68 ms on one core against 0.29 for a sum of x;
    #          only long ones: a norm's 576-4096 products were left as they are, unmeasured; nor a max: clang leaves
    #          the NaN-propagating max loop scalar, 16 scalar accumulators, 2.2x the time of lanes at 256x4096)
  if not opts: opts = _scalar_opts(ast, upcast_max, split_reduce, glbl, reduces, red_rngs)
  unroll = 1
  groups = {p for n in reduces if (p := group_dot_range(n, dots)) is not None} if dots and any(o.kind == "VECTOR" for o in opts) else set()
  # small reduce loops (e.g. a 3x3 window) are unrolled, then within what is left of the budget those that pick a bit field
  shifts = _shift_ranges(topo)
  for r in [r for r in red_rngs if unrollable(r)] + [r for r in red_rngs if r in shifts and unrollable(r, UNROLL_BUDGET) and not unrollable(r)]:
    if r not in groups and unroll * (n := const_end(r)) <= UNROLL_BUDGET and all(o.rid != r.arg[0] for o in opts):
      opts.append(Opt("UNROLL", r.arg[0], n))
      unroll *= n
  return opts


def _shift_ranges(topo: list[UOp]) -> set[UOp]:
  """The ranges a shift's amount depends on: a loop over the bit fields of packed codes (4-bit codes two a byte, a
  5-bit code's fifth bit one of eight in a byte). Unrolled, every copy shifts by an immediate and the compiler merges
  a copy's shift and mask into fewer ops; rolled, the amount is computed and splatted each trip (Q5 decode products
  with their output rows in the lanes on a Zen 3 AVX2 box, one process alternating: 0.79-0.92x the time unrolled)."""
  return {r for n in topo if n.op in (Ops.SHL, Ops.SHR) for r in _ranges_in(n.src[1])}


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
    if any(contiguous(ld, inner) for ld in loads) or not glbl:
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
  # a row operand that L3 row blocking streams stays unpacked (4096^2 took 1.47x the time with A packed as well)
  if (blk := row_block_opt(ast, opts, caps.cache_bytes[2])) is not None: opts = _unpack_aliased_rows(ast, opts) + [blk]
  return pack_chunks(ast, opts, caps.cache_bytes[2])


def pack_chunks(ast: UOp, opts: list[Opt], l3: int) -> list[Opt]:
  """`opts` with the column operand's PACK done in chunks of the reduce axis (`Opt.arg = (chunks,)`, codegen/pack.py
  `chunk_reduce`) when its packed copy is over half of L3: written whole, it goes to DRAM and the matmul reads it back
  from there (a 16 x 4096 x 4096 product spent 6.1 ms packing and 5.5 ms computing). In chunks of at most
  L3/PACK_CHUNK_L3_PART bytes, each chunk is packed and then summed while it is in cache, and the operand crosses DRAM
  once. Not when the output's extra round trips (each later chunk reads the sum so far and writes the new one) move
  more bytes than the packed copy's round trip saves (a big square product). PACK_CHUNKS=n forces n chunks,
  PACK_CHUNKS=0 none."""
  if (col := _column_pack(opts)) is None or (force := getenv("PACK_CHUNKS", -1)) == 0: return opts
  try: plan = split_packs(ast, [col])
  except ValueError: return opts
  nbytes, chunks = plan.packs[0].size * plan.packs[0].dtype.itemsize, 1
  if force > 0: chunks = force
  elif l3 and nbytes * 2 > l3:
    red = const_end(next(x for x in ast.toposort() if x.op is Ops.REDUCE).src[1]) or 0
    if chunk_reduce(ast, 2) is None: return opts   # (it fits for any count dividing the range: checked once more below)
    while nbytes * PACK_CHUNK_L3_PART > l3 * chunks and red // (chunks * 2) >= PACK_CHUNK_MIN_REDUCE and red % (chunks * 2) == 0: chunks *= 2
    out = next(x for x in ast.toposort() if x.op is Ops.DEFINE_GLOBAL and x.arg == 0)
    if nbytes <= (chunks - 1) * out.dtype.size * out.dtype.base.itemsize: chunks = 1  # the output's round trips would cost more
  if chunks < 2 or chunk_reduce(ast, chunks) is None: return opts
  # a row operand packed only for its aliased rows is left as it is: packed chunk by chunk it costs a launch a chunk
  # (16x4096x4096: 0.85x the time with it), and a chunk's rows are in L2 anyway
  return [replace(o, arg=(chunks,)) if o is col else o for o in _unpack_aliased_rows(ast, opts)]


def _column_pack(opts: list[Opt]) -> Opt | None:
  """The PACK of a column-panel tile's panels: the one along the range OUTER makes outermost."""
  return next((o for o in opts if o.kind == "PACK" and any(u.kind == "OUTER" and u.rid == o.rid for u in opts)), None)


def _unpack_aliased_rows(ast: UOp, opts: list[Opt]) -> list[Opt]:
  """`opts` without the PACK of a row operand that `_pack_opt` packed only for its aliased rows (`_aliased_rows`: a
  plain load along the reduce axis), where the kernel is blocked otherwise."""
  rngs, col = ranges_of(ast), _column_pack(opts)
  def aliased_only(o: Opt) -> bool:
    val = pack_candidate(ast, rngs[o.rid], o.amount, [rngs[col.rid]], pad=True) if col is not None else None
    return val is not None and _plain_load_along(val, "reduce")
  return [o for o in opts if o is col or o.kind != "PACK" or not aliased_only(o)]


def row_block_opt(ast: UOp, opts: list[Opt], l3: int) -> Opt | None:
  """Cache blocking of a big column-panel matmul (OUTER: each packed panel of B, K x P, sits in L2 while all rows
  of A stream past it). When A (M x K) is over L3/ROW_BLOCK_L3_PART, every panel re-reads it from DRAM; BLOCK the row axis into
  chunks of at most L3/ROW_CHUNK_L3_PART bytes of A, outermost, so the panels meet a chunk that is in L3 and each
  panel is re-read once per chunk instead (4096^2 on one core: 135 -> 170 GFLOPS). `l3`: the L3 bytes (0: unknown,
  nothing); ROW_BLOCK=0 turns it off. The BLOCK's rid is the row range's id after the OUTER relabelling."""
  if not l3 or not getenv("ROW_BLOCK", 1) or (outer := next((o for o in opts if o.kind == "OUTER"), None)) is None: return None
  rngs = ranges_of(ast)
  glbl = global_ranges(ast, lanes=False)
  rows = [o for o in opts if o.kind in UPCASTS and o.rid != outer.rid]
  red = [r for r in rngs.values() if r.arg[1] == "reduce"]
  if len(glbl) != 2 or len(rows) != 1 or len(red) != 1 or any(const_end(r) is None for r in (*glbl, *red)): return None
  row = rngs[rows[0].rid]
  item = max((n.dtype.itemsize for n in ast.toposort() if n.op is Ops.LOAD), default=4)
  a_bytes, row_bytes = const_end(row) * const_end(red[0]) * item, rows[0].amount * const_end(red[0]) * item
  if a_bytes * ROW_BLOCK_L3_PART <= l3: return None
  blocks, chunk = int(row_blocks(rngs, rows, unknown=0)), 1
  cmax = min(blocks - 1, l3 // (row_bytes * ROW_CHUNK_L3_PART))   # the most row blocks a chunk may hold
  while blocks % (chunk * 2) == 0 and chunk * 2 <= cmax: chunk *= 2
  if chunk * 2 <= cmax:   # no power of two that divides reaches the cache limit (683 blocks of 6 rows): the chunk size
    # from cmax/2..cmax that leaves the fewest blocks computed twice by an overlapping last chunk
    c = min(range(max(2, cmax // 2), cmax + 1), key=lambda c: (-blocks % c, -c))
    if -blocks % c * TILE_OVERLAP_WASTE <= blocks: chunk = c
  # the cores split the chunk loop: a few exact chunks come in a count that 4 divides (1, 2 and 4 cores even: 1536^2's 3
  # chunks on 2 cores took 45 ms against 34 unblocked, 12 chunks 35; an overlapping last chunk's size stays as chosen)
  while blocks % chunk == 0 and blocks // chunk < 16 and (blocks // chunk) % 4 and chunk % 2 == 0 and chunk >= 4: chunk //= 2
  return Opt("BLOCK", glbl[1].arg[0] if row is glbl[0] else row.arg[0], chunk) if chunk >= 2 else None


def _operand_pack_opts(ast: UOp, upcast_max: int, split: bool, lanes: int, regs: int, chosen: list[Opt]) -> list[Opt] | None:
  """PACK for matmuls whose operands `choose_opts` can't tile well as they are: the column operand not contiguous
  along the output's columns (x @ W.T reads W along the reduce axis: reduce-axis lanes and horizontal sums), or an
  operand that is an expression (a fused activation, normalization or gradient's elementwise part, which the kernel
  would evaluate again for every output column block). Those are packed first (codegen/pack.py), then the heuristic
  runs on the packed kernel. Used when an expression is packed, or when the packed kernel gets the column-panel tile
  (OUTER) that `chosen` (the heuristic on the kernel as it is) lacks."""
  if not getenv("PACK", 1) or not any(n.op is Ops.REDUCE for n in ast.toposort()): return None
  glbl = global_ranges(ast)
  if len(glbl) < 2 or (nsz := const_end(glbl[-1])) is None or nsz % lanes or (u := panel_vectors(outer_range(glbl[-1], lanes), whole=True)) == 1:
    return None
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
      if not _plain_load_along(v, "global", col): first.append(Opt("PACK", col.arg[0], u * lanes)); expr |= v.op is not Ops.LOAD
    elif col not in rs and v.op is not Ops.LOAD and getenv("PACK_A", -1) != 0:  # a row operand that is an expression
      P = tile_height(regs)   # the panels hold the tile's rows (the last one padded where P doesn't divide the axis)
      if (r := next((r for r in reversed(others) if r in rs and _tiles_well(const_end(r), P)), None)) is not None:
        first.append(Opt("PACK", r.arg[0], P)); expr = True
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
  rows = [o for o in opts if o.kind in UPCASTS and o.rid != col.arg[0]]
  if not expr and (not rows or row_blocks(ranges_of(ast), rows, unknown=0) < PACK_MIN_ROW_BLOCKS):
    return None
  # an expression (a dequantized weight) is packed once instead of evaluated once per row block: with few row blocks
  # (a batched decode step's 4 rows) the float32 scratch written and read back costs more than the evaluations it saves;
  # only the row axes reuse it: a column axis split in two (an attention projection's heads x head_dim) doesn't
  if expr and row_blocks(ranges_of(ast), rows, unknown=math.inf, axes=[r for r in others if r in row_rngs]) < PACK_MIN_EXPR_BLOCKS: return None
  return first + opts


def _gated_or_strided(v: UOp, glbl: list[UOp], lanes: int) -> bool:
  """Whether operand `v` can't be read as whole vectors along any global range: anything but an ungated load that walks
  memory with stride 1 along a global range of a size the lanes divide (which the matmul tile would vectorize), also
  through a CAST (16-bit matmul inputs)."""
  while v.op is Ops.CAST: v = v.src[0]
  if v.op is not Ops.LOAD or v.src[0].op is not Ops.INDEX or len(v.src[0].src) > 2: return True
  return not any(contiguous(v.src[0].src[1], g) and (const_end(g) or 0) % lanes == 0 for g in glbl)


def _sliding_window(v: UOp, glbl: list[UOp], red: set[UOp]) -> bool:
  """Whether operand `v` is a load whose index moves with stride 1 along an output range and along a reduce range too
  (a convolution's input window, x + kx, padded beforehand): vectorizing it along that output range (when the lanes
  divide it: 56 wide with 8 lanes) gives a tile of one window vector against broadcast weights, a load per FMA
  (AVX2, 64->64 channels at 56x56: 57 GFLOPS forward, 193 with the channels in the lanes instead)."""
  while v.op is Ops.CAST: v = v.src[0]
  if v.op is not Ops.LOAD or v.src[0].op is not Ops.INDEX: return False
  ix = v.src[0].src[1]
  return any(contiguous(ix, g) for g in glbl) and any(contiguous(ix, r) for r in red)


def _ranges_in(u: UOp) -> set[UOp]: return {n for n in u.toposort() if n.op is Ops.RANGE}


def _computed(v: UOp) -> bool:
  """Whether operand `v` is arithmetic over loads (a dequantized weight, a fused activation), not a load (through
  casts) or a load gated to zero (a padded window)."""
  while v.op is Ops.CAST: v = v.src[0]
  return v.op is not Ops.LOAD and not (v.op is Ops.WHERE and any(s.op is Ops.LOAD for s in v.src[1:]))


def conv_opts(ast: UOp, lanes: int, regs: int) -> list[Opt] | None:
  """A direct convolution (or one of its gradients) as a register-blocked matmul with the channels in the vector lanes: out[.., c, .., spatial] = sum
  over (channels, taps) of f[c, reduce..] * g[spatial.., reduce..], where the channel operand f moves with one global range c (the output or input
  channels: the weights, or the output gradient in the weight gradient) that it doesn't read contiguously, and the other operand is a gated window
  (padding), strided, or a sliding window (`_sliding_window`), so no axis of the output vectorizes well as it is. f is packed panel-major along c
  (PACK, codegen/pack.py), its panels of `lanes` x u channels are read as u vectors per reduce step, and the innermost other output axes (the output
  row, then the ones above it: the spatial rows in a forward conv, the kernel taps in a weight gradient) are the tile's rows, each a broadcast of g. A
  whole small axis is upcast so its padding gates fold to constants. The innermost tap loop (a short last reduce range) is FOLDed into the channel
  loop's body, each accumulator taking its taps in one trip; the other reduce loops stay loops (splitting the channel loop, or UNROLLing the taps,
  which gives each tap its own accumulators, measured slower: more live registers). None when the kernel isn't shaped like that (PACK=0 or CONV_OPT=0
  turns it off; CONV_OUTER=0 keeps a weight gradient's channel panels outermost, see below; CONV_FOLD=0 leaves the taps a loop)."""
  if not getenv("PACK", 1) or not getenv("CONV_OPT", 1): return None
  topo = ast.toposort()
  reduces = [n for n in topo if n.op is Ops.REDUCE]
  if not reduces or any(n.dtype.scalar() != dtypes.float32 for n in reduces) or len(ast.src) != 1: return None
  glbl = global_ranges(ast)
  red = {r for n in reduces for r in n.src[1:]}
  main = max(reduces, key=lambda n: math.prod(const_end(r) or 1 for r in n.src[1:]))
  if any(r.src[0].op is not Ops.CONST for r in (*glbl, *red)) or len(glbl) < 2: return None
  ops = _mul_operands(UOp(Ops.SINK, dtypes.void, (main,)))
  if len(ops) != 2: return None
  cands: list[tuple[UOp, set[UOp], set[UOp], UOp]] = []   # (channel range, ranges of f, ranges of g, g)
  for f, g in (ops, ops[::-1]):
    fr, gr = _ranges_in(f), _ranges_in(g)
    fg = [r for r in glbl if r in fr]
    if len(fg) != 1 or not fr & red or (c := fg[0]) in gr or c is glbl[-1] or (const_end(c) or 0) % lanes: continue
    if _plain_load_along(f, "global", c) or not (_gated_or_strided(g, glbl, lanes) or _sliding_window(g, glbl, red)): continue
    if not set(glbl) - {c} <= gr | fr: continue
    cands.append((c, fr, gr, g))
  if len(cands) != 1: return None
  c, fr, gr, g = cands[0]
  u = 2 if (const_end(c) // lanes) % 2 == 0 else 1
  # an operand computed by the kernel (a dequantized weight) is evaluated again for every channel panel here: with many
  # panels the matmul path packs it once instead (x @ dequantized W.T, 456 tokens as the channels on AVX2's 8 lanes:
  # 57 panels, 131 ms against 20 packed)
  if _computed(g) and const_end(c) // (lanes * u) >= PACK_MIN_EXPR_BLOCKS: return None
  opts = [Opt("PACK", c.arg[0], lanes * u), Opt("VECTOR", c.arg[0], lanes)]
  budget = max(1, (regs * 3 // 4) // u)  # output rows of the tile: u accumulators each
  for gr_ in reversed([r for r in glbl if r is not c]):
    n = const_end(gr_)
    k = n if n <= budget else next((a for a in (8, 7, 6, 5, 4, 3, 2) if a <= budget and n % a == 0), 1)
    if k < 2: continue
    opts.append(Opt("UPCAST", gr_.arg[0], k))
    budget //= k
    if budget < 2: break
  # the channel vectors after the rows: each row's broadcast then feeds its u vectors at once and dies (rows first kept
  # every row's broadcast live: a 6x2 tile on 16 registers spilled, AVX2 weight gradients at 46 GFLOPS on one core)
  if u > 1: opts.append(Opt("UPCAST", c.arg[0], u))
  # the innermost reduce loop, a short window's taps, folded into the loop around it: its 3 trips are each a tile's
  # worth of FMAs behind a loop's overhead (one process, kernels alternating, 2 cores: AVX-512 stride-2 forward 22.0 ->
  # 20.7 ms, its 2x2-phase input gradient 9.4 -> 8.2, the stride-1 layers 1.00-1.03x; AVX2 code 0.97-1.17x, 1.04 median)
  if getenv("CONV_FOLD", 1) and unrollable(inner := max(red, key=lambda r: r.arg[0])): opts.append(Opt("FOLD", inner.arg[0], const_end(inner)))
  # the channel range outermost (a weight gradient: dW[cout, cin, taps]) re-streams the whole window operand for
  # every channel panel, as scalar broadcasts the prefetchers follow badly; the first global range only the window
  # operand moves with goes outermost instead, so its windows stay in L2 across the panels, which stream in order
  if c is glbl[0] and getenv("CONV_OUTER", 1):
    upcast = {o.rid for o in opts if o.kind == "UPCAST"}
    gonly = [r for r in glbl if r is not c and r in gr and r not in fr and r.arg[0] not in upcast]
    if gonly and (const_end(gonly[0]) or 0) >= OUTER_MIN_TRIPS: opts.append(Opt("OUTER", gonly[0].arg[0], 0))
  return opts


def optimize(ast: UOp, caps: Capabilities) -> UOp:
  """Apply the optimizations a target with capabilities `caps` asks for (see the module docstring). PACK is left out: it adds a kernel, which
  the scheduler splits off (schedule/optimize.py); the kernel is correct without it."""
  if getenv("NOOPT", False): return ast
  opts = [o for o in heuristic_opts(ast, caps) if o.kind != "PACK"]
  capture.annotate("opts", opts)  # VIZ=1: shown with the kernel
  for opt in opts: ast = apply_opt(ast, opt)
  return ast


# ---- GPU targets (workgroups, shared memory, tensor cores) ----

def _pow2_at_most(n: int) -> int: return 1 << (max(n, 1).bit_length() - 1)


def tc_tile(ast: UOp, tc: TensorCore, caps: Capabilities, max_tile: int = 128, acc_regs: int = 128) -> tuple[int, ...]:
  """The TC tile (um, un, wm, wn, stage) for `ast`: the workgroup tile BM x BN (at most `max_tile` a side, dividing
  the output) that reads the least global memory per output (largest BM*BN/(BM+BN)), then the most warps (up to
  2 x 2) sharing it; the warps' accumulators fit in `acc_regs` 32-bit registers per lane, the double-buffered A/B
  tiles in the target's `shared_max`, and each tile splits evenly over the workgroup's threads (TC_STAGE=0: no
  staging through workgroup memory). Stage 2 (the output through shared memory as well) when the tensor core's C
  rows are narrower than a 32-byte sector and the C tile fits too."""
  if (mt := tc_match(ast, tc)) is None: raise ValueError(f"TC {tc.name}: no matmul-like reduce with {tc.dtype_in} inputs fits its tiles")
  _, a, _, i, j, _ = mt
  n, m, kk = tc.dims
  stage = 1 if getenv("TC_STAGE", 1) and caps.has_shared else 0
  best, key = (1, 1, 1, 1, stage), (-1.0, 0, 0)
  for wm in (1, 2):
    for wn in (1, 2):
      for um in (1, 2, 4, 8):
        for un in (1, 2, 4, 8, 16):
          bm, bn, nt = m * um * wm, n * un * wn, tc.threads * wm * wn
          if bm > max_tile or bn > max_tile or i.src[0].arg % bm or j.src[0].arg % bn or um * un * tc.elements_per_thread[2] > acc_regs: continue
          if stage and (2 * (bm + bn) * kk * a.dtype.itemsize > caps.shared_max or (bm * kk) % nt or (bn * kk) % nt): continue
          if (score := (bm * bn / (bm + bn), wm * wn, -abs(wm - wn))) > key: best, key = (um, un, wm, wn, stage), score
  # C rows narrower than a 32-byte sector (CUDA's m16n8: 8 columns): the output goes through shared memory too, when it fits
  um, un, wm, wn, stage = best
  out_isz = ast.src[0].src[1].dtype.itemsize if len(ast.src) == 1 else 0
  bm, bn = m * um * wm, n * un * wn
  if stage and n * out_isz < 32 and 2 * (bm + bn) * kk * a.dtype.itemsize + bm * bn * out_isz <= caps.shared_max:
    try:
      apply_opt(ast, Opt("TC", -1, caps.tensor_cores.index(tc), (um, un, wm, wn, 2)), caps)   # the stage-2 tile fits the kernel
      return (um, un, wm, wn, 2)
    except ValueError: pass
  return best


def choose_gpu_opts(ast: UOp, caps: Capabilities) -> list[Opt]:
  """Heuristic GPU optimizations (see the module docstring): TC when a tensor core fits; a reduction over a long axis
  split across a workgroup (GROUP on every top-level reduce when the reduce axis is contiguous in memory or the output
  is small, else threads over the output's contiguous axis and GROUPTOP); other kernels get UPCAST register tiles
  where loads are shared (matmul-like), UNROLL of tiny reduce loops, and LOCAL threads over their innermost output axes."""
  max_threads, warp = caps.local_max_threads, max(caps.warp_size, 1)
  if getenv("TC", 1) and (tci := next((n for n, tc in enumerate(caps.tensor_cores) if tc_match(ast, tc) is not None), None)) is not None:
    return [Opt("TC", -1, tci, tc_tile(ast, caps.tensor_cores[tci], caps))]
  glbl = global_ranges(ast)
  looped = in_loop(ast)
  top_reds = [n for n in ast.toposort() if n.op is Ops.REDUCE and n not in looped]
  cands = sorted({red.src[-1] for red in top_reds}, key=lambda r: r.arg[0])  # the innermost range of each top-level reduce
  out_elems = math.prod(range_size(g) for g in glbl)
  if cands and all(range_size(r) >= 64 for r in cands):
    along = any(contiguous(ix.src[1], cands[-1]) for ix in global_loads(ast))
    k = min(256 if along or out_elems < 64 else 0, min(_pow2_at_most(range_size(r)) for r in cands), max_threads)
    itemsize = max(red.dtype.itemsize for red in top_reds)
    if k >= warp and k * itemsize * len(top_reds) <= caps.shared_max:
      if not along and glbl and range_size(glbl[-1]) >= warp:  # threads on the contiguous output axis, each summing a chunk
        lk = min(warp, _pow2_at_most(range_size(glbl[-1])))
        k = min(k, max_threads // lk, 16)
        return [Opt("LOCAL", glbl[-1].arg[0], lk)] + [Opt("GROUPTOP", r.arg[0], k) for r in cands]
      opts = [Opt("GROUP", r.arg[0], k) for r in cands]
      return _row_opts(ast, glbl, top_reds, k, opts, caps) if along else opts
  opts: list[Opt] = []
  red_rngs = {r for red in top_reds for r in red.src[1:]}
  for r in sorted(red_rngs, key=lambda r: r.arg[0]):  # tiny reduce loops (a 3x3 window) unrolled
    if unrollable(r): opts.append(Opt("UNROLL", r.arg[0], r.src[0].arg))
  sizes = {g.arg[0]: range_size(g) for g in glbl}
  loads = [ix.src[1] for ix in global_loads(ast) if any(r in ix.toposort() for r in red_rngs)]
  for g in reversed(glbl):  # register tiles: outputs along an axis some reduce-loop load doesn't use share that load
    if loads and any(g not in ld.toposort() for ld in loads) and g.src[0].op is Ops.CONST and sizes[g.arg[0]] % 4 == 0 \
       and sizes[g.arg[0]] >= 64 and sum(o.kind == "UPCAST" for o in opts) < 2:
      opts.append(Opt("UPCAST", g.arg[0], 4))
      sizes[g.arg[0]] //= 4
  return opts + _local_opts(glbl, sizes, caps)


def _row_opts(ast: UOp, glbl: list[UOp], reds: list[UOp], k: int, groups: list[Opt], caps: Capabilities) -> list[Opt]:
  """A row kernel (a global axis the reductions don't use, e.g. softmax's output column: without more, every
  workgroup along it would redo the row's reductions): that axis goes to the group's threads (GROUPOUT) when it
  needs at most 16 stores per thread, and the group's per-thread partial loops of at most 16 steps are unrolled, so
  a thread's loads of its row elements are the same values in every reduction and in its outputs (read once)."""
  used = {x for red in reds for x in red.toposort() if x.op is Ops.RANGE}
  free = [g for g in glbl if g not in used and g.src[0].op is Ops.CONST]
  if len(free) != 1 or free[0].src[0].arg > 16 * k: return groups
  opts = [Opt("GROUPOUT", free[0].arg[0], k)] + groups
  try: cur = functools.reduce(lambda a, o: apply_opt(a, o, caps), opts, ast)
  except ValueError: return groups
  loops = {r for n in cur.toposort() if n.op is Ops.REDUCE for r in n.src[1:]
           if r.arg[1] == "reduce" and unrollable(r, UNROLL_BUDGET) and r.src[0].arg > 1}   # (not a group's thread range)
  # (not the serial combine's loop over the k slots in local memory)
  loops = {r for r in loops if not any(r in x.src[1].toposort() for x in cur.toposort() if x.op is Ops.INDEX and x.src[0].op is Ops.DEFINE_LOCAL)}
  return opts + [Opt("UNROLL", r.arg[0], r.src[0].arg) for r in sorted(loops, key=lambda r: r.arg[0])]


def _local_opts(glbl: list[UOp], sizes: dict[int, int], caps: Capabilities) -> list[Opt]:
  """LOCAL threads over the innermost output axes, up to 256 per workgroup (padded to whole warps on dim 0)."""
  warp, lmax = max(caps.warp_size, 1), tuple(caps.local_max or (caps.local_max_threads,) * 3)
  budget, opts = min(256, caps.local_max_threads), []
  for d, g in enumerate(reversed(glbl)):
    if d >= len(lmax) or budget < 2: break
    n = sizes[g.arg[0]]
    if n < 2: continue
    k = next((c for c in (256, 128, 64, 32, 16, 8, 4, 2) if c <= min(budget, lmax[d]) and g.src[0].op is Ops.CONST and n % c == 0), 0)
    if k < min(n, warp) and d == 0: k = min(budget, lmax[d], -(-n // warp) * warp)
    if k < 2: continue
    opts.append(Opt("LOCAL", g.arg[0], k))
    budget //= k
  return opts


def optimize_gpu(ast: UOp, caps: Capabilities) -> UOp:
  """Apply the GPU heuristic's optimizations (NOOPT=1: none, one thread per workgroup)."""
  if getenv("NOOPT", False) or not uses_gpudims(caps): return ast
  for opt in choose_gpu_opts(ast, caps):
    try: ast = apply_opt(ast, opt, caps)
    except ValueError: break  # the heuristic's guess doesn't fit this kernel: keep what applied
  return ast
