"""The NV runtime (HCQ queues on streams/events, allocator, programs) against a fake CUDA driver: no GPU needed."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver

from plugrad.runtime.hcq import Var
from plugrad.runtime.compiler import Compiler
from plugrad_nv.compiler import pack
from plugrad_nv.device import NVDevice, NVSignal
from plugrad_nv.driver import CUDAError


class NoCompiler(Compiler):
  def __init__(self) -> None: super().__init__(None)


def make(drv: FakeDriver | None = None, name: str = "NV", timeout_ms: int = 2000) -> NVDevice:
  dev = NVDevice(name, driver=drv or FakeDriver(), compiler=NoCompiler())
  dev.timeout_ms = timeout_ms
  return dev


def args(params, types: list[str]) -> list[int]:
  """Decode cuLaunchKernel's void** params: 'p' a u64 device pointer, 'i' an int32."""
  ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
  return [(ctypes.c_uint64 if t == "p" else ctypes.c_int32).from_address(ptrs[i]).value for i, t in enumerate(types)]


def saxpy(drv: FakeDriver):
  """out[i] = 2*a[i] + n for i < n, run over the whole grid with a guard, like a rendered kernel."""
  def k(grid, block, params):
    out, a, n = args(params, ["p", "p", "i"])
    total = grid[0] * block[0]
    assert total >= n, f"grid {grid} x block {block} does not cover n={n}"
    o = np.ctypeslib.as_array((ctypes.c_float * n).from_address(out))
    x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(a))
    o[:] = 2 * x + n
  drv.kernels["saxpy"] = k


def test_device_identity_and_arch():
  dev = make(FakeDriver(cc=(8, 6)))
  assert dev.gpu_name == "Fake GPU 0" and dev.renderer.arch == "sm_86"
  with pytest.raises(ValueError, match=r"there are 1 CUDA device\(s\)"): make(name="NV:3")


def test_copy_roundtrip_through_staging_chunks():
  drv = FakeDriver()
  dev = make(drv)
  dev.allocator.staging_size = 1 << 12  # force several staging chunks
  x = np.arange(5000, dtype=np.float32)
  buf = dev.allocator.alloc(x.nbytes)
  dev.allocator.copyin(buf, memoryview(x.tobytes()))
  out = bytearray(x.nbytes)
  dev.allocator.copyout(memoryview(out), buf)
  np.testing.assert_array_equal(np.frombuffer(out, np.float32), x)
  copies = [e for e in drv.log if e.endswith(":copy")]
  assert len(copies) == 2 * -(-x.nbytes // 4096) and all(e.startswith("s1:") for e in copies)  # on the copy stream


def test_lru_reuses_and_frees_through_driver():
  drv = FakeDriver()
  dev = make(drv)
  a = dev.allocator.alloc(1024)
  live = drv.live_bytes()
  dev.allocator.free(a, 1024)
  assert dev.allocator.alloc(1024) is a and drv.live_bytes() == live
  dev.allocator.free(a, 1024)
  dev.allocator.free_cache()
  assert drv.live_bytes() == live - 1024
  with pytest.raises(CUDAError, match="not a device allocation"): drv.mem_free(a.va_addr)


def test_program_launch_dims_passed_and_timing():
  """Launch sizes come with each call (the engine takes them from ProgramSpec.global_size/local_size)."""
  drv = FakeDriver()
  saxpy(drv)
  dev = make(drv)
  meta = {"kind": "cubin", "arch": "sm_90"}
  prg = dev.load("saxpy", pack(meta, b"FAKEsaxpy"))
  for n in (1, 300, 1000):
    a, out = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * n)
    x = np.linspace(-1, 1, n, dtype=np.float32)
    dev.allocator.copyin(a, memoryview(x.tobytes()))
    et = prg(out, a, global_size=(-(-n // 256), 1, 1), local_size=(256, 1, 1), vals=(n,), wait=True)
    assert drv.launches[-1][1:3] == ((-(-n // 256), 1, 1), (256, 1, 1))
    assert et is not None and et > 0
    res = bytearray(4 * n)
    dev.allocator.copyout(memoryview(res), out)
    np.testing.assert_allclose(np.frombuffer(res, np.float32), 2 * x + n)
  prg(out, a, vals=(1,), wait=True)  # no sizes: one block of one thread (a kernel without SPECIAL ids)
  assert drv.launches[-1][1:3] == ((1, 1, 1), (1, 1, 1))
  with pytest.raises(ValueError, match="local_size"): prg(out, a, global_size=(1, 1, 1), local_size=(0, 1, 1), vals=(1,))
  with pytest.raises(TypeError, match="NV buffers"): prg(np.zeros(4), a, vals=(1,))
  with pytest.raises(CUDAError, match="NOT_FOUND"): dev.load("nope", pack(meta, b"FAKEsaxpy"))
  with pytest.raises(ValueError, match="bad magic"): dev.load("saxpy", b"\x7fELF....")


def test_queue_vars_patched_at_submit_and_cross_stream_wait():
  drv = FakeDriver()
  dev = make(drv)
  gate, done = NVSignal(dev), NVSignal(dev)
  src, dst = dev.allocator.alloc(64), dev.allocator.alloc(64)
  dev.allocator.copyin(src, memoryview(bytes(range(64))))
  q = dev.hw_copy_queue_t().wait(gate, Var("g")).copy(dst.va_addr, src.va_addr, Var("n")).signal(done, Var("g") + 10)
  q.submit(dev, {"g": 1, "n": 16})
  assert done.value == 0  # blocked on the gate
  gate.value = 1
  drv.pump()
  assert done.value == 11 and done.timestamp > 0
  out = bytearray(64)
  dev.allocator.copyout(memoryview(out), dst)
  assert bytes(out[:16]) == bytes(range(16)) and bytes(out[16:]) == bytes(48)
  q.submit(dev, {"g": 2, "n": 64})  # same recorded queue, new values
  gate.value = 2
  drv.pump()
  dev.allocator.copyout(memoryview(out), dst)
  assert done.value == 12 and bytes(out) == bytes(range(64))
  with pytest.raises(ValueError, match=r"no value for queue variable\(s\) \['g', 'n'\]"): q.submit(dev)


def test_transfer_between_devices():
  drv = FakeDriver(n_devices=2)
  d0, d1 = make(drv, "NV"), make(drv, "NV:1")
  a, b = d0.allocator.alloc(32), d1.allocator.alloc(32)
  d0.allocator.copyin(a, memoryview(bytes(range(32))))
  d1.allocator.transfer(b, a, 32, d0, d1)
  out = bytearray(32)
  d1.allocator.copyout(memoryview(out), b)
  assert bytes(out) == bytes(range(32))


def test_kernel_fault_surfaces_on_synchronize():
  drv = FakeDriver()
  def bad(grid, block, params): raise MemoryError("simulated illegal address")
  drv.kernels["bad"] = bad
  dev = make(drv)
  prg = dev.load("bad", pack({"kind": "cubin"}, b"FAKEbad"))
  prg(dev.allocator.alloc(4))
  with pytest.raises(CUDAError, match="simulated illegal address"): dev.synchronize()


def test_wait_that_never_completes_times_out():
  dev = make(timeout_ms=50)
  never = NVSignal(dev)
  dev.hw_compute_queue_t().wait(never, 1).signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
  with pytest.raises(TimeoutError, match="did not reach"): dev.synchronize()
