"""SQTT (shader-processor thread trace) packet stream of RDNA3 (gfx11): an encoder and a decoder at the packet level.

The trace is a stream of 4-bit nibbles, low nibble of each byte first. A packet's type is named by its low bits: the
first byte (two nibbles) indexes TYPE_OF_BYTE; a type whose identity needs only the low nibble maps every byte with that
nibble to it. Type 0x10 is not a packet but a one-nibble filler (a zero nibble): the decoder skips it. Each type has a
fixed size in bits (PACKET_BITS) and most carry a time delta (DELTA_FIELD: bit offset, width) that advances the trace's
clock; type 0x0F adds 4 to its field, and a TIME_LONG (0x16) whose bit 9 is set carries a marker value in that field,
not a delta. The bits outside the type and the delta are the packet's payload, kept raw here.
Where these facts come from is in docs/amd.md (SQTT)."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Iterable

class SQTTError(ValueError):
  """A byte stream that is not a well-formed SQTT packet stream."""

# byte -> packet type (the first 32 entries repeat with small changes; 0x10 = filler nibble, 0x00 = reserved)
TYPE_OF_BYTE = bytes.fromhex(
  "10161801050b0c000f141801090403021017180106080d000f1418010a04030210071801050b0c000f141801090403021019180106080d00"
  "0f1418010a04030210001801050b0c000f141801090403021011180106080d000f1418010a04030210121801050b0c000f14180109040302"
  "1015180106080d000f1418010a040302") * 2
FILLER, RESERVED = 0x10, 0x00
# packet type -> size in bits
PACKET_BITS = {0x01: 12, 0x02: 8, 0x03: 8, 0x04: 12, 0x05: 24, 0x06: 24, 0x07: 64, 0x08: 20, 0x09: 32, 0x0A: 48,
               0x0B: 20, 0x0C: 52, 0x0D: 28, 0x0E: 48, 0x0F: 8, 0x11: 24, 0x12: 24, 0x13: 32, 0x14: 64, 0x15: 64,
               0x16: 48, 0x17: 64, 0x18: 20, 0x19: 48}
# packet type -> (bit offset, width) of its time delta
DELTA_FIELD = {0x01: (3, 3), 0x02: (4, 2), 0x03: (4, 2), 0x04: (4, 3), 0x05: (5, 3), 0x06: (5, 3), 0x07: (8, 3),
               0x08: (5, 3), 0x09: (5, 2), 0x0A: (5, 2), 0x0B: (5, 3), 0x0C: (5, 3), 0x0D: (5, 3), 0x0E: (7, 2),
               0x0F: (4, 4), 0x11: (7, 9), 0x12: (8, 3), 0x13: (8, 3), 0x14: (4, 3), 0x15: (7, 3), 0x16: (12, 36),
               0x17: (0, 0), 0x18: (4, 3), 0x19: (7, 2)}
DELTA_BIAS = {0x0F: 4}
MARKER_BIT = {0x16: 9}  # packet type -> the bit that, when set, makes its delta field a marker value (clock unchanged)
NAMES = {0x01: "VALU", 0x02: "FLAT", 0x03: "SMEM_MSG", 0x04: "SCALAR", 0x0F: "TIME_SHORT", 0x11: "TIME_MEDIUM",
         0x16: "TIME_LONG", 0x09: "STATE", 0x15: "REGION"}

def _id_bits(ptype: int) -> tuple[int, int]:
  """(the low byte that names ptype, how many low bits of it are significant): the fewest bits k such that every byte
  agreeing with the first such byte in its low k bits maps to ptype."""
  first = TYPE_OF_BYTE.index(ptype)
  for k in range(1, 9):
    if all(TYPE_OF_BYTE[b] == ptype for b in range(256) if b & ((1 << k) - 1) == first & ((1 << k) - 1)):
      return first & ((1 << k) - 1), k
  raise AssertionError(f"packet type {ptype:#x} has no identifying bits")  # unreachable: k=8 always matches

ID_BITS = {t: _id_bits(t) for t in PACKET_BITS if t in TYPE_OF_BYTE}

@dataclass(frozen=True)
class Packet:
  """One packet: its type, its time delta (cycles, bias included) and its payload (the bits outside type and delta,
  packed low to high)."""
  type: int
  delta: int = 0
  payload: int = 0
  @property
  def name(self) -> str: return NAMES.get(self.type, f"TYPE_{self.type:02X}")
  @property
  def is_marker(self) -> bool:
    """Whether the delta field holds a marker value instead of a time delta (TIME_LONG with bit 9 set)."""
    if self.type not in MARKER_BIT: return False
    return bool((self.payload >> _free_positions(self.type).index(MARKER_BIT[self.type])) & 1)
  @property
  def clock_delta(self) -> int:
    """How far this packet advances the trace clock."""
    return 0 if self.is_marker else self.delta

def payload_bits(ptype: int) -> int:
  """How many payload bits a packet of this type carries."""
  return PACKET_BITS[ptype] - ID_BITS[ptype][1] - DELTA_FIELD[ptype][1]

def _free_positions(ptype: int) -> list[int]:
  k, (off, width) = ID_BITS[ptype][1], DELTA_FIELD[ptype]
  return [b for b in range(k, PACKET_BITS[ptype]) if not off <= b < off + width]

def encode_packet(p: Packet) -> int:
  """The packet's bits as an integer of PACKET_BITS[p.type] bits."""
  if p.type not in ID_BITS: raise SQTTError(f"unknown SQTT packet type {p.type:#x}")
  ident, _ = ID_BITS[p.type]
  off, width = DELTA_FIELD[p.type]
  raw_delta = p.delta - DELTA_BIAS.get(p.type, 0)
  if not 0 <= raw_delta < (1 << width) or (width == 0 and p.delta): raise SQTTError(f"delta {p.delta} does not fit {p.name}")
  free = _free_positions(p.type)
  if not 0 <= p.payload < (1 << len(free)): raise SQTTError(f"payload {p.payload:#x} does not fit {p.name} ({len(free)} bits)")
  bits = ident | (raw_delta << off)
  for i, pos in enumerate(free): bits |= ((p.payload >> i) & 1) << pos
  return bits

