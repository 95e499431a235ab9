"""The DISK device: one file per device (`DISK:/path`), memory-mapped; buffers are byte ranges of that file.

`alloc(n)` maps the first n bytes (growing the file if it is shorter); offset views address the rest.
It stores data but cannot compile or run kernels.
"""
from __future__ import annotations
import mmap
import os
from dataclasses import dataclass
from plugrad.device import Allocator, BufferOptions, Compiled
from plugrad.runtime.compiler import UnsupportedCompiler

@dataclass
class DiskHandle:
  """A byte range [offset, offset+size) of the device's file, and the mmap it lives in."""
  mm: mmap.mmap | None
  offset: int
  size: int
  @property
  def view(self) -> memoryview:
    return memoryview(self.mm)[self.offset:self.offset + self.size] if self.mm is not None else memoryview(b"")

class DiskAllocator(Allocator):
  dev: DiskDevice
  def _alloc(self, size: int, options: BufferOptions) -> DiskHandle:
    return DiskHandle(self.dev.map(size), 0, size)
  def _copyin(self, dest: DiskHandle, src: memoryview) -> None: dest.view[:] = src
  def _copyout(self, dest: memoryview, src: DiskHandle) -> None: dest[:] = src.view
  def _offset(self, opaque: DiskHandle, size: int, offset: int) -> DiskHandle: return DiskHandle(opaque.mm, opaque.offset + offset, size)

class DiskDevice(Compiled):
  compute = False

  def __init__(self, device: str) -> None:
    path = self.path_of(device)
    self.path = os.path.expanduser(path)
    self._mm: mmap.mmap | None = None
    super().__init__(device, DiskAllocator(), [], UnsupportedCompiler(device, "DISK is a storage device"), None)

  @staticmethod
  def path_of(device: str) -> str:
    from plugrad.device import parse_device
    if (p := parse_device(device).path) is None: raise ValueError(f"device {device!r} needs a file path: DISK:/path/to/file")
    return p

  def map(self, size: int) -> mmap.mmap | None:
    """The file mapped with at least `size` bytes (the file is created or grown as needed)."""
    if size == 0: return None
    if self._mm is None or len(self._mm) < size:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        if os.fstat(fd).st_size < size: os.ftruncate(fd, size)
        self._mm = mmap.mmap(fd, max(size, os.fstat(fd).st_size))
      finally: os.close(fd)
    return self._mm

  def synchronize(self) -> None:
    if self._mm is not None: self._mm.flush()
