"""SQTT (shader-processor thread trace) of RDNA3 (gfx11): the packet stream's encoder and decoder, and the mapping of
a shader engine's packets onto a kernel's disassembly (per-wave instruction timelines).

The trace is a stream of 4-bit nibbles, low nibble of each byte first. A packet's type is named by its low bits: the
first byte (two nibbles) indexes TYPE_OF_BYTE; a type whose identity needs only the low nibble maps every byte with that
nibble to it. Type 0x10 is not a packet but a one-nibble filler (a zero nibble): the decoder skips it. Each type has a
fixed size in bits (PACKET_BITS) and most carry a time delta (DELTA_FIELD: bit offset, width) that advances the trace's
clock; TS_DELTA_SHORT adds 4 to its field, and a TS_DELTA_OR_MARK with rt set and pl clear carries a marker value in
that field, not a delta. The bits outside the type and the delta are the payload (Packet.payload); FIELDS names the
bit ranges of the packet types the mapping reads (Packet.field, make).
Where these facts come from is in docs/amd.md (SQTT)."""
from __future__ import annotations
import functools
import re
from dataclasses import dataclass
from typing import Iterable

from plugrad.viz.capture import WaveInst, WaveTrace

class SQTTError(ValueError):
  """A byte stream that is not a well-formed SQTT packet stream, or packets that do not fit the kernel's code."""

# byte -> packet type (the first 32 entries repeat with small changes; 0x10 = filler nibble, 0x00 = reserved)
TYPE_OF_BYTE = bytes.fromhex(
  "10161801050b0c000f141801090403021017180106080d000f1418010a04030210071801050b0c000f14180109040302100e180106080d00"
  "0f1418010a04030210001801050b0c000f141801090403021011180106080d000f1418010a04030210121801050b0c000f14180109040302"
  "1015180106080d000f1418010a040302") * 2
TYPE_OF_BYTE = TYPE_OF_BYTE[:0xE1] + bytes([0x13]) + TYPE_OF_BYTE[0xE2:]  # 0xE1 is EVENT_BIG, 0x61 EVENT: the one byte the halves differ in
FILLER, RESERVED = 0x10, 0x00
# packet type -> size in bits
PACKET_BITS = {0x01: 12, 0x02: 8, 0x03: 8, 0x04: 12, 0x05: 24, 0x06: 24, 0x07: 72, 0x08: 20, 0x09: 32, 0x0A: 48,
               0x0B: 20, 0x0C: 52, 0x0D: 28, 0x0E: 48, 0x0F: 8, 0x11: 24, 0x12: 24, 0x13: 32, 0x14: 64, 0x15: 64,
               0x16: 48, 0x17: 64, 0x18: 20}
# packet type -> (bit offset, width) of its time delta
DELTA_FIELD = {0x01: (3, 3), 0x02: (4, 2), 0x03: (4, 2), 0x04: (4, 3), 0x05: (5, 3), 0x06: (5, 3), 0x07: (8, 3),
               0x08: (5, 3), 0x09: (5, 2), 0x0A: (5, 2), 0x0B: (5, 3), 0x0C: (5, 3), 0x0D: (5, 3), 0x0E: (7, 2),
               0x0F: (4, 4), 0x11: (7, 9), 0x12: (8, 3), 0x13: (8, 3), 0x14: (4, 3), 0x15: (7, 3), 0x16: (12, 36),
               0x17: (0, 0), 0x18: (4, 3)}
DELTA_BIAS = {0x0F: 4}
# packet type ids as rocprof-trace-decoder numbers them (16, the filler nibble, is not a packet)
NAMES = {0x01: "VALUINST", 0x02: "VMEMEXEC", 0x03: "ALUEXEC", 0x04: "IMMEDIATE", 0x05: "IMMEDIATE_MASK", 0x06: "WAVERDY",
         0x07: "TS_DELTA_S8_W3", 0x08: "WAVEEND", 0x09: "WAVESTART", 0x0A: "TS_DELTA_S5_W2", 0x0B: "WAVEALLOC",
         0x0C: "TS_DELTA_S5_W3", 0x0D: "PERF", 0x0E: "UTILCTR", 0x0F: "TS_DELTA_SHORT", 0x11: "TS_WAVE_STATE", 0x12: "EVENT",
         0x13: "EVENT_BIG", 0x14: "REG", 0x15: "SNAPSHOT", 0x16: "TS_DELTA_OR_MARK", 0x17: "LAYOUT_HEADER", 0x18: "INST"}
