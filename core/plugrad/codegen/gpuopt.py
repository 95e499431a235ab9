"""GPU optimizations of a kernel AST: workgroup threads (LOCAL), reductions split across a workgroup (GROUP, GROUPTOP)
and the heuristic that picks them (with UPCAST/UNROLL from codegen/opt.py) from the renderer's capabilities.

- `LOCAL` a global range r (size N) by k: `r -> r'*k + l` where `l` is a new RANGE of size k with kind "local" (a thread
  id inside the workgroup once codegen/gpudims.py runs). When k doesn't divide N, r' has ceil(N/k) iterations and every
  global memory access of the kernel is gated by `r'*k + l < N`.
- `GROUP` a reduce range R by k (`GROUPTOP`: the same, each thread taking a contiguous chunk): every REDUCE over R
  becomes a per-thread partial over `R = r'*k + l` (GROUPTOP: `R = l*ceil(N/k) + r'`), stored to workgroup memory
  (`DEFINE_LOCAL`), a `BARRIER`, then the k partials are combined: a tree when k is a power of two (step s: threads
  l < s store `op(local[l], local[l+s])` into `local[l]`, then a BARRIER; every thread reads `local[0]` at the end),
  else every thread loops over them: `REDUCE(LOAD(INDEX(local, base*k + j), BARRIER), j)`. Only thread `l == 0`
  stores the kernel's outputs. Elements
  past N (k not dividing N) contribute the reduce identity and are never loaded. GROUP applies to every REDUCE
  that runs in no other reduce's loop (a barrier inside a loop would need a second one), after all LOCALs; a second
  GROUP (e.g. softmax's sum after its max) reuses the same k threads with its own local buffer.
The heuristic (`choose_gpu_opts`) reads `local_max_threads`, `shared_max`, `warp_size` and `local_max`.
"""
from __future__ import annotations

import math

from plugrad.codegen.gpudims import uses_gpudims
from plugrad.codegen.linearize import reduce_identity
from plugrad.codegen.opt import Opt, apply_opt, div_end, pm_opt_symbolic, ranges_of
from plugrad.codegen.tc import TensorCore
from plugrad.dtype import AddrSpace, dtypes
from plugrad.helpers import getenv
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import pm_symbolic

GPU_KINDS = ("LOCAL", "GROUP", "GROUPTOP", "TC")


def _c(x: int) -> UOp: return UOp.const(dtypes.index, x)


def gate_globals(x: UOp, valid: UOp) -> UOp:
  """`x` with every INDEX into a DEFINE_GLOBAL gated by `valid` too (a gated load yields 0 and touches no memory)."""
  subs = {n: n.replace(src=(n.src[0], n.src[1], valid if len(n.src) < 3 else n.src[2] & valid))
          for n in x.toposort() if n.op is Ops.INDEX and n.src[0].op is Ops.DEFINE_GLOBAL}
  return x.substitute(subs) if subs else x


