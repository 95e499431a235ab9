"""The NV device: HCQ (plugrad.runtime.hcq) on CUDA streams and events through the driver API.

- Signals are 64-bit slots in pinned, device-mapped host memory: the host reads/writes them directly, queues write
  them with cuStreamWriteValue64 and wait on them with cuStreamWaitValue64 (>=). Each signal also owns an event,
  recorded by signal/timestamp commands; its timestamp is the event's time since the device's base event.
- Queues replay their recorded commands on a stream (compute queue: one stream, copy queue: another), with Vars
  resolved at submit: exec -> cuLaunchKernel, copy -> cuMemcpyAsync, memory_barrier is implied by stream order.
- Memory: cuMemAlloc through the LRU cache; host=True buffers are pinned (cuMemHostAlloc) and serve as the staging
  buffers of copyin/copyout; NV<->NV transfers are queue copies (UVA).
- Programs: cubin/PTX from `NVRTCCompiler`, launched with the grid (blocks per dim) and block (threads per dim) the
  caller passes: the engine takes them from `ProgramSpec.global_size/local_size`.
- Interfaces: `NV` (or `CUDA+NV`) is libcuda; `MOCK+NV` is the same runtime on the mock CUDA driver
  (plugrad_nv.mock.libcuda: mock GPUs whose kernels the PTX interpreter runs), imported only then. A driver whose
  library loads no cubins (the mock) gets kernels compiled to PTX.
`NVDevice(name, driver=...)` accepts any object with `plugrad_nv.driver.CUDADriver`'s methods (tests use a fake).
"""
from __future__ import annotations

import ctypes
import importlib
import threading
from typing import Any

from plugrad.device import BufferOptions, parse_device
from plugrad.helpers import getenv
from plugrad.runtime.hcq import HCQAllocator, HCQArgsState, HCQBuffer, HCQCompiled, HCQProgram, HWQueue, Signal
from plugrad_nv.compiler import NVRTCCompiler, unpack
from plugrad_nv.driver import CUDADriver, CUDAError
from plugrad_nv.renderer import CUDARenderer

_DRIVERS: dict[str, Any] = {}
_DRIVER_LOCK = threading.Lock()


def get_driver(iface: str | None = None) -> Any:
  """The process-wide CUDADriver of an interface (cuInit runs once): libcuda for CUDA (the default), the mock CUDA
  driver for MOCK."""
  key = (iface or "CUDA").upper()
  if key not in ("CUDA", "MOCK"): raise ValueError(f"NV has no interface {key} (it has CUDA, the default, and MOCK)")
  with _DRIVER_LOCK:
    if key not in _DRIVERS:
      lib = importlib.import_module("plugrad_nv.mock.libcuda").MockLibCuda.instance() if key == "MOCK" else None
      _DRIVERS[key] = CUDADriver(lib)
    return _DRIVERS[key]


class NVSignal(Signal):
  def __init__(self, dev: NVDevice, value: int = 0) -> None:
    self.host_ptr, self.dev_addr = dev.signal_slot()
    self._mem = ctypes.c_uint64.from_address(self.host_ptr)
    self.event = dev.driver.event_create()
    self.recorded = False
    super().__init__(dev, value)

  def _read_value(self) -> int: return self._mem.value
  def _write_value(self, v: int) -> None: self._mem.value = v
  def _read_timestamp(self) -> int:
    if not self.recorded: return 0
    ms = self.dev.driver.event_elapsed_ms(self.dev.base_event, self.event)
    return 0 if ms is None else int(ms * 1e6)


class NVQueue(HWQueue):
  """Commands replayed on one of the device's streams (`stream_attr`)."""
  stream_attr = "compute_stream"

  def _submit(self, dev: NVDevice, encoded: Any, var_vals: dict[str, int]) -> None:  # type: ignore[override]
    drv, stream = dev.driver, getattr(dev, self.stream_attr)
    dev.make_current()
    cmds = self.resolved(var_vals)
    for i, c in enumerate(cmds):
      try: self._replay(drv, stream, c)
      except CUDAError:
        # the driver refused a command (a launch over the limits, ...): still write this submission's signal values so
        # the timeline moves on (later work and synchronize must not hang on it), then report the error
        for later in cmds[i + 1:]:
          if later.op == "signal":
            try: drv.write_value64(stream, later.args[0].dev_addr, later.args[1])
            except CUDAError: pass
        raise

  @staticmethod
  def _replay(drv: Any, stream: Any, c: Any) -> None:
    if c.op == "signal":
      sig, v = c.args
      drv.event_record(sig.event, stream)
      sig.recorded = True
      drv.write_value64(stream, sig.dev_addr, v)
    elif c.op == "wait": drv.wait_value64(stream, c.args[0].dev_addr, c.args[1])
    elif c.op == "timestamp":
      drv.event_record(c.args[0].event, stream)
      c.args[0].recorded = True
    elif c.op == "memory_barrier": pass  # stream order makes earlier writes visible
    elif c.op == "exec":
      prg, st, gsz, lsz = c.args
      drv.launch(prg.fn, gsz, lsz, stream, st.params)
    elif c.op == "copy": drv.memcpy_async(c.args[0], c.args[1], c.args[2], stream)
    else: raise ValueError(f"NV queue: unknown command {c.op}")


