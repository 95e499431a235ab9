"""The firmware the PSP loads into the GPU's microcontrollers, read from /lib/firmware/amdgpu (AMD_FIRMWARE_DIR).

Files are named by IP version (`psp_13_0_0_sos.bin`, `gc_11_0_0_mec.bin`, ...) and are containers with the headers of
amdgpu_ucode.h (generated plugrad_amd.autogen.amdgpu_ucode): a common header (total size, header size, payload offset)
and per kind the offsets and sizes of the payloads. `Firmware.load` cuts them into what the PSP is given, in the order
the kernel gives it: the sOS components for the PSP bootloader (by PSP_FW_TYPE), the SMU firmware, then one
`(GFX_FW_TYPE_*s, bytes)` per LOAD_IP_FW command (SDMA, the RS64 PFP/ME/MEC code and stacks, IMU, the RLC parts, RLC_G
last, after which the RLC autoload starts). A missing file or a malformed container is a `FirmwareError` naming the
file and what to do.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Any

from plugrad_amd.autogen import amdgpu_ucode as U
from plugrad_amd.autogen import psp_gfx_if as P

DEFAULT_DIR = "/lib/firmware/amdgpu"
INSTALL_HINT = "install the GPU firmware (Debian: apt-get install firmware-amd-graphics; elsewhere linux-firmware) or point AMD_FIRMWARE_DIR at it"


class FirmwareError(RuntimeError):
  """A firmware file is missing or malformed."""


def firmware_dir() -> str: return os.environ.get("AMD_FIRMWARE_DIR", DEFAULT_DIR)
def ver(v: tuple[int, int, int]) -> str: return "_".join(map(str, v))


@dataclass
class Container:
  """One firmware file: its bytes and its headers as the generated structs."""
  name: str
  blob: bytes
  header: Any

  def cut(self, offset: int, size: int, what: str) -> bytes:
    if size <= 0 or offset < 0 or offset + size > len(self.blob):
      raise FirmwareError(f"{self.name}: {what} at byte {offset} of {size} bytes lies outside the {len(self.blob)}-byte file")
    return self.blob[offset:offset + size]


def read_container(path: str, header_t: type, major: int | None = None) -> Container:
  """A firmware file parsed with `header_t`, its common header checked (sizes within the file, header version)."""
  name = os.path.basename(path)
  try:
    with open(path, "rb") as f: blob = f.read()
  except FileNotFoundError: raise FirmwareError(f"firmware {path} not found: {INSTALL_HINT}") from None
  except PermissionError: raise FirmwareError(f"firmware {path} is not readable (permission denied)") from None
  if len(blob) < ctypes.sizeof(header_t): raise FirmwareError(f"{name}: {len(blob)} bytes, shorter than its {header_t.__name__[7:]} header")
  hdr = header_t.from_buffer_copy(blob)
  common = hdr if isinstance(hdr, U.struct_common_firmware_header) else _common(hdr)
  if common.size_bytes != len(blob): raise FirmwareError(f"{name}: header says {common.size_bytes} bytes, the file has {len(blob)}")
  if common.header_size_bytes > len(blob) or common.ucode_array_offset_bytes > len(blob):
    raise FirmwareError(f"{name}: header size {common.header_size_bytes} / payload offset {common.ucode_array_offset_bytes} past the end")
  if major is not None and common.header_version_major != major:
    raise FirmwareError(f"{name}: header version {common.header_version_major}.{common.header_version_minor}, expected {major}.x")
  return Container(name, blob, hdr)


def _common(hdr: Any) -> Any:
  """The common_firmware_header nested first in every versioned header."""
  while not isinstance(hdr, U.struct_common_firmware_header): hdr = getattr(hdr, hdr._fields_[0][0])
  return hdr


@dataclass
class Firmware:
  sos: dict[int, bytes]                     # PSP_FW_TYPE_* -> sOS component for the bootloader
  smu: tuple[list[int], bytes]
  ips: list[tuple[list[int], bytes]] = field(default_factory=list)  # LOAD_IP_FW commands in order
  mec_start: int = 0                        # RS64 MEC program start (CP_MEC_RS64_PRGRM_CNTR_START, in dwords)

  @classmethod
  def load(cls, versions: dict[str, tuple[int, int, int]], directory: str | None = None) -> Firmware:
    """`versions`: the IP versions of MP0, MP1, GC and SDMA0 from the discovery table."""
    d = directory or firmware_dir()
    if not os.path.isdir(d): raise FirmwareError(f"firmware folder {d} not found: {INSTALL_HINT}")
    path = lambda n: os.path.join(d, n)
    fw = cls(sos_components(read_container(path(f"psp_{ver(versions['MP0'])}_sos.bin"), U.struct_psp_firmware_header_v2_0, 2)),
             smu_payload(read_container(path(f"smu_{ver(versions['MP1'])}.bin"), U.struct_smc_firmware_header_v1_0)))
    fw.ips += sdma_payloads(path(f"sdma_{ver(versions['SDMA0'])}.bin"))
    gc = ver(versions["GC"])
    for eng, stacks in (("PFP", 2), ("ME", 2), ("MEC", 4)):
      c = read_container(path(f"gc_{gc}_{eng.lower()}.bin"), U.struct_gfx_firmware_header_v2_0, 2)
      fw.ips.append(([getattr(P, f"GFX_FW_TYPE_RS64_{eng}")], c.cut(c.header.header.ucode_array_offset_bytes, c.header.ucode_size_bytes, "code")))
      fw.ips.append(([getattr(P, f"GFX_FW_TYPE_RS64_{eng}_P{i}_STACK") for i in range(stacks)],
                     c.cut(c.header.data_offset_bytes, c.header.data_size_bytes, "stack")))
      if eng == "MEC": fw.mec_start = (c.header.ucode_start_addr_lo | (c.header.ucode_start_addr_hi << 32)) >> 2
    fw.ips += imu_payloads(read_container(path(f"gc_{gc}_imu.bin"), U.struct_imu_firmware_header_v1_0, 1))
    fw.ips += rlc_payloads(read_container(path(f"gc_{gc}_rlc.bin"), U.struct_rlc_firmware_header_v2_3, 2))
    return fw


def sos_components(c: Container) -> dict[int, bytes]:
  """The psp_fw_bin descriptors of a v2 sOS container: {PSP_FW_TYPE: bytes}."""
  n, desc_t = c.header.psp_fw_bin_count, U.struct_psp_fw_bin_desc
  first = U.struct_psp_firmware_header_v2_0.psp_fw_bin.offset
  if first + n * ctypes.sizeof(desc_t) > len(c.blob): raise FirmwareError(f"{c.name}: {n} binary descriptors run past the file")
  out = {}
  for i in range(n):
    d = desc_t.from_buffer_copy(c.blob, first + i * ctypes.sizeof(desc_t))
    out[d.fw_type] = c.cut(c.header.header.ucode_array_offset_bytes + d.offset_bytes, d.size_bytes, f"component type {d.fw_type}")
  if U.PSP_FW_TYPE_PSP_SOS not in out: raise FirmwareError(f"{c.name} has no sOS component (types {sorted(out)})")
  return out


def smu_payload(c: Container) -> tuple[list[int], bytes]:
  h = c.header.header
  return [P.GFX_FW_TYPE_SMU], c.cut(h.ucode_array_offset_bytes, h.ucode_size_bytes, "SMU firmware")


def sdma_payloads(path: str) -> list[tuple[list[int], bytes]]:
  """SDMA 6 containers (v2 header) have a context thread (TH0) and a control thread (TH1); v3 one image."""
  c = read_container(path, U.struct_common_firmware_header)
  if c.header.header_version_major == 3:
    c = read_container(path, U.struct_sdma_firmware_header_v3_0)
    return [([P.GFX_FW_TYPE_SDMA_UCODE_TH0], c.cut(c.header.header.ucode_array_offset_bytes, c.header.ucode_size_bytes, "SDMA firmware"))]
  c = read_container(path, U.struct_sdma_firmware_header_v2_0, 2)
  h = c.header
  return [([P.GFX_FW_TYPE_SDMA_UCODE_TH1], c.cut(h.ctl_ucode_offset, h.ctl_ucode_size_bytes, "SDMA control thread")),
          ([P.GFX_FW_TYPE_SDMA_UCODE_TH0], c.cut(h.header.ucode_array_offset_bytes, h.ctx_ucode_size_bytes, "SDMA context thread"))]


def imu_payloads(c: Container) -> list[tuple[list[int], bytes]]:
  h = c.header
  off, iram = h.header.ucode_array_offset_bytes, h.imu_iram_ucode_size_bytes
  return [([P.GFX_FW_TYPE_IMU_I], c.cut(off, iram, "IMU instruction RAM")),
          ([P.GFX_FW_TYPE_IMU_D], c.cut(off + iram, h.imu_dram_ucode_size_bytes, "IMU data RAM"))]


def rlc_payloads(c: Container) -> list[tuple[list[int], bytes]]:
  """The RLC's save/restore lists, IRAM/DRAM boot code, RLC_P/RLC_V (header v2.3) and RLC_G last."""
  h3 = c.header
  h2 = h3.v2_2
  h1, minor = h2.v2_1, h2.v2_1.v2_0.header.header_version_minor
  if minor < 2: raise FirmwareError(f"{c.name}: RLC header v2.{minor}; GC 11 needs v2.2 or later (IRAM/DRAM boot code)")
  out = [([getattr(P, f"GFX_FW_TYPE_RLC_RESTORE_LIST_{m}_MEM")], c.cut(getattr(h1, f"save_restore_list_{m.lower()}_offset_bytes"),
          getattr(h1, f"save_restore_list_{m.lower()}_size_bytes"), f"RLC {m} restore list")) for m in ("GPM", "SRM")]
  out += [([getattr(P, f"GFX_FW_TYPE_RLC_{t}")], c.cut(getattr(h2, f"rlc_{f}_ucode_offset_bytes"), getattr(h2, f"rlc_{f}_ucode_size_bytes"),
          f"RLC {t}")) for t, f in (("IRAM", "iram"), ("DRAM_BOOT", "dram"))]
  if minor >= 3:
    out += [([getattr(P, f"GFX_FW_TYPE_RLC_{t}")], c.cut(getattr(h3, f"rlc{t.lower()}_ucode_offset_bytes"),
                                                       getattr(h3, f"rlc{t.lower()}_ucode_size_bytes"), f"RLC_{t}")) for t in ("P", "V")]
  g = h1.v2_0.header
  return out + [([P.GFX_FW_TYPE_RLC_G], c.cut(g.ucode_array_offset_bytes, g.ucode_size_bytes, "RLC_G"))]
