"""A mock CUDA driver (`DEV=MOCK+NV`): the libcuda functions the nv runtime calls, with libcuda's calling convention
(ctypes out-parameters by reference, opaque handles, CUresult codes), over mock GPUs whose kernels the PTX
interpreter (plugrad_nv.mock.ptx) runs. `plugrad_nv.driver.CUDADriver(lib=MockLibCuda.instance())` calls it exactly
where it would call the generated bindings of the real libcuda, so the runtime above (plugrad_nv.device: HCQ
signals, queues, allocator, programs) runs unchanged.

The mock GPUs (MOCK_NV_GPUS of them, default 2) report compute capability MOCK_NV_CC ("9.0" by default; a comma
list gives each GPU its own, e.g. "8.0,9.0") and MOCK_NV_VRAM_MB of memory each (default 1024). Their memory is host
memory (plugrad_nv.mock.memory.Arena), so device addresses are host addresses as with unified addressing. Streams
run their work in order when it is enqueued or queried (a `cuStreamWaitValue64` that isn't satisfied stalls its
stream until something writes the value); events take the host's clock when their stream reaches them. Modules must
be PTX (the mock has no SASS to run: a cubin is CUDA_ERROR_INVALID_IMAGE, so the device compiles to PTX under
MOCK, see `LOADS_CUBIN`). A kernel fault (illegal or misaligned address, a barrier some threads never reach, a
trap) is sticky for the context, as on a GPU: every later call on it returns the fault's code, and
`cuGetErrorString` of that code gives the interpreter's message naming the kernel, the thread and the PTX line.
Never imported by the real runtime.
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from plugrad_nv.autogen import cuda as _cuda
from plugrad_nv.mock.memory import AccessFault, Arena
from plugrad_nv.mock.ptx import KernelFault, LoadedModule, PTXError, PTXSyntaxError, Unimplemented, compile_ptx
from plugrad_nv.mock.ptx.machine import check_launch

DRIVER_VERSION = 13000
SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, NOT_INITIALIZED, INVALID_DEVICE = 0, 1, 2, 3, 101
INVALID_IMAGE, INVALID_CONTEXT, INVALID_PTX, INVALID_HANDLE, NOT_FOUND, NOT_READY = 200, 201, 218, 400, 500, 600
ILLEGAL_ADDRESS, LAUNCH_TIMEOUT, MISALIGNED, LAUNCH_FAILED, NOT_SUPPORTED = 700, 702, 716, 719, 801
ERROR_TEXT = {
  SUCCESS: "no error", INVALID_VALUE: "invalid argument", OUT_OF_MEMORY: "out of memory", NOT_INITIALIZED: "initialization error",
  INVALID_DEVICE: "invalid device ordinal", INVALID_IMAGE: "device kernel image is invalid", INVALID_CONTEXT: "invalid device context",
  INVALID_PTX: "a PTX JIT compilation failed", INVALID_HANDLE: "invalid resource handle", NOT_FOUND: "named symbol not found",
  NOT_READY: "device not ready", ILLEGAL_ADDRESS: "an illegal memory access was encountered",
  LAUNCH_TIMEOUT: "the launch timed out and was terminated", MISALIGNED: "misaligned address",
  LAUNCH_FAILED: "unspecified launch failure", NOT_SUPPORTED: "operation not supported"}
FAULT_CODES = {"illegal address": ILLEGAL_ADDRESS, "misaligned address": MISALIGNED, "barrier": LAUNCH_TIMEOUT,
               "timeout": LAUNCH_TIMEOUT, "trap": LAUNCH_FAILED, "internal": LAUNCH_FAILED, "invalid": LAUNCH_FAILED}
SM_COUNT = {8: 108, 9: 132}


class CUError(Exception):
  """Internal: a call fails with `code`; `detail` goes into cuGetErrorString's text."""
  def __init__(self, code: int, detail: str = "") -> None:
    super().__init__(detail)
    self.code, self.detail = code, detail


