"""Reaching an AMD GPU on the PCI bus: BAR mappings, register access, DMA memory (am.sysfs finds the GPUs).

`open_function` opens a GPU am.sysfs.usable accepted and maps its BARs (0: VRAM, 2: doorbells, 5: registers) and
provides DMA-able host memory with the bus address of every page (VFIO: mapped into the IOMMU at its own virtual
address; sysfs: pinned, physical addresses from /proc/self/pagemap). The mock (plugrad_amd.mock.pci) provides the
same interface on a simulated GPU.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import inspect
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from plugrad_amd.am.sysfs import PCIFunction, read_text, usable
from plugrad_amd.autogen import pci_regs, vfio
from plugrad_amd.kfd import MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE

VRAM_BAR, DOORBELL_BAR, MMIO_BAR = 0, 2, 5   # amdgpu_device_init: VRAM aperture, doorbell aperture, register BAR (CIK and later)
PAGE = 1 << 12
PAGEMAP_PFN_BITS = 55


class PCIError(RuntimeError):
  """A GPU can't be opened; the message says why and what to do."""


# ---------------------------------------------------------------------------- opened devices

class BarMMIO:
  """Registers through the mapped register BAR; those beyond it through an index/data register pair (`indirect`)."""
  def __init__(self, addr: int, size: int) -> None:
    self.addr, self.size = addr, size
    self.indirect: tuple[int, int] | None = None

  def _far(self, addr: int) -> tuple[int, int]:
    if self.indirect is None: raise PCIError(f"register {addr} lies beyond the {self.size}-byte register BAR and no indirect access is set up")
    return self.indirect

  def read32(self, addr: int) -> int:
    if addr * 4 + 4 <= self.size: return ctypes.c_uint32.from_address(self.addr + addr * 4).value
    index, data = self._far(addr)
    self.write32(index, addr * 4)
    return self.read32(data)

  def write32(self, addr: int, value: int) -> None:
    if addr * 4 + 4 <= self.size:
      ctypes.c_uint32.from_address(self.addr + addr * 4).value = value
      return
    index, data = self._far(addr)
    self.write32(index, addr * 4)
    self.write32(data, value)


@dataclass
class Bar:
  addr: int  # CPU address of the mapping
  size: int


