"""A thin Pythonic layer over the generated CUDA driver bindings (`plugrad_nv.autogen.cuda`).

The runtime (plugrad_nv.device) talks only to this interface (handles are ints or ctypes handles, errors are
`CUDAError`). `CUDADriver(lib)` calls another object with libcuda's functions and calling convention instead of the
real library: `DEV=MOCK+NV` passes the mock CUDA driver (plugrad_nv.mock.libcuda), so everything from here up runs
unchanged on the PTX interpreter. Tests of the runtime alone use a smaller fake of this class (tests/nv/fake_driver.py).
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

from plugrad_nv.autogen import cuda


class CUDAError(RuntimeError):
  """A CUDA driver call failed; `code` is the CUresult."""
  def __init__(self, msg: str, code: int = -1) -> None:
    super().__init__(msg)
    self.code = code


class CUDADriver:
  """libcuda through the generated bindings, loaded lazily by name (or `lib`: an object with the same cu* functions,
  such as the mock CUDA driver). Constructing it runs cuInit. `loads_cubin`: whether modules may be cubins (the mock
  runs PTX only, so the device compiles to PTX for it)."""
  NOT_READY = 600

  def __init__(self, lib: Any = None) -> None:
    if lib is None:
      cuda._libraries["libcuda"].load()  # LibraryNotFound (OSError) with the names tried when the driver isn't installed
      # cuEventElapsedTime_v2 only exists in CUDA 12.8+ drivers: fall back to the original symbol
      self._elapsed = cuda._libraries["libcuda"].cuEventElapsedTime
      self._elapsed.restype, self._elapsed.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_float), cuda.CUevent, cuda.CUevent]
    else: self._elapsed = lib.cuEventElapsedTime
    self.cu = cuda if lib is None else lib
    self.loads_cubin = bool(getattr(self.cu, "LOADS_CUBIN", True))
    self.check(self.cu.cuInit(0), "cuInit")

  def error_string(self, rc: int) -> str:
    p = ctypes.POINTER(ctypes.c_char)()
    if self.cu.cuGetErrorString(rc, ctypes.byref(p)) != 0 or not p: return f"CUresult {rc}"
    return ctypes.string_at(p).decode()

  def check(self, rc: int, what: str) -> None:
    if rc != 0: raise CUDAError(f"{what} failed: {self.error_string(rc)} (CUresult {rc})", rc)

  # ---- devices and contexts
  def driver_version(self) -> int:
    v = ctypes.c_int32()
    self.check(self.cu.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
    return v.value

  def device_count(self) -> int:
    n = ctypes.c_int32()
    self.check(self.cu.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    return n.value

  def device(self, index: int) -> int:
    d = ctypes.c_int32()
    self.check(self.cu.cuDeviceGet(ctypes.byref(d), index), f"cuDeviceGet({index})")
    return d.value

  def device_name(self, dev: int) -> str:
    buf = ctypes.create_string_buffer(256)
    self.check(self.cu.cuDeviceGetName(buf, 256, dev), "cuDeviceGetName")
    return buf.value.decode()

  def compute_capability(self, dev: int) -> tuple[int, int]:
    out = []
    for attr in (self.cu.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.cu.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR):
      v = ctypes.c_int32()
      self.check(self.cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev), "cuDeviceGetAttribute")
      out.append(v.value)
    return out[0], out[1]

  def primary_context(self, dev: int) -> Any:
    ctx = self.cu.CUcontext()
    self.check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    return ctx

  def set_context(self, ctx: Any) -> None: self.check(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

  # ---- memory
  def mem_alloc(self, nbytes: int) -> int:
    p = self.cu.CUdeviceptr()
    rc = self.cu.cuMemAlloc_v2(ctypes.byref(p), max(nbytes, 1))
    if rc == 2: raise MemoryError(f"cuMemAlloc of {nbytes} bytes: out of GPU memory")
    self.check(rc, f"cuMemAlloc({nbytes})")
    return p.value

  def mem_free(self, ptr: int) -> None: self.check(self.cu.cuMemFree_v2(self.cu.CUdeviceptr(ptr)), "cuMemFree")

  def host_alloc(self, nbytes: int) -> tuple[int, int]:
    """Pinned, device-mapped host memory: (host pointer, device address)."""
    p = ctypes.c_void_p()
    self.check(self.cu.cuMemHostAlloc(ctypes.byref(p), max(nbytes, 1), self.cu.CU_MEMHOSTALLOC_PORTABLE | self.cu.CU_MEMHOSTALLOC_DEVICEMAP),
               f"cuMemHostAlloc({nbytes})")
    d = self.cu.CUdeviceptr()
    self.check(self.cu.cuMemHostGetDevicePointer_v2(ctypes.byref(d), p, 0), "cuMemHostGetDevicePointer")
    return p.value, d.value

  def host_free(self, host_ptr: int) -> None: self.check(self.cu.cuMemFreeHost(ctypes.c_void_p(host_ptr)), "cuMemFreeHost")

  # ---- streams and events
  def stream_create(self) -> Any:
    s = self.cu.CUstream()
    self.check(self.cu.cuStreamCreate(ctypes.byref(s), self.cu.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    return s

  def stream_query(self, stream: Any) -> bool:
    """True when the stream is idle; raises the stream's error if a kernel faulted."""
    rc = self.cu.cuStreamQuery(stream)
    if rc == self.NOT_READY: return False
    self.check(rc, "cuStreamQuery")
    return True

  def stream_sync(self, stream: Any) -> None: self.check(self.cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

  def event_create(self) -> Any:
    e = self.cu.CUevent()
    self.check(self.cu.cuEventCreate(ctypes.byref(e), self.cu.CU_EVENT_DEFAULT), "cuEventCreate")
    return e

  def event_record(self, ev: Any, stream: Any) -> None: self.check(self.cu.cuEventRecord(ev, stream), "cuEventRecord")

  def event_elapsed_ms(self, start: Any, end: Any) -> float | None:
    """Milliseconds between two recorded events; None while either hasn't completed."""
    ms = ctypes.c_float()
    rc = self._elapsed(ctypes.byref(ms), start, end)
    if rc == self.NOT_READY: return None
    self.check(rc, "cuEventElapsedTime")
    return ms.value

  def write_value64(self, stream: Any, addr: int, value: int) -> None:
    rc = self.cu.cuStreamWriteValue64_v2(stream, self.cu.CUdeviceptr(addr), value, self.cu.CU_STREAM_WRITE_VALUE_DEFAULT)
    self.check(rc, "cuStreamWriteValue64")

  def wait_value64(self, stream: Any, addr: int, value: int) -> None:
    self.check(self.cu.cuStreamWaitValue64_v2(stream, self.cu.CUdeviceptr(addr), value, self.cu.CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue64")

  def memcpy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
    self.check(self.cu.cuMemcpyAsync(self.cu.CUdeviceptr(dst), self.cu.CUdeviceptr(src), nbytes, stream), "cuMemcpyAsync")

  # ---- modules and launches
  def module_load(self, image: bytes) -> Any:
    m = self.cu.CUmodule()
    buf = ctypes.create_string_buffer(image, len(image))
    self.check(self.cu.cuModuleLoadData(ctypes.byref(m), buf), "cuModuleLoadData")
    return m

  def module_function(self, module: Any, name: str) -> Any:
    f = self.cu.CUfunction()
    self.check(self.cu.cuModuleGetFunction(ctypes.byref(f), module, ctypes.create_string_buffer(name.encode())), f"cuModuleGetFunction({name})")
    return f

  def module_unload(self, module: Any) -> None: self.cu.cuModuleUnload(module)

  def launch(self, fn: Any, grid: Sequence[int], block: Sequence[int], stream: Any, params: Any, shared: int = 0) -> None:
    g, b = (list(grid) + [1, 1])[:3], (list(block) + [1, 1])[:3]
    self.check(self.cu.cuLaunchKernel(fn, *g, *b, shared, stream, ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p)), None),
               f"cuLaunchKernel(grid={tuple(g)}, block={tuple(b)})")
