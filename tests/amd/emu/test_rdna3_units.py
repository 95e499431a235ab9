"""Per-instruction-class unit tests of the RDNA3 emulator: short sequences assembled by llvm-mc-19 (an assembler
independent of the emulator's decoder), run on one wave with hand-set registers, checked against hand-computed values."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from rdna3_harness import TestMemory
from hypothesis import example, given, settings
from hypothesis import strategies as st

from plugrad_amd.mock.rdna3 import alu, isa
from plugrad_amd.mock.rdna3.compile import ENDPGM, Unimplemented
from plugrad_amd.mock.rdna3.decode import decode_one
from plugrad_amd.mock.rdna3.disasm import normalize, text
from plugrad_amd.mock.rdna3.emulator import Program, _run_wave
from plugrad_amd.mock.rdna3.wave import Wave

MC = "llvm-mc-19"
pytestmark = pytest.mark.skipif(shutil.which(MC) is None, reason="needs llvm-mc-19 (make sysdeps)")
F = lambda x: int(np.array(x, np.float32).view(np.uint32))
H = lambda x: int(np.array(x, np.float16).view(np.uint16))


def assemble(asm: str) -> bytes:
  """Assemble with llvm-mc into an object file (so branch labels get resolved) and return its .text bytes."""
  with tempfile.TemporaryDirectory() as d:
    obj = Path(d) / "a.o"
    subprocess.run([MC, "-arch=amdgcn", "-mcpu=gfx1100", "-filetype=obj", "-o", str(obj)], input=asm, capture_output=True, text=True,
                   check=True)
    data = obj.read_bytes()
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
  secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
  names = secs[shstrndx][4]
  for sh in secs:
    if data[names + sh[0]:].startswith(b".text\0"): return data[sh[4]:sh[4] + sh[5]]
  raise AssertionError("no .text in the assembled object")


def run_asm(asm: str, s: dict[int, int] | None = None, v: dict[int, object] | None = None, exec_mask: int = 0xFFFFFFFF,
            mem: TestMemory | None = None, lds: int = 256, scratch: int = 0) -> Wave:
  """Assemble `asm` + s_endpgm into test memory and run it on one wave with the given SGPRs/VGPRs."""
  mem = mem or TestMemory()
  base = mem.alloc(4096, assemble(asm + "\ns_endpgm\n").ljust(4096, b"\0"))
  w = Wave(32, mem, np.zeros(lds, np.uint8), scratch, "unit", 0)
  w.code_base = base
  w.set_mode(0xF0)
  for k, x in (s or {}).items(): w.s[k] = x & 0xFFFFFFFF
  for k, x in (v or {}).items(): w.v[k] = np.broadcast_to(np.asarray(x).astype(np.int64).astype(np.uint32), (32,))
  w.set_exec(exec_mask)
  with np.errstate(all="ignore"):
    assert _run_wave(w, Program(mem, base, "unit"), [10_000]) == ENDPGM
  return w


LANE = np.arange(32)


# ------------------------------------------------------------------ scalar ALU

def test_sop2_carry_chain_and_scc():
  w = run_asm("s_add_u32 s0, s1, s2\ns_addc_u32 s3, 0, 0\ns_sub_u32 s4, 1, 2\ns_subb_u32 s5, 5, 0", s={1: 0xFFFFFFFF, 2: 2})
  assert (w.s[0], w.s[3], w.s[4], w.s[5]) == (1, 1, 0xFFFFFFFF, 4)


def test_sop2_shifts_bitfields_minmax():
  w = run_asm("""s_lshl_b64 s[0:1], s[2:3], 36
s_bfe_u32 s4, s5, 0xc0008
s_bfe_i32 s6, s7, 0x40000
s_min_i32 s8, -5, 3
s_max_u32 s9, -5, 3
s_mul_hi_u32 s10, s11, s11
s_pack_ll_b32_b16 s12, s13, s14
s_cselect_b32 s15, 7, 9
s_ashr_i32 s16, s17, 4""", s={2: 0x1234, 3: 0xFF, 5: 0xABCD1234, 7: 0xC, 11: 0x80000001, 13: 0x1111AAAA, 14: 0x2222BBBB, 17: 0x80000000})
  assert (w.s[0], w.s[1]) == (0, 0x12340)
  assert w.s[4] == 0xD12 and w.s[6] == 0xFFFFFFFC
  assert w.s[8] == 0xFFFFFFFB and w.s[9] == 0xFFFFFFFB
  assert w.s[10] == (0x80000001 * 0x80000001) >> 32
  assert w.s[12] == 0xBBBBAAAA and w.s[15] == 7 and w.s[16] == 0xF8000000  # s_cselect saw SCC=1 from s_max_u32 (S0 >= S1)


def test_sop1_bit_ops_and_saveexec():
  w = run_asm("""s_not_b32 s0, s10
