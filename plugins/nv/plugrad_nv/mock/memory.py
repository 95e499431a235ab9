"""The mock GPUs' memory: one reserved host range (anonymous, MAP_NORESERVE) holding every device allocation, pinned
host allocation and module global, so a device address is a host address (unified addressing, as on a real GPU
with UVA) and kernels read it as numpy views.

Each allocation belongs to a device (device memory, module globals) or to all of them (pinned, device-mapped host
memory). The PTX interpreter reaches memory only through `load`/`store`/`atomic`, which check every lane's access:
an address outside the allocations the device may touch is an `AccessFault` ("illegal address"), an address not
aligned to the access size is one too ("misaligned address"), each naming the offending lane's address.
"""
from __future__ import annotations

import bisect
import ctypes
import mmap
import threading
from dataclasses import dataclass

import numpy as np

ALIGN = 256        # cuMemAlloc's alignment
PAGE = 4096


class AccessFault(RuntimeError):
  """A lane's access the GPU would fault on. `index` is the lane's position in the address array that was checked."""
  def __init__(self, kind: str, index: int, addr: int, size: int, detail: str) -> None:
    super().__init__(detail)
    self.kind, self.index, self.addr, self.size = kind, index, addr, size


@dataclass
class Allocation:
  start: int
  size: int
  kind: str            # "device", "host", "global" (a module variable)
  device: int | None   # None: every device may access it (pinned host memory)

  @property
  def end(self) -> int: return self.start + self.size


