"""GPU codegen on the emulated GPU (EMULATE targets on the PYTHON device): gpudims (limits, merging, splitting,
symbolic sizes), each GPU optimization (kernel AST and values against numpy), the emulator's warp/barrier semantics
and the tensor-core lane layouts."""
from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import numpy as np
import pytest

from plugrad import Tensor, Variable
from plugrad.codegen import get_program
from plugrad.codegen.heuristic import choose_gpu_opts
from plugrad.codegen.expand import expand, is_copy_range
from plugrad.codegen.group import is_grouped
from plugrad.codegen.optops import apply_opt
from plugrad.codegen.opt import Opt, ranges_of
from plugrad.codegen.targets import TARGETS
from plugrad.dtype import AddrSpace, dtypes
from plugrad.device import Device
from plugrad.engine.realize import buffer_for, run_schedule
from plugrad.runtime.renderer import Capabilities
from plugrad.schedule import kernelize
from plugrad.plugins.python import GPU_COUNTERS, BarrierError, PythonDevice, PythonProgram, PythonRenderer, reset_gpu_counters
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.symbolic import sym_infer
from plugrad.viz import capture

RNG = np.random.default_rng(0)


def emu_device(monkeypatch: pytest.MonkeyPatch, target: str = "CUDA", **caps) -> PythonDevice:
  """A fresh PYTHON device emulating `target`, with capabilities overridden by `caps`."""
  monkeypatch.setenv("EMULATE", target)
  dev = PythonDevice("PYTHON")
  monkeypatch.delenv("EMULATE")
  dev.renderer.caps = dataclasses.replace(dev.renderer.caps, **caps)
  return dev


def run_emulated(t: Tensor, dev: PythonDevice, opts: list[Opt] | None = None, var_vals: dict | None = None):
  """Compute the last kernel of `t` (a PYTHON tensor) with `dev`'s codegen and emulator: (result, ProgramSpec)."""
  items = t.schedule()
  for it in items[:-1]:  # earlier kernels (e.g. the first stage of a big reduce) on the emulator too
    if it.ast.op is Ops.COPY: run_schedule([it])
    else: _run_item(it, dev, None, var_vals)
  return _run_item(items[-1], dev, opts, var_vals)


def _run_item(it, dev: PythonDevice, opts: list[Opt] | None, var_vals: dict | None):
  bufs = [buffer_for(b).ensure_allocated() for b in it.bufs]
  ast = it.ast
  if opts is not None:
    for o in opts: ast = apply_opt(ast, o, dev.renderer.caps)
  spec = get_program(ast, dev.renderer) if opts is None else _program_noopt(ast, dev.renderer)
  prg = PythonProgram(dev, spec.name, dev.compiler.compile(spec.src))
  vv = {v.arg[0]: x for v, x in it.var_vals.items()} if var_vals is None else var_vals
  glb, lcl = spec.launch_dims(vv)
  prg(*[b._buf for b in bufs], global_size=glb, local_size=lcl, vals=tuple(vv[v.arg[0]] for v in spec.vars))
  return bufs[0].numpy(), spec


def _program_noopt(ast: UOp, renderer):
  mp = pytest.MonkeyPatch()
  mp.setenv("NOOPT", "1")
  try: return get_program(ast, renderer)
  finally: mp.undo()


def ops_of(spec) -> set[Ops]: return {u.op for u in spec.uops}


def specials(spec) -> dict[str, UOp]: return {u.arg: u for u in spec.uops if u.op is Ops.SPECIAL}


def t_(a: np.ndarray) -> Tensor: return Tensor(a, device="PYTHON")


# ----- gpudims
def test_dims_merge_when_more_ranges_than_hardware_dims(monkeypatch):
  a = RNG.random((3, 5, 7, 11)).astype(np.float32)
  out, spec = run_emulated(t_(a) * 2 + 1, emu_device(monkeypatch), opts=[])
  np.testing.assert_array_equal(out.reshape(a.shape), a * 2 + 1)
  assert set(specials(spec)) == {"gidx0", "gidx1", "gidx2"} and spec.local_size == [1, 1, 1]
  assert spec.global_size == [11, 7, 15]  # innermost on dim 0, the two outermost merged on dim 2


@pytest.mark.parametrize("n,want", [(40, [8, 5, 1]), (37, [8, 5, 1])])
def test_dims_split_over_a_limit(monkeypatch, n: int, want: list[int]):
  a = RNG.random(n).astype(np.float32)
  out, spec = run_emulated(t_(a) + 3, emu_device(monkeypatch, global_max=(8, 8, 8)), opts=[])
  np.testing.assert_array_equal(out, a + 3)
  assert spec.global_size == want
  gated = any(u.op is Ops.INDEX and len(u.src) == 3 for u in spec.uops)
  assert gated == (n % 8 != 0)  # 37 = 8*5 rounded up: the extra threads are gated off


def test_dims_that_cannot_fit_raise(monkeypatch):
  with pytest.raises(ValueError, match="limit"):
    run_emulated(t_(np.zeros((9, 9, 9, 9), np.float32)) + 1, emu_device(monkeypatch, global_max=(9, 9, 9)), opts=[])


def test_symbolic_launch_size(monkeypatch):
  v = Variable("n", 1, 1000)
  x = RNG.random(1000).astype(np.float32)
  dev = emu_device(monkeypatch)
  for n in (5, 333, 1000):
    out, spec = run_emulated(t_(x)[:v.bind(n)] * 2, dev)
    np.testing.assert_allclose(out[:n], x[:n] * 2)
    assert any(isinstance(g, UOp) for g in spec.global_size)  # workgroups depend on n
    assert spec.launch_dims({"n": n})[0][0] * spec.local_size[0] >= n


def test_local_threads_limit(monkeypatch):
  dev = emu_device(monkeypatch, local_max_threads=64)
  with pytest.raises(ValueError, match="threads per group"):
    run_emulated(t_(np.zeros((16, 16), np.float32)) + 1, dev, opts=[Opt("LOCAL", 0, 16), Opt("LOCAL", 1, 16)])


def test_cpu_renderer_keeps_loops():
  from plugrad.device import Device
  spec = get_program((Tensor.ones(8, 8).contiguous() + 1).schedule(optimize=False)[-1].ast, Device["CPU"].renderer)
  assert spec.local_size is None and spec.global_size == [1, 1, 1] and Ops.SPECIAL not in ops_of(spec)