s_brev_b32 s1, 1
s_ctz_i32_b32 s2, 0x50
s_clz_i32_u32 s3, 0x50
s_bcnt1_i32_b32 s4, s10
s_sext_i32_i8 s5, 0x80
s_ctz_i32_b32 s6, 0
s_and_saveexec_b32 s7, s11""", s={10: 0xF0F0, 11: 0x0000FFFF})
  assert w.s[0] == 0xFFFF0F0F and w.s[1] == 0x80000000 and w.s[2] == 4 and w.s[3] == 25
  assert w.s[4] == 8 and w.s[5] == 0xFFFFFF80 and w.s[6] == 0xFFFFFFFF
  assert w.s[7] == 0xFFFFFFFF and w.s[126] == 0xFFFF and w.scc == 1 and list(w.em) == [True] * 16 + [False] * 16


def test_sopc_and_sopk():
  w = run_asm("s_cmp_lt_i32 -1, 1\ns_cselect_b32 s0, 1, 0\ns_cmp_lt_u32 -1, 1\ns_cselect_b32 s1, 1, 0\n"
              "s_bitcmp1_b32 s9, 3\ns_cselect_b32 s2, 1, 0\ns_movk_i32 s3, 0x8000\ns_addk_i32 s4, 0xfffe\ns_cmpk_eq_u32 s4, 3\n"
              "s_cselect_b32 s5, 1, 0", s={9: 8, 4: 5})
  assert (w.s[0], w.s[1], w.s[2], w.s[3], w.s[4], w.s[5]) == (1, 0, 1, 0xFFFF8000, 3, 1)


def test_sopp_branches():
  w = run_asm("s_mov_b32 s0, 0\nloop:\ns_add_u32 s0, s0, 1\ns_cmp_lt_u32 s0, 5\ns_cbranch_scc1 loop\ns_branch end\ns_mov_b32 s0, 99\nend:")
  assert w.s[0] == 5


# ------------------------------------------------------------------ vector ALU

def test_vop1_conversions_and_transcendentals():
  w = run_asm("""v_cvt_f32_i32 v1, v0
v_cvt_i32_f32 v2, v10
v_cvt_u32_f32 v3, v11
v_rcp_f32 v4, 4.0
v_bfrev_b32 v5, 1
v_clz_i32_u32 v6, 0
v_cvt_f16_f32 v7, v12
v_fract_f32 v8, -0.5
v_frexp_exp_i32_f32 v9, v13
v_frexp_mant_f32 v14, v13
v_sqrt_f32 v15, 4.0
v_exp_f32 v16, 4.0
v_log_f32 v17, 4.0""", v={0: -LANE, 10: [F(3e9)] * 16 + [F(float("nan"))] * 16, 11: F(-7.5), 12: F(65520.0), 13: F(12.0)})
  assert list(w.v[1].view(np.float32)) == list(-LANE.astype(np.float32))
  assert list(w.v[2]) == [0x7FFFFFFF] * 16 + [0] * 16
  assert w.v[3][0] == 0 and w.v[4].view(np.float32)[0] == 0.25 and w.v[5][0] == 0x80000000 and w.v[6][0] == 0xFFFFFFFF
  assert w.v[7][0] == H(np.inf)  # 65520 rounds to inf in half
  assert w.v[8].view(np.float32)[0] == 0.5 and w.v[9][0] == 4 and w.v[14].view(np.float32)[0] == 0.75
  assert w.v[15].view(np.float32)[0] == 2.0 and w.v[16].view(np.float32)[0] == 16.0 and w.v[17].view(np.float32)[0] == 2.0


def test_vop2_carry_cndmask_and_exec_masking():
  w = run_asm("""v_add_co_u32 v2, vcc_lo, v0, v1
v_add_co_ci_u32_e32 v3, vcc_lo, 0, v4, vcc_lo
v_cndmask_b32_e32 v5, 1, v6, vcc_lo
v_mul_u32_u24_e32 v7, 0x1000001, v0
v_fmac_f32_e32 v8, 2.0, v9
v_fmamk_f32 v10, v9, 0x40400000, v8""", v={0: LANE, 1: 0xFFFFFFFF, 4: 10, 6: 77, 8: F(1.0), 9: F(3.0), 10: 1234}, exec_mask=0x0000FFFF)
  # lane 0: 0 + 0xffffffff = 0xffffffff no carry; lanes >= 1 carry
  assert w.v[2][0] == 0xFFFFFFFF and w.v[2][1] == 0 and w.v[3][0] == 10 and w.v[3][1] == 11
  assert w.s[106] == 0  # second add consumed the carries and produced none
  assert list(w.v[5][:2]) == [1, 1]
  assert w.v[7][3] == 3 and w.v[8].view(np.float32)[0] == 7.0 and w.v[10].view(np.float32)[0] == 16.0
  assert (w.v[2][16:] == 0).all() and (w.v[10][16:] == 1234).all()  # inactive lanes keep their values


def test_vop3_integer_ops():
  w = run_asm("""v_mad_u64_u32 v[2:3], s0, v0, v1, v[4:5]
