"""GPU optimizations of a kernel AST: workgroup threads (LOCAL), reductions split across a workgroup (GROUP, GROUPTOP)
tensor cores (TC) and the heuristic that picks them (with UPCAST/UNROLL from codegen/opt.py) from the renderer's
capabilities.

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
- `GROUPOUT` a global range by k, before the GROUPs: the group's k threads compute that output axis (row kernels such
  as the scheduler's one-kernel softmax: one workgroup per row reduces the row and writes it).
- `TC` a matmul on tensor cores (`Opt.arg` = tile: accumulators per warp, warps per workgroup, A/B staged in shared
  memory; see `_tc`, `tc_tile` and docs/kernel_ir.md).
The heuristic (`choose_gpu_opts`) reads `local_max_threads`, `shared_max`, `warp_size`, `local_max`, `has_shared` and
`tensor_cores`.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

from plugrad.codegen.gpudims import uses_gpudims
from plugrad.codegen.linearize import reduce_identity
from plugrad.codegen.opt import div_end, pm_opt_symbolic, ranges_of
from plugrad.codegen.optops import GLOBAL, KERNEL, REDUCE, Opt, OptKind, apply_opt, register, thread_amounts
from plugrad.codegen.tc import TensorCore
from plugrad.dtype import AddrSpace, dtypes
from plugrad.helpers import getenv
from plugrad.runtime.renderer import Capabilities
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import pm_symbolic



def _c(x: int) -> UOp: return UOp.const(dtypes.index, x)


def gate_globals(x: UOp, valid: UOp, using: UOp | None = None) -> UOp:
  """`x` with every INDEX into a DEFINE_GLOBAL (whose index uses `using`, when given) gated by `valid` too (a gated
  load yields 0 and touches no memory)."""
  subs = {n: n.replace(src=(n.src[0], n.src[1], valid if len(n.src) < 3 else n.src[2] & valid))
          for n in x.toposort() if n.op is Ops.INDEX and n.src[0].op is Ops.DEFINE_GLOBAL and (using is None or using in n.src[1].toposort())}
  return x.substitute(subs) if subs else x


def _padded_outer(rng: UOp, k: int) -> tuple[UOp, bool]:
  """The range of ceil(N/k) iterations (rng's id and kind) and whether k divides N exactly."""
  if (n := div_end(rng.src[0], k)) is not None: return UOp(Ops.RANGE, rng.dtype, (n,), rng.arg), True
  n = graph_rewrite((rng.src[0] + (k - 1)) // k, pm_symbolic, name="ceil size")
  return UOp(Ops.RANGE, rng.dtype, (n,), rng.arg), False


def _local(ast: UOp, rng: UOp, k: int, nid: int) -> UOp:
  if any(n.op is Ops.DEFINE_LOCAL for n in ast.toposort()): raise ValueError("LOCAL must come before GROUP")
  outer, exact = _padded_outer(rng, k)
  new = outer * k + UOp(Ops.RANGE, dtypes.index, (_c(k),), (nid, "local"))
  ast = ast.substitute({rng: new}, walk=True)
  return ast if exact else gate_globals(ast, new < rng.src[0])


def _group_out(ast: UOp, rng: UOp, k: int, nid: int) -> UOp:
  """GROUPOUT: global range `rng` (size N) computed by the k threads of the workgroup's group instead of by more
  workgroups: every store using it becomes ceil(N/k) stores at `j*k + l` (j = 0, 1, ...; l the group thread, shared
  with later GROUPs), those past N gated off. A row kernel (softmax: reduce the row, then write it) then has one
  workgroup per row whose threads write the row from the values they reduced."""
  if rng.arg[1] != "global" or len(rng.arg) > 2 or rng.src[0].op is not Ops.CONST:
    raise ValueError(f"GROUPOUT needs a global range of constant size, range {rng.arg} isn't one")
  if any(n.op is Ops.DEFINE_LOCAL for n in ast.toposort()): raise ValueError("GROUPOUT must come before GROUP")
  lcl = [r for r in ranges_of(ast).values() if r.arg[1] == "local"]
  if lcl: raise ValueError(f"GROUPOUT of range {rng.arg}: the kernel already has thread ranges {[r.arg for r in lcl]}")
  n = rng.src[0].arg
  lane = UOp(Ops.RANGE, dtypes.index, (_c(k),), (nid, "local", "group"))
  stores = []
  for st in ast.src:
    if rng not in st.toposort(): stores.append(st); continue
    for j in range(-(-n // k)):
      at = lane + j * k if j else lane
      # past N: this copy's own accesses gated (not the reductions' loads it reads, which don't use the thread id yet)
      stores.append(st.substitute({rng: at}, walk=True) if (j + 1) * k <= n else gate_globals(st.substitute({rng: at}, walk=True), at < n, lane))
  return UOp(Ops.SINK, dtypes.void, tuple(stores))


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
      # only this reduce's own loads: a GROUPed reduce used inside this one (softmax's max in its sum) keeps its gates
      body = valid.where(gate_globals(body, valid, inner), UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)))
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


TC_TILE_DEFAULT = (1, 1, 1, 1, 0)


def _aligned(idx: UOp, v: int) -> bool:
  """Whether the symbolic engine proves `idx % v == 0` for every value of its ranges and variables."""
  r = graph_rewrite(idx % v, pm_opt_symbolic, name="alignment")
  return r.op is Ops.CONST and r.arg == 0


def _stage(x: UOp, rows: tuple[UOp, UOp, int], cols: tuple[UOp, UOp, int], tid: UOp, nthreads: int, k2: UOp, name: str):
  """Stage operand `x` (a function of ranges rows[0], cols[0]) through workgroup memory: the TR x TC tile at
  (rows[1], cols[1]) is loaded cooperatively by the `nthreads` threads (thread id `tid`), with vector loads of up to
  16 bytes along the axis `x` is contiguous in when the symbolic engine proves them aligned, into one of two buffers
  (k2 % 2: the next tile's stores never overwrite the one other warps still read, so one BARRIER per step suffices).
  Returns (the STOREs, a function (r, c, barrier) -> the LOAD of tile element (r, c))."""
  (ri, rbase, tr), (ci, cbase, tcc) = rows, cols
  ld = x if x.op is Ops.LOAD and x.src[0].op is Ops.INDEX and len(x.src[0].src) == 2 and x.src[0].src[0].op is Ops.DEFINE_GLOBAL else None
  along_rows = ld is not None and not _contiguous_in(ci, ld.src[0].src[1]) and _contiguous_in(ri, ld.src[0].src[1])
  inner = tr if along_rows else tcc  # the tile dim that is contiguous in memory (and in the local layout)
  def flat(r: UOp, c: UOp) -> UOp: return c * tr + r if along_rows else r * tcc + c
  def rc(f: UOp) -> tuple[UOp, UOp]: return (f % tr, f // tr) if along_rows else (f // tcc, f % tcc)
  size = tr * tcc
  if size % nthreads: raise ValueError(f"TC staging: a {tr}x{tcc} tile doesn't split over {nthreads} threads")
  vec = 1
  if ld is not None and (along_rows or _contiguous_in(ci, ld.src[0].src[1])):
    for v in (16 // x.dtype.itemsize, 8, 4, 2):
      if v * x.dtype.itemsize > 16 or inner % v or size % (v * nthreads): continue
      r0, c0 = rc(tid * v)
      if _aligned(ld.src[0].src[1].substitute({ri: rbase + r0, ci: cbase + c0}, walk=True), v): vec = v; break
  per = size // (vec * nthreads)
  buf = UOp(Ops.DEFINE_LOCAL, x.dtype.ptr(2 * size, AddrSpace.LOCAL), arg=(name, 2 * size))
  half = (k2 % 2) * size
  stores = []
  for p in range(per):
    f = (tid + p * nthreads) * vec
    r, c = rc(f)
    val = x.substitute({ri: rbase + r, ci: cbase + c}, walk=True)
    if vec > 1: val = UOp(Ops.LOAD, x.dtype.vec(vec), val.src)
    stores.append(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, half + f)), val)))
  def elem(r: UOp, c: UOp, bar: UOp) -> UOp: return UOp(Ops.LOAD, x.dtype, (UOp(Ops.INDEX, buf.dtype, (buf, half + flat(r, c))), bar))
  return stores, elem


