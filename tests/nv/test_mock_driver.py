"""The nv runtime (NVDevice, CUDADriver) on fresh instances of the mock CUDA driver: memory, copies and transfers,
queue waits and signal writes across streams, event timing, module loading rules, sticky kernel faults, and the
faults a GPU would raise or hang on — an out-of-bounds store, a misaligned vector load, a barrier some threads never
reach, shared memory over the limit — each naming the kernel, the thread and the PTX line."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from plugrad.device import Device
from plugrad.runtime.hcq import Var
from plugrad_nv import probe_mock
from plugrad_nv.compiler import pack
from plugrad_nv.device import NVDevice, NVSignal
from plugrad_nv.driver import CUDADriver, CUDAError
from plugrad_nv.mock.libcuda import MockLibCuda

pytestmark = pytest.mark.skipif(not probe_mock().ok, reason=f"MOCK+NV unavailable: {probe_mock().reason}")


def fresh(cc: str = "9.0", gpus: int = 1, vram_mb: int = 64, name: str = "MOCK+NV") -> NVDevice:
  """An NVDevice on its own mock driver (faults are sticky per driver, so tests that fault don't share one)."""
  dev = NVDevice(name, driver=CUDADriver(MockLibCuda(gpus=gpus, cc=cc, vram_mb=vram_mb)))
  dev.timeout_ms = 3000
  return dev


def kernel(dev: NVDevice, src: str, name: str):
  return dev.load(name, dev.compiler.compile(src))


def buf(dev: NVDevice, a: np.ndarray):
  b = dev.allocator.alloc(a.nbytes)
  dev.allocator.copyin(b, memoryview(a.tobytes()))
  return b


def out(dev: NVDevice, b, n: int, dt=np.float32) -> np.ndarray:
  res = bytearray(n * np.dtype(dt).itemsize)
  dev.allocator.copyout(memoryview(res), b)
  return np.frombuffer(res, dt)


def test_identity_and_ptx_only():
  dev = fresh(cc="8.0")
  assert dev.renderer.arch == "sm_80" and dev.cc == (8, 0) and "sm_80" in dev.gpu_name
  assert not dev.driver.loads_cubin and dev.compiler.keep_ptx
  with pytest.raises(ValueError, match=r"there are 1 CUDA device\(s\)"): NVDevice("MOCK+NV:2", driver=dev.driver)


def test_copies_through_staging_and_lru():
  dev = fresh()
  dev.allocator.staging_size = 1 << 12  # several staging chunks
  x = np.arange(5000, dtype=np.float32)
  b = buf(dev, x)
  np.testing.assert_array_equal(out(dev, b, 5000), x)
  lib = dev.driver.cu
  used = lib.devices[0].used
  dev.allocator.free(b, x.nbytes)
  assert dev.allocator.alloc(x.nbytes) is b and lib.devices[0].used == used  # the LRU cache hands it back
  dev.allocator.free(b, x.nbytes)
  dev.allocator.free_cache()
  assert lib.devices[0].used == used - x.nbytes


def test_out_of_memory_is_memory_error():
  dev = fresh(vram_mb=1)
  with pytest.raises(MemoryError, match="out of GPU memory"): dev.allocator.alloc(2 << 20)


def test_transfer_between_mock_gpus():
  a, b = Device["MOCK+NV"], Device["MOCK+NV:1"]
  x = np.arange(1000, dtype=np.float32)
  from plugrad import Tensor
  t = Tensor(x, device="MOCK+NV").realize().to("MOCK+NV:1")
  assert t.device == "MOCK+NV:1" and a is not b
  np.testing.assert_array_equal((t * 2).numpy(), x * 2)


def test_queue_waits_block_until_a_signal_is_written():
  """A copy-queue submission waits on a gate signal (cuStreamWaitValue64) and signals another (cuStreamWriteValue64 +
  event); Vars are patched at submit; the host releasing the gate lets the stream run."""
  dev = fresh()
  gate, done = NVSignal(dev), NVSignal(dev)
  src, dst = buf(dev, np.arange(16, dtype=np.float32)), dev.allocator.alloc(64)
  q = dev.hw_copy_queue_t().wait(gate, Var("g")).copy(dst.va_addr, src.va_addr, Var("n")).signal(done, Var("g") + 10)
  q.submit(dev, {"g": 1, "n": 32})
  dev.check_fault()
  assert done.value == 0  # blocked on the gate
  gate.value = 1
  done.wait(11, 2000)
  assert done.timestamp >= 0
  np.testing.assert_array_equal(out(dev, dst, 8), np.arange(8, dtype=np.float32))


def test_launch_timing_and_params():
  dev = fresh()
  src = ('extern "C" __global__ void axpy(float* o, const float* a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; '
         'if (i < n) o[i] = 2.0f * a[i] + n; }')
  prg = kernel(dev, src, "axpy")
  x = np.linspace(-1, 1, 300, dtype=np.float32)
  a, o = buf(dev, x), dev.allocator.alloc(x.nbytes)
  et = prg(o, a, global_size=(2, 1, 1), local_size=(256, 1, 1), vals=(300,), wait=True)
  assert et is not None and et > 0
  np.testing.assert_allclose(out(dev, o, 300), 2 * x + 300)
  h = dev.driver.cu.history[-1]
  assert (h.name, h.grid, h.block) == ("axpy", (2, 1, 1), (256, 1, 1))


def test_module_rules():
  dev = fresh(cc="8.0")
  with pytest.raises(CUDAError, match="PTX only.*cubin"): dev.load("k", pack({"kind": "cubin"}, b"\x7fELF\x02\x01\x01" + bytes(64)))
  ptx90 = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { ret; }\n\0"
  with pytest.raises(CUDAError, match=r"PTX for sm_90 can't run on this sm_80 GPU \(CUresult 218\)"): dev.load("k", pack({"kind": "ptx"}, ptx90))
  bad = b".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() {\n  frobnicate.b32 %r1;\n  ret;\n}\n\0"
  with pytest.raises(CUDAError, match=r"PTX line 5: unimplemented PTX instruction frobnicate.b32") as ei: dev.load("k", pack({"kind": "ptx"}, bad))
  assert ei.value.code == 801
  with pytest.raises(CUDAError, match="NOT_FOUND|named symbol not found"):
    dev.load("nope", pack({"kind": "ptx"}, ptx90.replace(b"sm_90", b"sm_80")))
  rc = dev.driver.cu.cuMemsetD8_v2(0, 0, 0)
  assert rc == 801 and "does not implement cuMemsetD8_v2" in dev.driver.error_string(rc)


FAULT_SRC = {
  "oob": ('extern "C" __global__ void oob(float* a) { '
          'if (blockIdx.x == 1 && threadIdx.x == 5) a[1 << 24] = 1.0f; else a[threadIdx.x] = 2.0f; }', (2, 1, 1), (32, 1, 1)),
  "misaligned": ('extern "C" __global__ void misaligned(float* a) { float4 v = *(float4*)(a + 1 + 4 * threadIdx.x); '
                 'a[64 + threadIdx.x] = v.x + v.y + v.z + v.w; }', (1, 1, 1), (8, 1, 1)),
  "barrier": ('extern "C" __global__ void early_exit(float* a) { __shared__ float s[64]; if (threadIdx.x < 16) return; '
              's[threadIdx.x] = a[threadIdx.x]; __syncthreads(); a[threadIdx.x] = s[63 - threadIdx.x]; }', (1, 1, 1), (64, 1, 1)),
}


@pytest.mark.parametrize("case", list(FAULT_SRC))
def test_kernel_faults_name_kernel_thread_and_line(case):
  dev = fresh()
  src, grid, block = FAULT_SRC[case]
  name = re.search(r"void (\w+)\(", src).group(1)
  prg = kernel(dev, src, name)
  a = buf(dev, np.zeros(256, np.float32))
  with pytest.raises(CUDAError) as ei:  # the mock runs the kernel at once: its next driver call (or synchronize) raises
    prg(a, global_size=grid, local_size=block)
    dev.synchronize()
  msg = str(ei.value)
  want = {"oob": (700, "illegal address", r"thread \(5, 0, 0\) of block \(1, 0, 0\)", r"st\.global\.[fu]32"),
          "misaligned": (716, "misaligned address", r"thread \(0, 0, 0\) of block \(0, 0, 0\)", r"ld\.global(\.nc)?\.v4\.f32"),
          "barrier": (702, "barrier not reached by all threads", r"thread \(16, 0, 0\) of block \(0, 0, 0\) waits", r"bar\.sync")}[case]
  assert ei.value.code == want[0] and want[1] in msg and f"kernel {name}" in msg, msg
  assert re.search(want[2], msg) and re.search(r"PTX line \d+ \(" + want[3], msg), msg
  if case == "barrier": assert "thread (0, 0, 0) of block (0, 0, 0) exited without reaching it" in msg
  # the fault is sticky for the context, as on a GPU
  with pytest.raises(CUDAError) as again: dev.allocator.alloc(16)
  assert again.value.code == want[0]


def test_shared_memory_over_the_limit_is_refused_at_load():
  dev = fresh()
  src = ('extern "C" __global__ void big_shared(float* a) { __shared__ float s[16385]; s[threadIdx.x] = a[threadIdx.x]; '
         '__syncthreads(); a[threadIdx.x] = s[16384 - threadIdx.x]; }')
  with pytest.raises(CUDAError) as ei: kernel(dev, src, "big_shared")
  msg = str(ei.value)
  assert ei.value.code == 218 and "kernel big_shared: 65552 bytes of static shared memory, more than the 49152" in msg, msg
  assert re.search(r"PTX line \d+", msg) and "sm_90" in msg


def test_launch_limits_are_invalid_value():
  dev = fresh()
  prg = kernel(dev, 'extern "C" __global__ void __launch_bounds__(64) k(float* a) { a[threadIdx.x] = 1; }', "k")
  a = dev.allocator.alloc(4096)
  with pytest.raises(CUDAError, match=r"128 threads per block, more than its .maxntid \(64, 1, 1\)") as ei:
    prg(a, global_size=(1, 1, 1), local_size=(128, 1, 1))
  assert ei.value.code == 1
  with pytest.raises(CUDAError, match="exceeds the limits"): prg(a, global_size=(1, 1, 1), local_size=(1, 1, 128))
  prg(a, global_size=(1, 1, 1), local_size=(64, 1, 1), wait=True)  # not sticky: the context still works


def test_wait_that_never_completes_times_out():
  dev = fresh()
  dev.timeout_ms = 50
  never = NVSignal(dev)
  dev.hw_compute_queue_t().wait(never, 1).signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
  with pytest.raises(TimeoutError, match="did not reach"): dev.synchronize()


def test_error_string_and_handles():
  lib = MockLibCuda(gpus=1, cc="9.0", vram_mb=8)
  drv = CUDADriver(lib)
  p = ctypes.POINTER(ctypes.c_char)()
  assert lib.cuGetErrorString(700, ctypes.byref(p)) == 0 and ctypes.string_at(p) == b"an illegal memory access was encountered"
  with pytest.raises(CUDAError, match="not a stream"): drv.stream_query(lib.CUstream())
  with pytest.raises(CUDAError, match="invalid device ordinal"): drv.device(3)