T = {name: t for t, name in NAMES.items()}  # name -> type id
# packet type -> {field: (hi, lo)}: bit ranges (inclusive) within the packet's bits, bit 0 = the first nibble's bit 0
FIELDS: dict[int, dict[str, tuple[int, int]]] = {
  T["VALUINST"]: {"flag": (6, 6), "wave": (11, 7)},
  T["VMEMEXEC"]: {"src": (7, 6)},
  T["ALUEXEC"]: {"src": (7, 6)},
  T["IMMEDIATE"]: {"wave": (11, 7)},
  T["IMMEDIATE_MASK"]: {"mask": (23, 8)},
  T["WAVEEND"]: {"sa": (8, 8), "simd": (10, 9), "wgp": (13, 11), "wave": (19, 15)},
  T["WAVESTART"]: {"sa": (7, 7), "simd": (9, 8), "wgp": (12, 10), "wave": (17, 13), "id7": (31, 18)},
  T["TS_DELTA_OR_MARK"]: {"pl": (8, 8), "rt": (9, 9)},
  T["LAYOUT_HEADER"]: {"layout": (12, 7), "simd": (14, 13), "group": (17, 15), "sel_a": (31, 28), "sel_b": (36, 33)},
  T["INST"]: {"flag1": (3, 3), "flag2": (7, 7), "wave": (12, 8), "op": (19, 13)},
}
# INST packet `op` values of RDNA3 (layout 3); 0x50-0x66 are memory ops issued by another SIMD (not the traced wave's)
INST_OP = {"SALU": 0x00, "SMEM_RD": 0x01, "JUMP": 0x03, "JUMP_NO": 0x04, "MESSAGE": 0x09, "VALUT_4": 0x0B, "VALUB_2": 0x0D,
           "VALUB_4": 0x0E, "VALUB_16": 0x0F, "BARRIER": 0x13, "FLAT_RD_2": 0x1C, "FLAT_WR_3": 0x1D, "SGMEM_RD_1": 0x21,
           "SGMEM_RD_2": 0x22, **{f"SGMEM_WR_{i - 0x22}": i for i in range(0x24, 0x29)}, "LDS_RD": 0x29,
           **{f"LDS_WR_{i - 0x29}": i for i in range(0x2A, 0x2F)}, "SALU_WR_EXEC": 0x72, "VALU1_WR_EXEC": 0x73}
OTHER_SIMD_OPS = range(0x50, 0x67)
LAYOUT_RDNA3 = 3

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
  @functools.cached_property
  def bits(self) -> int:
    """The packet's raw bits (PACKET_BITS[type] of them)."""
    return encode_packet(self)
  def field(self, name: str) -> int:
    """A named field of this packet type (FIELDS); SQTTError for a name the type does not have."""
    hi, lo = _field(self.type, name)
    return (self.bits >> lo) & ((1 << (hi - lo + 1)) - 1)
  @property
  def is_marker(self) -> bool:
    """Whether the delta field holds a marker value instead of a time delta (TS_DELTA_OR_MARK with rt set, pl clear)."""
    return self.type == T["TS_DELTA_OR_MARK"] and self.field("rt") == 1 and self.field("pl") == 0
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

def from_bits(ptype: int, bits: int) -> Packet:
  """The packet of type ptype whose raw bits are `bits` (the identifying bits are not checked)."""
  off, width = DELTA_FIELD[ptype]
  payload = sum(((bits >> pos) & 1) << k for k, pos in enumerate(_free_positions(ptype)))
  return Packet(ptype, ((bits >> off) & ((1 << width) - 1)) + DELTA_BIAS.get(ptype, 0) if width else 0, payload)

