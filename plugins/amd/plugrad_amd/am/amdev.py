"""AMDev: one AMD GPU brought up from userspace, and its memory: the AM driver's core.

Bring-up, in the kernel's IP order (each step's register traffic through am.regs):
  discovery  read the VRAM size (RCC_CONFIG_MEMSIZE, at the fixed pre-discovery offset) and the IP discovery table
             64 KiB below the top of VRAM; check every block's version is one this driver knows; load the firmware
  reset      a GPU left running by an earlier driver (sOS alive, SMU answering) gets an SMU mode-1 reset
  NBIO/HDP   doorbell aperture, HDP flush remap (am.soc)
  GMC        page-table root, MMHUB apertures/TLB/L2/context 0 (am.gmc)
  PSP        sOS boot, ring, TOC/TMR, SMU and IP firmware, RLC autoload (am.psp)
  SMU        driver table address, all features (am.smu)
  GFX        RLC autoload done, GFXHUB, MEC program start and enable (am.gfx)
  SDMA       engine un-halted (am.sdma)
A failure names the step and leaves the GPU resettable (`PCIDevice.reset_hint`). Memory: VRAM physical ranges from
`VRAMAllocator`s (bring-up's own in a boot region near the top), mapped for the GPU at the BAR's CPU address, so one
address serves both; system memory from the PCI layer's DMA allocator, mapped with the SYSTEM bit at its host address.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from plugrad_amd.am.discovery import Discovery, DiscoveryError, parse_discovery
from plugrad_amd.am.firmware import Firmware
from plugrad_amd.am.gfx import GFX
from plugrad_amd.am.gmc import GMC, HUGE, PAGE, PageTable, VRAMAllocator
from plugrad_amd.am.pci import PCIDevice
from plugrad_amd.am.psp import PSP
from plugrad_amd.am.regs import IPRegs
from plugrad_amd.am.sdma import SDMA
from plugrad_amd.am.smu import SMU
from plugrad_amd.am.soc import SOC
from plugrad_amd.autogen import amdgpu_defs as A
from plugrad_amd.autogen import soc15_hw_ip as H

# block: (hardware id, {version: generated register module or None}); versions of the Navi 31 (gfx1100) family
BLOCKS: dict[str, tuple[int, dict[tuple[int, int, int], str | None]]] = {
  "GC": (H.GC_HWID, {(11, 0, 0): "gc_11_0_0"}),
  "MMHUB": (H.MMHUB_HWID, {(3, 0, 0): "mmhub_3_0_0"}),
  "NBIO": (H.NBIF_HWID, {(4, 3, 0): "nbio_4_3_0"}),
  "MP0": (H.MP0_HWID, {(13, 0, 0): "mp_13_0_0"}),
  "MP1": (H.MP1_HWID, {(13, 0, 0): "mp_13_0_0"}),
  "SDMA0": (H.SDMA0_HWID, {(6, 0, 0): None}),  # SDMA 6's registers are GC's
}
MB = 1 << 20
RESERVED_TOP = 32 * MB   # left alone at the top of VRAM: the discovery table, firmware-reserved and memory-training areas
BOOT_SIZE = 64 * MB      # below it: bring-up's own memory (page-table root, PSP buffers and TMR, MQD, ...)


class UnsupportedGPU(RuntimeError):
  """An IP block version this driver doesn't know."""


class BringUpError(RuntimeError):
  """A bring-up step failed; the message names it and how to reset the GPU."""


@dataclass
class Mapping:
  """A GPU mapping: its virtual address (= CPU address), size, and where it lives."""
  va: int
  size: int
  vram: int | None          # VRAM physical address, or None for system memory
  system_pages: list[int] | None = None


def runs(pages: list[int]) -> list[tuple[int, int]]:
  """Bus addresses of consecutive 4 KiB pages as contiguous (address, bytes) runs."""
  out: list[tuple[int, int]] = []
  for pg in pages:
    if out and out[-1][0] + out[-1][1] == pg: out[-1] = (out[-1][0], out[-1][1] + PAGE)
    else: out.append((pg, PAGE))
  return out


def gfx_arch(version: tuple[int, int, int]) -> str:
  """GC 11.0.0 -> gfx1100 (the LLVM processor the compiler targets)."""
  major, minor, rev = version
  return f"gfx{major}{minor:x}{rev:x}"


