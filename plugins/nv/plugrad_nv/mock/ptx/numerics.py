"""Floating-point semantics of PTX on numpy lane arrays: rounding to a format in any PTX rounding mode, correctly
rounded fma for f64/f32/f16/bf16, directed-rounding add/mul, flush-to-zero, half/bfloat16/fp8 encodings, saturating
float -> int conversion and exact 64-bit int -> float conversion.

The central tool is `round_to(x, err, fmt, mode)`: `x + err` is the exact value (x a float64 array, err its exact
error from an error-free transformation, or None when x is exact) rounded to `fmt` in mode rn/rz/rm/rp, with IEEE
overflow (to inf, or to the largest finite value where the mode or `.satfinite` says so) and gradual underflow.
float32/half/bfloat16 products are exact in float64, so their fma and arithmetic are one `round_to` of an exactly
known value: no double rounding. float64 fma uses Boldo and Melquiond's emulation (an exact product, TwoSums and one
round-to-odd addition, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd", 2008)
with exact rational arithmetic for the lanes where its preconditions (no overflow in splitting, no underflow of the
error terms) fail.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

f64, f32, f16 = np.float64, np.float32, np.float16
u16, u32, u64 = np.uint16, np.uint32, np.uint64


@dataclass(frozen=True)
class Fmt:
  """A binary floating-point format: `p` significand bits (with the implicit one), smallest normal exponent `emin`,
  largest finite value `maxf`, whether it has infinities (fp8 e4m3 has none) and its bit layout (exponent bits `ebits`)."""
  name: str
  p: int
  emin: int
  maxf: float
  has_inf: bool
  ebits: int
  nbits: int


F64 = Fmt("f64", 53, -1022, float(np.finfo(np.float64).max), True, 11, 64)
F32 = Fmt("f32", 24, -126, float(np.finfo(np.float32).max), True, 8, 32)
F16 = Fmt("f16", 11, -14, 65504.0, True, 5, 16)
BF16 = Fmt("bf16", 8, -126, float.fromhex("0x1.fep127"), True, 8, 16)
E4M3 = Fmt("e4m3", 4, -6, 448.0, False, 4, 8)
E5M2 = Fmt("e5m2", 3, -14, 57344.0, True, 5, 8)


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth; any order of magnitudes, finite inputs)."""
  s = a + b
  bb = s - a
  e = (a - (s - bb)) + (b - bb)
  return s, e


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  c = 134217729.0 * a  # 2^27 + 1 (Veltkamp)
  hi = c - (c - a)
  return hi, a - hi


def two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(p, e) with p = fl(a * b) and p + e = a * b exactly (Dekker), when |a|,|b| < 2^995 and the product doesn't underflow."""
  p = a * b
  ah, al = _split(a)
  bh, bl = _split(b)
  e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
  return p, e


def round_to(x: np.ndarray, err: np.ndarray | None, fmt: Fmt, mode: str = "rn", satfinite: bool = False) -> np.ndarray:
  """float64 array of `x + err` (exact value; err None means 0) rounded to `fmt` in `mode` (rn, rz, rm, rp, rna).

  NaN stays NaN; overflow gives inf in rn (largest finite in rz and toward zero for rm/rp, as IEEE says), or the
  largest finite value with `satfinite` or for formats without inf (then inf inputs clamp too)."""
  x = np.asarray(x, dtype=f64)
  ax = np.abs(x)
  finite = np.isfinite(x)
  xs = np.where(finite & (ax > 0), x, 1.0)
  _, e = np.frexp(xs)                                   # xs = m * 2^e, m in [0.5, 1)
  lead = np.maximum(e.astype(np.int64) - 1, fmt.emin)   # exponent of the leading bit (subnormals: emin)
  q = np.ldexp(1.0, (lead - (fmt.p - 1)).astype(np.int32))  # the quantum of the result's binade
  k = xs / q                                            # exact: a power-of-two scaling
  if mode == "rn": r = np.rint(k)
  elif mode == "rna": r = np.where(k >= 0, np.floor(k + 0.5), np.ceil(k - 0.5))
  elif mode == "rz": r = np.trunc(k)
  elif mode == "rm": r = np.floor(k)
  elif mode == "rp": r = np.ceil(k)
  else: raise ValueError(f"unknown rounding mode {mode}")
  if err is not None:
    err = np.where(finite, err, 0.0)
    onk = r == k                                        # x itself is on the grid: err decides the direction
    if mode == "rn":
      tie = np.abs(k - np.trunc(k)) == 0.5              # x is a midpoint: err breaks the tie
      r = np.where(tie & (err > 0), np.ceil(k), np.where(tie & (err < 0), np.floor(k), r))
    elif mode == "rz": r = np.where(onk & (err != 0) & (np.sign(err) != np.sign(k)), k - np.sign(k), r)
    elif mode == "rm": r = np.where(onk & (err < 0), k - 1, r)
    elif mode == "rp": r = np.where(onk & (err > 0), k + 1, r)
  out = r * q
  big = np.abs(out) > fmt.maxf
  if mode == "rn" and fmt.has_inf and not satfinite: over = np.copysign(np.inf, x)
  else:
    to_inf = fmt.has_inf and not satfinite and ((mode == "rp") & (x > 0) | (mode == "rm") & (x < 0))
    over = np.where(to_inf, np.copysign(np.inf, x), np.copysign(fmt.maxf, x))
  out = np.where(big, over, out)
  out = np.where(ax == 0, x, out)                                # signed zeros pass
  out = np.where(out == 0, np.copysign(0.0, x), out)             # a result rounded to zero keeps the sign
  inf_out = np.copysign(fmt.maxf, x) if (satfinite or not fmt.has_inf) else x
  return np.where(finite, out, np.where(np.isnan(x), x, inf_out))


