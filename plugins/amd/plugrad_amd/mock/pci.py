"""The mock PCI GPU (`DEV=MOCK+PCI+AMD`): a simulated Navi 31 on a simulated PCI bus, driven by the real AM driver.

`MockPlatform` stands where sysfs and VFIO stand (`gpus()`, `open()`, DMA-able host memory with bus addresses, like an
IOMMU); `MockPCIDevice` is what the driver gets instead of a sysfs/VFIO device: BARs (VRAM and doorbells are host
memory; the register BAR is the mock's register file), DMA memory, doorbell writes. `MockGPU` models what the driver
talks to:
- a register file built from the same generated bindings and the discovery table the mock puts 64 KiB below the top
  of VRAM (NAVI31 in mock.discovery); an access to an address that is no register faults, and so does a register of a
  block that isn't up: SDMA before its firmware, CP/RLC/SH registers before the RLC autoload, the MEC's and HQD
  registers before the MEC firmware (`gate`). Banked registers follow GRBM_GFX_CNTL (me/pipe/queue, vmid).
- the PSP bootloader, sOS ring and commands, and the SMU mailbox (mock.pci_firmware), checking every firmware image
  against the synthetic firmware's headers (mock.firmware);
- the GFXHUB: GPU virtual addresses are translated by walking the page table the driver wrote (context 0's base,
  4 levels, 2 MiB PDE0 pages, VRAM or system pages); translations are cached per 2 MiB and dropped only when the
  driver invalidates through GCVM_INVALIDATE_ENG17 (as the TLB does); an unmapped address is a page fault;
- the compute queue (HQD registers of MEC 1) and SDMA queue 0: a doorbell write runs the ring through the shared
  command processor (mock.engines) and the RDNA3 emulator; a doorbell no queue owns, or one outside the NBIO's
  routed ranges, faults.
A fault is raised at the offending register access (MockGPUError) or kept in `fault` for the runtime's next wait.
What the mock doesn't model: interrupts (IH), clock/power gating, the HDP cache (flushes are counted, not needed),
memory training, TMZ, RAS, more than one compute and one SDMA queue.
"""
from __future__ import annotations

import atexit
import ctypes
import importlib
import mmap
import os
import shutil
import tempfile
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from plugrad_amd.am.gmc import ADDR_MASK, ENTRIES, LEVEL_SHIFTS, PAGE
from plugrad_amd.am.pci import Bar, PCIDevice, PCIError
from plugrad_amd.am.regs import field_table, register_offsets
from plugrad_amd.am.soc import HDP_MEM_FLUSH, HDP_REG_FLUSH
from plugrad_amd.am.sysfs import PCIFunction
from plugrad_amd.autogen import amdgpu_defs as A
from plugrad_amd.autogen import pci_ids
from plugrad_amd.autogen import soc15_hw_ip as H
from plugrad_amd.mock import rdna3
from plugrad_amd.mock.discovery import NAVI31, NAVI31_GC_INFO, build_discovery
from plugrad_amd.mock.dispatch import PageFault, get_executor
from plugrad_amd.mock.engines import Engines, RingFault
from plugrad_amd.mock.firmware import write_synthetic
from plugrad_amd.mock.pci_firmware import PSPModel, SMUModel

MMIO_SIZE = 1 << 20
DOORBELL_SIZE = 1 << 21
FB_BASE = 1 << 39     # where the mock's "VBIOS" put VRAM in the MC address space (MC_VM_FB_LOCATION_BASE)
HUGE = 1 << 21
NAVI31_DEVICE_ID = 0x744C
MODULES = {"GC": "gc_11_0_0", "MMHUB": "mmhub_3_0_0", "NBIO": "nbio_4_3_0", "MP0": "mp_13_0_0", "MP1": "mp_13_0_0"}
HWIDS = {"GC": H.GC_HWID, "MMHUB": H.MMHUB_HWID, "NBIO": H.NBIF_HWID, "MP0": H.MP0_HWID, "MP1": H.MP1_HWID}
ALWAYS_ON_GC = ("GCVM_", "GCMC_", "GCUTCL2_", "SCRATCH_", "RLC_RLCS_BOOTLOAD_STATUS", "CP_STAT", "GRBM_STATUS")
RLC_GATED_GC = ("CP_", "RLC_", "SH_MEM_", "TCP_", "SPI_", "COMPUTE_", "GRBM_", "SQ_", "TA_", "GB_")
MEC_GATED_GC = ("CP_MEC_", "CP_HQD_", "CP_MQD_", "CP_PQ_")
QUEUE_BANKED = ("CP_HQD_", "CP_MQD_")


