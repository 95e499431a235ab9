"""GMC: VRAM management, the GPU page tables, and the MMHUB/GFXHUB programming that makes them live.

- `VRAMAllocator`: first-fit ranges of VRAM physical addresses (page granular, aligned; freed ranges coalesce).
- `PageTable`: the 4-level page table of VMID 0 (PDB2 -> PDB1 -> PDB0 -> PTB, 512 8-byte entries per table, 4 KiB
  pages), written into VRAM through the CPU's BAR mapping. Leaves are 4 KiB PTEs, or 2 MiB pages (a PDB0 entry with
  AMDGPU_PDE_PTE) where the virtual address, the physical address and the size allow; every PTE carries the fragment
  size of the aligned contiguous block it belongs to (the TLB's reach). Bits from the generated amdgpu_vm.h constants.
- `GMC`: the hubs' system apertures, L1 TLB / L2 cache setup and VM context 0 (the page table above), TLB
  invalidation through invalidation engine 17 and HDP flushes (so the GPU sees what the CPU wrote through the BAR).
The driver's virtual addresses are the CPU's: VRAM at physical `p` is mapped at `BAR0 address + p`, system memory
at its own host address, so a buffer has one address for the CPU and the GPU.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable

import numpy as np

from plugrad_amd.autogen import amdgpu_defs as A

PAGE = 1 << 12
HUGE = 1 << 21
ENTRIES = 1 << 9
LEVEL_SHIFTS = (39, 30, 21, 12)  # the address bits PDB2, PDB1, PDB0 and PTB index (9 each)
VA_BITS = 48
ADDR_MASK = ((1 << VA_BITS) - 1) & ~(PAGE - 1)  # the physical address bits of a PDE/PTE
FB_LOCATION_SHIFT = 24    # MC_VM_FB_LOCATION_BASE/TOP count 16 MiB units (mmhub_v3_0_get_fb_location)
APERTURE_SHIFT = 18       # MC_VM_SYSTEM_APERTURE_LOW/HIGH_ADDR count 256 KiB units
MAX_FRAG = 31             # AMDGPU_PTE_FRAG has 5 bits


class VRAMAllocator:
  """Physical VRAM ranges [start, end): `alloc(size, align)` -> address, `free(address)`."""
  def __init__(self, start: int, end: int) -> None:
    self.start, self.end = start, end
    self.free_ranges: list[tuple[int, int]] = [(start, end)]
    self.used: dict[int, int] = {}

  def alloc(self, size: int, align: int = PAGE) -> int:
    size = -(-max(size, 1) // PAGE) * PAGE
    for i, (lo, hi) in enumerate(self.free_ranges):
      a = -(-lo // align) * align
      if a + size > hi: continue
      self.free_ranges[i:i + 1] = [r for r in ((lo, a), (a + size, hi)) if r[0] < r[1]]
      self.used[a] = size
      return a
    raise MemoryError(f"out of VRAM: no free {size}-byte range aligned to {align} ({self.available()} bytes free in {len(self.free_ranges)} ranges)")

  def free(self, addr: int) -> None:
    size = self.used.pop(addr)
    rs = sorted(self.free_ranges + [(addr, addr + size)])
    merged = [rs[0]]
    for lo, hi in rs[1:]:
      if lo == merged[-1][1]: merged[-1] = (merged[-1][0], hi)
      else: merged.append((lo, hi))
    self.free_ranges = merged

  def available(self) -> int: return sum(hi - lo for lo, hi in self.free_ranges)


def fragments(va: int, pa: int, size: int) -> list[tuple[int, int, int]]:
  """Split a contiguous mapping into maximal blocks aligned to their power-of-two size in both address spaces:
  (va, pa, size) each; a block's PTEs carry its size as the fragment (log2(size) - 12)."""
  out = []
  while size:
    n = min(va & -va if va else 1 << 62, pa & -pa if pa else 1 << 62, 1 << (size.bit_length() - 1))
    out.append((va, pa, n))
    va, pa, size = va + n, pa + n, size - n
  return out


