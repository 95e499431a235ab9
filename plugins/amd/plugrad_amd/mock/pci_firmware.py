"""The mock PCI GPU's firmware processors: the PSP (MP0 13.0.0) and the SMU (MP1 13.0.0), as the driver sees them.

PSP: the bootloader takes sOS components through C2PMSG_35/36 (ready bit GFX_FLAG_RESPONSE; the image at the MC
address C2PMSG_36 << 20 must be the synthetic component the command names; the sOS needs the key database and the
system driver first); the running sOS creates the KM ring (C2PMSG_64/69/70/71) and runs the `psp_gfx_rb_frame`s the
driver adds up to C2PMSG_67: LOAD_TOC (answers the TMR size), SETUP_TMR (an aligned VRAM region big enough),
LOAD_IP_FW (the image must be the synthetic firmware of that GFX_FW_TYPE and size; all but the SMU's need the TMR),
AUTOLOAD_RLC (every RLC/CP/IMU/SDMA image loaded: the graphics block comes up). A well-formed command the PSP declines
answers a non-zero status (logged in `log`, as a real PSP refuses a bad signature); a protocol violation faults.
SMU: answers C2PMSG_66 messages (C2PMSG_82 argument, C2PMSG_90 response) once the PSP has loaded its firmware;
the debug mailbox takes DEBUGSMC_MSG_Mode1Reset, which puts the whole GPU back to power-on.
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from plugrad_amd.autogen import amdgpu_defs as A
from plugrad_amd.autogen import amdgpu_ucode as U
from plugrad_amd.autogen import psp_gfx_if as P
from plugrad_amd.autogen import smu_v13_0_0_ppsmc as S
from plugrad_amd.mock.firmware import KIND_GFX, KIND_PSP, check_payload

if TYPE_CHECKING: from plugrad_amd.mock.pci import MockGPU

FLAG = P.GFX_FLAG_RESPONSE
TMR_SIZE = 4 << 20
SOS_VERSION, SMU_VERSION = 0x00210E00, 0x004E4B00
BOOTLOADER = {A.PSP_BL__LOAD_KEY_DATABASE: U.PSP_FW_TYPE_PSP_KDB, A.PSP_BL__LOAD_TOS_SPL_TABLE: U.PSP_FW_TYPE_PSP_KDB,
              A.PSP_BL__LOAD_SYSDRV: U.PSP_FW_TYPE_PSP_SYS_DRV, A.PSP_BL__LOAD_SOCDRV: U.PSP_FW_TYPE_PSP_SOC_DRV,
              A.PSP_BL__LOAD_INTFDRV: U.PSP_FW_TYPE_PSP_INTF_DRV, A.PSP_BL__LOAD_DBGDRV: U.PSP_FW_TYPE_PSP_DBG_DRV,
              A.PSP_BL__LOAD_RASDRV: U.PSP_FW_TYPE_PSP_RAS_DRV, A.PSP_BL__LOAD_SOSDRV: U.PSP_FW_TYPE_PSP_SOS}
STACKS = {getattr(P, f"GFX_FW_TYPE_RS64_{e}_P{i}_STACK"): getattr(P, f"GFX_FW_TYPE_RS64_{e}_P0_STACK") for e, n in (("PFP", 2), ("ME", 2), ("MEC", 4))
          for i in range(n)}
AUTOLOAD_NEEDS = {getattr(P, f"GFX_FW_TYPE_{t}") for t in (
  "RLC_G", "RLC_IRAM", "RLC_DRAM_BOOT", "RLC_RESTORE_LIST_GPM_MEM", "RLC_RESTORE_LIST_SRM_MEM", "RLC_P", "RLC_V", "IMU_I", "IMU_D",
  "RS64_PFP", "RS64_ME", "RS64_MEC", "SDMA_UCODE_TH0", "SDMA_UCODE_TH1")} | set(STACKS)
MEC_FW = {P.GFX_FW_TYPE_RS64_MEC} | {t for t in STACKS if STACKS[t] == P.GFX_FW_TYPE_RS64_MEC_P0_STACK}
REFUSED = P.TEE_ERROR_NOT_SUPPORTED


class PSPModel:
  def __init__(self, gpu: MockGPU) -> None:
    self.gpu = gpu
    self.sos: set[int] = set()
    self.ring: tuple[int, int] | None = None  # (VRAM physical, bytes)
    self.rptr = 0
    self.toc = self.tmr = False
    self.log: list[str] = []
    gpu.set("MP0", "MP0_SMN_C2PMSG_33", FLAG)  # the IFWI finished initializing
    gpu.set("MP0", "MP0_SMN_C2PMSG_35", FLAG)  # the bootloader is ready

  def reg(self, n: int) -> int: return self.gpu.get("MP0", f"MP0_SMN_C2PMSG_{n}")
  def setreg(self, n: int, v: int) -> None: self.gpu.set("MP0", f"MP0_SMN_C2PMSG_{n}", v)
  def alive(self) -> bool: return U.PSP_FW_TYPE_PSP_SOS in self.sos
  def has_mec(self) -> bool: return MEC_FW <= self.gpu.loaded

  def vram(self, mc: int, size: int, what: str) -> int:
    """The VRAM physical address of an MC address the driver gave; faults outside the frame buffer."""
    pa = mc - self.gpu.get("MMHUB", "MMMC_VM_FB_LOCATION_BASE") * (1 << 24)
    if pa < 0 or pa + size > self.gpu.vram_size: raise self.gpu.fail(f"PSP {what} at MC address {mc:#x} is outside VRAM")
    return pa

  def image(self, mc: int, size: int | None, what: str) -> tuple[int, int, int] | str:
    """(kind, type, start) of the synthetic image at `mc`, or why it's refused."""
    pa = self.vram(mc, size or 64, what)
    try: c = check_payload(ctypes.string_at(self.gpu.vram_addr + pa, min(self.gpu.vram_size - pa, 1 << 20)), size)
    except ValueError as e: return str(e)
    return c.kind, c.type, c.start

  # ---- bootloader
  def _w_MP0_SMN_C2PMSG_35(self, cmd: int) -> None:
    if self.alive(): raise self.gpu.fail(f"PSP bootloader command {cmd:#x} after the sOS started")
    want = BOOTLOADER.get(cmd)
    img = self.image(self.reg(36) << 20, None, "bootloader image") if want is not None else "unknown bootloader command"
    if isinstance(img, str) or img[0] != KIND_PSP or img[1] != want:
      why = img if isinstance(img, str) else f"image is {'GFX firmware' if img[0] == KIND_GFX else 'PSP component'} type {img[1]}, expected {want}"
      self.log.append(f"bootloader refused command {cmd:#x}: {why}")
      return self.setreg(35, FLAG | 1)
    if want == U.PSP_FW_TYPE_PSP_SOS and not {U.PSP_FW_TYPE_PSP_KDB, U.PSP_FW_TYPE_PSP_SYS_DRV} <= self.sos:
      self.log.append("bootloader refused the sOS: the key database and system driver come first")
      return self.setreg(35, FLAG | 2)
    self.sos.add(want)
    if want == U.PSP_FW_TYPE_PSP_SOS:
      self.setreg(81, SOS_VERSION)
      self.setreg(58, SOS_VERSION)
      self.setreg(64, FLAG)  # the sOS is ready for a ring
    self.setreg(35, FLAG)

  # ---- ring
  def _w_MP0_SMN_C2PMSG_64(self, v: int) -> None:
    if not self.alive(): raise self.gpu.fail(f"PSP ring command {v:#x} before the sOS runs")
    if v == P.GFX_CTRL_CMD_ID_DESTROY_RINGS: self.ring = None
    elif v == A.PSP_RING_TYPE__KM << 16:
      size = self.reg(71)
      if size < 2 * ctypes.sizeof(P.struct_psp_gfx_rb_frame) or size % ctypes.sizeof(P.struct_psp_gfx_rb_frame):
        raise self.gpu.fail(f"PSP ring of {size} bytes (C2PMSG_71) is not a multiple of the 64-byte frame")
      self.ring, self.rptr = (self.vram(self.reg(69) | self.reg(70) << 32, size, "ring"), size), 0
      self.setreg(67, 0)
    else: raise self.gpu.fail(f"PSP ring control {v:#x} is unknown (C2PMSG_64)")
    self.setreg(64, FLAG)

  def _w_MP0_SMN_C2PMSG_67(self, wptr: int) -> None:
    if self.ring is None: raise self.gpu.fail("PSP ring write pointer moved (C2PMSG_67) without a ring")
    pa, size = self.ring
    frame_dw = ctypes.sizeof(P.struct_psp_gfx_rb_frame) // 4
    while self.rptr != wptr % (size // 4):
      f = P.struct_psp_gfx_rb_frame.from_buffer_copy(ctypes.string_at(self.gpu.vram_addr + pa + self.rptr * 4, frame_dw * 4))
      self.command(f)
      self.rptr = (self.rptr + frame_dw) % (size // 4)

  def command(self, f: P.struct_psp_gfx_rb_frame) -> None:
    cmd_pa = self.vram(f.cmd_buf_addr_lo | f.cmd_buf_addr_hi << 32, ctypes.sizeof(P.struct_psp_gfx_cmd_resp), "command buffer")
    fence_pa = self.vram(f.fence_addr_lo | f.fence_addr_hi << 32, 4, "fence")
    cmd = P.struct_psp_gfx_cmd_resp.from_address(self.gpu.vram_addr + cmd_pa)
    name = P.psp_gfx_cmd_id__enumvalues.get(cmd.cmd_id, cmd.cmd_id)
    why = getattr(self, f"_cmd_{name}", self._cmd_unknown)(cmd)
    if why: self.log.append(f"{name}: {why}")
    cmd.resp.status = (P.PSP_ERR_UNKNOWN_COMMAND if why == "unknown" else REFUSED) if why else 0
    ctypes.c_uint32.from_address(self.gpu.vram_addr + fence_pa).value = f.fence_value

  def _cmd_unknown(self, cmd: P.struct_psp_gfx_cmd_resp) -> str: return "unknown"

  def _cmd_GFX_CMD_ID_LOAD_TOC(self, cmd: P.struct_psp_gfx_cmd_resp) -> str | None:
    t = cmd.cmd.cmd_load_toc
    img = self.image(t.toc_phy_addr_lo | t.toc_phy_addr_hi << 32, t.toc_size, "TOC")
    if isinstance(img, str) or img[:2] != (KIND_PSP, U.PSP_FW_TYPE_PSP_TOC): return f"the image is no TOC ({img})"
    self.toc = True
    cmd.resp.tmr_size = TMR_SIZE
    return None

  def _cmd_GFX_CMD_ID_SETUP_TMR(self, cmd: P.struct_psp_gfx_cmd_resp) -> str | None:
    t = cmd.cmd.cmd_setup_tmr
    mc, pa = t.buf_phy_addr_lo | t.buf_phy_addr_hi << 32, t.system_phy_addr_lo | t.system_phy_addr_hi << 32
    if self.toc and t.buf_size < TMR_SIZE: return f"a TMR of {t.buf_size} bytes; the TOC needs {TMR_SIZE}"
    if mc % A.PSP_TMR_ALIGNMENT or self.vram(mc, t.buf_size, "TMR") != pa or not t._0.bitfield.virt_phy_addr:
      return f"TMR at MC {mc:#x} / physical {pa:#x} is misaligned or inconsistent"
    self.tmr = True
    return None

  def _cmd_GFX_CMD_ID_LOAD_IP_FW(self, cmd: P.struct_psp_gfx_cmd_resp) -> str | None:
    c = cmd.cmd.cmd_load_ip_fw
    want = STACKS.get(c.fw_type, c.fw_type)
    img = self.image(c.fw_phy_addr_lo | c.fw_phy_addr_hi << 32, c.fw_size, "firmware image")
    if isinstance(img, str) or img[:2] != (KIND_GFX, want): return f"firmware type {c.fw_type}: the image is not that firmware ({img})"
    if c.fw_type != P.GFX_FW_TYPE_SMU and not self.tmr: return f"firmware type {c.fw_type} before SETUP_TMR"
    self.gpu.loaded.add(c.fw_type)
    if c.fw_type == P.GFX_FW_TYPE_RS64_MEC: self.gpu.mec_start = img[2]
    self.gpu.sdma_fw = {P.GFX_FW_TYPE_SDMA_UCODE_TH0, P.GFX_FW_TYPE_SDMA_UCODE_TH1} <= self.gpu.loaded
    return None

  def _cmd_GFX_CMD_ID_AUTOLOAD_RLC(self, cmd: P.struct_psp_gfx_cmd_resp) -> str | None:
    if (missing := AUTOLOAD_NEEDS - self.gpu.loaded):
      return f"autoload without firmware types {sorted(P.psp_gfx_fw_type__enumvalues.get(m, m) for m in missing)}"
    self.gpu.rlc_up = True
    self.gpu.set("GC", "RLC_RLCS_BOOTLOAD_STATUS", self.gpu.encode("GC", "RLC_RLCS_BOOTLOAD_STATUS", bootload_complete=1))
    return None


class SMUModel:
  def __init__(self, gpu: MockGPU) -> None:
    self.gpu = gpu
    self.dram_hi: int | None = None
    self.features = False

  def running(self) -> bool: return P.GFX_FW_TYPE_SMU in self.gpu.loaded
  def reg(self, n: int) -> int: return self.gpu.get("MP1", f"MP1_SMN_C2PMSG_{n}")
  def setreg(self, n: int, v: int) -> None: self.gpu.set("MP1", f"MP1_SMN_C2PMSG_{n}", v)

  def _w_MP1_SMN_C2PMSG_66(self, msg: int) -> None:
    if not self.running(): return  # no PMFW: nobody answers
    arg, out, res = self.reg(82), self.reg(82), S.PPSMC_Result_OK
    if msg == S.PPSMC_MSG_TestMessage: out = arg + 1
    elif msg == S.PPSMC_MSG_GetSmuVersion: out = SMU_VERSION
    elif msg == S.PPSMC_MSG_SetDriverDramAddrHigh: self.dram_hi = arg
    elif msg == S.PPSMC_MSG_SetDriverDramAddrLow:
      mc = (self.dram_hi or 0) << 32 | arg
      fb = self.gpu.get("MMHUB", "MMMC_VM_FB_LOCATION_BASE") << 24
      if self.dram_hi is None or not fb <= mc < fb + self.gpu.vram_size: res = S.PPSMC_Result_Failed
    elif msg == S.PPSMC_MSG_EnableAllSmuFeatures: self.features = True
    elif msg not in (S.PPSMC_MSG_PrepareMp1ForUnload, S.PPSMC_MSG_GetDriverIfVersion): res = S.PPSMC_Result_UnknownCmd
    self.setreg(82, out % (1 << 32))
    self.setreg(90, res)

  def _w_MP1_SMN_C2PMSG_75(self, msg: int) -> None:
    if not self.running(): return
    if msg != S.DEBUGSMC_MSG_Mode1Reset: return self.setreg(54, S.PPSMC_Result_UnknownCmd)
    self.gpu.power_on()
    self.gpu.set("MP1", "MP1_SMN_C2PMSG_54", S.PPSMC_Result_OK)
