"""SQTT fields and the per-wave mapping (plugrad_amd.sqtt): named-field round trips over hypothesis-generated values,
the encoder's time-gap packets, llvm-objdump listings, the mapping of hand-built packet streams onto a listing (branches
taken and not, skipped s_delay_alu, IMMEDIATE_MASK, other-SIMD tokens), every error it names, and fuzzers showing the
mapper returns traces or raises SQTTError on arbitrary bytes and arbitrary listings."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugrad_amd import sqtt
from plugrad_amd.sqtt import CodeLine, SQTTError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
from fuzz_helpers import bounded

T, OP = sqtt.T, sqtt.INST_OP


@st.composite
def field_packets(draw) -> tuple[int, int, dict[str, int]]:
  t = draw(st.sampled_from(sorted(sqtt.FIELDS)))
  hi_delta = sqtt.max_delta(t)
  delta = draw(st.integers(sqtt.DELTA_BIAS.get(t, 0), hi_delta)) if hi_delta else 0
  fields = {name: draw(st.integers(0, (1 << (hi - lo + 1)) - 1)) for name, (hi, lo) in sqtt.FIELDS[t].items()}
  return t, delta, fields


@given(st.lists(field_packets(), min_size=1, max_size=30))
def test_fields_round_trip(specs: list[tuple[int, int, dict[str, int]]]) -> None:
  got = sqtt.decode(sqtt.encode([sqtt.make(t, d, **f) for t, d, f in specs]))
  assert [(p.type, p.delta, {k: p.field(k) for k in sqtt.FIELDS[p.type]}) for p in got] == specs


def test_field_tables_fit_their_packets() -> None:
  for t, fields in sqtt.FIELDS.items():
    off, width = sqtt.DELTA_FIELD[t]
    used = set(range(sqtt.ID_BITS[t][1])) | set(range(off, off + width))
    for name, (hi, lo) in fields.items():
      bits = set(range(lo, hi + 1))
      assert hi < sqtt.PACKET_BITS[t] and not bits & used, (sqtt.NAMES[t], name)
      used |= bits


def test_known_field_bits() -> None:
  # INST: id 0b010 in bits 2:0, delta 6:4, wave 12:8, op 19:13 -> delta 3, wave 5, op JUMP (3)
  assert sqtt.make(T["INST"], 3, wave=5, op=OP["JUMP"]).bits == 0b010 | 3 << 4 | 5 << 8 | 3 << 13
  # WAVESTART: id 0b01100, delta 6:5, sa 7, simd 9:8, wgp 12:10, wave 17:13
  assert sqtt.make(T["WAVESTART"], 1, sa=1, simd=2, wgp=3, wave=4).bits == 0b01100 | 1 << 5 | 1 << 7 | 2 << 8 | 3 << 10 | 4 << 13


def test_make_rejects_what_does_not_fit() -> None:
  with pytest.raises(SQTTError, match="does not fit"): sqtt.make(T["INST"], wave=32)
  with pytest.raises(SQTTError, match="no field 'op'"): sqtt.make(T["VALUINST"], op=1)
  with pytest.raises(SQTTError, match="no field"): sqtt.make(T["PERF"]).field("wave")


def test_marker_needs_rt_set_and_pl_clear() -> None:
  assert sqtt.make(T["TS_DELTA_OR_MARK"], 7, rt=1).is_marker
  assert not sqtt.make(T["TS_DELTA_OR_MARK"], 7, rt=1, pl=1).is_marker and not sqtt.make(T["TS_DELTA_OR_MARK"], 7).is_marker


KINDS = [T["INST"], T["VALUINST"], T["IMMEDIATE"], T["WAVESTART"], T["WAVEEND"], T["LAYOUT_HEADER"]]


@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.sampled_from(KINDS)), max_size=40))
def test_pack_timed_puts_each_packet_at_its_cycle(events: list[tuple[int, int]]) -> None:
  events = sorted(events)
  packets = sqtt.decode(sqtt.encode(sqtt.pack_timed([(c, t, {}) for c, t in events])))
  timed = [(c, p.type) for c, p in sqtt.timeline(packets) if p.type in KINDS]
  assert timed == events
  assert all(p.type in KINDS or p.name.startswith("TS_DELTA") for p in packets)


def test_pack_timed_gaps() -> None:
  ps = sqtt.pack_timed([(0, T["VALUINST"], {}), (7, T["VALUINST"], {}), (30, T["VALUINST"], {}), (32, T["LAYOUT_HEADER"], {})])
  assert [p.name for p in ps] == ["VALUINST", "VALUINST", "TS_DELTA_SHORT", "VALUINST", "TS_DELTA_OR_MARK", "LAYOUT_HEADER"]
  assert [p.delta for p in ps] == [0, 7, 16, 7, 2, 0]
  with pytest.raises(SQTTError, match="time order"): sqtt.pack_timed([(5, T["VALUINST"], {}), (4, T["VALUINST"], {})])


OBJDUMP = """
/tmp/x.so:\tfile format elf64-amdgpu

