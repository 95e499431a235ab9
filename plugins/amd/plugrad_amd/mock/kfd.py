"""Mock KFD: an in-process fake of /dev/kfd, the render nodes, mmap and the KFD sysfs topology (DEV=MOCK+AMD).

It implements `plugrad_amd.kfd.OSInterface`'s methods, so the real runtime (plugrad_amd.device) runs unchanged on
top of it. The fake GPUs are gfx1100s (MOCK_AMD_GPUS of them, default 2; MOCK_AMD_VRAM_MB of VRAM each, default
1024) whose memory is host memory: a reserved virtual range is a host allocation and its address is the GPU virtual
address too. Ringing a doorbell makes the fake read its queue the way the command processor / SDMA engine would:
it decodes the PM4 or SDMA packets between the read and write pointers (opcodes and fields from the generated
bindings) and performs them: copies, signal writes with 100 MHz timestamps, waits (a queue whose wait isn't
satisfied stalls and resumes when any doorbell rings), cache operations, and dispatches, which go to the executor
hook in plugrad_amd.mock.dispatch. A malformed packet, an access outside GPU-mapped memory or a failing kernel
faults the device: `fault` names the packet, and the runtime raises it on its next wait. The kernel executor is the
RDNA3 emulator (plugrad_amd.mock.rdna3), registered when a mock is created and no executor is set. Never imported by the real
runtime: `AMDDevice` imports this module only for the MOCK interface.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from plugrad_amd.autogen import kfd
from plugrad_amd.kfd import IOCTLS, KFDError
from plugrad_amd.mock import rdna3
from plugrad_amd.mock.dispatch import Dispatch, PageFault, get_executor
from plugrad_amd.mock.engines import Engines, RingFault

TOPO = "/sys/devices/virtual/kfd/kfd/topology/nodes"
GFX1100 = 110000


@dataclass
class Allocation:
  va: int
  size: int
  kind: str = "reserved"
  gpus: set[int] = field(default_factory=set)
  handle: int = 0
  mmap_offset: int = 0
  owner: int = 0


@dataclass
class Queue:
  qid: int
  gpu: int
  qtype: int
  ring: int
  ring_size: int
  rptr_addr: int
  wptr_addr: int
  doorbell: int
  consumed: int = 0  # bytes


class MockGPUMemory:
  """The mock GPU's view of memory: only allocations mapped to its gpu_id (GPUMemory protocol of mock.dispatch)."""
  def __init__(self, mock: MockKFD, gpu_id: int) -> None: self.mock, self.gpu_id = mock, gpu_id

  def _check(self, addr: int, size: int) -> None:
    a = self.mock.find(addr, size)
    if a is None or self.gpu_id not in a.gpus: raise PageFault(addr, size)

  def read(self, addr: int, size: int) -> bytes:
    self._check(addr, size)
    return ctypes.string_at(addr, size)

  def write(self, addr: int, data: bytes) -> None:
    self._check(addr, len(data))
    ctypes.memmove(addr, data, len(data))

  def view(self, addr: int, size: int) -> memoryview:
    self._check(addr, size)
    return memoryview((ctypes.c_uint8 * size).from_address(addr)).cast("B")

  def u32(self, addr: int) -> int: return struct.unpack("<I", self.read(addr, 4))[0]
  def u64(self, addr: int) -> int: return struct.unpack("<Q", self.read(addr, 8))[0]