v_perm_b32 v6, v7, v8, 0x05040100
v_bfe_i32 v9, v10, 4, 8
v_alignbit_b32 v11, v7, v8, 8
v_lshl_add_u32 v12, v0, 2, 5
v_mul_hi_i32 v13, -2, v1
v_lshlrev_b64 v[14:15], 40, v[4:5]
v_med3_i32 v16, 5, -3, v0
v_mbcnt_lo_u32_b32 v17, -1, 0""", v={0: 0xFFFFFFFF, 1: 0xFFFFFFFF, 4: 0xFFFFFFFF, 5: 0xFFFFFFFF, 7: 0x11223344, 8: 0x55667788,
                                    10: 0x00000F80})
  p = 0xFFFFFFFF * 0xFFFFFFFF + 0xFFFFFFFFFFFFFFFF
  assert (int(w.v[2][0]), int(w.v[3][0])) == (p & 0xFFFFFFFF, (p >> 32) & 0xFFFFFFFF) and w.s[0] == 0xFFFFFFFF  # carry out in all lanes
  assert w.v[6][0] == 0x33447788 and w.v[9][0] == 0xFFFFFFF8 and w.v[11][0] == 0x44556677
  assert w.v[12][0] == 1 and w.v[13][0] == 0 and (int(w.v[14][0]), int(w.v[15][0])) == (0, 0xFFFFFF00)
  assert w.v[16][0] == 0xFFFFFFFF and list(w.v[17]) == list(range(32))


def test_vop3_float_modifiers_and_specials():
  w = run_asm("""v_add_f32_e64 v2, -|v0|, v1
v_mul_f32_e64 v3, v0, v1 clamp
v_mul_f32_e64 v4, v0, v1 mul:2
v_med3_f32 v5, v0, v1, v6
v_fma_f32 v7, v0, v1, 0.15915494
v_cvt_pk_rtz_f16_f32 v8, v9, v10
v_div_fixup_f32 v11, v1, 0, v0
v_ldexp_f32 v12, v0, -3
v_max_f32_e64 v13, v6, v0
v_add_nc_u16 v14, v15, v16 op_sel:[1,0,1]""", v={0: F(-3.0), 1: F(0.5), 6: F(float("nan")), 9: F(1.0009765625 + 2 ** -12), 10: F(-1e6),
                                                 14: 0x0000BEEF, 15: 0x00050000, 16: 0x00000007})
  f = lambda r: float(w.v[r].view(np.float32)[0])
  assert f(2) == -2.5 and f(3) == 0.0 and f(4) == -3.0 and f(5) == 0.5
  assert f(7) == np.float32(-1.5 + np.float64(np.array(0x3E22F983, np.uint32).view(np.float32)))
  assert w.v[8][0] == H(1.0009765625) | (H(-65504.0) << 16)  # toward zero: no round up, and no overflow to -inf
  assert f(11) == -np.inf and f(12) == -0.375 and f(13) == -3.0
  assert w.v[14][0] == (12 << 16) | 0xBEEF  # hi(v15)=5 + lo(v16)=7 written to the high half, low half kept


def test_vop3_div_scale_sets_vcc_for_denormal_quotients():
  w = run_asm("v_div_scale_f32 v2, vcc_lo, v0, v1, v0", v={0: F(1e-30), 1: F(1e20)})
  assert w.s[106] == 0xFFFFFFFF and w.v[2].view(np.float32)[0] == np.float32(1e-30) * np.float32(2.0 ** 64)


def test_vopc_compares_write_vcc_sgpr_and_exec():
  w = run_asm("""v_cmp_lt_f32_e32 vcc_lo, v0, v1
