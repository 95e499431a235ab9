"""Turns decoded RDNA3 instructions into Python closures `fn(wave) -> next_pc | None` that run one instruction for all
32 lanes at once with numpy. Operand decoding (register, inline constant, literal, VOP3 abs/neg/op_sel, VOP3P
op_sel/op_sel_hi) is resolved here once per instruction, so execution only touches arrays.
Returned pcs: None = fall through, an int = branch target, ENDPGM / BARRIER = wave control."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from plugrad_amd.mock.rdna3 import alu
from plugrad_amd.mock.rdna3.alu import F16, F32, F64, I16, I32, I64, U8, U16, U32, U64
from plugrad_amd.mock.rdna3.decode import DPP_SRC, Inst
from plugrad_amd.mock.rdna3.wave import (LANE_IDS, LANES, EmulatorError, Wave, gather_global, lanes_to_mask, lds_index,
                                         mask_to_lanes, scatter_global, scratch_index)

ENDPGM, BARRIER = -1, -2
Fn = Callable[[Wave], Any]
NULL, VCC, M0, EXEC, SCC_SRC, LIT = 124, 106, 125, 126, 253, 255
_INLINE_F = {240: 0.5, 241: -0.5, 242: 1.0, 243: -1.0, 244: 2.0, 245: -2.0, 246: 4.0, 247: -4.0}
_INV_2PI = {"f32": 0x3E22F983, "f16": 0x3118, "f64": 0x3FC45F306DC9C882}
_APERTURE = {235: 0x1_0000 << 32, 236: (0x1_0000 << 32) | 0xFFFFFFFF, 237: 0x2_0000 << 32, 238: (0x2_0000 << 32) | 0xFFFFFFFF}
_DT = {"u32": U32, "i32": I32, "f32": F32, "u16": U16, "i16": I16, "f16": F16, "u64": U64, "i64": I64, "f64": F64}
_WIDTH = {k: np.dtype(v).itemsize * 8 for k, v in _DT.items()}
LANE_LT = ((np.uint64(1) << LANE_IDS.astype(np.uint64)) - np.uint64(1)).astype(U32)


class Unimplemented(EmulatorError):
  """An instruction the emulator does not know."""


def _s32(x: int) -> int:
  return x - (1 << 32) if x & 0x80000000 else x


def _s64(x: int) -> int:
  return x - (1 << 64) if x & (1 << 63) else x


# ---------------------------------------------------------------- operands

def const_bits(code: int, lit: int | None, width: int, flt: bool) -> int | None:
  """Bits of a non-register source operand for an operand of `width` bits (None if `code` is a register)."""
  if 128 <= code <= 192: v = code - 128
  elif 193 <= code <= 208: v = -(code - 192)
  elif code in _INLINE_F:
    f = _INLINE_F[code]
    if width == 64: return int(np.array(f, F64).view(U64))
    if width == 16: return int(np.array(f, F16).view(U16))
    return int(np.array(f, F32).view(U32))
  elif code == 248: return _INV_2PI["f64" if width == 64 else "f16" if width == 16 else "f32"]
  elif code == LIT:
    assert lit is not None
    if width == 64: return (lit << 32) if flt else lit
    return lit & ((1 << width) - 1)
  elif code in _APERTURE: return _APERTURE[code] if width == 64 else _APERTURE[code] >> 32
  else: return None
  return v & ((1 << width) - 1)


def sread(code: int, lit: int | None, width: int = 32) -> Callable[[Wave], int]:
  """Scalar source reader returning a Python int."""
  c = const_bits(code, lit, width, False)
  if c is not None: return lambda w: c
  if code == SCC_SRC: return lambda w: w.scc
  if code == NULL: return lambda w: 0
  if code < 128:
    if width == 64: return lambda w: w.s[code] | (w.s[code + 1] << 32)
    return lambda w: w.s[code]
  raise Unimplemented(f"scalar source operand {code}")


def swrite(code: int, width: int = 32) -> Callable[[Wave, int], None]:
  if code == NULL: return lambda w, x: None
  if code >= 128: raise Unimplemented(f"scalar destination {code}")
  if width == 64:
    if code == EXEC: return lambda w, x: w.set_exec(x)
    def wr64(w: Wave, x: int) -> None:
      w.s[code], w.s[code + 1] = x & 0xFFFFFFFF, (x >> 32) & 0xFFFFFFFF
    return wr64
  if code == EXEC: return lambda w, x: w.set_exec(x)
  if code == EXEC + 1: return lambda w, x: None  # exec_hi does not exist in wave32
  def wr(w: Wave, x: int) -> None:
    w.s[code] = x & 0xFFFFFFFF
  return wr


def vbits(code: int, lit: int | None, width: int, flt: bool) -> Fn:
  """Vector-instruction source reader returning lane bits (uint32/uint64 array, or a scalar for uniform sources)."""
  if code == DPP_SRC:
    if width != 32: raise Unimplemented(f"DPP on a {width}-bit operand")
    return lambda w: w.dpp_tmp
  if code >= 256:
    r = code - 256
    if width == 64: return lambda w: w.v[r].astype(U64) | (w.v[r + 1].astype(U64) << U64(32))
    return lambda w: w.v[r]
  c = const_bits(code, lit, 64 if width == 64 else 32, flt)
  if c is not None:
    if width == 16 and code != LIT: c = const_bits(code, lit, 16, flt) | (const_bits(code, lit, 16, flt) << 16)  # type: ignore[operator]
    cv = U64(c) if width == 64 else U32(c)
    return lambda w: cv
  s = sread(code, lit, 64 if width == 64 else 32)
  if width == 64: return lambda w: U64(s(w))
  return lambda w: U32(s(w))


def typed(code: int, lit: int | None, kind: str, hi: bool = False, neg: bool = False, absv: bool = False) -> Fn:
  """Reader of a source as numpy values of `kind`; `hi` picks the upper half of a 16-bit operand."""
  width, flt = _WIDTH[kind], kind[0] == "f"
  dt = _DT[kind]
  raw = vbits(code, lit, width, flt)
  if width == 16:
    sh = U32(16 if hi else 0)
    base = lambda w: ((raw(w) >> sh) & U32(0xFFFF)).astype(U16).view(dt)
  elif kind in ("u32", "u64"): base = raw
  else: base = lambda w: raw(w).view(dt)
  if flt and absv and neg: return lambda w: -np.abs(base(w))
  if flt and absv: return lambda w: np.abs(base(w))
  if flt and neg: return lambda w: -base(w)
  return base


def vwrite(vdst: int, kind: str, hi: bool = False) -> Callable[[Wave, Any], None]:
  """Writer of a typed result into VGPR vdst for the active lanes (16-bit results keep the other half)."""
  width, dt = _WIDTH[kind], _DT[kind]
  if width == 32:
    def w32(w: Wave, res: Any) -> None:
      bits = np.asarray(res, dt).view(U32) if kind != "u32" else res
      if w.full: w.v[vdst] = bits
      else: np.copyto(w.v[vdst], bits, casting="unsafe", where=w.em)
    return w32
  if width == 64:
    def w64(w: Wave, res: Any) -> None:
      b = np.asarray(res, dt).view(U64) if kind != "u64" else np.asarray(res, U64)
      np.copyto(w.v[vdst], (b & U64(0xFFFFFFFF)).astype(U32), where=w.em)
      np.copyto(w.v[vdst + 1], (b >> U64(32)).astype(U32), where=w.em)
    return w64
  keep, sh = (U32(0x0000FFFF), U32(16)) if hi else (U32(0xFFFF0000), U32(0))
  def w16(w: Wave, res: Any) -> None:
    b = np.asarray(res, dt).view(U16).astype(U32)
    np.copyto(w.v[vdst], (w.v[vdst] & keep) | (b << sh), where=w.em)
  return w16


# ---------------------------------------------------------------- vector ALU semantics table

def _f(kinds: str, out: str, fn: Callable) -> tuple[tuple[str, ...], str, Callable]:
  return tuple(kinds.split()), out, fn


def _cvt_pk_sat(lo: int, hi: int, dt: type) -> Callable:
  return lambda a, b: (np.clip(np.asarray(a, I64), lo, hi).astype(dt).view(U16).astype(U32) |
                       (np.clip(np.asarray(b, I64), lo, hi).astype(dt).view(U16).astype(U32) << U32(16)))


def _pack16(a: Any, b: Any) -> Any:
  return np.asarray(a).view(U16).astype(U32) | (np.asarray(b).view(U16).astype(U32) << U32(16))


def _half(x: Any, hi: bool) -> Any:
  return ((np.asarray(x, U32) >> U32(16 if hi else 0)) & U32(0xFFFF)).astype(U16).view(F16).astype(F64)


def _dot2_f16(a: Any, b: Any, c: Any) -> Any:
  return (_half(a, False) * _half(b, False) + _half(a, True) * _half(b, True) + np.asarray(c, F64)).astype(F32)


def _mul_hi_u24(a: Any, b: Any) -> Any:
  return (((np.asarray(a, U32) & U32(0xFFFFFF)).astype(U64) * (np.asarray(b, U32) & U32(0xFFFFFF)).astype(U64)) >> U64(32)).astype(U32)


def _sext16(x: Any) -> Any:
  return (np.asarray(x, U32) & U32(0xFFFF)).astype(U16).view(I16).astype(I64)


def _align(a: Any, b: Any, shift: Any) -> Any:
  return (((np.asarray(a, U64) << U64(32)) | b) >> np.asarray(shift).astype(U64)).astype(U32)


def _f32_through_f64(fn: Callable) -> Callable:
  return lambda a: fn(np.asarray(a, F64)).astype(F32)


def _rsq(a: Any) -> Any:
  return 1.0 / np.sqrt(a)


VALU: dict[str, tuple[tuple[str, ...], str, Callable]] = {
  # float32
  "v_add_f32": _f("f32 f32", "f32", lambda a, b: a + b), "v_sub_f32": _f("f32 f32", "f32", lambda a, b: a - b),
  "v_subrev_f32": _f("f32 f32", "f32", lambda a, b: b - a), "v_mul_f32": _f("f32 f32", "f32", lambda a, b: a * b),
  "v_min_f32": _f("f32 f32", "f32", np.fmin), "v_max_f32": _f("f32 f32", "f32", np.fmax),
  "v_ldexp_f32": _f("f32 i32", "f32", alu.ldexp), "v_fma_f32": _f("f32 f32 f32", "f32", alu.fma32),
  "v_fmac_f32": _f("f32 f32 f32", "f32", alu.fma32), "v_fmamk_f32": _f("f32 f32 f32", "f32", lambda a, b, k: alu.fma32(a, k, b)),
  "v_fmaak_f32": _f("f32 f32 f32", "f32", alu.fma32),
  "v_min3_f32": _f("f32 f32 f32", "f32", lambda a, b, c: np.fmin(np.fmin(a, b), c)),
  "v_max3_f32": _f("f32 f32 f32", "f32", lambda a, b, c: np.fmax(np.fmax(a, b), c)), "v_med3_f32": _f("f32 f32 f32", "f32", alu.med3),
  "v_minmax_f32": _f("f32 f32 f32", "f32", lambda a, b, c: np.fmax(np.fmin(a, b), c)),
  "v_maxmin_f32": _f("f32 f32 f32", "f32", lambda a, b, c: np.fmin(np.fmax(a, b), c)),
  "v_rcp_f32": _f("f32", "f32", lambda a: F32(1) / a), "v_rcp_iflag_f32": _f("f32", "f32", lambda a: F32(1) / a),
  "v_rsq_f32": _f("f32", "f32", _f32_through_f64(_rsq)), "v_sqrt_f32": _f("f32", "f32", np.sqrt),
  "v_exp_f32": _f("f32", "f32", np.exp2), "v_log_f32": _f("f32", "f32", np.log2),
  "v_sin_f32": _f("f32", "f32", alu.sin_rev), "v_cos_f32": _f("f32", "f32", lambda a: alu.sin_rev(a, cos=True)),
  "v_floor_f32": _f("f32", "f32", np.floor), "v_ceil_f32": _f("f32", "f32", np.ceil), "v_trunc_f32": _f("f32", "f32", np.trunc),
  "v_rndne_f32": _f("f32", "f32", np.rint), "v_fract_f32": _f("f32", "f32", alu.fract),
  "v_frexp_mant_f32": _f("f32", "f32", alu.frexp_mant), "v_frexp_exp_i32_f32": _f("f32", "i32", alu.frexp_exp),
  "v_div_fixup_f32": _f("f32 f32 f32", "f32", alu.div_fixup), "v_mov_b32": _f("u32", "u32", lambda a: a),
  # conversions
  "v_cvt_f32_i32": _f("i32", "f32", lambda a: np.asarray(a, F32)), "v_cvt_f32_u32": _f("u32", "f32", lambda a: np.asarray(a, F32)),
  "v_cvt_i32_f32": _f("f32", "i32", lambda a: alu.cvt_int(a, -(1 << 31), (1 << 31) - 1, I32)),
  "v_cvt_u32_f32": _f("f32", "u32", lambda a: alu.cvt_int(a, 0, (1 << 32) - 1, U32)),
  "v_cvt_floor_i32_f32": _f("f32", "i32", lambda a: alu.cvt_int(np.floor(a), -(1 << 31), (1 << 31) - 1, I32)),
  "v_cvt_nearest_i32_f32": _f("f32", "i32", lambda a: alu.cvt_int(np.floor(np.asarray(a, F64) + 0.5), -(1 << 31), (1 << 31) - 1, I32)),
  "v_cvt_f16_f32": _f("f32", "f16", lambda a: np.asarray(a, F16)), "v_cvt_f32_f16": _f("f16", "f32", lambda a: np.asarray(a, F32)),
  "v_cvt_f64_f32": _f("f32", "f64", lambda a: np.asarray(a, F64)), "v_cvt_f32_f64": _f("f64", "f32", lambda a: np.asarray(a, F32)),
  "v_cvt_i32_f64": _f("f64", "i32", lambda a: alu.cvt_int(a, -(1 << 31), (1 << 31) - 1, I32)),
  "v_cvt_u32_f64": _f("f64", "u32", lambda a: alu.cvt_int(a, 0, (1 << 32) - 1, U32)),
  "v_cvt_f64_i32": _f("i32", "f64", lambda a: np.asarray(a, F64)), "v_cvt_f64_u32": _f("u32", "f64", lambda a: np.asarray(a, F64)),
  **{f"v_cvt_f32_ubyte{k}": _f("u32", "f32", lambda a, k=k: ((a >> U32(8 * k)) & U32(0xFF)).astype(F32)) for k in range(4)},
  "v_cvt_pk_rtz_f16_f32": _f("f32 f32", "u32", lambda a, b: _pack16(alu.cvt_rtz_f16(a), alu.cvt_rtz_f16(b))),
  "v_pack_b32_f16": _f("f16 f16", "u32", _pack16),
  "v_cvt_pk_u16_u32": _f("u32 u32", "u32", _cvt_pk_sat(0, 0xFFFF, U16)),
  "v_cvt_pk_u16_f32": _f("f32 f32", "u32", lambda a, b: _pack16(alu.cvt_int(a, 0, 0xFFFF, U16), alu.cvt_int(b, 0, 0xFFFF, U16))),
  "v_cvt_pk_i16_f32": _f("f32 f32", "u32", lambda a, b: _pack16(alu.cvt_int(a, -32768, 32767, I16), alu.cvt_int(b, -32768, 32767, I16))),
  "v_cvt_pk_i16_i32": _f("i32 i32", "u32", _cvt_pk_sat(-32768, 32767, I16)),
  "v_cvt_f16_u16": _f("u16", "f16", lambda a: np.asarray(a, F16)), "v_cvt_f16_i16": _f("i16", "f16", lambda a: np.asarray(a, F16)),
  "v_cvt_u16_f16": _f("f16", "u16", lambda a: alu.cvt_int(a, 0, 0xFFFF, U16)),
  "v_cvt_i16_f16": _f("f16", "i16", lambda a: alu.cvt_int(a, -32768, 32767, I16)),
  "v_cvt_i32_i16": _f("i16", "i32", lambda a: np.asarray(a, I32)), "v_cvt_u32_u16": _f("u16", "u32", lambda a: np.asarray(a, U32)),
  # 32-bit integer
  "v_add_nc_u32": _f("u32 u32", "u32", lambda a, b: a + b), "v_sub_nc_u32": _f("u32 u32", "u32", lambda a, b: a - b),
  "v_subrev_nc_u32": _f("u32 u32", "u32", lambda a, b: b - a), "v_add_nc_i32": _f("u32 u32", "u32", lambda a, b: a + b),
  "v_sub_nc_i32": _f("u32 u32", "u32", lambda a, b: a - b), "v_mul_lo_u32": _f("u32 u32", "u32", lambda a, b: a * b),
  "v_mul_hi_u32": _f("u32 u32", "u32", lambda a, b: ((np.asarray(a, U64) * np.asarray(b, U64)) >> U64(32)).astype(U32)),
  "v_mul_hi_i32": _f("i32 i32", "i32", lambda a, b: ((np.asarray(a, I64) * np.asarray(b, I64)) >> 32).astype(I32)),
  "v_mul_u32_u24": _f("u32 u32", "u32", lambda a, b: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF))),
  "v_mul_hi_u32_u24": _f("u32 u32", "u32", _mul_hi_u24),
  "v_mul_i32_i24": _f("u32 u32", "u32", lambda a, b: (alu.sext24(a) * alu.sext24(b)).astype(U32)),
  "v_mul_hi_i32_i24": _f("u32 u32", "u32", lambda a, b: ((alu.sext24(a) * alu.sext24(b)) >> 32).astype(U32)),
  "v_mad_u32_u24": _f("u32 u32 u32", "u32", lambda a, b, c: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF)) + c),
  "v_mad_i32_i24": _f("u32 u32 u32", "u32", lambda a, b, c: (alu.sext24(a) * alu.sext24(b) + np.asarray(c, U32).view(I32)).astype(U32)),
  "v_mad_u32_u16": _f("u32 u32 u32", "u32", lambda a, b, c: (a & U32(0xFFFF)) * (b & U32(0xFFFF)) + c),
  "v_mad_i32_i16": _f("u32 u32 u32", "u32", lambda a, b, c: (_sext16(a) * _sext16(b) + np.asarray(c, U32).view(I32)).astype(U32)),
  "v_min_i32": _f("i32 i32", "i32", np.minimum), "v_max_i32": _f("i32 i32", "i32", np.maximum),
  "v_min_u32": _f("u32 u32", "u32", np.minimum), "v_max_u32": _f("u32 u32", "u32", np.maximum),
  "v_min3_i32": _f("i32 i32 i32", "i32", lambda a, b, c: np.minimum(np.minimum(a, b), c)),
  "v_max3_i32": _f("i32 i32 i32", "i32", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
  "v_min3_u32": _f("u32 u32 u32", "u32", lambda a, b, c: np.minimum(np.minimum(a, b), c)),
  "v_max3_u32": _f("u32 u32 u32", "u32", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
  "v_med3_i32": _f("i32 i32 i32", "i32", alu.imed3), "v_med3_u32": _f("u32 u32 u32", "u32", alu.imed3),
  "v_minmax_i32": _f("i32 i32 i32", "i32", lambda a, b, c: np.maximum(np.minimum(a, b), c)),
  "v_maxmin_i32": _f("i32 i32 i32", "i32", lambda a, b, c: np.minimum(np.maximum(a, b), c)),
  "v_minmax_u32": _f("u32 u32 u32", "u32", lambda a, b, c: np.maximum(np.minimum(a, b), c)),
  "v_maxmin_u32": _f("u32 u32 u32", "u32", lambda a, b, c: np.minimum(np.maximum(a, b), c)),
  "v_lshlrev_b32": _f("u32 u32", "u32", lambda a, b: b << (a & U32(31))), "v_lshrrev_b32": _f("u32 u32", "u32", lambda a, b: b >> (a & U32(31))),
  "v_ashrrev_i32": _f("u32 i32", "i32", lambda a, b: b >> (a & U32(31)).astype(I32)),
  "v_and_b32": _f("u32 u32", "u32", lambda a, b: a & b), "v_or_b32": _f("u32 u32", "u32", lambda a, b: a | b),
  "v_xor_b32": _f("u32 u32", "u32", lambda a, b: a ^ b), "v_xnor_b32": _f("u32 u32", "u32", lambda a, b: ~(a ^ b)),
  "v_not_b32": _f("u32", "u32", lambda a: ~np.asarray(a, U32)), "v_bfrev_b32": _f("u32", "u32", lambda a: alu.bfrev(np.broadcast_to(a, (LANES,)))),
  "v_clz_i32_u32": _f("u32", "u32", alu.clz), "v_ctz_i32_b32": _f("u32", "u32", alu.ctz),
  "v_cls_i32": _f("i32", "u32", lambda a: alu.clz((a ^ (a >> 31)).astype(U32))),
  "v_bfm_b32": _f("u32 u32", "u32", lambda a, b: (((U64(1) << (a & U32(31)).astype(U64)) - U64(1)).astype(U32)) << (b & U32(31))),
  "v_bcnt_u32_b32": _f("u32 u32", "u32", lambda a, b: alu.popcount(a) + b),
  "v_bfe_u32": _f("u32 u32 u32", "u32", alu.bfe_u32), "v_bfe_i32": _f("u32 u32 u32", "u32", alu.bfe_i32),
  "v_bfi_b32": _f("u32 u32 u32", "u32", lambda a, b, c: (a & b) | (~np.asarray(a, U32) & c)),
  "v_alignbit_b32": _f("u32 u32 u32", "u32", lambda a, b, c: _align(a, b, c & U32(31))),
  "v_alignbyte_b32": _f("u32 u32 u32", "u32", lambda a, b, c: _align(a, b, U32(8) * (c & U32(3)))),
  "v_xor3_b32": _f("u32 u32 u32", "u32", lambda a, b, c: a ^ b ^ c), "v_or3_b32": _f("u32 u32 u32", "u32", lambda a, b, c: a | b | c),
  "v_add3_u32": _f("u32 u32 u32", "u32", lambda a, b, c: a + b + c), "v_xad_u32": _f("u32 u32 u32", "u32", lambda a, b, c: (a ^ b) + c),
  "v_lshl_add_u32": _f("u32 u32 u32", "u32", lambda a, b, c: (a << (b & U32(31))) + c),
  "v_add_lshl_u32": _f("u32 u32 u32", "u32", lambda a, b, c: (a + b) << (c & U32(31))),
  "v_lshl_or_b32": _f("u32 u32 u32", "u32", lambda a, b, c: (a << (b & U32(31))) | c),
  "v_and_or_b32": _f("u32 u32 u32", "u32", lambda a, b, c: (a & b) | c), "v_perm_b32": _f("u32 u32 u32", "u32", alu.perm_b32),
  "v_sad_u32": _f("u32 u32 u32", "u32", lambda a, b, c: np.where(a > b, a - b, b - a) + c),
  # 64-bit
  "v_lshlrev_b64": _f("u32 u64", "u64", lambda a, b: b << (a & U32(63)).astype(U64)),
  "v_lshrrev_b64": _f("u32 u64", "u64", lambda a, b: b >> (a & U32(63)).astype(U64)),
  "v_ashrrev_i64": _f("u32 i64", "i64", lambda a, b: b >> (a & U32(63)).astype(I64)),
  "v_add_f64": _f("f64 f64", "f64", lambda a, b: a + b), "v_mul_f64": _f("f64 f64", "f64", lambda a, b: a * b),
  "v_min_f64": _f("f64 f64", "f64", np.fmin), "v_max_f64": _f("f64 f64", "f64", np.fmax),
  "v_fma_f64": _f("f64 f64 f64", "f64", alu.fma64), "v_ldexp_f64": _f("f64 i32", "f64", alu.ldexp),
  "v_rcp_f64": _f("f64", "f64", lambda a: 1.0 / a), "v_rsq_f64": _f("f64", "f64", _rsq), "v_sqrt_f64": _f("f64", "f64", np.sqrt),
  "v_floor_f64": _f("f64", "f64", np.floor), "v_ceil_f64": _f("f64", "f64", np.ceil), "v_trunc_f64": _f("f64", "f64", np.trunc),
  "v_rndne_f64": _f("f64", "f64", np.rint), "v_fract_f64": _f("f64", "f64", alu.fract),
  "v_frexp_mant_f64": _f("f64", "f64", alu.frexp_mant), "v_frexp_exp_i32_f64": _f("f64", "i32", alu.frexp_exp),
  "v_div_fixup_f64": _f("f64 f64 f64", "f64", alu.div_fixup),
  # float16
  "v_add_f16": _f("f16 f16", "f16", lambda a, b: a + b), "v_sub_f16": _f("f16 f16", "f16", lambda a, b: a - b),
  "v_subrev_f16": _f("f16 f16", "f16", lambda a, b: b - a), "v_mul_f16": _f("f16 f16", "f16", lambda a, b: a * b),
  "v_max_f16": _f("f16 f16", "f16", np.fmax), "v_min_f16": _f("f16 f16", "f16", np.fmin), "v_ldexp_f16": _f("f16 i16", "f16", alu.ldexp),
  "v_fma_f16": _f("f16 f16 f16", "f16", alu.fma16), "v_fmac_f16": _f("f16 f16 f16", "f16", alu.fma16),
  "v_fmamk_f16": _f("f16 f16 f16", "f16", lambda a, b, k: alu.fma16(a, k, b)), "v_fmaak_f16": _f("f16 f16 f16", "f16", alu.fma16),
  "v_min3_f16": _f("f16 f16 f16", "f16", lambda a, b, c: np.fmin(np.fmin(a, b), c)),
  "v_minmax_f16": _f("f16 f16 f16", "f16", lambda a, b, c: np.fmax(np.fmin(a, b), c)),
  "v_maxmin_f16": _f("f16 f16 f16", "f16", lambda a, b, c: np.fmin(np.fmax(a, b), c)),
  "v_dot2acc_f32_f16": _f("u32 u32 f32", "f32", lambda a, b, c: _dot2_f16(a, b, c)),
  "v_max3_f16": _f("f16 f16 f16", "f16", lambda a, b, c: np.fmax(np.fmax(a, b), c)), "v_med3_f16": _f("f16 f16 f16", "f16", alu.med3),
  "v_rcp_f16": _f("f16", "f16", lambda a: F16(1) / a), "v_sqrt_f16": _f("f16", "f16", np.sqrt),
  "v_rsq_f16": _f("f16", "f16", lambda a: (1.0 / np.sqrt(np.asarray(a, F64))).astype(F16)),
  "v_log_f16": _f("f16", "f16", np.log2), "v_exp_f16": _f("f16", "f16", np.exp2),
  "v_sin_f16": _f("f16", "f16", alu.sin_rev), "v_cos_f16": _f("f16", "f16", lambda a: alu.sin_rev(a, cos=True)),
  "v_floor_f16": _f("f16", "f16", np.floor), "v_ceil_f16": _f("f16", "f16", np.ceil), "v_trunc_f16": _f("f16", "f16", np.trunc),
  "v_rndne_f16": _f("f16", "f16", np.rint), "v_fract_f16": _f("f16", "f16", alu.fract),
  "v_frexp_mant_f16": _f("f16", "f16", alu.frexp_mant), "v_frexp_exp_i16_f16": _f("f16", "i16", lambda a: alu.frexp_exp(a).astype(I16)),
  "v_div_fixup_f16": _f("f16 f16 f16", "f16", alu.div_fixup), "v_mov_b16": _f("u16", "u16", lambda a: a),
  # 16-bit integer
  "v_add_nc_u16": _f("u16 u16", "u16", lambda a, b: a + b), "v_sub_nc_u16": _f("u16 u16", "u16", lambda a, b: a - b),
  "v_add_nc_i16": _f("u16 u16", "u16", lambda a, b: a + b), "v_sub_nc_i16": _f("u16 u16", "u16", lambda a, b: a - b),
  "v_mul_lo_u16": _f("u16 u16", "u16", lambda a, b: a * b), "v_mad_u16": _f("u16 u16 u16", "u16", lambda a, b, c: a * b + c),
  "v_mad_i16": _f("u16 u16 u16", "u16", lambda a, b, c: a * b + c),
  "v_max_u16": _f("u16 u16", "u16", np.maximum), "v_min_u16": _f("u16 u16", "u16", np.minimum),
  "v_max_i16": _f("i16 i16", "i16", np.maximum), "v_min_i16": _f("i16 i16", "i16", np.minimum),
  "v_min3_i16": _f("i16 i16 i16", "i16", lambda a, b, c: np.minimum(np.minimum(a, b), c)),
  "v_max3_i16": _f("i16 i16 i16", "i16", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
  "v_min3_u16": _f("u16 u16 u16", "u16", lambda a, b, c: np.minimum(np.minimum(a, b), c)),
  "v_max3_u16": _f("u16 u16 u16", "u16", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
  "v_med3_i16": _f("i16 i16 i16", "i16", alu.imed3), "v_med3_u16": _f("u16 u16 u16", "u16", alu.imed3),
  "v_lshlrev_b16": _f("u16 u16", "u16", lambda a, b: b << (a & U16(15))), "v_lshrrev_b16": _f("u16 u16", "u16", lambda a, b: b >> (a & U16(15))),
  "v_ashrrev_i16": _f("u16 i16", "i16", lambda a, b: b >> (a & U16(15)).astype(I16)),
  "v_and_b16": _f("u16 u16", "u16", lambda a, b: a & b), "v_or_b16": _f("u16 u16", "u16", lambda a, b: a | b),
  "v_xor_b16": _f("u16 u16", "u16", lambda a, b: a ^ b), "v_not_b16": _f("u16", "u16", lambda a: ~np.asarray(a, U16)),
}
_FMAC = {"v_fmac_f32", "v_fmac_f16", "v_dot2acc_f32_f16"}  # src2 is the destination register
_FMAMK = {"v_fmamk_f32", "v_fmamk_f16", "v_fmaak_f32", "v_fmaak_f16"}  # the literal is the third operand


def _finish_float(fn: Callable, kinds: tuple[str, ...], out: str, clamp: bool, omod: int) -> Callable:
  """Wrap a float op with denormal flushing (MODE), output modifier and clamp."""
  f32_in = [k == "f32" for k in kinds]
  scale = {0: None, 1: 2.0, 2: 4.0, 3: 0.5}[omod]
  def run(w: Wave, *args: Any) -> Any:
    if w.ftz32: args = tuple(alu.ftz(np.asarray(a, F32)) if f else a for a, f in zip(args, f32_in))
    r = fn(*args)
    if scale is not None: r = (r * scale).astype(_DT[out])
    if clamp: r = np.where(np.isnan(r), 0, np.clip(r, 0, 1)).astype(_DT[out])
    if w.ftz32 and out == "f32": r = alu.ftz(np.asarray(r, F32))
    return r
  return run


def compile_valu(inst: Inst, name: str) -> Fn:
  """Generic VOP1/VOP2/VOP3 instruction from the VALU table."""
  kinds, out, fn = VALU[name]
  vop3 = inst.enc in ("VOP3", "VOP3SD")
  absm, negm, opsel = (inst.abs, inst.neg, inst.opsel) if vop3 else (0, 0, 0)
  srcs = [inst.src0, getattr(inst, "src1", None) if vop3 else getattr(inst, "vsrc1", None), getattr(inst, "src2", None) if vop3 else None]
  if name in _FMAC: srcs[2] = 256 + inst.vdst  # also in VOP3 form: the accumulator is the destination, src2 is unused
  if name in _FMAMK: srcs[2] = LIT
  readers = [typed(srcs[i], inst.lit, k, hi=bool(opsel >> i & 1), neg=bool(negm >> i & 1), absv=bool(absm >> i & 1))
             for i, k in enumerate(kinds)]
  is_float = out[0] == "f" or any(k[0] == "f" for k in kinds)
  clamp, omod = (bool(inst.clamp), inst.omod) if vop3 else (False, 0)
  if (clamp or omod) and out[0] != "f": raise Unimplemented(f"{name} with integer clamp/omod")
  op = _finish_float(fn, kinds, out, clamp, omod) if is_float else (lambda w, *a: fn(*a))
  write = vwrite(inst.vdst, out, hi=bool(opsel >> 3 & 1))
  if len(readers) == 1:
    r0 = readers[0]
    return lambda w: write(w, op(w, r0(w)))
  if len(readers) == 2:
    r0, r1 = readers
    return lambda w: write(w, op(w, r0(w), r1(w)))
  r0, r1, r2 = readers
  return lambda w: write(w, op(w, r0(w), r1(w), r2(w)))


# ---------------------------------------------------------------- compares, carries, lane ops

def _cmp_pred(cond: str) -> Callable:
  nan = lambda a, b: np.isnan(a) | np.isnan(b)
  return {"f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool), "t": lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
          "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "ne": np.not_equal,
          "lg": lambda a, b: (a < b) | (a > b), "o": lambda a, b: ~nan(a, b), "u": nan, "nge": lambda a, b: ~(a >= b),
          "nlg": lambda a, b: ~((a < b) | (a > b)), "ngt": lambda a, b: ~(a > b), "nle": lambda a, b: ~(a <= b),
          "neq": lambda a, b: ~(a == b), "nlt": lambda a, b: ~(a < b), "class": alu.float_class}[cond]


def compile_cmp(inst: Inst, name: str) -> Fn:
  _, kind_cmp, cond, ty = (name.split("_") + [""])[:4]
  cmpx = kind_cmp == "cmpx"
  vop3 = inst.enc == "VOP3"
  absm, negm, opsel = (inst.abs, inst.neg, inst.opsel) if vop3 else (0, 0, 0)
  src1 = inst.src1 if vop3 else inst.vsrc1
  r0 = typed(inst.src0, inst.lit, ty, hi=bool(opsel & 1), neg=bool(negm & 1), absv=bool(absm & 1))
  r1 = typed(src1, inst.lit, "u32" if cond == "class" else ty, hi=bool(opsel & 2), neg=bool(negm & 2), absv=bool(absm & 2))
  pred = _cmp_pred(cond)
  dst = EXEC if cmpx else (inst.vdst if vop3 else VCC)
  write = swrite(dst)
  def run(w: Wave) -> None:
    res = pred(r0(w), r1(w))
    write(w, lanes_to_mask(res & w.em) if res.shape else (lanes_to_mask(w.em) if res else 0))
  return run


def _lane_mask_reader(code: int) -> Callable[[Wave], np.ndarray]:
  s = sread(code, None)
  return lambda w: mask_to_lanes(s(w))


def compile_cndmask(inst: Inst, name: str) -> Fn:
  vop3 = inst.enc == "VOP3"
  kind = "f16" if name.endswith("b16") else "f32"
  if vop3 and not (inst.abs or inst.neg): kind = "u16" if kind == "f16" else "u32"
  absm, negm, opsel = (inst.abs, inst.neg, inst.opsel) if vop3 else (0, 0, 0)
  r0 = typed(inst.src0, inst.lit, kind if vop3 else "u32", hi=bool(opsel & 1), neg=bool(negm & 1), absv=bool(absm & 1))
  r1 = typed(inst.src1 if vop3 else inst.vsrc1, inst.lit, kind if vop3 else "u32", hi=bool(opsel & 2), neg=bool(negm & 2), absv=bool(absm & 2))
  sel = _lane_mask_reader(inst.src2 if vop3 else VCC)
  write = vwrite(inst.vdst, kind if vop3 else "u32", hi=bool(opsel & 8))
  return lambda w: write(w, np.where(sel(w), r1(w), r0(w)))


def compile_carry(inst: Inst, name: str) -> Fn:
  """v_add/sub/subrev_co_u32 (carry out) and the _co_ci_ forms (carry in from VCC or src2)."""
  vop3 = inst.enc == "VOP3SD"
  r0 = vbits(inst.src0, inst.lit, 32, False)
  r1 = vbits(inst.src1 if vop3 else inst.vsrc1, inst.lit, 32, False)
  cin = _lane_mask_reader(inst.src2 if vop3 else VCC) if "_ci_" in name else None
  cout = swrite(inst.sdst if vop3 else VCC)
  write = vwrite(inst.vdst, "u32")
  sub, rev = "_sub" in name, "subrev" in name
  def run(w: Wave) -> None:
    a, b = np.asarray(r0(w), I64), np.asarray(r1(w), I64)
    if rev: a, b = b, a
    c = cin(w).astype(I64) if cin is not None else 0
    r = a - b - c if sub else a + b + c
    carry = (r < 0) if sub else (r > 0xFFFFFFFF)
    cout(w, lanes_to_mask(carry & w.em) if carry.shape else (lanes_to_mask(w.em) if carry else 0))
    write(w, (r & 0xFFFFFFFF).astype(U32))
  return run


def compile_mad64(inst: Inst, name: str) -> Fn:
  signed = "i64" in name
  r0, r1 = typed(inst.src0, inst.lit, "i32" if signed else "u32"), typed(inst.src1, inst.lit, "i32" if signed else "u32")
  r2 = vbits(inst.src2, inst.lit, 64, False)
  cout, write = swrite(inst.sdst), vwrite(inst.vdst, "u64")
  def run(w: Wave) -> None:
    a, b, c = (np.broadcast_to(np.asarray(x, object), (LANES,)) for x in (r0(w), r1(w), r2(w)))
    c = np.array([_s64(int(x)) if signed else int(x) for x in c], object)
    prod = np.array([int(x) * int(y) for x, y in zip(a, b)], object) + c
    lo = [int(p) & ((1 << 64) - 1) for p in prod]
    over = [(p > (1 << 63) - 1 or p < -(1 << 63)) if signed else p >= (1 << 64) for p in prod]
    cout(w, lanes_to_mask(np.array(over, bool) & w.em))
    write(w, np.array(lo, U64))
  return run


def compile_div_scale(inst: Inst, name: str) -> Fn:
  bits = 64 if name.endswith("f64") else 32
  kind = f"f{bits}"
  rs = [typed(s, inst.lit, kind, neg=bool(inst.neg >> i & 1)) for i, s in enumerate((inst.src0, inst.src1, inst.src2))]
  cout, write = swrite(inst.sdst), vwrite(inst.vdst, kind)
  def run(w: Wave) -> None:
    d, vcc = alu.div_scale(*(np.broadcast_to(r(w), (LANES,)) for r in rs), bits)
    cout(w, lanes_to_mask(vcc & w.em))
    write(w, d)
  return run


def compile_div_fmas(inst: Inst, name: str) -> Fn:
  bits = 64 if name.endswith("f64") else 32
  kind = f"f{bits}"
  rs = [typed(s, inst.lit, kind, neg=bool(inst.neg >> i & 1), absv=bool(inst.abs >> i & 1)) for i, s in enumerate((inst.src0, inst.src1, inst.src2))]
  vcc, write = _lane_mask_reader(VCC), vwrite(inst.vdst, kind)
  return lambda w: write(w, alu.div_fmas(rs[0](w), rs[1](w), rs[2](w), vcc(w), bits))


def compile_mbcnt(inst: Inst, name: str) -> Fn:
  r0, r1 = vbits(inst.src0, inst.lit, 32, False), vbits(inst.src1, inst.lit, 32, False)
  write = vwrite(inst.vdst, "u32")
  if name.endswith("lo_u32_b32"): return lambda w: write(w, alu.popcount(r0(w) & LANE_LT) + r1(w))
  return lambda w: write(w, np.broadcast_to(r1(w), (LANES,)))


def compile_lane_read(inst: Inst, name: str) -> Fn:
  src = inst.src0
  r = vbits(src, inst.lit, 32, False)
  write = swrite(inst.vdst)
  if name == "v_readfirstlane_b32":
    def first(w: Wave) -> None:
      lanes = w.idx
      write(w, int(np.broadcast_to(r(w), (LANES,))[lanes[0] if len(lanes) else 0]))
    return first
  lane = sread(inst.src1, inst.lit)
  return lambda w: write(w, int(np.broadcast_to(r(w), (LANES,))[lane(w) & 31]))


def compile_writelane(inst: Inst, name: str) -> Fn:
  val, lane = sread(inst.src0, inst.lit), sread(inst.src1, inst.lit)
  def run(w: Wave) -> None:
    w.v[inst.vdst][lane(w) & 31] = val(w)
  return run


def compile_permlane(inst: Inst, name: str) -> Fn:
  """v_permlane16_b32 / v_permlanex16_b32: lane l of each 16-lane row reads lane sel(l) of the same row (x16: the
  other row), sel(l) = nibble l%16 of the 64-bit selector {src2, src1}."""
  if inst.src0 < 256: raise Unimplemented(f"{name} with a non-VGPR source")
  src, lo, hi = inst.src0 - 256, sread(inst.src1, inst.lit), sread(inst.src2, inst.lit)
  write = vwrite(inst.vdst, "u32")
  row = (np.arange(LANES) // 16) * 16
  if name == "v_permlanex16_b32": row = row ^ 16
  def run(w: Wave) -> None:
    sel = lo(w) | (hi(w) << 32)
    lanes = row + np.array([(sel >> (4 * (k % 16))) & 0xF for k in range(LANES)])
    write(w, w.v[src][lanes].copy())
  return run


def compile_swap(inst: Inst, name: str) -> Fn:
  a, b = inst.vdst, inst.src0 - 256
  def run(w: Wave) -> None:
    x, y = w.v[a].copy(), w.v[b].copy()
    np.copyto(w.v[a], y, where=w.em)
    np.copyto(w.v[b], x, where=w.em)
  return run


# ---------------------------------------------------------------- VOP3P: packed 16-bit math, mixed fma, dots, WMMA

_PK: dict[str, tuple[str, Callable]] = {
  "v_pk_add_f16": ("f16", lambda a, b, c: a + b), "v_pk_mul_f16": ("f16", lambda a, b, c: a * b),
  "v_pk_fma_f16": ("f16", alu.fma16), "v_pk_min_f16": ("f16", lambda a, b, c: np.fmin(a, b)),
  "v_pk_max_f16": ("f16", lambda a, b, c: np.fmax(a, b)),
  "v_pk_add_u16": ("u16", lambda a, b, c: a + b), "v_pk_sub_u16": ("u16", lambda a, b, c: a - b),
  "v_pk_add_i16": ("u16", lambda a, b, c: a + b), "v_pk_sub_i16": ("u16", lambda a, b, c: a - b),
  "v_pk_mul_lo_u16": ("u16", lambda a, b, c: a * b), "v_pk_mad_u16": ("u16", lambda a, b, c: a * b + c),
  "v_pk_mad_i16": ("u16", lambda a, b, c: a * b + c),
  "v_pk_lshlrev_b16": ("u16", lambda a, b, c: b << (a & U16(15))), "v_pk_lshrrev_b16": ("u16", lambda a, b, c: b >> (a & U16(15))),
  "v_pk_ashrrev_i16": ("i16", lambda a, b, c: b >> (a & 15).astype(I16)),
  "v_pk_max_i16": ("i16", lambda a, b, c: np.maximum(a, b)), "v_pk_min_i16": ("i16", lambda a, b, c: np.minimum(a, b)),
  "v_pk_max_u16": ("u16", lambda a, b, c: np.maximum(a, b)), "v_pk_min_u16": ("u16", lambda a, b, c: np.minimum(a, b)),
}


def compile_pk(inst: Inst, name: str) -> Fn:
  kind, fn = _PK[name]
  flt = kind == "f16"
  srcs = (inst.src0, inst.src1, inst.src2)
  lo = [typed(s, inst.lit, kind, hi=bool(inst.opsel >> i & 1), neg=flt and bool(inst.neg >> i & 1)) for i, s in enumerate(srcs)]
  hi = [typed(s, inst.lit, kind, hi=bool(inst.opsel_hi >> i & 1), neg=flt and bool(inst.neg_hi >> i & 1)) for i, s in enumerate(srcs)]
  write, dt = vwrite(inst.vdst, "u32"), _DT[kind]
  clamp = bool(inst.clamp)
  def half(vals: list) -> np.ndarray:
    r = np.asarray(fn(*vals), dt)
    if clamp and flt: r = np.where(np.isnan(r), 0, np.clip(r, 0, 1)).astype(dt)
    return np.broadcast_to(r, (LANES,)).view(U16).astype(U32)
  return lambda w: write(w, half([r(w) for r in lo]) | (half([r(w) for r in hi]) << U32(16)))


def compile_pk_fmac(inst: Inst, name: str) -> Fn:
  """v_pk_fmac_f16 (VOP2): both halves d = fma(a, b, d)."""
  srcs = (inst.src0, inst.vsrc1, 256 + inst.vdst)
  lo = [typed(s, inst.lit, "f16") for s in srcs]
  hi = [typed(s, inst.lit, "f16", hi=True) for s in srcs]
  write = vwrite(inst.vdst, "u32")
  half = lambda vals: np.broadcast_to(alu.fma16(*vals), (LANES,)).view(U16).astype(U32)
  return lambda w: write(w, half([r(w) for r in lo]) | (half([r(w) for r in hi]) << U32(16)))


def compile_fma_mix(inst: Inst, name: str) -> Fn:
  """v_fma_mix*: each source is f32 (op_sel_hi=0) or the f16 half picked by op_sel (op_sel_hi=1); neg_hi acts as abs."""
  srcs = (inst.src0, inst.src1, inst.src2)
  rs = []
  for i, s in enumerate(srcs):
    f16 = bool(inst.opsel_hi >> i & 1)
    rs.append(typed(s, inst.lit, "f16" if f16 else "f32", hi=f16 and bool(inst.opsel >> i & 1), neg=bool(inst.neg >> i & 1),
                    absv=bool(inst.neg_hi >> i & 1)))
  if name == "v_fma_mix_f32":
    write = vwrite(inst.vdst, "f32")
    return lambda w: write(w, alu.fma32(*(np.asarray(r(w), F32) for r in rs)))
  write = vwrite(inst.vdst, "f16", hi=name == "v_fma_mixhi_f16")
  return lambda w: write(w, (np.asarray(rs[0](w), F64) * np.asarray(rs[1](w), F64) + np.asarray(rs[2](w), F64)).astype(F16))


def compile_dot2(inst: Inst, name: str) -> Fn:
  a_lo, b_lo = typed(inst.src0, inst.lit, "f16", neg=bool(inst.neg & 1)), typed(inst.src1, inst.lit, "f16", neg=bool(inst.neg & 2))
  a_hi = typed(inst.src0, inst.lit, "f16", hi=True, neg=bool(inst.neg_hi & 1))
  b_hi = typed(inst.src1, inst.lit, "f16", hi=True, neg=bool(inst.neg_hi & 2))
  c = typed(inst.src2, inst.lit, "f32")
  write = vwrite(inst.vdst, "f32")
  return lambda w: write(w, (np.asarray(a_lo(w), F64) * np.asarray(b_lo(w), F64) + np.asarray(a_hi(w), F64) * np.asarray(b_hi(w), F64)
                             + np.asarray(c(w), F64)).astype(F32))


def compile_wmma(inst: Inst, name: str) -> Fn:
  """v_wmma_*_16x16x16: lane l holds row l%16 of A and column l%16 of B (16 halves in 8 VGPRs; lanes 16-31 repeat
  lanes 0-15); accumulator element j of lane l is D[2j + l//16][l%16] (f32: one VGPR each; f16/bf16: the half
  picked by op_sel[2] of VGPR j)."""
  if inst.src0 < 256 or inst.src1 < 256 or inst.src2 < 256:
    raise Unimplemented(f"{name} with a non-VGPR source")
  a0, b0, c0, d0 = inst.src0 - 256, inst.src1 - 256, inst.src2 - 256, inst.vdst
  bf = "bf16" in name
  out16 = name.startswith(("v_wmma_f16", "v_wmma_bf16"))
  hi = bool(inst.opsel & 4)
  rows = 2 * np.arange(8)[:, None] + (np.arange(LANES)[None, :] // 16)
  cols = np.broadcast_to(np.arange(LANES)[None, :] % 16, (8, LANES))

  integer = "_iu" in name
  if integer:
    bits = 8 if name.endswith("iu8") else 4
    nregs = 16 * bits // 32
    sa, sb = bool(inst.neg & 1), bool(inst.neg & 2)  # neg bits mark A / B as signed
    def ints(regs: np.ndarray, signed: bool) -> np.ndarray:  # (nregs, 32) -> (32 lanes, 16) int64
      per = 32 // bits
      v = np.stack([(regs >> U32(bits * i)) & U32((1 << bits) - 1) for i in range(per)], axis=1).reshape(nregs * per, LANES).T
      v = v.astype(I64)
      return np.where(signed & (v >= (1 << (bits - 1))), v - (1 << bits), v)
    def run_int(w: Wave) -> None:
      if not w.full: raise EmulatorError(f"{w.kernel}: {name} executed with EXEC != all lanes")
      a, b = ints(w.v[a0:a0 + nregs], sa)[:16], ints(w.v[b0:b0 + nregs], sb)[:16].T
      c = np.zeros((16, 16), I64)
      c[rows, cols] = w.v[c0:c0 + 8].view(I32)
      d = a @ b + c
      d = np.clip(d, -(1 << 31), (1 << 31) - 1) if inst.clamp else d
      w.v[d0:d0 + 8] = (d[rows, cols] & 0xFFFFFFFF).astype(U32)
    return run_int

  def halves(regs: np.ndarray) -> np.ndarray:  # (8, 32) uint32 -> (32 lanes, 16) f32
    h = np.stack([regs & U32(0xFFFF), regs >> U32(16)], axis=1).reshape(16, LANES).T.astype(U32)
    return alu.bf16_to_f32(h) if bf else h.astype(U16).view(F16).astype(F32)

  def run(w: Wave) -> None:
    if not w.full: raise EmulatorError(f"{w.kernel}: {name} executed with EXEC != all lanes")
    a = halves(w.v[a0:a0 + 8])[:16]           # A[row][k]
    b = halves(w.v[b0:b0 + 8])[:16].T         # B[k][col]
    if out16:
      craw = (w.v[c0:c0 + 8] >> U32(16 if hi else 0)) & U32(0xFFFF)
      cmat_l = alu.bf16_to_f32(craw) if bf else craw.astype(U16).view(F16).astype(F32)
    else:
      cmat_l = w.v[c0:c0 + 8].view(F32)
    c = np.zeros((16, 16), F32)
    c[rows, cols] = cmat_l
    d = (a.astype(F32) @ b.astype(F32) + c).astype(F32)
    dl = d[rows, cols]
    if out16:
      bits = alu.f32_to_bf16(dl) if bf else dl.astype(F16).view(U16).astype(U32)
      sh, keep = (U32(16), U32(0xFFFF)) if hi else (U32(0), U32(0xFFFF0000))
      w.v[d0:d0 + 8] = (w.v[d0:d0 + 8] & keep) | (bits.astype(U32) << sh)
    else:
      w.v[d0:d0 + 8] = dl.view(U32)
  return run


# ---------------------------------------------------------------- VOPD (two independent ops in one instruction)

_DUAL: dict[str, Callable] = {
  "fmac_f32": lambda a, b, d, k: alu.fma32(a, b, d), "fmaak_f32": lambda a, b, d, k: alu.fma32(a, b, k),
  "fmamk_f32": lambda a, b, d, k: alu.fma32(a, k, b), "mul_f32": lambda a, b, d, k: a * b, "add_f32": lambda a, b, d, k: a + b,
  "sub_f32": lambda a, b, d, k: a - b, "subrev_f32": lambda a, b, d, k: b - a, "mov_b32": lambda a, b, d, k: a,
  "max_f32": lambda a, b, d, k: np.fmax(a, b), "min_f32": lambda a, b, d, k: np.fmin(a, b),
}
_DUAL_INT: dict[str, Callable] = {"add_nc_u32": lambda a, b: a + b, "lshlrev_b32": lambda a, b: b << (a & U32(31)),
                                  "and_b32": lambda a, b: a & b, "mov_b32": lambda a, b: a}


def _dual_half(name: str, src0: int, vsrc1: int, vdst: int, lit: int | None) -> tuple[Callable, int]:
  op = name.removeprefix("v_dual_")
  k = U32(lit if lit is not None else 0).view(F32)
  if op == "cndmask_b32":
    r0, r1, sel = vbits(src0, lit, 32, False), vbits(vsrc1, lit, 32, False), _lane_mask_reader(VCC)
    return (lambda w: np.where(sel(w), r1(w), r0(w))), vdst
  if op in _DUAL_INT:
    r0, r1, fi = vbits(src0, lit, 32, False), vbits(vsrc1, lit, 32, False), _DUAL_INT[op]
    return (lambda w: np.asarray(fi(r0(w), r1(w)), U32)), vdst
  if op not in _DUAL: raise Unimplemented(name)
  f0, f1, fd, ff = typed(src0, lit, "f32"), typed(vsrc1, lit, "f32"), typed(256 + vdst, lit, "f32"), _DUAL[op]
  def run(w: Wave) -> np.ndarray:
    a, b = f0(w), f1(w)
    if w.ftz32: a, b = alu.ftz(np.asarray(a, F32)), alu.ftz(np.asarray(b, F32))
    r = np.asarray(ff(a, b, fd(w), k), F32)
    return (alu.ftz(r) if w.ftz32 else r).view(U32)
  return run, vdst


def compile_vopd(inst: Inst, name: str) -> Fn:
  fx, dx = _dual_half(inst.namex, inst.srcx0, inst.vsrcx1, inst.vdstx, inst.lit)
  fy, dy = _dual_half(inst.namey, inst.srcy0, inst.vsrcy1, inst.vdsty, inst.lit)
  def run(w: Wave) -> None:
    x, y = np.array(fx(w), U32), np.array(fy(w), U32)  # copies: both halves read before either writes
    np.copyto(w.v[dx], x, where=w.em)
    np.copyto(w.v[dy], y, where=w.em)
  return run


# ---------------------------------------------------------------- scalar ALU

def _scc_nz(r: int) -> tuple[int, int]:
  return r, int(r != 0)


def _bfe(a: int, b: int, bits: int, signed: bool) -> int:
  off, width = b & (bits - 1), (b >> 16) & 0x7F
  v = (a >> off) & ((1 << width) - 1) if width else 0
  if signed and width and v >> (width - 1) & 1: v -= 1 << width
  return v & ((1 << bits) - 1)


M32, M64 = 0xFFFFFFFF, (1 << 64) - 1
SOP2_FN: dict[str, Callable[[int, int, int], tuple[int, int | None]]] = {
  "s_add_u32": lambda a, b, c: ((a + b) & M32, int(a + b > M32)), "s_sub_u32": lambda a, b, c: ((a - b) & M32, int(b > a)),
  "s_addc_u32": lambda a, b, c: ((a + b + c) & M32, int(a + b + c > M32)),
  "s_subb_u32": lambda a, b, c: ((a - b - c) & M32, int(b + c > a)),
  "s_add_i32": lambda a, b, c: ((a + b) & M32, int(not -(1 << 31) <= _s32(a) + _s32(b) < (1 << 31))),
  "s_sub_i32": lambda a, b, c: ((a - b) & M32, int(not -(1 << 31) <= _s32(a) - _s32(b) < (1 << 31))),
  "s_absdiff_i32": lambda a, b, c: _scc_nz(abs(_s32(a) - _s32(b)) & M32),
  "s_lshl_b32": lambda a, b, c: _scc_nz((a << (b & 31)) & M32), "s_lshl_b64": lambda a, b, c: _scc_nz((a << (b & 63)) & M64),
  "s_lshr_b32": lambda a, b, c: _scc_nz(a >> (b & 31)), "s_lshr_b64": lambda a, b, c: _scc_nz(a >> (b & 63)),
  "s_ashr_i32": lambda a, b, c: _scc_nz((_s32(a) >> (b & 31)) & M32), "s_ashr_i64": lambda a, b, c: _scc_nz((_s64(a) >> (b & 63)) & M64),
  **{f"s_lshl{k}_add_u32": (lambda a, b, c, k=k: (((a << k) + b) & M32, int(((a << k) + b) > M32))) for k in (1, 2, 3, 4)},
  "s_min_i32": lambda a, b, c: (a if _s32(a) < _s32(b) else b, int(_s32(a) < _s32(b))),
  "s_min_u32": lambda a, b, c: (min(a, b), int(a < b)),
  "s_max_i32": lambda a, b, c: (a if _s32(a) >= _s32(b) else b, int(_s32(a) >= _s32(b))),
  "s_max_u32": lambda a, b, c: (max(a, b), int(a >= b)),
  **{f"s_{n}_b{w}": (lambda a, b, c, f=f, m=m: _scc_nz(f(a, b) & m)) for w, m in ((32, M32), (64, M64)) for n, f in (
    ("and", lambda a, b: a & b), ("or", lambda a, b: a | b), ("xor", lambda a, b: a ^ b), ("nand", lambda a, b: ~(a & b)),
    ("nor", lambda a, b: ~(a | b)), ("xnor", lambda a, b: ~(a ^ b)), ("and_not1", lambda a, b: a & ~b), ("or_not1", lambda a, b: a | ~b))},
  "s_bfe_u32": lambda a, b, c: _scc_nz(_bfe(a, b, 32, False)), "s_bfe_i32": lambda a, b, c: _scc_nz(_bfe(a, b, 32, True)),
  "s_bfe_u64": lambda a, b, c: _scc_nz(_bfe(a, b, 64, False)), "s_bfe_i64": lambda a, b, c: _scc_nz(_bfe(a, b, 64, True)),
  "s_bfm_b32": lambda a, b, c: ((((1 << (a & 31)) - 1) << (b & 31)) & M32, None),
  "s_bfm_b64": lambda a, b, c: ((((1 << (a & 63)) - 1) << (b & 63)) & M64, None),
  "s_mul_i32": lambda a, b, c: ((_s32(a) * _s32(b)) & M32, None), "s_mul_hi_u32": lambda a, b, c: ((a * b) >> 32, None),
  "s_mul_hi_i32": lambda a, b, c: (((_s32(a) * _s32(b)) >> 32) & M32, None),
  "s_cselect_b32": lambda a, b, c: (a if c else b, None), "s_cselect_b64": lambda a, b, c: (a if c else b, None),
  "s_pack_ll_b32_b16": lambda a, b, c: ((a & 0xFFFF) | ((b & 0xFFFF) << 16), None),
  "s_pack_lh_b32_b16": lambda a, b, c: ((a & 0xFFFF) | (b & 0xFFFF0000), None),
  "s_pack_hh_b32_b16": lambda a, b, c: ((a >> 16) | (b & 0xFFFF0000), None),
  "s_pack_hl_b32_b16": lambda a, b, c: ((a >> 16) | ((b & 0xFFFF) << 16), None),
}
_SOP2_64_SRC1 = {"s_lshl_b64": 32, "s_lshr_b64": 32, "s_ashr_i64": 32, "s_bfe_u64": 32, "s_bfe_i64": 32, "s_bfm_b64": 32}


def _bits_of(name: str) -> int:
  return 64 if "64" in name.rsplit("_", 1)[-1] else 32


def compile_sop2(inst: Inst, name: str) -> Fn:
  fn = SOP2_FN[name]
  w64 = _bits_of(name) == 64
  a = sread(inst.ssrc0, inst.lit, 64 if w64 and name != "s_bfm_b64" else 32)
  b = sread(inst.ssrc1, inst.lit, _SOP2_64_SRC1.get(name, 64 if w64 else 32))
  write = swrite(inst.sdst, 64 if w64 else 32)
  def run(w: Wave) -> None:
    r, scc = fn(a(w), b(w), w.scc)
    write(w, r)
    if scc is not None: w.scc = scc
  return run


def _ctz(x: int, bits: int) -> int:
  return (x & -x).bit_length() - 1 if x else -1


def _clz(x: int, bits: int) -> int:
  return bits - x.bit_length() if x else -1


SOP1_FN: dict[str, Callable[[int, int], tuple[int, int | None]]] = {
  "s_mov_b32": lambda a, c: (a, None), "s_mov_b64": lambda a, c: (a, None),
  "s_not_b32": lambda a, c: _scc_nz(~a & M32), "s_not_b64": lambda a, c: _scc_nz(~a & M64),
  "s_brev_b32": lambda a, c: (int(f"{a:032b}"[::-1], 2), None), "s_brev_b64": lambda a, c: (int(f"{a:064b}"[::-1], 2), None),
  "s_ctz_i32_b32": lambda a, c: (_ctz(a, 32) & M32, None), "s_ctz_i32_b64": lambda a, c: (_ctz(a, 64) & M32, None),
  "s_clz_i32_u32": lambda a, c: (_clz(a, 32) & M32, None), "s_clz_i32_u64": lambda a, c: (_clz(a, 64) & M32, None),
  "s_sext_i32_i8": lambda a, c: ((((a & 0xFF) ^ 0x80) - 0x80) & M32, None),
  "s_sext_i32_i16": lambda a, c: ((((a & 0xFFFF) ^ 0x8000) - 0x8000) & M32, None),
  "s_abs_i32": lambda a, c: _scc_nz(abs(_s32(a)) & M32),
  "s_cls_i32": lambda a, c: (_clz(a ^ (M32 if a >> 31 else 0), 32) if a not in (0, M32) else M32, None),
  "s_cls_i32_i64": lambda a, c: (_clz(a ^ (M64 if a >> 63 else 0), 64) if a not in (0, M64) else M32, None),
  "s_bcnt0_i32_b32": lambda a, c: _scc_nz(32 - bin(a).count("1")), "s_bcnt0_i32_b64": lambda a, c: _scc_nz(64 - bin(a).count("1")),
  "s_bcnt1_i32_b32": lambda a, c: _scc_nz(bin(a).count("1")), "s_bcnt1_i32_b64": lambda a, c: _scc_nz(bin(a).count("1")),
}
_SAVEEXEC: dict[str, Callable[[int, int], int]] = {
  "and": lambda s, e: s & e, "or": lambda s, e: s | e, "xor": lambda s, e: s ^ e, "nand": lambda s, e: ~(s & e), "nor": lambda s, e: ~(s | e),
  "xnor": lambda s, e: ~(s ^ e), "and_not0": lambda s, e: ~s & e, "or_not0": lambda s, e: ~s | e, "and_not1": lambda s, e: s & ~e,
  "or_not1": lambda s, e: s | ~e}  # saveexec: EXEC = op(SSRC0, EXEC), notN negates operand N


def compile_sop1(inst: Inst, name: str) -> Fn:
  if name.endswith(("_saveexec_b32", "_wrexec_b32")):
    kind = name[2:].rsplit("_", 2)[0]
    f, src, dst = _SAVEEXEC[kind], sread(inst.ssrc0, inst.lit), swrite(inst.sdst)
    wrexec = "wrexec" in name
    def saveexec(w: Wave) -> None:
      old, s = w.s[EXEC], src(w)
      new = f(s, old) & M32
      w.set_exec(new)
      w.scc = int(new != 0)
      dst(w, new if wrexec else old)
    return saveexec
  if name in ("s_bitset0_b32", "s_bitset1_b32", "s_bitset0_b64", "s_bitset1_b64"):
    bits, one = _bits_of(name), "bitset1" in name
    src, dst, cur = sread(inst.ssrc0, inst.lit), swrite(inst.sdst, bits), sread(inst.sdst, None, bits)
    return lambda w: dst(w, (cur(w) | (1 << (src(w) & (bits - 1)))) if one else (cur(w) & ~(1 << (src(w) & (bits - 1)))))
  if name in ("s_cmov_b32", "s_cmov_b64"):
    bits = _bits_of(name)
    src, dst = sread(inst.ssrc0, inst.lit, bits), swrite(inst.sdst, bits)
    def cmov(w: Wave) -> None:
      if w.scc: dst(w, src(w))
    return cmov
  if name == "s_getpc_b64":
    dst, nxt = swrite(inst.sdst, 64), inst.addr + inst.size
    return lambda w: dst(w, w.code_base + nxt)
  if name in ("s_setpc_b64", "s_swappc_b64"):
    src, dst, nxt = sread(inst.ssrc0, inst.lit, 64), swrite(inst.sdst, 64), inst.addr + inst.size
    def setpc(w: Wave) -> int:
      target = src(w)
      if name == "s_swappc_b64": dst(w, w.code_base + nxt)
      return target - w.code_base
    return setpc
  fn = SOP1_FN[name]
  bits = _bits_of(name) if not name.startswith(("s_ctz", "s_clz", "s_bcnt")) else (64 if name.endswith("64") else 32)
  src = sread(inst.ssrc0, inst.lit, bits)
  dst = swrite(inst.sdst, 64 if name in ("s_mov_b64", "s_not_b64", "s_brev_b64") else 32)
  def run(w: Wave) -> None:
    r, scc = fn(src(w), w.scc)
    dst(w, r)
    if scc is not None: w.scc = scc
  return run


_SCMP = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
         "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}


def compile_sopc(inst: Inst, name: str) -> Fn:
  if name.startswith("s_bitcmp"):
    bits = _bits_of(name)
    a, b, want = sread(inst.ssrc0, inst.lit, bits), sread(inst.ssrc1, inst.lit), int(name[8])
    def bitcmp(w: Wave) -> None:
      w.scc = int(((a(w) >> (b(w) & (bits - 1))) & 1) == want)
    return bitcmp
  _, _, cond, ty = name.split("_")
  width = 64 if ty.endswith("64") else 32
  a, b, f = sread(inst.ssrc0, inst.lit, width), sread(inst.ssrc1, inst.lit, width), _SCMP[cond]
  if ty == "i32":
    def cmp_i(w: Wave) -> None:
      w.scc = int(f(_s32(a(w)), _s32(b(w))))
    return cmp_i
  def cmp_u(w: Wave) -> None:
    w.scc = int(f(a(w), b(w)))
  return cmp_u


def compile_sopk(inst: Inst, name: str) -> Fn:
  k = inst.simm16
  ks = k - 0x10000 if k & 0x8000 else k
  dst, cur = swrite(inst.sdst), sread(inst.sdst, None)
  if name == "s_movk_i32": return lambda w: dst(w, ks & M32)
  if name == "s_cmovk_i32":
    def cmovk(w: Wave) -> None:
      if w.scc: dst(w, ks & M32)
    return cmovk
  if name == "s_addk_i32":
    def addk(w: Wave) -> None:
      a = _s32(cur(w))
      w.scc = int(not -(1 << 31) <= a + ks < (1 << 31))
      dst(w, (a + ks) & M32)
    return addk
  if name == "s_mulk_i32": return lambda w: dst(w, (_s32(cur(w)) * ks) & M32)
  if name.startswith("s_cmpk_"):
    _, _, cond, ty = name.split("_")
    f = _SCMP[cond]
    if ty == "i32":
      def cmpk_i(w: Wave) -> None:
        w.scc = int(f(_s32(cur(w)), ks))
      return cmpk_i
    def cmpk_u(w: Wave) -> None:
      w.scc = int(f(cur(w), k))
    return cmpk_u
  if name in ("s_getreg_b32", "s_setreg_b32"):
    hwreg, off, size = k & 0x3F, (k >> 6) & 0x1F, ((k >> 11) & 0x1F) + 1
    if hwreg != 1: raise Unimplemented(f"{name} of hardware register {hwreg} (only MODE is emulated)")
    field = ((1 << size) - 1) << off
    if name == "s_getreg_b32": return lambda w: dst(w, (w.mode & field) >> off)
    return lambda w: w.set_mode((w.mode & ~field) | ((cur(w) << off) & field))
  if name.startswith("s_waitcnt"): return lambda w: None
  raise Unimplemented(name)


def compile_sopp(inst: Inst, name: str) -> Fn:
  k = inst.simm16
  target = inst.addr + 4 + 4 * (k - 0x10000 if k & 0x8000 else k)
  if name == "s_branch": return lambda w: target
  cond = {"s_cbranch_scc0": lambda w: not w.scc, "s_cbranch_scc1": lambda w: w.scc, "s_cbranch_vccz": lambda w: w.s[VCC] == 0,
          "s_cbranch_vccnz": lambda w: w.s[VCC] != 0, "s_cbranch_execz": lambda w: w.s[EXEC] == 0,
          "s_cbranch_execnz": lambda w: w.s[EXEC] != 0}.get(name)
  if cond is not None: return lambda w: target if cond(w) else None
  if name == "s_endpgm": return lambda w: ENDPGM
  if name == "s_barrier": return lambda w: BARRIER
  if name == "s_denorm_mode": return lambda w: w.set_mode((w.mode & ~0xF0) | ((k & 0xF) << 4))
  if name == "s_round_mode": return lambda w: w.set_mode((w.mode & ~0xF) | (k & 0xF))
  if name == "s_trap":
    def trap(w: Wave) -> None:
      raise EmulatorError(f"kernel {w.kernel}: s_trap {k:#x} at offset {inst.addr:#x} (the kernel trapped, e.g. __builtin_trap or a failed assert)")
    return trap
  if name in ("s_nop", "s_clause", "s_delay_alu", "s_waitcnt_depctr", "s_waitcnt", "s_set_inst_prefetch_distance", "s_sendmsg",
              "s_icache_inv", "s_setprio", "s_wait_idle", "s_sleep"): return lambda w: None
  raise Unimplemented(name)


# ---------------------------------------------------------------- memory

def compile_smem(inst: Inst, name: str) -> Fn:
  if name in ("s_gl1_inv", "s_dcache_inv"): return lambda w: None
  n = {"s_load_b32": 1, "s_load_b64": 2, "s_load_b128": 4, "s_load_b256": 8, "s_load_b512": 16}[name]
  base, soff, off, d = sread(inst.sbase, None, 64), sread(inst.soffset, None), inst.offset, inst.sdata
  def run(w: Wave) -> None:
    addr = (base(w) + off + soff(w)) & ~3 & M64
    vals = np.frombuffer(w.mem.read(addr, 4 * n), "<u4")
    for i in range(n):
      if d + i < 128 and d + i != NULL: w.s[d + i] = int(vals[i])
    if d <= EXEC < d + n: w.set_exec(w.s[EXEC])
  return run


_LOADS = {"u8": (1, "u8"), "i8": (1, "i8"), "u16": (2, "u16"), "i16": (2, "i16"), "b32": (4, None), "b64": (8, None), "b96": (12, None),
          "b128": (16, None), "d16_u8": (1, "lo_u8"), "d16_i8": (1, "lo_i8"), "d16_b16": (2, "lo"), "d16_hi_u8": (1, "hi_u8"),
          "d16_hi_i8": (1, "hi_i8"), "d16_hi_b16": (2, "hi")}
_STORES = {"b8": (1, False), "b16": (2, False), "b32": (4, False), "b64": (8, False), "b96": (12, False), "b128": (16, False),
           "d16_hi_b8": (1, True), "d16_hi_b16": (2, True)}


def _load_writer(vdst: int, nbytes: int, ext: str | None) -> Callable[[Wave, np.ndarray, np.ndarray], None]:
  """Write gathered bytes (n, nbytes) of lanes `idx` into VGPRs (extension / d16 half per the load kind)."""
  def write(w: Wave, idx: np.ndarray, data: np.ndarray) -> None:
    if ext is None:
      words = np.ascontiguousarray(data).view("<u4").astype(U32)  # (n, nbytes/4)
      for j in range(nbytes // 4): w.v[vdst + j][idx] = words[:, j]
      return
    raw = np.ascontiguousarray(data).view("<u2" if nbytes == 2 else U8)[:, 0].astype(U32)
    if ext.endswith("i8"): raw = ((raw ^ 0x80) - 0x80) & 0xFFFF if ext != "i8" else ((raw.astype(np.int64) ^ 0x80) - 0x80).astype(U32)
    if ext == "i16": raw = ((raw.astype(np.int64) ^ 0x8000) - 0x8000).astype(U32)
    if ext.startswith("lo"): w.v[vdst][idx] = (w.v[vdst][idx] & U32(0xFFFF0000)) | (raw & U32(0xFFFF))
    elif ext.startswith("hi"): w.v[vdst][idx] = (w.v[vdst][idx] & U32(0xFFFF)) | ((raw & U32(0xFFFF)) << U32(16))
    else: w.v[vdst][idx] = raw
  return write


def _store_bytes(w: Wave, data_reg: int, idx: np.ndarray, nbytes: int, hi: bool) -> np.ndarray:
  if nbytes >= 4:
    return np.ascontiguousarray(w.v[data_reg:data_reg + nbytes // 4, idx].T.astype("<u4")).view(np.uint8).reshape(len(idx), nbytes)
  vals = w.v[data_reg][idx] >> U32(16 if hi else 0)
  return np.ascontiguousarray(vals.astype("<u4")).view(np.uint8).reshape(len(idx), 4)[:, :nbytes]


def _mem_kind(name: str) -> tuple[str, str]:
  body = name.split("_", 1)[1]
  op, _, rest = body.partition("_")
  return op, rest


_ATOMIC_FN: dict[str, Callable[[Any, Any], Any]] = {
  "add_u32": lambda m, v: m + v, "sub_u32": lambda m, v: m - v, "min_i32": lambda m, v: np.minimum(m.view(I32), v.view(I32)).view(U32),
  "min_u32": np.minimum, "max_i32": lambda m, v: np.maximum(m.view(I32), v.view(I32)).view(U32), "max_u32": np.maximum,
  "and_b32": lambda m, v: m & v, "or_b32": lambda m, v: m | v, "xor_b32": lambda m, v: m ^ v, "swap_b32": lambda m, v: v,
  "add_f32": lambda m, v: (m.view(F32) + v.view(F32)).view(U32),
  "min_f32": lambda m, v: np.fmin(m.view(F32), v.view(F32)).view(U32), "max_f32": lambda m, v: np.fmax(m.view(F32), v.view(F32)).view(U32)}


def compile_global(inst: Inst, name: str) -> Fn:
  """GLOBAL_* and FLAT_* (flat addresses are treated as global ones; LDS/scratch apertures are refused)."""
  op, kind = _mem_kind(name)
  off, saddr = inst.offset, inst.saddr
  if saddr != NULL and inst.enc == "GLOBAL":
    sbase, vr = sread(saddr, None, 64), inst.vaddr
    def addr_of(w: Wave, idx: np.ndarray) -> np.ndarray:
      a = U64(sbase(w)) + w.v[vr][idx].astype(U64)
      return a + U64(off) if off >= 0 else a - U64(-off)
  else:
    vr = inst.vaddr
    def addr_of(w: Wave, idx: np.ndarray) -> np.ndarray:
      a = w.v[vr][idx].astype(U64) | (w.v[vr + 1][idx].astype(U64) << U64(32))
      return a + U64(off) if off >= 0 else a - U64(-off)
  def check_aperture(w: Wave, addrs: np.ndarray) -> None:
    if inst.enc == "FLAT" and np.any((addrs >> U64(48)) != 0):
      raise EmulatorError(f"{w.kernel}: flat access to address {int(addrs[0]):#x} in the LDS/scratch aperture is not emulated")
  if op == "load":
    nbytes, ext = _LOADS[kind]
    write = _load_writer(inst.vdst, nbytes, ext)
    def load(w: Wave) -> None:
      idx = w.idx
      addrs = addr_of(w, idx)
      check_aperture(w, addrs)
      write(w, idx, gather_global(w.mem, addrs, nbytes))
    return load
  if op == "store":
    nbytes, hi = _STORES[kind]
    def store(w: Wave) -> None:
      idx = w.idx
      addrs = addr_of(w, idx)
      check_aperture(w, addrs)
      scatter_global(w.mem, addrs, _store_bytes(w, inst.data, idx, nbytes, hi))
    return store
  if op == "atomic":
    rtn = bool(inst.glc)
    if kind == "cmpswap_b32": fn = None
    elif kind == "add_u64": fn = "u64"
    elif kind in _ATOMIC_FN: fn = _ATOMIC_FN[kind]
    else: raise Unimplemented(name)
    def atomic(w: Wave) -> None:
      idx = w.idx
      addrs = addr_of(w, idx)
      for j, (lane, a) in enumerate(zip(idx, addrs)):  # lanes in order: each sees the previous ones' results
        nb = 8 if fn == "u64" else 4
        old = np.frombuffer(w.mem.read(int(a), nb), "<u8" if nb == 8 else "<u4")[0]
        if fn is None:
          new = w.v[inst.data][lane] if old == w.v[inst.data + 1][lane] else old
        elif fn == "u64":
          new = old + (U64(w.v[inst.data][lane]) | (U64(w.v[inst.data + 1][lane]) << U64(32)))
        else:
          new = fn(np.array(old, U32), np.array(w.v[inst.data][lane], U32))
        w.mem.write(int(a), np.asarray(new, "<u8" if nb == 8 else "<u4").tobytes())
        if rtn:
          w.v[inst.vdst][lane] = U32(int(old) & M32)
          if nb == 8: w.v[inst.vdst + 1][lane] = U32(int(old) >> 32)
    return atomic
  raise Unimplemented(name)


def compile_scratch(inst: Inst, name: str) -> Fn:
  op, kind = _mem_kind(name)
  off, vr = inst.offset, inst.vaddr
  soff = sread(inst.saddr, None) if inst.saddr != NULL else (lambda w: 0)
  sve = bool(inst.sve)
  def addr_of(w: Wave, idx: np.ndarray) -> np.ndarray:
    a = np.full(len(idx), soff(w) + off, np.int64)
    if sve: a = a + w.v[vr][idx].astype(np.int64)
    return a
  if op == "load":
    nbytes, ext = _LOADS[kind]
    write = _load_writer(inst.vdst, nbytes, ext)
    def load(w: Wave) -> None:
      idx = w.idx
      pos = scratch_index(w, addr_of(w, idx), nbytes, name)
      write(w, idx, w.scratch[idx[:, None], pos])
    return load
  nbytes, hi = _STORES[kind]
  def store(w: Wave) -> None:
    idx = w.idx
    pos = scratch_index(w, addr_of(w, idx), nbytes, name)
    w.scratch[idx[:, None], pos] = _store_bytes(w, inst.data, idx, nbytes, hi)
  return store


_DS_LOAD = {"ds_load_b32": 4, "ds_load_b64": 8, "ds_load_b96": 12, "ds_load_b128": 16}
_DS_STORE = {"ds_store_b32": 4, "ds_store_b64": 8, "ds_store_b96": 12, "ds_store_b128": 16, "ds_store_b8": 1, "ds_store_b16": 2,
             "ds_store_b8_d16_hi": -1, "ds_store_b16_d16_hi": -2}
_DS_LOAD_SMALL = {"ds_load_u8": (1, "u8"), "ds_load_i8": (1, "i8"), "ds_load_u16": (2, "u16"), "ds_load_i16": (2, "i16"),
                  "ds_load_u8_d16": (1, "lo_u8"), "ds_load_u8_d16_hi": (1, "hi_u8"), "ds_load_i8_d16": (1, "lo_i8"),
                  "ds_load_i8_d16_hi": (1, "hi_i8"), "ds_load_u16_d16": (2, "lo"), "ds_load_u16_d16_hi": (2, "hi")}
_DS_ATOMIC = {"ds_add_u32": "add_u32", "ds_sub_u32": "sub_u32", "ds_min_i32": "min_i32", "ds_max_i32": "max_i32", "ds_min_u32": "min_u32",
              "ds_max_u32": "max_u32", "ds_and_b32": "and_b32", "ds_or_b32": "or_b32", "ds_xor_b32": "xor_b32", "ds_add_f32": "add_f32",
              "ds_min_f32": "min_f32", "ds_max_f32": "max_f32",
              "ds_add_rtn_u32": "add_u32"}


def compile_ds(inst: Inst, name: str) -> Fn:
  if inst.gds: raise Unimplemented(f"{name} with gds")
  va, d0, d1, vd = inst.vaddr, inst.data0, inst.data1, inst.vdst
  single = inst.offset0 | (inst.offset1 << 8)
  def base(w: Wave, idx: np.ndarray) -> np.ndarray:
    return w.v[va][idx].astype(np.int64)
  if name in _DS_LOAD or name in _DS_LOAD_SMALL:
    nbytes, ext = (_DS_LOAD[name], None) if name in _DS_LOAD else _DS_LOAD_SMALL[name]
    write = _load_writer(vd, nbytes, ext)
    def load(w: Wave) -> None:
      idx = w.idx
      write(w, idx, w.lds[lds_index(w, base(w, idx) + single, nbytes, name)])
    return load
  if name in _DS_STORE:
    nbytes = _DS_STORE[name]
    hi, nbytes = nbytes < 0, abs(nbytes)
    def store(w: Wave) -> None:
      idx = w.idx
      w.lds[lds_index(w, base(w, idx) + single, nbytes, name)] = _store_bytes(w, d0, idx, nbytes, hi)
    return store
  if "_2addr" in name:
    size = 8 if name.endswith("b64") else 4
    stride = size * (64 if "stride64" in name else 1)
    o0, o1 = inst.offset0 * stride, inst.offset1 * stride
    if name.startswith("ds_load"):
      w0, w1 = _load_writer(vd, size, None), _load_writer(vd + size // 4, size, None)
      def load2(w: Wave) -> None:
        idx = w.idx
        b = base(w, idx)
        x, y = w.lds[lds_index(w, b + o0, size, name)], w.lds[lds_index(w, b + o1, size, name)]
        w0(w, idx, x)
        w1(w, idx, y)
      return load2
    def store2(w: Wave) -> None:
      idx = w.idx
      b = base(w, idx)
      w.lds[lds_index(w, b + o0, size, name)] = _store_bytes(w, d0, idx, size, False)
      w.lds[lds_index(w, b + o1, size, name)] = _store_bytes(w, d1, idx, size, False)
    return store2
  if name in _DS_ATOMIC:
    fn, rtn = _ATOMIC_FN[_DS_ATOMIC[name]], "_rtn_" in name
    def atomic(w: Wave) -> None:
      idx = w.idx
      pos = lds_index(w, base(w, idx) + single, 4, name)
      lds32 = w.lds.view(U8)
      for lane, p in zip(idx, pos):
        old = np.frombuffer(lds32[p].tobytes(), "<u4")[0]
        lds32[p] = np.frombuffer(np.asarray(fn(np.array(old, U32), np.array(w.v[d0][lane], U32)), "<u4").tobytes(), U8)
        if rtn: w.v[vd][lane] = old
    return atomic
  if name == "ds_swizzle_b32":
    lane = np.arange(LANES)
    if single & 0x8000:  # quad permute: each lane of a quad picks a lane of its quad
      src_lane = (lane & ~3) | ((single >> (2 * (lane & 3))) & 3)
    else:  # bitmask permute within 32 lanes: ((lane & and) | or) ^ xor
      src_lane = ((lane & (single & 0x1F)) | ((single >> 5) & 0x1F)) ^ ((single >> 10) & 0x1F)
    def swizzle(w: Wave) -> None:
      res = w.v[d0][src_lane].copy()
      res[~w.em[src_lane]] = 0
      np.copyto(w.v[vd], res, where=w.em)
    return swizzle
  if name in ("ds_bpermute_b32", "ds_permute_b32"):
    def permute(w: Wave) -> None:
      lanes = ((w.v[va].astype(np.int64) + single) >> 2) & 31
      src = w.v[d0].copy()
      if name == "ds_bpermute_b32":
        res = src[lanes]
        res[~w.em[lanes]] = 0
        np.copyto(w.v[vd], res, where=w.em)
      else:
        res = np.zeros(LANES, U32)
        act = w.idx
        res[lanes[act]] = src[act]
        np.copyto(w.v[vd], res, where=w.em)
    return permute
  raise Unimplemented(name)


# ---------------------------------------------------------------- dispatch by encoding

_SPECIAL_VALU: dict[str, Callable[[Inst, str], Fn]] = {
  "v_cndmask_b32": compile_cndmask, "v_cndmask_b16": compile_cndmask, "v_readfirstlane_b32": compile_lane_read,
  "v_readlane_b32": compile_lane_read, "v_writelane_b32": compile_writelane, "v_swap_b32": compile_swap,
  "v_mad_u64_u32": compile_mad64, "v_mad_i64_i32": compile_mad64, "v_div_scale_f32": compile_div_scale, "v_div_scale_f64": compile_div_scale,
  "v_div_fmas_f32": compile_div_fmas, "v_div_fmas_f64": compile_div_fmas, "v_mbcnt_lo_u32_b32": compile_mbcnt,
  "v_mbcnt_hi_u32_b32": compile_mbcnt, "v_nop": lambda inst, name: (lambda w: None), "v_pk_fmac_f16": compile_pk_fmac,
  "v_permlane16_b32": compile_permlane, "v_permlanex16_b32": compile_permlane,
  **{n: compile_carry for n in ("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_add_co_ci_u32", "v_sub_co_ci_u32", "v_subrev_co_ci_u32")},
}


def compile_vector(inst: Inst, name: str) -> Fn:
  if name.startswith(("v_cmp_", "v_cmpx_")): return compile_cmp(inst, name)
  if name in _SPECIAL_VALU: return _SPECIAL_VALU[name](inst, name)
  if name in VALU: return compile_valu(inst, name)
  raise Unimplemented(name)


def compile_vop3p(inst: Inst, name: str) -> Fn:
  if name in _PK: return compile_pk(inst, name)
  if name.startswith("v_fma_mix"): return compile_fma_mix(inst, name)
  if name == "v_dot2_f32_f16": return compile_dot2(inst, name)
  if name.startswith("v_wmma_"): return compile_wmma(inst, name)
  raise Unimplemented(name)


_BY_ENC: dict[str, Callable[[Inst, str], Fn]] = {
  "SOP1": compile_sop1, "SOP2": compile_sop2, "SOPC": compile_sopc, "SOPK": compile_sopk, "SOPP": compile_sopp, "SMEM": compile_smem,
  "VOP1": compile_vector, "VOP2": compile_vector, "VOPC": compile_vector, "VOP3": compile_vector, "VOP3SD": compile_vector,
  "VOP3P": compile_vop3p, "VOPD": compile_vopd, "DS": compile_ds, "GLOBAL": compile_global, "FLAT": compile_global,
  "SCRATCH": compile_scratch, "MUBUF": lambda inst, name: (lambda w: None),
}


def dpp_lanes(inst: Inst) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
  """(source lane, source valid, lane may be written, bound_ctrl) of a DPP16/DPP8 operand."""
  lane = np.arange(LANES)
  d = inst.dpp["word"]
  if inst.dpp["kind"] == "dpp8":
    return (lane & ~7) | ((d >> (8 + 3 * (lane % 8))) & 7), np.ones(LANES, bool), np.ones(LANES, bool), False
  if d & (3 << 20 | 3 << 22): raise Unimplemented("DPP with abs/neg source modifiers")
  ctrl, row, pos, n = (d >> 8) & 0x1FF, lane & ~15, lane % 16, (d >> 8) & 0xF
  valid = np.ones(LANES, bool)
  if ctrl <= 0xFF: src = (lane & ~3) | ((ctrl >> (2 * (lane & 3))) & 3)
  elif 0x101 <= ctrl <= 0x10F: src, valid = lane + n, pos + n < 16
  elif 0x111 <= ctrl <= 0x11F: src, valid = lane - n, pos - n >= 0
  elif 0x121 <= ctrl <= 0x12F: src = row + (pos - n) % 16
  elif ctrl == 0x140: src = row + 15 - pos
  elif ctrl == 0x141: src = (lane & ~7) + 7 - lane % 8
  elif 0x150 <= ctrl <= 0x15F: src = row + n
  elif 0x160 <= ctrl <= 0x16F: src = row + (pos ^ n)
  else: raise Unimplemented(f"DPP control {ctrl:#x}")
  row_mask, bank_mask = (d >> 28) & 0xF, (d >> 24) & 0xF
  writable = (((row_mask >> (lane // 16)) & 1) != 0) & (((bank_mask >> (pos // 4)) & 1) != 0)
  return np.clip(src, 0, LANES - 1), valid, writable, bool(d >> 19 & 1)


def compile_dpp(inst: Inst, inner: Fn) -> Fn:
  """Run `inner` with src0 replaced by the DPP-permuted VGPR; lanes with an invalid source (out of the row, or an
  inactive lane without FI) read 0 with bound_ctrl and are not written without it."""
  src_lane, valid, writable, bound = dpp_lanes(inst)
  reg, fi = inst.dpp_src - 256, inst.dpp["fi"]
  def run(w: Wave) -> Any:
    ok = valid if fi else valid & w.em[src_lane]
    vals = w.v[reg][src_lane]
    w.dpp_tmp = np.where(ok, vals, U32(0)).astype(U32) if bound else vals
    mask = w.em & writable if bound else w.em & writable & ok
    saved = (w.em, w.idx, w.full)
    w.em, w.idx, w.full = mask, np.flatnonzero(mask), bool(mask.all())
    try:
      return inner(w)
    finally:
      if w.em is mask: w.em, w.idx, w.full = saved  # (a v_cmpx wrote EXEC: keep what it set)
  return run


def describe(inst: Inst) -> str:
  op = f"{inst.op[0]:#x}/{inst.op[1]:#x}" if isinstance(inst.op, tuple) else f"{inst.op:#x}"
  return f"{inst.name or 'unknown'} ({inst.enc} opcode {op})"


def compile_inst(inst: Inst, kernel: str) -> Fn:
  """Closure for one instruction; an unknown or unsupported one raises Unimplemented naming its opcode and the kernel."""
  try:
    if inst.name is None or inst.enc not in _BY_ENC: raise Unimplemented("not in the emulator's opcode tables")
    try:
      fn = _BY_ENC[inst.enc](inst, inst.name)
      return compile_dpp(inst, fn) if getattr(inst, "dpp", None) else fn
    except KeyError as e:
      raise Unimplemented(f"no semantics for {e}") from None
  except Unimplemented as e:
    raise Unimplemented(f"kernel {kernel}: unimplemented RDNA3 instruction {describe(inst)} at offset {inst.addr:#x}"
                        + (f": {e}" if str(e) and str(e) != inst.name else "")) from None