def _handle(h: Any) -> int:
  """The integer value of an opaque handle argument (a ctypes pointer, c_void_p or int)."""
  if h is None: return 0
  if isinstance(h, int): return h
  if isinstance(h, ctypes.c_uint64): return h.value
  return ctypes.cast(h, ctypes.c_void_p).value or 0


def _out(ref: Any, value: int | float) -> None:
  """Store into an out-parameter passed as ctypes.byref(x)."""
  obj = getattr(ref, "_obj", ref)
  if isinstance(obj, (ctypes._Pointer, ctypes.c_void_p)) or type(obj).__name__.startswith("LP_"):
    ctypes.memmove(ctypes.addressof(obj), ctypes.byref(ctypes.c_uint64(int(value))), 8)
  else: obj.value = value


def api(fn: Callable) -> Callable:
  """A driver entry point: CUError -> its code (remembered for cuGetErrorString); a sticky context fault is returned first."""
  @functools.wraps(fn)
  def call(self: MockLibCuda, *args: Any) -> int:
    with self.lock:
      try:
        if self.sticky is not None and fn.__name__ not in ("cuGetErrorString", "cuDriverGetVersion"): return self.sticky[0]
        fn(self, *args)
        return SUCCESS
      except CUError as e:
        self.details[e.code] = e.detail
        return e.code
  return call


class Device:
  def __init__(self, index: int, cc: tuple[int, int], vram: int) -> None:
    self.index, self.cc, self.vram, self.used = index, cc, vram, 0
    self.name = f"plugrad mock GPU sm_{cc[0]}{cc[1]} (PTX interpreter)"


class Stream:
  def __init__(self, handle: int, dev: int) -> None:
    self.handle, self.dev = handle, dev
    self.ops: deque[tuple] = deque()


@dataclass(frozen=True)
class Launch:
  """A kernel that ran: its name, grid, block, the GPU and the PTX it was loaded from."""
  name: str
  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  device: int
  ptx: str


class Event:
  def __init__(self) -> None:
    self.t: float | None = None
    self.pending = False