class MockKFD:
  """The fake driver and GPUs. One process-wide instance (`instance()`), so MOCK+AMD and MOCK+AMD:1 share memory."""
  name = "MOCK"
  _instance: MockKFD | None = None
  _lock = threading.Lock()

  @classmethod
  def instance(cls) -> MockKFD:
    with cls._lock:
      if cls._instance is None: cls._instance = cls(int(os.environ.get("MOCK_AMD_GPUS", "2")), int(os.environ.get("MOCK_AMD_VRAM_MB", "1024")) << 20)
      return cls._instance

  def __init__(self, n_gpus: int = 2, vram_bytes: int = 1 << 30) -> None:
    self.gpu_ids = [0x1000 + 0x111 * i for i in range(n_gpus)]
    self.vram_bytes, self.vram_used = vram_bytes, {g: 0 for g in self.gpu_ids}
    self.allocs: dict[int, Allocation] = {}
    self._backing: dict[int, mmap.mmap] = {}
    self.fds: dict[int, str] = {}
    self.queues: dict[int, Queue] = {}
    self.fault: str | None = None
    self.dispatches: list[Dispatch] = []
    self.engines = {g: Engines() for g in self.gpu_ids}  # each GPU's command processor state, one dispatch log for all
    for e in self.engines.values(): e.dispatches = self.dispatches
    self._next_fd, self._next_handle = 1000, 1
    self._busy = threading.RLock()
    if get_executor() is None: rdna3.install()  # dispatches run clang's machine code on the RDNA3 emulator (tests may swap it)

  # ---- sysfs
  def listdir(self, path: str) -> list[str]:
    if path.rstrip("/") == TOPO: return [str(i) for i in range(len(self.gpu_ids) + 1)]
    raise FileNotFoundError(path)

  def read_text(self, path: str) -> str:
    parts = path.rstrip("/").split("/")
    if "/".join(parts[:-2]) != TOPO or not parts[-2].isdigit() or int(parts[-2]) > len(self.gpu_ids): raise FileNotFoundError(path)
    node = int(parts[-2])
    if parts[-1] == "gpu_id": return f"{self.gpu_ids[node - 1] if node else 0}\n"
    if parts[-1] != "properties": raise FileNotFoundError(path)
    if node == 0: return "cpu_cores_count 2\nsimd_count 0\ngfx_target_version 0\n"
    return (f"cpu_cores_count 0\nsimd_count 96\nmax_waves_per_simd 16\nlds_size_in_kb 64\nwave_front_size 32\narray_count 12\n"
            f"simd_arrays_per_engine 2\nmax_engine_clk_fcompute 2500\n"
            f"gfx_target_version {GFX1100}\ndrm_render_minor {127 + node}\nlocal_mem_size {self.vram_bytes}\n")

  # ---- files
  def open(self, path: str) -> int:
    ok = path == "/dev/kfd" or any(path == f"/dev/dri/renderD{128 + i}" for i in range(len(self.gpu_ids)))
    if not ok: raise FileNotFoundError(errno.ENOENT, f"mock KFD has no {path}")
    self._next_fd += 1
    self.fds[self._next_fd] = path
    return self._next_fd

  def close(self, fd: int) -> None: self.fds.pop(fd, None)

  # ---- memory
  def find(self, addr: int, size: int, kind: str | None = None) -> Allocation | None:
    for a in self.allocs.values():
      if a.va <= addr and addr + size <= a.va + a.size and (kind is None or a.kind != "reserved"): return a
    return None

  def mmap(self, addr: int, size: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    if fd == -1:  # reserve a range: the host memory behind it is the GPU memory
      m = mmap.mmap(-1, size)
      va = ctypes.addressof(ctypes.c_char.from_buffer(m))
      self._backing[va] = m
      self.allocs[va] = Allocation(va, size)
      return va
    path = self.fds.get(fd)
    if path == "/dev/kfd":  # a doorbell page
      q = next((q for q in self.queues.values() if q.doorbell & ~0x1FFF == offset), None)
      if q is None: raise OSError(errno.EINVAL, f"mock KFD: no doorbell page at offset {offset:#x}")
      return self._doorbell_page(q)
    a = self.allocs.get(addr)
    if path is None or a is None or a.mmap_offset != offset or a.size != size:
      raise OSError(errno.EINVAL, f"mock KFD: mmap of {size} bytes at {addr:#x} offset {offset:#x} on {path} matches no allocation")
    return addr

  def _doorbell_page(self, q: Queue) -> int:
    if not hasattr(self, "_db_pages"): self._db_pages: dict[int, int] = {}
    page = q.doorbell & ~0x1FFF
    if page not in self._db_pages:
      m = mmap.mmap(-1, 0x2000)
      self._db_pages[page] = ctypes.addressof(ctypes.c_char.from_buffer(m))
      self._backing[self._db_pages[page]] = m
    return self._db_pages[page]

  def munmap(self, addr: int, size: int) -> None:
    if self.allocs.pop(addr, None) is None: return
    self._backing.pop(addr, None)  # the host memory goes with it (released when unreferenced)

  # ---- ioctls
  def ioctl(self, fd: int, name: str, **fields: Any) -> Any:
    if self.fds.get(fd) != "/dev/kfd": raise KFDError(errno.EBADF, f"AMDKFD_IOC_{name}: fd {fd} is not /dev/kfd")
    if name not in IOCTLS: raise KFDError(errno.EINVAL, f"unknown ioctl {name}")
    st = IOCTLS[name][2]()
    for k, v in fields.items(): setattr(st, k, v)
    handler = getattr(self, f"_ioctl_{name.lower()}", None)
    if handler is None: raise KFDError(errno.ENOTTY, f"AMDKFD_IOC_{name} is not implemented by the mock KFD")
    handler(st)
    return st

  def _gpu(self, gpu_id: int) -> int:
    if gpu_id not in self.gpu_ids: raise KFDError(errno.EINVAL, f"no GPU with gpu_id {gpu_id:#x}")
    return gpu_id

  def _ioctl_get_version(self, st: Any) -> None: st.major_version, st.minor_version = kfd.KFD_IOCTL_MAJOR_VERSION, kfd.KFD_IOCTL_MINOR_VERSION

  def _ioctl_acquire_vm(self, st: Any) -> None:
    self._gpu(st.gpu_id)
    if not self.fds.get(st.drm_fd, "").startswith("/dev/dri/renderD"):
      raise KFDError(errno.EBADF, f"ACQUIRE_VM: drm_fd {st.drm_fd} is no render node")

  def _ioctl_alloc_memory_of_gpu(self, st: Any) -> None:
    g = self._gpu(st.gpu_id)
    r = self.allocs.get(st.va_addr)
    if r is None or r.kind != "reserved" or r.size < st.size:
      raise KFDError(errno.EINVAL, f"ALLOC_MEMORY_OF_GPU at {st.va_addr:#x}: not a reserved range")
    kind = "vram" if st.flags & kfd.KFD_IOC_ALLOC_MEM_FLAGS_VRAM else "gtt" if st.flags & kfd.KFD_IOC_ALLOC_MEM_FLAGS_GTT else \
      "userptr" if st.flags & kfd.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR else None
    if kind is None: raise KFDError(errno.EINVAL, f"ALLOC_MEMORY_OF_GPU flags {st.flags:#x} name no memory domain")
    if kind == "vram":
      if self.vram_used[g] + st.size > self.vram_bytes: raise KFDError(errno.ENOMEM, f"out of VRAM ({self.vram_used[g]} of {self.vram_bytes} used)")
      self.vram_used[g] += st.size
    r.kind, r.handle, r.mmap_offset, r.owner = kind, self._next_handle, self._next_handle << 12, g
    self._next_handle += 1
    st.handle, st.mmap_offset = r.handle, r.mmap_offset

  def _by_handle(self, handle: int) -> Allocation:
    a = next((a for a in self.allocs.values() if a.handle == handle and a.kind != "reserved"), None)
    if a is None: raise KFDError(errno.EINVAL, f"no allocation with handle {handle}")
    return a

  def _ids(self, st: Any) -> list[int]:
    return [self._gpu(i) for i in (ctypes.c_uint32 * st.n_devices).from_address(st.device_ids_array_ptr)] if st.n_devices else []

  def _ioctl_map_memory_to_gpu(self, st: Any) -> None:
    a = self._by_handle(st.handle)
    a.gpus |= set(self._ids(st))
    st.n_success = st.n_devices

  def _ioctl_unmap_memory_from_gpu(self, st: Any) -> None:
    a = self._by_handle(st.handle)
    a.gpus -= set(self._ids(st))
    st.n_success = st.n_devices

  def _ioctl_free_memory_of_gpu(self, st: Any) -> None:
    a = self._by_handle(st.handle)
    if a.kind == "vram": self.vram_used[a.owner] -= a.size
    a.kind, a.handle, a.gpus = "reserved", 0, set()

  def _ioctl_create_queue(self, st: Any) -> None:
    g = self._gpu(st.gpu_id)
    if st.queue_type not in (kfd.KFD_IOC_QUEUE_TYPE_COMPUTE, kfd.KFD_IOC_QUEUE_TYPE_SDMA):
      raise KFDError(errno.EINVAL, f"mock KFD supports PM4 compute and SDMA queues, not queue type {st.queue_type}")
    if st.ring_size & (st.ring_size - 1) or st.ring_size < 1024:
      raise KFDError(errno.EINVAL, f"ring size {st.ring_size} is not a power of two >= 1024")
    for what, addr, n in (("ring", st.ring_base_address, st.ring_size), ("rptr", st.read_pointer_address, 8), ("wptr", st.write_pointer_address, 8)):
      if self.find(addr, n, "mapped") is None: raise KFDError(errno.EFAULT, f"CREATE_QUEUE: {what} at {addr:#x} is not allocated")
    qid = len(self.queues)
    q = Queue(qid, g, st.queue_type, st.ring_base_address, st.ring_size, st.read_pointer_address, st.write_pointer_address,
              0x10000 * (qid + 1) + 8 * qid)
    self.queues[qid] = q
    st.queue_id, st.doorbell_offset = qid, q.doorbell

  def _ioctl_destroy_queue(self, st: Any) -> None: self.queues.pop(st.queue_id, None)

  # ---- doorbells and the command processors
  def ring_doorbell(self, addr: int, value: int) -> None:
    ctypes.c_uint64.from_address(addr).value = value
    self.poll()

  def poll(self) -> None:
    """Run every queue until none makes progress (a stalled wait is retried on the next doorbell or host poll)."""
    with self._busy:
      progress = True
      while progress and self.fault is None:
        progress = any([self._run(q) for q in list(self.queues.values())])

  def _run(self, q: Queue) -> bool:
    """Execute q's packets up to its write pointer; False when it made no progress (empty or stalled on a wait)."""
    unit, kind = (4, "PM4") if q.qtype == kfd.KFD_IOC_QUEUE_TYPE_COMPUTE else (1, "SDMA")
    wptr = ctypes.c_uint64.from_address(q.wptr_addr).value * unit
    start = q.consumed
    try: q.consumed = self.engines[q.gpu].run_ring(kind, MockGPUMemory(self, q.gpu), q.ring, q.ring_size, q.consumed, wptr)
    except RingFault as e:
      self.fault = f"{kind} queue {q.qid} at ring offset {e.offset:#x}: {type(e.cause).__name__}: {e.cause}"
      return False
    ctypes.c_uint64.from_address(q.rptr_addr).value = q.consumed // unit
    return q.consumed != start