def _padded_outer(rng: UOp, k: int) -> tuple[UOp, bool]:
  """The range of ceil(N/k) iterations (rng's id and kind) and whether k divides N exactly."""
  if (n := div_end(rng.src[0], k)) is not None: return UOp(Ops.RANGE, rng.dtype, (n,), rng.arg), True
  n = graph_rewrite((rng.src[0] + (k - 1)) // k, pm_symbolic, name="ceil size")
  return UOp(Ops.RANGE, rng.dtype, (n,), rng.arg), False


def _local(ast: UOp, rng: UOp, k: int, nid: int) -> UOp:
  if rng.arg[1] != "global" or len(rng.arg) > 2: raise ValueError(f"LOCAL needs a global range, range {rng.arg} isn't one")
  if any(n.op is Ops.DEFINE_LOCAL for n in ast.toposort()): raise ValueError("LOCAL must come before GROUP")
  outer, exact = _padded_outer(rng, k)
  new = outer * k + UOp(Ops.RANGE, dtypes.index, (_c(k),), (nid, "local"))
  ast = ast.substitute({rng: new}, walk=True)
  return ast if exact else gate_globals(ast, new < rng.src[0])


def _nested(ast: UOp) -> set[UOp]:
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


def _group(ast: UOp, rng: UOp, k: int, top: bool, nid: int) -> UOp:
  if rng.arg[1] != "reduce" or len(rng.arg) > 2: raise ValueError(f"GROUP needs a reduce range, range {rng.arg} isn't one")
  reds = [n for n in ast.toposort() if n.op is Ops.REDUCE and rng in n.src[1:]]
  if not reds: raise ValueError(f"no REDUCE uses range {rng.arg}")
  if any(r in in_loop(ast) for r in reds): raise ValueError(f"GROUP of range {rng.arg}: its REDUCE runs inside another reduce's loop")
  lcl = sorted((r for r in ranges_of(ast).values() if r.arg[1] == "local"), key=lambda r: r.arg[0])
  grp = [r for r in lcl if r.arg[2:] == ("group",)]  # a second GROUP reuses the workgroup's reduce threads
  if grp and grp[0].src[0].arg != k: raise ValueError(f"GROUP by {k}: the kernel already reduces across {grp[0].src[0].arg} threads")
  lcl = [r for r in lcl if r not in grp]
  base: UOp = _c(0)
  for r in lcl: base = base * r.src[0] + r  # this thread's slot among the workgroup's other threads
  nthreads = math.prod(r.src[0].arg for r in lcl) * k
  lane = grp[0] if grp else UOp(Ops.RANGE, dtypes.index, (_c(k),), (nid, "local", "group"))
  n_bufs = len([x for x in ast.toposort() if x.op is Ops.DEFINE_LOCAL])
  n = rng.src[0]
  exact = (q := div_end(n, k)) is not None
  chunk = q if q is not None else graph_rewrite((n + (k - 1)) // k, pm_symbolic, name="chunk")
  subs, fresh = {}, nid + 1
  for i, red in enumerate(sorted(reds, key=lambda r: len(r.toposort()))):
    inner = UOp(Ops.RANGE, dtypes.index, (chunk,), (fresh, "reduce"))
    j = UOp(Ops.RANGE, dtypes.index, (_c(k),), (fresh + 1, "reduce"))
    fresh += 2
    idx = lane * chunk + inner if top else inner * k + lane
    body = red.src[0].substitute({**subs, rng: idx}, walk=True)
    if not exact:
      valid = idx < n
      body = valid.where(gate_globals(body, valid), UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)))
    others = tuple(r for r in red.src[1:] if r is not rng)
    partial = UOp(Ops.REDUCE, red.dtype, (body, inner, *others), red.arg)
    buf = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(nthreads, AddrSpace.LOCAL), arg=(f"temp{n_bufs + i}", nthreads))
    subs[red] = _combine(red, buf, base * k, lane, k, partial, j)
  ast = ast.substitute(subs, walk=True)
  # only thread 0 of the group stores (every thread holds the same combined value)
  first = lane.eq(0)
  stores = [st.replace(src=(st.src[0].replace(src=(*st.src[0].src[:2], first if len(st.src[0].src) < 3 else st.src[0].src[2] & first)), *st.src[1:]))
            if lane not in st.src[0].toposort() else st for st in ast.src]
  return UOp(Ops.SINK, dtypes.void, tuple(stores))


def _combine(red: UOp, buf: UOp, base: UOp, lane: UOp, k: int, partial: UOp, j: UOp) -> UOp:
  """The k partials of a workgroup combined through local memory: a tree of log2(k) halving steps (thread l < s adds
  slot l+s into slot l, a BARRIER after each) when k is a power of two, else a serial loop over the k slots."""
  def ix(i: UOp, gate: UOp | None = None) -> UOp: return UOp(Ops.INDEX, buf.dtype, (buf, base + i) if gate is None else (buf, base + i, gate))
  bar = UOp(Ops.BARRIER, dtypes.void, (UOp(Ops.STORE, dtypes.void, (ix(lane), partial)),))
  if k & (k - 1): return UOp(Ops.REDUCE, red.dtype, (UOp(Ops.LOAD, red.dtype, (ix(j), bar)), j), red.arg)
  s = k // 2
  while s >= 1:
    act = lane < s
    a, b = UOp(Ops.LOAD, red.dtype, (ix(lane, act), bar)), UOp(Ops.LOAD, red.dtype, (ix(lane + s, act), bar))
    bar = UOp(Ops.BARRIER, dtypes.void, (UOp(Ops.STORE, dtypes.void, (ix(lane, act), UOp(red.arg, red.dtype, (a, b)))),))
    s //= 2
  return UOp(Ops.LOAD, red.dtype, (ix(_c(0)), bar))


def _strip_cast(x: UOp) -> UOp: return x.src[0] if x.op is Ops.CAST else x


def tc_match(ast: UOp, tc: TensorCore) -> tuple[UOp, UOp, UOp, UOp, UOp, UOp] | None:
  """(reduce, A operand, B operand, i, j, k) when `ast` has a top-level ADD reduce of a product A*B in `tc`'s dtypes where
  A uses output range i (not j), B uses j (not i), both the reduce range k, and the tile divides every size."""
  n, m, kk = tc.dims
  nested = _nested(ast)
  for red in (x for x in ast.toposort() if x.op is Ops.REDUCE and x not in nested):
    if red.arg is not Ops.ADD or red.dtype != tc.dtype_out or len(red.src) != 2: continue
    mul = _strip_cast(red.src[0])
    if mul.op is not Ops.MUL: continue
    a, b = (x if x.dtype == tc.dtype_in else _strip_cast(x) for x in mul.src)
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