# ----- opts
@pytest.mark.parametrize("n,k", [(64, 16), (37, 16)])
def test_local(monkeypatch, n: int, k: int):
  a = RNG.random((3, n)).astype(np.float32)
  out, spec = run_emulated(t_(a).exp2(), emu_device(monkeypatch), opts=[Opt("LOCAL", 1, k)])
  np.testing.assert_allclose(out.reshape(3, n), np.exp2(a), rtol=1e-6)
  assert spec.local_size == [k, 1, 1] and spec.global_size[0] == -(-n // k)


def test_local_only_splits_and_leaves_earlier_marks_pending(monkeypatch):
  """LOCAL splits a global range into workgroups and threads (the partial last workgroup's accesses gated) and nothing
  more: an UPCAST marked before it stays a pending range of copies for the expand pass (LOCAL made the copies first
  before). Values on the emulator."""
  a = RNG.random((12, 37)).astype(np.float32)
  ast = t_(a).exp2().schedule(optimize=False)[-1].ast
  rows, cols = sorted((r for r in ranges_of(ast).values() if r.arg[1] == "global"), key=lambda r: r.arg[0])
  opts = [Opt("UPCAST", rows.arg[0], 4), Opt("LOCAL", cols.arg[0], 16)]
  split = functools.reduce(lambda x, o: apply_opt(x, o), opts, ast)
  assert any(is_copy_range(n) for n in split.toposort()) and any(r.arg[1] == "local" for r in ranges_of(split).values())
  out, spec = run_emulated(t_(a).exp2(), emu_device(monkeypatch), opts=opts)
  np.testing.assert_allclose(out.reshape(12, 37), np.exp2(a), rtol=1e-6)
  assert spec.local_size == [16, 1, 1]


def _conv_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """A stride-1, padding-1 convolution in float64 (NCHW, OIHW)."""
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))   # N C H W kh kw
  return np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64))


def test_partial_workgroup_padding_selects_fold_into_gated_loads(monkeypatch):
  """A padded 3x3 convolution whose 28 columns run on 32 threads (LOCAL): each tap's padding select
  `where(x < 29 & ..., load, 0)` wraps a load the partial workgroup's gate `x < 28 & ...` already gates, so the select
  is the load (a gated load is 0 where its gate is false). With LOCAL applied after the taps are unrolled the
  simplifier folded `x < 29` (x < 28 as a range); a LOCAL that only splits its range leaves the bound to the gate.
  No such select remains in the kernel; values against numpy."""
  from plugrad.codegen.expand import _implies
  x, w = RNG.standard_normal((1, 4, 28, 28)).astype(np.float32), RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
  t = t_(x).conv2d(t_(w), padding=1)
  ast = t.schedule(optimize=False)[-1].ast
  dev = emu_device(monkeypatch)
  opts = choose_gpu_opts(ast, dev.renderer.caps)
  assert any(o.kind == "LOCAL" and o.amount == 32 for o in opts), opts   # 28 columns on 32 threads: a partial workgroup
  out, spec = run_emulated(t, dev, opts=opts)
  np.testing.assert_allclose(out.reshape(1, 8, 28, 28), _conv_ref(x, w), rtol=1e-4, atol=1e-4)
  def redundant(u: UOp) -> bool:
    ld = u.src[1] if u.op is Ops.WHERE else None
    return ld is not None and ld.op is Ops.LOAD and len(ld.src[0].src) == 3 and _implies(ld.src[0].src[2], u.src[0]) \
      and u.src[2].op is Ops.CONST and u.src[2].arg == 0
  assert not any(map(redundant, spec.uops))


@pytest.mark.parametrize("kind", ["GROUP", "GROUPTOP"])
@pytest.mark.parametrize("n,k", [(256, 16), (300, 32), (100, 12)])
def test_group_reduce(monkeypatch, kind: str, n: int, k: int):
  a = RNG.random((5, n)).astype(np.float32)
  t = t_(a).sum(1)
  rid = next(r for r in ranges_of(t.schedule(optimize=False)[-1].ast).values() if r.arg[1] == "reduce").arg[0]
  out, spec = run_emulated(t, emu_device(monkeypatch), opts=[Opt(kind, rid, k)])
  np.testing.assert_allclose(out, a.sum(1), rtol=1e-5)
  assert {Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.SPECIAL} <= ops_of(spec) and spec.local_size == [k, 1, 1]
  loc = next(u for u in spec.uops if u.op is Ops.DEFINE_LOCAL)
  assert loc.dtype.addrspace is AddrSpace.LOCAL and loc.dtype.size == k


def test_group_max_and_local(monkeypatch):
  a = RNG.standard_normal((8, 128)).astype(np.float32)
  t = t_(a).max(0)
  rngs = ranges_of(t.schedule(optimize=False)[-1].ast)
  g = next(r for r in rngs.values() if r.arg[1] == "global").arg[0]
  r = next(r for r in rngs.values() if r.arg[1] == "reduce").arg[0]
  out, spec = run_emulated(t, emu_device(monkeypatch), opts=[Opt("LOCAL", g, 32), Opt("GROUPTOP", r, 4)])
  np.testing.assert_array_equal(out, a.max(0))
  assert spec.local_size == [32, 4, 1] or spec.local_size == [4, 32, 1]


def test_bad_opts_raise(monkeypatch):
  ast = t_(np.zeros((4, 64), np.float32)).sum(1).schedule(optimize=False)[-1].ast
  g = next(r for r in ranges_of(ast).values() if r.arg[1] == "global").arg[0]
  with pytest.raises(ValueError, match="reduce range"): apply_opt(ast, Opt("GROUP", g, 4))
  r = next(r for r in ranges_of(ast).values() if r.arg[1] == "reduce").arg[0]
  with pytest.raises(ValueError, match="before GROUP"): apply_opt(apply_opt(ast, Opt("GROUP", r, 4)), Opt("LOCAL", g, 2))


@pytest.mark.parametrize("target", ["CUDA", "AMD", "AMD_CDNA3"])
def test_heuristic_sum_rows(monkeypatch, target: str):
  dev = emu_device(monkeypatch, target)
  a = RNG.random((64, 1024)).astype(np.float32)
  out, spec = run_emulated(t_(a).sum(1), dev)
  np.testing.assert_allclose(out, a.sum(1), rtol=1e-5)
  assert {Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER} <= ops_of(spec) and spec.local_size is not None