class Arena:
  """All mock GPU memory. `alloc`/`free` hand out 256-byte aligned ranges (first fit, freed ranges merged)."""
  def __init__(self, size: int) -> None:
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    self.size = size
    self.mm = mmap.mmap(-1, size, flags=flags)
    self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
    self.u8 = np.frombuffer(self.mm, dtype=np.uint8)
    self._views: dict[np.dtype, np.ndarray] = {}
    self._free: list[list[int]] = [[self.base, size]]   # sorted [start, size] extents
    self._starts: list[int] = []
    self._allocs: dict[int, Allocation] = {}
    self.lock = threading.RLock()

  def view(self, dt: np.dtype) -> np.ndarray:
    """The whole arena as an array of `dt` (element i is at base + i * itemsize)."""
    v = self._views.get(dt)
    if v is None: v = self._views[dt] = self.u8.view(dt)
    return v

  # ---- allocation
  def alloc(self, size: int, kind: str, device: int | None) -> int:
    need = max(-(-size // ALIGN) * ALIGN, ALIGN)
    with self.lock:
      for ext in self._free:
        start = -(-ext[0] // ALIGN) * ALIGN
        if start + need <= ext[0] + ext[1]:
          self._take(ext, start, need)
          self._allocs[start] = Allocation(start, size, kind, device)
          bisect.insort(self._starts, start)
          return start
    raise MemoryError(f"mock GPU memory exhausted: {size} bytes requested")

  def _take(self, ext: list[int], start: int, need: int) -> None:
    i = self._free.index(ext)
    before, after = start - ext[0], ext[0] + ext[1] - (start + need)
    repl = ([[ext[0], before]] if before else []) + ([[start + need, after]] if after else [])
    self._free[i:i + 1] = repl

  def free(self, addr: int) -> Allocation:
    with self.lock:
      a = self._allocs.pop(addr, None)
      if a is None: raise KeyError(f"{addr:#x} is not the start of an allocation")
      self._starts.remove(addr)
      need = max(-(-a.size // ALIGN) * ALIGN, ALIGN)
      self._release(addr, need)
      if need >= 1 << 20:  # give big ranges' pages back to the OS
        lo, hi = -(-(addr - self.base) // PAGE) * PAGE, (addr - self.base + need) // PAGE * PAGE
        if hi > lo: self.mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
      return a

  def _release(self, start: int, size: int) -> None:
    i = bisect.bisect_left(self._free, [start, 0])
    self._free.insert(i, [start, size])
    if i + 1 < len(self._free) and start + size == self._free[i + 1][0]:
      self._free[i][1] += self._free.pop(i + 1)[1]
    if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == start:
      self._free[i - 1][1] += self._free.pop(i)[1]

  def find(self, addr: int) -> Allocation | None:
    """The allocation containing `addr`, or None."""
    i = bisect.bisect_right(self._starts, addr) - 1
    if i < 0: return None
    a = self._allocs[self._starts[i]]
    return a if addr < a.end else None

  def allocations(self) -> list[Allocation]: return [self._allocs[s] for s in self._starts]

  # ---- checked access for kernels and copies
  def check_range(self, addr: int, size: int, device: int | None) -> Allocation:
    """The allocation holding [addr, addr+size) that `device` may touch (None: any); AccessFault otherwise."""
    a = self.find(addr)
    if a is None or addr + size > a.end or (device is not None and a.device is not None and a.device != device):
      raise AccessFault("illegal address", 0, addr, size, self._why(addr, size, device))
    return a

  def _why(self, addr: int, size: int, device: int | None) -> str:
    a = self.find(addr)
    if a is None: return f"address {addr:#x} ({size} bytes) is outside every allocation"
    if addr + size > a.end: return f"{size} bytes at {addr:#x} run past the end of the {a.size}-byte allocation at {a.start:#x}"
    return f"address {addr:#x} is in device {a.device}'s memory, not device {device}'s (no peer access)"

  def check(self, addrs: np.ndarray, size: int, device: int | None) -> None:
    """Every address in `addrs` (uint64) starts `size` accessible, `size`-aligned bytes; AccessFault names the first bad lane."""
    if addrs.size == 0: return
    if size > 1 and (addrs & np.uint64(size - 1)).any():
      i = int(np.flatnonzero(addrs & np.uint64(size - 1))[0])
      raise AccessFault("misaligned address", i, int(addrs[i]), size, f"address {int(addrs[i]):#x} is not aligned to the {size}-byte access")
    lo, hi = int(addrs.min()), int(addrs.max())
    a = self.find(lo)
    if a is not None and hi + size <= a.end and (device is None or a.device is None or a.device == device): return
    for i, ad in enumerate(addrs.tolist()):
      try: self.check_range(ad, size, device)
      except AccessFault as e:
        e.index = i
        raise

  def load(self, addrs: np.ndarray, dt: np.dtype, nvec: int, device: int | None) -> np.ndarray:
    """Values at `addrs`: shape (n,) for nvec 1, else (n, nvec) consecutive elements."""
    size = np.dtype(dt).itemsize
    self.check(addrs, size * nvec, device)
    idx = (addrs - np.uint64(self.base)) // np.uint64(size)
    v = self.view(dt)
    if nvec == 1: return v[idx]
    return v[idx[:, None] + np.arange(nvec, dtype=np.uint64)]

  def store(self, addrs: np.ndarray, values: np.ndarray, dt: np.dtype, nvec: int, device: int | None) -> None:
    size = np.dtype(dt).itemsize
    self.check(addrs, size * nvec, device)
    idx = (addrs - np.uint64(self.base)) // np.uint64(size)
    v = self.view(dt)
    if nvec == 1: v[idx] = values
    else: v[idx[:, None] + np.arange(nvec, dtype=np.uint64)] = values

  def indices(self, addrs: np.ndarray, dt: np.dtype, device: int | None) -> np.ndarray:
    """Element indices into `view(dt)` of checked addresses (for read-modify-write atomics)."""
    size = np.dtype(dt).itemsize
    self.check(addrs, size, device)
    return (addrs - np.uint64(self.base)) // np.uint64(size)

  def host_view(self, addr: int, size: int) -> np.ndarray:
    return self.u8[addr - self.base: addr - self.base + size]
