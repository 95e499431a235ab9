"""DEV=MOCK+NV end to end (issue 42): Tensor programs go through the CUDA renderer, NVRTC's PTX, the nv plugin's real
runtime (NVDevice on HCQ: signals, queues, allocator, programs, CUDADriver) and the mock CUDA driver, whose PTX
interpreter executes the kernels. Each GPU feature is checked in the PTX of the kernels that ran (the mock's launch
history): launch dimensions (blocks and threads from codegen's gpudims), shared memory and bar.sync for group
reductions, mma.sync for tensor-core matmuls (f16 and bf16), half/bf16 arithmetic; values against numpy. Also a
training step, softmax, TinyJit with a symbolic shape (compiled once), the e5m2 overflow the mock found in the
renderer, and the same features on an sm_80 mock (in a subprocess, whose MOCK_NV_CC differs)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import plugrad.engine.realize as realize
from plugrad import Tensor, TinyJit, Variable
from plugrad.codegen import get_program
from plugrad.codegen.optops import apply_opt
from plugrad.codegen.opt import Opt, ranges_of
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.engine.realize import buffer_for, run_schedule
from plugrad.nn.optim import SGD
from plugrad.uop.ops import Ops
from plugrad_nv import probe_mock

pytestmark = pytest.mark.skipif(not probe_mock().ok, reason=f"MOCK+NV unavailable: {probe_mock().reason}")
D = "MOCK+NV"
RNG = np.random.default_rng(0)


@pytest.fixture
def mock():
  """The process-wide mock CUDA driver behind MOCK+NV (healthy: no sticky fault)."""
  dev = Device[D]
  lib = dev.driver.cu
  assert type(lib).__name__ == "MockLibCuda" and lib.sticky is None, lib.sticky
  return lib


def ran(mock, start: int) -> list:
  return list(mock.history)[start:] if start <= len(mock.history) else list(mock.history)


def test_device_is_the_real_runtime_on_the_mock(mock):
  dev = Device[D]
  assert type(dev).__name__ == "NVDevice" and type(dev.driver).__name__ == "CUDADriver"
  assert dev.renderer.arch == "sm_90" and dev.compiler.keep_ptx and "mode=ptx-only" in dev.compiler.cachekey
  assert dev.gpu_name.startswith("plugrad mock GPU sm_90")


def test_elementwise_launch_dims(mock):
  """A 100k-element elementwise kernel: many blocks of many threads (codegen's gpudims), values exact (NVRTC contracts
  x*3-1 into one fma.rn.f32: rounded once, as float64 arithmetic rounded to float32 is here)."""
  x = RNG.standard_normal(100_003).astype(np.float32)
  start = len(mock.history)
  got = (Tensor(x, device=D) * 3 - 1).numpy()
  np.testing.assert_array_equal(got, (x.astype(np.float64) * 3 - 1).astype(np.float32))
  ks = ran(mock, start)
  assert any(k.grid[0] > 1 and k.block[0] > 1 for k in ks), [(k.name, k.grid, k.block) for k in ks]
  assert all(k.block[0] * k.block[1] * k.block[2] <= 1024 for k in ks)


def test_group_reduction_uses_shared_memory_and_barriers(mock):
  a = RNG.random(2**16).astype(np.float32)
  start = len(mock.history)
  got = Tensor(a, device=D).sum().numpy()
  np.testing.assert_allclose(got, a.astype(np.float64).sum(), rtol=1e-5)
  ptx = "\n".join(k.ptx for k in ran(mock, start))
  assert "bar.sync" in ptx and "st.shared" in ptx and "ld.shared" in ptx
  assert max(k.block[0] * k.block[1] * k.block[2] for k in ran(mock, start)) > 32  # several warps share the block


def test_matmul_float32(mock):
  a, b = RNG.standard_normal((70, 48)).astype(np.float32), RNG.standard_normal((48, 90)).astype(np.float32)
  np.testing.assert_allclose((Tensor(a, device=D) @ Tensor(b, device=D)).numpy(), a @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_matmul_on_tensor_cores(mock, dt):
  """A 128x128 low-precision matmul with float32 accumulation runs mma.sync m16n8k16 (values: exact products summed in float32)."""
  import ml_dtypes
  npdt = np.float16 if dt == dtypes.float16 else ml_dtypes.bfloat16
  a = RNG.standard_normal((128, 128)).astype(npdt)
  b = RNG.standard_normal((128, 128)).astype(npdt)
  start = len(mock.history)
  got = Tensor(a.astype(np.float32), device=D).cast(dt).matmul(Tensor(b.astype(np.float32), device=D).cast(dt), dtype=dtypes.float32).numpy()
  np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-4, atol=1e-3)
  ptx = "\n".join(k.ptx for k in ran(mock, start))
  ty = "f16" if dt == dtypes.float16 else "bf16"
  assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32" in ptx


def test_half_and_bfloat16_arithmetic(mock):
  import ml_dtypes
  x = RNG.standard_normal(1000).astype(np.float32)
  for dt, npdt in ((dtypes.float16, np.float16), (dtypes.bfloat16, ml_dtypes.bfloat16)):
    xl = x.astype(npdt)
    t = Tensor(x, device=D).cast(dt)
    got = ((t * t + t) - 1).cast(dtypes.float32).numpy()
    want = ((xl * xl + xl) - npdt(1)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(t.sum(dtype=dtypes.float32).numpy(), xl.astype(np.float32).sum(), rtol=1e-4, atol=1e-3)


def test_softmax(mock):
  x = RNG.standard_normal((33, 257)).astype(np.float32)
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(Tensor(x, device=D).softmax(axis=-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_training_step_matches_numpy(mock):
  """Two SGD steps of a two-layer MLP with MSE loss: gradients and weights equal a hand-written numpy backward pass."""
  x, y = RNG.standard_normal((16, 8)).astype(np.float32), RNG.standard_normal((16, 4)).astype(np.float32)
  w1, w2 = (RNG.standard_normal((8, 12)) * 0.3).astype(np.float32), (RNG.standard_normal((12, 4)) * 0.3).astype(np.float32)
  W1, W2 = Tensor(w1, device=D, requires_grad=True), Tensor(w2, device=D, requires_grad=True)
  opt = SGD([W1, W2], lr=0.1)
  X, Y = Tensor(x, device=D), Tensor(y, device=D)
  with Tensor.train():
    for _ in range(2):
      opt.zero_grad()
      loss = ((X @ W1).relu() @ W2 - Y).square().mean()
      loss.backward()
      opt.step()
      h = x @ w1
      r = np.maximum(h, 0)
      d = 2 * (r @ w2 - y) / y.size
      g2 = r.T @ d
      g1 = x.T @ ((d @ w2.T) * (h > 0))
      w1, w2 = w1 - 0.1 * g1, w2 - 0.1 * g2
      np.testing.assert_allclose(loss.numpy(), ((r @ (w2 + 0.1 * g2) - y) ** 2).mean(), rtol=1e-5)
  np.testing.assert_allclose(W1.numpy(), w1, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(W2.numpy(), w2, rtol=1e-5, atol=1e-6)


def test_symbolic_jit_loop_compiles_once(mock):
  v = Variable("rows", 1, 40)
  x, w = RNG.standard_normal((40, 24)).astype(np.float32), RNG.standard_normal((24, 8)).astype(np.float32)
  xt, wt = Tensor(x, device=D).realize(), Tensor(w, device=D).realize()
  @TinyJit
  def f(n) -> Tensor: return (xt[:n] @ wt).relu().softmax(axis=1).realize()
  f(v.bind(3))
  f(v.bind(5))
  compiles = realize.GlobalCounters["compiles"]
  for n in (1, 17, 40, 9):
    start = len(mock.history)
    h = np.maximum(x[:n] @ w, 0)
    e = np.exp(h - h.max(1, keepdims=True))
    np.testing.assert_allclose(f(v.bind(n)).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert len(mock.history) > start  # the replay launched the captured kernels on the mock
  assert realize.GlobalCounters["compiles"] == compiles, "a symbolic kernel is compiled once for every bound value"


def test_e5m2_overflow_is_inf(mock):
  """Found by the mock: the CUDA renderer converted to fp8e5m2 with cuda_fp8.h's saturating constructor, so overflow
  gave 57344 where OCP E5M2 (and every other backend) gives inf."""
  got = Tensor(np.array([61440, 1e6, np.inf, -1e6, 57344, 61439], np.float32), device=D).cast(dtypes.fp8e5m2).cast(dtypes.float32).numpy()
  np.testing.assert_array_equal(got, [np.inf, np.inf, np.inf, -np.inf, 57344, 57344])


def run_with_opts(t: Tensor, opts: list[Opt] | None) -> tuple[np.ndarray, object]:
  """Run `t`'s last kernel on MOCK+NV with these GPU opts applied (NOOPT: nothing else), like test_gpu_codegen does
  on the emulated GPU: (result, ProgramSpec)."""
  dev = Device[D]
  items = t.schedule()
  run_schedule(items[:-1])
  it = items[-1]
  bufs = [buffer_for(b).ensure_allocated() for b in it.bufs]
  ast = it.ast
  caps = getattr(dev.renderer, "caps", dev.renderer)  # the capability record codegen reads (the renderer itself before `caps`)
  for o in opts or []: ast = apply_opt(ast, o, caps)
  mp = pytest.MonkeyPatch()
  if opts: mp.setenv("NOOPT", "1")
  try: spec = get_program(ast, dev.renderer)
  finally: mp.undo()
  prg = dev.load(spec.name, dev.compiler.compile_cached(spec.src))
  glb, lcl = spec.launch_dims({})
  prg(*[b._buf for b in bufs], global_size=glb, local_size=lcl, wait=True)
  return bufs[0].numpy(), spec


@pytest.mark.parametrize("n,k", [(64, 16), (37, 16)])
def test_local_opt(mock, n: int, k: int):
  a = RNG.random((3, n)).astype(np.float32)
  out, spec = run_with_opts(Tensor(a, device=D).exp2(), [Opt("LOCAL", 1, k)])
  np.testing.assert_allclose(out.reshape(3, n), np.exp2(a), rtol=2e-7)
  assert spec.local_size == [k, 1, 1] and spec.global_size[0] == -(-n // k)
  assert mock.history[-1].block == (k, 1, 1)


@pytest.mark.parametrize("kind", ["GROUP", "GROUPTOP"])
@pytest.mark.parametrize("n,k", [(256, 16), (300, 32), (100, 12)])
def test_group_reduce_opt(mock, kind: str, n: int, k: int):
  a = RNG.random((5, n)).astype(np.float32)
  t = Tensor(a, device=D).sum(1)
  rid = next(r for r in ranges_of(t.schedule(optimize=False)[-1].ast).values() if r.arg[1] == "reduce").arg[0]
  out, spec = run_with_opts(t, [Opt(kind, rid, k)])
  np.testing.assert_allclose(out, a.sum(1), rtol=1e-5)
  assert {Ops.DEFINE_LOCAL, Ops.BARRIER} <= {u.op for u in spec.uops} and spec.local_size == [k, 1, 1]
  assert "bar.sync" in mock.history[-1].ptx and ".shared" in mock.history[-1].ptx


TILES = [(), (2, 1), (1, 2, 2, 1), (2, 2, 2, 2, 1), (1, 4, 1, 2, 1), (2, 2, 2, 2, 2), (1, 1, 1, 1, 2)]


@pytest.mark.parametrize("tile", TILES, ids=lambda t: "x".join(map(str, t)) or "plain")
def test_tensor_core_tiles(mock, tile: tuple):
  """Each TC tile (um, un, wm, wn, stage): um*un mma.sync per K step and warp, wm x wn warps, A/B (and C) staged in
  shared memory with bar.sync, values against numpy."""
  a, b = RNG.standard_normal((64, 32)).astype(np.float16), RNG.standard_normal((32, 128)).astype(np.float16)
  out, spec = run_with_opts(Tensor(a, device=D) @ Tensor(b, device=D), [Opt("TC", -1, 0, tile)])
  np.testing.assert_allclose(out.reshape(64, 128).astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-3, atol=2e-2)
  um, un, wm, wn, stage = tile + (1, 1, 1, 1, 0)[len(tile):]
  ptx = mock.history[-1].ptx
  assert ptx.count("mma.sync.aligned.m16n8k16") >= um * un and spec.local_size == ([32] + [w for w in (wn, wm) if w > 1] + [1, 1])[:3]
  assert ("bar.sync" in ptx) == (stage > 0)


@pytest.mark.parametrize("shape", [(40, 72, 24), (3, 32, 16, 32)], ids=["ragged", "batch"])
def test_tensor_core_heuristic_shapes(mock, shape):
  """The heuristic's own tensor-core choice on shapes that aren't tile multiples (padded edges) and on a batch."""
  if len(shape) == 3: sa, sb = (shape[0], shape[2]), (shape[2], shape[1])
  else: sa, sb = shape[:3], (shape[0], shape[2], shape[3])
  a, b = RNG.standard_normal(sa).astype(np.float16), RNG.standard_normal(sb).astype(np.float16)
  got = (Tensor(a, device=D) @ Tensor(b, device=D)).numpy()
  np.testing.assert_allclose(got.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-3, atol=2e-2)


SM80_SCRIPT = textwrap.dedent("""
  import numpy as np, ml_dtypes
  from plugrad import Tensor
  from plugrad.device import Device
  from plugrad.dtype import dtypes
  rng = np.random.default_rng(1)
  dev = Device["MOCK+NV"]
  assert dev.renderer.arch == "sm_80", dev.renderer.arch
  a, b = rng.standard_normal((64, 64)).astype(np.float16), rng.standard_normal((64, 64)).astype(np.float16)
  got = Tensor(a).matmul(Tensor(b), dtype=dtypes.float32).numpy()
  np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-4, atol=1e-3)
  ptx = "\\n".join(k.ptx for k in dev.driver.cu.history)
  assert "mma.sync.aligned.m16n8k16" in ptx and ".target sm_80" in ptx
  x = rng.standard_normal((8, 300)).astype(np.float32)
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
  xb = x.astype(ml_dtypes.bfloat16)
  got = Tensor(x).cast(dtypes.bfloat16).sum(axis=1, dtype=dtypes.float32).numpy()
  np.testing.assert_allclose(got, xb.astype(np.float32).sum(1), rtol=1e-3, atol=1e-2)
  print("ok")
""")


def test_sm80_mock_runs_tensor_cores_and_bfloat16():
  env = {**os.environ, "DEV": D, "MOCK_NV_CC": "8.0"}
  p = subprocess.run([sys.executable, "-c", SM80_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
  assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout[-2000:] + p.stderr[-3000:]