v_cmp_u_f32_e64 s4, v0, v1
v_cmp_class_f32_e64 s5, v0, 0x3
v_cmp_gt_i64_e64 s6, v[2:3], 0
v_cmpx_gt_u32_e32 16, v4""", v={0: [F(float("nan"))] * 8 + [F(1.0)] * 24, 1: F(2.0), 2: 0, 3: [0xFFFFFFFF] * 4 + [0] * 28, 4: LANE})
  assert w.s[106] == 0xFFFFFF00 and w.s[4] == 0xFF and w.s[5] == 0xFF
  assert w.s[6] == 0 and w.s[126] == 0xFFFF


def test_vop3p_packed_half_and_mix():
  w = run_asm("""v_pk_add_f16 v2, v0, v1 op_sel:[1,0] op_sel_hi:[0,1]
v_pk_fma_f16 v3, v0, v1, v0 neg_lo:[1,0,0] neg_hi:[0,0,1]
v_fma_mix_f32 v4, v0, v1, v5 op_sel_hi:[1,1,0]
v_dot2_f32_f16 v6, v0, v1, v5""", v={0: H(2.0) | (H(3.0) << 16), 1: H(0.5) | (H(-4.0) << 16), 5: F(10.0)})
  halves = lambda r: (float(np.array(w.v[r][0] & 0xFFFF, np.uint16).view(np.float16)), float(np.array(w.v[r][0] >> 16, np.uint16).view(np.float16)))
  assert halves(2) == (3.0 + 0.5, 2.0 + -4.0)
  assert halves(3) == (-2.0 * 0.5 + 2.0, 3.0 * -4.0 - 3.0)
  assert w.v[4].view(np.float32)[0] == 2.0 * 0.5 + 10.0 and w.v[6].view(np.float32)[0] == 2.0 * 0.5 + 3.0 * -4.0 + 10.0


def test_vopd_reads_all_sources_before_writing():
  w = run_asm("v_dual_mov_b32 v4, v1 :: v_dual_mov_b32 v5, v4\nv_dual_mul_f32 v2, v8, v13 :: v_dual_add_f32 v3, v9, v14",
              v={1: 2, 4: 1, 8: F(3.0), 13: F(4.0), 9: F(3.0), 14: F(4.0)})
  assert (w.v[4][0], w.v[5][0]) == (2, 1) and w.v[2].view(np.float32)[0] == 12.0 and w.v[3].view(np.float32)[0] == 7.0


def test_readfirstlane_readlane_writelane():
  w = run_asm("v_readfirstlane_b32 s0, v0\nv_readlane_b32 s1, v0, 7\nv_writelane_b32 v1, s2, 3", v={0: LANE * 10, 1: 5}, s={2: 42},
              exec_mask=0xFFFFFFF0)
  assert w.s[0] == 40 and w.s[1] == 70 and w.v[1][3] == 42 and w.v[1][4] == 5


# ------------------------------------------------------------------ memory

def test_smem_and_global_loads_stores():
  mem = TestMemory()
  buf = mem.put(np.arange(128, dtype=np.uint32) | 0x80)
  w = run_asm("""s_load_b64 s[4:5], s[0:1], 0x8
global_load_b32 v2, v0, s[0:1] offset:-4
global_load_i8 v3, v0, s[0:1]
global_load_u8 v4, v0, s[0:1]
global_load_d16_hi_b16 v5, v0, s[0:1]
v_add_nc_u32 v6, 1000, v0
global_store_b32 v0, v6, s[0:1] offset:128
s_waitcnt vmcnt(0)
global_load_b64 v[8:9], v[10:11], off""", s={0: buf & 0xFFFFFFFF, 1: buf >> 32},
              v={0: 4 * (LANE + 1), 5: 0x1234, 10: (buf + 128 + 4 * (LANE + 1)) & 0xFFFFFFFF, 11: (buf + 128) >> 32}, mem=mem)
  assert (w.s[4], w.s[5]) == (0x82, 0x83)
  assert list(w.v[2]) == list(np.arange(32) | 0x80)
  assert w.v[3][0] == 0xFFFFFF81 and w.v[4][0] == 0x81 and w.v[5][0] == (0x81 << 16) | 0x1234
  assert list(w.v[8][:3]) == [1004, 1008, 1012] and list(w.v[9][:3]) == [1008, 1012, 1016]


def test_lds_ops_and_atomics():
  w = run_asm("""v_lshlrev_b32 v1, 2, v0
