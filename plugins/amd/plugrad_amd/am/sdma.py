"""SDMA (6.0, registers inside GC): the copy engine's first queue, programmed as the kernel's sdma_v6_0_gfx_resume does.

The engine is un-halted once the PSP has loaded its firmware; queue 0 gets its ring (GPU virtual address >> 8), size
(log2 dwords), read-pointer write-back address, write-pointer poll address and doorbell
(AMDGPU_NAVI10_DOORBELL_sDMA_ENGINE0, dword index = 2 * doorbell, routed by the NBIO's S2A port 2). The write pointer the
doorbell carries counts bytes.
"""
from __future__ import annotations

from typing import Any

from plugrad_amd.am.gfx import log2
from plugrad_amd.autogen import amdgpu_defs as A

SDMA_DOORBELL_RANGE = 20  # doorbell dwords per SDMA instance (soc21.c: doorbell_index.sdma_doorbell_range)
HANG_COUNT = 100          # watchdog in 100 ms units
RESP_MODE, REDO_DELAY, RD_L2_POLICY, WR_L2_POLICY = 3, 9, 2, 3  # sdma_v6_0_gfx_resume's UTCL1 settings


class SDMA:
  def __init__(self, adev: Any) -> None:
    self.adev, self.gc = adev, adev.regs["GC"]

  def init_hw(self) -> None:
    gc = self.gc
    gc.SDMA0_WATCHDOG_CNTL.update(queue_hang_count=HANG_COUNT)
    gc.SDMA0_UTCL1_CNTL.update(resp_mode=RESP_MODE, redo_delay=REDO_DELAY)
    gc.SDMA0_UTCL1_PAGE.update(rd_l2_policy=RD_L2_POLICY, wr_l2_policy=WR_L2_POLICY, llc_noalloc=1)
    gc.SDMA0_F32_CNTL.update(halt=0, th1_reset=0)
    gc.SDMA0_CNTL.update(trap_enable=1)

  def queue(self, ring: int, ring_size: int, rptr: int, wptr: int) -> int:
    """Start queue 0 on `ring` (GPU virtual addresses); returns the doorbell's dword index."""
    gc, doorbell = self.gc, A.AMDGPU_NAVI10_DOORBELL_sDMA_ENGINE0 * 2
    gc.SDMA0_QUEUE0_RB_CNTL.write(rb_size=log2(ring_size // 4, "SDMA ring dwords"), rb_priv=1)
    for r in ("RB_RPTR", "RB_RPTR_HI", "RB_WPTR", "RB_WPTR_HI"): getattr(gc, f"SDMA0_QUEUE0_{r}").write(0)
    gc.pair("SDMA0_QUEUE0_RB_WPTR_POLL_ADDR_LO", "SDMA0_QUEUE0_RB_WPTR_POLL_ADDR_HI", wptr)
    gc.pair("SDMA0_QUEUE0_RB_RPTR_ADDR_LO", "SDMA0_QUEUE0_RB_RPTR_ADDR_HI", rptr)
    gc.SDMA0_QUEUE0_RB_BASE.write((ring >> 8) % (1 << 32))
    gc.SDMA0_QUEUE0_RB_BASE_HI.write(ring >> 40)
    gc.SDMA0_QUEUE0_MINOR_PTR_UPDATE.write(1)
    gc.SDMA0_QUEUE0_RB_WPTR.write(0)
    gc.SDMA0_QUEUE0_RB_WPTR_HI.write(0)
    gc.SDMA0_QUEUE0_DOORBELL.update(enable=1)
    gc.SDMA0_QUEUE0_DOORBELL_OFFSET.update(offset=doorbell)
    self.adev.soc.sdma_doorbells(doorbell, SDMA_DOORBELL_RANGE)
    gc.SDMA0_QUEUE0_MINOR_PTR_UPDATE.write(0)
    gc.SDMA0_QUEUE0_RB_CNTL.update(rptr_writeback_enable=1, f32_wptr_poll_enable=1, rb_enable=1)
    gc.SDMA0_QUEUE0_IB_CNTL.update(ib_enable=1)
    return doorbell
