"""Unit tests for the instructions the conformance suite's kernels execute under DEV=MOCK+AMD that the hand-computed
class tests (test_rdna3_units.py) didn't reach (bench/amd_emu_coverage.py lists them): VOP3-form and VOPC compares
(float predicates with NaN, signed/unsigned, 16-bit, f64), 16-bit and 24-bit integer ALU, three-operand min/max,
shift-adds, VOPD pairs, scalar ALU and compares, and the loads. Each runs on one wave (llvm-mc-19 assembles, random
lane values with edge cases) against a numpy oracle written from the ISA guide's one-line definitions."""
from __future__ import annotations

import numpy as np
import pytest
from test_rdna3_units import LANE, run_asm

from rdna3_harness import TestMemory

RNG = np.random.default_rng(7)
U32 = np.uint32


def rand_u32(n: int = 32) -> np.ndarray:
  v = RNG.integers(0, 2**32, n, dtype=np.uint64).astype(U32)
  v[:6] = [0, 1, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0xFFFF]
  return v


def rand_f32(n: int = 32) -> np.ndarray:
  v = (RNG.standard_normal(n) * 8).astype(np.float32)
  v[:8] = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.5, 1.5, -2.0]
  return v


def i32(x: np.ndarray) -> np.ndarray: return x.astype(U32).view(np.int32).astype(np.int64)
def u16(x: np.ndarray) -> np.ndarray: return (x & 0xFFFF).astype(np.int64)
def i16(x: np.ndarray) -> np.ndarray: return (x & 0xFFFF).astype(np.uint16).view(np.int16).astype(np.int64)
def i24(x: np.ndarray) -> np.ndarray: return ((x.astype(np.int64) & 0xFFFFFF) ^ 0x800000) - 0x800000
def mask(b: np.ndarray) -> int: return int(np.packbits(np.asarray(b, bool), bitorder="little").view("<u4")[0])


FCMP = {"eq": lambda a, b: a == b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
        "lg": lambda a, b: (a < b) | (a > b), "neq": lambda a, b: ~(a == b), "nge": lambda a, b: ~(a >= b),
        "nle": lambda a, b: ~(a <= b), "ngt": lambda a, b: ~(a > b), "nlt": lambda a, b: ~(a < b),
        "o": lambda a, b: ~np.isnan(a) & ~np.isnan(b), "u": lambda a, b: np.isnan(a) | np.isnan(b)}
ICMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}


@pytest.mark.parametrize("form", ["e32", "e64"])
@pytest.mark.parametrize("pred", list(FCMP))
def test_float_compares(pred: str, form: str):
  a, b = rand_f32(), rand_f32()
  b[5], b[6] = 1.5, 2.0  # equal and ordered pairs
  dst = "vcc_lo" if form == "e32" else "s4"
  w = run_asm(f"v_cmp_{pred}_f32_{form} {dst}, v1, v2", v={1: a.view(U32), 2: b.view(U32)})
  with np.errstate(invalid="ignore"): want = mask(FCMP[pred](a, b))
  assert w.s[106 if form == "e32" else 4] == want, (pred, hex(w.s[106 if form == "e32" else 4]), hex(want))


@pytest.mark.parametrize("form", ["e32", "e64"])
@pytest.mark.parametrize("ty", ["i32", "u32", "u16"])
@pytest.mark.parametrize("pred", list(ICMP))
def test_int_compares(pred: str, ty: str, form: str):
  a, b = rand_u32(), rand_u32()
  b[8:12] = a[8:12]
  conv = {"i32": i32, "u32": lambda x: x.astype(np.int64), "u16": u16}[ty]
  dst = "vcc_lo" if form == "e32" else "s4"
  w = run_asm(f"v_cmp_{pred}_{ty}_{form} {dst}, v1, v2", v={1: a, 2: b})
  assert w.s[106 if form == "e32" else 4] == mask(ICMP[pred](conv(a), conv(b)))


def test_cmpx_writes_exec_and_f64_ordered_compare():
  a, b = rand_u32(), rand_u32()
  w = run_asm("v_cmpx_gt_i32_e32 v1, v2", v={1: a, 2: b})
  assert w.s[126] == mask(i32(a) > i32(b))
  x, y = rand_f32(), rand_f32()
  for form in ("e32", "e64"):
    w = run_asm(f"v_cmpx_lt_i32_{form} v1, v2", v={1: a, 2: b}, exec_mask=0x0FFFFFFF)
    assert w.s[126] == mask(i32(a) < i32(b)) & 0x0FFFFFFF  # lanes off in EXEC stay off
    w = run_asm(f"v_cmpx_ngt_f32_{form} v1, v2", v={1: x.view(U32), 2: y.view(U32)})
    with np.errstate(invalid="ignore"): assert w.s[126] == mask(~(x > y))
  d = np.where(LANE % 3 == 0, np.nan, LANE * 1.5)
  bits = d.view(np.uint64)
  w = run_asm("v_cmp_o_f64_e64 s4, v[2:3], v[2:3]", v={2: (bits & 0xFFFFFFFF).astype(U32), 3: (bits >> 32).astype(U32)})
  assert w.s[4] == mask(~np.isnan(d))