Disassembly of section .text:

0000000000001700 <loop>:
\ts_load_b32 s2, s[0:1], 0x18                                // 000000001700: F4000080 F8000018
\ts_waitcnt lgkmcnt(0)                                       // 000000001708: BF89FC07
\ts_delay_alu instid0(VALU_DEP_2)| instskip(NEXT)// 00000000170C: BF870002
\tv_add_nc_u32_e32 v3, s2, v3                                // 000000001710: 4A060602
\ts_cbranch_scc0 65534                                       // 000000001714: BFA1FFFE <loop+0x10>
\ts_endpgm                                                   // 000000001718: BFB00000

0000000000001800 <other>:
\ts_endpgm                                                   // 000000001800: BFB00000
"""


def test_code_listing_from_objdump() -> None:
  code = sqtt.code_listing(OBJDUMP, "loop")
  assert [(c.pc, c.size, c.mnemonic, c.target) for c in code] == [
    (0x0, 8, "s_load_b32", None), (0x8, 4, "s_waitcnt", None), (0xC, 4, "s_delay_alu", None), (0x10, 4, "v_add_nc_u32_e32", None),
    (0x14, 4, "s_cbranch_scc0", 0x10), (0x18, 4, "s_endpgm", None)]
  assert code[1].text == "s_waitcnt lgkmcnt(0)" and sqtt.code_listing(OBJDUMP, "other") == [CodeLine(0, 4, "s_endpgm")]
  with pytest.raises(SQTTError, match="name the kernel"): sqtt.code_listing(OBJDUMP)
  with pytest.raises(SQTTError, match="'nope' is not in"): sqtt.code_listing(OBJDUMP, "nope")


CODE = sqtt.code_listing(OBJDUMP, "loop")


def stream(*events: tuple[int, str, dict[str, int]], header: bool = True) -> bytes:
  ev = [(0, T["LAYOUT_HEADER"], {"layout": 3})] if header else []
  return sqtt.encode(sqtt.pack_timed(ev + [(c, T[name], f) for c, name, f in events]))


def one_wave(slot: int = 2, simd: int = 0, loops: int = 2) -> list[tuple[int, str, dict[str, int]]]:
  at = dict(sa=0, wgp=0, simd=simd, wave=slot)
  ev = [(5, "WAVESTART", at), (6, "INST", dict(wave=slot, op=OP["SMEM_RD"])), (8, "IMMEDIATE", dict(wave=slot))]
  c = 40
  for i in range(loops):
    ev += [(c, "VALUINST", dict(wave=slot)), (c + 1, "INST", dict(wave=slot, op=OP["JUMP"] if i < loops - 1 else OP["JUMP_NO"]))]
    c += 3
  return ev + [(c + 10, "WAVEEND", at)]


def test_mapping_follows_branches_and_skips_s_delay_alu() -> None:
  [w] = sqtt.wave_traces(stream(*one_wave()), CODE)
  assert (w.cu, w.simd, w.slot, w.start, w.end) == (0, 0, 2, 5, 56)
  assert [(i.pc, i.cycle, i.duration, i.kind) for i in w.insts] == [
    (0x0, 6, 2, "SMEM"), (0x8, 8, 32, "WAIT"), (0x10, 40, 1, "VALU"), (0x14, 41, 2, "BRANCH"), (0x10, 43, 1, "VALU"),
    (0x14, 44, 12, "BRANCH")]
  assert w.insts[2].text == "v_add_nc_u32_e32 v3, s2, v3"


def test_waves_on_other_simds_have_no_instructions() -> None:
  other = dict(sa=1, wgp=3, simd=2, wave=2)
  ws = sqtt.wave_traces(stream(*one_wave()[:1], (5, "WAVESTART", other), *one_wave()[1:], (60, "WAVEEND", other)), CODE)
  assert [(w.cu, w.simd, len(w.insts)) for w in ws] == [(0, 0, 6), (3 | 1 << 3, 2, 0)]


def test_selected_simd_comes_from_the_header_or_the_caller() -> None:
  data = sqtt.encode(sqtt.pack_timed([(0, T["LAYOUT_HEADER"], {"layout": 3, "simd": 3})] +
                                     [(c, T[n], f) for c, n, f in one_wave(simd=3)]))
  assert len(sqtt.wave_traces(data, CODE)[0].insts) == 6
  with pytest.raises(SQTTError, match=r"wave slot 2 \(sa 0 wgp 0 simd 1\) with no WAVESTART"): sqtt.wave_traces(data, CODE, selected=(0, 0, 1))


def test_immediate_mask_and_other_simd_ops() -> None:
  ev = [(1, "WAVESTART", dict(wave=0)), (1, "WAVESTART", dict(wave=3)), (2, "INST", dict(wave=0, op=OP["SMEM_RD"])),
        (3, "INST", dict(wave=3, op=OP["SMEM_RD"])), (4, "INST", dict(wave=0, op=0x55)), (9, "IMMEDIATE_MASK", dict(mask=0b1001)),
        (20, "WAVEEND", dict(wave=0)), (21, "WAVEEND", dict(wave=3))]
  ws = sqtt.wave_traces(stream(*ev), CODE)
  assert [[(i.pc, i.cycle) for i in w.insts] for w in ws] == [[(0, 2), (8, 9)], [(0, 3), (8, 9)]]


@pytest.mark.parametrize("events, match", [
  ([(1, "VALUINST", dict(wave=1))], "VALUINST for wave slot 1 .* with no WAVESTART"),
  ([(1, "WAVEEND", dict(wave=1))], "WAVEEND for wave slot 1 .* with no WAVESTART"),
  ([(1, "WAVESTART", dict(wave=1)), (2, "WAVESTART", dict(wave=1))], "still running"),
  ([(1, "WAVESTART", dict(wave=0)), (2, "INST", dict(wave=0, op=OP["JUMP"]))], "not a branch, but the token is a JUMP"),
  ([(1, "WAVESTART", dict(wave=0))] + [(2 + i, "VALUINST", dict(wave=0)) for i in range(4)], "a branch without a JUMP/JUMP_NO token"),
  ([(1, "WAVESTART", dict(wave=0))] + [(2 + i, "VALUINST", dict(wave=0)) for i in range(3)] +
   [(9, "INST", dict(wave=0, op=OP["JUMP_NO"])), (10, "VALUINST", dict(wave=0))], "the wave is at s_endpgm"),
  ([(1, "WAVESTART", dict(wave=0))], "has no WAVEEND"),
])
def test_mapping_errors_name_what_and_where(events, match) -> None:
  with pytest.raises(SQTTError, match=match): sqtt.wave_traces(stream(*events), CODE)


def test_pc_outside_the_code() -> None:
  code = [CodeLine(0, 4, "s_branch 5", target=24)]
  with pytest.raises(SQTTError, match=r"packet 3 \(cycle 3\): VALUINST for wave slot 0: its PC 0x18 is outside"):
    sqtt.wave_traces(stream((1, "WAVESTART", dict(wave=0)), (2, "INST", dict(wave=0, op=OP["JUMP"])), (3, "VALUINST", dict(wave=0))), code)


def test_cut_off_stream_is_accepted_when_not_strict() -> None:
  data = stream(*one_wave()[:-1])
  [w] = sqtt.wave_traces(data + sqtt.encode([sqtt.make(T["TS_DELTA_OR_MARK"], 5)])[:-2], CODE, strict=False)
  assert len(w.insts) == 6 and w.end == w.insts[-1].cycle and w.insts[-1].duration == 0
  with pytest.raises(SQTTError, match="cut off"): sqtt.wave_traces(data + sqtt.encode([sqtt.make(T["TS_DELTA_OR_MARK"], 5)])[:-2], CODE)


MNEMONICS = ["v_add_f32 v0, v1, v2", "s_endpgm", "s_delay_alu instid0(VALU_DEP_1)", "s_waitcnt vmcnt(0)", "s_cbranch_scc0 3",
             "global_load_b32 v1, v0, s[0:1]", "s_barrier", "ds_load_b32 v1, v0"]


@st.composite
def listings(draw) -> list[CodeLine]:
  out, pc = [], 0
  for text in draw(st.lists(st.sampled_from(MNEMONICS), max_size=12)):
    size = draw(st.sampled_from([4, 8, 12, 0]))
    target = draw(st.integers(-16, 64)) * 4 if "branch" in text else None
    out.append(CodeLine(pc, size, text, target))
    pc += size
  return out


TOKENS = st.sampled_from(["INST", "VALUINST", "IMMEDIATE", "WAVESTART", "WAVEEND", "IMMEDIATE_MASK"])


@st.composite
def packet_streams(draw) -> bytes:
  ev = []
  for c, name in enumerate(draw(st.lists(TOKENS, max_size=40))):
    f = {k: draw(st.integers(0, min(3, (1 << (hi - lo + 1)) - 1) if k != "op" else 0x7F)) for k, (hi, lo) in sqtt.FIELDS[T[name]].items()}
    ev.append((c, T[name], f))
  return sqtt.encode(sqtt.pack_timed(ev))


@given(st.one_of(st.binary(max_size=400), packet_streams()), listings(), st.booleans())
def test_fuzz_mapper(data: bytes, code: list[CodeLine], strict: bool) -> None:
  res, err = bounded(lambda: sqtt.wave_traces(data, code, strict=strict), (SQTTError,), len(data) + 1000)
  if err is None:
    for w in res:
      assert all(i.duration >= 0 and i.pc in {c.pc for c in code} for i in w.insts) and w.end >= w.start


@given(st.text(max_size=2000), st.one_of(st.none(), st.text(max_size=8)))
def test_fuzz_code_listing(text: str, kernel: str | None) -> None:
  res, err = bounded(lambda: sqtt.code_listing(text, kernel), (SQTTError,), len(text) + 1000)
  if err is None: assert all(c.size % 4 == 0 and c.size > 0 for c in res)


def test_code_line_of_size_zero_is_an_error_not_a_hang() -> None:
  """Regression: stepping over a size-0 s_delay_alu looped forever."""
  data = stream((1, "WAVESTART", dict(wave=0)), (2, "VALUINST", dict(wave=0)), (3, "WAVEEND", dict(wave=0)))
  with pytest.raises(SQTTError, match="has size 0"): sqtt.wave_traces(data, [CodeLine(0, 0, "s_delay_alu instid0(VALU_DEP_1)")])