def test_acceptance_big_sums_have_group_reduce(monkeypatch):
  """Tensor.rand(4096, 1024).sum(1) (program only: running 4M elements in Python is too slow) and a full 2**20 sum (run)."""
  dev = emu_device(monkeypatch)
  spec = get_program(Tensor.empty(4096, 1024, device="PYTHON").sum(1).schedule(optimize=False)[-1].ast, dev.renderer)
  assert {Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER} <= ops_of(spec) and spec.local_size == [256, 1, 1] and spec.global_size == [4096, 1, 1]
  a = RNG.random(2**20).astype(np.float32)
  reset_gpu_counters()
  out, spec = run_emulated(t_(a).sum(), dev)
  assert {Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER} <= ops_of(spec) and spec.local_size == [256, 1, 1]
  np.testing.assert_allclose(out[0], a.astype(np.float64).sum(), rtol=1e-4)
  assert GPU_COUNTERS["global_load_bytes"] >= 4 * 2**20 and GPU_COUNTERS["global_load_sectors"] * 32 == GPU_COUNTERS["global_load_bytes"]  # coalesced


def test_heuristic_elementwise_uses_threads(monkeypatch):
  opts = choose_gpu_opts((Tensor.empty(100, 300, device="PYTHON") + 1).schedule(optimize=False)[-1].ast, emu_device(monkeypatch).renderer.caps)
  assert opts and all(o.kind == "LOCAL" for o in opts)


# ----- the emulator's lanes and barriers (hand-written programs)
def _i(x: int) -> UOp: return UOp.const(dtypes.int32, x)


def _exchange_program(barrier: bool, threads: int = 64) -> list[UOp]:
  """local[l] = l; (BARRIER;) out[l] = local[(l + 32) % threads]: a read of another warp's store."""
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(threads), arg=0)
  loc = UOp(Ops.DEFINE_LOCAL, dtypes.int32.ptr(threads, AddrSpace.LOCAL), arg=("temp0", threads))
  lid = UOp(Ops.SPECIAL, dtypes.int32, (_i(threads),), "lidx0")
  st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, loc.dtype, (loc, lid)), lid))
  dep = UOp(Ops.BARRIER, dtypes.void, (st,)) if barrier else st
  other = UOp(Ops.MOD, dtypes.int32, (UOp(Ops.ADD, dtypes.int32, (lid, _i(32))), _i(threads)))
  ld = UOp(Ops.LOAD, dtypes.int32, (UOp(Ops.INDEX, loc.dtype, (loc, other)), dep))
  fin = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, lid)), ld))
  return [u for u in fin.toposort()]


def _run_uops(monkeypatch, uops: list[UOp], n_out: int, local: tuple[int, int, int]) -> np.ndarray:
  dev = emu_device(monkeypatch)
  uops = sorted(uops, key=lambda u: u.op is not Ops.DEFINE_GLOBAL)  # parameters first, the rest in order
  src = PythonRenderer.render(dev.renderer, "k", uops)
  prg = PythonProgram(dev, "k", dev.compiler.compile(src))
  buf = memoryview(bytearray(4 * n_out))
  prg(buf, global_size=(1, 1, 1), local_size=local)
  return np.frombuffer(buf, np.int32).copy()


def test_warps_run_separately_between_barriers(monkeypatch):
  want = (np.arange(64) + 32) % 64
  np.testing.assert_array_equal(_run_uops(monkeypatch, _exchange_program(True), 64, (64, 1, 1)), want)
  racy = _run_uops(monkeypatch, _exchange_program(False), 64, (64, 1, 1))  # warp 0 reads warp 1's slots before it ran
  np.testing.assert_array_equal(racy, np.concatenate([np.zeros(32, np.int32), np.arange(32)]))


def test_barrier_in_divergent_branch_is_an_error(monkeypatch):
  lid = UOp(Ops.SPECIAL, dtypes.int32, (_i(64),), "lidx0")
  cond = UOp(Ops.CMPLT, dtypes.bool, (lid, _i(40)))
  iff = UOp(Ops.IF, dtypes.void, (cond,))
  bar = UOp(Ops.BARRIER, dtypes.void, ())
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(1), arg=0)
  uops = [out, _i(64), lid, _i(40), cond, iff, bar, UOp(Ops.ENDIF, dtypes.void, (iff,))]
  with pytest.raises(BarrierError, match="part of"): _run_uops(monkeypatch, uops, 1, (64, 1, 1))


def test_launch_must_match_the_kernel_ids(monkeypatch):
  with pytest.raises(RuntimeError, match="lidx0 has size 64"): _run_uops(monkeypatch, _exchange_program(True), 64, (32, 1, 1))