class HostMemory:
  """Anonymous host memory reserved and mapped with mmap; `aligned` returns an address aligned to `align`."""
  def __init__(self) -> None:
    self.libc = ctypes.CDLL(None, use_errno=True)
    self.libc.mmap.restype = ctypes.c_void_p
    self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    self.libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

  def map(self, size: int, fd: int = -1, offset: int = 0, addr: int = 0, lock: bool = False) -> int:
    flags = (MAP_SHARED if fd >= 0 else MAP_PRIVATE | MAP_ANONYMOUS) | (MAP_FIXED if addr else 0)
    r = self.libc.mmap(addr or None, size, PROT_READ | PROT_WRITE, flags, fd, offset)
    if r is None or r == ctypes.c_void_p(-1).value:
      e = ctypes.get_errno()
      raise PCIError(f"mmap of {size} bytes (fd {fd}, offset {offset}) failed: {os.strerror(e)}")
    if lock and self.libc.mlock(r, size) != 0:
      raise PCIError(f"mlock of {size} bytes failed: {os.strerror(ctypes.get_errno())} (raise the memlock limit: ulimit -l)")
    return r

  def aligned(self, size: int, align: int, fd: int = -1, offset: int = 0) -> int:
    """Map `size` bytes at an `align`-aligned address (so 2 MiB GPU pages can map it)."""
    base = self.map(size + align)
    self.libc.munmap(base, size + align)
    return self.map(size, fd, offset, addr=-(-base // align) * align)

  def unmap(self, addr: int, size: int) -> None: self.libc.munmap(addr, size)


class PCIDevice:
  """An opened GPU: BARs, register access, DMA memory, doorbells. Subclasses: sysfs, VFIO, and the mock's."""
  bdf: str
  vram: Bar
  doorbells: Bar
  mmio: Any
  fault: str | None = None
  timeout_s: float | None = None  # how long a bring-up wait may take (None: AMD_PCI_TIMEOUT_S, default 10 s)

  def alloc_dma(self, size: int) -> tuple[int, list[int]]: raise NotImplementedError
  def free_dma(self, addr: int, size: int) -> None: raise NotImplementedError
  def write_doorbell(self, addr: int, value: int) -> None: ctypes.c_uint64.from_address(addr).value = value
  def poll(self) -> None: pass
  def settle(self, seconds: float) -> None: time.sleep(seconds)
  def reset_hint(self) -> str:
    return (f"the next open resets it (SMU mode-1 reset), or reset it now: echo 1 | sudo tee /sys/bus/pci/devices/{self.bdf}/reset "
            "(or rebind amdgpu)")
  def close(self) -> None: pass


def _resource_sizes(path: str) -> list[int]:
  """BAR sizes from the function's `resource` file (start end flags per BAR)."""
  out = []
  for ln in (read_text(os.path.join(path, "resource")) or "").splitlines():
    start, end, _ = (int(x, 16) for x in ln.split())
    out.append(end - start + 1 if end else 0)
  return out


class SysfsDevice(PCIDevice):
  """A GPU without a driver reached through its sysfs resource files (root; DMA addresses are physical addresses)."""
  def __init__(self, fn: PCIFunction) -> None:
    self.fn, self.bdf, self.host = fn, fn.bdf, HostMemory()
    self.fds: list[int] = []
    try: self._open()
    except BaseException:
      self.close()
      raise

  def _open(self) -> None:
    fn, sizes = self.fn, _resource_sizes(self.fn.path)
    def bar(i: int, align: int = PAGE) -> Bar:
      try: fd = os.open(os.path.join(fn.path, f"resource{i}"), os.O_RDWR | os.O_SYNC)
      except PermissionError: raise PCIError(f"{fn.name}: permission denied on resource{i}: run as root or bind the GPU to vfio-pci") from None
      except FileNotFoundError: raise PCIError(f"{fn.name} has no BAR {i} (resource{i})") from None
      self.fds.append(fd)
      return Bar(self.host.aligned(sizes[i], align, fd), sizes[i])
    self.vram, self.doorbells, mm = bar(VRAM_BAR, 1 << 21), bar(DOORBELL_BAR), bar(MMIO_BAR)
    self.mmio = BarMMIO(mm.addr, mm.size)
    self._enable_bus_master(os.path.join(fn.path, "config"))
    self.pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    self.fds.append(self.pagemap)

  def _enable_bus_master(self, config: str) -> None:
    fd = os.open(config, os.O_RDWR)
    try:
      cmd = int.from_bytes(os.pread(fd, 2, pci_regs.PCI_COMMAND), "little")
      os.pwrite(fd, (cmd | pci_regs.PCI_COMMAND_MEMORY | pci_regs.PCI_COMMAND_MASTER).to_bytes(2, "little"), pci_regs.PCI_COMMAND)
    finally: os.close(fd)

  def alloc_dma(self, size: int) -> tuple[int, list[int]]:
    addr = self.host.map(size, lock=True)
    ctypes.memset(addr, 0, size)  # fault every page in before asking for its frame
    pfns = []
    for page in range(addr, addr + size, PAGE):
      e = int.from_bytes(os.pread(self.pagemap, 8, (page // PAGE) * 8), "little")
      pfn = e % (1 << PAGEMAP_PFN_BITS)
      if not e >> 63 or not pfn: raise PCIError("reading physical addresses from /proc/self/pagemap needs root (CAP_SYS_ADMIN)")
      pfns.append(pfn * PAGE)
    return addr, pfns

  def free_dma(self, addr: int, size: int) -> None: self.host.unmap(addr, size)

  def close(self) -> None:
    while self.fds: os.close(self.fds.pop())


def _vfio_ioctls() -> dict[str, int]:
  """VFIO ioctl numbers: _IO(VFIO_TYPE, VFIO_BASE + n), from the macros the generated bindings keep as comments."""
  src = inspect.getsource(vfio)
  return {m.group(1): (ord(vfio.VFIO_TYPE) << 8) | (vfio.VFIO_BASE + int(m.group(2)))
          for m in re.finditer(r"^# (VFIO_\w+) = _IO \( \(';'\) , 100 \+ (\d+) \) # macro$", src, re.M)}


class VFIODevice(PCIDevice):
  """A GPU bound to vfio-pci: BARs mmapped from the device fd, DMA memory mapped into the IOMMU (type 1 v2)."""
  def __init__(self, fn: PCIFunction, dev_root: str = "/dev") -> None:
    self.fn, self.bdf, self.host, self.ioctls = fn, fn.bdf, HostMemory(), _vfio_ioctls()
    self.fds: list[int] = []
    try: self._open(dev_root)
    except BaseException:
      self.close()
      raise

  def _open(self, dev_root: str) -> None:
    fn = self.fn
    self.container = os.open(os.path.join(dev_root, "vfio", "vfio"), os.O_RDWR)
    self.fds.append(self.container)
    if self._ioctl(self.container, "VFIO_GET_API_VERSION") != vfio.VFIO_API_VERSION: raise PCIError("the kernel's VFIO API version is unknown")
    if not self._ioctl(self.container, "VFIO_CHECK_EXTENSION", vfio.VFIO_TYPE1v2_IOMMU): raise PCIError("VFIO lacks the type-1 v2 IOMMU")
    self.group = os.open(os.path.join(dev_root, "vfio", str(fn.iommu_group)), os.O_RDWR)
    self.fds.append(self.group)
    st = vfio.struct_vfio_group_status(argsz=ctypes.sizeof(vfio.struct_vfio_group_status))
    self._ioctl(self.group, "VFIO_GROUP_GET_STATUS", st)
    if not st.flags & vfio.VFIO_GROUP_FLAGS_VIABLE:
      raise PCIError(f"{fn.name}: IOMMU group {fn.iommu_group} is not viable: bind every device of "
                     f"/sys/kernel/iommu_groups/{fn.iommu_group} to vfio-pci")
    self._ioctl(self.group, "VFIO_GROUP_SET_CONTAINER", ctypes.c_int(self.container))
    self._ioctl(self.container, "VFIO_SET_IOMMU", vfio.VFIO_TYPE1v2_IOMMU)
    self.dev = self._ioctl(self.group, "VFIO_GROUP_GET_DEVICE_FD", ctypes.create_string_buffer(fn.bdf.encode()))
    self.fds.append(self.dev)
    self.vram, self.doorbells = self._bar(VRAM_BAR, 1 << 21), self._bar(DOORBELL_BAR)
    mm = self._bar(MMIO_BAR)
    self.mmio = BarMMIO(mm.addr, mm.size)
    cfg = self._region(vfio.VFIO_PCI_CONFIG_REGION_INDEX)
    cmd = int.from_bytes(os.pread(self.dev, 2, cfg.offset + pci_regs.PCI_COMMAND), "little")
    cmd |= pci_regs.PCI_COMMAND_MEMORY | pci_regs.PCI_COMMAND_MASTER
    os.pwrite(self.dev, cmd.to_bytes(2, "little"), cfg.offset + pci_regs.PCI_COMMAND)

  def _ioctl(self, fd: int, name: str, arg: Any = 0) -> int:
    try: return fcntl.ioctl(fd, self.ioctls[name], arg) if isinstance(arg, int) else fcntl.ioctl(fd, self.ioctls[name], arg, True)
    except OSError as e: raise PCIError(f"{self.fn.name}: {name} failed: {os.strerror(e.errno or errno.EIO)}") from None

  def _region(self, index: int) -> Any:
    r = vfio.struct_vfio_region_info(argsz=ctypes.sizeof(vfio.struct_vfio_region_info), index=index)
    self._ioctl(self.dev, "VFIO_DEVICE_GET_REGION_INFO", r)
    return r

  def _bar(self, i: int, align: int = PAGE) -> Bar:
    r = self._region(vfio.VFIO_PCI_BAR0_REGION_INDEX + i)
    if not r.size: raise PCIError(f"{self.fn.name} has no BAR {i}")
    return Bar(self.host.aligned(r.size, align, self.dev, r.offset), r.size)

  def alloc_dma(self, size: int) -> tuple[int, list[int]]:
    addr = self.host.map(size)
    m = vfio.struct_vfio_iommu_type1_dma_map(argsz=ctypes.sizeof(vfio.struct_vfio_iommu_type1_dma_map), vaddr=addr, iova=addr, size=size,
                                             flags=vfio.VFIO_DMA_MAP_FLAG_READ | vfio.VFIO_DMA_MAP_FLAG_WRITE)
    self._ioctl(self.container, "VFIO_IOMMU_MAP_DMA", m)
    return addr, list(range(addr, addr + size, PAGE))  # the IOMMU maps each page at its own virtual address

  def free_dma(self, addr: int, size: int) -> None:
    u = vfio.struct_vfio_iommu_type1_dma_unmap(argsz=ctypes.sizeof(vfio.struct_vfio_iommu_type1_dma_unmap), iova=addr, size=size)
    self._ioctl(self.container, "VFIO_IOMMU_UNMAP_DMA", u)
    self.host.unmap(addr, size)

  def reset_hint(self) -> str: return "the next open resets it (SMU mode-1 reset), or reset it through VFIO (VFIO_DEVICE_RESET) / rebind amdgpu"

  def close(self) -> None:
    while self.fds: os.close(self.fds.pop())


def open_function(fn: PCIFunction, dev_root: str = "/dev") -> PCIDevice:
  """Open a GPU `usable` said yes to, through VFIO or sysfs."""
  ok, why = usable(fn, dev_root)
  if not ok: raise PCIError(why)
  return VFIODevice(fn, dev_root) if fn.driver == "vfio-pci" else SysfsDevice(fn)
