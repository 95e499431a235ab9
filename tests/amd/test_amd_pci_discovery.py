"""The PCI driver's IP discovery parser against hand-built tables (laid out here with struct, independently of the mock's
builder), every malformation the kernel checks, the mock's table, and a fuzzer (PLUGRAD_FUZZ_EXAMPLES cases): any
bytes parse or raise DiscoveryError, never anything else."""
from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrad_amd.am.discovery import Discovery, DiscoveryError, IPBlock, parse_discovery
from plugrad_amd.mock.discovery import NAVI31, NAVI31_GC_INFO, build_discovery

FUZZ = int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200"))
BINARY_SIGNATURE, TABLE_SIGNATURE, GC_TABLE_ID = 0x28211407, 0x53445049, 0x4347  # discovery.h
GC, MMHUB, NBIF = 11, 34, 108                                                       # soc15_hw_ip.h


def csum(b: bytes) -> int: return sum(b) & 0xFFFF


def hand_table(ips: list[tuple[int, int, tuple[int, int, int], list[int]]], wide: bool = False, gc: bytes = b"", version: int = 4) -> bytes:
  """A discovery binary laid out by hand: binary header (60 bytes) | IP discovery header (80) | die header | entries | gc."""
  entries = struct.pack("<HH", 0, len(ips))
  for hw, inst, (ma, mi, rev), bases in ips:
    entries += struct.pack("<HBBBBBB", hw, inst, len(bases), ma, mi, rev, 0)
    entries += b"".join(struct.pack("<Q" if wide else "<I", b) for b in bases)
  die_info = struct.pack("<HH", 0, 60 + 80) + bytes(4 * 15)
  ih = struct.pack("<IHHIH", TABLE_SIGNATURE, version, 80 + len(entries), 0, 1) + die_info + struct.pack("<BB", 1 if wide else 0, 0)
  assert len(ih) == 80
  ip_table = ih + entries
  tables = [(60, csum(ip_table), len(ip_table))] + ([(60 + len(ip_table), csum(gc), len(gc))] if gc else [(0, 0, 0)])
  tables += [(0, 0, 0)] * 4
  size = 60 + len(ip_table) + len(gc)
  rest = b"".join(struct.pack("<HHHH", o, c, s, 0) for o, c, s in tables) + ip_table + gc
  return struct.pack("<IHHHH", BINARY_SIGNATURE, 2, 0, csum(struct.pack("<H", size) + rest), size) + rest


def gc_table(num_se: int = 6, wave: int = 32) -> bytes:
  fields = [num_se, 4, 4, 4, 24, 0, 0, 0, 0, 0, 0, wave, 16, 0, 64, 0, 2, 0, 0]
  return struct.pack("<IHHI", GC_TABLE_ID, 1, 0, 12 + 4 * len(fields)) + struct.pack(f"<{len(fields)}I", *fields)


def test_hand_built_table():
  ips = [(GC, 0, (11, 0, 0), [0x1260, 0xA000, 0x1C000, 0x2402C00]), (MMHUB, 0, (3, 0, 0), [0x1A000, 0x2408800]),
         (NBIF, 0, (4, 3, 0), [0, 0x14, 0xD20])]
  d = parse_discovery(hand_table(ips, gc=gc_table()) + bytes(1000))
  assert d.ips == [IPBlock(GC, 0, (11, 0, 0), (0x1260, 0xA000, 0x1C000, 0x2402C00)), IPBlock(MMHUB, 0, (3, 0, 0), (0x1A000, 0x2408800)),
                   IPBlock(NBIF, 0, (4, 3, 0), (0, 0x14, 0xD20))]
  assert [ip.name for ip in d.ips] == ["GC", "MMHUB", "NBIF"] and d.ips[0].version_str == "11.0.0"
  assert d.gc_info["gc_num_se"] == 6 and d.gc_info["gc_wave_size"] == 32 and d.gc_info["gc_lds_size"] == 64
  assert d.require(GC) is d.ips[0] and d.find(GC, 1) is None


def test_64_bit_base_addresses_keep_their_dword_bits():
  """Version 4 tables may carry 64-bit bases; like the kernel, the parser keeps the low 30 bits (dword addresses)."""
  d = parse_discovery(hand_table([(GC, 0, (12, 0, 0), [0x1260 | (7 << 40), 0x3FFFFFFF | (1 << 30)])], wide=True))
  assert d.ips[0].bases == (0x1260, 0x3FFFFFFF)