# ----- tensor cores
@pytest.mark.parametrize("tc", list(dict.fromkeys(tc for t in TARGETS.values() for tc in t.tensor_cores)), ids=lambda tc: f"{tc.name}_w{tc.threads}")
def test_tensor_core_layouts_cover_each_element(tc):
  for op in "abc":
    rows, cols = tc.shape(op)
    ept = tc.elements_per_thread["abc".index(op)]
    seen = np.zeros((rows, cols), int)
    for lane in range(tc.threads):
      for j in range(ept): seen[tc.layout(op).coord(lane, j)] += 1
    assert (seen == tc.threads * ept // (rows * cols)).all(), f"{tc.name} {op}"


@pytest.mark.parametrize("target", ["CUDA", "AMD", "AMD_RDNA4", "AMD_CDNA3"])
def test_wmma_lanes_hold_their_fragments(monkeypatch, target: str):
  """One warp loads its A/B/C fragments per the layout, WMMA, stores D per the C layout: equals A @ B + C."""
  tc = TARGETS[target].tensor_cores[0]
  n, m, k = tc.dims
  A, B, Cm = (RNG.standard_normal(s).astype(np.float16) for s in ((m, k), (k, n), (m, n)))
  Cm = Cm.astype(np.float32)
  lane = UOp(Ops.SPECIAL, dtypes.int32, (_i(tc.threads),), "lidx0")
  bufs = [UOp(Ops.DEFINE_GLOBAL, dt.ptr(sz), arg=i) for i, (dt, sz) in enumerate([(dtypes.float32, m * n), (dtypes.float16, m * k),
                                                                                    (dtypes.float16, k * n), (dtypes.float32, m * n)])]
  def frag(op: str, buf: UOp, ncols: int, dt) -> UOp:
    lay, ept = tc.layout(op), tc.elements_per_thread["abc".index(op)]
    # per lane (row, col) of element j, looked up from tables indexed by the lane id (what a codegen would emit)
    els = []
    for j in range(ept):
      off = [lay.coord(ln, j)[0] * ncols + lay.coord(ln, j)[1] for ln in range(tc.threads)]
      idx = _i(0)
      for ln, o in enumerate(off): idx = UOp(Ops.WHERE, dtypes.int32, (UOp(Ops.CMPEQ, dtypes.bool, (lane, _i(ln))), _i(o), idx))
      els.append(UOp(Ops.LOAD, dt, (UOp(Ops.INDEX, buf.dtype, (buf, idx)),)))
    return UOp(Ops.VECTORIZE, dt.vec(ept), tuple(els)), off
  (a, _), (b, _), (c, _) = frag("a", bufs[1], k, dtypes.float16), frag("b", bufs[2], n, dtypes.float16), frag("c", bufs[3], n, dtypes.float32)
  d = UOp(Ops.WMMA, dtypes.float32.vec(tc.elements_per_thread[2]), (a, b, c), tc.name)
  stores = []
  for j in range(tc.elements_per_thread[2]):
    off = [tc.c.coord(ln, j)[0] * n + tc.c.coord(ln, j)[1] for ln in range(tc.threads)]
    idx = _i(0)
    for ln, o in enumerate(off): idx = UOp(Ops.WHERE, dtypes.int32, (UOp(Ops.CMPEQ, dtypes.bool, (lane, _i(ln))), _i(o), idx))
    stores.append(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, bufs[0].dtype, (bufs[0], idx)), UOp(Ops.GEP, dtypes.float32, (d,), (j,)))))
  sink = UOp(Ops.SINK, dtypes.void, tuple(stores))
  uops = [u for u in sink.toposort() if u.op is not Ops.SINK]
  uops = sorted(uops, key=lambda u: u.op is not Ops.DEFINE_GLOBAL)  # toposort is already an execution order
  dev = emu_device(monkeypatch, target)
  prg = PythonProgram(dev, "k", dev.compiler.compile(PythonRenderer.render(dev.renderer, "k", uops)))
  mem = [memoryview(bytearray(x.tobytes())) for x in (np.zeros((m, n), np.float32), A, B, Cm)]
  reset_gpu_counters()
  prg(*mem, global_size=(1, 1, 1), local_size=(tc.threads, 1, 1))
  got = np.frombuffer(mem[0], np.float32).reshape(m, n)
  np.testing.assert_allclose(got, A.astype(np.float64) @ B.astype(np.float64) + Cm, rtol=1e-5, atol=1e-5)
  assert GPU_COUNTERS["wmma"] == 1


@pytest.mark.parametrize("target", ["CUDA", "CUDA_SM80", "AMD", "AMD_RDNA4", "AMD_CDNA3"])
def test_tc_matmul(monkeypatch, target: str):
  """The heuristic's tensor-core kernel: several warps per workgroup, A/B tiles staged in shared memory."""
  a, b = RNG.standard_normal((32, 48)).astype(np.float16), RNG.standard_normal((48, 64)).astype(np.float16)
  out, spec = run_emulated(t_(a) @ t_(b), emu_device(monkeypatch, target))
  assert {Ops.WMMA, Ops.DEFINE_LOCAL, Ops.BARRIER} <= ops_of(spec) and spec.local_size[0] == TARGETS[target].warp_size
  assert spec.local_size[1] * spec.local_size[2] > 1, "one warp per workgroup: the tile isn't shared"
  np.testing.assert_allclose(out.reshape(32, 64).astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-3, atol=2e-2)


def test_tc_only_marks_and_the_tensor_core_pass_lowers_it(monkeypatch):
  """TC retypes the matmul's reduce range (its tensor core and tile in the mark) after checking the kernel fits, and
  nothing more: no WMMA, warps or shared memory until the pipeline's "tensor cores" pass (before, TC expanded what was
  pending and lowered itself). It is the last Opt: another one after it is refused, naming TC. A tile that doesn't fit
  is refused when TC applies, not when the pass lowers it."""
  from plugrad.codegen.gpuopt import lower_tensor_cores
  from plugrad.codegen.optops import is_tc_range
  a, b = RNG.standard_normal((64, 32)).astype(np.float16), RNG.standard_normal((32, 128)).astype(np.float16)
  dev = emu_device(monkeypatch, "CUDA")
  ast = (t_(a) @ t_(b)).schedule(optimize=False)[-1].ast
  marked = apply_opt(ast, Opt("TC", -1, 0, (2, 2, 2, 2, 1)), dev.renderer.caps)
  (k,) = [r for r in marked.toposort() if is_tc_range(r)]
  assert k.arg[1] == "reduce" and k.arg[4] == (2, 2, 2, 2, 1)
  assert not any(n.op in (Ops.WMMA, Ops.DEFINE_LOCAL, Ops.BARRIER) for n in marked.toposort())
  assert not any(r.arg[1] == "local" for r in ranges_of(marked).values())
  glob = next(r for r in ranges_of(marked).values() if r.arg[1] == "global")
  with pytest.raises(ValueError, match="TC must be the last"): apply_opt(marked, Opt("UPCAST", glob.arg[0], 2), dev.renderer.caps)
  was = (capture.VIZ, capture.PROFILE)
  capture.TRACE.clear()
  capture.enable(viz=True)
  try:
    with capture.group("kernel", "tc") as g: low = lower_tensor_cores(marked)
  finally: capture.enable(*was)
  assert sum(n.op is Ops.WMMA for n in low.toposort()) == 4 and not any(is_tc_range(r) for r in low.toposort())
  # the pass is a rewrite: each store of the matmul replaced by its fragments' stores (pm_tensor_cores), then simplified
  assert [r.name for r in g.rewrites if r.name in ("tensor cores", "simplify after TC")] == ["tensor cores", "simplify after TC"]
  assert not any(n.op is Ops.GROUP or n.tag is not None for n in low.toposort())
  with pytest.raises(ValueError, match="doesn't divide"): apply_opt(ast, Opt("TC", -1, 0, (8, 8, 1, 1, 0)), dev.renderer.caps)
  out, _ = run_emulated(t_(a) @ t_(b), dev, [Opt("TC", -1, 0, (2, 2, 2, 2, 1))])
  np.testing.assert_allclose(out.reshape(64, 128).astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-3, atol=2e-2)


