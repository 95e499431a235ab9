"""CUDA renderer: golden sources of the GPU ops (SPECIAL, DEFINE_LOCAL, BARRIER, IF/ENDIF, WMMA) on hand-built linear
programs (gpu_programs.py) and of today's loop kernels, and execution of rendered kernels on the CPU by the CUDA
emulator (cuda_emu.py: one OS thread per CUDA thread, real barriers, mma by the PTX register layout) against numpy."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cuda_emu import CTYPES, EmulatedKernel, gxx
from gpu_programs import f16, f32, group_sum_program, linear, mma_coords, scale_program, special, wmma_program

from plugrad.codegen import get_program
from plugrad.codegen.linearize import linearize
from plugrad.codegen.targets import CUDA
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.engine.realize import buffer_for
from plugrad.schedule import kernelize
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.symbolic import sym_infer
from plugrad_nv.renderer import CUDARenderer


def gl(slot: int, size: int, dt=dtypes.float32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), arg=slot)
def rng(end, rid: int, kind: str = "global") -> UOp:
  return UOp(Ops.RANGE, dtypes.index, (end if isinstance(end, UOp) else UOp.const(dtypes.index, end),), arg=(rid, kind))
def load(buf: UOp, idx: UOp) -> UOp: return UOp(Ops.LOAD, buf.dtype.base, (UOp(Ops.INDEX, buf.dtype, (buf, idx)),))
def store(buf: UOp, idx: UOp, val: UOp) -> UOp: return UOp.sink_of(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, idx)), val)))


def scale_ast(n) -> UOp:
  """out[i] = in[i] * 2 for i < n (n may be a DEFINE_VAR)."""
  i = rng(n, 0)
  return store(gl(0, 4096), i, load(gl(1, 4096), i) * UOp.const(dtypes.float32, 2.0))


def test_golden_special_and_if():
  uops, _, _ = scale_program(300)
  assert CUDARenderer().render("k", uops) == (
    'extern "C" __global__ void __launch_bounds__(64) k(float* __restrict__ data0, float* __restrict__ data1) {\n'
    "  const int gidx0 = (int)blockIdx.x;\n"
    "  const int lidx0 = (int)threadIdx.x;\n"
    "  int alu6 = (gidx0*64);\n"
    "  int alu7 = (alu6+lidx0);\n"
    "  bool alu9 = (alu7<300);\n"
    "  if (alu9) {\n"
    "    float val13 = data1[alu7];\n"
    "    float alu15 = (val13*2.0f);\n"
    "    data0[alu7] = alu15;\n"
    "  }\n"
    "}\n")


def test_golden_shared_memory_barrier():
  src = CUDARenderer().render("k", group_sum_program(5)[0])
  assert src == (
    'extern "C" __global__ void __launch_bounds__(64) k(float* __restrict__ data0, float* __restrict__ data1) {\n'
    "  const int gidx0 = (int)blockIdx.x;\n"
    "  const int lidx0 = (int)threadIdx.x;\n"
    "  __shared__ __align__(16) float temp0[64];\n"
    "  int alu8 = (gidx0*64);\n"
    "  int alu9 = (alu8+lidx0);\n"
    "  float val11 = data1[alu9];\n"
    "  temp0[lidx0] = val11;\n"
    "  __syncthreads();\n"
    "  bool alu15 = (lidx0==0);\n"
    "  if (alu15) {\n"
    "    float acc0[1];\n"
    "    acc0[0] = 0.0f;\n"
    "    for (int ridx1 = 0; ridx1 < 64; ridx1++) {\n"
    "      float val24 = acc0[0];\n"
    "      float val26 = temp0[ridx1];\n"
    "      float alu27 = (val24+val26);\n"
    "      acc0[0] = alu27;\n"
    "    }\n"
    "    float val33 = acc0[0];\n"
    "    data0[gidx0] = val33;\n"
    "  }\n"
    "}\n")


@pytest.mark.parametrize("din,ty", [(dtypes.float16, "f16"), (dtypes.bfloat16, "bf16")])
def test_golden_wmma(din, ty: str):
  src = CUDARenderer().render("k", wmma_program(din)[0])
  t, v = ("half", "float16") if din == dtypes.float16 else ("__nv_bfloat16", "bfloat16")
  tc = f"WMMA_16_8_16_{'half' if din == dtypes.float16 else 'bfloat16'}_float"
  assert f'asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, ' in src
  assert f"__device__ __forceinline__ pg_float32_4 pg_wmma_{tc}(pg_{v}_8 a, pg_{v}_4 b, pg_float32_4 c) {{" in src
  assert f"struct __align__(16) pg_{v}_8 {{ {t} v[8];" in src and f"struct __align__(8) pg_{v}_4 {{ {t} v[4];" in src
  assert f"pg_{v}_8 alu51 = pg_{v}_8{{val22, val27, val32, val35, val39, val44, val47, val50}};" in src
  assert f"pg_float32_4 alu82 = pg_wmma_{tc}(alu51, alu68, alu81);" in src and "float alu83 = alu82[0];" in src
  assert "__launch_bounds__(32)" in src


def test_wmma_shapes_it_cannot_render():
  a, b, c = (UOp(Ops.VECTORIZE, f16.vec(n), tuple(UOp.const(f16, 1.0) for _ in range(n))) for n in (8, 4, 4))
  bad = UOp(Ops.WMMA, f32.vec(4), (a, b, UOp(Ops.VECTORIZE, f32.vec(4), (UOp.const(f32, 0.0),) * 4)), arg="WMMA_16_16_16_half_float")
  with pytest.raises(NotImplementedError, match="m16n8k16"): CUDARenderer().render("k", linear(bad))
  with pytest.raises(ValueError, match="not a tensor-core name"): CUDARenderer().render("k", linear(UOp(Ops.WMMA, f32.vec(4), (a, b, c), arg="mma")))


def test_bad_special_name():
  for bad in ("widx0", "gidx3", "lidx"):
    with pytest.raises(ValueError, match=rf"one of gidx0..2, lidx0..2, got '{bad}'"): CUDARenderer().render("k", linear(special(bad, 4)))


def test_tensor_core_layout_matches_ptx():
  """codegen/tc.py's lane layout of the CUDA tensor cores (data) equals the PTX ISA fragment formulas the emulator uses."""
  tc = pytest.importorskip("plugrad.codegen.tc", reason="codegen/tc.py (GPU codegen) not on this branch yet")
  for t in tc.TC_CUDA_SM80:
    for op, n in (("a", 8), ("b", 4), ("c", 4)):
      cells = [(lane, j) for lane in range(32) for j in range(n)]
      assert [t.layout(op).coord(lane, j) for lane, j in cells] == [mma_coords(op, lane, j) for lane, j in cells]


