"""GFX (GC 11): after the RLC autoload, the GFXHUB, the compute micro-engine (MEC) and one compute queue.

No MES and no KIQ: like the kernel's KIQ setup (gfx_v11_0_kiq_init_register), a compute queue is made by filling a
v11 MQD in VRAM (the generated struct_v11_compute_mqd) and writing its fields into the hardware queue descriptor
(HQD) registers of MEC 1 pipe 0 queue 0, selected through GRBM_GFX_CNTL, then setting CP_HQD_ACTIVE. The queue reads
PM4 packets from its ring (a GPU virtual address), reports its read pointer, and is rung through doorbell
AMDGPU_NAVI10_DOORBELL_MEC_RING0 (64-bit doorbells: dword index = 2 * doorbell).
"""
from __future__ import annotations

import ctypes
from typing import Any

from plugrad_amd.autogen import amdgpu_defs as A
from plugrad_amd.autogen import v11_structs as V

MEC_ME = 1             # GRBM_GFX_CNTL.MEID of the first compute micro-engine
MQD_HEADER = 3224438784  # 0xC0310800: the v11 MQD header gfx_v11_0_compute_mqd_init writes
PERSISTENT_PRELOAD_SIZE = 85  # 0x55: the kernel's CP_HQD_PERSISTENT_STATE.PRELOAD_SIZE
RPTR_BLOCK_SIZE = 5
HQD_FIELDS = (  # (MQD field, HQD register), in the kernel's register order
  ("cp_hqd_eop_base_addr_lo", "CP_HQD_EOP_BASE_ADDR"), ("cp_hqd_eop_base_addr_hi", "CP_HQD_EOP_BASE_ADDR_HI"),
  ("cp_hqd_eop_control", "CP_HQD_EOP_CONTROL"), ("cp_hqd_pq_doorbell_control", "CP_HQD_PQ_DOORBELL_CONTROL"),
  ("cp_mqd_base_addr_lo", "CP_MQD_BASE_ADDR"), ("cp_mqd_base_addr_hi", "CP_MQD_BASE_ADDR_HI"), ("cp_mqd_control", "CP_MQD_CONTROL"),
  ("cp_hqd_pq_base_lo", "CP_HQD_PQ_BASE"), ("cp_hqd_pq_base_hi", "CP_HQD_PQ_BASE_HI"), ("cp_hqd_pq_control", "CP_HQD_PQ_CONTROL"),
  ("cp_hqd_pq_rptr_report_addr_lo", "CP_HQD_PQ_RPTR_REPORT_ADDR"), ("cp_hqd_pq_rptr_report_addr_hi", "CP_HQD_PQ_RPTR_REPORT_ADDR_HI"),
  ("cp_hqd_pq_wptr_poll_addr_lo", "CP_HQD_PQ_WPTR_POLL_ADDR"), ("cp_hqd_pq_wptr_poll_addr_hi", "CP_HQD_PQ_WPTR_POLL_ADDR_HI"),
  ("cp_hqd_pq_doorbell_control", "CP_HQD_PQ_DOORBELL_CONTROL"), ("cp_hqd_pq_wptr_lo", "CP_HQD_PQ_WPTR_LO"),
  ("cp_hqd_pq_wptr_hi", "CP_HQD_PQ_WPTR_HI"), ("cp_hqd_vmid", "CP_HQD_VMID"), ("cp_hqd_persistent_state", "CP_HQD_PERSISTENT_STATE"),
  ("cp_hqd_active", "CP_HQD_ACTIVE"))


def log2(n: int, what: str) -> int:
  if n <= 0 or n & (n - 1): raise ValueError(f"{what} {n} is not a power of two")
  return n.bit_length() - 1