def encode(packets: Iterable[Packet]) -> bytes:
  """The nibble stream of packets, padded with filler nibbles to a whole number of bytes."""
  nibbles: list[int] = []
  for p in packets:
    bits = encode_packet(p)
    nibbles += [(bits >> s) & 0xF for s in range(0, PACKET_BITS[p.type], 4)]
  if len(nibbles) % 2: nibbles.append(0)
  return bytes(nibbles[i] | (nibbles[i + 1] << 4) for i in range(0, len(nibbles), 2))

def decode(data: bytes, strict: bool = True) -> list[Packet]:
  """The packets in an SQTT byte stream; filler nibbles are skipped. Raises SQTTError on a reserved type, and on a
  packet cut off by the end of the stream unless strict is False (a buffer read back from a GPU can end mid-packet:
  then the cut-off tail is dropped)."""
  nib = [(b >> s) & 0xF for b in data for s in (0, 4)]
  out: list[Packet] = []
  i = 0
  while i < len(nib):
    low = nib[i] | ((nib[i + 1] << 4) if i + 1 < len(nib) else 0)
    ptype = TYPE_OF_BYTE[low]
    if ptype == FILLER: i += 1; continue
    if ptype not in ID_BITS: raise SQTTError(f"reserved SQTT packet type at nibble {i} (byte {low:#04x})")
    n = PACKET_BITS[ptype] // 4
    if i + n > len(nib):
      if not strict: break
      raise SQTTError(f"SQTT packet {ptype:#x} at nibble {i} is cut off by the end of the stream")
    bits = sum(nib[i + j] << (4 * j) for j in range(n))
    off, width = DELTA_FIELD[ptype]
    payload = sum(((bits >> pos) & 1) << k for k, pos in enumerate(_free_positions(ptype)))
    out.append(Packet(ptype, ((bits >> off) & ((1 << width) - 1)) + DELTA_BIAS.get(ptype, 0) if width else 0, payload))
    i += n
  return out

def timeline(packets: Iterable[Packet]) -> list[tuple[int, Packet]]:
  """(the clock at each packet, after its delta, the packet): the deltas summed from 0 (markers do not advance it)."""
  t, out = 0, []
  for p in packets:
    t += p.clock_delta
    out.append((t, p))
  return out
