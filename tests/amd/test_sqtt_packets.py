"""SQTT packet layer (plugrad_amd.sqtt): encoder -> decoder round trips over hypothesis-generated packet streams, bytes
worked out by hand from the layout tables, and clear errors (never a crash or a hang) on hostile byte streams."""
from __future__ import annotations
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugrad_amd import sqtt
from plugrad_amd.sqtt import Packet, SQTTError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
from fuzz_helpers import bounded

TYPES = sorted(sqtt.ID_BITS)

@st.composite
def packets(draw) -> Packet:
  t = draw(st.sampled_from(TYPES))
  _, width = sqtt.DELTA_FIELD[t]
  bias = sqtt.DELTA_BIAS.get(t, 0)
  delta = draw(st.integers(bias, bias + (1 << width) - 1)) if width else 0
  return Packet(t, delta, draw(st.integers(0, (1 << sqtt.payload_bits(t)) - 1)))

@given(st.lists(packets(), max_size=60))
def test_round_trip(ps: list[Packet]) -> None:
  assert sqtt.decode(sqtt.encode(ps)) == ps

@given(st.lists(packets(), max_size=30), st.integers(0, 6))
def test_filler_nibbles_between_packets_are_skipped(ps: list[Packet], fill: int) -> None:
  data = b"".join(sqtt.encode([p]) + b"\x00" * fill for p in ps)
  assert sqtt.decode(data) == ps

def test_layout_tables_are_consistent() -> None:
  for t, (ident, k) in sqtt.ID_BITS.items():
    off, width = sqtt.DELTA_FIELD[t]
    assert sqtt.PACKET_BITS[t] % 4 == 0 and (width == 0 or off >= k) and off + width <= sqtt.PACKET_BITS[t]
    assert all(sqtt.TYPE_OF_BYTE[b] == t for b in range(256) if b % (1 << k) == ident)
  assert all(sqtt.TYPE_OF_BYTE[b] == sqtt.FILLER for b in range(0, 256, 16))  # a zero nibble is always filler

def test_known_bytes() -> None:
  # TIME_SHORT (0x0F): 8 bits, low nibble 8, delta-4 in bits 4..7 -> delta 7 is 0x38
  assert sqtt.encode([Packet(0x0F, 7)]) == b"\x38"
  # FLAT (0x02): 8 bits, low nibble 0xF, delta in bits 4..5, payload in bits 6..7 -> delta 2, payload 1 is 0x6F
  assert sqtt.encode([Packet(0x02, 2, 1)]) == b"\x6f"
  # VALU (0x01): 12 bits, low 3 bits 0b011, delta in bits 3..5, payload bits 6..11 -> 0x3 | 5<<3 | 0x2A<<6 = 0xAAB
  assert sqtt.encode([Packet(0x01, 5, 0x2A)]) == bytes([0xAB, 0x0A])
  assert sqtt.decode(bytes([0xAB, 0x0A])) == [Packet(0x01, 5, 0x2A)]

def test_the_bytes_the_published_tables_disagreed_on() -> None:
  """0x31/0xB1 start a UTILCTR (type 14, 48 bits), 0xE1 an EVENT_BIG (19, 32 bits) while 0x61 is an EVENT (18, 24
  bits), and TS_DELTA_S8_W3 (7) is 72 bits: the newer of the two published tables (docs/amd.md, SQTT)."""
  assert [sqtt.TYPE_OF_BYTE[b] for b in (0x31, 0xB1, 0xE1, 0x61, 0x21)] == [0x0E, 0x0E, 0x13, 0x12, 0x07]
  assert [p.type for p in sqtt.decode(bytes([0xE1, 0, 0, 0, 0x61, 0, 0]))] == [0x13, 0x12]
  assert len(sqtt.encode([Packet(0x07, 3)])) == 9 and sqtt.decode(sqtt.encode([Packet(0x07, 3)])) == [Packet(0x07, 3)]

def test_timeline_sums_deltas() -> None:
  ps = [Packet(0x0F, 4), Packet(0x01, 3), Packet(0x16, 1000)]
  assert [t for t, _ in sqtt.timeline(sqtt.decode(sqtt.encode(ps)))] == [4, 7, 1007]

@pytest.mark.parametrize("p", [Packet(0x0F, 3), Packet(0x0F, 20), Packet(0x02, 0, 4), Packet(0x19), Packet(0x17, 1)])
def test_encoder_rejects_what_does_not_fit(p: Packet) -> None:
  with pytest.raises(SQTTError): sqtt.encode([p])

def test_decoder_names_a_truncated_packet() -> None:
  data = sqtt.encode([Packet(0x16, 123456)])
  with pytest.raises(SQTTError, match="cut off"): sqtt.decode(data[:-1])

def test_lenient_decode_drops_a_cut_off_tail() -> None:
  ps = [Packet(0x0F, 5), Packet(0x01, 2, 7)]
  data = sqtt.encode(ps + [Packet(0x16, 99)])
  assert sqtt.decode(data[:-2], strict=False) == ps

def test_time_long_marker_does_not_advance_the_clock() -> None:
  marker = Packet(0x16, 0x123456789, 1 << 2)  # payload bit 2 is packet bit 9 (payload starts at bit 7)
  assert marker.is_marker and not Packet(0x16, 5).is_marker
  ps = sqtt.decode(sqtt.encode([Packet(0x0F, 4), marker, Packet(0x16, 10)]))
  assert [t for t, _ in sqtt.timeline(ps)] == [4, 4, 14]

def test_decoder_names_a_reserved_type() -> None:
  with pytest.raises(SQTTError, match="reserved"): sqtt.decode(b"\x07")

@given(st.binary(max_size=512))
def test_fuzz_decoder_on_arbitrary_bytes(data: bytes) -> None:
  res, err = bounded(lambda: sqtt.decode(data), (SQTTError,), len(data))
  if err is None: assert sqtt.decode(sqtt.encode(res)) == res  # what decodes re-encodes to the same packets