ds_store_b32 v1, v0
ds_load_2addr_b32 v[2:3], v1 offset1:1
v_mov_b32 v4, 0
ds_add_u32 v4, v5 offset:200
ds_bpermute_b32 v6, v7, v0
ds_store_b16 v1, v8 offset:256
ds_load_u16 v9, v1 offset:256
s_waitcnt lgkmcnt(0)
ds_load_b32 v10, v4 offset:200""", v={0: LANE, 5: 2, 7: 4 * (31 - LANE), 8: 0x12345678}, lds=512)
  assert list(w.v[2]) == list(LANE) and list(w.v[3][:31]) == list(LANE[1:]) and list(w.v[6]) == list(31 - LANE)
  assert w.v[9][0] == 0x5678 and w.v[10][0] == 64


def test_lds_out_of_range_is_an_error():
  with pytest.raises(Exception, match="outside the workgroup's 256 bytes of LDS"):
    run_asm("ds_load_b32 v1, v0", v={0: 1024})


def test_scratch_is_private_per_lane():
  w = run_asm("scratch_store_b32 off, v0, off offset:8\nscratch_load_b32 v1, off, off offset:8\nscratch_store_b32 v2, v0, off\n"
              "scratch_load_b32 v3, v2, off", v={0: LANE * 3, 2: 16}, scratch=64)
  assert list(w.v[1]) == list(LANE * 3) and list(w.v[3]) == list(LANE * 3)


def test_unknown_instruction_raises_naming_opcode():
  with pytest.raises(Unimplemented, match=r"kernel unit: unimplemented RDNA3 instruction .*\(VOP3 opcode 0x20c\) at offset 0x0"):
    run_asm("v_cubeid_f32 v0, v1, v2, v3")


# ------------------------------------------------------------------ decoder tables vs llvm

def _disassemble(raws: list[bytes]) -> list[str]:
  """Disassemble each byte string (one llvm-mc run, one input line each); '<invalid>' where llvm rejects the bits."""
  r = subprocess.run([MC, "-arch=amdgcn", "-mcpu=gfx1100", "-disassemble", "-show-encoding"],
                     input="\n".join(" ".join(f"0x{b:02x}" for b in raw) for raw in raws), capture_output=True, text=True)
  failed: dict[int, int] = {}
  for m in re.finditer(r"<stdin>:(\d+):\d+: warning: invalid instruction encoding", r.stderr):
    failed[int(m.group(1)) - 1] = failed.get(int(m.group(1)) - 1, 0) + 1
  outs = [(ln.split(";")[0].strip(), len(re.search(r"encoding: \[([^\]]*)\]", ln).group(1).split(",")))
          for ln in r.stdout.splitlines() if "encoding:" in ln]
  res, k = [], 0
  for i, raw in enumerate(raws):
    got, first = 4 * failed.get(i, 0), None
    while got < len(raw):
      first = first or outs[k][0]
      got += outs[k][1]
      k += 1
    res.append("<invalid>" if i in failed or first is None else first)
  return res


def _names_via_llvm(patterns: list[list[bytes]]) -> list[str]:
  """For each op, the first encoding pattern llvm accepts decides its mnemonic."""
  names = ["<invalid>"] * len(patterns[0])
  for pat in patterns:
    todo = [i for i, n in enumerate(names) if n == "<invalid>"]
    if not todo: break
    for i, n in zip(todo, _disassemble([pat[i] for i in todo])): names[i] = n.split()[0] if n != "<invalid>" else n
  return names


@pytest.mark.parametrize("enc", ["SOP2", "SOP1", "SOPC", "SOPK", "VOP1", "VOP2", "VOPC", "VOP3P", "DS", "GLOBAL"])
def test_opcode_tables_match_llvm(enc):
  """Every opcode in the emulator's tables disassembles, through llvm-mc, to the same mnemonic."""
  table = {"SOP2": isa.SOP2, "SOP1": isa.SOP1, "SOPC": isa.SOPC, "SOPK": isa.SOPK, "VOP1": isa.VOP1, "VOP2": isa.VOP2, "VOPC": isa.VOPC,
           "VOP3P": isa.VOP3P, "DS": isa.DS, "GLOBAL": isa.GLOBAL}[enc]
  enc_word = {"SOP2": lambda op: [(0b10 << 30) | (op << 23) | (1 << 16) | (2 << 8) | 3],
              "SOP1": lambda op: [(0x17D << 23) | (2 << 16) | (op << 8) | 4], "SOPC": lambda op: [(0x17E << 23) | (op << 16) | (2 << 8) | 3],
              "SOPK": lambda op: [(0xB << 28) | (op << 23) | (1 << 16) | 5], "VOP1": lambda op: [(0x3F << 25) | (2 << 17) | (op << 9) | 258],
              "VOP2": lambda op: [(op << 25) | (2 << 17) | (3 << 9) | 258] + ([0x3F800000] if op in (44, 45, 55, 56) else []),
              "VOPC": lambda op: [(0x3E << 25) | (op << 17) | (3 << 9) | 258],
              "VOP3P": lambda op: [(0xCC << 24) | (op << 16) | 8, 256 + 16 | ((256 + 24) << 9) | ((256 + 0) << 18)],
              "DS": lambda op: [(0x36 << 26) | (op << 18), (4 << 24) | (2 << 16) | (2 << 8) | 1],
              "GLOBAL": lambda op: [(0x37 << 26) | (op << 18) | (2 << 16), (4 << 24) | (124 << 16) | (4 << 8) | 2]}[enc]
  ops = sorted(table)
  pack = lambda words: b"".join(struct.pack("<I", x) for x in words)
  raws = [pack(enc_word(op)) for op in ops]
  # second chance with the optional fields cleared (llvm rejects e.g. a v_nop with operands or ds_add with a vdst)
  clear = {"VOP1": 0xFE01FE00}.get(enc, 0xFFFFFFFF)
  masks = [0xFF0000FF, 0x0000FFFF] if enc == "DS" else [0x0003FFFF]
  alts = [[pack([enc_word(op)[0] & clear] + [w & m for w in enc_word(op)[1:]]) for op in ops] for m in masks]
  names = _names_via_llvm([raws, *alts])
  ours = [decode_one(r + bytes(8), 0).name for r in raws]
  assert [n.removesuffix("_e32") for n in names] == ours


