"""The IP discovery table: which IP blocks the GPU has, their versions and register segment bases.

The table sits 64 KiB below the top of VRAM (DISCOVERY_TMR_OFFSET), where the firmware leaves it at power-on; its
layout is discovery.h's (generated plugrad_amd.autogen.discovery): a binary header (signature, byte-sum checksum of the
rest, a list of tables), the IP discovery table (signature, checksum, dies), per die a list of IP entries (hardware id,
instance, major.minor.revision, base addresses in dwords), and the GC info table (shader engines, wave size, ...).
`parse_discovery` checks every signature, checksum, offset and size the kernel checks and raises `DiscoveryError`
naming what is wrong; it never reads outside the blob.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

from plugrad_amd.autogen import discovery as D
from plugrad_amd.autogen import soc15_hw_ip

HWID_NAMES: dict[int, str] = {}
for _n, _v in vars(soc15_hw_ip).items():
  if _n.endswith("_HWID"): HWID_NAMES.setdefault(_v, _n[:-5])


class DiscoveryError(ValueError):
  """The IP discovery table is malformed (wrong signature, checksum, offset or size)."""


@dataclass(frozen=True)
class IPBlock:
  hw_id: int
  instance: int
  version: tuple[int, int, int]
  bases: tuple[int, ...]

  @property
  def name(self) -> str: return HWID_NAMES.get(self.hw_id, f"HWID{self.hw_id}")
  @property
  def version_str(self) -> str: return ".".join(map(str, self.version))


@dataclass
class Discovery:
  ips: list[IPBlock]
  gc_info: dict[str, int] = field(default_factory=dict)

  def find(self, hw_id: int, instance: int = 0) -> IPBlock | None:
    return next((ip for ip in self.ips if ip.hw_id == hw_id and ip.instance == instance), None)

  def require(self, hw_id: int, instance: int = 0) -> IPBlock:
    if (ip := self.find(hw_id, instance)) is None:
      raise DiscoveryError(f"the discovery table lists no {HWID_NAMES.get(hw_id, hw_id)} block (instance {instance}); it has "
                           f"{', '.join(sorted({f'{i.name} {i.version_str}' for i in self.ips}))}")
    return ip


def byte_sum(data: bytes) -> int:
  """discovery.h's checksum: the 16-bit sum of the bytes."""
  return sum(data) % (1 << 16)


def _struct(blob: bytes, st: type, offset: int, what: str) -> ctypes.Structure:
  if offset < 0 or offset + ctypes.sizeof(st) > len(blob):
    raise DiscoveryError(f"{what} at byte {offset} ({ctypes.sizeof(st)} bytes) runs past the {len(blob)}-byte table")
  return st.from_buffer_copy(blob, offset)


def parse_discovery(blob: bytes) -> Discovery:
  """Parse the discovery binary (at least its binary_size bytes)."""
  bh = _struct(blob, D.struct_binary_header, 0, "binary header")
  if bh.binary_signature != D.BINARY_SIGNATURE:
    raise DiscoveryError(f"binary signature {bh.binary_signature:#x} is not {D.BINARY_SIGNATURE:#x}: no IP discovery table here "
                         "(is the VRAM size right and the firmware initialized?)")
  start = D.struct_binary_header.binary_checksum.offset + 2
  if not start <= bh.binary_size <= len(blob): raise DiscoveryError(f"binary size {bh.binary_size} outside [{start}, {len(blob)}]")
  if byte_sum(blob[start:bh.binary_size]) != bh.binary_checksum:
    raise DiscoveryError(f"binary checksum {byte_sum(blob[start:bh.binary_size]):#x} does not match the header's {bh.binary_checksum:#x}")
  blob = blob[:bh.binary_size]
  info = bh.table_list[D.IP_DISCOVERY]
  if not info.offset: raise DiscoveryError("the binary has no IP discovery table")
  ih = _struct(blob, D.struct_ip_discovery_header, info.offset, "IP discovery header")
  if ih.signature != D.DISCOVERY_TABLE_SIGNATURE:
    raise DiscoveryError(f"IP discovery table signature {ih.signature:#x} is not {D.DISCOVERY_TABLE_SIGNATURE:#x}")
  if info.offset + ih.size > len(blob): raise DiscoveryError(f"IP discovery table of {ih.size} bytes at {info.offset} runs past the binary")
  if byte_sum(blob[info.offset:info.offset + ih.size]) != info.checksum: raise DiscoveryError("IP discovery table checksum does not match")
  if not 1 <= ih.num_dies <= len(ih.die_info): raise DiscoveryError(f"{ih.num_dies} dies (1 to {len(ih.die_info)} allowed)")
  wide = ih.version >= 4 and bool(ih.base_addr_64_bit)
  ips = [ip for d in range(ih.num_dies) for ip in _die(blob, ih.die_info[d].die_offset, d, wide)]
  return Discovery(ips, _gc_info(blob, bh.table_list[D.GC]))


def _die(blob: bytes, offset: int, die: int, wide: bool) -> list[IPBlock]:
  dh = _struct(blob, D.struct_die_header, offset, f"die {die} header")
  if dh.die_id != die: raise DiscoveryError(f"die header at {offset} has id {dh.die_id}, expected {die}")
  pos, out = offset + ctypes.sizeof(D.struct_die_header), []
  width = 8 if wide else 4
  for i in range(dh.num_ips):
    ip = _struct(blob, D.struct_ip_v4, pos, f"die {die} IP entry {i}")
    end = pos + ctypes.sizeof(D.struct_ip_v4) + width * ip.num_base_address
    if end > len(blob): raise DiscoveryError(f"die {die} IP entry {i} ({ip.num_base_address} base addresses) runs past the table")
    raw = blob[pos + ctypes.sizeof(D.struct_ip_v4):end]
    # 64-bit bases keep their low 30 bits: dword addresses, the bits above are ASIC-specific (as the kernel does)
    bases = tuple(int.from_bytes(raw[k:k + width], "little") & ((1 << 30) - 1 if wide else (1 << 32) - 1) for k in range(0, len(raw), width))
    out.append(IPBlock(ip.hw_id, ip.instance_number, (ip.major, ip.minor, ip.revision), bases))
    pos = end
  return out


def _gc_info(blob: bytes, info: ctypes.Structure) -> dict[str, int]:
  """The GC info table's fields (num_se, wave size, ...) when the binary has one."""
  if not info.offset: return {}
  hdr = _struct(blob, D.struct_gpu_info_header, info.offset, "GC info header")
  if hdr.table_id != D.GC_TABLE_ID: raise DiscoveryError(f"GC info table id {hdr.table_id:#x} is not {D.GC_TABLE_ID:#x}")
  st = getattr(D, f"struct_gc_info_v{hdr.version_major}_{hdr.version_minor}", None)
  if st is None: raise DiscoveryError(f"GC info table version {hdr.version_major}.{hdr.version_minor} is unknown")
  gi = _struct(blob, st, info.offset, f"GC info v{hdr.version_major}.{hdr.version_minor}")
  return {name: getattr(gi, name) for name, *_ in st._fields_ if name.startswith("gc_")}