VOP3_INT = {  # asm (v0 = result of v1, v2, v3), oracle on uint32 lanes (result compared in the bits given)
  "v_max3_i32 v0, v1, v2, v3": (lambda a, b, c: np.maximum(np.maximum(i32(a), i32(b)), i32(c)), 32),
  "v_max3_u32 v0, v1, v2, v3": (lambda a, b, c: np.maximum(np.maximum(a, b), c), 32),
  "v_min3_i32 v0, v1, v2, v3": (lambda a, b, c: np.minimum(np.minimum(i32(a), i32(b)), i32(c)), 32),
  "v_max3_i16 v0, v1, v2, v3": (lambda a, b, c: np.maximum(np.maximum(i16(a), i16(b)), i16(c)), 16),
  "v_max3_u16 v0, v1, v2, v3": (lambda a, b, c: np.maximum(np.maximum(u16(a), u16(b)), u16(c)), 16),
  "v_min3_i16 v0, v1, v2, v3": (lambda a, b, c: np.minimum(np.minimum(i16(a), i16(b)), i16(c)), 16),
  "v_min3_u16 v0, v1, v2, v3": (lambda a, b, c: np.minimum(np.minimum(u16(a), u16(b)), u16(c)), 16),
  "v_max_u16 v0, v1, v2": (lambda a, b, c: np.maximum(u16(a), u16(b)), 16),
  "v_min_u16 v0, v1, v2": (lambda a, b, c: np.minimum(u16(a), u16(b)), 16),
  "v_mul_lo_u16 v0, v1, v2": (lambda a, b, c: u16(a) * u16(b), 16),
  "v_sub_nc_u16 v0, v1, v2": (lambda a, b, c: u16(a) - u16(b), 16),
  "v_lshlrev_b16 v0, v1, v2": (lambda a, b, c: u16(b) << (a & 15), 16),
  "v_ashrrev_i16 v0, v1, v2": (lambda a, b, c: i16(b) >> (a & 15).astype(np.int64), 16),
  "v_lshlrev_b32_e64 v0, v1, v2": (lambda a, b, c: b.astype(np.int64) << (a & 31), 32),
  "v_mul_i32_i24 v0, v1, v2": (lambda a, b, c: i24(a) * i24(b), 32),
  "v_mad_i32_i24 v0, v1, v2, v3": (lambda a, b, c: i24(a) * i24(b) + i32(c), 32),
  "v_mad_u32_u24 v0, v1, v2, v3": (lambda a, b, c: (a & 0xFFFFFF).astype(np.int64) * (b & 0xFFFFFF) + c, 32),
  "v_xad_u32 v0, v1, v2, v3": (lambda a, b, c: (a ^ b).astype(np.int64) + c, 32),
  "v_or3_b32 v0, v1, v2, v3": (lambda a, b, c: a | b | c, 32),
  "v_add_lshl_u32 v0, v1, v2, v3": (lambda a, b, c: ((a.astype(np.int64) + b) & 0xFFFFFFFF) << (c & 31), 32),
  "v_subrev_nc_u32 v0, v1, v2": (lambda a, b, c: b.astype(np.int64) - a, 32),
}


@pytest.mark.parametrize("asm", list(VOP3_INT))
def test_integer_alu(asm: str):
  a, b, c = rand_u32(), rand_u32(), rand_u32()
  if "16" in asm or "lshl" in asm or "ashr" in asm: a[::2] &= 0x1F  # in-range shift amounts too
  w = run_asm(asm, v={1: a, 2: b, 3: c})
  fn, bits = VOP3_INT[asm]
  m = (1 << bits) - 1
  assert np.array_equal(w.v[0].astype(np.int64) & m, fn(a, b, c).astype(np.int64) & m), asm


