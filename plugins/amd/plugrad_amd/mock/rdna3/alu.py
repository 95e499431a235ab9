"""Numeric semantics of RDNA3 vector ALU operations on numpy lane arrays (one element per lane), following the
pseudocode of AMD's RDNA3 ISA reference guide: IEEE float32/float16/float64 with round-to-nearest-even, a correctly
rounded fused multiply-add, the division helpers (v_div_scale/fmas/fixup), float classes, bit manipulation and the
saturating float->int conversions. Everything here is pure: arrays in, arrays out."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

U8, U16, I16, U32, I32, U64, I64 = np.uint8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64
F16, F32, F64 = np.float16, np.float32, np.float64
TWO_PI = 6.283185307179586


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """Correctly rounded float32 a*b+c: the product is exact in float64; the sum is made round-to-odd in float64 (an
  inexact sum, per TwoSum's error term, with an even mantissa moves one ulp toward the exact value), which float64's 29
  extra bits make safe to round once more to float32. (Nudging only by the error's direction at any mantissa is wrong
  twice: below half an ulp `s + err` rounds back to `s`, and a value one ulp under a float32 midpoint would become it.)"""
  p = np.asarray(a, F64) * np.asarray(b, F64)
  c64 = np.asarray(c, F64)
  s = p + c64
  bp = s - c64
  err = (p - bp) + (c64 - (s - bp))
  fix = np.isfinite(err) & (err != 0) & ((s.view(np.uint64) & 1) == 0)
  if np.any(fix): s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
  return s.astype(F32)


def sin_rev(x: np.ndarray, cos: bool = False) -> np.ndarray:
  """v_sin/v_cos: sin/cos of x revolutions (x * 2pi), reduced exactly in revolutions first (full input range:
  every float32 >= 2^23 is a whole number of turns, so sin(-MAXFLOAT) is +0); signed zero kept for sin(+-0)."""
  x64 = np.asarray(x, F64)
  r = x64 - np.rint(x64)
  out = (np.cos if cos else np.sin)(r * TWO_PI) + 0.0
  if not cos: out = np.where(x64 == 0, x64, out)
  return out.astype(np.asarray(x).dtype)


def fma16(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """float16 a*b+c, exact in float64 then rounded once to float16."""
  return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F16)


def fma64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """float64 fused multiply-add, exact through rationals (lanes with inf/nan take the unfused result)."""
  a, b, c = np.broadcast_arrays(np.asarray(a, F64), np.asarray(b, F64), np.asarray(c, F64))
  out = a * b + c
  for i in np.flatnonzero(np.isfinite(a) & np.isfinite(b) & np.isfinite(c)):
    exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
    out[i] = float(exact) if exact != 0 else (a[i] * b[i] + c[i])
  return out


def ftz(x: np.ndarray) -> np.ndarray:
  """Flush float32 denormals to signed zero."""
  return np.where(np.abs(x) < np.finfo(F32).tiny, np.copysign(F32(0), x), x).astype(F32)


def fract(x: np.ndarray) -> np.ndarray:
  y = x - np.floor(x)
  y = np.minimum(y, np.nextafter(x.dtype.type(1), x.dtype.type(0)))
  return np.where(np.isinf(x), np.nan, y).astype(x.dtype)


def frexp_mant(x: np.ndarray) -> np.ndarray:
  m, _ = np.frexp(x)
  return np.where(np.isfinite(x), m, x).astype(x.dtype)


def frexp_exp(x: np.ndarray) -> np.ndarray:
  _, e = np.frexp(x)
  return np.where(np.isfinite(x), e, 0).astype(I32)


def ldexp(x: np.ndarray, e: np.ndarray) -> np.ndarray:
  return np.ldexp(x, np.clip(np.asarray(e, I64), -2000, 2000).astype(I32)).astype(np.asarray(x).dtype)


def cvt_int(x: np.ndarray, lo: int, hi: int, dtype: type) -> np.ndarray:
  """Float -> integer: truncate toward zero, saturate to [lo, hi], NaN -> 0."""
  t = np.trunc(np.asarray(x, F64))
  return np.where(np.isnan(t), 0, np.clip(t, lo, hi)).astype(I64).astype(dtype)


def cvt_rtz_f16(x: np.ndarray) -> np.ndarray:
  """float32 -> float16 rounding toward zero."""
  x = np.asarray(x, F32)
  h = x.astype(F16)
  over = np.isfinite(x) & (np.abs(h.astype(F32)) > np.abs(x))
  return np.where(over, np.nextafter(h, F16(0)), h).astype(F16)


def med3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  return np.fmax(np.fmin(a, b), np.fmin(np.fmax(a, b), c))


def imed3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))


def float_class(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """v_cmp_class: bit k of `mask` tests class k (sNaN, qNaN, -inf, -normal, -denorm, -0, +0, +denorm, +normal, +inf)."""
  x = np.asarray(x)
  fi = np.finfo(x.dtype)
  mant_bits = {2: 10, 4: 23, 8: 52}[x.dtype.itemsize]
  bits = x.view({2: U16, 4: U32, 8: U64}[x.dtype.itemsize])
  quiet = ((bits >> mant_bits) & 1).astype(bool)
  neg, nan, inf, a = np.signbit(x), np.isnan(x), np.isinf(x), np.abs(x)
  zero, den = a == 0, (a < fi.tiny) & (a != 0)
  norm = np.isfinite(x) & ~zero & ~den
  classes = [nan & ~quiet, nan & quiet, inf & neg, norm & neg, den & neg, zero & neg, zero & ~neg, den & ~neg, norm & ~neg, inf & ~neg]
  m = np.asarray(mask, U32)
  out = np.zeros(np.broadcast(x, m).shape, bool)
  for k, c in enumerate(classes): out |= c & (((m >> k) & 1) != 0)
  return out


def _biased_exponent(x: np.ndarray) -> np.ndarray:
  if x.dtype == F32: return ((x.view(U32) >> U32(23)) & U32(0xFF)).astype(I64)
  return ((x.view(U64) >> U64(52)) & U64(0x7FF)).astype(I64)


def div_scale(s0: np.ndarray, s1: np.ndarray, s2: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
  """v_div_scale_f32/f64 (ISA pseudocode): scale s0 (the numerator s2 or the denominator s1 of s2/s1) by 2^+-64
  (2^+-128 for f64) so the Newton-Raphson steps see no denormals; vcc tells v_div_fmas to undo it."""
  dt = F32 if bits == 32 else F64
  s0, s1, s2 = (np.asarray(v, dt) for v in (s0, s1, s2))
  tiny = np.finfo(dt).tiny
  k, big, tiny_num = (64, 96, 23) if bits == 32 else (128, 768, 53)
  with np.errstate(all="ignore"):
    e1, e2 = _biased_exponent(s1), _biased_exponent(s2)
    q = np.abs(s2.astype(F64) / s1.astype(F64)) if bits == 32 else np.abs(s2 / s1)
    rcp = np.abs(1.0 / s1.astype(F64))
    den1 = (np.abs(s1) < tiny) & (s1 != 0)
    rcp_den, q_den = (rcp < tiny) & (rcp != 0), (q < tiny) & (q != 0)
    out, vcc = s0.copy(), np.zeros(s0.shape, bool)
    undecided = np.ones(s0.shape, bool)
    def case(cond: np.ndarray, value: np.ndarray | None, set_vcc: bool) -> None:
      nonlocal out
      hit = undecided & cond
      if value is not None: out = np.where(hit, value, out)
      if set_vcc: vcc[hit] = True
      undecided[hit] = False
    up, down = np.ldexp(s0, k).astype(dt), np.ldexp(s0, -k).astype(dt)
    case((s2 == 0) | (s1 == 0), np.full(s0.shape, np.nan, dt), False)
    case(e2 - e1 >= big, np.where(s0 == s1, up, s0), True)
    case(den1, up, False)
    # the guide's pseudocode says ldexp(+64) here, which would overflow a huge denominator; scaling it down is what
    # makes the post-scale of v_div_fmas (down, as the estimate is then < 2) give the correctly rounded quotient
    case(rcp_den & q_den, np.where(s0 == s1, down, s0), True)
    case(rcp_den, down, False)
    case(q_den, np.where(s0 == s2, up, s0), True)
    case(e2 <= tiny_num, up, False)
  return out.astype(dt), vcc


def fma_scaled32(a: np.ndarray, b: np.ndarray, c: np.ndarray, scale: np.ndarray) -> np.ndarray:
  """float32 round(a*b+c) * scale with a single rounding (scale a power of two)."""
  p = np.asarray(a, F64) * np.asarray(b, F64)
  c64 = np.asarray(c, F64)
  s = p + c64
  bp = s - c64
  err = (p - bp) + (c64 - (s - bp))
  s, err = s * scale, err * scale
  fix = np.isfinite(err) & (err != 0)
  if np.any(fix): s = np.where(fix, np.nextafter(s, s + np.where(fix, err, 0)), s)
  return s.astype(F32)


def div_fmas(a: np.ndarray, b: np.ndarray, c: np.ndarray, vcc: np.ndarray, bits: int) -> np.ndarray:
  """v_div_fmas: fma, post-scaled where vcc: up by 2^64 (2^128) if the quotient estimate c is large (the
  denominator was scaled), down otherwise (the numerator was scaled)."""
  k = 64 if bits == 32 else 128
  big = np.abs(np.asarray(c, F64)) >= 2.0
  scale = np.where(vcc, np.where(big, 2.0 ** k, 2.0 ** -k), 1.0)
  if bits == 32: return fma_scaled32(a, b, c, scale)
  return (fma64(a, b, c) * scale).astype(F64)


def div_fixup(s0: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
  """v_div_fixup: s0 is the quotient estimate of s2/s1; NaN/zero/inf operands get the IEEE answer, a NaN estimate
  (overflow in the macro) becomes a signed infinity, otherwise the sign of s2/s1 is applied to |s0|."""
  dt = np.asarray(s0).dtype
  s0, s1, s2 = np.asarray(s0, dt), np.asarray(s1, dt), np.asarray(s2, dt)
  sign = np.signbit(s1) ^ np.signbit(s2)
  inf, zero = np.asarray(np.inf, dt), np.asarray(0, dt)
  signed = lambda v: np.where(sign, -v, v).astype(dt)
  with np.errstate(all="ignore"):
    out = signed(np.abs(s0))
    out = np.where(np.isnan(s0), signed(inf), out)
    out = np.where((np.abs(s1) == np.inf) | (s2 == 0), signed(zero), out)
    out = np.where((s1 == 0) | (np.abs(s2) == np.inf), signed(inf), out)
    out = np.where(((s1 == 0) & (s2 == 0)) | ((np.abs(s1) == np.inf) & (np.abs(s2) == np.inf)), np.asarray(np.nan, dt), out)
    out = np.where(np.isnan(s1), s1, out)
    out = np.where(np.isnan(s2), s2, out)
  return out.astype(dt)


_POP8 = np.array([bin(i).count("1") for i in range(256)], U32)


def popcount(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, U32)
  return _POP8[np.ascontiguousarray(x).astype("<u4").view(U8).reshape(x.shape + (4,))].sum(axis=-1).astype(U32)


def clz(x: np.ndarray) -> np.ndarray:
  """v_clz_i32_u32 (find first bit high): leading zeros, -1 (0xffffffff) for zero."""
  x = np.asarray(x, U32)
  n = np.full(x.shape, 32, I64)
  nz = x != 0
  n[nz] = 31 - np.floor(np.log2(x[nz].astype(F64))).astype(I64)
  return np.where(nz, n, -1).astype(I64).astype(U32)


def ctz(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, U32)
  low = x & (~x + U32(1))
  nz = x != 0
  n = np.zeros(x.shape, I64)
  n[nz] = np.log2(low[nz].astype(F64)).astype(I64)
  return np.where(nz, n, -1).astype(I64).astype(U32)


def bfrev(x: np.ndarray) -> np.ndarray:
  b = np.asarray(x, U32).astype("<u4").view(U8).reshape(-1, 4)
  return np.packbits(np.unpackbits(b, axis=1, bitorder="little")[:, ::-1], axis=1, bitorder="little").view("<u4").reshape(-1).astype(U32)


def perm_b32(s0: np.ndarray, s1: np.ndarray, sel: np.ndarray) -> np.ndarray:
  """v_perm_b32: each selector byte picks a byte of {s0, s1} (s1 is bytes 0-3), a sign fill (8-11), 0 (12) or 0xff."""
  data = (np.asarray(s0, U64) << U64(32)) | np.asarray(s1, U64)
  sel = np.asarray(sel, U32)
  out = np.zeros(np.broadcast(data, sel).shape, U32)
  for i in range(4):
    s = ((sel >> U32(8 * i)) & U32(0xFF)).astype(I64)
    byte = (data >> (U64(8) * np.minimum(s, 7).astype(U64))) & U64(0xFF)
    sign_at = (np.clip(s - 8, 0, 3) * 16 + 15).astype(U64)
    sign = np.where(((data >> sign_at) & U64(1)) != 0, U64(0xFF), U64(0))
    v = np.where(s < 8, byte, np.where(s < 12, sign, np.where(s == 12, U64(0), U64(0xFF))))
    out |= (v.astype(U32) << U32(8 * i))
  return out


def bfe_i32(x: np.ndarray, off: np.ndarray, width: np.ndarray) -> np.ndarray:
  x, off, width = np.asarray(x, U32).astype(I64), np.asarray(off, U32) & 31, np.asarray(width, U32) & 31
  v = (x >> off.astype(I64)) & ((I64(1) << width.astype(I64)) - 1)
  sign = (v >> np.maximum(width.astype(I64) - 1, 0)) & 1
  v = np.where((sign != 0) & (width > 0), v - (I64(1) << width.astype(I64)), v)
  return np.where(width == 0, 0, v).astype(I64).astype(U32)


def bfe_u32(x: np.ndarray, off: np.ndarray, width: np.ndarray) -> np.ndarray:
  x, off, width = np.asarray(x, U32).astype(U64), np.asarray(off, U32) & 31, np.asarray(width, U32) & 31
  return ((x >> off.astype(U64)) & ((U64(1) << width.astype(U64)) - U64(1))).astype(U32)


def sext24(x: np.ndarray) -> np.ndarray:
  v = np.asarray(x, U32).astype(I64) & 0xFFFFFF
  return np.where(v >= 0x800000, v - 0x1000000, v)


def bf16_to_f32(x: np.ndarray) -> np.ndarray:
  return (np.asarray(x, U32) << U32(16)).view(F32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
  """Round-to-nearest-even float32 -> bfloat16 bits (NaN stays NaN)."""
  b = np.asarray(x, F32).view(U32).astype(U64)
  r = ((b + U64(0x7FFF) + ((b >> U64(16)) & U64(1))) >> U64(16)).astype(U32)
  return np.where(np.isnan(x), U32(0x7FC0), r & U32(0xFFFF)).astype(U32)