def test_loop_kernel_without_ids():
  """A linear program without SPECIAL ids runs its loops in one thread; no launch metadata anywhere in the source."""
  src = CUDARenderer().render("E_300", linearize(scale_ast(300)))
  assert src == (
    'extern "C" __global__ void __launch_bounds__(1) E_300(float* __restrict__ data0, float* __restrict__ data1) {\n'
    "  for (int gidx0 = 0; gidx0 < 300; gidx0++) {\n"
    "    float val6 = data1[gidx0];\n"
    "    float alu8 = (val6*2.0f);\n"
    "    data0[gidx0] = alu8;\n"
    "  }\n"
    "}\n")


def test_no_comments_in_kernels():
  """No metadata rides in kernel sources: hand-built GPU programs and what codegen makes (group sums, tiled tensor cores)."""
  srcs = [CUDARenderer().render("k", uops) for uops in (scale_program(300)[0], group_sum_program(3)[0], wmma_program()[0],
                                                          wmma_program(dtypes.bfloat16)[0])]
  a, h = Tensor.empty(4096, 1024, device="CPU"), Tensor.empty(256, 256, dtype=dtypes.float16, device="CPU")
  srcs += [get_program(t.schedule(optimize=False)[-1].ast, CUDARenderer()).src for t in (a.sum(1), a.sum(), h @ h)]
  for src in srcs: assert "/*" not in src and "//" not in src


