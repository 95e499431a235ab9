"""DEV=MOCK+AMD end to end on the RDNA3 emulator (issue 15): Tensor programs go through the renderer, clang-19's real
gfx1100 code object, the KFD runtime's PM4 queues and the mock's packet decoding to the emulator, which executes the
machine code. Each feature test checks the code object that ran (llvm-objdump-19, independent of the emulator's own
decoder) for the instructions the feature must produce: LDS and s_barrier for group reductions, v_wmma for the f16
matmul, a kernarg-read variable for symbolic shapes. Also TinyJit replay, sin over the whole float32 range (the
renderer's range reduction), examples/demo.py, and the errors: an unimplemented instruction names its mnemonic,
opcode and the kernel; a page fault names the address."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import plugrad.engine.realize as realize
from plugrad import Tensor, TinyJit, Variable
from plugrad.device import Device
from plugrad.dtype import dtypes, f32_to_fp8, fp8_to_f32
from plugrad_amd.compiler import AMDGPUCompiler
from plugrad_amd.device import AMDDevice
from plugrad_amd.mock import dispatch, rdna3
from plugrad_amd.mock.kfd import MockKFD

pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("clang-19", "ld.lld-19", "llvm-objdump-19")),
                                reason="clang-19/lld-19/llvm-19 not installed (make sysdeps)")
D = "MOCK+AMD"
ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def emulator():
  """The shared mock with the RDNA3 emulator as its executor (other tests may swap executors on fresh mocks)."""
  Device[D]
  prev = dispatch.set_executor(rdna3.execute)
  mock = MockKFD.instance()
  assert mock.fault is None, mock.fault
  yield mock
  dispatch.set_executor(prev)


def ran_since(mock: MockKFD, start: int) -> list[tuple[str, str]]:
  """(kernel name, llvm-objdump disassembly) of every kernel dispatched on the mock since dispatch number `start`."""
  by_kd = {r.prg.kd_addr: r for r in realize._RUNNERS.values() if hasattr(r.prg, "kd_addr")}
  out = []
  for d in mock.dispatches[start:]:
    r = by_kd[d.kernel_object]
    out.append((r.spec.name, AMDGPUCompiler("gfx1100").disassemble(r.prg.lib)))
  return out


def mnemonics(disasm: str) -> set[str]:
  return {m.group(1) for m in re.finditer(r"^\s+([a-z_0-9]+)\b.*//", disasm, re.M)}


def test_elementwise_and_reduce_run_the_machine_code(emulator):
  start, n0 = len(emulator.dispatches), rdna3.STATS.instructions
  x = RNG.standard_normal((37, 19)).astype(np.float32)
  out = ((Tensor(x, device=D) * 3 - 1).exp2().sum(axis=1)).numpy()
  np.testing.assert_allclose(out, np.exp2(x * 3 - 1).sum(1), rtol=2e-6)
  assert rdna3.STATS.instructions > n0 and len(emulator.dispatches) > start
  assert all("s_endpgm" in mnemonics(d) for _, d in ran_since(emulator, start))


def test_group_reduction_uses_lds_and_barriers(emulator):
  """A 2**16-element sum: core's GPU heuristic makes it a group reduction (256 threads, partial sums in LDS between
  s_barriers); the emulator runs 8 waves per workgroup round-robin between barriers."""
  a = RNG.random(2**16).astype(np.float32)
  start = len(emulator.dispatches)
  got = Tensor(a, device=D).sum().numpy()
  np.testing.assert_allclose(got, a.astype(np.float64).sum(), rtol=1e-5)
  ops = set().union(*(mnemonics(d) for _, d in ran_since(emulator, start)))
  assert "s_barrier" in ops and any(o.startswith("ds_store") for o in ops) and any(o.startswith("ds_load") for o in ops), sorted(ops)
  assert max(d.workgroup_size[0] for d in emulator.dispatches[start:]) > 32  # more than one wave shares the LDS


@pytest.mark.parametrize("n", [64, 48])
def test_wmma_f16_matmul(emulator, n: int):
  """f16 x f16 -> f32 matmul on the tensor cores: v_wmma_f32_16x16x16_f16 in the code that ran, values against numpy
  (float32 accumulation of exact f16 products). 48 is not a multiple of the 16x16x16 tile's blocking: padded edges."""
  a, b = RNG.standard_normal((n, n)).astype(np.float16), RNG.standard_normal((n, n)).astype(np.float16)
  start = len(emulator.dispatches)
  got = Tensor(a, device=D).matmul(Tensor(b, device=D), dtype=dtypes.float32).numpy()
  np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5, atol=1e-4)
  ops = set().union(*(mnemonics(d) for _, d in ran_since(emulator, start)))
  if n % 16 == 0: assert "v_wmma_f32_16x16x16_f16" in ops, sorted(ops)


