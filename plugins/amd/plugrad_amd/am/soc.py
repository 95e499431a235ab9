"""SOC/NBIO: the PCIe side of the GPU: the doorbell aperture, the HDP flush page and the doorbell routes to the engines.

Follows the kernel's nbio_v4_3 (soc21): the BAR2 doorbell aperture is enabled, the HDP flush registers are remapped
into the MMIO page at MMIO_REG_HOLE_OFFSET (writing 0 there flushes the host data path, so the GPU sees what the CPU
wrote to VRAM through the BAR), and the S2A doorbell ports route doorbell writes to the CP (ports 0 and 3) and to
SDMA0 (port 2, a range of doorbell dwords).
"""
from __future__ import annotations

from typing import Any

from plugrad_amd.autogen import amdgpu_defs as A
from plugrad_amd.autogen import kfd

HDP_MEM_FLUSH = A.MMIO_REG_HOLE_OFFSET + kfd.KFD_MMIO_REMAP_HDP_MEM_FLUSH_CNTL
HDP_REG_FLUSH = A.MMIO_REG_HOLE_OFFSET + kfd.KFD_MMIO_REMAP_HDP_REG_FLUSH_CNTL
SDMA_DOORBELL_AWID, DOORBELL_AWADDR = 14, 3  # nbio_v4_3 sdma_doorbell_range / the AWADDR[31:28] of every port
CP_PORTS = ((0, 3), (3, 6))  # (S2A port, AWID) of the CP's doorbells: nbio_v4_3 gc_doorbell_init


class SOC:
  def __init__(self, adev: Any) -> None:
    self.adev, self.nbio = adev, adev.regs["NBIO"]
    self.remapped = False

  def init_hw(self) -> None:
    self.nbio.RCC_DEV0_EPF2_STRAP2.update(strap_no_soft_reset_dev0_f2=0)
    self.nbio.RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN.write(bif_doorbell_aper_en=1)
    self.nbio.BIF_BX0_REMAP_HDP_MEM_FLUSH_CNTL.write(HDP_MEM_FLUSH)
    self.nbio.BIF_BX0_REMAP_HDP_REG_FLUSH_CNTL.write(HDP_REG_FLUSH)
    self.remapped = True

  def flush_hdp(self) -> None:
    """Flush the host data path: CPU writes through the VRAM BAR reach VRAM before the GPU reads it."""
    if not self.remapped: raise RuntimeError("HDP flush before the NBIO remapped the flush register (SOC.init_hw)")
    self.adev.mmio.write32(HDP_MEM_FLUSH // 4, 0)

  def cp_doorbells(self) -> None:
    """Route doorbell writes to the CP (the kernel's gc_doorbell_init)."""
    for port, awid in CP_PORTS:
      reg = getattr(self.nbio, f"S2A_DOORBELL_ENTRY_{port}_CTRL")
      reg.write(**{f"s2a_doorbell_port{port}_enable": 1, f"s2a_doorbell_port{port}_awid": awid,
                   f"s2a_doorbell_port{port}_awaddr_31_28_value": DOORBELL_AWADDR})

  def sdma_doorbells(self, first: int, count: int) -> None:
    """Route doorbell dwords [first, first + count) to SDMA0 (port 2)."""
    self.nbio.S2A_DOORBELL_ENTRY_2_CTRL.write(s2a_doorbell_port2_enable=1, s2a_doorbell_port2_awid=SDMA_DOORBELL_AWID,
                                              s2a_doorbell_port2_range_offset=first, s2a_doorbell_port2_range_size=count,
                                              s2a_doorbell_port2_awaddr_31_28_value=DOORBELL_AWADDR)