class MockGPUError(RuntimeError):
  """What real hardware would reject: raised at the offending access and kept as the GPU's fault."""


@dataclass
class Queue:
  kind: str          # "PM4" (compute HQD) or "SDMA"
  ring: int          # GPU virtual address
  size: int          # bytes
  rptr: int          # GPU virtual address the engine reports its read pointer to
  doorbell: int      # dword index in the doorbell BAR
  unit: int          # bytes per write-pointer unit (4 for PM4, 1 for SDMA)
  wptr: int = 0      # bytes
  consumed: int = 0  # bytes


def host_buffer(size: int, align: int = PAGE) -> tuple[mmap.mmap, int]:
  """Host memory standing for a BAR or DMA memory: (backing, address aligned to `align`)."""
  m = mmap.mmap(-1, size + align)
  base = ctypes.addressof(ctypes.c_char.from_buffer(m))
  return m, -(-base // align) * align


class MockPlatform:
  """The simulated PCI bus: GPUs, and DMA memory with bus addresses (the IOMMU's view)."""
  _instance: MockPlatform | None = None
  _lock = threading.Lock()

  @classmethod
  def instance(cls) -> MockPlatform:
    with cls._lock:
      if cls._instance is None: cls._instance = cls(int(os.environ.get("MOCK_AMD_GPUS", "2")), int(os.environ.get("MOCK_AMD_VRAM_MB", "1024")) << 20)
      return cls._instance

  def __init__(self, n_gpus: int = 2, vram_bytes: int = 1 << 30, firmware_dir: str | None = None, ips: list | None = None) -> None:
    """`ips` replaces the GPUs' discovery table (NAVI31), e.g. to show the driver a block version it doesn't know."""
    self.devices = [MockGPU(self, i, vram_bytes, ips or NAVI31) for i in range(n_gpus)]
    self.dma: dict[int, int] = {}   # bus page -> host page
    self.dma_generation = 0         # bumped when DMA memory is freed: cached translations to it are checked again
    self._dma_backing: dict[int, tuple[mmap.mmap, list[int]]] = {}
    self._next_bus = 1 << 44
    self.firmware_dir = firmware_dir or os.environ.get("AMD_FIRMWARE_DIR") or self._synthetic_firmware()
    if get_executor() is None: rdna3.install()

  @staticmethod
  def _synthetic_firmware() -> str:
    """A private folder of synthetic firmware (mock.firmware), removed at exit."""
    d = tempfile.mkdtemp(prefix="plugrad-mock-amdgpu-fw-")
    atexit.register(shutil.rmtree, d, True)
    write_synthetic(d)
    return d

  def gpus(self) -> list[PCIFunction]:
    return [PCIFunction(g.bdf, pci_ids.PCI_VENDOR_ID_ATI, NAVI31_DEVICE_ID, pci_ids.PCI_CLASS_DISPLAY_VGA << 8, None, None, None, "mock")
            for g in self.devices]

  def open(self, fn: PCIFunction) -> MockPCIDevice:
    gpu = next(g for g in self.devices if g.bdf == fn.bdf)
    if gpu.opened: raise PCIError(f"{fn.bdf} is already open in this process")
    gpu.opened = True
    return MockPCIDevice(self, gpu)

  def alloc_dma(self, size: int) -> tuple[int, list[int]]:
    m, addr = host_buffer(size)
    bus = list(range(self._next_bus, self._next_bus + size, PAGE))
    self._next_bus += size + HUGE  # a gap: a run past the end is no neighbour's memory
    for i, b in enumerate(bus): self.dma[b] = addr + i * PAGE
    self._dma_backing[addr] = (m, bus)
    return addr, bus

  def free_dma(self, addr: int, size: int) -> None:
    _, bus = self._dma_backing.pop(addr)
    for b in bus: self.dma.pop(b, None)
    self.dma_generation += 1


class MockPCIDevice(PCIDevice):
  """The driver's handle on a mock GPU (the PCIDevice interface)."""
  timeout_s = 0.5  # the mock answers at once: a wait not satisfied immediately never will be
  def __init__(self, platform: MockPlatform, gpu: MockGPU) -> None:
    self.platform, self.gpu, self.bdf, self.mmio = platform, gpu, gpu.bdf, gpu
    self.vram, self.doorbells = Bar(gpu.vram_addr, gpu.vram_size), Bar(gpu.db_addr, DOORBELL_SIZE)

  @property
  def fault(self) -> str | None: return self.gpu.fault  # type: ignore[override]
  def alloc_dma(self, size: int) -> tuple[int, list[int]]: return self.platform.alloc_dma(size)
  def free_dma(self, addr: int, size: int) -> None: self.platform.free_dma(addr, size)
  def write_doorbell(self, addr: int, value: int) -> None: self.gpu.doorbell(addr - self.gpu.db_addr, value)
  def poll(self) -> None: self.gpu.run_queues()
  def settle(self, seconds: float) -> None: pass  # the mock answers at once
  def reset_hint(self) -> str: return "the next open resets it (SMU mode-1 reset), or MockGPU.power_on()"
  def close(self) -> None: self.gpu.opened = False


class MockGPU:
  def __init__(self, platform: MockPlatform, index: int, vram_bytes: int, ips: list = NAVI31) -> None:
    self.platform, self.index, self.bdf = platform, index, f"0000:{3 + index:02x}:00.0"
    self.vram_size = vram_bytes
    self._vram, self.vram_addr = host_buffer(vram_bytes, HUGE)
    self._db, self.db_addr = host_buffer(DOORBELL_SIZE)
    self.bases = {name: next(b for h, _, _, b in NAVI31 if h == hwid) for name, hwid in HWIDS.items()}
    self.modules = {b: importlib.import_module(f"plugrad_amd.autogen.{m}") for b, m in MODULES.items()}
    self.names: dict[int, tuple[str, str]] = {}
    self.addrs: dict[tuple[str, str], int] = {}
    for blk, mod in self.modules.items():
      for name, (off, seg) in register_offsets(mod).items():
        if blk in ("MP0", "MP1") and not name.startswith(blk): continue  # one module, two blocks
        if seg < len(self.bases[blk]) and (blk, name) not in self.addrs:
          self.names.setdefault(self.bases[blk][seg] + off, (blk, name))
          self.addrs[(blk, name)] = self.bases[blk][seg] + off
    self.opened, self.power_cycles = False, 0
    self.engines = Engines()
    disc = build_discovery(ips, NAVI31_GC_INFO)
    ctypes.memmove(self.vram_addr + vram_bytes - A.DISCOVERY_TMR_OFFSET, disc, len(disc))
    self.power_on()

  # ---- state
  def power_on(self) -> None:
    """The state after power-on or a mode-1 reset: VRAM keeps its contents, every block is back at its start."""
    self.power_cycles += 1
    self.regs: dict[int, int] = {}
    self.banks: dict[tuple[str, tuple[int, ...]], int] = {}
    self.fault: str | None = None
    self.rlc_up = self.sdma_fw = False
    self.loaded: set[int] = set()
    self.mec_start = 0
    self.queues: dict[int, Queue] = {}
    self.tlb: dict[int, tuple[np.ndarray, int | None, list[int], int]] = {}  # 2 MiB region -> (hosts, contiguous base, system pages, generation)
    self.hdp_flushes = 0
    self.trace: deque[tuple[str, str, str, int]] = deque(maxlen=1 << 16)  # (r/w, block, register, value): what the driver did
    self.set("NBIO", "RCC_DEV0_EPF0_RCC_CONFIG_MEMSIZE", self.vram_size >> 20)
    self.set("GC", "SDMA0_F32_CNTL", self.encode("GC", "SDMA0_F32_CNTL", halt=1, th1_reset=1))  # the engines start halted
    self.set("GC", "CP_MEC_RS64_CNTL", self.encode("GC", "CP_MEC_RS64_CNTL", mec_halt=1, mec_pipe0_reset=1))
    fb_top = (FB_BASE + self.vram_size - 1) >> 24
    for blk, p in (("MMHUB", "MM"), ("GC", "GC")):
      self.set(blk, f"{p}MC_VM_FB_LOCATION_BASE", FB_BASE >> 24)
      self.set(blk, f"{p}MC_VM_FB_LOCATION_TOP", fb_top)
    self.psp, self.smu = PSPModel(self), SMUModel(self)

  def addr(self, blk: str, name: str) -> int: return self.addrs[(blk, name)]
  def get(self, blk: str, name: str) -> int: return self.regs.get(self.addr(blk, name), 0)
  def set(self, blk: str, name: str, value: int) -> None: self.regs[self.addr(blk, name)] = value % (1 << 32)

  def field(self, blk: str, name: str, f: str, value: int | None = None) -> int:
    shift, mask = field_table(self.modules[blk])[name][f]
    return ((self.get(blk, name) if value is None else value) & mask) >> shift

  def encode(self, blk: str, name: str, **fields: int) -> int:
    t = field_table(self.modules[blk])[name]
    return sum((v << t[f][0]) & t[f][1] for f, v in fields.items())

  def fail(self, msg: str) -> MockGPUError:
    self.fault = self.fault or msg
    return MockGPUError(msg)

  # ---- the register BAR
  def grbm(self) -> tuple[int, int, int, int]:
    v = self.get("GC", "GRBM_GFX_CNTL")
    return tuple(self.field("GC", "GRBM_GFX_CNTL", f, v) for f in ("meid", "pipeid", "queueid", "vmid"))  # type: ignore[return-value]

  def bank(self, blk: str, name: str) -> tuple[str, tuple[int, ...]] | None:
    if blk != "GC": return None
    me, pipe, queue, vmid = self.grbm()
    if name.startswith(QUEUE_BANKED):
      if me == 0: raise self.fail(f"{name} accessed with GRBM_GFX_CNTL selecting ME 0 (the graphics ME): compute queues live on ME 1 and 2")
      return name, (me, pipe, queue)
    if name.startswith("CP_MEC_RS64_PRGRM_CNTR_START"): return name, (me, pipe)
    if name.startswith("SH_MEM_"): return name, (vmid,)
    return None

  def gate(self, blk: str, name: str, what: str) -> None:
    """Refuse registers of blocks that are not up yet."""
    if blk != "GC" or name.startswith(ALWAYS_ON_GC): return
    if name.startswith(("SDMA0_", "SDMA1_")):
      if not self.sdma_fw: raise self.fail(f"GC register {name} {what} before the PSP loaded the SDMA firmware (SDMA_UCODE_TH0/TH1)")
    elif name.startswith(MEC_GATED_GC) and not (self.rlc_up and self.psp.has_mec()):
      raise self.fail(f"GC register {name} {what} before the MEC firmware was loaded and the RLC autoload brought GC up")
    elif name.startswith(RLC_GATED_GC) and not self.rlc_up:
      raise self.fail(f"GC register {name} {what} before the RLC autoload brought the graphics block up (PSP AUTOLOAD_RLC)")

  def lookup(self, addr: int, what: str, value: int = 0) -> tuple[str, str]:
    if (r := self.names.get(addr)) is None:
      raise self.fail(f"MMIO {what} of {value:#x} at register address {addr:#x}: no register of GC/MMHUB/NBIO/MP0/MP1 there"
                      if what == "write" else f"MMIO read at register address {addr:#x}: no register of GC/MMHUB/NBIO/MP0/MP1 there")
    return r

  def read32(self, addr: int) -> int:
    if addr * 4 in (HDP_MEM_FLUSH, HDP_REG_FLUSH) and self._hdp_remapped(addr * 4): return 0
    blk, name = self.lookup(addr, "read")
    self.gate(blk, name, "read")
    if (h := getattr(self, f"_r_{name}", None)) is not None: v = h()
    elif (b := self.bank(blk, name)) is not None: v = self.banks.get(b, 0)
    else: v = self.regs.get(addr, 0)
    self.trace.append(("r", blk, name, v))
    return v

  def write32(self, addr: int, value: int) -> None:
    if addr * 4 in (HDP_MEM_FLUSH, HDP_REG_FLUSH) and self._hdp_remapped(addr * 4):
      self.hdp_flushes += 1
      return
    blk, name = self.lookup(addr, "write", value)
    self.gate(blk, name, "written")
    self.trace.append(("w", blk, name, value))
    if (b := self.bank(blk, name)) is not None: self.banks[b] = value
    else: self.regs[addr] = value
    for model in (self, self.psp, self.smu):
      if (h := getattr(model, f"_w_{name}", None)) is not None: h(value)

  def _hdp_remapped(self, byte_addr: int) -> bool:
    return byte_addr in (self.get("NBIO", "BIF_BX0_REMAP_HDP_MEM_FLUSH_CNTL"), self.get("NBIO", "BIF_BX0_REMAP_HDP_REG_FLUSH_CNTL"))

  # registers with side effects
  def _r_BIF_BX_PF0_RSMU_DATA(self) -> int: return self.read32(self.get("NBIO", "BIF_BX_PF0_RSMU_INDEX") // 4)
  def _w_BIF_BX_PF0_RSMU_DATA(self, v: int) -> None: self.write32(self.get("NBIO", "BIF_BX_PF0_RSMU_INDEX") // 4, v)
  def _r_MMVM_INVALIDATE_ENG17_SEM(self) -> int: return 1  # the semaphore is free: taken
  def _w_MMVM_INVALIDATE_ENG17_REQ(self, v: int) -> None: self.set("MMHUB", "MMVM_INVALIDATE_ENG17_ACK", v & 0xFFFF)

  def _w_GCVM_INVALIDATE_ENG17_REQ(self, v: int) -> None:
    self.tlb.clear()
    self.set("GC", "GCVM_INVALIDATE_ENG17_ACK", v & 0xFFFF)

  def _w_CP_MEC_RS64_CNTL(self, v: int) -> None:
    f = lambda n: self.field("GC", "CP_MEC_RS64_CNTL", n, v)
    if f("mec_halt") or not f("mec_pipe0_active") or f("mec_pipe0_reset"): return
    start = self.banks.get(("CP_MEC_RS64_PRGRM_CNTR_START", (1, 0)), 0) | self.banks.get(("CP_MEC_RS64_PRGRM_CNTR_START_HI", (1, 0)), 0) << 32
    if start != self.mec_start >> 2:
      raise self.fail(f"MEC 1 pipe 0 started at program counter {start:#x}; its firmware starts at {self.mec_start >> 2:#x} "
                      "(CP_MEC_RS64_PRGRM_CNTR_START)")

  def mec_running(self) -> bool:
    v = self.get("GC", "CP_MEC_RS64_CNTL")
    return not self.field("GC", "CP_MEC_RS64_CNTL", "mec_halt", v) and bool(self.field("GC", "CP_MEC_RS64_CNTL", "mec_pipe0_active", v)) \
      and not self.field("GC", "CP_MEC_RS64_CNTL", "mec_pipe0_reset", v)

  def _w_CP_HQD_ACTIVE(self, v: int) -> None:
    me, pipe, queue, _ = self.grbm()
    b = lambda n: self.banks.get((n, (me, pipe, queue)), 0)
    if not v & 1:
      self.queues = {d: q for d, q in self.queues.items() if q.kind != "PM4"}
      return
    if not self.mec_running(): raise self.fail("CP_HQD_ACTIVE set while MEC 1 pipe 0 is halted or in reset (CP_MEC_RS64_CNTL)")
    self.require_vm("activating a compute queue")
    ring = (b("CP_HQD_PQ_BASE") | b("CP_HQD_PQ_BASE_HI") << 32) << 8
    qs = self.field("GC", "CP_HQD_PQ_CONTROL", "queue_size", b("CP_HQD_PQ_CONTROL"))
    dbc = b("CP_HQD_PQ_DOORBELL_CONTROL")
    db = self.field("GC", "CP_HQD_PQ_DOORBELL_CONTROL", "doorbell_offset", dbc)
    lo, hi = self.get("GC", "CP_MEC_DOORBELL_RANGE_LOWER") // 4, self.get("GC", "CP_MEC_DOORBELL_RANGE_UPPER") // 4
    if not ring: raise self.fail("CP_HQD_ACTIVE set on a queue without a ring (CP_HQD_PQ_BASE is 0)")
    if not self.field("GC", "CP_HQD_PQ_DOORBELL_CONTROL", "doorbell_en", dbc): raise self.fail("compute queue activated with its doorbell disabled")
    if not lo <= db <= hi: raise self.fail(f"compute queue doorbell {db} is outside the MEC's doorbell range [{lo}, {hi}] (CP_MEC_DOORBELL_RANGE_*)")
    rptr = b("CP_HQD_PQ_RPTR_REPORT_ADDR") | b("CP_HQD_PQ_RPTR_REPORT_ADDR_HI") << 32
    self.queues[db] = Queue("PM4", ring, 4 << (qs + 1), rptr, db, 4)

  def _w_SDMA0_QUEUE0_RB_CNTL(self, v: int) -> None:
    f = lambda n, r="SDMA0_QUEUE0_RB_CNTL", x=None: self.field("GC", r, n, v if x is None else x)
    if not f("rb_enable"):
      self.queues = {d: q for d, q in self.queues.items() if q.kind != "SDMA"}
      return
    if f("halt", "SDMA0_F32_CNTL", self.get("GC", "SDMA0_F32_CNTL")):
      raise self.fail("SDMA0 queue 0 enabled while the SDMA engine is halted (SDMA0_F32_CNTL.HALT)")
    self.require_vm("enabling an SDMA queue")
    ring = (self.get("GC", "SDMA0_QUEUE0_RB_BASE") | self.get("GC", "SDMA0_QUEUE0_RB_BASE_HI") << 32) << 8
    if not ring: raise self.fail("SDMA0 queue 0 enabled without a ring (SDMA0_QUEUE0_RB_BASE is 0)")
    if not f("enable", "SDMA0_QUEUE0_DOORBELL", self.get("GC", "SDMA0_QUEUE0_DOORBELL")):
      raise self.fail("SDMA0 queue 0 enabled with its doorbell off")
    db = f("offset", "SDMA0_QUEUE0_DOORBELL_OFFSET", self.get("GC", "SDMA0_QUEUE0_DOORBELL_OFFSET"))
    rptr = self.get("GC", "SDMA0_QUEUE0_RB_RPTR_ADDR_LO") | self.get("GC", "SDMA0_QUEUE0_RB_RPTR_ADDR_HI") << 32
    self.queues[db] = Queue("SDMA", ring, 4 << f("rb_size"), rptr, db, 1)

  # ---- doorbells and queues
  def doorbell(self, offset: int, value: int) -> None:
    ctypes.c_uint64.from_address(self.db_addr + offset).value = value
    if not self.field("NBIO", "RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN", "bif_doorbell_aper_en"):
      raise self.fail(f"doorbell write at BAR2 offset {offset:#x} while the doorbell aperture is disabled (RCC_DOORBELL_APER_EN)")
    q = self.queues.get(offset // 4)
    if q is None or offset % 8: raise self.fail(f"doorbell write at BAR2 offset {offset:#x} (dword {offset // 4}): no queue has this doorbell")
    self.check_route(q)
    q.wptr = value * q.unit
    self.run_queues()

  def check_route(self, q: Queue) -> None:
    """The NBIO routes the doorbell to the engine: S2A port 0 (CP) or port 2's range (SDMA)."""
    n = lambda port, f: self.field("NBIO", f"S2A_DOORBELL_ENTRY_{port}_CTRL", f"s2a_doorbell_port{port}_{f}")
    if q.kind == "PM4" and not n(0, "enable"):
      raise self.fail("compute doorbell rung but the NBIO doesn't route doorbells to the CP (S2A_DOORBELL_ENTRY_0_CTRL)")
    if q.kind == "SDMA" and not (n(2, "enable") and n(2, "range_offset") <= q.doorbell < n(2, "range_offset") + n(2, "range_size")):
      raise self.fail(f"SDMA doorbell {q.doorbell} is outside the NBIO's SDMA doorbell range (S2A_DOORBELL_ENTRY_2_CTRL)")

  def run_queues(self) -> None:
    progress = True
    while progress and self.fault is None:
      progress = False
      for q in list(self.queues.values()):
        start = q.consumed
        try: q.consumed = self.engines.run_ring(q.kind, MockVM(self), q.ring, q.size, q.consumed, q.wptr)
        except (RingFault, MockGPUError) as e:
          self.fault = self.fault or f"{q.kind} queue (doorbell {q.doorbell}): {e}"
          return
        if q.consumed != start:
          MockVM(self).write(q.rptr, (q.consumed // q.unit).to_bytes(8, "little"))
          progress = True

  # ---- the GFXHUB's translation
  def require_vm(self, what: str) -> None:
    cntl = self.get("GC", "GCVM_CONTEXT0_CNTL")
    if not self.field("GC", "GCVM_CONTEXT0_CNTL", "enable_context", cntl):
      raise self.fail(f"{what} before GCVM context 0 is enabled (GFXHUB not initialized)")
    if self.field("GC", "GCVM_CONTEXT0_CNTL", "page_table_depth", cntl) != 3 or self.field("GC", "GCVM_CONTEXT0_CNTL", "page_table_block_size", cntl):
      raise self.fail("GCVM context 0: the mock walks 4-level tables of 4 KiB pages (PAGE_TABLE_DEPTH 3, PAGE_TABLE_BLOCK_SIZE 0)")

  def phys_host(self, pa: int, system: bool, size: int = PAGE) -> int:
    if system:
      if (h := self.platform.dma.get(pa & ~(PAGE - 1))) is None: raise self.fail(f"GPU access to bus address {pa:#x}: no DMA memory there")
      return h + pa % PAGE
    if pa + size > self.vram_size: raise self.fail(f"GPU access to VRAM physical {pa:#x} beyond the {self.vram_size}-byte VRAM")
    return self.vram_addr + pa

  def region(self, va: int) -> tuple[np.ndarray, int | None]:
    """Host addresses of the 512 pages of the 2 MiB region holding `va` (-1: unmapped) and, when they are all mapped
    contiguously, the region's host base: the walk the L2 does, cached until the next invalidation."""
    key = va >> 21
    if (r := self.tlb.get(key)) is not None:
      if r[2] and r[3] != self.platform.dma_generation:  # system pages behind cached translations may have been freed
        if (gone := [b for b in r[2] if b not in self.platform.dma]):
          raise self.fail(f"GPU access at {va:#x} through a stale TLB entry: bus page {gone[0]:#x} was freed (the driver unmapped it "
                          "without invalidating the TLB, GCVM_INVALIDATE_ENG17)")
        self.tlb[key] = r = (r[0], r[1], r[2], self.platform.dma_generation)
      return r[0], r[1]
    self.require_vm("a GPU memory access")
    base = self.get("GC", "GCVM_CONTEXT0_PAGE_TABLE_BASE_ADDR_LO32") | self.get("GC", "GCVM_CONTEXT0_PAGE_TABLE_BASE_ADDR_HI32") << 32
    if not base & A.AMDGPU_PTE_VALID: raise self.fail("GCVM context 0's page table base is not valid")
    hosts, system = np.full(ENTRIES, -1, np.int64), []
    table, va0 = base & ADDR_MASK, key << 21
    for lv in range(3):
      e = int(self.table(table)[(va0 >> LEVEL_SHIFTS[lv]) % ENTRIES])
      if not e & A.AMDGPU_PTE_VALID: break
      if e & A.AMDGPU_PDE_PTE:
        if lv != 2: raise self.fail(f"a PDE_PTE page at level {lv} (only 2 MiB PDE0 pages are modelled)")
        if e & A.AMDGPU_PTE_SYSTEM: raise self.fail("a 2 MiB page of system memory (the mock maps system memory in 4 KiB pages)")
        hosts = self.phys_host(e & ADDR_MASK, False, HUGE) + np.arange(ENTRIES, dtype=np.int64) * PAGE
        break
      if e & A.AMDGPU_PTE_SYSTEM: raise self.fail("a page-table level in system memory (the mock walks tables in VRAM)")
      table = e & ADDR_MASK
    else:
      ents = self.table(table)
      for i in np.flatnonzero(ents & np.uint64(A.AMDGPU_PTE_VALID)):
        e = int(ents[i])
        hosts[i] = self.phys_host(e & ADDR_MASK, bool(e & A.AMDGPU_PTE_SYSTEM))
        if e & A.AMDGPU_PTE_SYSTEM: system.append(e & ADDR_MASK)
    contig = int(hosts[0]) if hosts[0] >= 0 and np.all(np.diff(hosts) == PAGE) else None
    self.tlb[key] = (hosts, contig, system, self.platform.dma_generation)
    return hosts, contig

  def table(self, pa: int) -> np.ndarray:
    if pa + PAGE > self.vram_size: raise self.fail(f"page table at {pa:#x} outside VRAM")
    return np.ctypeslib.as_array((ctypes.c_uint64 * ENTRIES).from_address(self.vram_addr + pa))


class MockVM:
  """The GPU's view of memory through the GFXHUB (mock.dispatch's GPUMemory protocol): only mapped pages exist."""
  def __init__(self, gpu: MockGPU) -> None: self.gpu = gpu

  def host(self, addr: int, size: int) -> int:
    """The host address of [addr, addr + size) when it is mapped and contiguous; PageFault otherwise."""
    end, out = addr + max(size, 1), None
    a = addr
    while a < end:
      hosts, contig = self.gpu.region(a)
      stop = min(end, ((a >> 21) + 1) << 21)
      if contig is not None: h = contig + a % HUGE
      else:
        first, last = (a % HUGE) // PAGE, ((stop - 1) % HUGE) // PAGE
        seg = hosts[first:last + 1]
        if np.any(seg < 0) or np.any(np.diff(seg) != PAGE): raise PageFault(addr, size)
        h = int(seg[0]) + a % PAGE
      if out is None: out = h
      elif h != out + (a - addr): raise PageFault(addr, size)
      a = stop
    assert out is not None
    return out

  def chunks(self, addr: int, size: int) -> list[tuple[int, int]]:
    """(host address, bytes) page by page: a read or write may cross non-contiguous pages."""
    out, a, end = [], addr, addr + size
    while a < end:
      n = min(end, (a // PAGE + 1) * PAGE) - a
      hosts, contig = self.gpu.region(a)
      h = int(hosts[(a % HUGE) // PAGE])
      if h < 0: raise PageFault(a, n)
      out.append((h + a % PAGE, n))
      a += n
    return out

  def read(self, addr: int, size: int) -> bytes:
    try: return ctypes.string_at(self.host(addr, size), size)
    except PageFault: return b"".join(ctypes.string_at(h, n) for h, n in self.chunks(addr, size))

  def write(self, addr: int, data: bytes) -> None:
    try:
      ctypes.memmove(self.host(addr, len(data)), data, len(data))
      return
    except PageFault: pass
    pos = 0
    for h, n in self.chunks(addr, len(data)):
      ctypes.memmove(h, data[pos:pos + n], n)
      pos += n

  def view(self, addr: int, size: int) -> memoryview:
    return memoryview((ctypes.c_uint8 * size).from_address(self.host(addr, size))).cast("B")

  def u32(self, addr: int) -> int: return int.from_bytes(self.read(addr, 4), "little")
  def u64(self, addr: int) -> int: return int.from_bytes(self.read(addr, 8), "little")