def pte_flags(system: bool, snooped: bool, uncached: bool, frag: int, huge: bool) -> int:
  f = A.AMDGPU_PTE_VALID | A.AMDGPU_PTE_READABLE | A.AMDGPU_PTE_WRITEABLE | A.AMDGPU_PTE_EXECUTABLE | A.AMDGPU_PTE_FRAG(min(frag, MAX_FRAG))
  if system: f |= A.AMDGPU_PTE_SYSTEM
  if snooped: f |= A.AMDGPU_PTE_SNOOPED
  if uncached: f = A.AMDGPU_PTE_MTYPE_NV10(f, A.MTYPE_UC)
  return f | (A.AMDGPU_PDE_PTE if huge else 0)


class PageTable:
  """VMID 0's page table in VRAM. `vram_cpu` is the CPU address of VRAM physical 0 (the BAR mapping); `alloc_table`
  returns the physical address of a fresh zeroed 4 KiB page for a table."""
  def __init__(self, vram_cpu: int, alloc_table: Callable[[], int]) -> None:
    self.vram_cpu, self.alloc_table = vram_cpu, alloc_table
    self.root = alloc_table()
    self.tables = 1

  def entries(self, table: int) -> np.ndarray:
    """The 512 entries of the table at physical `table` (a view of VRAM)."""
    return np.ctypeslib.as_array((ctypes.c_uint64 * ENTRIES).from_address(self.vram_cpu + table))

  def _next(self, table: int, idx: int, va: int, create: bool) -> int | None:
    e = int(self.entries(table)[idx])
    if e & A.AMDGPU_PTE_VALID:
      if e & A.AMDGPU_PDE_PTE: raise ValueError(f"virtual address {va:#x} is inside a 2 MiB page; it can't also get a page table")
      return e & ADDR_MASK
    if not create: return None
    child = self.alloc_table()
    self.tables += 1
    self.entries(table)[idx] = child | A.AMDGPU_PTE_VALID
    return child

  def _leaf_table(self, va: int, level: int, create: bool) -> int | None:
    """The table of `level` (2: PDB0, 3: PTB) covering `va`."""
    t: int | None = self.root
    for lv in range(level):
      t = self._next(t, (va >> LEVEL_SHIFTS[lv]) % ENTRIES, va, create)
      if t is None: return None
    return t

  def map(self, va: int, runs: list[tuple[int, int]], system: bool = False, snooped: bool = False, uncached: bool = False) -> None:
    """Map `va` onward to the physical runs [(address, bytes)], each a multiple of 4 KiB."""
    for pa, n in runs:
      if va % PAGE or pa % PAGE or n % PAGE: raise ValueError(f"mapping {va:#x} -> {pa:#x} ({n} bytes) is not page aligned")
      for bva, bpa, bn in fragments(va, pa, n):
        self._map_block(bva, bpa, bn, system, snooped, uncached, (bn.bit_length() - 1) - 12)
      va += n

  def _map_block(self, va: int, pa: int, n: int, system: bool, snooped: bool, uncached: bool, frag: int) -> None:
    huge = n >= HUGE
    step, level = (HUGE, 2) if huge else (PAGE, 3)
    flags = pte_flags(system, snooped, uncached, frag, huge)
    shift = LEVEL_SHIFTS[level]
    while n:
      table = self._leaf_table(va, level, create=True)
      assert table is not None
      idx = (va >> shift) % ENTRIES
      cnt = min(n // step, ENTRIES - idx)
      ents = self.entries(table)
      if np.any(ents[idx:idx + cnt] & A.AMDGPU_PTE_VALID): raise ValueError(f"virtual address range at {va:#x} is already mapped")
      ents[idx:idx + cnt] = (np.arange(cnt, dtype=np.uint64) * np.uint64(step) + np.uint64(pa)) | np.uint64(flags)
      va, pa, n = va + cnt * step, pa + cnt * step, n - cnt * step

  def unmap(self, va: int, size: int) -> None:
    """Invalidate the entries of [va, va + size) (2 MiB entries only whole)."""
    end = va + size
    while va < end:
      pdb0 = self._leaf_table(va, 2, create=False)
      if pdb0 is None: raise ValueError(f"virtual address {va:#x} is not mapped")
      e = int(self.entries(pdb0)[(va >> LEVEL_SHIFTS[2]) % ENTRIES])
      if e & A.AMDGPU_PTE_VALID and e & A.AMDGPU_PDE_PTE:
        if va % HUGE or end - va < HUGE: raise ValueError(f"unmapping part of the 2 MiB page at {va & ~(HUGE - 1):#x}")
        self.entries(pdb0)[(va >> LEVEL_SHIFTS[2]) % ENTRIES] = 0
        va += HUGE
        continue
      ptb = self._leaf_table(va, 3, create=False)
      if ptb is None: raise ValueError(f"virtual address {va:#x} is not mapped")
      idx = (va >> LEVEL_SHIFTS[3]) % ENTRIES
      cnt = min((end - va) // PAGE, ENTRIES - idx)
      self.entries(ptb)[idx:idx + cnt] = 0
      va += cnt * PAGE

  def lookup(self, va: int) -> tuple[int, int] | None:
    """(entry, page size) translating `va`, or None: the walk the GPU's L2 does."""
    t = self.root
    for lv in range(4):
      e = int(self.entries(t)[(va >> LEVEL_SHIFTS[lv]) % ENTRIES])
      if not e & A.AMDGPU_PTE_VALID: return None
      if lv == 3 or (lv == 2 and e & A.AMDGPU_PDE_PTE): return e, 1 << LEVEL_SHIFTS[lv]
      t = e & ADDR_MASK
    return None


class GMC:
  """The two VM hubs (MM: MMHUB, GC: the GFXHUB inside GC) for VMID 0, and TLB/HDP flushes."""
  HUBS = ("MM", "GC")

  def __init__(self, adev: Any) -> None:
    self.adev = adev
    mm = adev.regs["MMHUB"]
    self.fb_base = mm.MMMC_VM_FB_LOCATION_BASE.field("fb_base") << FB_LOCATION_SHIFT
    self.fb_top = mm.MMMC_VM_FB_LOCATION_TOP.field("fb_top") << FB_LOCATION_SHIFT
    self.hub_up = {"MM": False, "GC": False}

  def mc(self, paddr: int) -> int:
    """The memory-controller address of VRAM physical `paddr` (what the PSP and the hubs' apertures take)."""
    return self.fb_base + paddr

  def hub(self, hub: str) -> Any: return self.adev.regs["MMHUB" if hub == "MM" else "GC"]

  def init_hub(self, hub: str, root: int, scratch: int, dummy: int) -> None:
    """Apertures, TLB and L2 setup, VM context 0 on `root` (the kernel's gfxhub/mmhub_v3_0_gart_enable)."""
    r, p = self.hub(hub), hub
    getattr(r, f"{p}MC_VM_AGP_BASE").write(0)
    getattr(r, f"{p}MC_VM_AGP_BOT").write(getattr(r, f"{p}MC_VM_AGP_BOT").encode(agp_bot=(1 << 24) - 1))  # AGP off: bottom above top
    getattr(r, f"{p}MC_VM_AGP_TOP").write(0)
    getattr(r, f"{p}MC_VM_SYSTEM_APERTURE_LOW_ADDR").write(self.fb_base >> APERTURE_SHIFT)
    getattr(r, f"{p}MC_VM_SYSTEM_APERTURE_HIGH_ADDR").write(self.fb_top >> APERTURE_SHIFT)
    r.pair(f"{p}MC_VM_SYSTEM_APERTURE_DEFAULT_ADDR_LSB", f"{p}MC_VM_SYSTEM_APERTURE_DEFAULT_ADDR_MSB", self.mc(scratch) >> 12)
    r.pair(f"{p}VM_L2_PROTECTION_FAULT_DEFAULT_ADDR_LO32", f"{p}VM_L2_PROTECTION_FAULT_DEFAULT_ADDR_HI32", dummy >> 12)
    getattr(r, f"{p}MC_VM_MX_L1_TLB_CNTL").update(enable_l1_tlb=1, system_access_mode=3, enable_advanced_driver_model=1,
                                                  system_aperture_unmapped_access=0, mtype=A.MTYPE_UC)
    getattr(r, f"{p}VM_L2_CNTL").update(enable_l2_cache=1, enable_default_page_out_to_system_memory=1, l2_pde0_cache_tag_generation_mode=0,
                                        pde_fault_classification=0, context1_identity_access_mode=1, identity_mode_fragment_size=0)
    getattr(r, f"{p}VM_L2_CNTL2").update(invalidate_all_l1_tlbs=1, invalidate_l2_cache=1)
    getattr(r, f"{p}VM_L2_CNTL3").write(l2_cache_4k_associativity=1, l2_cache_bigk_associativity=1, bank_select=9, l2_cache_bigk_fragment_size=6)
    getattr(r, f"{p}VM_L2_CNTL4").write(l2_cache_4k_partition_count=1)
    r.pair(f"{p}VM_CONTEXT0_PAGE_TABLE_START_ADDR_LO32", f"{p}VM_CONTEXT0_PAGE_TABLE_START_ADDR_HI32", 0)
    r.pair(f"{p}VM_CONTEXT0_PAGE_TABLE_END_ADDR_LO32", f"{p}VM_CONTEXT0_PAGE_TABLE_END_ADDR_HI32", ((1 << VA_BITS) - 1) >> 12)
    r.pair(f"{p}VM_CONTEXT0_PAGE_TABLE_BASE_ADDR_LO32", f"{p}VM_CONTEXT0_PAGE_TABLE_BASE_ADDR_HI32", root | A.AMDGPU_PTE_VALID)
    faults = {f"{x}_protection_fault_enable_default": 1 for x in ("range", "dummy_page", "pde0", "valid", "read", "write", "execute")}
    getattr(r, f"{p}VM_CONTEXT0_CNTL").write(enable_context=1, page_table_depth=A.AMDGPU_VM_PTB - A.AMDGPU_VM_PDB2, page_table_block_size=0, **faults)
    r.pair(f"{p}VM_L2_CONTEXT1_IDENTITY_APERTURE_LOW_ADDR_LO32", f"{p}VM_L2_CONTEXT1_IDENTITY_APERTURE_LOW_ADDR_HI32", (1 << 36) - 1)
    r.pair(f"{p}VM_L2_CONTEXT1_IDENTITY_APERTURE_HIGH_ADDR_LO32", f"{p}VM_L2_CONTEXT1_IDENTITY_APERTURE_HIGH_ADDR_HI32", 0)
    r.pair(f"{p}VM_L2_CONTEXT_IDENTITY_PHYSICAL_OFFSET_LO32", f"{p}VM_L2_CONTEXT_IDENTITY_PHYSICAL_OFFSET_HI32", 0)
    for eng in range(18):
      r.pair(f"{p}VM_INVALIDATE_ENG{eng}_ADDR_RANGE_LO32", f"{p}VM_INVALIDATE_ENG{eng}_ADDR_RANGE_HI32", (1 << 37) - 1)
    self.hub_up[hub] = True

  def flush_hdp(self) -> None: self.adev.soc.flush_hdp()

  def flush_tlb(self, hub: str) -> None:
    """Invalidate VMID 0's translations on `hub` (engine 17; the MMHUB's engine is taken with its semaphore first)."""
    self.flush_hdp()
    if not self.hub_up[hub]: return
    r, p = self.hub(hub), hub
    if hub == "MM": self.adev.wait(lambda: r.MMVM_INVALIDATE_ENG17_SEM.read() & 1, "MMHUB invalidation semaphore")
    getattr(r, f"{p}VM_INVALIDATE_ENG17_REQ").write(per_vmid_invalidate_req=1, flush_type=0, invalidate_l2_ptes=1, invalidate_l2_pde0=1,
                                                    invalidate_l2_pde1=1, invalidate_l2_pde2=1, invalidate_l1_ptes=1)
    ack = getattr(r, f"{p}VM_INVALIDATE_ENG17_ACK")
    self.adev.wait(lambda: ack.field("per_vmid_invalidate_ack") & 1, f"{hub}VM TLB invalidation")
    if hub == "MM": r.MMVM_INVALIDATE_ENG17_SEM.write(0)

  def fault_status(self) -> str | None:
    """The GFXHUB's protection-fault status and address, when a fault is latched."""
    r = self.hub("GC")
    if not (st := r.GCVM_L2_PROTECTION_FAULT_STATUS.read()): return None
    addr = (r.GCVM_L2_PROTECTION_FAULT_ADDR_HI32.read() << 32 | r.GCVM_L2_PROTECTION_FAULT_ADDR_LO32.read()) << 12
    bits = {k: v for k, v in r.GCVM_L2_PROTECTION_FAULT_STATUS.decode(st).items() if v}
    return f"GPU page fault at {addr:#x} ({', '.join(f'{k}={v}' for k, v in bits.items())})"