def _field(ptype: int, name: str) -> tuple[int, int]:
  f = FIELDS.get(ptype, {}).get(name)
  if f is None: raise SQTTError(f"SQTT packet {NAMES.get(ptype, hex(ptype))} has no field {name!r}")
  return f

def make(ptype: int, delta: int = 0, **fields: int) -> Packet:
  """A packet of type ptype with the given time delta and named field values (unnamed bits zero); SQTTError when a
  value does not fit its field."""
  bits = 0
  for name, v in fields.items():
    hi, lo = _field(ptype, name)
    if not 0 <= v < (1 << (hi - lo + 1)): raise SQTTError(f"{NAMES[ptype]}.{name} = {v} does not fit bits {hi}:{lo}")
    bits |= v << lo
  return Packet(ptype, delta, from_bits(ptype, bits).payload)

MAX_MARK_DELTA = (1 << DELTA_FIELD[0x16][1]) - 1

def max_delta(ptype: int) -> int:
  """The largest time delta a packet of this type carries (0 for a type without a delta field)."""
  width = DELTA_FIELD[ptype][1]
  return (1 << width) - 1 + DELTA_BIAS.get(ptype, 0) if width else 0

def time_packets(gap: int) -> list[Packet]:
  """Packets that only advance the clock by `gap` cycles: one TS_DELTA_SHORT for 4..19, else TS_DELTA_OR_MARK
  packets (36-bit deltas, not markers)."""
  if 4 <= gap <= 19: return [Packet(T["TS_DELTA_SHORT"], gap)]
  out = []
  while gap > 0:
    out.append(make(T["TS_DELTA_OR_MARK"], min(gap, MAX_MARK_DELTA)))
    gap -= out[-1].delta
  return out

def pack_timed(events: Iterable[tuple[int, int, dict[str, int]]]) -> list[Packet]:
  """Packets for (cycle, type, fields) events in time order: each packet's delta is the cycles since the previous
  one; a gap longer than its type's delta field holds is covered by time packets (time_packets) placed first."""
  out: list[Packet] = []
  clock = 0
  for cycle, ptype, fields in events:
    gap = cycle - clock
    if gap < 0: raise SQTTError(f"SQTT event at cycle {cycle} comes after cycle {clock}: events must be in time order")
    d = min(gap, max_delta(ptype))
    out += time_packets(gap - d)
    out.append(make(ptype, d, **fields))
    clock += gap
  return out

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
    out.append(from_bits(ptype, sum(nib[i + j] << (4 * j) for j in range(n))))
    i += n
  return out

def timeline(packets: Iterable[Packet]) -> list[tuple[int, Packet]]:
  """(the clock at each packet, after its delta, the packet): the deltas summed from 0 (markers do not advance it)."""
  t, out = 0, []
  for p in packets:
    t += p.clock_delta
    out.append((t, p))
  return out


# ---------------------------------------------------------------- code listings and the per-wave mapping

@dataclass(frozen=True)
class CodeLine:
  """One instruction of a kernel: its byte offset from the kernel's entry, size in bytes, llvm-objdump's text, and for
  a direct branch (s_branch, s_cbranch_*) its target offset."""
  pc: int
  size: int
  text: str
  target: int | None = None
  @property
  def mnemonic(self) -> str: return self.text.split(None, 1)[0] if self.text else ""
  @property
  def is_branch(self) -> bool: return self.target is not None

_SYMBOL = re.compile(r"^([0-9a-fA-F]+) <(.+)>:\s*$")
_INSTRUCTION = re.compile(r"^\s+(\S.*?)\s*// ([0-9a-fA-F]+): ((?:[0-9a-fA-F]{8}\s?)+)\s*(?:<[^>]*>\s*)?$")
SOPP_PREFIX = 0x17F  # bits 31:23 of a SOPP instruction word

def _branch_target(mnemonic: str, pc: int, word: int) -> int | None:
  if not (mnemonic == "s_branch" or mnemonic.startswith("s_cbranch_")) or word >> 23 != SOPP_PREFIX: return None
  simm = word & 0xFFFF
  return pc + 4 + 4 * (simm - 0x10000 if simm & 0x8000 else simm)

