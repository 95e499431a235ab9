"""Execution on a real NVIDIA GPU (skipped without one): Tensor programs on NV against numpy, hand-built programs with
SPECIAL ids (symbolic sizes, the PTX path), shared memory + barriers and mma.sync tensor cores launched with explicit
sizes, timing, NV<->CPU and NV<->NV copies. The full conformance suite runs with `DEV=NV` (bench/nv_check.sh)."""
from __future__ import annotations

import numpy as np
import pytest

import sys
from pathlib import Path

import plugrad_nv

sys.path.insert(0, str(Path(__file__).parent))

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
  big = np.ones((70000, 3), np.float32)  # more rows than a y/z grid dim holds
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


def _run(nv, uops, bufs: list[np.ndarray], grid, block, vals=(), ptx: bool = False) -> list[np.ndarray]:
  """Render, compile and launch a hand-built program on the GPU with explicit launch sizes; the buffers after it."""
  from plugrad_nv.compiler import NVRTCCompiler
  prg = nv.load("k", NVRTCCompiler(nv.renderer.arch, ptx=ptx).compile(nv.renderer.render("k", uops)))
  dbufs = [nv.allocator.alloc(max(b.nbytes, 4)) for b in bufs]
  for d, b in zip(dbufs, bufs): nv.allocator.copyin(d, memoryview(np.ascontiguousarray(b).tobytes()))
  et = prg(*dbufs, global_size=tuple(map(int, grid)), local_size=tuple(block), vals=tuple(vals), wait=True)
  assert et is not None and 0 < et < 1
  out = []
  for d, b in zip(dbufs, bufs):
    res = bytearray(b.nbytes)
    nv.allocator.copyout(memoryview(res), d)
    out.append(np.frombuffer(res, b.dtype).reshape(b.shape))
  return out


def test_special_ids_symbolic_and_ptx(nv):
  from plugrad.dtype import dtypes
  from plugrad.uop.ops import Ops, UOp
  from gpu_programs import scale_program
  uops, _, block = scale_program(UOp(Ops.DEFINE_VAR, dtypes.int32, arg=("n", 1, 4096)))
  x = np.arange(4096, dtype=np.float32)
  for ptx in (False, True):
    for nval in (1, 1000, 4096):
      got = _run(nv, uops, [np.full(4096, -1, np.float32), x], (-(-nval // 64), 1, 1), block, (nval,), ptx)[0]
      np.testing.assert_array_equal(got[:nval], 2 * x[:nval])
      assert (got[nval:] == -1).all()


def test_shared_memory_group_sum(nv):
  from gpu_programs import group_sum_program
  uops, grid, block = group_sum_program(100)
  x = np.random.default_rng(3).standard_normal((100, 64)).astype(np.float32)
  got = _run(nv, uops, [np.zeros(100, np.float32), x], grid, block)[0]
  np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("din", ["float16", "bfloat16"])
def test_wmma_mma_sync(nv, din: str):
  """The fragment layout on hardware: each lane's A/B/C fragments as gpu_programs.mma_coords says, D = A @ B + C."""
  from plugrad.dtype import bf16_to_f32, dtypes, f32_to_bf16
  from gpu_programs import wmma_program
  uops, grid, block = wmma_program(getattr(dtypes, din))
  rs = np.random.default_rng(4)
  a32, b32 = rs.integers(-4, 5, (16, 16)).astype(np.float32), rs.integers(-4, 5, (16, 8)).astype(np.float32)
  c = rs.standard_normal((16, 8)).astype(np.float32)
  enc = (lambda v: v.astype(np.float16)) if din == "float16" else f32_to_bf16
  a, b = enc(a32), enc(b32)
  if din == "bfloat16": assert (bf16_to_f32(a) == a32).all()
  got = _run(nv, uops, [np.zeros((16, 8), np.float32), a, b, c], grid, block)[0]
  np.testing.assert_allclose(got, a32 @ b32 + c, rtol=1e-6, atol=1e-5)
