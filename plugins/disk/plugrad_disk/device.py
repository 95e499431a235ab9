"""The DISK device: one file per device (`DISK:/path`), memory-mapped; buffers are byte ranges of that file.

`alloc(n)` maps the file and hands out its first n bytes; offset views address the rest. Mapping never changes the file:
a missing file is created with exactly n zero bytes (blocks reserved with posix_fallocate, so a full disk is an ENOSPC
OSError here and the half-made file is removed), an existing file is never grown, shrunk or truncated (a buffer larger
than an existing file is a ValueError: resize or delete the file yourself). Only regular files are mapped; a path that is
a dangling symbolic link is a FileNotFoundError naming its target (the file is never created through the link).

Bytes reach the file only through an explicit write (`copyin`: `assign`, `.to("DISK:...")`, `Tensor(data,
device="DISK:...")`, `safe_save`), made with pwrite (a full disk is an ENOSPC OSError, never a SIGBUS from a write into
a hole of the mapping) and fdatasync'ed, so they reach the file as soon as the copy is realized. Reads copy out with
pread (`copyout`) or straight out of the mapping (`as_host`, read-only); each checks first that the file still holds
the range, so a file truncated under a mapping is an OSError saying so instead of a SIGBUS (or silent zeros). A file
that can't be opened for writing (permissions, a read-only filesystem) is mapped read-only, and writing to it is a
PermissionError. DISK stores data but cannot compile or run kernels: the scheduler turns work on it into byte-range
copies (`storage = True`) and anything else is a RuntimeError telling you to `.to()` a compute device first.
"""
from __future__ import annotations
import errno
import mmap
import os
import stat
import weakref
from dataclasses import dataclass
from plugrad.device import Allocator, BufferOptions, Compiled, parse_device
from plugrad.runtime.compiler import UnsupportedCompiler
from plugrad.runtime.renderer import Renderer

_READ_ONLY_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ETXTBSY)  # open for reading instead
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENODEV, errno.ENOSYS)  # the filesystem can't reserve: write sparse

class MappedFile:
  """An open file and its mapping, kept while any buffer uses them: the descriptor answers how long the file is now
  (before every access) and does the reads and writes that must not fault."""
  def __init__(self, device: str, fd: int, mm: mmap.mmap, readonly: bool) -> None:
    self.device, self.fd, self.mm, self.readonly = device, fd, mm, readonly
    weakref.finalize(self, os.close, fd)

  def check(self, start: int, size: int) -> None:
    """OSError unless the file still holds bytes [start, start+size) (touching a mapped page past its end is a SIGBUS)."""
    if (have := os.fstat(self.fd).st_size) < start + size:
      raise OSError(f"{self.device}: the file is now {have} bytes, it was truncated since it was mapped; bytes "
                    f"[{start}, {start + size}) are gone. Load it again (and don't truncate files plugrad has open)")

  def read(self, dest: memoryview, start: int) -> None:
    self.check(start, dest.nbytes)
    dest = dest.cast("B")
    while dest.nbytes:
      if (n := os.preadv(self.fd, [dest], start)) == 0:  # truncated in between
        self.check(start, dest.nbytes)
        raise OSError(f"{self.device}: the file ended at byte {start} while reading it")
      dest, start = dest[n:], start + n

  def write(self, src: memoryview, start: int) -> None:
    if self.readonly: raise PermissionError(f"{self.device}: the file is read-only, can't write {src.nbytes} bytes into it")
    self.check(start, src.nbytes)  # a pwrite past the end would grow the file: never
    src, total, at = src.cast("B"), src.nbytes, start
    try:
      while src.nbytes:
        n = os.pwrite(self.fd, src, start)
        src, start = src[n:], start + n
      os.fdatasync(self.fd)
    except OSError as e:
      raise OSError(e.errno, f"{self.device}: writing {total} bytes at offset {at} failed: {os.strerror(e.errno or 0)}") from None

@dataclass
class DiskHandle:
  """A byte range [offset, offset+size) of the device's file, and the mapped file it lives in."""
  file: MappedFile | None
  offset: int
  size: int
  @property
  def mm(self) -> mmap.mmap | None: return self.file.mm if self.file is not None else None
  @property
  def view(self) -> memoryview:
    if self.file is None: return memoryview(b"")
    self.file.check(self.offset, self.size)
    return memoryview(self.file.mm)[self.offset:self.offset + self.size].toreadonly()

