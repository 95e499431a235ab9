"""Synthetic GPU firmware for the mock PCI GPU: real container formats, recognizable payloads.

Firmware files are not on CI machines (and real ones are signed blobs the mock could not run anyway), so tests write
synthetic files with `write_synthetic(folder)`: the same names and amdgpu_ucode.h container headers as
/lib/firmware/amdgpu (psp_13_0_0_sos.bin with its sOS components and TOC, smu_13_0_0.bin, sdma_6_0_0.bin,
gc_11_0_0_{pfp,me,mec,imu,rlc}.bin), so the driver's parsing and cutting run unchanged. Each payload starts with a
`Payload` header naming what it is (a PSP sOS component or a GFX_FW_TYPE), its size, a start address (the MEC's program
counter start) and a CRC-32 of the rest; the mock PSP checks every image it is given against it, so a payload cut
from the wrong place of a container, or handed over as the wrong type, is refused as a real PSP refuses a bad signature.
"""
from __future__ import annotations

import ctypes
import os
import zlib
from dataclasses import dataclass

from plugrad_amd.autogen import amdgpu_ucode as U
from plugrad_amd.autogen import psp_gfx_if as P

MAGIC = b"PGFW"
KIND_PSP, KIND_GFX = 1, 2
MEC_START = 0x10000  # byte address the synthetic MEC firmware starts at (CP_MEC_RS64_PRGRM_CNTR_START = this >> 2)
SOS_COMPONENTS = (U.PSP_FW_TYPE_PSP_KDB, U.PSP_FW_TYPE_PSP_SPL, U.PSP_FW_TYPE_PSP_SYS_DRV, U.PSP_FW_TYPE_PSP_SOC_DRV, U.PSP_FW_TYPE_PSP_INTF_DRV,
                  U.PSP_FW_TYPE_PSP_DBG_DRV, U.PSP_FW_TYPE_PSP_RAS_DRV, U.PSP_FW_TYPE_PSP_SOS, U.PSP_FW_TYPE_PSP_TOC)


