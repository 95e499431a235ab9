"""Execution on a real NVIDIA GPU (skipped without one): Tensor programs on NV against numpy, the PTX path, symbolic
launches, timing, NV<->CPU and NV<->NV copies. The full conformance suite runs with `DEV=NV` (bench/nv_check.sh)."""
from __future__ import annotations

import numpy as np
import pytest

import plugrad_nv

pytestmark = pytest.mark.skipif(not plugrad_nv.probe().ok, reason=f"no usable NVIDIA GPU: {plugrad_nv.probe().reason}")


@pytest.fixture(scope="module")
def nv():
  from plugrad.device import Device
  return Device["NV"]


def T(a, dev="NV"):
  from plugrad.tensor import Tensor
  return Tensor(a, device=dev)


def test_elementwise_reduce_matmul(nv):
  rs = np.random.default_rng(0)
  a, b = rs.standard_normal((33, 300), dtype=np.float32), rs.standard_normal((300, 17), dtype=np.float32)
  np.testing.assert_allclose((T(a) * 2 + 1).numpy(), a * 2 + 1, rtol=1e-6)
  np.testing.assert_allclose(T(a).sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(T(a).max().numpy(), a.max())
  np.testing.assert_allclose((T(a) @ T(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
  h = a.astype(np.float16)
  np.testing.assert_allclose((T(h) * T(h)).numpy(), h * h, rtol=1e-2, atol=1e-2)


def test_big_and_high_rank_shapes(nv):
  a = np.arange(2 * 3 * 4 * 5 * 6, dtype=np.int32).reshape(2, 3, 4, 5, 6)
  np.testing.assert_array_equal(T(a).permute(4, 2, 0, 3, 1).contiguous().numpy(), a.transpose(4, 2, 0, 3, 1))
  big = np.ones((70000, 3), np.float32)  # y grid > 65535 blocks with narrow x
  np.testing.assert_array_equal((T(big) + 1).numpy(), big + 1)


def test_copies_and_timing(nv):
  from plugrad.device import Device
  x = np.random.default_rng(1).standard_normal(3 << 20).astype(np.float32)  # larger than one staging buffer
  t = T(x)
  np.testing.assert_array_equal(t.numpy(), x)
  np.testing.assert_array_equal(t.to("CPU").numpy(), x)
  np.testing.assert_array_equal(T(x, "CPU").to("NV").numpy(), x)
  if len([d for d in range(8) if _has(d)]) > 1: np.testing.assert_array_equal(t.to("NV:1").numpy(), x)
  nv.synchronize()
  assert Device["NV"].timeline_signal.value == Device["NV"].timeline_value - 1


def _has(i: int) -> bool:
  from plugrad_nv.device import get_driver
  return i < get_driver().device_count()


def test_program_direct_launch_symbolic_and_ptx(nv, monkeypatch):
  from plugrad.codegen import get_program
  from plugrad.dtype import dtypes
  from plugrad.uop.ops import Ops, UOp
  from plugrad_nv.compiler import NVRTCCompiler
  n = UOp(Ops.DEFINE_VAR, dtypes.index, arg=("n", 1, 1 << 20))
  i = UOp(Ops.RANGE, dtypes.index, (n,), arg=(0, "global"))
  g0, g1 = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(1 << 20), arg=0), UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(1 << 20), arg=1)
  val = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, g1.dtype, (g1, i)),)) * UOp.const(dtypes.float32, 3.0)
  ast = UOp.sink_of(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, g0.dtype, (g0, i)), val)))
  spec = get_program(ast, nv.renderer)
  x = np.arange(1 << 20, dtype=np.float32)
  for ptx in (False, True):
    prg = nv.load(spec.name, NVRTCCompiler(nv.renderer.arch, ptx=ptx).compile(spec.src))
    out, inp = nv.allocator.alloc(x.nbytes), nv.allocator.alloc(x.nbytes)
    nv.allocator.copyin(inp, memoryview(x.tobytes()))
    nv.allocator.copyin(out, memoryview(bytes(x.nbytes)))
    for nval in (1, 1000, 1 << 20):
      et = prg(out, inp, vals=(nval,), wait=True)
      assert et is not None and 0 < et < 1
      res = bytearray(x.nbytes)
      nv.allocator.copyout(memoryview(res), out)
      got = np.frombuffer(res, np.float32)
      np.testing.assert_array_equal(got[:nval], 3 * x[:nval])