def _coord(lay, lane: UOp, e: int, which: int) -> UOp:
  """Row (which=0) or column (1) of element e of `lane`'s fragment as index math over the lane id (the layout's bit strides)."""
  x: UOp = _c(sum(d[which] for b, d in enumerate(lay.elem) if e >> b & 1))
  for b, d in enumerate(lay.lane):
    if d[which]: x = x + (lane // (1 << b)) % 2 * d[which]
  return x


def _tc(ast: UOp, tc: TensorCore, nid: int) -> UOp:
  if (mt := tc_match(ast, tc)) is None: raise ValueError(f"TC {tc.name}: no matmul-like reduce with {tc.dtype_in} inputs fits its tiles")
  red, a, b, i, j, k = mt
  n, m, kk = tc.dims
  if any(r.arg[1] == "local" for r in ranges_of(ast).values()): raise ValueError("TC must come before LOCAL")
  lane = UOp(Ops.RANGE, dtypes.index, (_c(tc.threads),), (nid, "local"))
  i2, j2, k2 = (UOp(Ops.RANGE, dtypes.index, (_c(r.src[0].arg // d),), r.arg) for r, d in ((i, m), (j, n), (k, kk)))
  def frag(op: str, x: UOp, rows: tuple[UOp, UOp, int], cols: tuple[UOp, UOp, int]) -> UOp:
    lay, ept = tc.layout(op), tc.elements_per_thread["abc".index(op)]
    els = [x.substitute({rows[0]: rows[1] * rows[2] + _coord(lay, lane, e, 0), cols[0]: cols[1] * cols[2] + _coord(lay, lane, e, 1)}, walk=True)
           for e in range(ept)]
    return UOp(Ops.VECTORIZE, x.dtype.vec(ept), tuple(els))
  fa, fb = frag("a", a, (i, i2, m), (k, k2, kk)), frag("b", b, (k, k2, kk), (j, j2, n))
  ec = tc.elements_per_thread[2]
  zero = UOp(Ops.VECTORIZE, tc.dtype_out.vec(ec), (UOp.const(tc.dtype_out, 0.0),) * ec)
  acc = UOp(Ops.REDUCE, tc.dtype_out.vec(ec), (UOp(Ops.WMMA, tc.dtype_out.vec(ec), (fa, fb, zero), tc.name), k2), Ops.ADD)
  stores = []
  for st in ast.src:
    if red not in st.toposort(): raise ValueError(f"TC {tc.name}: a store of the kernel doesn't use the matmul")
    for e in range(ec):
      sub = {red: UOp(Ops.GEP, tc.dtype_out, (acc,), (e,)), i: i2 * m + _coord(tc.c, lane, e, 0), j: j2 * n + _coord(tc.c, lane, e, 1)}
      stores.append(st.substitute(sub, walk=True))
  return UOp(Ops.SINK, dtypes.void, tuple(stores))


def apply_gpu_opt(ast: UOp, opt: Opt, renderer=None) -> UOp:
  """`ast` with one optimization applied; LOCAL/GROUP/GROUPTOP/TC here, the others by codegen/opt.py (ValueError if it
  doesn't fit). TC's amount is the index of the tensor core in `renderer.tensor_cores`."""
  if opt.kind not in GPU_KINDS: return apply_opt(ast, opt)
  rngs = ranges_of(ast)
  if opt.kind == "TC":
    tcs = getattr(renderer, "tensor_cores", [])
    if not 0 <= opt.amount < len(tcs): raise ValueError(f"{opt}: the renderer has {len(tcs)} tensor cores")
    return graph_rewrite(_tc(ast, tcs[opt.amount], max(rngs) + 1), pm_opt_symbolic, name="simplify after TC")
  if (rng := rngs.get(opt.rid)) is None: raise ValueError(f"{opt}: the kernel has no range {opt.rid}")
  if opt.amount < 2: raise ValueError(f"{opt}: needs at least 2 threads")
  nid = max(rngs) + 1
  ast = _local(ast, rng, opt.amount, nid) if opt.kind == "LOCAL" else _group(ast, rng, opt.amount, opt.kind == "GROUPTOP", nid)
  return graph_rewrite(ast, pm_opt_symbolic, name=f"simplify after {opt.kind}")


def _loads(ast: UOp) -> list[UOp]: return [n.src[0] for n in ast.toposort() if n.op is Ops.LOAD and n.src[0].src[0].op is Ops.DEFINE_GLOBAL]


def _contiguous_in(rng: UOp, idx: UOp) -> bool:
  """Whether consecutive values of `rng` read consecutive elements through `idx`."""
  if rng not in idx.toposort(): return False
  d = graph_rewrite(idx.substitute({rng: rng + 1}, walk=True) - idx, pm_symbolic, name="stride")
  return d.op is Ops.CONST and d.arg == 1


def _pow2_at_most(n: int) -> int: return 1 << (max(n, 1).bit_length() - 1)


def _size(r: UOp) -> int: return r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0].vmax


def choose_gpu_opts(ast: UOp, renderer) -> list[Opt]:
  """Heuristic GPU optimizations (see the module docstring): TC when a tensor core fits; a reduction over a long axis
  split across a workgroup (GROUP on every top-level reduce when the reduce axis is contiguous in memory or the output
  is small, else threads over the output's contiguous axis and GROUPTOP); other kernels get UPCAST register tiles
  where loads are shared (matmul-like), UNROLL of tiny reduce loops, and LOCAL threads over their innermost output axes."""
  max_threads, warp = renderer.local_max_threads, max(renderer.warp_size, 1)
  if getenv("TC", 1) and (tci := next((n for n, tc in enumerate(renderer.tensor_cores) if tc_match(ast, tc) is not None), None)) is not None:
    return [Opt("TC", -1, tci)]  # one warp per workgroup computes an M x N tile with tensor cores
  rngs = sorted(ranges_of(ast).values(), key=lambda r: r.arg[0])
  glbl = [r for r in rngs if r.arg[1] == "global"]
  looped = in_loop(ast)
  top_reds = [n for n in ast.toposort() if n.op is Ops.REDUCE and n not in looped]
  cands = sorted({red.src[-1] for red in top_reds}, key=lambda r: r.arg[0])  # the innermost range of each top-level reduce
  out_elems = math.prod(_size(g) for g in glbl)
  if cands and all(_size(r) >= 64 for r in cands):
    contiguous = any(_contiguous_in(cands[-1], ix.src[1]) for ix in _loads(ast))
    k = min(256 if contiguous or out_elems < 64 else 0, min(_pow2_at_most(_size(r)) for r in cands), max_threads)
    itemsize = max(red.dtype.itemsize for red in top_reds)
    if k >= warp and k * itemsize * len(top_reds) <= renderer.shared_max:
      if not contiguous and glbl and _size(glbl[-1]) >= warp:  # threads on the contiguous output axis, each summing a chunk
        lk = min(warp, _pow2_at_most(_size(glbl[-1])))
        k = min(k, max_threads // lk, 16)
        return [Opt("LOCAL", glbl[-1].arg[0], lk)] + [Opt("GROUPTOP", r.arg[0], k) for r in cands]
      return [Opt("GROUP", r.arg[0], k) for r in cands]
  opts: list[Opt] = []
  red_rngs = {r for red in top_reds for r in red.src[1:]}
  for r in sorted(red_rngs, key=lambda r: r.arg[0]):  # tiny reduce loops (a 3x3 window) unrolled
    if r.src[0].op is Ops.CONST and r.src[0].arg <= 4: opts.append(Opt("UNROLL", r.arg[0], r.src[0].arg))
  sizes = {g.arg[0]: _size(g) for g in glbl}
  loads = [ix.src[1] for ix in _loads(ast) if any(r in ix.toposort() for r in red_rngs)]
  for g in reversed(glbl):  # register tiles: outputs along an axis some reduce-loop load doesn't use share that load
    if loads and any(g not in ld.toposort() for ld in loads) and g.src[0].op is Ops.CONST and sizes[g.arg[0]] % 4 == 0 \
       and sizes[g.arg[0]] >= 64 and sum(o.kind == "UPCAST" for o in opts) < 2:
      opts.append(Opt("UPCAST", g.arg[0], 4))
      sizes[g.arg[0]] //= 4
  return opts + _local_opts(glbl, sizes, renderer)


def _local_opts(glbl: list[UOp], sizes: dict[int, int], renderer) -> list[Opt]:
  """LOCAL threads over the innermost output axes, up to 256 per workgroup (padded to whole warps on dim 0)."""
  warp, lmax = max(renderer.warp_size, 1), tuple(renderer.local_max or (renderer.local_max_threads,) * 3)
  budget, opts = min(256, renderer.local_max_threads), []
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


def optimize_gpu(ast: UOp, renderer) -> UOp:
  """Apply the GPU heuristic's optimizations (NOOPT=1: none, one thread per workgroup)."""
  if getenv("NOOPT", False) or not uses_gpudims(renderer): return ast
  for opt in choose_gpu_opts(ast, renderer):
    try: ast = apply_gpu_opt(ast, opt, renderer)
    except ValueError: break  # the heuristic's guess doesn't fit this kernel: keep what applied
  return ast
