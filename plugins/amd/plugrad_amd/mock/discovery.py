"""Building IP discovery tables (discovery.h layout) for the mock PCI GPU and for tests of the driver's parser.

`build_discovery(ips, gc_info)` lays out a binary header, the IP discovery table (one die), its IP entries and a GC
info table (v1.0), with the byte-sum checksums the parser checks. `NAVI31` is the mock GPU's table: gfx1100's IP
versions with the register segment bases of the last discrete GPU whose bases the kernel ships
(sienna_cichlid_ip_offset.h), which also agree with the fixed pre-discovery offsets (RCC_CONFIG_MEMSIZE in NBIO
segment 2, MP0 C2PMSG_33 in MP0 segment 0).
"""
from __future__ import annotations

import ctypes

from plugrad_amd.autogen import discovery as D
from plugrad_amd.autogen import soc15_hw_ip as H

GC_BASES = (0x00001260, 0x0000A000, 0x0001C000, 0x02402C00)
NAVI31: list[tuple[int, int, tuple[int, int, int], tuple[int, ...]]] = [  # (hw id, instance, version, segment bases)
  (H.GC_HWID, 0, (11, 0, 0), GC_BASES),
  (H.SDMA0_HWID, 0, (6, 0, 0), GC_BASES),
  (H.SDMA1_HWID, 0, (6, 0, 0), GC_BASES),
  (H.MMHUB_HWID, 0, (3, 0, 0), (0x0001A000, 0x02408800)),
  (H.ATHUB_HWID, 0, (3, 0, 0), (0x00000C00, 0x02408C00)),
  (H.NBIF_HWID, 0, (4, 3, 0), (0x00000000, 0x00000014, 0x00000D20, 0x00010400, 0x0241B000, 0x04040000)),
  (H.MP0_HWID, 0, (13, 0, 0), (0x00016000, 0x00DC0000, 0x00E00000, 0x00E40000, 0x0243FC00)),
  (H.MP1_HWID, 0, (13, 0, 0), (0x00016000, 0x00DC0000, 0x00E00000, 0x00E40000, 0x0243FC00)),
  (H.HDP_HWID, 0, (6, 0, 0), (0x00000F20, 0x0240A400)),
  (H.OSSSYS_HWID, 0, (6, 0, 0), (0x000010A0, 0x0240A000)),
  (H.SMUIO_HWID, 0, (13, 0, 6), (0x00016800, 0x00016A00, 0x00440000, 0x02401000)),
  (H.UMC_HWID, 0, (8, 10, 0), (0x00014000, 0x02425800)),
]
NAVI31_GC_INFO = {"gc_num_se": 6, "gc_num_wgp0_per_sa": 4, "gc_num_wgp1_per_sa": 4, "gc_num_rb_per_se": 4, "gc_num_gl2c": 24,
                  "gc_wave_size": 32, "gc_max_waves_per_simd": 16, "gc_lds_size": 64, "gc_num_sa_per_se": 2}


def checksum(data: bytes) -> int: return sum(data) % (1 << 16)


def build_discovery(ips: list[tuple[int, int, tuple[int, int, int], tuple[int, ...]]], gc_info: dict[str, int] | None = None,
                    version: int = 4) -> bytes:
  """A discovery binary listing `ips` on one die (32-bit base addresses), with a GC info table when `gc_info` is given."""
  hdr_size = ctypes.sizeof(D.struct_binary_header)
  ih_off = hdr_size
  die_off = ih_off + ctypes.sizeof(D.struct_ip_discovery_header)
  entries = bytearray(D.struct_die_header(die_id=0, num_ips=len(ips)))
  for hwid, inst, (ma, mi, rev), bases in ips:
    entries += bytes(D.struct_ip_v4(hw_id=hwid, instance_number=inst, num_base_address=len(bases), major=ma, minor=mi, revision=rev))
    entries += b"".join(b.to_bytes(4, "little") for b in bases)
  ih = D.struct_ip_discovery_header(signature=D.DISCOVERY_TABLE_SIGNATURE, version=version, num_dies=1)
  ih.size = ctypes.sizeof(ih) + len(entries)
  ih.die_info[0].die_id, ih.die_info[0].die_offset = 0, die_off
  ip_table = bytes(ih) + bytes(entries)
  gc_off = ih_off + len(ip_table)
  gc = b""
  if gc_info is not None:
    g = D.struct_gc_info_v1_0(**gc_info)
    g.header.table_id, g.header.version_major, g.header.version_minor, g.header.size = D.GC_TABLE_ID, 1, 0, ctypes.sizeof(g)
    gc = bytes(g)
  bh = D.struct_binary_header(binary_signature=D.BINARY_SIGNATURE, version_major=2, version_minor=0, binary_size=gc_off + len(gc))
  bh.table_list[D.IP_DISCOVERY].offset, bh.table_list[D.IP_DISCOVERY].checksum = ih_off, checksum(ip_table)
  bh.table_list[D.IP_DISCOVERY].size = len(ip_table)
  if gc:
    bh.table_list[D.GC].offset, bh.table_list[D.GC].checksum, bh.table_list[D.GC].size = gc_off, checksum(gc), len(gc)
  body = bytearray(bytes(bh) + ip_table + gc)
  start = D.struct_binary_header.binary_checksum.offset + 2
  bh.binary_checksum = checksum(body[start:])
  body[:hdr_size] = bytes(bh)
  return bytes(body)