def test_vop3_table_matches_llvm():
  ops = sorted(isa.VOP3)
  enc = lambda op, src1, src2, vdst: struct.pack("<II", (0x35 << 26) | (op << 16) | (106 << 8 if op in isa.VOP3SD else 0) | vdst,
                                                 258 | (src1 << 9) | (src2 << 18))
  names = _names_via_llvm([[enc(op, *f) for op in ops] for f in ((259, 260, 1), (259, 0, 1), (259, 0, 0), (259, 0, 126), (0, 0, 1))])
  mine = [decode_one(enc(op, 259, 260, 1), 0) for op in ops]
  for g, m in zip(names, mine):
    assert g.removesuffix("_e64") == m.name, (g, text(m))


# ------------------------------------------------------------------ float semantics (hypothesis against exact rationals)

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def _round32(q: Fraction) -> np.float32:
  """Correctly rounded float32 of an exact rational (via float64 for the easy cases, exact tie checks otherwise)."""
  f = np.float32(float(q))
  lo, hi = np.nextafter(f, np.float32(-np.inf)), np.nextafter(f, np.float32(np.inf))
  best = min((f, lo, hi), key=lambda c: (abs(Fraction(float(c)) - q) if np.isfinite(c) else Fraction(10 ** 60),
                                          int(np.array(c, np.float32).view(np.uint32)) & 1))
  return best


@settings(max_examples=300, deadline=None)
@given(finite32, finite32, finite32)
@example(5.0, 2580019603832832.0, 1.0)  # a*b is a float32 midpoint and c is under half a float64 ulp of it: rounds up
@example(1.0, 16777217.0 - 1, 0.5)
def test_fma32_is_correctly_rounded(a, b, c):
  with np.errstate(all="ignore"):
    r = alu.fma32(np.float32(a), np.float32(b), np.float32(c))
  exact = Fraction(a) * Fraction(b) + Fraction(c)
  if abs(float(exact)) >= 3.4e38: return  # overflow region: not interesting here
  want = _round32(exact)
  assert r == want or (r == 0 and want == 0)


# decoded so errors can name them, refused on purpose (no meaning in a compute kernel the emulator runs)
REFUSED = {"s_version", "s_setkill", "s_sethalt", "s_wait_event", "s_code_end"}


def test_every_decodable_instruction_has_semantics():
  """The opcode tables list exactly what the emulator runs: each entry compiles with some legal operand set."""
  from plugrad_amd.mock.rdna3.compile import compile_inst
  from plugrad_amd.mock.rdna3.decode import Inst
  base = dict(sdst=1, ssrc0=2, ssrc1=3, simm16=1 | (31 << 11), vdst=1, src0=258, src1=259, src2=260, vsrc1=259, abs=0, neg=0, opsel=0,
              clamp=0, omod=0, neg_hi=0, opsel_hi=3, sdata=0, sbase=0, offset=0, soffset=124, glc=0, dlc=0, slc=0, offset0=0, offset1=0,
              gds=0, vaddr=0, data0=0, data1=0, data=0, saddr=124, sve=0)
  tables = {"SOP1": isa.SOP1, "SOP2": isa.SOP2, "SOPC": isa.SOPC, "SOPK": isa.SOPK, "SOPP": isa.SOPP, "SMEM": isa.SMEM, "VOP1": isa.VOP1,
            "VOP2": isa.VOP2, "VOPC": isa.VOPC, "VOP3": isa.VOP3, "VOP3P": isa.VOP3P, "DS": isa.DS, "GLOBAL": isa.GLOBAL, "FLAT": isa.FLAT,
            "SCRATCH": isa.SCRATCH, "MUBUF": isa.MUBUF}
  missing = []
  for enc, table in tables.items():
    for op, name in table.items():
      if name in REFUSED: continue
      e = "VOP3SD" if enc == "VOP3" and op in isa.VOP3SD else enc
      for operands in ({}, {"src1": 3, "src2": 4}, {"src0": 3, "src1": 4}):  # lane selects / lane numbers must be SGPRs
        inst = Inst(e, op, name, **{**base, **operands})
        inst.lit, inst.addr, inst.size = 0x3F800000, 0, 8
        try:
          compile_inst(inst, "coverage")
          break
        except Unimplemented:
          continue
      else:
        missing.append(f"{enc} {name}")
  assert missing == []