class AMDev:
  def __init__(self, pci: PCIDevice, fw_dir: str | None = None, timeout_s: float | None = None) -> None:
    self.pci, self.mmio = pci, pci.mmio
    self.timeout_s = timeout_s if timeout_s is not None else pci.timeout_s or float(os.environ.get("AMD_PCI_TIMEOUT_S", "10"))
    self.vram_size = self.mmio.read32(A.mmRCC_CONFIG_MEMSIZE) * MB
    if not self.vram_size: raise BringUpError(f"{pci.bdf}: RCC_CONFIG_MEMSIZE reads 0: the GPU's firmware has not initialized its memory")
    if pci.vram.size < self.vram_size:
      raise BringUpError(f"{pci.bdf}: BAR 0 shows {pci.vram.size // MB} MiB of the {self.vram_size // MB} MiB of VRAM: enable Resizable BAR "
                         "(\"Above 4G decoding\" and \"Re-Size BAR\" in the firmware setup)")
    self.discovery = self.read_discovery()
    self.versions, self.regs = self.blocks(self.discovery)
    nbio = self.regs["NBIO"]
    self.mmio.indirect = (nbio.BIF_BX_PF0_RSMU_INDEX.addr, nbio.BIF_BX_PF0_RSMU_DATA.addr)
    self.arch = gfx_arch(self.versions["GC"])
    self.fw = Firmware.load(self.versions, fw_dir)  # before touching the hardware: a missing file changes nothing
    top = self.vram_size - RESERVED_TOP
    self.vram = VRAMAllocator(0, top - BOOT_SIZE)
    self.boot = VRAMAllocator(top - BOOT_SIZE, top)
    self.soc, self.gmc = SOC(self), GMC(self)
    self.pt = PageTable(self.pci.vram.addr, lambda: self.boot_alloc(PAGE))
    self.scratch, self.dummy = self.boot_alloc(PAGE), self.boot_alloc(PAGE)
    self.psp, self.smu, self.gfx, self.sdma = PSP(self, self.fw), SMU(self), GFX(self), SDMA(self)
    self.bring_up()

  # ---- discovery
  def read_discovery(self) -> Discovery:
    self.wait(lambda: self.mmio.read32(A.mmMP0_SMN_C2PMSG_33) >> 31, "the GPU's firmware to finish initializing (MP0 C2PMSG_33 bit 31)")
    pos = self.vram_size - A.DISCOVERY_TMR_OFFSET
    blob = ctypes.string_at(self.pci.vram.addr + pos, A.DISCOVERY_TMR_SIZE)
    try: return parse_discovery(blob)
    except DiscoveryError as e: raise BringUpError(f"{self.pci.bdf}: the IP discovery table at VRAM offset {pos} is unusable: {e}") from None

  def blocks(self, disc: Discovery) -> tuple[dict[str, tuple[int, int, int]], dict[str, IPRegs]]:
    """The versions of the blocks the driver uses and their register files; UnsupportedGPU for an unknown version."""
    versions, regs = {}, {}
    for name, (hwid, known) in BLOCKS.items():
      ip = disc.require(hwid)
      if ip.version not in known:
        raise UnsupportedGPU(f"{self.pci.bdf}: {name} {ip.version_str} is not supported by the PCI driver (it knows {name} "
                             f"{', '.join('.'.join(map(str, v)) for v in known)}: Navi 31 / gfx1100); use DEV=AMD through amdgpu for this GPU")
      versions[name] = ip.version
      if (mod := known[ip.version]) is not None:
        regs[name] = IPRegs(name, importlib.import_module(f"plugrad_amd.autogen.{mod}"), ip.bases, self.mmio)
    return versions, regs

  # ---- bring-up
  def bring_up(self) -> None:
    steps: list[tuple[str, Callable[[], None]]] = [
      ("reset", self.reset_if_running), ("NBIO/HDP", self.soc.init_hw), ("GMC", self.init_gmc), ("PSP", self.psp.init_hw),
      ("SMU", self.smu.init_hw), ("GFX", lambda: self.gfx.init_hw(self.pt.root, self.scratch, self.dummy)), ("SDMA", self.sdma.init_hw)]
    for name, step in steps:
      try: step()
      except Exception as e:
        raise BringUpError(f"{self.pci.bdf}: bring-up failed at {name}: {type(e).__name__}: {e}. The GPU is left as it is: "
                           f"{self.pci.reset_hint()}") from e

  def reset_if_running(self) -> None:
    if self.psp.sos_alive() and self.smu.alive(): self.smu.mode1_reset()

  def init_gmc(self) -> None:
    self.gmc.init_hub("MM", self.pt.root, self.scratch, self.dummy)
    self.gmc.flush_tlb("MM")

  def wait(self, cond: Callable[[], Any], what: str, timeout_s: float | None = None) -> None:
    """Poll `cond` until true; TimeoutError naming `what`."""
    deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
    while not cond():
      if self.pci.fault: raise RuntimeError(f"{self.pci.bdf} faulted waiting for {what}: {self.pci.fault}")
      if time.monotonic() > deadline: raise TimeoutError(f"timed out waiting for {what}")
      self.pci.settle(1e-4)

  def settle(self, seconds: float) -> None: self.pci.settle(seconds)

  # ---- memory
  def vram_cpu(self, paddr: int) -> int: return self.pci.vram.addr + paddr

  def boot_alloc(self, size: int, align: int = PAGE) -> int:
    """Zeroed VRAM for bring-up's own structures (physical address)."""
    p = self.boot.alloc(size, align)
    ctypes.memset(self.vram_cpu(p), 0, -(-size // PAGE) * PAGE)
    return p

  def flush_tlbs(self) -> None:
    for hub in self.gmc.HUBS: self.gmc.flush_tlb(hub)

  def _check_va(self, va: int, size: int) -> None:
    if va < self.gmc.fb_top and va + size > self.gmc.fb_base:
      raise MemoryError(f"address {va:#x} falls in the GPU's system aperture [{self.gmc.fb_base:#x}, {self.gmc.fb_top:#x}): not mappable")

  def alloc(self, size: int, kind: str, uncached: bool = False) -> Mapping:
    """`size` bytes of "vram" or "gtt" (system) memory mapped for the GPU; the CPU reaches both at the returned address."""
    size = -(-max(size, 1) // PAGE) * PAGE
    if kind == "vram":
      p = self.vram.alloc(size, HUGE if size >= HUGE else PAGE)
      m = Mapping(self.vram_cpu(p), size, p)
      self._check_va(m.va, size)
      self.pt.map(m.va, [(p, size)], uncached=uncached)
    else:
      addr, pages = self.pci.alloc_dma(size)
      m = Mapping(addr, size, None, pages)
      self._check_va(m.va, size)
      self.pt.map(m.va, runs(pages), system=True, snooped=True, uncached=uncached)
    self.flush_tlbs()
    return m

  def free(self, m: Mapping) -> None:
    self.pt.unmap(m.va, m.size)
    self.flush_tlbs()
    if m.vram is not None: self.vram.free(m.vram)
    else: self.pci.free_dma(m.va, m.size)
