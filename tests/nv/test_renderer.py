"""CUDA renderer: golden sources, launch geometry (also symbolic), and execution of rendered kernels emulated on the
CPU (tests/nv/cuda_emu.py) compared with numpy, covering x guards, y/z mapping, folded outer ranges and grid-stride loops."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cuda_emu import CTYPES, EmulatedKernel, gxx

from plugrad.codegen import get_program
from plugrad.dtype import dtypes
from plugrad.engine.realize import buffer_for
from plugrad.uop.ops import Ops, UOp
from plugrad_nv.renderer import CUDARenderer, eval_expr, launch_dims, parse_launch


def gl(slot: int, size: int, dt=dtypes.float32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), arg=slot)
def rng(end, rid: int, kind: str = "global") -> UOp:
  return UOp(Ops.RANGE, dtypes.index, (end if isinstance(end, UOp) else UOp.const(dtypes.index, end),), arg=(rid, kind))
def load(buf: UOp, idx: UOp) -> UOp: return UOp(Ops.LOAD, buf.dtype.base, (UOp(Ops.INDEX, buf.dtype, (buf, idx)),))
def store(buf: UOp, idx: UOp, val: UOp) -> UOp: return UOp.sink_of(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, idx)), val)))


def scale_ast(n) -> UOp:
  """out[i] = in[i] * 2 for i < n (n may be a DEFINE_VAR)."""
  i = rng(n, 0)
  return store(gl(0, 4096), i, load(gl(1, 4096), i) * UOp.const(dtypes.float32, 2.0))


def test_golden_elementwise_guarded():
  src = get_program(scale_ast(300), CUDARenderer()).src
  assert src == (
    'extern "C" __global__ void __launch_bounds__(256) E_300(float* __restrict__ data0, float* __restrict__ data1) {\n'
    "  const int gidx0 = ((int)blockIdx.x*256+(int)threadIdx.x);\n"
    "  if (gidx0 < 300) {\n"
    "    float val6 = data1[gidx0];\n"
    "    float alu8 = (val6*2.0f);\n"
    "    data0[gidx0] = alu8;\n"
    "  }\n"
    "}\n"
    '/* plugrad-launch {"grid":[2,1,1],"block":[256,1,1],"vars":[]} */\n')


def test_golden_symbolic_launch():
  n = UOp(Ops.DEFINE_VAR, dtypes.index, arg=("n", 1, 4096))
  src = get_program(scale_ast(n), CUDARenderer()).src
  assert "const int n)" in src and "if (gidx0 < n) {" in src
  meta = parse_launch(src)
  assert meta == {"grid": [["cdiv", "n", 256], 1, 1], "block": [256, 1, 1], "vars": ["n"]}
  assert launch_dims(meta, (1,)) == ((1, 1, 1), (256, 1, 1)) and launch_dims(meta, (257,)) == ((2, 1, 1), (256, 1, 1))
  assert launch_dims(meta, {"n": 4096})[0] == (16, 1, 1)
  with pytest.raises(ValueError, match=r"takes 1 variable value\(s\) \['n'\], got 2"): launch_dims(meta, (1, 2))
  with pytest.raises(RuntimeError, match="needs variable 'n'"): launch_dims(meta, {})


def test_eval_expr_c_semantics():
  assert eval_expr(["//", -7, 2], {}) == -3 and eval_expr(["%", -7, 2], {}) == -1 and eval_expr(["cdiv", 7, 2], {}) == 4
  assert eval_expr(["min", ["max", "a", 3], 10], {"a": 12}) == 10
  with pytest.raises(ZeroDivisionError): eval_expr(["//", 1, "z"], {"z": 0})
  with pytest.raises(ValueError, match="no /\\* plugrad-launch"): parse_launch("__global__ void f() {}")


def test_arch_and_types():
  assert CUDARenderer.accepts_arch("sm_90") and CUDARenderer.accepts_arch("sm_90a") and not CUDARenderer.accepts_arch("gfx1100")
  with pytest.raises(ValueError, match="sm_90"): CUDARenderer("gfx1100")
  a = gl(1, 16, dtypes.float16)
  src = get_program(store(gl(0, 16, dtypes.bfloat16), (i := rng(16, 0)), load(a, i).cast(dtypes.bfloat16)), CUDARenderer()).src
  assert "#include <cuda_fp16.h>" in src and "#include <cuda_bf16.h>" in src and "__nv_bfloat16* __restrict__ data0" in src
  assert "((__nv_bfloat16)(float)val" in src  # half-like conversions go through float


def test_nan_inf_constants():
  r = CUDARenderer()
  assert r.render_const(float("nan"), dtypes.float32) == "__int_as_float(0x7fc00000)"
  assert r.render_const(float("-inf"), dtypes.float32) == "__int_as_float((int)0xff800000)"
  assert r.render_const(float("inf"), dtypes.float16) == "((half)__int_as_float(0x7f800000))"
  assert r.render_const(float("nan"), dtypes.float64).startswith("__longlong_as_double(0x7ff8")


# ---------------------------------------------------------------- emulated execution

needs_gxx = pytest.mark.skipif(gxx() is None, reason="g++/clang++ not found: the CUDA emulation compiles kernels as C++")


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
    k(arrays, tuple(si.var_vals[v] for v in spec.vars))
  return state[items[-1].bufs[0]]


class TinyGrid(CUDARenderer):
  """Tiny hardware limits so grid-stride loops and folded z ranges get exercised by small tensors."""
  grid_yz_max, grid_x_max, block_threads = 3, 2, 4


@needs_gxx
@pytest.mark.parametrize("renderer", [CUDARenderer(), TinyGrid()], ids=["default", "tiny-grid"])
@pytest.mark.parametrize("case", ["guard2d", "reduce4d", "perm5d", "narrow_x"])
def test_emulated_kernels_match_numpy(case: str, renderer: CUDARenderer):
  from plugrad.tensor import Tensor
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
  else:  # x axis of size 2, many rows: rows get block threads along y
    a = rs.standard_normal((37, 2), dtype=np.float32)
    t, want = Tensor(a, device="CPU").realize().exp2(), np.exp2(a)
  got = emulate(t, renderer)
  np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


@needs_gxx
def test_emulated_symbolic_sizes():
  n = UOp(Ops.DEFINE_VAR, dtypes.index, arg=("n", 1, 4096))
  for ren in (CUDARenderer(), TinyGrid()):
    spec = get_program(scale_ast(n), ren)
    k = EmulatedKernel(spec.name, spec.src, ["float", "float"], 1)
    x = np.arange(4096, dtype=np.float32)
    for nv in (1, 255, 256, 1000):
      out = np.full(4096, -1, np.float32)
      k([out, x], (nv,))
      np.testing.assert_array_equal(out[:nv], 2 * x[:nv])
      assert (out[nv:] == -1).all(), f"n={nv}: threads past n wrote memory"


@needs_gxx
def test_emulated_folded_range_without_launch_expression():
  """A folded (z) range whose end has no launch expression (a WHERE) is decomposed by its bound and skipped past its end."""
  n = UOp(Ops.DEFINE_VAR, dtypes.index, arg=("n", 1, 6))
  end = UOp(Ops.WHERE, dtypes.index, (n < 4, n, UOp.const(dtypes.index, 4)))  # min(n, 4) spelled as a WHERE
  r0, r1, r2 = rng(end, 0), rng(3, 1), rng(5, 2)
  idx = r0 * 15 + r1 * 5 + r2
  ast = store(gl(0, 90), idx, load(gl(1, 90), idx) + UOp.const(dtypes.float32, 1.0))
  for ren in (CUDARenderer(), TinyGrid()):
    spec = get_program(ast, ren)
    assert "continue;" in spec.src
    k = EmulatedKernel(spec.name, spec.src, ["float", "float"], 1)
    x = np.arange(90, dtype=np.float32)
    for nv in (1, 3, 6):
      out = np.full(90, -1, np.float32)
      k([out, x], (nv,))
      m = min(nv, 4) * 15
      np.testing.assert_array_equal(out[:m], x[:m] + 1)
      assert (out[m:] == -1).all()