class DiskAllocator(Allocator):
  dev: DiskDevice
  def _alloc(self, size: int, options: BufferOptions) -> DiskHandle:
    return DiskHandle(self.dev.map(size), 0, size)
  def _copyin(self, dest: DiskHandle, src: memoryview) -> None:
    if dest.size and dest.file is not None: dest.file.write(src, dest.offset)
  def _copyout(self, dest: memoryview, src: DiskHandle) -> None:
    if src.size and src.file is not None: src.file.read(dest, src.offset)
  def _offset(self, opaque: DiskHandle, size: int, offset: int) -> DiskHandle: return DiskHandle(opaque.file, opaque.offset + offset, size)
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
    self._file: MappedFile | None = None
    self._ident: tuple[int, int] | None = None
    super().__init__(device, DiskAllocator(), [DiskRenderer], UnsupportedCompiler(device, "DISK is a storage device"), None)

  @staticmethod
  def path_of(device: str) -> str:
    if (p := parse_device(device).path) is None: raise ValueError(f"device {device!r} needs a file path: DISK:/path/to/file")
    return p

  @property
  def _mm(self) -> mmap.mmap | None: return self._file.mm if self._file is not None else None
  @property
  def readonly(self) -> bool: return self._file is not None and self._file.readonly

  def map(self, size: int) -> MappedFile | None:
    """The file mapped with at least `size` bytes. A missing file is created with `size` zero bytes; an existing one is
    never resized (ValueError when it is shorter than `size`)."""
    if size == 0: return None
    try: st = os.stat(self.path)
    except OSError: st = None
    if st is None or (st.st_dev, st.st_ino) != self._ident or (self._file is not None and st.st_size < len(self._file.mm)):
      self._file = None  # replaced or truncated since mapped: map the file as it is now (reading past its end would SIGBUS)
    if self._file is None or len(self._file.mm) < size:
      fd, created, readonly = self._open()
      st = os.fstat(fd)
      try:
        if created: self._reserve(fd, size)
        elif st.st_size < size:
          raise ValueError(f"{self.device}: the file has {st.st_size} bytes, a buffer of {size} bytes does not fit. DISK never grows or "
                           "shrinks an existing file: resize it yourself (os.truncate(path, n)) or delete it first")
        mm = mmap.mmap(fd, max(size, st.st_size), access=mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE)
      except BaseException:
        os.close(fd)
        if created: self._remove_ours(st)
        raise
      self._file, self._ident = MappedFile(self.device, fd, mm, readonly), (st.st_dev, st.st_ino)
    return self._file

  def _reserve(self, fd: int, size: int) -> None:
    """Give a file we just created its size with its blocks reserved: a full disk fails here, not at a later write."""
    try: os.posix_fallocate(fd, 0, size)
    except OSError as e:
      if e.errno not in _NO_FALLOCATE:
        raise OSError(e.errno, f"{self.device}: can't create a file of {size} bytes: {os.strerror(e.errno or 0)}") from None
      os.ftruncate(fd, size)
    except AttributeError: os.ftruncate(fd, size)  # no posix_fallocate on this platform

  def _remove_ours(self, st: os.stat_result) -> None:
    """Delete the file a failed create made, if the path still names it (a failed create leaves nothing behind)."""
    try:
      now = os.lstat(self.path)
      if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino): os.unlink(self.path)
    except OSError: pass

  def _open(self) -> tuple[int, bool, bool]:
    """(fd, created, readonly): the existing regular file read-write (read-only when it can't be written), else a new
    empty file (never through a symbolic link). O_NONBLOCK: opening a FIFO must not wait for a writer."""
    flags = os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    for _ in range(8):  # the path may appear or vanish between tries (another process); each try is bounded
      try: return self._regular(os.open(self.path, os.O_RDWR | flags)), False, False
      except FileNotFoundError: pass
      except OSError as e:
        if e.errno == errno.EISDIR: raise IsADirectoryError(errno.EISDIR, f"{self.device}: the path is a directory, not a file", self.path) from None
        if e.errno not in _READ_ONLY_ERRNOS: raise
        try: return self._regular(os.open(self.path, os.O_RDONLY | flags)), False, True
        except FileNotFoundError: pass
      try: return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o644), True, False
      except FileExistsError:
        if os.path.islink(self.path) and not os.path.exists(self.path):
          raise FileNotFoundError(errno.ENOENT, f"{self.device}: the path is a symbolic link to {os.readlink(self.path)!r}, which "
                                  "does not exist; DISK never creates a file through a symbolic link", self.path) from None
        # else created by someone else in between: it is theirs, open it as it is (never resized)
    raise OSError(f"{self.device}: the path keeps appearing and disappearing; can't open it")

  def _regular(self, fd: int) -> int:
    """fd, if it is a regular file; else closed and a ValueError naming what it is."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode): return fd
    os.close(fd)
    if stat.S_ISDIR(mode): raise IsADirectoryError(errno.EISDIR, f"{self.device}: the path is a directory, not a file", self.path)
    raise ValueError(f"{self.device}: the path is not a regular file ({_kind(mode)}); DISK maps regular files only")

  def release(self) -> None:
    """Drop the device's own reference to the mapping; buffers still using it keep it alive."""
    self._file, self._ident = None, None

  def synchronize(self) -> None:
    pass  # writes are flushed as they are made

def _kind(mode: int) -> str:
  for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                     (stat.S_ISBLK, "a block device")):
    if test(mode): return name
  return "not a regular file"
