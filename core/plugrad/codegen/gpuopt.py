"""GPU optimizations of a kernel AST: workgroup threads (LOCAL), reductions split across a workgroup (GROUP, GROUPTOP,
GROUPOUT) and tensor cores (TC), the rewrites registered in codegen/optops.py (the heuristic that picks them, with
UPCAST/UNROLL from codegen/opt.py, is codegen/heuristic.py's `choose_gpu_opts`).

- `LOCAL` a global range r (size N) by k: `r -> r'*k + l` where `l` is a new RANGE of size k with kind "local" (a thread
  id inside the workgroup once codegen/gpudims.py runs). When k doesn't divide N, r' has ceil(N/k) iterations and every
  global memory access of the kernel is gated by `r'*k + l < N`. It only splits: copies marked before it stay pending.
- `GROUP` a reduce range R by k (`GROUPTOP`: the same, each thread taking a contiguous chunk): every REDUCE over R
  becomes a per-thread partial over `R = r'*k + l` (GROUPTOP: `R = l*ceil(N/k) + r'`) reduced across the group's
  thread range l: `REDUCE(REDUCE(x, r'), l)`. It only splits the range; codegen/group.py lowers that (local memory,
  barriers, a tree or serial combine, outputs stored by thread 0) in the expand pass after the copies are made (each
  copy's reduce with its own local buffer). Elements past N (k not dividing N) contribute the reduce identity and are
  never loaded. GROUP applies to every REDUCE that runs in no other reduce's loop (a barrier inside a loop would need
  a second one), after all LOCALs; a second GROUP (e.g. softmax's sum after its max) reuses the same k threads with
  its own local buffer.
- `GROUPOUT` a global range by k, before the GROUPs: the group's k threads compute that output axis (row kernels such
  as the scheduler's one-kernel softmax: one workgroup per row reduces the row and writes it). It only splits the range
  (a range of copies for the expand pass, codegen/expand.py).
- `TC` a matmul on tensor cores (`Opt.arg` = tile: accumulators per warp, warps per workgroup, A/B staged in shared
  memory; see `_tc_tile`, `heuristic.tc_tile` and docs/kernel_ir.md). It checks the kernel fits (`tc_fit`) and retypes the
  matmul's reduce range `(id, "reduce", "tc", tensor core, tile)`; the pipeline's "tensor cores" pass, after the expand
  pass, lowers it (`lower_tensor_cores`: warps, fragments, shared-memory staging, WMMAs). TC is the last Opt.

Every kind here only splits or retypes ranges; the expand pass and the tensor-core pass lower what they mark.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from plugrad.codegen.facts import contiguous, div_end, in_loop, ranges_of, tc_match
from plugrad.codegen.accumulate import reduce_identity
from plugrad.codegen.expand import copy_range, expand, pm_flatten_stores, pm_opt_symbolic, simplify, store_group
from plugrad.codegen.group import is_group_lane
from plugrad.codegen.optops import GLOBAL, KERNEL, REDUCE, Opt, OptKind, is_tc_range, register, thread_amounts
from plugrad.codegen.tc import TensorCore
from plugrad.dtype import AddrSpace, dtypes
from plugrad.runtime.renderer import Capabilities
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import pm_symbolic
from plugrad.uop.upat import PatternMatcher, UPat


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


def _grouped(ast: UOp) -> bool:
  """Whether a GROUP/GROUPTOP already applied to `ast` (its thread range pending, or lowered into local memory)."""
  return any(n.op is Ops.DEFINE_LOCAL or is_group_lane(n) for n in ast.toposort())


def _local(ast: UOp, rng: UOp, k: int, nid: int) -> UOp:
  if _grouped(ast): raise ValueError("LOCAL must come before GROUP")
  outer, exact = _padded_outer(rng, k)
  new = outer * k + UOp(Ops.RANGE, dtypes.index, (_c(k),), (nid, "local"))
  ast = ast.substitute({rng: new}, walk=True)
  return ast if exact else gate_globals(ast, new < rng.src[0])


def _group_out(ast: UOp, rng: UOp, k: int, nid: int) -> UOp:
  """GROUPOUT: global range `rng` (size N) computed by the k threads of the workgroup's group instead of by more
  workgroups: `rng` becomes `l + j*k` (l the group thread, shared with later GROUPs; j a range of ceil(N/k) copies the
  expand pass makes of every store using it), the accesses past N gated off. A row kernel (softmax: reduce the row, then write it) then has one
  workgroup per row whose threads write the row from the values they reduced."""
  if rng.arg[1] != "global" or len(rng.arg) > 2 or rng.src[0].op is not Ops.CONST:
    raise ValueError(f"GROUPOUT needs a global range of constant size, range {rng.arg} isn't one")
  if _grouped(ast): raise ValueError("GROUPOUT must come before GROUP")
  lcl = [r for r in ranges_of(ast).values() if r.arg[1] == "local"]
  if lcl: raise ValueError(f"GROUPOUT of range {rng.arg}: the kernel already has thread ranges {[r.arg for r in lcl]}")
  n, copies = rng.src[0].arg, -(-rng.src[0].arg // k)
  lane = UOp(Ops.RANGE, dtypes.index, (_c(k),), (nid, "local", "group"))
  at = lane + copy_range(ast, rng, copies, "upcast") * k if copies > 1 else lane   # the expand pass makes the copies
  ast = ast.substitute({rng: at}, walk=True)
  # past N: each copy's own accesses gated (not the reductions' loads it reads, which don't use the thread id yet); the
  # simplifier folds the gate of every copy but the last to true
  return ast if n % k == 0 else UOp(Ops.SINK, dtypes.void, tuple(gate_globals(st, at < n, lane) if lane in st.toposort() else st for st in ast.src))


def _group(ast: UOp, rng: UOp, k: int, top: bool, nid: int) -> UOp:
  """GROUP (GROUPTOP: `top`) of reduce range `rng` by k: every REDUCE over it becomes a per-thread partial over
  `rng = inner*k + lane` (GROUPTOP: `lane*ceil(N/k) + inner`) reduced across the group's threads,
  `REDUCE(REDUCE(x, inner, ...), lane)`; codegen/group.py lowers that into local memory and barriers."""
  reds = [n for n in ast.toposort() if n.op is Ops.REDUCE and rng in n.src[1:]]
  if not reds: raise ValueError(f"no REDUCE uses range {rng.arg}")
  if any(r in in_loop(ast) for r in reds): raise ValueError(f"GROUP of range {rng.arg}: its REDUCE runs inside another reduce's loop")
  grp = [r for r in ranges_of(ast).values() if is_group_lane(r)]  # a second GROUP reuses the workgroup's reduce threads
  if grp and grp[0].src[0].arg != k: raise ValueError(f"GROUP by {k}: the kernel already reduces across {grp[0].src[0].arg} threads")
  lane = grp[0] if grp else UOp(Ops.RANGE, dtypes.index, (_c(k),), (nid, "local", "group"))
  n = rng.src[0]
  exact = (q := div_end(n, k)) is not None
  chunk = q if q is not None else graph_rewrite((n + (k - 1)) // k, pm_symbolic, name="chunk")
  subs, fresh = {}, nid + 1
  for red in sorted(reds, key=lambda r: len(r.toposort())):
    inner = UOp(Ops.RANGE, dtypes.index, (chunk,), (fresh, "reduce"))
    fresh += 2   # the ids as before, when the combine loop took the second: later ranges keep theirs
    idx = lane * chunk + inner if top else inner * k + lane
    body = red.src[0].substitute({**subs, rng: idx}, walk=True)
    if not exact:
      valid = idx < n
      # only this reduce's own loads: a GROUPed reduce used inside this one (softmax's max in its sum) keeps its gates
      body = valid.where(gate_globals(body, valid, inner), UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)))
    partial = UOp(Ops.REDUCE, red.dtype, (body, inner, *(r for r in red.src[1:] if r is not rng)), red.arg)
    subs[red] = UOp(Ops.REDUCE, red.dtype, (partial, lane), red.arg)
  return ast.substitute(subs, walk=True)


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
  along_rows = ld is not None and not contiguous(ld.src[0].src[1], ci) and contiguous(ld.src[0].src[1], ri)
  inner = tr if along_rows else tcc  # the tile dim that is contiguous in memory (and in the local layout)
  def flat(r: UOp, c: UOp) -> UOp: return c * tr + r if along_rows else r * tcc + c
  def rc(f: UOp) -> tuple[UOp, UOp]: return (f % tr, f // tr) if along_rows else (f // tcc, f % tcc)
  size = tr * tcc
  assert size % nthreads == 0, "tc_fit checks the tiles split over the threads"
  vec = 1
  if ld is not None and (along_rows or contiguous(ld.src[0].src[1], ci)):
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


def tc_fit(ast: UOp, tc: TensorCore, tile: tuple[int, ...] = ()) -> tuple[tuple[int, ...], tuple[UOp, ...]]:
  """The full tile (um, un, wm, wn, stage) and the matched matmul (red, a, b, i, j, k) when `ast`'s matmul fits tensor
  core `tc` with `tile`; ValueError naming what doesn't fit otherwise (every condition the lowering relies on, so an Opt is refused
  when it applies, not when the tensor-core pass lowers it)."""
  if len(tile) > 5 or any(not isinstance(t, int) or t < 0 for t in tile): raise ValueError(f"TC tile {tile}: expected up to 5 non-negative ints")
  um, un, wm, wn, stage = tuple(tile) + TC_TILE_DEFAULT[len(tile):]
  if min(um, un, wm, wn) < 1 or stage not in (0, 1, 2): raise ValueError(f"TC tile {tile}: sizes must be >= 1 and stage 0, 1 or 2")
  if (mt := tc_match(ast, tc)) is None: raise ValueError(f"TC {tc.name}: no matmul-like reduce with {tc.dtype_in} inputs fits its tiles")
  red, _, _, i, j, _ = mt
  n, m, kk = tc.dims
  bm, bn, nthreads = m * um * wm, n * un * wn, wm * wn * tc.threads
  if i.src[0].arg % bm or j.src[0].arg % bn: raise ValueError(f"TC tile {tile}: {bm}x{bn} doesn't divide the {i.src[0].arg}x{j.src[0].arg} output")
  if any(r.arg[1] == "local" for r in ranges_of(ast).values()): raise ValueError("TC must come before LOCAL")
  if nthreads > 1024: raise ValueError(f"TC tile {tile}: {wm * wn} warps of {tc.threads} lanes is too many threads")
  if stage and ((bm * kk) % nthreads or (kk * bn) % nthreads):
    raise ValueError(f"TC staging: a {bm}x{kk} or {kk}x{bn} tile doesn't split over {nthreads} threads")
  if stage == 2:
    if len(ast.src) != 1 or len((st := ast.src[0]).src[0].src) != 2: raise ValueError("TC stage 2 needs one ungated output store")
    if st.src[1].dtype.count != 1 or not contiguous(st.src[0].src[1], j):
      raise ValueError("TC stage 2: the output isn't contiguous along its columns")
    if (bm * bn) % nthreads: raise ValueError(f"TC stage 2: a {bm}x{bn} tile doesn't split over {nthreads} threads")
  elif any(red not in st.toposort() for st in ast.src): raise ValueError(f"TC {tc.name}: a store of the kernel doesn't use the matmul")
  return (um, un, wm, wn, stage), mt


@dataclass(frozen=True)
class _TCTile:
  """What the tensor-core rules share for one matmul: the tensor core, the matmul's reduce and output ranges, the
  tile's sizes (um x un tensor-core tiles a warp, wm x wn warps, `bm` x `bn` a workgroup, `stage`), its ranges and
  ids (workgroup gi/gj, K step k2, the warp's corner i0/j0, lane, thread id) and the warps' A and B fragments."""
  tc: TensorCore
  red: UOp
  i: UOp
  j: UOp
  sizes: tuple[int, int, int, int, int, int]   # um, un, bm, bn, threads a workgroup, stage
  ids: tuple[UOp, ...]                         # gi, gj, i0, j0, lane, tid, k2
  fa: tuple[UOp, ...]
  fb: tuple[UOp, ...]

  def acc(self, u: int, v: int) -> UOp:
    """The accumulator of the warp's tile (u, v): its WMMAs summed over the K steps."""
    ec = self.tc.elements_per_thread[2]
    zero = UOp(Ops.VECTORIZE, self.tc.dtype_out.vec(ec), (UOp.const(self.tc.dtype_out, 0.0),) * ec)
    wmma = UOp(Ops.WMMA, zero.dtype, (self.fa[u], self.fb[v], zero), self.tc.name)
    return UOp(Ops.REDUCE, zero.dtype, (wmma, self.ids[6]), Ops.ADD)

  def element(self, u: int, v: int, e: int) -> tuple[UOp, UOp, dict[UOp, UOp]]:
    """Row and column (inside the workgroup's tile) of element e of lane's C fragment of tile (u, v), and the
    substitution that makes an expression of the matmul's output that element's."""
    (n, m, _), (gi, gj, i0, j0, lane), (_, _, bm, bn) = self.tc.dims, self.ids[:5], self.sizes[:4]
    r, c = i0 + u * m + _coord(self.tc.c, lane, e, 0), j0 + v * n + _coord(self.tc.c, lane, e, 1)
    return r, c, {self.red: UOp(Ops.GEP, self.tc.dtype_out, (self.acc(u, v),), (e,)), self.i: gi * bm + r, self.j: gj * bn + c}


def _tc_tile(ast: UOp, tc: TensorCore, nid: int, tile: tuple[int, ...] = ()) -> _TCTile:
  """The tile of `ast`'s matmul on tensor core `tc` with tile (um, un, wm, wn, stage): each warp computes um x un
  tensor-core tiles (um*un accumulators sharing its A and B fragments), wm x wn warps per workgroup (LOCAL), and with
  stage >= 1 the workgroup's A and B tiles of each K step pass through workgroup memory (DEFINE_LOCAL + BARRIER) so
  that its warps share one coalesced, vectorized load of them."""
  (um, un, wm, wn, stage), (red, a, b, i, j, k) = tc_fit(ast, tc, tile)
  n, m, kk = tc.dims
  bm, bn = m * um * wm, n * un * wn
  gi, gj, k2 = (UOp(Ops.RANGE, dtypes.index, (_c(r.src[0].arg // d),), r.arg) for r, d in ((i, bm), (j, bn), (k, kk)))
  wi = UOp(Ops.RANGE, dtypes.index, (_c(wm),), (nid, "local")) if wm > 1 else _c(0)
  wj = UOp(Ops.RANGE, dtypes.index, (_c(wn),), (nid + 1, "local")) if wn > 1 else _c(0)
  lane = UOp(Ops.RANGE, dtypes.index, (_c(tc.threads),), (nid + 2, "local"))  # the highest id: lidx0, so a warp is 32 consecutive threads
  i0, j0 = wi * (um * m), wj * (un * n)  # this warp's corner inside the workgroup's tile
  tid = (wi * wn + wj) * tc.threads + lane
  if stage:
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
  fa = tuple(frag("a", ea, i0 + u * m, _c(0), a.dtype) for u in range(um))
  fb = tuple(frag("b", eb, _c(0), j0 + v * n, b.dtype) for v in range(un))
  return _TCTile(tc, red, i, j, (um, un, bm, bn, wm * wn * tc.threads, stage), (gi, gj, i0, j0, lane, tid, k2), fa, fb)


def _tc_store(ctx: _TCTile, st: UOp) -> UOp | None:
  """A STORE of the matmul's output (stage 0 and 1): one store per element of each C fragment of the warp's tiles,
  the output expression evaluated there; with stage 1, consecutive aligned ones as vector stores."""
  um, un, *_, stage = ctx.sizes
  if stage == 2: return None
  out = []
  for u in range(um):
    for v in range(un):
      sts = [st.substitute(ctx.element(u, v, e)[2], walk=True) for e in range(ctx.tc.elements_per_thread[2])]
      out += _vector_stores([graph_rewrite(x, pm_opt_symbolic, name="simplify TC store") for x in sts]) if stage else sts
  return store_group(out)


def _tc_staged_out(ctx: _TCTile, s: UOp) -> UOp | None:
  """TC stage 2: the kernel's one output goes through workgroup memory too. Every lane stores its C fragments' output
  values (epilogue applied) to a BM x BN local tile, a BARRIER, then the workgroup's threads write whole rows of it with
  vector stores of up to 16 bytes (for tensor cores whose C rows are narrower than a 32-byte sector: CUDA's m16n8)."""
  um, un, bm, bn, nthreads, stage = ctx.sizes
  if stage != 2: return None
  out_idx, val = s.src[0].src[0], s.src[0].src[1]   # (tc_fit checked: one ungated store, contiguous along j)
  gi, gj, tid = ctx.ids[0], ctx.ids[1], ctx.ids[5]
  n_bufs = len([x for x in s.toposort() if x.op is Ops.DEFINE_LOCAL]) + 2
  cbuf = UOp(Ops.DEFINE_LOCAL, val.dtype.ptr(bm * bn, AddrSpace.LOCAL), arg=(f"temp{n_bufs}", bm * bn))
  local = []
  for u in range(um):
    for v in range(un):
      for e in range(ctx.tc.elements_per_thread[2]):
        r, c, sub = ctx.element(u, v, e)
        local.append(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, cbuf.dtype, (cbuf, r * bn + c)), val.substitute(sub, walk=True))))
  bar = UOp(Ops.BARRIER, dtypes.void, tuple(local))
  def gidx(f: UOp) -> UOp: return out_idx.src[1].substitute({ctx.i: gi * bm + f // bn, ctx.j: gj * bn + f % bn}, walk=True)
  vec = next((w for w in (16 // val.dtype.itemsize, 8, 4, 2) if w * val.dtype.itemsize <= 16 and bn % w == 0 and (bm * bn) % (w * nthreads) == 0
              and _aligned(gidx(tid * w), w)), 1)
  stores = []
  for p in range((bm * bn) // (vec * nthreads)):
    f = (tid + p * nthreads) * vec
    ld = UOp(Ops.LOAD, val.dtype.vec(vec) if vec > 1 else val.dtype, (UOp(Ops.INDEX, cbuf.dtype, (cbuf, f)), bar))
    stores.append(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out_idx.dtype, (out_idx.src[0], gidx(f))), ld)))
  return s.replace(src=tuple(stores))


# pre-order, on the kernel as it came in (walk: what a rule returns is final): stage 2 rewrites the SINK (its one store)
pm_tensor_cores = PatternMatcher([(UPat(Ops.SINK, name="s"), _tc_staged_out), (UPat(Ops.STORE, name="st"), _tc_store)])


def _tc_opt(ast: UOp, rng: UOp | None, opt: Opt, caps: Capabilities | None) -> UOp:
  """TC: the amount is the index of the tensor core in `caps.tensor_cores`, `arg` the tile. It only retypes the
  matmul's reduce range, `(id, "reduce", "tc", tensor core, tile)`, once the kernel is checked to fit (with the copies
  marked before it made, as the tensor-core pass will see it); `lower_tensor_cores` lowers it. TC is the last Opt."""
  tcs = caps.tensor_cores if caps is not None else ()
  if not 0 <= opt.amount < len(tcs): raise ValueError(f"{opt}: the renderer has {len(tcs)} tensor cores")
  tile, (*_, k) = tc_fit(expand(ast), tcs[opt.amount], opt.arg)
  return ast.substitute({k: k.replace(arg=(*k.arg[:2], "tc", tcs[opt.amount], tile))}, walk=True)


def lower_tensor_cores(ast: UOp) -> UOp:
  """The tensor-core pass: the matmul whose reduce range TC marked on its tensor core (`_tc_tile`: warps, fragments,
  shared-memory staging; `pm_tensor_cores`: each output store by its fragments' WMMA results), simplified; `ast`
  itself when nothing is marked."""
  if (k := next((r for r in ast.toposort() if is_tc_range(r)), None)) is None: return ast
  ast = ast.substitute({k: k.replace(arg=k.arg[:2])}, walk=True)
  tile = _tc_tile(ast, k.arg[3], max(ranges_of(ast)) + 1, k.arg[4])
  return simplify(graph_rewrite(ast, pm_flatten_stores, ctx=tile, bpm=pm_tensor_cores, walk=True, name="tensor cores"), "simplify after TC")


def _threads(split: Callable[[UOp, UOp, int, int], UOp]) -> Callable[[UOp, UOp | None, Opt, Capabilities | None], UOp]:
  """The registered form of a thread split (LOCAL, GROUP, GROUPTOP, GROUPOUT): new ranges get ids past the kernel's.
  Each only splits; pending copy marks stay pending."""
  def apply(ast: UOp, rng: UOp | None, opt: Opt, caps: Capabilities | None) -> UOp:
    assert rng is not None
    return simplify(split(ast, rng, opt.amount, max(ranges_of(ast)) + 1), f"simplify after {opt.kind}")
  return apply


register(OptKind("LOCAL", _threads(_local), GLOBAL, device="gpu", min_amount=2, beam=thread_amounts))
register(OptKind("GROUP", _threads(lambda a, r, k, nid: _group(a, r, k, False, nid)), REDUCE, device="gpu", min_amount=2,
                 beam=thread_amounts))
register(OptKind("GROUPTOP", _threads(lambda a, r, k, nid: _group(a, r, k, True, nid)), REDUCE, device="gpu", min_amount=2,
                 beam=thread_amounts))
register(OptKind("GROUPOUT", _threads(_group_out), GLOBAL, device="gpu", min_amount=2))
register(OptKind("TC", _tc_opt, KERNEL, device="gpu"))