def code_listing(disasm: str, kernel: str | None = None) -> list[CodeLine]:
  """The instructions of one kernel in llvm-objdump -d output (the `<kernel>:` section; with kernel None the output
  must hold exactly one), PCs relative to the kernel's symbol. SQTTError when the kernel is not there."""
  sections: dict[str, list[CodeLine]] = {}
  cur, base = None, 0
  for line in disasm.splitlines():
    if m := _SYMBOL.match(line):
      cur, base = m.group(2), int(m.group(1), 16)
      sections[cur] = []
    elif cur is not None and (m := _INSTRUCTION.match(line)):
      words = [int(w, 16) for w in m.group(3).split()]
      pc, text = int(m.group(2), 16) - base, m.group(1)
      sections[cur].append(CodeLine(pc, 4 * len(words), text, _branch_target(text.split()[0], pc, words[0])))
  if kernel is None:
    if len(sections) != 1: raise SQTTError(f"the disassembly holds {len(sections)} symbols ({', '.join(sections)}): name the kernel")
    kernel = next(iter(sections))
  if kernel not in sections: raise SQTTError(f"kernel {kernel!r} is not in the disassembly (it has {', '.join(sections) or 'none'})")
  return sections[kernel]

NO_TOKEN = ("s_delay_alu",)  # instructions the trace skips silently
ENDS = ("s_endpgm",)         # WAVEEND stands for it
_TOKEN_TYPES = (T["INST"], T["VALUINST"], T["IMMEDIATE"])

def inst_kind(mnemonic: str) -> str:
  """The kind of an instruction for WaveInst.kind, from its mnemonic."""
  if mnemonic == "s_branch" or mnemonic.startswith("s_cbranch_"): return "BRANCH"
  if mnemonic == "s_barrier": return "BARRIER"
  if mnemonic.startswith(("s_waitcnt", "s_nop", "s_sleep", "s_wait_")): return "WAIT"
  if mnemonic.startswith(("s_load_", "s_buffer_load_", "s_dcache_", "s_gl1_inv")): return "SMEM"
  if mnemonic.startswith(("global_", "flat_", "buffer_", "scratch_")): return "VMEM"
  if mnemonic.startswith("ds_"): return "LDS"
  if mnemonic.startswith("v_"): return "VALU"
  if mnemonic.startswith(("s_clause", "s_sendmsg", "s_set_inst_prefetch", "s_setprio", "s_icache", "s_code_end", "s_trap")): return "OTHER"
  return "SALU" if mnemonic.startswith("s_") else "OTHER"

@dataclass
class _LiveWave:
  trace: WaveTrace
  pc: int
  steps: list[tuple[int, str, int, str]]  # (pc, text, cycle, kind)

  def finish(self, end: int) -> WaveTrace:
    self.trace.end = end
    cycles = [c for _, _, c, _ in self.steps] + [end]
    self.trace.insts = [WaveInst(pc, text, c, cycles[i + 1] - c, kind) for i, (pc, text, c, kind) in enumerate(self.steps)]
    return self.trace