def fma64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """Correctly rounded float64 a*b+c (round to nearest even)."""
  a, b, c = (np.asarray(v, dtype=f64) for v in (a, b, c))
  a, b, c = np.broadcast_arrays(a, b, c)
  ph, pl = two_prod(a, b)
  uh, ul = two_sum(c, pl)
  th, tl = two_sum(ph, uh)
  s, e = two_sum(tl, ul)                                   # round-to-odd of tl + ul
  odd = (s.view(u64) & 1) == 1
  s = np.where((e != 0) & ~odd, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
  z = th + s
  aa, ab = np.abs(a), np.abs(b)
  finite_in = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
  exact_ok = (aa < 2.0 ** 995) & (ab < 2.0 ** 995) & (np.abs(ph) > 2.0 ** -960) & np.isfinite(z) & finite_in
  out = np.where(exact_ok, z, a * b + c)                   # zero, inf and NaN operands: the product is exact
  out = np.where(np.isinf(c) & np.isfinite(a) & np.isfinite(b), c, out)  # a finite product (even one past float64) + inf
  slow = ~exact_ok & finite_in & (aa != 0) & (ab != 0)
  for i in np.flatnonzero(slow): out.flat[i] = _fma_exact(float(a.flat[i]), float(b.flat[i]), float(c.flat[i]))
  return out


def _fma_exact(a: float, b: float, c: float) -> float:
  v = Fraction(a) * Fraction(b) + Fraction(c)
  if v == 0: return 0.0  # a nonzero product cancelled by c: +0 in round to nearest
  try: return float(v)
  except OverflowError: return float("inf") if v > 0 else float("-inf")


def fma_small(a: np.ndarray, b: np.ndarray, c: np.ndarray, fmt: Fmt, mode: str = "rn") -> np.ndarray:
  """a*b+c for formats whose products are exact in float64 (f32, f16, bf16), rounded once to `fmt`."""
  a, b, c = (np.asarray(v, dtype=f64) for v in (a, b, c))
  p = a * b
  if fmt is F32 and mode == "rn":  # fast path: fl64(p + c) rounds to float32 the same way unless it is a float32 midpoint
    s = p + c
    r = s.astype(f32).astype(f64)
    bits = np.asarray(s).view(u64)
    suspect = ((bits & u64(0x1FFFFFFF)) == u64(0x10000000)) | (np.abs(s) < 2.0 ** -125)
    if not suspect.any(): return r
    s2, e = two_sum(p, c)
    fin = np.isfinite(s2) & np.isfinite(p) & np.isfinite(c)
    exact = round_to(np.where(fin, s2, p + c), np.where(fin, e, 0.0), fmt, mode)
    return np.where(suspect, exact, r)
  s, e = two_sum(p, c)
  fin = np.isfinite(s) & np.isfinite(p) & np.isfinite(c)
  return round_to(np.where(fin, s, p + c), np.where(fin, e, 0.0), fmt, mode)


def add_exact(a: np.ndarray, b: np.ndarray, fmt: Fmt, mode: str = "rn") -> np.ndarray:
  """a + b (float64 inputs that are values of `fmt`) rounded once to `fmt` in `mode`."""
  a, b = np.asarray(a, dtype=f64), np.asarray(b, dtype=f64)
  s, e = two_sum(a, b)
  fin = np.isfinite(s)
  if fmt is F64: return directed64(s, np.where(fin, e, 0.0), mode)
  return round_to(s, np.where(fin, e, 0.0), fmt, mode)


def mul_exact(a: np.ndarray, b: np.ndarray, fmt: Fmt, mode: str = "rn") -> np.ndarray:
  """a * b rounded once to `fmt` in `mode`; float64 directed modes through an exact product (rational fallback)."""
  a, b = np.asarray(a, dtype=f64), np.asarray(b, dtype=f64)
  if fmt is not F64: return round_to(a * b, None, fmt, mode)
  p, e = two_prod(a, b)
  ok = np.isfinite(p) & (np.abs(a) < 2.0 ** 995) & (np.abs(b) < 2.0 ** 995) & ((np.abs(p) > 2.0 ** -960) | (p == 0))
  out = directed64(p, np.where(ok, e, 0.0), mode)
  for i in np.flatnonzero(~ok & np.isfinite(p) & (p != 0)):
    out.flat[i] = rational_round(Fraction(float(a.flat[i])) * Fraction(float(b.flat[i])), F64, mode)
  return out


def directed64(s: np.ndarray, e: np.ndarray, mode: str) -> np.ndarray:
  """float64 `s` with exact error `e` (|e| <= ulp(s)/2, so s is the rn result) rounded in `mode` instead."""
  if mode == "rn": return s
  up, down = np.nextafter(s, np.inf), np.nextafter(s, -np.inf)
  if mode == "rm": return np.where(e < 0, down, s)
  if mode == "rp": return np.where(e > 0, up, s)
  if mode == "rz": return np.where((e != 0) & (np.sign(e) != np.sign(s)), np.where(s > 0, down, up), s)
  raise ValueError(f"unknown rounding mode {mode}")


def rational_round(v: Fraction, fmt: Fmt, mode: str) -> float:
  """An exact rational rounded to `fmt` in `mode` (for the few lanes vector code can't do exactly)."""
  if v == 0: return 0.0
  x = float(v) if abs(v) < Fraction(2) ** 1024 else (np.inf if v > 0 else -np.inf)
  err = v - Fraction(x) if np.isfinite(x) else Fraction(0)
  e = np.array([float(err)]) if err != 0 else None
  if e is not None and e[0] == 0: e[0] = np.copysign(5e-324, float(err))  # below float64's range: only its sign matters
  if fmt is F64: return float(directed64(np.array([x]), e if e is not None else np.zeros(1), mode)[0])
  return float(round_to(np.array([x]), e, fmt, mode)[0])


def div_exact(a: np.ndarray, b: np.ndarray, fmt: Fmt, mode: str = "rn") -> np.ndarray:
  """a / b correctly rounded to `fmt`: the float64 quotient suffices for rn of f32 and narrower (53 >= 2*24+2);
  float64 rn is numpy's; directed modes use the exact remainder of the float64 quotient (rational for edge lanes)."""
  a, b = np.asarray(a, dtype=f64), np.asarray(b, dtype=f64)
  q = a / b
  if mode == "rn": return q if fmt is F64 else round_to(q, None, fmt, "rn")
  out = round_to(q, None, fmt, mode) if fmt is not F64 else q.copy()
  fin = np.isfinite(q) & (q != 0) & np.isfinite(a) & np.isfinite(b)
  for i in np.flatnonzero(fin):
    out.flat[i] = rational_round(Fraction(float(a.flat[i])) / Fraction(float(b.flat[i])), fmt, mode)
  return out


def sqrt_exact(a: np.ndarray, fmt: Fmt, mode: str = "rn") -> np.ndarray:
  """sqrt(a) correctly rounded to `fmt` (float64 sqrt is correctly rounded; directed modes fix it up exactly)."""
  a = np.asarray(a, dtype=f64)
  s = np.sqrt(a)
  if mode == "rn": return s if fmt is F64 else round_to(s, None, fmt, "rn")
  out = s.copy() if fmt is F64 else round_to(s, None, fmt, mode)
  for i in np.flatnonzero(np.isfinite(s) & (s > 0)):
    out.flat[i] = _sqrt_directed(float(a.flat[i]), fmt, mode)
  return out


def _sqrt_directed(a: float, fmt: Fmt, mode: str) -> float:
  """sqrt of a positive finite float rounded in a directed mode: the candidates around the float64 root, checked by squaring."""
  cand = float(round_to(np.array([np.sqrt(a)]), None, fmt, "rn")[0])
  va = Fraction(a)
  below = Fraction(cand) ** 2 <= va
  if Fraction(cand) ** 2 == va: return cand
  step = np.nextafter if fmt is F64 else (lambda x, d: float(round_to(np.array([np.nextafter(x, d)]), None, fmt, "rp" if d > x else "rm")[0]))
  lo, hi = (cand, step(cand, np.inf)) if below else (step(cand, -np.inf), cand)
  return hi if mode == "rp" else lo


def ftz(x: np.ndarray, fmt: Fmt = F32) -> np.ndarray:
  """Subnormal values of `fmt` flushed to sign-preserving zero."""
  tiny = 2.0 ** fmt.emin
  return np.where((np.abs(x) < tiny) & (x != 0), np.copysign(np.zeros_like(x), x), x)


# ---------------------------------------------------------------------------- encodings

def f32_to_bits(x: np.ndarray) -> np.ndarray: return np.asarray(x, dtype=f32).view(u32)


def bf16_to_f64(bits: np.ndarray) -> np.ndarray:
  return (np.asarray(bits).astype(u32) << u32(16)).view(f32).astype(f64)


def f16_to_f64(bits: np.ndarray) -> np.ndarray: return np.asarray(bits, dtype=u16).view(f16).astype(f64)


def encode(x: np.ndarray, fmt: Fmt) -> np.ndarray:
  """Bits of float64 values that are exactly representable in `fmt` (already rounded): uint16 for f16/bf16, uint8 for
  fp8. NaN becomes the canonical NaN (0x7FFF for f16/bf16, 0x7F for fp8), as PTX's cvt produces."""
  x = np.asarray(x, dtype=f64)
  nan = np.isnan(x)
  if fmt is F16: bits = np.where(nan, 0, x).astype(f16).view(u16)
  elif fmt is BF16: bits = (np.where(nan, 0, x).astype(f32).view(u32) >> u32(16)).astype(u16)
  elif fmt in (E4M3, E5M2): bits = _encode_fp8(np.where(nan, 0, x), fmt)
  else: raise ValueError(f"no encoder for {fmt.name}")
  can = {F16: 0x7FFF, BF16: 0x7FFF, E4M3: 0x7F, E5M2: 0x7F}[fmt]
  return np.where(nan, bits.dtype.type(can), bits)


def _encode_fp8(x: np.ndarray, fmt: Fmt) -> np.ndarray:
  mb = fmt.nbits - 1 - fmt.ebits
  bias = -fmt.emin + 1
  sign = np.signbit(x).astype(np.uint8) << np.uint8(7)
  a = np.abs(x)
  inf = np.isinf(a)
  m, e = np.frexp(np.where(inf | (a == 0), 1.0, a))
  exp = e.astype(np.int64) - 1 + bias
  sub = exp <= 0
  mant = np.where(sub, a / 2.0 ** (fmt.emin - mb), (m * 2 - 1) * 2 ** mb).astype(np.int64)
  code = np.where(sub, mant, (exp << mb) | mant)
  code = np.where(a == 0, 0, code)
  if fmt.has_inf: code = np.where(inf, ((1 << fmt.ebits) - 1) << mb, code)
  return (code.astype(np.uint8) | sign).astype(np.uint8)


def decode_fp8(bits: np.ndarray, fmt: Fmt) -> np.ndarray:
  """float64 values of fp8 codes (e4m3: 0x7F/0xFF NaN, no inf; e5m2: IEEE-like)."""
  b = np.asarray(bits).astype(np.int64) & 0xFF
  mb = fmt.nbits - 1 - fmt.ebits
  bias = -fmt.emin + 1
  s = np.where(b & 0x80, -1.0, 1.0)
  e = (b >> mb) & ((1 << fmt.ebits) - 1)
  m = b & ((1 << mb) - 1)
  val = np.where(e == 0, m * 2.0 ** (fmt.emin - mb), (1 + m / 2.0 ** mb) * np.ldexp(1.0, (e - bias).astype(np.int32)))
  if fmt is E4M3: val = np.where((e == 15) & (m == 7), np.nan, val)
  else: val = np.where(e == 31, np.where(m == 0, np.inf, np.nan), val)
  return s * val


# ---------------------------------------------------------------------------- conversions

def float_to_int(x: np.ndarray, dt: np.dtype, mode: str) -> np.ndarray:
  """PTX cvt from float to an integer type: rounded to an integral value in `mode` (rni, rzi, rmi, rpi), saturated to
  the type's range, NaN -> 0."""
  x = np.asarray(x, dtype=f64)
  r = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[mode](x)
  info = np.iinfo(dt)
  lo, hi = float(info.min), float(info.max)
  out = np.zeros(x.shape, dtype=dt)
  ok = (r > lo) & (r < hi)
  out[ok] = r[ok].astype(dt)
  out[r <= lo] = info.min
  out[r >= hi] = info.max
  out[np.isnan(x)] = 0
  return out


def int_to_float(v: np.ndarray, fmt: Fmt, mode: str = "rn") -> np.ndarray:
  """An integer array converted to `fmt` with one rounding (64-bit values split in halves so nothing rounds twice)."""
  v = np.asarray(v)
  if v.dtype.itemsize < 8: return round_to(v.astype(f64), None, fmt, mode)
  hi = (v >> 32).astype(f64) * 4294967296.0
  lo = (v & 0xFFFFFFFF).astype(f64)
  s, e = two_sum(hi, lo)
  if fmt is F64: return directed64(s, e, mode)
  return round_to(s, e, fmt, mode)