def test_arch_and_types():
  assert CUDARenderer.accepts_arch("sm_90") and CUDARenderer.accepts_arch("sm_90a") and not CUDARenderer.accepts_arch("gfx1100")
  with pytest.raises(ValueError, match="sm_90"): CUDARenderer("gfx1100")
  a = gl(1, 16, dtypes.float16)
  src = get_program(store(gl(0, 16, dtypes.bfloat16), (i := rng(16, 0)), load(a, i).cast(dtypes.bfloat16)), CUDARenderer()).src
  assert "#include <cuda_fp16.h>" in src and "#include <cuda_bf16.h>" in src and "__nv_bfloat16* __restrict__ data0" in src
  assert "((__nv_bfloat16)(float)val" in src  # half-like conversions go through float


def test_capabilities_are_data():
  r = CUDARenderer().caps
  assert (r.has_local, r.has_shared, r.warp_size, r.local_max_threads, r.shared_max) == (True, True, 32, 1024, 48 * 1024)
  assert r.global_max == (2**31 - 1, 65535, 65535) and r.local_max == (1024, 1024, 64)
  assert r == CUDA.caps()   # the target record's, not a copy


def test_nan_inf_constants():
  r = CUDARenderer()
  assert r.render_const(float("nan"), dtypes.float32) == "__int_as_float(0x7fc00000)"
  assert r.render_const(float("-inf"), dtypes.float32) == "__int_as_float((int)0xff800000)"
  assert r.render_const(float("inf"), dtypes.float16) == "((half)__int_as_float(0x7f800000))"
  assert r.render_const(float("nan"), dtypes.float64).startswith("__longlong_as_double(0x7ff8")


# ---------------------------------------------------------------- emulated execution

needs_gxx = pytest.mark.skipif(gxx() is None, reason="g++/clang++ not found: the CUDA emulation compiles kernels as C++")


