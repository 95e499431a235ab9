"""The DISK device: one file per device (`DISK:/path`), memory-mapped; buffers are byte ranges of that file.

`alloc(n)` maps the file and hands out its first n bytes; offset views address the rest. Mapping never changes the file:
a missing file is created with exactly n zero bytes, an existing file is never grown, shrunk or truncated (a buffer
larger than an existing file is a ValueError: resize or delete the file yourself). Bytes reach the file only through an
explicit write (`copyin`: `assign`, `.to("DISK:...")`, `Tensor(data, device="DISK:...")`, `safe_save`). Reads copy
straight out of the mapping (`as_host`), writes go into it and are flushed (msync) per written range, so they reach
the file as soon as the copy is realized. It stores data but cannot compile or run kernels: the scheduler turns work
on it into byte-range copies (`storage = True`) and anything else is a RuntimeError telling you to `.to()` a compute
device first. A file that can't be opened for writing is mapped read-only.
"""
from __future__ import annotations
import mmap
import os
from dataclasses import dataclass
from plugrad.device import Allocator, BufferOptions, Compiled, parse_device
from plugrad.runtime.compiler import UnsupportedCompiler
from plugrad.runtime.renderer import Renderer

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
  def _copyin(self, dest: DiskHandle, src: memoryview) -> None:
    if dest.size == 0: return
    if self.dev.readonly: raise PermissionError(f"{self.dev.device}: the file is read-only, can't write {dest.size} bytes into it")
    dest.view[:] = src
    start = dest.offset - dest.offset % mmap.ALLOCATIONGRANULARITY  # msync wants a page-aligned start
    dest.mm.flush(start, dest.offset + dest.size - start)
  def _copyout(self, dest: memoryview, src: DiskHandle) -> None: dest[:] = src.view
  def _offset(self, opaque: DiskHandle, size: int, offset: int) -> DiskHandle: return DiskHandle(opaque.mm, opaque.offset + offset, size)
  def as_host(self, opaque: DiskHandle) -> memoryview: return opaque.view

class DiskRenderer(Renderer):
  """Stands in for a renderer: any attempt to generate a kernel for DISK ends here with a clear error."""
  name = "DISK"
  def render(self, name: str, uops: list) -> str:
    raise RuntimeError(f"DISK is a storage device and can't compute (kernel {name}); move the data to a compute device "
                       "first, e.g. t.to('CPU'), and compute there")

class DiskDevice(Compiled):
  compute = False
  storage = True

  def __init__(self, device: str) -> None:
    path = self.path_of(device)
    self.path = os.path.expanduser(path)
    self._mm: mmap.mmap | None = None
    self._ident: tuple[int, int] | None = None
    self.readonly = False
    super().__init__(device, DiskAllocator(), [DiskRenderer], UnsupportedCompiler(device, "DISK is a storage device"), None)

  @staticmethod
  def path_of(device: str) -> str:
    if (p := parse_device(device).path) is None: raise ValueError(f"device {device!r} needs a file path: DISK:/path/to/file")
    return p

  def map(self, size: int) -> mmap.mmap | None:
    """The file mapped with at least `size` bytes. A missing file is created with `size` zero bytes; an existing one is
    never resized (ValueError when it is shorter than `size`)."""
    if size == 0: return None
    try: st = os.stat(self.path)
    except FileNotFoundError: st = None
    if st is None or (st.st_dev, st.st_ino) != self._ident or (self._mm is not None and st.st_size < len(self._mm)):
      self._mm = None  # replaced or truncated since mapped: map the file as it is now (reading past its end would SIGBUS)
    if self._mm is None or len(self._mm) < size:
      fd, created = self._open()
      try:
        have = os.fstat(fd).st_size
        if created: os.ftruncate(fd, size)  # a file we just made (empty, O_EXCL): give it the buffer's size
        elif have < size:
          raise ValueError(f"{self.device}: the file has {have} bytes, a buffer of {size} bytes does not fit. DISK never grows or "
                           "shrinks an existing file: resize it yourself (os.truncate(path, n)) or delete it first")
        self._mm = mmap.mmap(fd, max(size, have), access=mmap.ACCESS_READ if self.readonly else mmap.ACCESS_WRITE)
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino)
      finally: os.close(fd)
    return self._mm

  def _open(self) -> tuple[int, bool]:
    """(fd, created): the existing file read-write (read-only when not writable), else a new empty file."""
    try: fd, self.readonly = os.open(self.path, os.O_RDWR), False
    except PermissionError: fd, self.readonly = os.open(self.path, os.O_RDONLY), True
    except FileNotFoundError:
      self.readonly = False
      try: return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
      except FileExistsError: return self._open()  # created by someone else in between: it is theirs, never resize it
    return fd, False

  def release(self) -> None:
    """Drop the device's own reference to the mapping; buffers still using it keep it alive."""
    self._mm, self._ident = None, None

  def synchronize(self) -> None:
    pass  # writes are flushed as they are made