class NVCopyQueue(NVQueue):
  stream_attr = "copy_stream"


class NVAllocator(HCQAllocator):
  def _alloc(self, size: int, options: BufferOptions) -> HCQBuffer:
    drv = self.dev.driver
    self.dev.make_current()
    if options.external_ptr is not None: return HCQBuffer(options.external_ptr, size, meta=("external", options.external_ptr))
    if options.host or options.cpu_access:
      host, dptr = drv.host_alloc(size)
      view = memoryview((ctypes.c_uint8 * max(size, 1)).from_address(host)).cast("B")[:size]
      return HCQBuffer(dptr, size, view, meta=("host", host))
    return HCQBuffer(drv.mem_alloc(size), size, meta=("device", None))

  def _free(self, opaque: HCQBuffer, size: int, options: BufferOptions) -> None:
    kind, host = opaque.meta
    if kind == "external": return
    self.dev.synchronize()  # the GPU may still use it
    self.dev.make_current()
    if kind == "host": self.dev.driver.host_free(host)
    else: self.dev.driver.mem_free(opaque.va_addr)


class NVArgsState(HCQArgsState):
  """Kernel parameters as cuLaunchKernel wants them: an array of pointers to each argument's value."""
  def __init__(self, prg: NVProgram, bufs: tuple[HCQBuffer, ...], vals: tuple[int, ...]) -> None:
    super().__init__(prg, bufs, vals)
    self.values = [ctypes.c_uint64(b.va_addr) for b in bufs] + [ctypes.c_int32(v) for v in vals]
    self.params = (ctypes.c_void_p * max(len(self.values), 1))(*[ctypes.addressof(v) for v in self.values])


class NVProgram(HCQProgram):
  """A loaded kernel: `prg(*bufs, global_size=blocks, local_size=threads per block, vals=..., wait=...)`."""
  dev: NVDevice

  def __init__(self, dev: NVDevice, name: str, lib: bytes) -> None:
    super().__init__(dev, name, lib)
    self.meta, binary = unpack(lib)
    dev.make_current()
    self.module = dev.driver.module_load(binary)
    self.fn = dev.driver.module_function(self.module, name)

  def fill_kernargs(self, bufs: tuple[HCQBuffer, ...], vals: tuple[int, ...]) -> NVArgsState:
    if any(not isinstance(b, HCQBuffer) for b in bufs):
      raise TypeError(f"{self.name}: NV kernels take NV buffers, got {[type(b).__name__ for b in bufs]}")
    return NVArgsState(self, bufs, vals)

  def __del__(self) -> None:
    try: self.dev.driver.module_unload(self.module)
    except Exception: pass


class NVDevice(HCQCompiled):
  """An NVIDIA GPU (`NV`, `NV:1`, `NV::sm_90`, `NV::PTX`-style arch/renderer selection via the DEV grammar), or a
  mock one (`MOCK+NV`, `MOCK+NV:1`)."""
  def __init__(self, device: str, driver: Any = None, compiler: Any = None) -> None:
    self.driver = driver if driver is not None else get_driver(parse_device(device).iface)
    idx = parse_device(device).index
    if not 0 <= idx < (n := self.driver.device_count()): raise ValueError(f"device {device}: there are {n} CUDA device(s) (NV:0 .. NV:{n - 1})")
    self.cu_device = self.driver.device(idx)
    self.gpu_name = self.driver.device_name(self.cu_device)
    self.cc = self.driver.compute_capability(self.cu_device)
    self.context = self.driver.primary_context(self.cu_device)
    self.make_current()
    self.compute_stream, self.copy_stream = self.driver.stream_create(), self.driver.stream_create()
    self.base_event = self.driver.event_create()
    self.driver.event_record(self.base_event, self.compute_stream)
    self._sig_page: tuple[int, int] | None = None
    self._sig_next = 0
    arch = f"sm_{self.cc[0]}{self.cc[1]}"
    renderer = type("CUDARenderer", (CUDARenderer,), {"default_arch": arch})
    keep_ptx = not getattr(self.driver, "loads_cubin", True)
    if compiler is None: compiler = lambda r: NVRTCCompiler(r.arch, ptx=bool(getenv("NV_PTX", 0)), keep_ptx=keep_ptx)
    super().__init__(device, NVAllocator, [renderer], compiler, NVProgram,
                     NVSignal, NVQueue, NVCopyQueue, timeout_ms=getenv("NV_TIMEOUT_MS", 30000))

  def make_current(self) -> None: self.driver.set_context(self.context)

  def signal_slot(self) -> tuple[int, int]:
    """8 bytes of pinned, device-mapped memory for a signal: (host pointer, device address)."""
    if self._sig_page is None or self._sig_next + 8 > 4096:
      self._sig_page, self._sig_next = self.driver.host_alloc(4096), 0
      ctypes.memset(self._sig_page[0], 0, 4096)
    host, dev = self._sig_page
    self._sig_next += 8
    return host + self._sig_next - 8, dev + self._sig_next - 8

  def check_fault(self) -> None:
    for s in (self.compute_stream, self.copy_stream): self.driver.stream_query(s)  # raises CUDAError if a kernel faulted

  def synchronize(self) -> None:
    super().synchronize()
    self.check_fault()