TILES = [(), (2, 1), (1, 2, 2, 1), (1, 1, 1, 1, 1), (2, 2, 2, 2, 1), (1, 4, 1, 2, 1), (2, 2, 2, 2, 2), (1, 1, 1, 1, 2)]


@pytest.mark.parametrize("target", ["CUDA", "AMD"])
@pytest.mark.parametrize("tile", TILES, ids=lambda t: "x".join(map(str, t)) or "plain")
def test_tc_tiles(monkeypatch, target: str, tile: tuple):
  """Every TC tile (um, un, wm, wn, stage): um*un accumulators per warp sharing fragments, wm x wn warps, staging."""
  a, b = RNG.standard_normal((64, 32)).astype(np.float16), RNG.standard_normal((32, 128)).astype(np.float16)
  dev = emu_device(monkeypatch, target)
  reset_gpu_counters()
  out, spec = run_emulated(t_(a) @ t_(b), dev, [Opt("TC", -1, 0, tile)])
  um, un, wm, wn, stage = tile + (1, 1, 1, 1, 0)[len(tile):]
  np.testing.assert_allclose(out.reshape(64, 128).astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-3, atol=2e-2)
  assert sum(u.op is Ops.WMMA for u in spec.uops) == um * un
  assert spec.local_size == ([TARGETS[target].warp_size] + [w for w in (wn, wm) if w > 1] + [1, 1])[:3]
  assert sum(u.op is Ops.BARRIER for u in spec.uops) == min(stage, 2) and sum(u.op is Ops.DEFINE_LOCAL for u in spec.uops) == (0, 2, 3)[stage]
  n, m, kk = TARGETS[target].tensor_cores[0].dims
  assert GPU_COUNTERS["wmma"] == 64 * 128 * 32 // (n * m * kk)
  if stage:  # 16-byte loads of A rows (and of B rows when the tile is a whole 32-byte sector wide): no byte moved is wasted
    assert any(u.op is Ops.LOAD and u.dtype.count == 8 and u.src[0].src[0].op is Ops.DEFINE_GLOBAL for u in spec.uops)
    if n * un * wn * 2 >= 32: assert GPU_COUNTERS["global_load_sectors"] * 32 == GPU_COUNTERS["global_load_bytes"]
  if stage == 2 and n * un * wn * 2 >= 32:  # the output through shared memory: 16-byte stores of whole rows
    assert GPU_COUNTERS["global_store_sectors"] * 32 == GPU_COUNTERS["global_store_bytes"]


TC_SHAPES = {  # operands contiguous along the other axis (staged with vectors along rows), a batch range, a fused epilogue
  "transA": (lambda a, b: a.T @ b, ((32, 48), (32, 64))), "transB": (lambda a, b: a @ b.T, ((48, 32), (64, 32))),
  "batch": (lambda a, b: a @ b, ((3, 32, 16), (3, 16, 32))), "bias_relu": (lambda a, b: (a @ b + 1).relu(), ((32, 32), (32, 64)))}


@pytest.mark.parametrize("target", ["CUDA", "AMD"])
@pytest.mark.parametrize("name", list(TC_SHAPES))
def test_tc_matmul_shapes(monkeypatch, name: str, target: str):
  fn, shapes = TC_SHAPES[name]
  a, b = (RNG.standard_normal(sh).astype(np.float16) for sh in shapes)
  out, spec = run_emulated(fn(t_(a), t_(b)), emu_device(monkeypatch, target))
  assert {Ops.WMMA, Ops.BARRIER} <= ops_of(spec)
  want = fn(a.astype(np.float32), b.astype(np.float32)) if name != "bias_relu" else np.maximum(a.astype(np.float32) @ b.astype(np.float32) + 1, 0)
  np.testing.assert_allclose(out.reshape(want.shape).astype(np.float32), want, rtol=2e-3, atol=2e-2)


