"""The operating-system layer of the KFD runtime: open, ioctl, mmap, sysfs reads and doorbell writes.

`OSInterface` is the real one (libc through ctypes, ioctl numbers computed from the generated kfd bindings); the
mock driver (plugrad_amd.mock.kfd.MockKFD) implements the same methods in-process, so plugrad_amd.device is one
runtime for both. Nothing here opens a device at import.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import inspect
import os
import re
from typing import Any

from plugrad_amd.autogen import kfd

PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
_IOC_DIR = {"_IO": 0, "_IOW": 1, "_IOR": 2, "_IOWR": 3}


def _ioctl_table() -> dict[str, tuple[int, int, type]]:
  """{name: (direction, nr, args struct)} from the AMDKFD_IOC_* macros of the generated bindings (kept there as comments,
  since clang2py can't evaluate _IOWR)."""
  src = inspect.getsource(kfd)
  out = {}
  for m in re.finditer(r"^# AMDKFD_IOC_(\w+) = (_IO\w*)\('K',nr,type\) \( (0x[0-9A-Fa-f]+) , struct (\w+) \) # macro$", src, re.M):
    out[m.group(1)] = (_IOC_DIR[m.group(2)], int(m.group(3), 16), getattr(kfd, f"struct_{m.group(4)}"))
  return out


IOCTLS = _ioctl_table()
IOCTL_BY_NR = {nr: (name, st) for name, (_, nr, st) in IOCTLS.items()}


def ioctl_number(name: str) -> int:
  d, nr, st = IOCTLS[name]
  return (d << 30) | (ctypes.sizeof(st) << 16) | (ord("K") << 8) | nr


class KFDError(OSError):
  """An ioctl on /dev/kfd failed; the message names the ioctl."""


class OSInterface:
  """/dev/kfd, /dev/dri/renderD*, mmap and sysfs of the running kernel."""
  name = "KFD"

  def __init__(self) -> None:
    self.libc = ctypes.CDLL(None, use_errno=True)
    self.libc.mmap.restype = ctypes.c_void_p
    self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

  def open(self, path: str) -> int: return os.open(path, os.O_RDWR | os.O_CLOEXEC)
  def close(self, fd: int) -> None: os.close(fd)
  def read_text(self, path: str) -> str:
    with open(path) as f: return f.read()
  def listdir(self, path: str) -> list[str]: return os.listdir(path)

  def ioctl(self, fd: int, name: str, **fields: Any) -> Any:
    """Fill the ioctl's args struct from `fields`, run it, return the struct (with the kernel's outputs)."""
    st = IOCTLS[name][2]()
    for k, v in fields.items(): setattr(st, k, v)
    try: fcntl.ioctl(fd, ioctl_number(name), st)
    except OSError as e: raise KFDError(e.errno, f"AMDKFD_IOC_{name} failed: {os.strerror(e.errno or 0)} ({fields})") from None
    return st

  def mmap(self, addr: int, size: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    r = self.libc.mmap(addr or None, size, prot, flags, fd, offset)
    if r is None or r == ctypes.c_void_p(-1).value:
      e = ctypes.get_errno()
      raise MemoryError(f"mmap of {size} bytes (fd {fd}, offset {offset:#x}) failed: {os.strerror(e)}") if e == errno.ENOMEM else \
        OSError(e, f"mmap of {size} bytes (fd {fd}, offset {offset:#x}) failed: {os.strerror(e)}")
    return r

  def munmap(self, addr: int, size: int) -> None: self.libc.munmap(addr, size)

  def poll(self) -> None:
    """Called while the host waits on the GPU; the hardware needs nothing (the mock runs its stalled queues here)."""

  def ring_doorbell(self, addr: int, value: int) -> None:
    """Write the queue's new write pointer to its doorbell (a 64-bit MMIO store)."""
    ctypes.c_uint64.from_address(addr).value = value