class GFX:
  def __init__(self, adev: Any) -> None:
    self.adev, self.gc = adev, adev.regs["GC"]

  def grbm_select(self, me: int = 0, pipe: int = 0, queue: int = 0, vmid: int = 0) -> None:
    self.gc.GRBM_GFX_CNTL.write(meid=me, pipeid=pipe, queueid=queue, vmid=vmid)

  def init_hw(self, root: int, scratch: int, dummy: int) -> None:
    gc = self.gc
    self.adev.wait(lambda: gc.CP_STAT.read() == 0 and gc.RLC_RLCS_BOOTLOAD_STATUS.field("bootload_complete") == 1,
                   "the RLC autoload to finish (RLC_RLCS_BOOTLOAD_STATUS.BOOTLOAD_COMPLETE)")
    self.adev.gmc.init_hub("GC", root, scratch, dummy)
    self.adev.gmc.flush_tlb("GC")
    self.grbm_select(me=MEC_ME)
    gc.pair("CP_MEC_RS64_PRGRM_CNTR_START", "CP_MEC_RS64_PRGRM_CNTR_START_HI", self.adev.fw.mec_start)
    self.grbm_select()
    gc.CP_MEC_RS64_CNTL.update(mec_pipe0_reset=1)
    gc.CP_MEC_RS64_CNTL.update(mec_pipe0_reset=0)
    gc.RLC_CNTL.update(rlc_enable_f32=1)
    self.adev.soc.cp_doorbells()
    gc.GRBM_CNTL.update(read_timeout=(1 << 8) - 1)
    for vmid in range(16):
      self.grbm_select(vmid=vmid)
      gc.SH_MEM_CONFIG.write(address_mode=A.SH_MEM_ADDRESS_MODE_64, alignment_mode=A.SH_MEM_ALIGNMENT_MODE_UNALIGNED, initial_inst_prefetch=3)
      gc.SH_MEM_BASES.write(shared_base=1, private_base=2)  # LDS aperture at 1 << 60, scratch at 2 << 60 (flat addresses)
    self.grbm_select()
    gc.CP_MEC_DOORBELL_RANGE_LOWER.write(A.AMDGPU_NAVI10_DOORBELL_KIQ * 2 * 4)  # byte offsets of 64-bit doorbells
    gc.CP_MEC_DOORBELL_RANGE_UPPER.write(A.AMDGPU_NAVI10_DOORBELL_USERQUEUE_END * 2 * 4)
    gc.CP_MEC_RS64_CNTL.update(mec_pipe0_reset=0, mec_pipe0_active=1, mec_halt=0)

  def compute_queue(self, ring: int, ring_size: int, rptr: int, wptr: int, eop: int, eop_size: int, mqd_paddr: int, mqd: int) -> int:
    """Load a compute queue into MEC 1 pipe 0 queue 0; the addresses are GPU virtual addresses (`mqd_paddr`: where the
    MQD is in VRAM, mapped at `mqd`). Returns the doorbell's dword index."""
    gc, doorbell = self.gc, A.AMDGPU_NAVI10_DOORBELL_MEC_RING0 * 2
    m = V.struct_v11_compute_mqd(header=MQD_HEADER, cp_hqd_vmid=0, cp_hqd_active=1)
    m.cp_mqd_base_addr_lo, m.cp_mqd_base_addr_hi = mqd % (1 << 32), mqd >> 32
    m.cp_hqd_pq_base_lo, m.cp_hqd_pq_base_hi = (ring >> 8) % (1 << 32), ring >> 40
    m.cp_hqd_eop_base_addr_lo, m.cp_hqd_eop_base_addr_hi = (eop >> 8) % (1 << 32), eop >> 40
    m.cp_hqd_pq_rptr_report_addr_lo, m.cp_hqd_pq_rptr_report_addr_hi = rptr % (1 << 32), rptr >> 32
    m.cp_hqd_pq_wptr_poll_addr_lo, m.cp_hqd_pq_wptr_poll_addr_hi = wptr % (1 << 32), wptr >> 32
    m.cp_hqd_eop_control = gc.CP_HQD_EOP_CONTROL.encode(eop_size=log2(eop_size // 4, "EOP buffer dwords") - 1)
    m.cp_hqd_pq_doorbell_control = gc.CP_HQD_PQ_DOORBELL_CONTROL.encode(doorbell_offset=doorbell, doorbell_en=1)
    m.cp_mqd_control = gc.CP_MQD_CONTROL.encode(priv_state=1)
    m.cp_hqd_pq_control = gc.CP_HQD_PQ_CONTROL.encode(queue_size=log2(ring_size // 4, "ring dwords") - 1, rptr_block_size=RPTR_BLOCK_SIZE,
                                                      priv_state=1, kmd_queue=1)
    m.cp_hqd_persistent_state = gc.CP_HQD_PERSISTENT_STATE.encode(preload_size=PERSISTENT_PRELOAD_SIZE, preload_req=1)
    ctypes.memmove(self.adev.vram_cpu(mqd_paddr), ctypes.addressof(m), ctypes.sizeof(m))
    self.adev.gmc.flush_hdp()
    self.grbm_select(me=MEC_ME)
    gc.CP_PQ_WPTR_POLL_CNTL.update(en=0)
    for f, reg in HQD_FIELDS: getattr(gc, reg).write(getattr(m, f))
    gc.CP_PQ_STATUS.update(doorbell_enable=1)
    self.grbm_select()
    return doorbell