def test_tc_staging_reads_each_tile_once(monkeypatch):
  """Staged: each workgroup reads its A rows and B columns once (2 * 128*128*128 * 2 bytes / 64 per tile side);
  unstaged: every warp gathers its own fragments, 2-byte loads that waste most of each sector."""
  a, b = (RNG.standard_normal((128, 128)).astype(np.float16) for _ in range(2))
  moved = {}
  for tile in ((2, 4, 2, 2, 0), (2, 4, 2, 2, 1)):
    reset_gpu_counters()
    out, spec = run_emulated(t_(a) @ t_(b), emu_device(monkeypatch, "CUDA"), [Opt("TC", -1, 0, tile)])
    np.testing.assert_allclose(out.reshape(128, 128).astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-3, atol=5e-2)
    moved[tile[-1]] = GPU_COUNTERS["global_load_sectors"] * 32
  assert moved[1] == 2 * 128 * 128 * 2 * (128 // 64) and moved[0] > 4 * moved[1]


def test_tc_tile_errors(monkeypatch):
  dev = emu_device(monkeypatch, "CUDA")
  ast = (t_(np.ones((32, 32), np.float16)) @ t_(np.ones((32, 32), np.float16))).schedule(optimize=False)[-1].ast
  for tile, msg in (((4, 1, 2, 1), "doesn't divide"), ((1, 1, 1, 1, 3), "stage 0, 1 or 2"), ((1, 0), ">= 1"), ((1,) * 6, "up to 5")):
    with pytest.raises(ValueError, match=msg): apply_opt(ast, Opt("TC", -1, 0, tile), dev.renderer.caps)


def test_tc_heuristic_tile_from_target_data(monkeypatch):
  """128 x 128 workgroup tiles of 2 x 2 warps when the output allows; the accumulators and shared memory fit the target."""
  a = Tensor.empty(256, 256, dtype=dtypes.float16, device="PYTHON")
  ast = (a @ a).schedule(optimize=False)[-1].ast
  cuda, amd = (choose_gpu_opts(ast, emu_device(monkeypatch, t).renderer.caps) for t in ("CUDA", "AMD"))
  # CUDA's C rows (8 halves) are narrower than a sector: its output is staged too (exactly the 48 KB of shared memory)
  assert cuda == [Opt("TC", -1, 0, (4, 8, 2, 2, 2))] and amd == [Opt("TC", -1, 0, (4, 4, 2, 2, 1))]
  small = emu_device(monkeypatch, "CUDA", shared_max=4096)  # the double-buffered tiles must fit in shared memory
  um, un, wm, wn, _ = choose_gpu_opts(ast, small.renderer.caps)[0].arg
  assert 2 * (16 * um * wm + 8 * un * wn) * 16 * 2 <= 4096


def test_vector_access_must_be_aligned(monkeypatch):
  """A 16-byte load at an address that isn't a multiple of 16 faults on hardware: the emulator raises."""
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float16.ptr(64), arg=0)
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float16.ptr(64), arg=1)
  lane = UOp(Ops.SPECIAL, dtypes.int32, (_i(4),), "lidx0")
  def prog(off: int):
    v = UOp(Ops.LOAD, dtypes.float16.vec(8), (UOp(Ops.INDEX, buf.dtype, (buf, lane * _i(8) + _i(off))),))
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, lane * _i(8))), v))
    return [buf, out, *[u for u in st.toposort() if u.op not in (Ops.DEFINE_GLOBAL,)]]
  dev = emu_device(monkeypatch)
  x = np.arange(64, dtype=np.float16)
  for off in (0, 4):
    uops = prog(off)
    prg = PythonProgram(dev, "k", dev.compiler.compile(PythonRenderer.render(dev.renderer, "k", uops)))
    mem = [memoryview(bytearray(64 * 2)), memoryview(bytearray(x.tobytes()))]
    mem = [mem[1], mem[0]]
    reset_gpu_counters()
    if off:
      with pytest.raises(RuntimeError, match="misaligned"): prg(*mem, global_size=(1, 1, 1), local_size=(4, 1, 1))
      continue
    prg(*mem, global_size=(1, 1, 1), local_size=(4, 1, 1))
    np.testing.assert_array_equal(np.frombuffer(mem[1], np.float16)[:32], x[:32])
    assert GPU_COUNTERS["global_load_sectors"] == 2 and GPU_COUNTERS["global_store_sectors"] == 2


def test_acceptance_f16_matmul_256_uses_wmma(monkeypatch):
  """Issue 13's acceptance line: a 256 x 256 float16 matmul on EMULATE=CUDA runs on tensor cores and matches numpy."""
  a, b = RNG.standard_normal((256, 256)).astype(np.float16), RNG.standard_normal((256, 256)).astype(np.float16)
  reset_gpu_counters()
  out, spec = run_emulated(t_(a) @ t_(b), emu_device(monkeypatch))
  assert sum(u.op is Ops.WMMA for u in spec.uops) == 4 * 8 and spec.global_size == [2, 2, 1] and spec.local_size == [32, 2, 2]
  assert {Ops.DEFINE_LOCAL, Ops.BARRIER} <= ops_of(spec) and GPU_COUNTERS["wmma"] == 256**3 // (16 * 8 * 16)
  ref = a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(out.reshape(256, 256).astype(np.float64), ref, rtol=2e-3, atol=3e-2)


def test_backends_doc_lists_exactly_the_capability_record():
  """docs/backends.md's capability table names every field of the capability record (`Capabilities`), and nothing
  else."""
  root = Path(__file__).resolve().parents[2]
  doc = (root / "docs" / "backends.md").read_text().split("**Capabilities codegen reads**", 1)[1]
  table = doc[:doc.index("\n\n", doc.index("|---"))]
  listed = {a for row in table.splitlines() if row.startswith("| `") for a in re.findall(r"`(\w+)`", row.split("|")[1])}
  fields = {f.name for f in dataclasses.fields(Capabilities)}
  assert listed == fields, f"documented but not in the record: {sorted(listed - fields)}; in the record but not documented: {sorted(fields - listed)}"


def test_capabilities_are_read_only_through_the_record():
  """Core and the plugins read what a target can do only from `renderer.caps`: no getattr on a renderer (it would
  hide a capability no record declares), and no renderer class (core's, the CPU, CUDA and AMD plugins') sets a
  capability as an attribute of its own."""
  import plugrad_amd.renderer  # noqa: F401  (the plugins' renderer classes, for the subclass walk)
  import plugrad_cpu.device  # noqa: F401
  import plugrad_nv.renderer  # noqa: F401
  import plugrad.runtime.softhcq  # noqa: F401
  from plugrad.runtime.renderer import Renderer
  root = Path(__file__).resolve().parents[2]
  for p in (p for d in ("core/plugrad", "plugins") for p in (root / d).rglob("*.py") if "autogen" not in p.parts):
    assert not re.findall(r"getattr\([^,()]*(?:renderer|\bren)\b[^,()]*,", p.read_text()), f"{p}: getattr on a renderer"
  fields, todo, seen = {f.name for f in dataclasses.fields(Capabilities)}, [Renderer], set()
  while todo:
    if (cls := todo.pop()) in seen: continue
    seen.add(cls)
    assert not fields & set(vars(cls)), f"{cls.__qualname__} sets {sorted(fields & set(vars(cls)))} outside its capability record"
    todo += cls.__subclasses__()
  assert len(seen) >= 6


TWO_REDUCES = {"sum+max": (lambda t: t.sum(1) + t.max(1), lambda x: x.sum(1) + x.max(1)),
               "mean+square": (lambda t: t.mean(1) * 2 + (t * t).sum(1), lambda x: x.mean(1) * 2 + (x * x).sum(1))}


@pytest.mark.parametrize("name", list(TWO_REDUCES))
def test_two_reduces_in_one_kernel_share_group_threads(monkeypatch, name: str):
  fn, ref = TWO_REDUCES[name]
  x = RNG.standard_normal((4, 512)).astype(np.float32)
  dev = emu_device(monkeypatch)
  items = [it for it in fn(t_(x)).schedule() if it.ast.op is not Ops.COPY]
  spec = get_program(items[-1].ast, dev.renderer)
  assert sum(u.op is Ops.DEFINE_LOCAL for u in spec.uops) == 2 and spec.local_size == [256, 1, 1]
  out, _ = run_emulated(fn(t_(x)), dev)
  np.testing.assert_allclose(out, ref(x.astype(np.float64)), rtol=1e-5)