def test_sign_bit_counts_dot2acc_pk_fmac_and_lds_float_atomics():
  w = run_asm("""s_cls_i32 s0, s1
s_cls_i32 s2, -1
v_cls_i32 v2, v0
v_dot2acc_f32_f16 v3, v4, v5
v_pk_fmac_f16 v6, v4, v5
v_mov_b32 v7, 0
ds_max_f32 v7, v8
ds_min_f32 v7, v8 offset:4
s_waitcnt lgkmcnt(0)
ds_load_2addr_b32 v[9:10], v7 offset1:1""", s={1: 0x40000000},
              v={0: [0x40000000, 0xFFFF0000] * 16, 3: F(1.0), 4: H(2.0) | (H(3.0) << 16), 5: H(0.5) | (H(-4.0) << 16), 6: H(1.0) | (H(1.0) << 16),
                 8: F(1.0) * 0 + np.array([F(x) for x in np.linspace(-5, 26, 32)])})
  assert w.s[0] == 1 and w.s[2] == 0xFFFFFFFF and list(w.v[2][:2]) == [1, 16]  # index of the first bit differing from the sign
  assert w.v[3].view(np.float32)[0] == 1.0 + 2.0 * 0.5 + 3.0 * -4.0
  assert w.v[6][0] == H(2.0 * 0.5 + 1.0) | (H(3.0 * -4.0 + 1.0) << 16)
  assert w.v[9].view(np.float32)[0] == 26.0 and w.v[10].view(np.float32)[0] == -5.0  # LDS started at 0: max 26, min -5


def test_s_trap_is_an_error():
  with pytest.raises(Exception, match="s_trap 0x2"):
    run_asm("s_trap 2")


def test_vop3_fmac_accumulates_into_its_destination():
  """Regression: v_fmac_f32_e64 (clang uses it for SGPR operands) reads the accumulator from vdst, not src2."""
  w = run_asm("v_fmac_f32_e64 v0, s1, s2\nv_fmac_f32_e64 v0, s3, -v1", s={1: F(2.0), 2: F(3.0), 3: F(0.5)}, v={0: F(1.0), 1: F(4.0)})
  assert w.v[0].view(np.float32)[0] == 1.0 + 2.0 * 3.0 - 0.5 * 4.0


def test_dpp16_and_dpp8_lane_patterns():
  w = run_asm("""v_mov_b32_dpp v1, v0 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf
v_mov_b32 v2, 7
v_mov_b32_dpp v2, v0 row_shr:1 row_mask:0xf bank_mask:0xf
v_mov_b32 v3, 7
v_mov_b32_dpp v3, v0 row_shl:2 row_mask:0xf bank_mask:0xf bound_ctrl:1
v_add_f32_dpp v4, v5, v5 row_mirror row_mask:0xf bank_mask:0xf
v_mov_b32_dpp v6, v0 dpp8:[7,6,5,4,3,2,1,0]
v_mov_b32 v7, 9
v_mov_b32_dpp v7, v0 row_xmask:1 row_mask:0x1 bank_mask:0xf""", v={0: LANE, 5: [F(float(i)) for i in range(32)]})
  assert list(w.v[1][:4]) == [1, 0, 3, 2]
  assert list(w.v[2][:3]) == [7, 0, 1] and w.v[2][16] == 7  # lane 0 of each row has no source: not written
  assert list(w.v[3][13:17]) == [15, 0, 0, 18]  # bound_ctrl: out-of-row sources read 0
  assert list(w.v[4].view(np.float32)[:2]) == [15.0 + 0.0, 14.0 + 1.0]
  assert list(w.v[6][:8]) == [7, 6, 5, 4, 3, 2, 1, 0] and w.v[6][8] == 15
  assert list(w.v[7][:2]) == [1, 0] and w.v[7][16] == 9  # row_mask 0x1: the second row is not written