class Payload(ctypes.LittleEndianStructure):
  _pack_ = 1
  _fields_ = [("magic", ctypes.c_char * 4), ("kind", ctypes.c_uint32), ("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
              ("start", ctypes.c_uint32), ("crc", ctypes.c_uint32)]


def payload(kind: int, fw_type: int, size: int = 512, start: int = 0) -> bytes:
  """A synthetic image of `size` bytes: the header, then filler the CRC covers."""
  body = bytes((fw_type * 31 + i * 7 + kind) % 251 for i in range(size - ctypes.sizeof(Payload)))
  h = Payload(MAGIC, kind, fw_type, size, start, zlib.crc32(body))
  return bytes(h) + body


@dataclass
class Checked:
  kind: int
  type: int
  start: int


def check_payload(data: bytes, size: int | None = None) -> Checked:
  """Parse and verify a synthetic image (ValueError naming the problem)."""
  if len(data) < ctypes.sizeof(Payload): raise ValueError(f"image of {len(data)} bytes is shorter than a firmware header")
  h = Payload.from_buffer_copy(data)
  if h.magic != MAGIC: raise ValueError(f"image does not start with a firmware header (bytes {bytes(data[:8]).hex()}): signature check failed")
  if size is not None and h.size != size: raise ValueError(f"image header says {h.size} bytes, the command says {size}")
  if len(data) < h.size or zlib.crc32(bytes(data[ctypes.sizeof(Payload):h.size])) != h.crc:
    raise ValueError("image CRC mismatch: signature check failed")
  return Checked(h.kind, h.type, h.start)


def _common(total: int, header: int, major: int, minor: int, ucode_offset: int, ucode_size: int) -> U.struct_common_firmware_header:
  return U.struct_common_firmware_header(size_bytes=total, header_size_bytes=header, header_version_major=major, header_version_minor=minor,
                                         ucode_array_offset_bytes=ucode_offset, ucode_size_bytes=ucode_size)


def _container(hdr: ctypes.Structure, parts: list[bytes]) -> bytes:
  return bytes(hdr) + b"".join(parts)


def sos_file() -> bytes:
  descs, blobs, off = [], [], 0
  for t in SOS_COMPONENTS:
    b = payload(KIND_PSP, t, 384 + 16 * t)
    descs.append(U.struct_psp_fw_bin_desc(fw_type=t, fw_version=1, offset_bytes=off, size_bytes=len(b)))
    blobs.append(b)
    off += len(b)
  head = ctypes.sizeof(U.struct_psp_firmware_header_v2_0) + len(descs) * ctypes.sizeof(U.struct_psp_fw_bin_desc)
  total = head + off
  h = U.struct_psp_firmware_header_v2_0(header=_common(total, head, 2, 0, head, off), psp_fw_bin_count=len(descs))
  return bytes(h) + b"".join(bytes(d) for d in descs) + b"".join(blobs)


def smu_file() -> bytes:
  head = ctypes.sizeof(U.struct_smc_firmware_header_v1_0)
  b = payload(KIND_GFX, P.GFX_FW_TYPE_SMU, 1024)
  return _container(U.struct_smc_firmware_header_v1_0(header=_common(head + len(b), head, 1, 0, head, len(b))), [b])


def sdma_file() -> bytes:
  head = ctypes.sizeof(U.struct_sdma_firmware_header_v2_0)
  th0, th1 = payload(KIND_GFX, P.GFX_FW_TYPE_SDMA_UCODE_TH0, 768), payload(KIND_GFX, P.GFX_FW_TYPE_SDMA_UCODE_TH1, 640)
  h = U.struct_sdma_firmware_header_v2_0(header=_common(head + len(th0) + len(th1), head, 2, 0, head, len(th0)), ctx_ucode_size_bytes=len(th0),
                                         ctl_ucode_offset=head + len(th0), ctl_ucode_size_bytes=len(th1))
  return _container(h, [th0, th1])


def gfx_file(engine: str) -> bytes:
  head = ctypes.sizeof(U.struct_gfx_firmware_header_v2_0)
  start = MEC_START if engine == "MEC" else 0
  code = payload(KIND_GFX, getattr(P, f"GFX_FW_TYPE_RS64_{engine}"), 1024, start)
  stack = payload(KIND_GFX, getattr(P, f"GFX_FW_TYPE_RS64_{engine}_P0_STACK"), 512)
  h = U.struct_gfx_firmware_header_v2_0(header=_common(head + len(code) + len(stack), head, 2, 0, head, len(code)), ucode_size_bytes=len(code),
                                        ucode_offset_bytes=head, data_size_bytes=len(stack), data_offset_bytes=head + len(code),
                                        ucode_start_addr_lo=start, ucode_start_addr_hi=0)
  return _container(h, [code, stack])


def imu_file() -> bytes:
  head = ctypes.sizeof(U.struct_imu_firmware_header_v1_0)
  i, d = payload(KIND_GFX, P.GFX_FW_TYPE_IMU_I, 640), payload(KIND_GFX, P.GFX_FW_TYPE_IMU_D, 384)
  h = U.struct_imu_firmware_header_v1_0(header=_common(head + len(i) + len(d), head, 1, 0, head, len(i) + len(d)),
                                        imu_iram_ucode_size_bytes=len(i), imu_dram_ucode_size_bytes=len(d))
  return _container(h, [i, d])


def rlc_file() -> bytes:
  head = ctypes.sizeof(U.struct_rlc_firmware_header_v2_3)
  names = ("RLC_G", "RLC_RESTORE_LIST_GPM_MEM", "RLC_RESTORE_LIST_SRM_MEM", "RLC_IRAM", "RLC_DRAM_BOOT", "RLC_P", "RLC_V")
  parts = {n: payload(KIND_GFX, getattr(P, f"GFX_FW_TYPE_{n}"), 512 + 32 * k) for k, n in enumerate(names)}
  offs, off = {}, head
  for n in names: offs[n], off = off, off + len(parts[n])
  h = U.struct_rlc_firmware_header_v2_3()
  h1 = h.v2_2.v2_1
  h1.v2_0.header = _common(off, head, 2, 3, offs["RLC_G"], len(parts["RLC_G"]))
  for m in ("GPM", "SRM"):
    setattr(h1, f"save_restore_list_{m.lower()}_offset_bytes", offs[f"RLC_RESTORE_LIST_{m}_MEM"])
    setattr(h1, f"save_restore_list_{m.lower()}_size_bytes", len(parts[f"RLC_RESTORE_LIST_{m}_MEM"]))
  for t, f in (("IRAM", "iram"), ("DRAM_BOOT", "dram")):
    setattr(h.v2_2, f"rlc_{f}_ucode_offset_bytes", offs[f"RLC_{t}"])
    setattr(h.v2_2, f"rlc_{f}_ucode_size_bytes", len(parts[f"RLC_{t}"]))
  for t in ("P", "V"):
    setattr(h, f"rlc{t.lower()}_ucode_offset_bytes", offs[f"RLC_{t}"])
    setattr(h, f"rlc{t.lower()}_ucode_size_bytes", len(parts[f"RLC_{t}"]))
  return _container(h, [parts[n] for n in names])


def write_synthetic(folder: str, mp0: str = "13_0_0", mp1: str = "13_0_0", gc: str = "11_0_0", sdma: str = "6_0_0") -> list[str]:
  """Write the synthetic firmware files into `folder`; their paths."""
  os.makedirs(folder, exist_ok=True)
  files = {f"psp_{mp0}_sos.bin": sos_file(), f"smu_{mp1}.bin": smu_file(), f"sdma_{sdma}.bin": sdma_file(),
           **{f"gc_{gc}_{e.lower()}.bin": gfx_file(e) for e in ("PFP", "ME", "MEC")}, f"gc_{gc}_imu.bin": imu_file(), f"gc_{gc}_rlc.bin": rlc_file()}
  out = []
  for name, data in files.items():
    with open(p := os.path.join(folder, name), "wb") as f: f.write(data)
    out.append(p)
  return out
