"""PSP (MP0 13.0.x): boots the secure OS and loads every other block's firmware (the kernel's psp_v13_0 + amdgpu_psp).

1. Bootloader: unless the sOS is already running (C2PMSG_81 != 0), each sOS component (key database, SPL table,
   system/SoC/interface/debug/RAS drivers, then the sOS itself) is copied into a 1 MiB-aligned VRAM buffer, its MC
   address >> 20 written to C2PMSG_36 and the load command to C2PMSG_35; the bootloader answers with bit 31
   (GFX_FLAG_RESPONSE) of C2PMSG_35.
2. Ring: the KM ring's MC address and size go to C2PMSG_69/70/71 and `PSP_RING_TYPE__KM << 16` to C2PMSG_64; the
   sOS acknowledges with GFX_FLAG_RESPONSE and status 0 in the low 16 bits.
3. Commands: a `psp_gfx_cmd_resp` in the command buffer, a `psp_gfx_rb_frame` (command and fence MC addresses, fence
   value) at the ring's write pointer, the new write pointer (dwords) to C2PMSG_67; the PSP writes the fence value
   when done and the response status into the command buffer.
4. LOAD_TOC (the RLC autoload table: its answer sizes the TMR), SMU firmware, SETUP_TMR, LOAD_IP_FW for every IP
   firmware, then AUTOLOAD_RLC: the RLC boots the graphics engines from the TMR.
"""
from __future__ import annotations

import ctypes
from typing import Any

from plugrad_amd.am.firmware import Firmware
from plugrad_amd.autogen import amdgpu_defs as A
from plugrad_amd.autogen import amdgpu_ucode as U
from plugrad_amd.autogen import psp_gfx_if as P

RING_SIZE = 1 << 16
STATUS_MASK = (1 << 16) - 1
# (sOS component, bootloader command) in the order psp_hw_start loads them; MP0 13.x takes its SPL table from the KDB
SOS_ORDER = ((U.PSP_FW_TYPE_PSP_KDB, A.PSP_BL__LOAD_KEY_DATABASE), (U.PSP_FW_TYPE_PSP_KDB, A.PSP_BL__LOAD_TOS_SPL_TABLE),
             (U.PSP_FW_TYPE_PSP_SYS_DRV, A.PSP_BL__LOAD_SYSDRV), (U.PSP_FW_TYPE_PSP_SOC_DRV, A.PSP_BL__LOAD_SOCDRV),
             (U.PSP_FW_TYPE_PSP_INTF_DRV, A.PSP_BL__LOAD_INTFDRV), (U.PSP_FW_TYPE_PSP_DBG_DRV, A.PSP_BL__LOAD_DBGDRV),
             (U.PSP_FW_TYPE_PSP_RAS_DRV, A.PSP_BL__LOAD_RASDRV), (U.PSP_FW_TYPE_PSP_SOS, A.PSP_BL__LOAD_SOSDRV))


class PSPError(RuntimeError):
  """The PSP refused a command or didn't answer."""