def test_symbolic_shapes_compile_once(emulator):
  v = Variable("rows", 1, 40)
  x, w = RNG.standard_normal((40, 24)).astype(np.float32), RNG.standard_normal((24, 8)).astype(np.float32)
  xt, wt = Tensor(x, device=D), Tensor(w, device=D)
  def run(n: int) -> np.ndarray: return (xt[:v.bind(n)] @ wt).relu().softmax(axis=1).numpy()
  run(3)
  compiles = realize.GlobalCounters["compiles"]
  for n in (1, 17, 40):
    start = len(emulator.dispatches)
    e = np.exp(np.maximum(x[:n] @ w, 0) - np.maximum(x[:n] @ w, 0).max(1, keepdims=True))
    np.testing.assert_allclose(run(n), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert any(d.grid_size[0] * d.grid_size[1] >= n for d in emulator.dispatches[start:])
  assert realize.GlobalCounters["compiles"] == compiles  # one code object per kernel for every bound value


def test_symbolic_causal_attention(emulator):
  t = Variable("seq", 1, 12)
  q = RNG.standard_normal((1, 2, 12, 4)).astype(np.float32)
  for T in (2, 7):
    qt = Tensor(q, device=D)[:, :, :t.bind(T)]
    out = qt.scaled_dot_product_attention(qt, qt, is_causal=True).numpy()
    qq = q[:, :, :T]
    sc = qq @ qq.transpose(0, 1, 3, 2) / 2.0 + np.triu(np.full((T, T), -np.inf), 1)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True) @ qq, rtol=1e-5, atol=1e-6)


def test_tinyjit_replays_on_the_emulator(emulator):
  w = Tensor(RNG.standard_normal((16, 16)).astype(np.float32), device=D).realize()
  @TinyJit
  def step(x: Tensor) -> Tensor: return ((x @ w).relu().contiguous() * 2 + 1).sum(axis=1).realize()  # two kernels: one batch
  wn = w.numpy()
  for i in range(5):
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    start = len(emulator.dispatches)
    np.testing.assert_allclose(step(Tensor(x, device=D).realize()).numpy(), (np.maximum(x @ wn, 0) * 2 + 1).sum(1), rtol=1e-5, atol=1e-5)
    if i >= 2: assert len(emulator.dispatches) > start  # replays dispatch the captured kernels on the emulator
  assert step.plan and any(b is not None for b, _, _ in step.plan), "replay through AMDDevice.batch_runner"


def test_tinyjit_with_a_symbolic_shape(emulator):
  v = Variable("n", 1, 32)
  x = RNG.standard_normal(32).astype(np.float32)
  xt = Tensor(x, device=D).realize()
  @TinyJit
  def f(n) -> Tensor: return (xt[:n] * 2 + 1).sum().realize()
  for n in (5, 9, 32, 17, 5):
    np.testing.assert_allclose(f(v.bind(n)).numpy(), (x[:n] * 2 + 1).sum(), rtol=1e-5)


def test_sin_over_the_whole_float32_range(emulator):
  """The conformance failure this fixed: sin/cos of 1e5, 3e18, 1e30 (v_sin_f32 alone takes x/2pi, rounded)."""
  x = np.concatenate([[0, -0.0, 100.0, -1000.0, 12345.6, 65535.99, 65536, 1e5, 3e18, -3e18, 1e30, 3.4e38, 1e-40, np.inf, -np.inf, np.nan],
                      RNG.uniform(-30, 30, 100), 10 ** RNG.uniform(0, 38, 100)]).astype(np.float32)
  with np.errstate(invalid="ignore"): want_s, want_c = np.sin(x.astype(np.float64)), np.cos(x.astype(np.float64))
  np.testing.assert_allclose(Tensor(x, device=D).sin().numpy(), want_s, atol=2e-7, rtol=0)
  np.testing.assert_allclose(Tensor(x, device=D).cos().numpy(), want_c, atol=5e-7, rtol=0)