class _Mapper:
  """Walks one shader engine's packets, following each traced wave through the code."""
  def __init__(self, code: list[CodeLine], selected: tuple[int, int, int] | None) -> None:
    bad = next((c for c in code if c.size <= 0), None)
    if bad is not None: raise SQTTError(f"code line {bad.text!r} at PC {bad.pc:#x} has size {bad.size}")
    self.lines = {c.pc: c for c in code}
    self.entry = code[0].pc if code else 0
    self.selected = selected
    self.live: dict[tuple[int, int, int, int], _LiveWave] = {}
    self.done: list[WaveTrace] = []

  def packet(self, n: int, t: int, p: Packet) -> None:
    if p.type == T["LAYOUT_HEADER"] and self.selected is None: self.selected = (0, 0, p.field("simd"))
    elif p.type == T["WAVESTART"]: self.start(n, t, p)
    elif p.type == T["WAVEEND"]: self.end(n, t, p)
    elif p.type == T["INST"] and p.field("op") in OTHER_SIMD_OPS: return
    elif p.type in _TOKEN_TYPES: self.step(n, t, p.field("wave"), p)
    elif p.type == T["IMMEDIATE_MASK"]:
      mask = p.field("mask")
      for slot in range(16):
        if mask >> slot & 1: self.step(n, t, slot, p)

  def start(self, n: int, t: int, p: Packet) -> None:
    key = (p.field("sa"), p.field("wgp"), p.field("simd"), p.field("wave"))
    if key in self.live: raise SQTTError(f"packet {n} (cycle {t}): WAVESTART for wave slot {key[3]} of sa {key[0]} wgp {key[1]} "
                                         f"simd {key[2]}, which is still running")
    self.live[key] = _LiveWave(WaveTrace(0, key[1] | key[0] << 3, key[2], key[3], t, t), self.entry, [])

  def end(self, n: int, t: int, p: Packet) -> None:
    key = (p.field("sa"), p.field("wgp"), p.field("simd"), p.field("wave"))
    w = self.live.pop(key, None)
    if w is None: raise SQTTError(f"packet {n} (cycle {t}): WAVEEND for wave slot {key[3]} of sa {key[0]} wgp {key[1]} simd {key[2]} "
                                  "with no WAVESTART")
    self.done.append(w.finish(t))

  def step(self, n: int, t: int, slot: int, p: Packet) -> None:
    sa, wgp, simd = self.selected or (0, 0, 0)
    w = self.live.get((sa, wgp, simd, slot))
    if w is None: raise SQTTError(f"packet {n} (cycle {t}): {p.name} for wave slot {slot} (sa {sa} wgp {wgp} simd {simd}) with no WAVESTART")
    pc = w.pc
    while (line := self.lines.get(pc)) is not None and line.mnemonic in NO_TOKEN: pc += line.size
    where = f"packet {n} (cycle {t}): {p.name} for wave slot {slot}"
    if line is None: raise SQTTError(f"{where}: its PC {pc:#x} is outside the kernel's code")
    if line.mnemonic in ENDS: raise SQTTError(f"{where}: the wave is at {line.text} (PC {pc:#x})")
    jump = p.field("op") if p.type == T["INST"] and p.field("op") in (INST_OP["JUMP"], INST_OP["JUMP_NO"]) else None
    if line.is_branch != (jump is not None):
      raise SQTTError(f"{where}: PC {pc:#x} is {line.text!r}, " + ("a branch without a JUMP/JUMP_NO token" if line.is_branch else
                                                                      "not a branch, but the token is a JUMP"))
    w.steps.append((pc, line.text, t, inst_kind(line.mnemonic)))
    w.pc = line.target if jump == INST_OP["JUMP"] and line.target is not None else pc + line.size

def wave_traces(data: bytes, code: list[CodeLine], strict: bool = True, selected: tuple[int, int, int] | None = None) -> list[WaveTrace]:
  """The waves of one shader engine's trace with the instructions traced for each, mapped onto `code` (code_listing).
  Instruction tokens belong to the wave slot on the selected (shader array, WGP, SIMD): `selected`, by default SIMD
  LAYOUT_HEADER.simd of shader array 0, WGP 0. Each WaveInst's duration runs to the wave's next traced instruction,
  the last one's to its WAVEEND. SQTTError names the packet and the wave of a token with no started wave, a PC
  outside the code, a branch without a JUMP/JUMP_NO token. strict=False accepts a stream cut off at its end (waves
  still running end at the last packet's cycle); strict=True also rejects waves with no WAVEEND. Waves come in the
  order they ended (the ones cut off last); WaveTrace.se is 0 (the caller knows which shader engine it read)."""
  m = _Mapper(code, selected)
  t = 0
  for n, (t, p) in enumerate(timeline(decode(data, strict=strict))): m.packet(n, t, p)
  if m.live and strict:
    sa, wgp, simd, slot = next(iter(m.live))
    raise SQTTError(f"wave slot {slot} of sa {sa} wgp {wgp} simd {simd} (and {len(m.live) - 1} more) has no WAVEEND")
  return m.done + [w.finish(t) for w in m.live.values()]
