"""`PCI+AMD` / `MOCK+PCI+AMD`: plugrad_amd.device's HCQ runtime on the AM driver instead of KFD.

Only the lowest layer differs from `AMDDevice`: memory comes from `AMDev.alloc` (VRAM or DMA-able system memory mapped
in the driver's own page table), the compute and SDMA rings are hardware queues the driver programs (`PCIRing`), and
doorbells are 64-bit writes into BAR 2 after an HDP flush. PM4/SDMA encodings, signals, kernargs, programs, TinyJit
batches and the compiler are the KFD path's. Copies between GPUs go through the host.
"""
from __future__ import annotations

import ctypes
import importlib
from typing import Any

from plugrad.device import parse_device
from plugrad.runtime.hcq import HCQBuffer
from plugrad_amd.am.amdev import AMDev, Mapping
from plugrad_amd.am.pci import PCIDevice, PCIError, open_function
from plugrad_amd.am.sysfs import SYSFS, availability_reasons
from plugrad_amd.device import PAGE, RING_SIZE, AMDAllocator, AMDDevice, Ring, host_transfer
from plugrad_amd.renderer import ARCHS

EOP_SIZE = PAGE
PCI_INTERFACES = ("PCI", "MOCK+PCI")


class PCIOS:
  """The hooks plugrad_amd.device calls on its lowest layer: doorbells, polling while waiting, faults."""
  name = "PCI"

  def __init__(self, dev: AMDPCIDevice) -> None: self.dev = dev

  def ring_doorbell(self, addr: int, value: int) -> None:
    self.dev.adev.gmc.flush_hdp()  # the ring's packets, written by the CPU, reach memory before the engine reads them
    self.dev.pci.write_doorbell(addr, value)

  def poll(self) -> None: self.dev.pci.poll()

  @property
  def fault(self) -> str | None: return self.dev.pci.fault or self.dev.adev.gmc.fault_status()


class PCIRing(Ring):
  """A hardware queue the AM driver programmed (MEC 1 pipe 0 queue 0, or SDMA0 queue 0); `submit` is `Ring`'s."""
  def __init__(self, dev: AMDPCIDevice, engine: str) -> None:  # not Ring.__init__: that makes a KFD queue
    self.dev, self.unit = dev, 4 if engine == "compute" else 1
    self.ring = dev.alloc_gpu(RING_SIZE, "gtt", uncached=True)
    self.ptrs = dev.alloc_gpu(PAGE, "gtt", uncached=True)
    self.rptr_addr, self.wptr_addr = self.ptrs.va_addr, self.ptrs.va_addr + 8
    ctypes.memset(self.ptrs.va_addr, 0, 16)
    a = dev.adev
    if engine == "compute":
      self.eop, self.mqd = dev.alloc_gpu(EOP_SIZE, "vram"), dev.alloc_gpu(PAGE, "vram")
      db = a.gfx.compute_queue(self.ring.va_addr, RING_SIZE, self.rptr_addr, self.wptr_addr, self.eop.va_addr, EOP_SIZE,
                               self.mqd.meta.vram, self.mqd.va_addr)
    else: db = a.sdma.queue(self.ring.va_addr, RING_SIZE, self.rptr_addr, self.wptr_addr)
    self.doorbell = dev.pci.doorbells.addr + db * 4
    self.wptr = 0


class AMDPCIAllocator(AMDAllocator):
  def _transfer(self, dest: HCQBuffer, src: HCQBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
    host_transfer(dest, src, nbytes, src_dev, dest_dev)


def platform(iface: str) -> Any:
  """The PCI platform of an interface: the machine's sysfs, or the mock's simulated bus."""
  if iface == "MOCK+PCI": return importlib.import_module("plugrad_amd.mock.pci").MockPlatform.instance()
  return SysfsPlatform()


class SysfsPlatform:
  """The machine's PCI bus."""
  def __init__(self, root: str = SYSFS, dev_root: str = "/dev") -> None: self.root, self.dev_root = root, dev_root

  def gpus(self) -> list[Any]:
    ok, reasons = availability_reasons(self.root, self.dev_root)
    if not ok: raise PCIError("no usable AMD GPU on the PCI bus" + (": " + "; ".join(reasons) if reasons else f" ({self.root} lists none)"))
    return ok

  def open(self, fn: Any) -> PCIDevice: return open_function(fn, self.dev_root)


class AMDPCIDevice(AMDDevice):
  """An AMD GPU driven from userspace (`PCI+AMD`, `PCI+AMD:1`), or the mock PCI GPU (`MOCK+PCI+AMD`)."""
  def __init__(self, device: str, plat: Any = None) -> None:  # not AMDDevice.__init__ (it opens KFD): init_runtime is the shared part
    dn = parse_device(device)
    if dn.iface not in PCI_INTERFACES: raise ValueError(f"device {device}: the PCI driver serves {', '.join(PCI_INTERFACES)}, not {dn.iface}")
    plat = plat or platform(dn.iface)
    gpus = plat.gpus()
    if not 0 <= dn.index < len(gpus): raise ValueError(f"device {device}: there are {len(gpus)} usable AMD GPU(s) on the PCI bus")
    want = dn.arch or (dn.renderer.lower() if dn.renderer and dn.renderer.lower() in ARCHS else None)
    self.pci = plat.open(gpus[dn.index])
    try:
      self.adev = AMDev(self.pci, getattr(plat, "firmware_dir", None))
      if want and want != self.adev.arch: raise ValueError(f"device {device}: the GPU at {self.pci.bdf} is {self.adev.arch}, not {want}")
    except BaseException:
      self.pci.close()  # the GPU is free again (a later open resets it)
      raise
    self.arch = self.adev.arch
    self.os, self.props, self.gpu_id = PCIOS(self), {}, int("".join(c for c in self.pci.bdf if c.isalnum()), 16)  # the bus address
    self.family, self.wave, self.regs = self.arch[:5], ARCHS[self.arch]["wave"], self.adev.regs["GC"].module
    self.init_runtime(device, AMDPCIAllocator)

  def make_rings(self) -> tuple[Ring, Ring]: return PCIRing(self, "compute"), PCIRing(self, "sdma")

  def shader_engines(self) -> int:
    """From the IP discovery table's GC info (gc_num_se)."""
    return max(1, self.adev.discovery.gc_info.get("gc_num_se", 1))

  def alloc_gpu(self, size: int, kind: str, cpu_access: bool = True, uncached: bool = False) -> HCQBuffer:
    m = self.adev.alloc(size, kind, uncached)
    view = memoryview((ctypes.c_uint8 * m.size).from_address(m.va)).cast("B")[:size]
    return HCQBuffer(m.va, size, view, meta=m)

  def free_gpu(self, buf: HCQBuffer) -> None:
    assert isinstance(buf.meta, Mapping)
    self.adev.free(buf.meta)

  def map_into(self, buf: HCQBuffer) -> None:
    raise NotImplementedError(f"{self.device}: mapping another GPU's memory (peer-to-peer) is not done on the PCI interface")