def test_fp8_conversions_on_gfx1100(emulator):
  """gfx1100 has no fp8 instructions: the software conversions run on the emulator, every code both ways."""
  codes = np.arange(256, dtype=np.uint8)
  for dt in (dtypes.fp8e4m3, dtypes.fp8e5m2):
    f = Tensor(codes, device=D).bitcast(dt).cast(dtypes.float32).numpy()
    want = fp8_to_f32(codes, dt)
    assert ((f == want) | (np.isnan(f) & np.isnan(want))).all()
    vals = np.concatenate([want[np.isfinite(want)], RNG.standard_normal(200) * 100, [1e6, -1e6, np.inf, np.nan]]).astype(np.float32)
    back = Tensor(vals, device=D).cast(dt).bitcast(dtypes.uint8).numpy()
    assert np.array_equal(back, f32_to_fp8(vals, dt))


def test_unimplemented_instruction_names_its_opcode_and_the_kernel():
  """A kernel using an instruction the emulator doesn't implement (s_sethalt) faults the device with its mnemonic,
  encoding, opcode and kernel name."""
  dev = Device[D]
  src = ('target triple = "amdgcn-amd-amdhsa"\n'
         'define amdgpu_kernel void @halting_kernel(ptr addrspace(1) %data0) #0 {\nentry:\n'
         '  call void asm sideeffect "s_sethalt 0", ""()\n  store i32 1, ptr addrspace(1) %data0\n  ret void\n}\n'
         'attributes #0 = { nounwind "amdgpu-flat-work-group-size"="1,32" "target-cpu"="gfx1100" "amdgpu-no-implicitarg-ptr" }\n')

  mock = MockKFD(1, 64 << 20)
  d = AMDDevice("MOCK+AMD", os_iface=mock)
  prg = d.load("halting_kernel", dev.compiler.compile_cached(src))
  buf = d.allocator.alloc(64)
  with pytest.raises(RuntimeError) as ei: prg(buf, global_size=(1, 1, 1), local_size=(32, 1, 1), wait=True)
  msg = str(ei.value)
  assert "s_sethalt" in msg and "halting_kernel" in msg and "SOPP" in msg and "opcode" in msg, msg


def test_page_fault_names_the_address():
  src = ('target triple = "amdgcn-amd-amdhsa"\n'
         'define amdgpu_kernel void @wild_store(ptr addrspace(1) %data0) #0 {\nentry:\n'
         '  %p = getelementptr inbounds i32, ptr addrspace(1) %data0, i64 268435456\n  store i32 7, ptr addrspace(1) %p\n  ret void\n}\n'
         'attributes #0 = { nounwind "amdgpu-flat-work-group-size"="1,1" "target-cpu"="gfx1100" "amdgpu-no-implicitarg-ptr" }\n')

  d = AMDDevice("MOCK+AMD", os_iface=MockKFD(1, 64 << 20))
  prg = d.load("wild_store", d.compiler.compile_cached(src))
  buf = d.allocator.alloc(64)
  with pytest.raises(RuntimeError, match=rf"page fault: access of 4 byte\(s\) at {buf.va_addr + (1 << 30):#x}"):
    prg(buf, global_size=(1, 1, 1), local_size=(1, 1, 1), wait=True)


@pytest.mark.slow
def test_demo_runs_under_mock_amd():
  env = {**os.environ, "DEV": D}
  p = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True, env=env, timeout=600)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
  assert "default device: MOCK+AMD (renderer AMDGPU)" in p.stdout, p.stdout
  err = float(re.search(r"max \|error\| vs numpy: (\S+)", p.stdout).group(1))
  assert err < 1e-4 and "([1, 2, 3] * 2) on MOCK+AMD: [2, 4, 6]" in p.stdout, p.stdout
