"""The PTX interpreter's ALU against independent oracles on hypothesis inputs, one test per opcode the CUDA renderer's
kernels contain (`RENDERER_OPCODES`: every ALU opcode NVRTC emits for the conformance suite's kernels and the ALU/cast
sweep of tests/nv/test_compile.py, sm_80 and sm_90; `test_the_table_covers_the_renderer` recompiles the sweep and
fails when a new opcode appears without a test here).

Oracles: Python integers (wrapping, truncating division, saturation), exact rationals rounded to nearest even by
`rn` below (IEEE special cases written out), ml_dtypes for bfloat16/fp8 decoding, the math module for `.approx`
instructions (within the ISA's error bound). Each example is one warp of 32 lanes, one value per lane."""
from __future__ import annotations

import math
import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

sys.path.insert(0, str(Path(__file__).parent))
from ptx_harness import NPT, run_alu

from plugrad_nv.mock.ptx.ops import split_opcode

EXAMPLES = max(5, int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200")) // 10)
N = 32
INF = float("inf")

# ---------------------------------------------------------------------------- exact rounding (independent of the interpreter)

FORMATS = {"f64": (53, -1022, Fraction(2) ** 1024 - Fraction(2) ** 971), "f32": (24, -126, Fraction(2) ** 128 - Fraction(2) ** 104),
           "f16": (11, -14, Fraction(65504)), "bf16": (8, -126, Fraction(2) ** 128 - Fraction(2) ** 120),
           "e4m3": (4, -6, Fraction(448)), "e5m2": (3, -14, Fraction(57344))}


def rn(v: Fraction, fmt: str, sat: bool = False) -> float:
  """Exact rational -> nearest value of `fmt` (ties to even), gradual underflow, overflow to inf (to the largest finite
  value with `sat`). Zero results get the sign of v (the caller handles exact zeros)."""
  p, emin, maxf = FORMATS[fmt]
  if v == 0: return 0.0
  s, a = (-1 if v < 0 else 1), abs(v)
  e = a.numerator.bit_length() - a.denominator.bit_length()
  if Fraction(2) ** e > a: e -= 1
  q = Fraction(2) ** (max(e, emin) - p + 1)
  k = a / q
  n = math.floor(k)
  if k - n > Fraction(1, 2) or (k - n == Fraction(1, 2) and n % 2): n += 1
  r = n * q
  if r > maxf: return s * (float(maxf) if sat else INF)
  return s * float(r)


def fval(bits: int, t: str) -> float:
  if t == "f16": return float(np.uint16(bits).view(np.float16))
  if t == "bf16": return float(np.uint16(bits).view(ml_dtypes.bfloat16))
  return float(bits)


def fbits(x: float, t: str) -> int:
  """Bits of a value exactly representable in t (NaN: any NaN)."""
  if t == "f16": return int(np.float16(x).view(np.uint16))
  if t == "bf16": return int(np.array(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16))
  raise ValueError(t)


def exact(x: float) -> Fraction: return Fraction(x)


def f_add(a: float, b: float, t: str) -> float:
  if math.isnan(a) or math.isnan(b) or (math.isinf(a) and math.isinf(b) and a != b): return math.nan
  if math.isinf(a) or math.isinf(b): return a if math.isinf(a) else b
  v = exact(a) + exact(b)
  if v == 0: return -0.0 if (math.copysign(1, a) < 0 and math.copysign(1, b) < 0) else 0.0
  return rn(v, t)


def f_mul(a: float, b: float, t: str) -> float:
  if math.isnan(a) or math.isnan(b): return math.nan
  sign = -1.0 if (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0) else 1.0
  if math.isinf(a) or math.isinf(b): return math.nan if (a == 0 or b == 0) else sign * INF
  v = exact(a) * exact(b)
  return sign * 0.0 if v == 0 else (rn(v, t) if rn(v, t) != 0 else sign * 0.0)


def f_fma(a: float, b: float, c: float, t: str) -> float:
  if any(math.isnan(x) for x in (a, b, c)): return math.nan
  p_inf = math.isinf(a) or math.isinf(b)
  if p_inf and (a == 0 or b == 0): return math.nan
  psign = -1.0 if (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0) else 1.0
  if p_inf: return math.nan if (math.isinf(c) and c != psign * INF) else psign * INF
  if math.isinf(c): return c
  v = exact(a) * exact(b) + exact(c)
  if v == 0:
    pz = exact(a) * exact(b) == 0
    return -0.0 if (pz and psign < 0 and math.copysign(1, c) < 0) else 0.0
  r = rn(v, t)
  return r if r != 0 else math.copysign(0.0, float(v))


def f_div(a: float, b: float, t: str) -> float:
  if math.isnan(a) or math.isnan(b) or (a == 0 and b == 0) or (math.isinf(a) and math.isinf(b)): return math.nan
  sign = -1.0 if (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0) else 1.0
  if math.isinf(a) or b == 0: return sign * INF
  if math.isinf(b) or a == 0: return sign * 0.0
  r = rn(exact(a) / exact(b), t)
  return r if r != 0 else sign * 0.0


def f_sqrt(a: float, t: str) -> float:
  """Correctly rounded square root: a candidate, moved until a lies strictly between the squares of its two midpoints."""
  if math.isnan(a) or a < 0: return math.nan
  if a == 0 or math.isinf(a): return a
  v = exact(a)
  step = (lambda x, d: float(np.nextafter(np.float32(x), np.float32(d)))) if t == "f32" else math.nextafter
  r = rn(Fraction(math.sqrt(a)), t)
  for _ in range(4):
    lo, hi = (Fraction(step(r, -INF)) + Fraction(r)) / 2, (Fraction(r) + Fraction(step(r, INF))) / 2
    if lo * lo < v < hi * hi: return r
    r = step(r, INF) if v >= hi * hi else step(r, -INF)
  raise AssertionError(f"sqrt oracle did not converge for {a!r}")


def same_float(got: float, want: float) -> bool:
  if math.isnan(want): return math.isnan(got)
  return got == want and math.copysign(1, got) == math.copysign(1, want)


# ---------------------------------------------------------------------------- strategies

def arrays(t: str) -> st.SearchStrategy:
  if t in ("f32", "f64"):
    w = 32 if t == "f32" else 64
    edge = st.sampled_from([0.0, -0.0, 1.0, -1.0, INF, -INF, math.nan, 1e-45 if w == 32 else 5e-324, 2.0 ** -126, 3.4e38, 0.5, 1.5, 2.5])
    return hnp.arrays(NPT[t], N, elements=st.one_of(st.floats(width=w), edge))
  if t in ("f16", "bf16", "b16"):
    specials = st.sampled_from([0, 0x8000, 0x3C00, 0x7C00, 0xFC00, 0x7E00, 0x3F80, 0x7F80, 1])
    return hnp.arrays(np.uint16, N, elements=st.one_of(st.integers(0, 0xFFFF), specials))
  if t == "pred": return hnp.arrays(np.uint8, N, elements=st.integers(0, 1))
  info = np.iinfo(NPT[t])
  specials = st.sampled_from([0, 1, info.max, info.min, -1 if info.min else 2, 7])
  return hnp.arrays(NPT[t], N, elements=st.one_of(st.integers(info.min, info.max), specials))


def decode(a: np.ndarray, t: str) -> list:
  if t in ("f16", "bf16"): return [fval(int(x), t) for x in a]
  if t in ("f32", "f64"): return [float(x) for x in a]
  return [int(x) for x in a]


# ---------------------------------------------------------------------------- the table

BITS = {"s16": 16, "u16": 16, "b16": 16, "s32": 32, "u32": 32, "b32": 32, "s64": 64, "u64": 64, "b64": 64}
Spec = tuple[str, list[str], list[str], Callable]  # template, input types, output types, lane oracle -> tuple of outputs


def wrap(v: int, t: str) -> int:
  b = BITS[t]
  v &= (1 << b) - 1
  return v - (1 << b) if t.startswith("s") and v >> (b - 1) else v


def uns(v: int, t: str) -> int: return v & ((1 << BITS[t]) - 1)


def int_spec(base: str, mods: list[str], t: str) -> Spec:
  b = BITS[t]
  two = f"{base}.{'.'.join(mods + [t])} {{d}}, {{a}}, {{b}}"
  if base == "add": return two, [t, t], [t], lambda x, y: (wrap(x + y, t),)
  if base == "sub": return two, [t, t], [t], lambda x, y: (wrap(x - y, t),)
  if base == "mul" and "lo" in mods: return two, [t, t], [t], lambda x, y: (wrap(x * y, t),)
  if base == "mul" and "hi" in mods: return two, [t, t], [t], lambda x, y: (wrap((x * y) >> b, t),)
  if base == "mul" and "wide" in mods:
    w = t[0] + str(2 * b)
    return two, [t, t], [w], lambda x, y: (wrap(x * y, w),)
  if base == "mad" and "wide" in mods:
    w = t[0] + str(2 * b)
    return f"mad.wide.{t} {{d}}, {{a}}, {{b}}, {{c}}", [t, t, w], [w], lambda x, y, z: (wrap(x * y + z, w),)
  if base == "mad": return f"mad.lo.{t} {{d}}, {{a}}, {{b}}, {{c}}", [t, t, t], [t], lambda x, y, z: (wrap(x * y + z, t),)
  if base in ("div", "rem"):
    def dr(x, y):
      if y == 0: return (wrap(-1, t) if base == "div" else x,)
      q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
      return (wrap(q, t) if base == "div" else wrap(x - q * y, t),)
    return two, [t, t], [t], dr
  if base in ("min", "max"): return two, [t, t], [t], lambda x, y: ((min if base == "min" else max)(x, y),)
  if base == "neg": return f"neg.{t} {{d}}, {{a}}", [t], [t], lambda x: (wrap(-x, t),)
  raise KeyError(base)


def bit_spec(base: str, mods: list[str], t: str) -> Spec:
  if t == "pred":
    fn = {"and": lambda x, y: x & y, "or": lambda x, y: x | y, "xor": lambda x, y: x ^ y}
    if base == "not": return "not.pred {d}, {a}", ["pred"], ["pred"], lambda x: (1 - x,)
    return f"{base}.pred {{d}}, {{a}}, {{b}}", ["pred", "pred"], ["pred"], lambda x, y: (fn[base](x, y),)
  b = BITS[t]
  if base in ("and", "or", "xor"):
    fn = {"and": lambda x, y: x & y, "or": lambda x, y: x | y, "xor": lambda x, y: x ^ y}[base]
    return f"{base}.{t} {{d}}, {{a}}, {{b}}", [t, t], [t], lambda x, y: (uns(fn(x, y), t),)
  if base == "not": return f"not.{t} {{d}}, {{a}}", [t], [t], lambda x: (uns(~x, t),)
  if base in ("shl", "shr"):
    def sh(x, n):
      n = uns(n, "u32")
      if base == "shl": return (uns(x << min(n, b), t),)
      if t.startswith("s"): return (wrap(x >> min(n, b - 1), t),)
      return (x >> min(n, b) if n < b else 0,)
    return f"{base}.{t} {{d}}, {{a}}, {{b}}", [t, "u32"], [t], sh
  if base == "clz": return f"clz.{t} {{d}}, {{a}}", [t], ["u32"], lambda x: (b - uns(x, t).bit_length(),)
  if base == "bfi":
    def bfi(x, y, pos, ln):
      pos, ln = min(pos & 0xFF, b), min(ln & 0xFF, b)
      m = ((1 << ln) - 1) << pos & ((1 << b) - 1)
      return ((uns(y, t) & ~m | (uns(x, t) << pos) & m) & ((1 << b) - 1),)
    return f"bfi.{t} {{d}}, {{a}}, {{b}}, {{c}}, {{f}}", [t, t, "u32", "u32"], [t], bfi
  if base == "shf":
    return "shf.l.wrap.b32 {d}, {a}, {b}, {c}", ["b32", "b32", "u32"], ["b32"], \
      lambda lo, hi, n: ((((hi << 32 | lo) << (n & 31)) >> 32) & 0xFFFFFFFF,)
  raise KeyError(base)


def float_spec(base: str, mods: list[str], t: str) -> Spec:
  op = ".".join([base] + mods + [t])
  two, one = f"{op} {{d}}, {{a}}, {{b}}", f"{op} {{d}}, {{a}}"
  enc = (lambda v: (fbits(v, t) if not math.isnan(v) else "nan",)) if t in ("f16", "bf16") else (lambda v: (v,))
  if base == "add": return two, [t, t], [t], lambda x, y: enc(f_add(x, y, t))
  if base == "sub": return two, [t, t], [t], lambda x, y: enc(f_add(x, -y, t))
  if base == "mul": return two, [t, t], [t], lambda x, y: enc(f_mul(x, y, t))
  if base == "fma": return f"{op} {{d}}, {{a}}, {{b}}, {{c}}", [t, t, t], [t], lambda x, y, z: enc(f_fma(x, y, z, t))
  if base == "div" and "rn" in mods: return two, [t, t], [t], lambda x, y: enc(f_div(x, y, t))
  if base == "sqrt": return one, [t], [t], lambda x: enc(f_sqrt(x, t))
  if base == "rcp" and "rn" in mods: return one, [t], [t], lambda x: enc(f_div(1.0, x, t))
  if base == "abs": return one, [t], [t], lambda x: enc(abs(x) if not math.isnan(x) else math.nan)
  if base == "neg": return one, [t], [t], lambda x: enc(-x)
  if base in ("rcp", "ex2", "div"): return approx_spec(op, base, mods, t)
  raise KeyError(base)


def approx_spec(op: str, base: str, mods: list[str], t: str) -> Spec:
  """`.approx`: the exact function within a relative error bound (ftz: subnormals as zero)."""
  tiny = 2.0 ** -126 if t == "f32" else 2.0 ** -1022
  flush = (lambda v: math.copysign(0.0, v) if abs(v) < tiny else v) if "ftz" in mods else (lambda v: v)
  def approx(fn, *xs):
    try: return (("approx", fn(*[flush(x) for x in xs])),)
    except (ZeroDivisionError, OverflowError, ValueError): return (("approx", None),)
  if base == "rcp": return f"{op} {{d}}, {{a}}", [t], [t], lambda x: approx(lambda a: 1 / a, x)
  if base == "ex2": return f"{op} {{d}}, {{a}}", [t], [t], lambda x: approx(lambda a: 2.0 ** a, x)
  return f"{op} {{d}}, {{a}}, {{b}}", [t, t], [t], lambda x, y: approx(lambda a, b: a / b if abs(b) <= 2.0 ** 126 else 0.0 * a, x, y)


CMP = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
       "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}


def cmp_spec(base: str, mods: list[str], types: list[str]) -> Spec:
  c = mods[0]
  t = types[-1]
  def f(x, y):
    if t in ("f16", "bf16", "f32", "f64"):
      nan = math.isnan(x) or math.isnan(y)
      if c == "num": r = not nan
      elif c == "nan": r = nan
      elif c.endswith("u") and c[:-1] in CMP: r = nan or CMP[c[:-1]](x, y)
      else: r = (not nan) and CMP[c](x, y)
    else: r = CMP[c](x, y)
    return int(r)
  if base == "setp": return f"setp.{c}.{t} {{d}}, {{a}}, {{b}}", [t, t], ["pred"], lambda x, y: (f(x, y),)
  return f"set.{c}.f32.{t} {{d}}, {{a}}, {{b}}", [t, t], ["f32"], lambda x, y: (1.0 if f(x, y) else 0.0,)


def cvt_spec(mods: list[str], dt: str, st_: str) -> Spec:
  op = ".".join(["cvt"] + mods + [dt, st_])
  if dt in ("e4m3x2", "e5m2x2"):
    f8 = "e4m3" if dt.startswith("e4m3") else "e5m2"
    def to8(v: float) -> int:
      if math.isnan(v): return 0x7F
      if math.isinf(v): v = math.copysign(float(FORMATS[f8][2]), v)
      r = rn(exact(v), f8, sat=True) if v != 0 else v
      arr = np.array(r, np.float32).astype(ml_dtypes.float8_e4m3fn if f8 == "e4m3" else ml_dtypes.float8_e5m2)
      return int(arr.view(np.uint8)) | (0x80 if math.copysign(1, r) < 0 else 0)
    return f"{op} {{d}}, {{a}}, {{b}}", ["f32", "f32"], [dt], lambda x, y: ((to8(x) << 8) | to8(y),)
  if st_ in ("e4m3x2", "e5m2x2"):
    mdt = ml_dtypes.float8_e4m3fn if st_.startswith("e4m3") else ml_dtypes.float8_e5m2
    def from8(v: int) -> tuple:
      lo, hi = (float(np.uint8(x).view(mdt)) for x in (v & 0xFF, (v >> 8) & 0xFF))
      h = [0x7FFF if math.isnan(x) else int(np.float16(x).view(np.uint16)) for x in (lo, hi)]
      return (h[1] << 16 | h[0],)
    return f"{op} {{d}}, {{a}}", ["b16"], ["f16x2"], from8
  fl = ("f16", "bf16", "f32", "f64")
  if st_ in fl and dt in fl:
    irnd = next((m for m in mods if m.endswith("i")), None)
    def ff(x: float):
      if math.isnan(x): return ("nan",) if dt in ("f16", "bf16") else (math.nan,)
      if irnd: v = float(math.trunc(x)) if not math.isinf(x) else x
      elif math.isinf(x) or x == 0: v = x
      else: v = rn(exact(x), dt)
      if v == 0: v = math.copysign(0.0, x)
      return (fbits(v, dt),) if dt in ("f16", "bf16") else (v,)
    return f"{op} {{d}}, {{a}}", [st_], [dt], ff
  if st_ in fl:  # float -> int, saturating
    irnd = next(m for m in mods if m.endswith("i"))
    info = np.iinfo(NPT[dt])
    def fi(x: float):
      if math.isnan(x): return (0,)
      if math.isinf(x): return (info.max if x > 0 else info.min,)
      r = {"rzi": math.trunc, "rni": lambda v: round(v), "rmi": math.floor, "rpi": math.ceil}[irnd](x)
      return (min(max(r, info.min), info.max),)
    return f"{op} {{d}}, {{a}}", [st_], [dt], fi
  if dt in fl:
    return f"{op} {{d}}, {{a}}", [st_], [dt], lambda x: (rn(Fraction(x), dt) if x else 0.0,)
  def ii(x: int):
    src = wrap(x, st_) if st_ in BITS else x
    return (wrap(src, dt),)
  src_t = {"s8": "s8", "u8": "u8"}.get(st_, st_)
  if src_t in ("s8", "u8"):
    return f"{op} {{d}}, {{a}}", ["b16"], [dt], lambda x: (wrap((x & 0xFF) - (0x100 if src_t == "s8" and x & 0x80 else 0), dt),)
  return f"{op} {{d}}, {{a}}", [st_], [dt], ii


def selp_spec(t: str) -> Spec:
  return f"selp.{t} {{d}}, {{a}}, {{b}}, {{c}}", [t, t, "pred"], [t], lambda x, y, p: (x if p else y,)


def mov_spec(t: str) -> Spec:
  if t == "pred": return "mov.pred {d}, {a}", ["pred"], ["pred"], lambda x: (x,)
  return f"mov.{t} {{d}}, {{a}}", [t], [t], lambda x: (x,)


def carry_spec(op: str) -> Spec:
  """Multiword chains, as the f64 sin reduction uses them: the carry flag must flow through each instruction."""
  if op in ("add.cc.u32", "addc.u32"):
    return ("add.cc.u32 {d}, {a}, {b};\n\taddc.u32 {e}, {c}, {a}", ["u32", "u32", "u32"], ["u32", "u32"],
            lambda a, b, c: ((a + b) & 0xFFFFFFFF, (c + a + ((a + b) >> 32)) & 0xFFFFFFFF))
  if op == "addc.cc.u32":
    return ("add.cc.u32 {d}, {a}, {b};\n\taddc.cc.u32 {d}, {c}, {a};\n\taddc.u32 {e}, 0, 0", ["u32", "u32", "u32"], ["u32", "u32"],
            lambda a, b, c: ((c + a + ((a + b) >> 32)) & 0xFFFFFFFF, (c + a + ((a + b) >> 32)) >> 32))
  if op in ("sub.cc.u32", "subc.u32"):
    return ("sub.cc.u32 {d}, {a}, {b};\n\tsubc.u32 {e}, {c}, {a}", ["u32", "u32", "u32"], ["u32", "u32"],
            lambda a, b, c: ((a - b) % 2 ** 32, (c - a - (a < b)) % 2 ** 32))
  if op == "subc.cc.u32":
    return ("sub.cc.u32 {d}, {a}, {b};\n\tsubc.cc.u32 {d}, {c}, {a};\n\tsubc.u32 {e}, 0, 0", ["u32", "u32", "u32"], ["u32", "u32"],
            lambda a, b, c: ((c - a - (a < b)) % 2 ** 32, 0xFFFFFFFF if c - a - (a < b) < 0 else 0))
  def madc(a, b, c):  # (a*b + c) 64-bit result from 32-bit pieces: lo = mad.lo.cc, hi = madc.hi
    full = a * b + c
    return full & 0xFFFFFFFF, (full >> 32) & 0xFFFFFFFF
  if op in ("mad.lo.cc.u32", "madc.hi.u32"):
    return "mad.lo.cc.u32 {d}, {a}, {b}, {c};\n\tmadc.hi.u32 {e}, {a}, {b}, 0", ["u32", "u32", "u32"], ["u32", "u32"], madc
  if op == "madc.hi.cc.u32":  # hi(a*b) + c + CF with a carry out, consumed by addc
    def mhc(a, b, c):
      s = ((a * b) >> 32) + c + (((a * b) & 0xFFFFFFFF) + c >> 32)
      return s & 0xFFFFFFFF, s >> 32
    return ("mad.lo.cc.u32 {e}, {a}, {b}, {c};\n\tmadc.hi.cc.u32 {d}, {a}, {b}, {c};\n\taddc.u32 {e}, 0, 0",
            ["u32", "u32", "u32"], ["u32", "u32"], mhc)
  if op == "madc.lo.cc.u32":
    def mlc(a, b, c):
      s = ((a * b) & 0xFFFFFFFF) + c + (((a * b) & 0xFFFFFFFF) + c >> 32)
      return s & 0xFFFFFFFF, s >> 32
    return ("mad.lo.cc.u32 {e}, {a}, {b}, {c};\n\tmadc.lo.cc.u32 {d}, {a}, {b}, {c};\n\taddc.u32 {e}, 0, 0",
            ["u32", "u32", "u32"], ["u32", "u32"], mlc)
  raise KeyError(op)


CARRY = {"add.cc.u32", "addc.cc.u32", "addc.u32", "sub.cc.u32", "subc.cc.u32", "subc.u32", "mad.lo.cc.u32", "madc.hi.cc.u32",
         "madc.hi.u32", "madc.lo.cc.u32"}


def spec(op: str) -> Spec:
  if op in CARRY: return carry_spec(op)
  base, mods, types = split_opcode(op)
  t = types[-1]
  if base in ("setp", "set"): return cmp_spec(base, mods, types)
  if base == "cvt": return cvt_spec(mods, types[0], types[1])
  if base == "selp": return selp_spec(t)
  if base == "mov": return mov_spec(t)
  if t in ("f16", "bf16", "f32", "f64"): return float_spec(base, mods, t)
  if base in ("and", "or", "xor", "not", "shl", "shr", "clz", "bfi", "shf"): return bit_spec(base, mods, t)
  return int_spec(base, mods, t)


# the ALU opcodes in NVRTC's PTX of the conformance kernels and the op/cast sweep (sm_80 and sm_90)
RENDERER_OPCODES = """
abs.f16 abs.f32 abs.f64 add.bf16 add.cc.u32 add.f16 add.f32 add.f64 add.rn.f64 add.s16 add.s32 add.s64 add.u64 addc.cc.u32 addc.u32
and.b16 and.b32 and.b64 and.pred bfi.b32 bfi.b64 clz.b64 cvt.f32.bf16 cvt.f32.f16 cvt.f64.f32 cvt.rn.bf16.f32 cvt.rn.f16.f32
cvt.rn.f16x2.e4m3x2 cvt.rn.f16x2.e5m2x2 cvt.rn.f32.f64 cvt.rn.f32.s16 cvt.rn.f32.s32 cvt.rn.f32.s64 cvt.rn.f32.u16 cvt.rn.f32.u32
cvt.rn.f32.u64 cvt.rn.f64.s16 cvt.rn.f64.s32 cvt.rn.f64.s64 cvt.rn.f64.u16 cvt.rn.f64.u32 cvt.rn.f64.u64 cvt.rn.satfinite.e4m3x2.f32
cvt.rn.satfinite.e5m2x2.f32 cvt.rni.s32.f32 cvt.rni.s32.f64 cvt.rzi.f32.f32 cvt.rzi.f64.f64 cvt.rzi.s32.f32 cvt.rzi.s32.f64
cvt.rzi.s64.f32 cvt.rzi.s64.f64 cvt.rzi.u32.f32 cvt.rzi.u32.f64 cvt.rzi.u64.f32 cvt.rzi.u64.f64 cvt.s16.s8 cvt.s32.s16 cvt.s32.s8
cvt.s64.s16 cvt.s64.s32 cvt.s64.s8 cvt.u16.u32 cvt.u16.u64 cvt.u32.u16 cvt.u32.u64 cvt.u64.u16 cvt.u64.u32 div.approx.f32 div.rn.f32
div.rn.f64 div.s32 div.s64 div.u16 div.u32 div.u64 ex2.approx.f32 fma.rn.bf16 fma.rn.f32 fma.rn.f64 mad.lo.cc.u32 mad.lo.s32
mad.wide.u32 madc.hi.cc.u32 madc.hi.u32 madc.lo.cc.u32 max.s16 max.s32 max.s64 max.u16 max.u32 max.u64 min.s32 mov.b16 mov.b32
mov.b64 mov.f32 mov.f64 mov.pred mov.u16 mov.u32 mov.u64 mul.bf16 mul.f16 mul.f32 mul.f64 mul.hi.s32 mul.hi.u32 mul.lo.s16
mul.lo.s32 mul.lo.s64 mul.lo.u32 mul.rn.f32 mul.rn.f64 mul.wide.s32 mul.wide.u32 neg.bf16 neg.f16 neg.f32 neg.f64 neg.s16 neg.s32
neg.s64 not.b32 not.pred or.b16 or.b32 or.b64 or.pred rcp.approx.ftz.f32 rcp.approx.ftz.f64 rcp.rn.f32 rcp.rn.f64 rem.s32 rem.s64
rem.u16 rem.u32 rem.u64 selp.b16 selp.b32 selp.b64 selp.f32 selp.f64 selp.u16 selp.u32 selp.u64 set.eq.f32.f32 set.gt.f32.f32
set.lt.f32.f32 set.neu.f32.f32 setp.eq.b32 setp.eq.b64 setp.eq.bf16 setp.eq.f16 setp.eq.f32 setp.eq.f64 setp.eq.s16 setp.eq.s32
setp.eq.s64 setp.ge.f32 setp.ge.s32 setp.geu.f32 setp.gt.bf16 setp.gt.f16 setp.gt.f32 setp.gt.f64 setp.gt.s32 setp.gt.s64
setp.gt.u16 setp.gt.u32 setp.gt.u64 setp.gtu.f64 setp.le.f32 setp.lt.bf16 setp.lt.f16 setp.lt.f32 setp.lt.f64 setp.lt.s16
setp.lt.s32 setp.lt.s64 setp.lt.u16 setp.lt.u32 setp.lt.u64 setp.ltu.f32 setp.ltu.f64 setp.nan.f32 setp.nan.f64 setp.ne.s16
setp.ne.s32 setp.ne.s64 setp.neu.bf16 setp.neu.f16 setp.neu.f32 setp.neu.f64 setp.num.f32 shf.l.wrap.b32 shl.b16 shl.b32 shl.b64
shr.s32 shr.s64 shr.u16 shr.u32 shr.u64 sqrt.rn.f32 sqrt.rn.f64 sub.bf16 sub.cc.u32 sub.f16 sub.f32 sub.f64 sub.s16 sub.s32
sub.s64 subc.cc.u32 subc.u32 xor.b16 xor.b32 xor.b64 xor.pred""".split()
ARCH = {"add.bf16": "sm_90", "sub.bf16": "sm_90", "mul.bf16": "sm_90", "setp.eq.bf16": "sm_90", "setp.gt.bf16": "sm_90",
        "setp.lt.bf16": "sm_90", "setp.neu.bf16": "sm_90", "cvt.rn.f16x2.e4m3x2": "sm_90", "cvt.rn.f16x2.e5m2x2": "sm_90",
        "cvt.rn.satfinite.e4m3x2.f32": "sm_90", "cvt.rn.satfinite.e5m2x2.f32": "sm_90"}


def check(op: str, got: list[np.ndarray], inputs: list[np.ndarray], sp: Spec) -> None:
  _, ins, outs, oracle = sp
  cols = [decode(a, t) for a, t in zip(inputs, ins)]
  for lane in range(N):
    want = oracle(*[c[lane] for c in cols])
    for k, (w, t) in enumerate(zip(want, outs)):
      g = got[k][lane]
      args = [c[lane] for c in cols]
      if isinstance(w, tuple) and w[0] == "approx":
        gv = float(g)
        if w[1] is None or math.isinf(w[1]) or math.isnan(w[1]): ok = math.isinf(gv) or math.isnan(gv) or w[1] is None
        else: ok = math.isclose(gv, w[1], rel_tol=2.0 ** -21, abs_tol=2.0 ** -126)
      elif w == "nan": ok = math.isnan(fval(int(g), t))
      elif t in ("f32", "f64"): ok = same_float(float(g), float(w))
      else: ok = int(g) == int(w)
      assert ok, f"{op} lane {lane}: inputs {args} -> got {g!r}, want {w!r}"


@pytest.mark.parametrize("op", RENDERER_OPCODES)
def test_alu_opcode(op: str):
  sp = spec(op)
  template, ins, outs, _ = sp
  arch = ARCH.get(op, "sm_80")

  @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
  @given(st.tuples(*[arrays(t if t not in ("s8", "u8") else "b16") for t in ins]))
  def prop(inputs):
    if op.startswith(("div.s", "div.u", "rem.")):
      inputs = (inputs[0], np.where(inputs[1] == 0, 1, inputs[1]).astype(inputs[1].dtype))  # division by zero: its own test
      if op.endswith("s32") or op.endswith("s64") or op.endswith("s16"):
        info = np.iinfo(inputs[0].dtype)
        inputs = (np.where((inputs[0] == info.min) & (inputs[1] == -1), 0, inputs[0]).astype(inputs[0].dtype), inputs[1])
    if op == "div.approx.f32":  # the ISA's error bound holds for |b| in [2^-126, 2^126] and normal quotients
      b = np.abs(inputs[1].astype(np.float64))
      keep = (b >= 2.0 ** -126) & (b <= 2.0 ** 126) & np.isfinite(inputs[0])
      q = np.abs(inputs[0].astype(np.float64) / np.where(keep, inputs[1], 1))
      keep &= (q == 0) | ((q >= 2.0 ** -126) & (q < 2.0 ** 127))
      inputs = (np.where(keep, inputs[0], 1).astype(np.float32), np.where(keep, inputs[1], 1).astype(np.float32))
    got = run_alu(template, ins, outs, list(inputs), arch)
    check(op, got, list(inputs), sp)
  prop()


def test_integer_division_by_zero_and_overflow():
  """Division by zero gives all ones (the remainder: the dividend); INT_MIN / -1 wraps."""
  got = run_alu("div.s32 {d}, {a}, {b};\n\trem.s32 {e}, {a}, {b}", ["s32", "s32"], ["s32", "s32"],
                [np.array([7, -7, -2**31, 5] * 8, np.int32), np.array([0, 0, -1, 2] * 8, np.int32)])
  assert got[0][:4].tolist() == [-1, -1, -2**31, 2] and got[1][:4].tolist() == [7, -7, 0, 1]
  got = run_alu("div.u32 {d}, {a}, {b}", ["u32", "u32"], ["u32"], [np.full(32, 9, np.uint32), np.zeros(32, np.uint32)])
  assert (got[0] == 0xFFFFFFFF).all()


def test_div_approx_flushes_huge_divisors():
  """div.approx.f32 is a * (1/b) with the reciprocal flushed: for |b| in [2^126, 2^128] the result is 0 (inf/b: NaN), as the ISA says."""
  got = run_alu("div.approx.f32 {d}, {a}, {b}", ["f32", "f32"], ["f32"],
                [np.array([1.0, 3e38, INF, 1.0] * 8, np.float32), np.array([2.0 ** 127, 2.0 ** 126 * 1.5, 2.0 ** 127, 2.0] * 8, np.float32)])
  assert got[0][:2].tolist() == [0.0, 0.0] and math.isnan(got[0][2]) and got[0][3] == 0.5


@pytest.mark.parametrize("op,mode", [("add", "rz"), ("add", "rm"), ("add", "rp"), ("mul", "rz"), ("fma", "rm"), ("div", "rz"), ("sqrt", "rp")])
@pytest.mark.parametrize("t", ["f32", "f64"])
def test_directed_rounding(op: str, mode: str, t: str):
  """.rz/.rm/.rp: the exact result rounded toward zero / down / up (oracle: exact rationals bracketed by neighbours)."""
  rng = np.random.default_rng(hash((op, mode, t)) % 2**32)
  npdt = np.float32 if t == "f32" else np.float64
  xs = [(rng.standard_normal(N) * 10.0 ** rng.integers(-5, 5, N)).astype(npdt) for _ in range(3)]
  if op == "sqrt": xs[0] = np.abs(xs[0])
  nin = {"add": 2, "mul": 2, "fma": 3, "div": 2, "sqrt": 1}[op]
  tmpl = f"{op}.{mode}.{t} {{d}}, " + ", ".join("{" + c + "}" for c in "abc"[:nin])
  got = run_alu(tmpl, [t] * nin, [t], xs[:nin])[0]
  for i in range(N):
    a, b, c = (Fraction(float(x[i])) for x in xs)
    v = {"add": a + b, "mul": a * b, "fma": a * b + c, "div": a / b if b else None, "sqrt": None}[op]
    g = Fraction(float(got[i]))
    up, down = Fraction(float(np.nextafter(npdt(got[i]), npdt(INF)))), Fraction(float(np.nextafter(npdt(got[i]), npdt(-INF))))
    if op == "sqrt":
      a2 = a
      assert (g * g <= a2 < up * up) if mode != "rp" else (down * down < a2 <= g * g), (op, mode, float(a), float(got[i]))
      continue
    if v is None: continue
    if mode == "rz": assert abs(g) <= abs(v) < abs(up if v > 0 else down) or g == v, (op, mode, i, float(v), float(got[i]))
    if mode == "rm": assert g <= v < up, (op, mode, i, float(v), float(got[i]))
    if mode == "rp": assert down < v <= g, (op, mode, i, float(v), float(got[i]))


def test_the_table_covers_the_renderer():
  """Recompile the op/cast sweep and the GPU programs for sm_80 and sm_90: every ALU opcode in their PTX has a test
  above (or is a memory / control / tensor-core instruction tested elsewhere)."""
  from test_compile import gpu_program_sources, rename, sweep_asts

  from plugrad.codegen import get_program
  from plugrad_nv.compiler import NVRTCCompiler
  from plugrad_nv.mock.ptx import parse
  from plugrad_nv.mock.ptx.parser import Instr, Scope
  from plugrad_nv.renderer import CUDARenderer
  try: NVRTCCompiler("sm_90", keep_ptx=True)
  except OSError as e: pytest.skip(f"NVRTC not installed: {e}")
  srcs = [get_program(a, CUDARenderer()).src for a in sweep_asts()] + gpu_program_sources()
  seen: set[str] = set()
  def walk(sc: Scope) -> None:
    for it in sc.items:
      if isinstance(it, Scope): walk(it)
      elif isinstance(it, Instr): seen.add(it.opcode)
  for arch in ("sm_80", "sm_90"):
    c = NVRTCCompiler(arch, keep_ptx=True)
    for k in range(0, len(srcs), 150):
      ptx = c.nvrtc_compile("\n".join(rename(s, i) for i, s in enumerate(srcs[k:k + 150], k)), ptx=True).decode()
      for fn in parse(ptx).functions.values():
        if fn.body is not None: walk(fn.body)
  other = ("ld.", "st.", "cvta.", "bra", "ret", "bar.", "call", "mma.")
  missing = sorted(o for o in seen if not o.startswith(other) and o not in RENDERER_OPCODES)
  assert not missing, f"ALU opcodes without a test in RENDERER_OPCODES: {missing}"