def test_sin_cos_full_range_examples_from_the_isa_guide():
  w = run_asm("v_sin_f32 v1, v0\nv_cos_f32 v2, v0", v={0: [0xFF800000, 0xFF7FFFFF, 0x80000000, 0x3E800000, 0x7F800000] + [F(0.125)] * 27})
  assert list(w.v[1][1:4]) == [0x00000000, 0x80000000, 0x3F800000]
  assert np.isnan(w.v[1].view(np.float32)[[0, 4]]).all()
  assert w.v[1].view(np.float32)[5] == np.float32(np.sqrt(0.5)) and w.v[2].view(np.float32)[5] == np.float32(np.sqrt(0.5))
  assert w.v[2].view(np.float32)[1] == 1.0


MODIFIER_LINES = """v_pk_add_f16 v1, v2, v3 op_sel:[1,0] op_sel_hi:[0,1]
v_pk_fma_f16 v3, v0, v1, v0 neg_lo:[1,0,0] neg_hi:[0,0,1]
v_pk_mul_f16 v3, v0, s1 clamp
v_fma_mix_f32 v4, v0, v1, v5 op_sel_hi:[1,1,0]
v_dot2_f32_f16 v6, v0, v1, v5
v_add_f32_e64 v2, -|v0|, v1
v_mul_f32_e64 v3, v0, v1 clamp
v_mul_f32_e64 v4, v0, v1 mul:2
v_add_nc_u16 v14, v15, v16 op_sel:[1,0,1]
v_cmp_lt_f32_e64 s4, |v0|, 0.5
v_cndmask_b32_e64 v1, v2, -v3, s5
ds_load_2addr_b32 v[2:3], v1 offset1:1
ds_store_b64 v1, v[2:3] offset:16
global_load_b32 v2, v0, s[0:1] offset:-4
global_atomic_add_u32 v1, v0, v2, s[2:3] glc
scratch_store_b32 off, v0, off offset:8
s_load_b64 s[4:5], s[0:1], 0x8
v_dual_fmaak_f32 v0, v1, v2, 0x3f800000 :: v_dual_mov_b32 v3, 1.0
s_cmpk_lg_u32 s4, 0x3e6
v_mov_b32_dpp v1, v0 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf
v_mov_b32_dpp v3, v0 row_shl:2 row_mask:0xf bank_mask:0xf bound_ctrl:1
v_add_f32_dpp v4, v5, v5 row_mirror row_mask:0xf bank_mask:0xf
v_mov_b32_dpp v6, v0 dpp8:[7,6,5,4,3,2,1,0]
v_mov_b32_dpp v7, v0 row_xmask:1 row_mask:0x1 bank_mask:0xf fi:1
v_cmp_lt_f32 vcc_lo, v1, v2 row_half_mirror row_mask:0xf bank_mask:0x3"""


def test_disassembly_text_with_modifiers_matches_llvm():
  """Operand modifiers (abs/neg/op_sel/clamp/omod/offsets/glc) print as llvm-mc prints them."""
  out = subprocess.run([MC, "-arch=amdgcn", "-mcpu=gfx1100", "-show-encoding"], input=MODIFIER_LINES, capture_output=True, text=True,
                       check=True).stdout
  for line in out.splitlines():
    if "encoding:" not in line: continue
    theirs, enc = line.split(";")[0], re.search(r"encoding: \[([^\]]*)\]", line).group(1)
    raw = bytes(int(x, 16) for x in enc.split(","))
    assert text(decode_one(raw + bytes(8), 0)) == normalize(theirs)


def test_permlane_and_swizzle():
  w = run_asm("""v_permlane16_b32 v1, v0, s0, s1
v_permlanex16_b32 v2, v0, s0, s1
ds_swizzle_b32 v3, v0 offset:swizzle(QUAD_PERM,3,2,1,0)
ds_swizzle_b32 v4, v0 offset:swizzle(BITMASK_PERM,"ppppi")
s_waitcnt lgkmcnt(0)""", s={0: 0x76543210, 1: 0xFEDCBA98}, v={0: LANE * 10})
  assert list(w.v[1]) == list(LANE * 10)  # identity selector
  assert list(w.v[2]) == list((LANE ^ 16) * 10)  # the other row
  assert list(w.v[3][:8]) == [30, 20, 10, 0, 70, 60, 50, 40]
  assert list(w.v[4][:4]) == [10, 0, 30, 20]  # xor 1


def test_vgpr_beyond_the_descriptor_count_is_an_error():
  with pytest.raises(Exception, match="beyond the 32 VGPRs"):
    run_asm("v_mov_b32 v40, 1")