class MockLibCuda:
  """The mock driver: `cu*` functions returning CUresult codes; types and constants are libcuda's own (the generated
  bindings', which load nothing by themselves)."""
  LOADS_CUBIN = False  # kernels must come as PTX: the interpreter has no SASS
  _instance: MockLibCuda | None = None
  _instance_lock = threading.Lock()

  def __init__(self, gpus: int | None = None, cc: str | tuple[int, int] | None = None, vram_mb: int | None = None) -> None:
    n = gpus if gpus is not None else int(os.environ.get("MOCK_NV_GPUS", "2"))
    ccs = cc if cc is not None else os.environ.get("MOCK_NV_CC", "9.0")
    cc_list = [ccs] if isinstance(ccs, tuple) else [_parse_cc(s) for s in str(ccs).split(",")]
    vram = (vram_mb if vram_mb is not None else int(os.environ.get("MOCK_NV_VRAM_MB", "1024"))) << 20
    if n < 1: raise ValueError("a mock CUDA driver needs at least one GPU")
    self.devices = [Device(i, cc_list[i % len(cc_list)], vram) for i in range(n)]
    self.arena = Arena(n * vram + (256 << 20))
    self.lock = threading.RLock()
    self.sticky: tuple[int, str] | None = None
    self.details: dict[int, str] = {}
    self.initialized = False
    self._ids = itertools.count(0x100000, 0x10)
    self.contexts: dict[int, int] = {}          # handle -> device index
    self.current: int | None = None
    self.streams: dict[int, Stream] = {}
    self.events: dict[int, Event] = {}
    self.modules: dict[int, LoadedModule] = {}
    self.functions: dict[int, tuple[int, str]] = {}
    self.host_allocs: set[int] = set()
    self._strings: dict[int, ctypes.Array] = {}
    self.history: deque[Launch] = deque(maxlen=4096)  # the latest kernels run, for tests and debugging

  @classmethod
  def instance(cls) -> MockLibCuda:
    """The process-wide mock (what DEV=MOCK+NV opens)."""
    with cls._instance_lock:
      if cls._instance is None: cls._instance = cls()
      return cls._instance

  def __getattr__(self, name: str) -> Any:
    if name.startswith("cu") and name[2:3].isupper():
      def missing(*args: Any) -> int:
        self.details[NOT_SUPPORTED] = f"the mock CUDA driver does not implement {name}"
        return NOT_SUPPORTED
      return missing
    return getattr(_cuda, name)

  # ---- helpers
  def _new(self) -> int: return next(self._ids)

  def _dev(self) -> Device:
    if not self.initialized: raise CUError(NOT_INITIALIZED, "cuInit has not been called")
    if self.current is None: raise CUError(INVALID_CONTEXT, "no current context (cuCtxSetCurrent)")
    return self.devices[self.contexts[self.current]]

  def _stream(self, h: Any) -> Stream:
    s = self.streams.get(_handle(h))
    if s is None: raise CUError(INVALID_HANDLE, f"{_handle(h):#x} is not a stream")
    return s

  def _event(self, h: Any) -> Event:
    e = self.events.get(_handle(h))
    if e is None: raise CUError(INVALID_HANDLE, f"{_handle(h):#x} is not an event")
    return e

  def _enqueue(self, s: Stream, *op: Any) -> None:
    s.ops.append(op)
    self.pump()

  # ---- init, devices, contexts
  @api
  def cuInit(self, flags: int) -> None:
    if flags != 0: raise CUError(INVALID_VALUE, "cuInit flags must be 0")
    self.initialized = True

  @api
  def cuDriverGetVersion(self, ver: Any) -> None: _out(ver, DRIVER_VERSION)

  def cuGetErrorString(self, rc: int, pstr: Any) -> int:
    text = ERROR_TEXT.get(int(rc))
    if text is None: return INVALID_VALUE
    if (d := self.details.get(int(rc))): text = f"{text}: {d}"
    buf = ctypes.create_string_buffer(text.encode())
    self._strings[int(rc)] = buf
    _out(pstr, ctypes.addressof(buf))
    return SUCCESS

  @api
  def cuDeviceGetCount(self, n: Any) -> None:
    if not self.initialized: raise CUError(NOT_INITIALIZED, "cuInit has not been called")
    _out(n, len(self.devices))

  @api
  def cuDeviceGet(self, d: Any, ordinal: int) -> None:
    if not 0 <= ordinal < len(self.devices): raise CUError(INVALID_DEVICE, f"device {ordinal}: there are {len(self.devices)}")
    _out(d, ordinal)

  def _device(self, dev: Any) -> Device:
    i = dev.value if isinstance(dev, ctypes.c_int32) else int(dev)
    if not 0 <= i < len(self.devices): raise CUError(INVALID_DEVICE, f"device {i}: there are {len(self.devices)}")
    return self.devices[i]

  @api
  def cuDeviceGetName(self, buf: Any, size: int, dev: Any) -> None:
    name = self._device(dev).name.encode()[:size - 1] + b"\0"
    ctypes.memmove(buf, name, len(name))

  @api
  def cuDeviceGetAttribute(self, out: Any, attr: int, dev: Any) -> None:
    d = self._device(dev)
    c = _cuda
    table = {c.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: d.cc[0], c.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: d.cc[1],
             c.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 1024, c.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: 1024,
             c.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: 1024, c.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: 64,
             c.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: 2**31 - 1, c.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: 65535,
             c.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: 65535, c.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: 48 * 1024,
             c.CU_DEVICE_ATTRIBUTE_WARP_SIZE: 32, c.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: SM_COUNT.get(d.cc[0], 100),
             c.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: 1, c.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: 65536,
             c.CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: 65536, c.CU_DEVICE_ATTRIBUTE_CLOCK_RATE: 1_500_000}
    if int(attr) not in table: raise CUError(INVALID_VALUE, f"device attribute {int(attr)} is not modelled by the mock")
    _out(out, table[int(attr)])

  @api
  def cuDevicePrimaryCtxRetain(self, pctx: Any, dev: Any) -> None:
    d = self._device(dev)
    h = next((k for k, v in self.contexts.items() if v == d.index), None)
    if h is None:
      h = self._new()
      self.contexts[h] = d.index
    _out(pctx, h)

  @api
  def cuCtxSetCurrent(self, ctx: Any) -> None:
    h = _handle(ctx)
    if h and h not in self.contexts: raise CUError(INVALID_CONTEXT, f"{h:#x} is not a context")
    self.current = h or None

  @api
  def cuCtxSynchronize(self) -> None:
    self.pump()
    for s in self.streams.values():
      if s.dev == self._dev().index and s.ops: raise CUError(LAUNCH_TIMEOUT, "a stream waits on a value nothing will write (it would hang)")

  # ---- memory
  @api
  def cuMemAlloc_v2(self, pptr: Any, size: int) -> None:
    d = self._dev()
    if size == 0: raise CUError(INVALID_VALUE, "cuMemAlloc of 0 bytes")
    if d.used + size > d.vram: raise CUError(OUT_OF_MEMORY, f"{size} bytes requested, {d.vram - d.used} of {d.vram} free on GPU {d.index}")
    try: p = self.arena.alloc(size, "device", d.index)
    except MemoryError as e: raise CUError(OUT_OF_MEMORY, str(e)) from None
    d.used += size
    _out(pptr, p)

  @api
  def cuMemFree_v2(self, ptr: Any) -> None:
    p = _handle(ptr)
    a = self.arena.find(p)
    if a is None or a.start != p or a.kind != "device": raise CUError(INVALID_VALUE, f"cuMemFree({p:#x}): not a device allocation")
    self.pump()
    self.arena.free(p)
    self.devices[a.device].used -= a.size

  @api
  def cuMemHostAlloc(self, pp: Any, size: int, flags: int) -> None:
    self._dev()
    if size == 0: raise CUError(INVALID_VALUE, "cuMemHostAlloc of 0 bytes")
    try: p = self.arena.alloc(size, "host", None)
    except MemoryError as e: raise CUError(OUT_OF_MEMORY, str(e)) from None
    self.host_allocs.add(p)
    _out(pp, p)

  @api
  def cuMemHostGetDevicePointer_v2(self, pdptr: Any, p: Any, flags: int) -> None:
    h = _handle(p)
    a = self.arena.find(h)
    if a is None or a.kind != "host": raise CUError(INVALID_VALUE, f"{h:#x} is not pinned host memory")
    _out(pdptr, h)

  @api
  def cuMemFreeHost(self, p: Any) -> None:
    h = _handle(p)
    if h not in self.host_allocs: raise CUError(INVALID_VALUE, f"cuMemFreeHost({h:#x}): not a host allocation")
    self.pump()
    self.host_allocs.discard(h)
    self.arena.free(h)

  @api
  def cuMemGetInfo_v2(self, free: Any, total: Any) -> None:
    d = self._dev()
    _out(free, d.vram - d.used)
    _out(total, d.vram)

  # ---- streams and events
  @api
  def cuStreamCreate(self, ps: Any, flags: int) -> None:
    d = self._dev()
    h = self._new()
    self.streams[h] = Stream(h, d.index)
    _out(ps, h)

  @api
  def cuStreamDestroy_v2(self, s: Any) -> None:
    st = self._stream(s)
    self.pump()
    del self.streams[st.handle]

  @api
  def cuStreamQuery(self, s: Any) -> None:
    st = self._stream(s)
    self.pump()
    if st.ops: raise CUError(NOT_READY, "")

  @api
  def cuStreamSynchronize(self, s: Any) -> None:
    st = self._stream(s)
    self.pump()
    if st.ops: raise CUError(LAUNCH_TIMEOUT, "the stream waits on a value nothing will write (cuStreamSynchronize would hang)")

  @api
  def cuEventCreate(self, pe: Any, flags: int) -> None:
    self._dev()
    h = self._new()
    self.events[h] = Event()
    _out(pe, h)

  @api
  def cuEventDestroy_v2(self, e: Any) -> None: self.events.pop(_handle(e), None)

  @api
  def cuEventRecord(self, e: Any, s: Any) -> None:
    ev, st = self._event(e), self._stream(s)
    ev.pending = True
    self._enqueue(st, "record", ev)

  @api
  def cuEventQuery(self, e: Any) -> None:
    ev = self._event(e)
    self.pump()
    if ev.pending: raise CUError(NOT_READY, "")

  @api
  def cuEventElapsedTime(self, pms: Any, a: Any, b: Any) -> None:
    ea, eb = self._event(a), self._event(b)
    self.pump()
    if ea.pending or eb.pending: raise CUError(NOT_READY, "")
    if ea.t is None or eb.t is None: raise CUError(INVALID_HANDLE, "an event that was never recorded")
    _out(pms, (eb.t - ea.t) * 1e3)

  cuEventElapsedTime_v2 = cuEventElapsedTime

  @api
  def cuStreamWriteValue64_v2(self, s: Any, addr: Any, value: int, flags: int) -> None:
    self._enqueue(self._stream(s), "write", _handle(addr), int(value))

  @api
  def cuStreamWaitValue64_v2(self, s: Any, addr: Any, value: int, flags: int) -> None:
    if int(flags) & ~0x3 and int(flags) != 1 << 30: raise CUError(INVALID_VALUE, f"cuStreamWaitValue64 flags {flags}")
    self._enqueue(self._stream(s), "wait", _handle(addr), int(value), int(flags) & 0x3)

  @api
  def cuMemcpyAsync(self, dst: Any, src: Any, n: int, s: Any) -> None:
    self._enqueue(self._stream(s), "copy", _handle(dst), _handle(src), int(n))

  # ---- modules and launches
  @api
  def cuModuleLoadData(self, pmod: Any, image: Any) -> None:
    d = self._dev()
    raw = image.raw if hasattr(image, "raw") else ctypes.string_at(image)
    if raw[:4] == b"\x7fELF":
      raise CUError(INVALID_IMAGE, "the mock GPU runs PTX only, this image is a cubin (ELF): compile to PTX (NVRTCCompiler(keep_ptx=True))")
    text = raw.split(b"\0", 1)[0].decode(errors="replace")
    if ".entry" not in text and ".func" not in text: raise CUError(INVALID_IMAGE, "the image is neither a cubin nor PTX text")
    if (m := re.search(r"^\s*\.target\s+sm_(\d+)", text, re.M)) and int(m.group(1)) > d.cc[0] * 10 + d.cc[1]:
      raise CUError(INVALID_PTX, f"PTX for sm_{m.group(1)} can't run on this sm_{d.cc[0]}{d.cc[1]} GPU")
    try: mod = LoadedModule(compile_ptx(text), self.arena, d.index, d.cc)
    except (PTXSyntaxError, PTXError) as e: raise CUError(INVALID_PTX, str(e)) from None
    except Unimplemented as e: raise CUError(NOT_SUPPORTED, f"the PTX interpreter does not implement this: {e}") from None
    except KernelFault as e: raise CUError(INVALID_PTX, str(e)) from None
    h = self._new()
    self.modules[h] = mod
    _out(pmod, h)

  @api
  def cuModuleGetFunction(self, pf: Any, mod: Any, name: Any) -> None:
    h = _handle(mod)
    m = self.modules.get(h)
    if m is None: raise CUError(INVALID_HANDLE, f"{h:#x} is not a module")
    n = (name.value if hasattr(name, "value") else ctypes.string_at(name)).decode()
    f = m.prog.functions.get(n)
    if f is None or f.kind != "entry": raise CUError(NOT_FOUND, f"no kernel {n} in the module")
    fh = self._new()
    self.functions[fh] = (h, n)
    _out(pf, fh)

  @api
  def cuModuleUnload(self, mod: Any) -> None:
    h = _handle(mod)
    m = self.modules.pop(h, None)
    if m is None: raise CUError(INVALID_HANDLE, f"{h:#x} is not a module")
    self.pump()
    m.free()
    for fh in [k for k, v in self.functions.items() if v[0] == h]: del self.functions[fh]

  @api
  def cuLaunchKernel(self, f: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, s: Any, params: Any, extra: Any) -> None:
    fh = _handle(f)
    if fh not in self.functions: raise CUError(INVALID_HANDLE, f"{fh:#x} is not a function")
    mh, name = self.functions[fh]
    mod = self.modules[mh]
    st = self._stream(s)
    if st.dev != mod.device: raise CUError(INVALID_CONTEXT, f"kernel {name} is loaded on GPU {mod.device}, the stream is on GPU {st.dev}")
    if extra: raise CUError(INVALID_VALUE, "cuLaunchKernel's extra argument is not supported by the mock")
    cf = mod.prog.functions[name]
    buf = bytearray(cf.param_size)
    ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p)) if cf.params else None
    for i, p in enumerate(cf.params):
      addr = ptrs[i]
      if not addr: raise CUError(INVALID_VALUE, f"kernel {name}: parameter {i} ({p.name}) has a NULL pointer")
      buf[p.offset:p.offset + p.size] = ctypes.string_at(addr, p.size)
    grid, block = (int(gx), int(gy), int(gz)), (int(bx), int(by), int(bz))
    try: _check(mod, cf, grid, block, int(shared))
    except KernelFault as e: raise CUError(INVALID_VALUE, str(e)) from None
    self._enqueue(st, "launch", mod, name, grid, block, bytes(buf), int(shared))

  # ---- execution
  def pump(self) -> None:
    """Run every stream's operations in order until each is empty or blocked on an unsatisfied wait."""
    progress = True
    while progress and self.sticky is None:
      progress = False
      for s in list(self.streams.values()):
        while s.ops and self.sticky is None and self._step(s): progress = True

  def _step(self, s: Stream) -> bool:
    op = s.ops[0]
    try:
      if op[0] == "wait":
        a = self.arena.check_range(op[1], 8, s.dev)
        cur = int(self.arena.host_view(op[1], 8).view(np.uint64)[0]) if a else 0
        flag = op[3]
        ok = cur >= op[2] if flag == 0 else cur == op[2] if flag == 1 else (cur & op[2]) != 0 if flag == 2 else ~(cur | op[2]) & ((1 << 64) - 1) != 0
        if not ok: return False
      s.ops.popleft()
      if op[0] == "record":
        op[1].t, op[1].pending = time.perf_counter(), False
      elif op[0] == "write":
        self.arena.check_range(op[1], 8, s.dev)
        self.arena.host_view(op[1], 8).view(np.uint64)[0] = op[2]
      elif op[0] == "copy":
        _, dst, src, n = op
        if n:
          self.arena.check_range(dst, n, None)
          self.arena.check_range(src, n, None)
          ctypes.memmove(dst, src, n)
      elif op[0] == "launch":
        _, mod, name, grid, block, params, shared = op
        self.history.append(Launch(name, grid, block, mod.device, mod.prog.source))
        mod.launch(name, grid, block, params, shared)
    except AccessFault as e: self._fault(ILLEGAL_ADDRESS, f"stream operation {op[0]}: {e}")
    except KernelFault as e: self._fault(FAULT_CODES.get(e.kind, LAUNCH_FAILED), str(e))
    except Unimplemented as e: self._fault(LAUNCH_FAILED, f"the PTX interpreter does not implement this: {e}")
    return True

  def _fault(self, code: int, detail: str) -> None:
    self.sticky = (code, detail)
    self.details[code] = detail
    for s in self.streams.values(): s.ops.clear()


def _check(mod: LoadedModule, cf: Any, grid: tuple, block: tuple, shared: int) -> None:
  check_launch(cf, grid, block, cf.param_size)
  if shared > 48 * 1024: raise KernelFault("invalid launch", f"kernel {cf.name}: {shared} bytes of dynamic shared memory, more than 48 KiB")


def _parse_cc(s: str) -> tuple[int, int]:
  m = re.fullmatch(r"\s*(?:sm_)?(\d)\.?(\d)\s*", s)
  if m is None: raise ValueError(f"MOCK_NV_CC: {s!r} is not a compute capability like 8.0, 9.0 or sm_90")
  return int(m.group(1)), int(m.group(2))