def test_float_sub_forms_fmaak_and_f16_convert():
  a, b = rand_f32(), rand_f32()
  w = run_asm("v_subrev_f32 v0, v1, v2\nv_sub_f32_e64 v3, v1, v2\nv_fmaak_f32 v4, v1, v2, 0x40490fdb", v={1: a.view(U32), 2: b.view(U32)})
  with np.errstate(invalid="ignore"):
    np.testing.assert_array_equal(w.v[0].view(np.float32), b - a)
    np.testing.assert_array_equal(w.v[3].view(np.float32), a - b)
    want = (a.astype(np.float64) * b + np.float64(np.float32(3.14159274))).astype(np.float32)  # one rounding (exact product)
    np.testing.assert_array_equal(w.v[4].view(np.float32), want)
  h = np.array([0, 1, 0x3C00, 0xBC00, 0x7C00, 0x7E00, 0x0001, 0x8001, 0x7BFF] + list(RNG.integers(0, 2**16, 23)), np.uint16)
  w = run_asm("v_cvt_f32_f16 v0, v1", v={1: h.astype(U32) | 0xABCD0000})  # the high half is ignored
  np.testing.assert_array_equal(w.v[0].view(np.float32), h.view(np.float16).astype(np.float32))


def test_subrev_carry_in_from_vcc():
  a, b = rand_u32(), rand_u32()
  cin = RNG.integers(0, 2, 32).astype(bool)
  w = run_asm("v_subrev_co_ci_u32 v0, vcc_lo, v1, v2, vcc_lo", v={1: a, 2: b}, s={106: mask(cin)})
  diff = b.astype(np.int64) - a - cin
  assert np.array_equal(w.v[0], (diff & 0xFFFFFFFF).astype(U32)) and w.s[106] == mask(diff < 0)


VOPD_X = {  # (asm, oracle) with X: dst v10, srcs v1, v2 (v10 also the fmac accumulator)
  "v_dual_add_f32 v10, v1, v2": lambda a, b, d: a + b, "v_dual_mul_f32 v10, v1, v2": lambda a, b, d: a * b,
  "v_dual_sub_f32 v10, v1, v2": lambda a, b, d: a - b, "v_dual_subrev_f32 v10, v1, v2": lambda a, b, d: b - a,
  "v_dual_fmac_f32 v10, v1, v2": lambda a, b, d: (a.astype(np.float64) * b + d).astype(np.float32),
  "v_dual_mov_b32 v10, v1": lambda a, b, d: a, "v_dual_min_f32 v10, v1, v2": lambda a, b, d: np.fmin(a, b),
  "v_dual_cndmask_b32 v10, v1, v2": lambda a, b, d: np.where(LANE % 2 == 1, b, a),
  "v_dual_fmaak_f32 v10, v1, v2, 0x3fc00000": lambda a, b, d: (a.astype(np.float64) * b + 1.5).astype(np.float32),
}
VOPD_Y = {  # Y: dst v11, srcs v4, v7 (other banks than X's)
  "v_dual_add_f32 v11, v4, v7": lambda a, b, d: a + b, "v_dual_mul_f32 v11, v4, v7": lambda a, b, d: a * b,
  "v_dual_sub_f32 v11, v4, v7": lambda a, b, d: a - b, "v_dual_mov_b32 v11, v4": lambda a, b, d: a,
  "v_dual_fmac_f32 v11, v4, v7": lambda a, b, d: (a.astype(np.float64) * b + d).astype(np.float32),
  "v_dual_cndmask_b32 v11, v4, v7": lambda a, b, d: np.where(LANE % 2 == 1, b, a),
  "v_dual_subrev_f32 v11, v4, v7": lambda a, b, d: b - a,
  "v_dual_fmaak_f32 v11, v4, v7, 0x3fc00000": lambda a, b, d: (a.astype(np.float64) * b + 1.5).astype(np.float32),
  "v_dual_add_nc_u32 v11, v4, v7": "int_add", "v_dual_and_b32 v11, v4, v7": "int_and", "v_dual_lshlrev_b32 v11, v4, v7": "int_shl",
}


def _vopd_ok(x: str, y: str) -> bool:
  # the ISA allows fmaak/fmamk in one half only when the other half takes no literal; both cndmasks read vcc (fine);
  # two fmaaks or fmac with fmaak are the assembler's call: pairs llvm-mc rejects are skipped by the caller
  return not (x.startswith("v_dual_fmaak") and y.startswith("v_dual_fmaak"))