def test_mock_table_matches_the_hand_layout():
  ips = [(h, i, v, list(b)) for h, i, v, b in NAVI31]
  assert build_discovery(NAVI31) == hand_table(ips)
  d = parse_discovery(build_discovery(NAVI31, NAVI31_GC_INFO))
  assert d.require(GC).version == (11, 0, 0) and len(d.ips) == len(NAVI31) and d.gc_info["gc_num_se"] == NAVI31_GC_INFO["gc_num_se"]


def corrupt(blob: bytes, offset: int, data: bytes) -> bytes: return blob[:offset] + data + blob[offset + len(data):]


def resum(blob: bytes) -> bytes:
  """Recompute the binary checksum (to reach the inner checks)."""
  size = struct.unpack_from("<H", blob, 10)[0]
  return corrupt(blob, 8, struct.pack("<H", csum(blob[10:size])))


def retable(blob: bytes) -> bytes:
  """Recompute the IP discovery table's checksum, then the binary's."""
  size = struct.unpack_from("<H", blob, 60 + 6)[0]
  return resum(corrupt(blob, 14, struct.pack("<H", csum(blob[60:60 + size]))))


GOOD = hand_table([(GC, 0, (11, 0, 0), [0x1260]), (MMHUB, 0, (3, 0, 0), [0x1A000])], gc=gc_table())


@pytest.mark.parametrize("blob,match", [
  (b"", "binary header at byte 0"),
  (corrupt(GOOD, 0, b"\0\0\0\0"), "binary signature 0x0 is not 0x28211407"),
  (corrupt(GOOD, 8, b"\1\0"), "binary checksum"),
  (GOOD[:-4], r"binary size \d+ outside"),
  (corrupt(GOOD, 60, b"XXXX"), None),  # the binary checksum catches it first
  (resum(corrupt(GOOD, 12, b"\0\0")), "no IP discovery table"),
], ids=["empty", "signature", "checksum", "truncated", "table-signature", "no-table"])
def test_malformed_tables(blob: bytes, match: str | None):
  with pytest.raises(DiscoveryError, match=match): parse_discovery(blob)


@pytest.mark.parametrize("edit,match", [
  (lambda b: resum(corrupt(b, 60, b"XXXX")), "IP discovery table signature"),
  (lambda b: retable(corrupt(b, 60 + 12, b"\0\0")), r"0 dies"),
  (lambda b: retable(corrupt(b, 140, b"\5\0")), "die header at 140 has id 5, expected 0"),
  (lambda b: retable(corrupt(b, 142, b"\x40\0")), "runs past"),
  (lambda b: resum(corrupt(b, 60 + 8, b"\xff")), "IP discovery table checksum does not match"),
  (lambda b: resum(corrupt(b, len(GOOD) - 88, struct.pack("<I", 0x1234))), "GC info table id 0x1234"),
  (lambda b: resum(corrupt(b, len(GOOD) - 84, struct.pack("<HH", 9, 9))), "GC info table version 9.9 is unknown"),
], ids=["table-signature", "no-dies", "die-id", "entries-past-end", "table-checksum", "gc-id", "gc-version"])
def test_malformed_inner_tables(edit, match: str):
  with pytest.raises(DiscoveryError, match=match): parse_discovery(edit(GOOD))


def test_missing_block_names_what_is_there():
  with pytest.raises(DiscoveryError, match=r"lists no NBIF block \(instance 0\); it has GC 11.0.0, MMHUB 3.0.0"): parse_discovery(GOOD).require(NBIF)


@settings(max_examples=FUZZ, deadline=None, derandomize=FUZZ <= 200, database=None)
@given(st.one_of(st.binary(max_size=600),
                 st.tuples(st.integers(0, len(GOOD) - 1), st.binary(min_size=1, max_size=8), st.booleans())
                 .map(lambda t: (resum if t[2] else (lambda b: b))(corrupt(GOOD, t[0], t[1])[:len(GOOD)]))))
def test_fuzz_parser_never_crashes(blob: bytes):
  try: d = parse_discovery(blob)
  except DiscoveryError: return
  assert isinstance(d, Discovery) and all(isinstance(ip.bases, tuple) for ip in d.ips)