def _vector_stores(stores: list[UOp]) -> list[UOp]:
  """Pairs (or quads) of scalar stores to consecutive, provably aligned elements of one buffer as one vector store."""
  out, i = [], 0
  while i < len(stores):
    for v in (4, 2):
      grp = stores[i:i + v]
      if len(grp) < v or any(st.src[0].op is not Ops.INDEX or len(st.src[0].src) != 2 or st.src[0].src[0] is not grp[0].src[0].src[0]
                             or st.src[1].dtype.count != 1 for st in grp): continue
      base = grp[0].src[0].src[1]
      if v * grp[0].src[1].dtype.itemsize > 16 or not _aligned(base, v): continue
      if not all((d := graph_rewrite(st.src[0].src[1] - base, pm_opt_symbolic, name="offset")).op is Ops.CONST and d.arg == e
                 for e, st in enumerate(grp)): continue
      val = UOp(Ops.VECTORIZE, grp[0].src[1].dtype.vec(v), tuple(st.src[1] for st in grp))
      out.append(UOp(Ops.STORE, dtypes.void, (grp[0].src[0], val)))
      i += v
      break
    else:
      out.append(stores[i])
      i += 1
  return out


def _tc(ast: UOp, tc: TensorCore, nid: int, tile: tuple[int, ...] = ()) -> UOp:
  """The matmul of `ast` on tensor core `tc` with tile (um, un, wm, wn, stage): each warp computes um x un tensor-core
  tiles (um*un accumulators sharing its A and B fragments), wm x wn warps per workgroup (LOCAL), and with stage=1 the
  workgroup's A and B tiles of each K step pass through workgroup memory (DEFINE_LOCAL + BARRIER) so that its warps
  share one coalesced, vectorized load of them."""
  if len(tile) > 5 or any(not isinstance(t, int) or t < 0 for t in tile): raise ValueError(f"TC tile {tile}: expected up to 5 non-negative ints")
  um, un, wm, wn, stage = tuple(tile) + TC_TILE_DEFAULT[len(tile):]
  if min(um, un, wm, wn) < 1 or stage not in (0, 1, 2): raise ValueError(f"TC tile {tile}: sizes must be >= 1 and stage 0, 1 or 2")
  if (mt := tc_match(ast, tc)) is None: raise ValueError(f"TC {tc.name}: no matmul-like reduce with {tc.dtype_in} inputs fits its tiles")
  red, a, b, i, j, k = mt
  n, m, kk = tc.dims
  bm, bn = m * um * wm, n * un * wn
  if i.src[0].arg % bm or j.src[0].arg % bn: raise ValueError(f"TC tile {tile}: {bm}x{bn} doesn't divide the {i.src[0].arg}x{j.src[0].arg} output")
  if any(r.arg[1] == "local" for r in ranges_of(ast).values()): raise ValueError("TC must come before LOCAL")
  if wm * wn * tc.threads > 1024: raise ValueError(f"TC tile {tile}: {wm * wn} warps of {tc.threads} lanes is too many threads")
  gi, gj, k2 = (UOp(Ops.RANGE, dtypes.index, (_c(r.src[0].arg // d),), r.arg) for r, d in ((i, bm), (j, bn), (k, kk)))
  wi = UOp(Ops.RANGE, dtypes.index, (_c(wm),), (nid, "local")) if wm > 1 else _c(0)
  wj = UOp(Ops.RANGE, dtypes.index, (_c(wn),), (nid + 1, "local")) if wn > 1 else _c(0)
  lane = UOp(Ops.RANGE, dtypes.index, (_c(tc.threads),), (nid + 2, "local"))  # the highest id: lidx0, so a warp is 32 consecutive threads
  i0, j0 = wi * (um * m), wj * (un * n)  # this warp's corner inside the workgroup's tile
  if stage:
    tid = (wi * wn + wj) * tc.threads + lane
    n_bufs = len([x for x in ast.toposort() if x.op is Ops.DEFINE_LOCAL])
    st_a, el_a = _stage(a, (i, gi * bm, bm), (k, k2 * kk, kk), tid, wm * wn * tc.threads, k2, f"temp{n_bufs}")
    st_b, el_b = _stage(b, (k, k2 * kk, kk), (j, gj * bn, bn), tid, wm * wn * tc.threads, k2, f"temp{n_bufs + 1}")
    bar = UOp(Ops.BARRIER, dtypes.void, tuple(st_a + st_b))
    def ea(r: UOp, c: UOp) -> UOp: return el_a(r, c, bar)
    def eb(r: UOp, c: UOp) -> UOp: return el_b(r, c, bar)
  else:
    def ea(r: UOp, c: UOp) -> UOp: return a.substitute({i: gi * bm + r, k: k2 * kk + c}, walk=True)
    def eb(r: UOp, c: UOp) -> UOp: return b.substitute({k: k2 * kk + r, j: gj * bn + c}, walk=True)
  def frag(op: str, el, r0: UOp, c0: UOp, dt) -> UOp:
    lay, ept = tc.layout(op), tc.elements_per_thread["abc".index(op)]
    return UOp(Ops.VECTORIZE, dt.vec(ept), tuple(el(r0 + _coord(lay, lane, e, 0), c0 + _coord(lay, lane, e, 1)) for e in range(ept)))
  fa = [frag("a", ea, i0 + u * m, _c(0), a.dtype) for u in range(um)]
  fb = [frag("b", eb, _c(0), j0 + v * n, b.dtype) for v in range(un)]
  ec = tc.elements_per_thread[2]
  zero = UOp(Ops.VECTORIZE, tc.dtype_out.vec(ec), (UOp.const(tc.dtype_out, 0.0),) * ec)
  if stage == 2: return _tc_staged_out(ast, tc, red, i, j, (gi, gj, i0, j0, lane, tid), (um, un, bm, bn, wm * wn * tc.threads), fa, fb, zero, k2)
  stores = []
  for st in ast.src:
    if red not in st.toposort(): raise ValueError(f"TC {tc.name}: a store of the kernel doesn't use the matmul")
    for u in range(um):
      for v in range(un):
        acc = UOp(Ops.REDUCE, tc.dtype_out.vec(ec), (UOp(Ops.WMMA, tc.dtype_out.vec(ec), (fa[u], fb[v], zero), tc.name), k2), Ops.ADD)
        sts = []
        for e in range(ec):
          sub = {red: UOp(Ops.GEP, tc.dtype_out, (acc,), (e,)), i: gi * bm + i0 + u * m + _coord(tc.c, lane, e, 0),
                 j: gj * bn + j0 + v * n + _coord(tc.c, lane, e, 1)}
          sts.append(st.substitute(sub, walk=True))
        stores += _vector_stores([graph_rewrite(x, pm_opt_symbolic, name="simplify TC store") for x in sts]) if stage else sts
  return UOp(Ops.SINK, dtypes.void, tuple(stores))


def _tc_staged_out(ast: UOp, tc: TensorCore, red: UOp, i: UOp, j: UOp, ids: tuple, sizes: tuple, fa: list, fb: list, zero: UOp,
                   k2: UOp) -> UOp:
  """TC stage 2: the kernel's one output goes through workgroup memory too. Every lane stores its C fragments' output
  values (epilogue applied) to a BM x BN local tile, a BARRIER, then the workgroup's threads write whole rows of it with
  vector stores of up to 16 bytes (for tensor cores whose C rows are narrower than a 32-byte sector: CUDA's m16n8)."""
  gi, gj, i0, j0, lane, tid = ids
  um, un, bm, bn, nthreads = sizes
  if len(ast.src) != 1 or len((st := ast.src[0]).src[0].src) != 2: raise ValueError("TC stage 2 needs one ungated output store")
  out_idx, val = st.src[0], st.src[1]
  if val.dtype.count != 1 or not _contiguous_in(j, out_idx.src[1]): raise ValueError("TC stage 2: the output isn't contiguous along its columns")
  n, m, _ = tc.dims
  ec = tc.elements_per_thread[2]
  n_bufs = len([x for x in ast.toposort() if x.op is Ops.DEFINE_LOCAL]) + 2
  cbuf = UOp(Ops.DEFINE_LOCAL, val.dtype.ptr(bm * bn, AddrSpace.LOCAL), arg=(f"temp{n_bufs}", bm * bn))
  local = []
  for u in range(um):
    for v in range(un):
      acc = UOp(Ops.REDUCE, tc.dtype_out.vec(ec), (UOp(Ops.WMMA, tc.dtype_out.vec(ec), (fa[u], fb[v], zero), tc.name), k2), Ops.ADD)
      for e in range(ec):
        r, c = i0 + u * m + _coord(tc.c, lane, e, 0), j0 + v * n + _coord(tc.c, lane, e, 1)
        x = val.substitute({red: UOp(Ops.GEP, tc.dtype_out, (acc,), (e,)), i: gi * bm + r, j: gj * bn + c}, walk=True)
        local.append(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, cbuf.dtype, (cbuf, r * bn + c)), x)))
  bar = UOp(Ops.BARRIER, dtypes.void, tuple(local))
  def gidx(f: UOp) -> UOp: return out_idx.src[1].substitute({i: gi * bm + f // bn, j: gj * bn + f % bn}, walk=True)
  vec = next((w for w in (16 // val.dtype.itemsize, 8, 4, 2) if w * val.dtype.itemsize <= 16 and bn % w == 0 and (bm * bn) % (w * nthreads) == 0
              and _aligned(gidx(tid * w), w)), 1)
  if (bm * bn) % (vec * nthreads): raise ValueError(f"TC stage 2: a {bm}x{bn} tile doesn't split over {nthreads} threads")
  stores = []
  for p in range((bm * bn) // (vec * nthreads)):
    f = (tid + p * nthreads) * vec
    ld = UOp(Ops.LOAD, val.dtype.vec(vec) if vec > 1 else val.dtype, (UOp(Ops.INDEX, cbuf.dtype, (cbuf, f)), bar))
    stores.append(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out_idx.dtype, (out_idx.src[0], gidx(f))), ld)))
  return UOp(Ops.SINK, dtypes.void, tuple(stores))


def _tc_opt(ast: UOp, rng: UOp | None, opt: Opt, caps: Capabilities | None) -> UOp:
  """TC: the amount is the index of the tensor core in `caps.tensor_cores`, `arg` the tile."""
  tcs = caps.tensor_cores if caps is not None else ()
  if not 0 <= opt.amount < len(tcs): raise ValueError(f"{opt}: the renderer has {len(tcs)} tensor cores")
  return graph_rewrite(_tc(ast, tcs[opt.amount], max(ranges_of(ast)) + 1, opt.arg), pm_opt_symbolic, name="simplify after TC")


def _threads(split: Callable[[UOp, UOp, int, int], UOp]) -> Callable[[UOp, UOp | None, Opt, Capabilities | None], UOp]:
  """The registered form of a thread split (LOCAL, GROUP, GROUPTOP, GROUPOUT): new ranges get ids past the kernel's."""
  def apply(ast: UOp, rng: UOp | None, opt: Opt, caps: Capabilities | None) -> UOp:
    assert rng is not None
    return graph_rewrite(split(ast, rng, opt.amount, max(ranges_of(ast)) + 1), pm_opt_symbolic, name=f"simplify after {opt.kind}")
  return apply


register(OptKind("LOCAL", _threads(_local), GLOBAL, device="gpu", min_amount=2, beam=thread_amounts))
register(OptKind("GROUP", _threads(lambda a, r, k, nid: _group(a, r, k, False, nid)), REDUCE, device="gpu", min_amount=2, beam=thread_amounts))
register(OptKind("GROUPTOP", _threads(lambda a, r, k, nid: _group(a, r, k, True, nid)), REDUCE, device="gpu", min_amount=2, beam=thread_amounts))
register(OptKind("GROUPOUT", _threads(_group_out), GLOBAL, device="gpu", min_amount=2))
register(OptKind("TC", _tc_opt, KERNEL, device="gpu"))


def _loads(ast: UOp) -> list[UOp]: return [n.src[0] for n in ast.toposort() if n.op is Ops.LOAD and n.src[0].src[0].op is Ops.DEFINE_GLOBAL]


def _contiguous_in(rng: UOp, idx: UOp) -> bool:
  """Whether consecutive values of `rng` read consecutive elements through `idx`."""
  if rng not in idx.toposort(): return False
  d = graph_rewrite(idx.substitute({rng: rng + 1}, walk=True) - idx, pm_symbolic, name="stride")
  return d.op is Ops.CONST and d.arg == 1


def _pow2_at_most(n: int) -> int: return 1 << (max(n, 1).bit_length() - 1)


def _size(r: UOp) -> int: return r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0].vmax


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
      _tc(ast, tc, max(ranges_of(ast)) + 1, (um, un, wm, wn, 2))
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
    if k >= warp and k * itemsize * len(top_reds) <= caps.shared_max:
      if not contiguous and glbl and _size(glbl[-1]) >= warp:  # threads on the contiguous output axis, each summing a chunk
        lk = min(warp, _pow2_at_most(_size(glbl[-1])))
        k = min(k, max_threads // lk, 16)
        return [Opt("LOCAL", glbl[-1].arg[0], lk)] + [Opt("GROUPTOP", r.arg[0], k) for r in cands]
      opts = [Opt("GROUP", r.arg[0], k) for r in cands]
      return _row_opts(ast, glbl, top_reds, k, opts, caps) if contiguous else opts
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
  loops = {r for n in cur.toposort() if n.op is Ops.REDUCE for r in n.src[1:] if r.src[0].op is Ops.CONST and 1 < r.src[0].arg <= 16}
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