@pytest.mark.parametrize("x", list(VOPD_X))
@pytest.mark.parametrize("y", list(VOPD_Y))
def test_vopd_pairs(x: str, y: str):
  if not _vopd_ok(x, y): pytest.skip("not an encodable pair")
  fa, fb, fc, fd = (rand_f32() for _ in range(4))
  ia, ib = rand_u32(), RNG.integers(0, 32, 32).astype(U32)
  yint = isinstance(VOPD_Y[y], str)
  v = {1: fa.view(U32), 2: fb.view(U32), 10: fc.view(U32), 4: ia if yint else fd.view(U32), 7: ib if yint else fa[::-1].copy().view(U32),
       11: fb[::-1].copy().view(U32)}
  try: w = run_asm(f"{x} :: {y}", v=v, s={106: 0xAAAAAAAA})
  except Exception as e:
    if "llvm-mc" in repr(e) or "CalledProcessError" in type(e).__name__: pytest.skip(f"llvm-mc rejects {x} :: {y}")
    raise
  with np.errstate(all="ignore"):
    wx = VOPD_X[x](fa, fb, fc)
    np.testing.assert_array_equal(w.v[10].view(np.float32) if wx.dtype == np.float32 else w.v[10], wx if wx.dtype == np.float32 else wx.view(U32))
    if yint:
      want = {"int_add": ia.astype(np.int64) + ib, "int_and": ia & ib, "int_shl": ib.astype(np.int64) << (ia & 31)}[VOPD_Y[y]]
      assert np.array_equal(w.v[11], (want & 0xFFFFFFFF).astype(U32))
    else:
      wy = VOPD_Y[y](fd, fa[::-1], fb[::-1])
      np.testing.assert_array_equal(w.v[11].view(np.float32), wy)


def test_scalar_alu_compares_and_saveexec():
  w = run_asm("""s_lshr_b32 s0, s10, 4
s_mul_hi_i32 s1, s10, s11
s_mul_i32 s2, s10, s11
s_or_not1_b32 s3, s10, s11
s_sub_i32 s4, s11, s10
s_mov_b32 s20, s10
s_mulk_i32 s20, 0xfff9
s_bitcmp0_b32 s12, 3
s_cselect_b32 s5, 1, 0
s_cmp_gt_i32 s10, s11
s_cselect_b32 s6, 1, 0
s_cmp_gt_u32 s10, s11
s_cselect_b32 s7, 1, 0
s_cmpk_lg_i32 s13, 0xfffb
s_cselect_b32 s8, 1, 0
s_or_saveexec_b32 s9, s14
s_cselect_b32 s15, 1, 0""", s={10: 0xF0000001, 11: 0x12345678, 12: 0b10110, 13: 0xFFFFFFFB, 14: 0x00FF0000}, exec_mask=0x0000FFFF)
  a, b = 0xF0000001, 0x12345678
  sa = a - (1 << 32)
  assert w.s[0] == a >> 4 and w.s[1] == ((sa * b) >> 32) & 0xFFFFFFFF and w.s[2] == (a * b) & 0xFFFFFFFF
  assert w.s[3] == (a | ~b) & 0xFFFFFFFF and w.s[4] == (b - a) & 0xFFFFFFFF and w.s[20] == (sa * -7) & 0xFFFFFFFF
  assert (w.s[5], w.s[6], w.s[7], w.s[8]) == (1, 0, 1, 0)  # bit 3 of 0b10110 is clear; -5 == simm16 0xfffb
  assert w.s[9] == 0x0000FFFF and w.s[126] == 0x00FFFFFF and w.s[15] == 1


def test_cbranch_vccz():
  w = run_asm("""s_mov_b32 s0, 0
s_cbranch_vccz skip
s_mov_b32 s0, 1
skip:
s_mov_b32 vcc_lo, 4
s_mov_b32 s1, 0
s_cbranch_vccz skip2
s_mov_b32 s1, 1
skip2:""", s={106: 0})
  assert (w.s[0], w.s[1]) == (0, 1)


def test_wide_loads():
  mem = TestMemory()
  data = np.arange(128, dtype=np.uint32) * 0x01010101 + 0x10203
  buf = mem.put(data)
  w = run_asm("""s_load_b512 s[16:31], s[0:1], 0x0
global_load_b96 v[4:6], v0, s[0:1] offset:4
global_load_d16_b16 v7, v1, s[0:1]
s_waitcnt vmcnt(0) lgkmcnt(0)""", s={0: buf & 0xFFFFFFFF, 1: buf >> 32}, v={0: LANE * 12, 1: LANE * 2, 7: 0xDEAD0000}, mem=mem)
  assert [w.s[16 + i] for i in range(16)] == list(data[:16])
  flat = data.view(np.uint8)
  for r in range(3): assert np.array_equal(w.v[4 + r], flat[4 + LANE[:, None] * 12 + 4 * r + np.arange(4)].copy().view("<u4")[:, 0])
  halves = flat.view(np.uint16)[LANE].astype(U32)
  assert np.array_equal(w.v[7], halves | 0xDEAD0000)  # d16: the low half is loaded, the high half kept