def launch_dims(spec, vals: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(grid, block) of a ProgramSpec: its global/local sizes with the variables bound (one thread without local sizes)."""
  vv = {v: vals[v.arg[0]] for v in spec.vars}
  grid = tuple(int(sym_infer(g, vv)) for g in spec.global_size)
  return grid, tuple(spec.local_size) if spec.local_size is not None else (1, 1, 1)


def emulate(t, renderer: CUDARenderer) -> np.ndarray:
  """Run every kernel of `t`'s schedule through the emulator; inputs come from realized CPU buffers."""
  state: dict[UOp, np.ndarray] = {}
  items = t.schedule()
  for si in items:
    assert si.ast.op is Ops.SINK, "emulate() handles kernels only"
    arrays = []
    for b in si.bufs:
      if b not in state: state[b] = buffer_for(b).numpy().copy() if buffer_for(b).is_allocated else np.zeros(b.arg, b.dtype.np)
      arrays.append(state[b])
    spec = get_program(si.ast, renderer)
    k = EmulatedKernel(spec.name, spec.src, [CTYPES[g.dtype.base.name] for g in spec.globals], len(spec.vars))
    vals = {v.arg[0]: x for v, x in si.var_vals.items()}
    k(arrays, tuple(vals[v.arg[0]] for v in spec.vars), *launch_dims(spec, vals))
  return state[items[-1].bufs[0]]


@needs_gxx
@pytest.mark.parametrize("case", ["guard2d", "reduce4d", "perm5d", "sum_full", "matmul_f16", "matmul_f16_tiles"])
def test_emulated_kernels_match_numpy(case: str):
  """Tensor kernels as codegen makes them for CUDA (hardware ids, group reductions and tensor cores where the GPU
  optimizer picks them), launched with their ProgramSpec sizes."""
  rs = np.random.default_rng(0)
  if case == "guard2d":
    a, b = rs.standard_normal((5, 300), dtype=np.float32), rs.standard_normal((1, 300), dtype=np.float32)
    t, want = Tensor(a, device="CPU").realize() * Tensor(b, device="CPU").realize() + 1, a * b + 1
  elif case == "reduce4d":
    a = rs.standard_normal((3, 5, 6, 7), dtype=np.float32)
    t, want = Tensor(a, device="CPU").realize().sum(axis=3), a.sum(axis=3)
  elif case == "perm5d":
    a = rs.integers(-50, 50, (2, 3, 4, 5, 6)).astype(np.int32)
    t, want = Tensor(a, device="CPU").realize().permute(4, 2, 0, 3, 1) * 3, a.transpose(4, 2, 0, 3, 1) * 3
  elif case == "sum_full":
    a = rs.standard_normal(1 << 14, dtype=np.float32)
    t, want = Tensor(a, device="CPU").realize().sum(), np.array(a.astype(np.float64).sum())
  elif case == "matmul_f16_tiles":  # 2 x 2 workgroups of 2 x 2 warps, A/B tiles through shared memory over 4 K steps
    a, b = rs.integers(-2, 3, (128, 64)).astype(np.float16), rs.integers(-2, 3, (64, 64)).astype(np.float16)
    t, want = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize(), (a.astype(np.float32) @ b.astype(np.float32))
  else:
    a, b = rs.integers(-2, 3, (32, 64)).astype(np.float16), rs.integers(-2, 3, (64, 32)).astype(np.float16)
    t, want = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize(), (a.astype(np.float32) @ b.astype(np.float32))
  got = emulate(t, CUDARenderer())
  np.testing.assert_allclose(got.reshape(want.shape).astype(np.float64), want, rtol=1e-5, atol=1e-4)


@needs_gxx
def test_emulated_one_kernel_softmax(monkeypatch: pytest.MonkeyPatch):
  """Softmax as the scheduler makes it for a GPU renderer (one kernel: a workgroup per row, GROUP max and sum, the row
  written by the group's threads), rendered for CUDA and run with real barriers."""
  cpu = Device["CPU"].renderer
  gpu = {k: getattr(CUDARenderer.caps, k) for k in ("has_local", "has_shared", "local_max_threads")}
  monkeypatch.setattr(cpu, "caps", dataclasses.replace(cpu.caps, **gpu))
  monkeypatch.setattr(kernelize, "_SCHEDULE_CACHE", {})
  x = np.random.default_rng(3).standard_normal((6, 300)).astype(np.float32)
  t = Tensor(x, device="CPU").realize().softmax(-1)
  assert len([it for it in t.schedule() if it.ast.op is Ops.SINK]) == 1
  e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
  np.testing.assert_allclose(emulate(t, CUDARenderer()).reshape(6, 300), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


@needs_gxx
def test_emulated_special_ids_symbolic_size():
  n = UOp(Ops.DEFINE_VAR, dtypes.int32, arg=("n", 1, 4096))
  uops, _, local = scale_program(n)
  k = EmulatedKernel("k", CUDARenderer().render("k", uops), ["float", "float"], 1)
  x = np.arange(4096, dtype=np.float32)
  for nv in (1, 63, 64, 1000):
    out = np.full(4096, -1, np.float32)
    k([out, x], (nv,), (-(-nv // 64), 1, 1), local)
    np.testing.assert_array_equal(out[:nv], 2 * x[:nv])
    assert (out[nv:] == -1).all(), f"n={nv}: threads past n wrote memory"


@needs_gxx
def test_emulated_shared_memory_group_sum():
  uops, grid, block = group_sum_program(7)
  k = EmulatedKernel("k", CUDARenderer().render("k", uops), ["float", "float"], 0)
  x = np.random.default_rng(1).standard_normal((7, 64)).astype(np.float32)
  out = np.zeros(7, np.float32)
  k([out, x], (), grid, block)
  np.testing.assert_allclose(out, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


@needs_gxx
def test_emulated_wmma_f16():
  """Each lane loads exactly its PTX fragment of A, B and C; the WMMA result, stored by the C layout, is A @ B + C."""
  uops, grid, block = wmma_program()
  k = EmulatedKernel("k", CUDARenderer().render("k", uops), ["float", "half", "half", "float"], 0)
  rs = np.random.default_rng(2)
  for _ in range(3):
    a, b = rs.standard_normal((16, 16)).astype(np.float16), rs.standard_normal((16, 8)).astype(np.float16)
    c = rs.standard_normal((16, 8)).astype(np.float32)
    d = np.full((16, 8), np.nan, np.float32)
    k([d, a, b, c], (), grid, block)
    np.testing.assert_allclose(d, a.astype(np.float64) @ b.astype(np.float64) + c, rtol=1e-5, atol=1e-5)