def test_float32_matmul_register_tiles(monkeypatch):
  a, b = RNG.standard_normal((64, 24)).astype(np.float32), RNG.standard_normal((24, 128)).astype(np.float32)
  dev = emu_device(monkeypatch)
  ast = (t_(a) @ t_(b)).schedule(optimize=False)[-1].ast
  assert [o.kind for o in choose_gpu_opts(ast, dev.renderer.caps)].count("UPCAST") == 2
  out, spec = run_emulated(t_(a) @ t_(b), dev)
  np.testing.assert_allclose(out.reshape(64, 128), a @ b, rtol=1e-5, atol=1e-5)
  assert spec.local_size is not None


def test_tiny_reduce_is_unrolled(monkeypatch):
  x = RNG.standard_normal((40, 3)).astype(np.float32)
  dev = emu_device(monkeypatch)
  assert [o.kind for o in choose_gpu_opts(t_(x).sum(1).schedule(optimize=False)[-1].ast, dev.renderer.caps)][0] == "UNROLL"
  out, spec = run_emulated(t_(x).sum(1), dev)
  np.testing.assert_allclose(out, x.sum(1), rtol=1e-6)
  assert not any(u.op is Ops.RANGE for u in spec.uops)


def test_symbolic_attention_flops_in_a_gpu_launch(monkeypatch):
  """Causal attention over a symbolic sequence: kernels with a loop whose trip count is the variable inside a launch
  whose size is symbolic too. The flop count multiplies the loop's int32 bound by the launch's index-typed thread count
  (it raised UOpSpecError: MUL of int32 with index)."""
  v = Variable("k", 1, 12)
  q = RNG.standard_normal((1, 2, 12, 4)).astype(np.float32)
  dev = emu_device(monkeypatch)
  for k in (2, 7):
    x = t_(q)[:, :, :v.bind(k)]
    out, spec = run_emulated(x.scaled_dot_product_attention(x, x, is_causal=True), dev)
    qq = q[:, :, :k]
    sc = qq @ qq.transpose(0, 1, 3, 2) / 2.0 + np.triu(np.full((k, k), -np.inf), 1)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    np.testing.assert_allclose(out[:2 * k * 4].reshape(1, 2, k, 4), e / e.sum(-1, keepdims=True) @ qq, rtol=1e-5, atol=1e-6)
    assert isinstance(spec.flops, UOp) and sym_infer(spec.flops, {"k": k}) > 0


# ----- row kernels: softmax in one kernel (scheduler + GROUPOUT)
def gpu_scheduler(monkeypatch: pytest.MonkeyPatch, target: str = "CUDA") -> None:
  """Schedule PYTHON tensors as for `target` (the scheduler's row-kernel decision reads the device's renderer)."""
  ren = Device["PYTHON"].renderer
  monkeypatch.setattr(ren, "caps", TARGETS[target].caps())
  monkeypatch.setattr(kernelize, "_SCHEDULE_CACHE", {})


def kernels(t: Tensor) -> list:
  return [it for it in t.schedule() if it.ast.op is Ops.SINK]


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_row_kernels_scheduled_only_for_gpus(monkeypatch):
  x = Tensor.empty(8, 1024, device="PYTHON")
  assert len(kernels(x.softmax(-1))) == 3  # the CPU-style PYTHON renderer: max, sum, divide
  gpu_scheduler(monkeypatch)
  assert len(kernels(x.softmax(-1))) == 1 and len(kernels(x.log_softmax(-1))) == 1
  assert len(kernels(Tensor.empty(8, 5000, device="PYTHON").softmax(-1))) == 3  # rows past ROW_MAX
  assert len(kernels(Tensor.empty(8, 32, device="PYTHON").softmax(-1))) == 3  # shorter than a useful group
  assert len(kernels(Tensor.empty(1024, 8, device="PYTHON").softmax(0))) == 3  # not the contiguous axis
  # the row's max would run inside a reduction over rows: it keeps its own kernel
  assert len(kernels((x - x.max(1, keepdim=True)).exp().sum(0))) == 2
  assert len(kernels(x.layernorm())) == 1 and len(kernels(x * (x.square().mean(-1, keepdim=True) + 1e-6).rsqrt())) == 1


def test_row_kernel_rows_must_be_cheap(monkeypatch):
  """Regression: attention's softmax over scores that are themselves a matmul became one row kernel that recomputed
  the scores for every row element (4100 workgroups, 30x the loads): rows holding a reduction keep their kernels."""
  q, k = Tensor.empty(2, 64, 32, device="PYTHON"), Tensor.empty(2, 32, 128, device="PYTHON")
  want = len(kernels((q @ k).softmax(-1)))
  gpu_scheduler(monkeypatch)
  assert len(kernels((q @ k).softmax(-1))) == want


