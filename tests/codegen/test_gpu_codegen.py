"""GPU codegen on the emulated GPU (EMULATE targets on the PYTHON device): gpudims (limits, merging, splitting,
symbolic sizes), each GPU optimization (kernel AST and values against numpy), the emulator's warp/barrier semantics
and the tensor-core lane layouts."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import Tensor, Variable
from plugrad.codegen import get_program
from plugrad.codegen.gpuopt import apply_gpu_opt, choose_gpu_opts
from plugrad.codegen.opt import Opt, ranges_of
from plugrad.codegen.targets import TARGETS
from plugrad.dtype import AddrSpace, dtypes
from plugrad.engine.realize import buffer_for, run_schedule
from plugrad.plugins.python import GPU_COUNTERS, BarrierError, PythonDevice, PythonProgram, PythonRenderer, reset_gpu_counters
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.symbolic import sym_infer

RNG = np.random.default_rng(0)


def emu_device(monkeypatch: pytest.MonkeyPatch, target: str = "CUDA", **caps) -> PythonDevice:
  """A fresh PYTHON device emulating `target`, with capabilities overridden by `caps`."""
  monkeypatch.setenv("EMULATE", target)
  dev = PythonDevice("PYTHON")
  monkeypatch.delenv("EMULATE")
  for k, v in caps.items(): setattr(dev.renderer, k, v)
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
    for o in opts: ast = apply_gpu_opt(ast, o)
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
  spec = get_program((Tensor.ones(8, 8).contiguous() + 1).schedule()[-1].ast, Device["CPU"].renderer)
  assert spec.local_size is None and spec.global_size == [1, 1, 1] and Ops.SPECIAL not in ops_of(spec)


# ----- opts
@pytest.mark.parametrize("n,k", [(64, 16), (37, 16)])
def test_local(monkeypatch, n: int, k: int):
  a = RNG.random((3, n)).astype(np.float32)
  out, spec = run_emulated(t_(a).exp2(), emu_device(monkeypatch), opts=[Opt("LOCAL", 1, k)])
  np.testing.assert_allclose(out.reshape(3, n), np.exp2(a), rtol=1e-6)
  assert spec.local_size == [k, 1, 1] and spec.global_size[0] == -(-n // k)


@pytest.mark.parametrize("kind", ["GROUP", "GROUPTOP"])
@pytest.mark.parametrize("n,k", [(256, 16), (300, 32), (100, 12)])
def test_group_reduce(monkeypatch, kind: str, n: int, k: int):
  a = RNG.random((5, n)).astype(np.float32)
  t = t_(a).sum(1)
  rid = next(r for r in ranges_of(t.schedule()[-1].ast).values() if r.arg[1] == "reduce").arg[0]
  out, spec = run_emulated(t, emu_device(monkeypatch), opts=[Opt(kind, rid, k)])
  np.testing.assert_allclose(out, a.sum(1), rtol=1e-5)
  assert {Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.SPECIAL} <= ops_of(spec) and spec.local_size == [k, 1, 1]
  loc = next(u for u in spec.uops if u.op is Ops.DEFINE_LOCAL)
  assert loc.dtype.addrspace is AddrSpace.LOCAL and loc.dtype.size == k


def test_group_max_and_local(monkeypatch):
  a = RNG.standard_normal((8, 128)).astype(np.float32)
  t = t_(a).max(0)
  rngs = ranges_of(t.schedule()[-1].ast)
  g = next(r for r in rngs.values() if r.arg[1] == "global").arg[0]
  r = next(r for r in rngs.values() if r.arg[1] == "reduce").arg[0]
  out, spec = run_emulated(t, emu_device(monkeypatch), opts=[Opt("LOCAL", g, 32), Opt("GROUPTOP", r, 4)])
  np.testing.assert_array_equal(out, a.max(0))
  assert spec.local_size == [32, 4, 1] or spec.local_size == [4, 32, 1]


def test_bad_opts_raise(monkeypatch):
  ast = t_(np.zeros((4, 64), np.float32)).sum(1).schedule()[-1].ast
  g = next(r for r in ranges_of(ast).values() if r.arg[1] == "global").arg[0]
  with pytest.raises(ValueError, match="reduce range"): apply_gpu_opt(ast, Opt("GROUP", g, 4))
  r = next(r for r in ranges_of(ast).values() if r.arg[1] == "reduce").arg[0]
  with pytest.raises(ValueError, match="before GROUP"): apply_gpu_opt(apply_gpu_opt(ast, Opt("GROUP", r, 4)), Opt("LOCAL", g, 2))


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
  spec = get_program(Tensor.empty(4096, 1024, device="PYTHON").sum(1).schedule()[-1].ast, dev.renderer)
  assert {Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER} <= ops_of(spec) and spec.local_size == [256, 1, 1] and spec.global_size == [4096, 1, 1]
  a = RNG.random(2**20).astype(np.float32)
  reset_gpu_counters()
  out, spec = run_emulated(t_(a).sum(), dev)
  assert {Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER} <= ops_of(spec) and spec.local_size == [256, 1, 1]
  np.testing.assert_allclose(out[0], a.astype(np.float64).sum(), rtol=1e-4)
  assert GPU_COUNTERS["global_load_bytes"] >= 4 * 2**20 and GPU_COUNTERS["global_load_sectors"] * 32 == GPU_COUNTERS["global_load_bytes"]  # coalesced


def test_heuristic_elementwise_uses_threads(monkeypatch):
  opts = choose_gpu_opts((Tensor.empty(100, 300, device="PYTHON") + 1).schedule()[-1].ast, emu_device(monkeypatch).renderer)
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
  a, b = RNG.standard_normal((32, 48)).astype(np.float16), RNG.standard_normal((48, 64)).astype(np.float16)
  out, spec = run_emulated(t_(a) @ t_(b), emu_device(monkeypatch, target))
  assert Ops.WMMA in ops_of(spec) and spec.local_size == [TARGETS[target].warp_size, 1, 1]
  np.testing.assert_allclose(out.reshape(32, 64).astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-3, atol=2e-2)


def test_tc_bf16_and_non_matching_dtypes(monkeypatch):
  dev = emu_device(monkeypatch, "CUDA_SM80")
  a, b = RNG.standard_normal((16, 32)).astype(np.float32), RNG.standard_normal((32, 8)).astype(np.float32)
  out, spec = run_emulated((t_(a).cast(dtypes.bfloat16) @ t_(b).cast(dtypes.bfloat16)).cast(dtypes.float32), dev)
  assert "WMMA_16_8_16_bfloat16_float" in {u.arg for u in spec.uops if u.op is Ops.WMMA}
  ref = a.astype(np.float32) @ b.astype(np.float32)
  np.testing.assert_allclose(out.astype(np.float32), ref.reshape(-1), rtol=3e-2, atol=0.15)
  out, spec = run_emulated(t_(a) @ t_(b), dev)  # float32 inputs: no tensor core on these targets
  assert Ops.WMMA not in ops_of(spec)
  np.testing.assert_allclose(out.reshape(16, 8), ref, rtol=1e-5, atol=1e-5)


def test_acceptance_f16_matmul_256_uses_wmma(monkeypatch):
  a = Tensor.empty(256, 256, dtype=dtypes.float16, device="PYTHON")
  spec = get_program((a @ a).schedule()[-1].ast, emu_device(monkeypatch).renderer)
  assert sum(u.op is Ops.WMMA for u in spec.uops) == 1 and spec.global_size == [32, 16, 1]


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
  ast = (t_(a) @ t_(b)).schedule()[-1].ast
  assert [o.kind for o in choose_gpu_opts(ast, dev.renderer)].count("UPCAST") == 2
  out, spec = run_emulated(t_(a) @ t_(b), dev)
  np.testing.assert_allclose(out.reshape(64, 128), a @ b, rtol=1e-5, atol=1e-5)
  assert spec.local_size is not None


def test_tiny_reduce_is_unrolled(monkeypatch):
  x = RNG.standard_normal((40, 3)).astype(np.float32)
  dev = emu_device(monkeypatch)
  assert [o.kind for o in choose_gpu_opts(t_(x).sum(1).schedule()[-1].ast, dev.renderer)][0] == "UNROLL"
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