class PSP:
  def __init__(self, adev: Any, fw: Firmware) -> None:
    self.adev, self.fw, self.mp0 = adev, fw, adev.regs["MP0"]
    boot = adev.boot_alloc
    self.msg1 = boot(A.PSP_1_MEG, A.PSP_1_MEG)
    self.cmd, self.fence, self.ring = boot(A.PSP_CMD_BUFFER_SIZE), boot(A.PSP_FENCE_BUFFER_SIZE), boot(RING_SIZE)
    self.fence_value, self.tmr, self.tmr_size = 0, 0, 0

  def reg(self, n: int) -> Any: return getattr(self.mp0, f"MP0_SMN_C2PMSG_{n}")
  def sos_alive(self) -> bool: return self.reg(81).read() != 0

  def init_hw(self) -> None:
    if not self.sos_alive():
      for fw_type, cmd in SOS_ORDER:
        if fw_type in self.fw.sos: self._bootloader_load(fw_type, cmd)
      self.adev.wait(self.sos_alive, "the PSP secure OS to start (C2PMSG_81)")
    self._ring_create()
    if U.PSP_FW_TYPE_PSP_TOC in self.fw.sos: self._load_toc()
    self.load_ip_fw(*self.fw.smu)
    self._setup_tmr()
    for types, data in self.fw.ips: self.load_ip_fw(types, data)
    self.submit(P.GFX_CMD_ID_AUTOLOAD_RLC)

  def _wait_bootloader(self, what: str) -> None:
    self.adev.wait(lambda: self.reg(35).read() & P.GFX_FLAG_RESPONSE, f"the PSP bootloader ({what})")
    if (err := self.reg(35).read() & STATUS_MASK): raise PSPError(f"the PSP bootloader reports error {err} ({what})")

  def _stage(self, data: bytes) -> None:
    """Copy `data` into the 1 MiB message buffer and make it visible to the PSP."""
    if len(data) > A.PSP_1_MEG: raise PSPError(f"a {len(data)}-byte firmware image exceeds the PSP's {A.PSP_1_MEG}-byte buffer")
    ctypes.memmove(self.adev.vram_cpu(self.msg1), data, len(data))
    self.adev.gmc.flush_hdp()

  def _bootloader_load(self, fw_type: int, cmd: int) -> None:
    what = f"{U.psp_fw_type__enumvalues.get(fw_type, fw_type)} (bootloader command {cmd})"
    self._wait_bootloader(f"ready before {what}")
    self._stage(self.fw.sos[fw_type])
    self.reg(36).write(self.adev.gmc.mc(self.msg1) >> 20)
    self.reg(35).write(cmd)
    if cmd != A.PSP_BL__LOAD_SOSDRV: self._wait_bootloader(what)

  def _ring_create(self) -> None:
    if self.reg(71).read():  # a ring left by an earlier driver: destroy it first
      self.reg(64).write(P.GFX_CTRL_CMD_ID_DESTROY_RINGS)
      self.adev.wait(lambda: self.reg(64).read() & P.GFX_FLAG_RESPONSE, "the PSP to destroy the old ring")
    self.adev.wait(lambda: self.reg(64).read() & P.GFX_FLAG_RESPONSE, "the PSP secure OS to accept a ring")
    ring_mc = self.adev.gmc.mc(self.ring)
    self.reg(69).write(ring_mc % (1 << 32))
    self.reg(70).write(ring_mc >> 32)
    self.reg(71).write(RING_SIZE)
    self.reg(64).write(A.PSP_RING_TYPE__KM << 16)
    self.adev.wait(lambda: self.reg(64).read() & P.GFX_FLAG_RESPONSE, "the PSP ring creation")
    if (st := self.reg(64).read() & STATUS_MASK): raise PSPError(f"the PSP refused the ring (status {st})")

  def submit(self, cmd_id: int, **fields: Any) -> Any:
    """Run one PSP command; `fields` fill the command's union member (e.g. cmd_load_ip_fw=...). The response."""
    cmd = P.struct_psp_gfx_cmd_resp(cmd_id=cmd_id)
    for k, v in fields.items(): setattr(cmd.cmd, k, v)
    ctypes.memset(self.adev.vram_cpu(self.cmd), 0, A.PSP_CMD_BUFFER_SIZE)
    ctypes.memmove(self.adev.vram_cpu(self.cmd), ctypes.addressof(cmd), ctypes.sizeof(cmd))
    self.fence_value += 1
    frame_dw, ring_dw = ctypes.sizeof(P.struct_psp_gfx_rb_frame) // 4, RING_SIZE // 4
    wptr = self.reg(67).read()
    cmd_mc, fence_mc = self.adev.gmc.mc(self.cmd), self.adev.gmc.mc(self.fence)
    frame = P.struct_psp_gfx_rb_frame(cmd_buf_addr_lo=cmd_mc % (1 << 32), cmd_buf_addr_hi=cmd_mc >> 32, fence_addr_lo=fence_mc % (1 << 32),
                                      fence_addr_hi=fence_mc >> 32, fence_value=self.fence_value)
    ctypes.memmove(self.adev.vram_cpu(self.ring) + (wptr % ring_dw) * 4, ctypes.addressof(frame), ctypes.sizeof(frame))
    self.adev.gmc.flush_hdp()
    self.reg(67).write((wptr + frame_dw) % ring_dw)
    fence = ctypes.c_uint32.from_address(self.adev.vram_cpu(self.fence))
    name = P.psp_gfx_cmd_id__enumvalues.get(cmd_id, cmd_id)
    self.adev.wait(lambda: fence.value == self.fence_value, f"the PSP to finish command {name}")
    resp = P.struct_psp_gfx_cmd_resp.from_buffer_copy(ctypes.string_at(self.adev.vram_cpu(self.cmd), ctypes.sizeof(P.struct_psp_gfx_cmd_resp)))
    if resp.resp.status: raise PSPError(f"the PSP failed command {name} with status {resp.resp.status:#x}")
    return resp

  def load_ip_fw(self, types: list[int], data: bytes) -> None:
    self._stage(data)
    mc = self.adev.gmc.mc(self.msg1)
    for t in types:
      self.submit(P.GFX_CMD_ID_LOAD_IP_FW, cmd_load_ip_fw=P.struct_psp_gfx_cmd_load_ip_fw(fw_phy_addr_lo=mc % (1 << 32), fw_phy_addr_hi=mc >> 32,
                                                                                           fw_size=len(data), fw_type=t))

  def _load_toc(self) -> None:
    toc = self.fw.sos[U.PSP_FW_TYPE_PSP_TOC]
    self._stage(toc)
    mc = self.adev.gmc.mc(self.msg1)
    resp = self.submit(P.GFX_CMD_ID_LOAD_TOC, cmd_load_toc=P.struct_psp_gfx_cmd_load_toc(toc_phy_addr_lo=mc % (1 << 32), toc_phy_addr_hi=mc >> 32,
                                                                                          toc_size=len(toc)))
    self.tmr_size = resp.resp.tmr_size

  def _setup_tmr(self) -> None:
    """Reserve the trusted memory region the PSP keeps firmware in (sized by the TOC) and hand it over."""
    if self.tmr_size:
      self.tmr = self.adev.boot_alloc(self.tmr_size, A.PSP_TMR_ALIGNMENT)
      mc = self.adev.gmc.mc(self.tmr)
    else: mc = 0
    tmr = P.struct_psp_gfx_cmd_setup_tmr(buf_phy_addr_lo=mc % (1 << 32), buf_phy_addr_hi=mc >> 32, buf_size=self.tmr_size,
                                         system_phy_addr_lo=self.tmr % (1 << 32), system_phy_addr_hi=self.tmr >> 32)
    tmr._0.bitfield.virt_phy_addr = 1
    self.submit(P.GFX_CMD_ID_SETUP_TMR, cmd_setup_tmr=tmr)