@pytest.mark.parametrize("target", ["CUDA", "AMD"])
@pytest.mark.parametrize("shape", [(8, 1024), (5, 100), (2, 3, 256)], ids=lambda s: "x".join(map(str, s)))
def test_row_kernels_read_rows_once(monkeypatch, target: str, shape: tuple):
  gpu_scheduler(monkeypatch, target)
  x = RNG.standard_normal(shape).astype(np.float32)
  dev = emu_device(monkeypatch, target)
  def layernorm(a: np.ndarray) -> np.ndarray:
    m = a.mean(-1, keepdims=True)
    return (a - m) / np.sqrt(((a - m) ** 2).mean(-1, keepdims=True) + 1e-5)
  for fn, ref in ((lambda t: t.softmax(-1), _softmax), (lambda t: t.log_softmax(-1), lambda a: np.log(_softmax(a))),
                  (lambda t: t.layernorm(), layernorm)):
    assert len(kernels(fn(t_(x)))) == 1
    reset_gpu_counters()
    out, spec = run_emulated(fn(t_(x)), dev)
    np.testing.assert_allclose(out.reshape(shape), ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    assert np.prod(spec.global_size) == np.prod(shape[:-1]) and GPU_COUNTERS["launches"] == 1  # one workgroup per row
    if shape[-1] % 256 == 0: assert GPU_COUNTERS["global_load_bytes"] == x.nbytes  # each row element read once


def test_second_group_keeps_the_first_groups_gates(monkeypatch):
  """Regressions: GROUP of softmax's sum past N (100 over 64 threads) gated the loads of the already-grouped max inside
  it, and GROUPOUT's gate on the copy past N gated the reductions' loads too (both gave wrong rows)."""
  gpu_scheduler(monkeypatch)
  x = RNG.standard_normal((5, 100)).astype(np.float32)
  ast = kernels(t_(x).softmax(-1))[-1].ast
  rngs = sorted(ranges_of(ast).values(), key=lambda r: r.arg[0])
  opts = [Opt("GROUPOUT", rngs[1].arg[0], 64)] + [Opt("GROUP", r.arg[0], 64) for r in rngs if r.arg[1] == "reduce"]
  out, _ = run_emulated(t_(x).softmax(-1), emu_device(monkeypatch), opts)
  np.testing.assert_allclose(out.reshape(5, 100), _softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_groupout_errors(monkeypatch):
  gpu_scheduler(monkeypatch)
  dev = emu_device(monkeypatch)
  ast = kernels(t_(np.ones((4, 128), np.float32)).softmax(-1))[-1].ast
  rngs = sorted(ranges_of(ast).values(), key=lambda r: r.arg[0])
  red = next(r for r in rngs if r.arg[1] == "reduce")
  with pytest.raises(ValueError, match="global range"): apply_opt(ast, Opt("GROUPOUT", red.arg[0], 64), dev.renderer.caps)
  grouped = apply_opt(ast, Opt("GROUP", red.arg[0], 64), dev.renderer.caps)
  with pytest.raises(ValueError, match="before GROUP"): apply_opt(grouped, Opt("GROUPOUT", rngs[1].arg[0], 64), dev.renderer.caps)


def test_group_only_marks_and_the_expand_pass_lowers_it(monkeypatch):
  """GROUP splits a reduce range into a thread's partial loop and the group's thread range, nothing more: the
  one-kernel softmax's max and sum (200 columns over 64 threads: gated partials) become REDUCE(REDUCE(x, inner),
  lane), with no local memory or barrier yet (before, GROUP wrote those itself). codegen/group.py lowers them: the
  max's first (the sum reads it), both in the expand pass; one local buffer each, and the rows are right on the
  emulator."""
  gpu_scheduler(monkeypatch)
  x = RNG.standard_normal((4, 200)).astype(np.float32)
  dev = emu_device(monkeypatch)
  ast = kernels(t_(x).softmax(-1))[-1].ast
  reds = sorted({r for n in ast.toposort() if n.op is Ops.REDUCE for r in n.src[1:]}, key=lambda r: r.arg[0])
  assert len([n for n in ast.toposort() if n.op is Ops.REDUCE]) == 2
  opts = [Opt("GROUP", r.arg[0], 64) for r in reds]
  first = apply_opt(ast, opts[0], dev.renderer.caps)
  (grouped,) = [n for n in first.toposort() if is_grouped(n)]
  assert grouped.src[0].op is Ops.REDUCE and not any(n.op in (Ops.DEFINE_LOCAL, Ops.BARRIER) for n in first.toposort())
  # the second GROUP only marks too: two grouped reduces pending, no local memory yet
  marked = functools.reduce(lambda a, o: apply_opt(a, o, dev.renderer.caps), opts, ast)
  assert sum(map(is_grouped, marked.toposort())) == 2 and not any(n.op is Ops.DEFINE_LOCAL for n in marked.toposort())
  low = expand(marked)
  assert not any(map(is_grouped, low.toposort())) and sum(n.op is Ops.DEFINE_LOCAL for n in low.toposort()) == 2
  out, _ = run_emulated(t_(x).softmax(-1), dev, opts)
  np.testing.assert_allclose(out.reshape(4, 200), _softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_groupout_marks_its_copies_and_gates_only_the_last(monkeypatch):
  """GROUPOUT only splits the row into the group's threads and a range of copies that the expand pass makes (100
  columns over 64 threads: 2 copies); only the copy past N keeps a gate (the first one's folds to true and is
  dropped), and the row is right on the emulator."""
  gpu_scheduler(monkeypatch)
  x = RNG.standard_normal((5, 100)).astype(np.float32)
  dev = emu_device(monkeypatch)
  ast = kernels(t_(x).softmax(-1))[-1].ast
  col = sorted(ranges_of(ast).values(), key=lambda r: r.arg[0])[1]
  marked = apply_opt(ast, Opt("GROUPOUT", col.arg[0], 64), dev.renderer.caps)
  (copy,) = [n for n in marked.toposort() if is_copy_range(n)]
  assert copy.arg[1:] == ("global", "upcast") and copy.src[0].arg == 2 and len(marked.src) == 1
  done = expand(marked)
  assert [len(st.src[0].src) for st in done.src] == [2, 3]   # (buffer, index) for the first copy, + the gate for the second
  out, _ = run_emulated(t_(x).softmax(-1), dev, [Opt("GROUPOUT", col.arg[0], 64)])
  np.testing.assert_allclose(out.reshape(5, 100), _softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_gated_select_rule():
  """where(c, load(gate g), 0) is the load exactly when g implies c (the same terms, or a tighter upper bound of the
  same integer); a select of another constant, of -0.0, or under a condition g doesn't imply stays; a load gated by
  false is 0."""
  from plugrad.codegen.expand import simplify
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(64), arg=0)
  i, j = (UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 40),), (n, "global")) for n in (0, 1))
  def load(g: UOp) -> UOp: return UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, buf.dtype, (buf, i + j, g)),))
  def sel(c: UOp, ld: UOp, z: float = 0.0) -> UOp: return simplify(c.where(ld, UOp.const(dtypes.float32, z)))
  g = (i < 28) & (j < 30)
  assert sel(i < 29, load(g)) is load(g) and sel((j < 30) & (i < 28), load(g)) is load(g)
  for c in (i < 27, j < 29, (i < 28) & (j < 20), i.ne(3)):
    assert sel(c, load(g)).op is Ops.WHERE, c
  assert sel(i < 29, load(g), 1.0).op is Ops.WHERE and sel(i < 29, load(g), -0.0).op is Ops.WHERE
  # a select folded into its load whose gate later folds to false is 0, as the select was (a stride-2 convolution's
  # input gradient read `(0 ? x[...] : 0.0f)` before this rule)
  off = simplify(load(UOp.const(dtypes.bool, False)) + 1.0)
  assert off.op is Ops.CONST and off.arg == 1.0
