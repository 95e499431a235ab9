"""Instruction semantics: each PTX instruction becomes a closure `f(st, m)` over a `Frame` (plugrad_nv.mock.ptx.machine)
that computes on numpy arrays holding one value per lane and writes the lanes of the active mask `m` (None: every
lane). Operand types, modifiers, rounding and register conversions are resolved once here; control flow becomes a
terminator tuple that the scheduler interprets. Unknown instructions or forms raise `Unimplemented` with the line.

Numerics follow the PTX ISA: IEEE round to nearest even unless a rounding modifier says otherwise (.rz/.rm/.rp, exact
through plugrad_nv.mock.ptx.numerics), `.ftz` flushes float32 subnormal inputs and results, `.sat` clamps to [0, 1],
float -> int conversions saturate (NaN -> 0), integer division by zero gives all ones (remainder: the dividend).
`.approx` instructions (ex2, lg2, sin, cos, tanh, rsqrt, rcp, sqrt, div) return the correctly rounded value of the
exact function, which is within the ISA's stated error bound of the hardware's result but not bit-identical to it.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable

import numpy as np

from plugrad_nv.mock.ptx import numerics as N
from plugrad_nv.mock.ptx import parser as P
from plugrad_nv.mock.ptx.program import (LOCAL_WINDOW, NP, SHARED_WINDOW, SIGNED, UINT, WINDOW_SIZE, FnCompiler,
                                         PTXError, Unimplemented, bitconv)

f64, f32 = np.float64, np.float32
TYPES = set(NP) | {"b128", "e4m3", "e5m2"}
FLOAT = {"f16": N.F16, "bf16": N.BF16, "f32": N.F32, "f64": N.F64}
ROUND = {"rn", "rz", "rm", "rp", "rna"}
IROUND = {"rni", "rzi", "rmi", "rpi"}
Closure = Callable[[Any, Any], None]


def split_opcode(opcode: str) -> tuple[str, list[str], list[str]]:
  """'ld.global.nc.v4.f32' -> ('ld', ['global', 'nc', 'v4'], ['f32']); state-space qualifiers like ::cta dropped."""
  parts = opcode.split(".")
  mods, types = [], []
  for p in parts[1:]:
    p = p.split("::")[0] if p.split("::")[0] in ("shared", "global", "local", "const", "param") else p
    (types if p in TYPES else mods).append(p)
  return parts[0], mods, types


def err(ins: P.Instr, msg: str) -> Unimplemented: return Unimplemented(f"PTX line {ins.line}: {msg}: {ins.text}")


# ---------------------------------------------------------------------------- operands

def imm_value(imm: P.Imm, ptype: str) -> Any:
  """An immediate as a numpy scalar of `ptype`'s storage."""
  dt = NP[ptype]
  if ptype == "pred": return np.bool_(bool(imm.value))
  if ptype in FLOAT or ptype in ("f16x2", "bf16x2"):
    if imm.kind == "int" and ptype in ("f16", "bf16", "f16x2", "bf16x2"): return dt.type(imm.value & ((1 << (8 * dt.itemsize)) - 1))
    v = P.float_bits_to_float(imm) if imm.kind in ("f32", "f64") else float(imm.value)
    if ptype == "f32": return f32(v)
    if ptype == "f64": return f64(v)
    if ptype in ("f16", "bf16"): return N.encode(N.round_to(np.array([v]), None, FLOAT[ptype]), FLOAT[ptype])[0]
    raise PTXError(f"float immediate for .{ptype}")
  if imm.kind in ("f32", "f64"): v = imm.value
  elif imm.kind == "float": v = int(imm.value)
  else: v = int(imm.value)
  bits = 8 * dt.itemsize
  return np.array(v & ((1 << bits) - 1), dtype=UINT[dt.itemsize]).view(dt)[()]


def read(cx: FnCompiler, ins: P.Instr, op: Any, ptype: str) -> Callable[[Any], Any]:
  """Reader of an operand as `ptype`'s storage type (relaxed PTX type rules for registers of another size)."""
  want = NP[ptype]
  if isinstance(op, P.Imm):
    c = imm_value(op, ptype)
    return lambda st: c
  if isinstance(op, P.Neg):
    r = read(cx, ins, op.reg, "pred")
    return lambda st: ~r(st)
  if not isinstance(op, P.Reg): raise err(ins, f"unsupported operand {op!r} for .{ptype}")
  kind = cx.lookup(op.name, ins.line)
  if kind[0] == "reg":
    slot, rtype = kind[1], kind[2]
    conv = bitconv(NP[rtype], want, ptype in SIGNED or rtype in SIGNED)
    if conv is None: return lambda st: st.R[slot]
    return lambda st: conv(st.R[slot])
  if kind[0] == "sreg":
    name = kind[1]
    conv = bitconv(np.dtype(np.uint64) if name in ("%clock64", "%globaltimer") else np.dtype(np.uint32), want, False)
    if conv is None: return lambda st: st.L.sreg(name)
    return lambda st: conv(st.L.sreg(name))
  if kind[0] == "sym":
    if kind[1].space == "shared": cx.cf.shared.add(kind[1].index)
    return _symbol_address(ins, kind[1], want)
  raise err(ins, f"{op.name} ({kind[0]}) can't be used as a value")


def _symbol_address(ins: P.Instr, sym: Any, want: np.dtype) -> Callable[[Any], Any]:
  """The address of a variable in its own state space (mov %rd, var)."""
  conv = bitconv(np.dtype(np.uint64), want, False) or (lambda v: v)
  if sym.space in ("global", "const"): idx = sym.index; return lambda st: conv(np.uint64(st.L.gaddr[idx]))
  if sym.space == "shared": idx = sym.index; return lambda st: conv(np.uint64(st.L.saddr[idx]))
  if sym.space == "local": off = sym.offset; return lambda st: conv(np.uint64(st.lbase + off))
  raise err(ins, f"taking the address of .{sym.space} variable {sym.name} is not supported")


def write(cx: FnCompiler, ins: P.Instr, op: Any, ptype: str) -> Callable[[Any, Any, Any], None]:
  """Writer of a `ptype` value (storage dtype) into a destination register under a lane mask."""
  if op is None: return lambda st, m, v: None
  if not isinstance(op, P.Reg): raise err(ins, f"destination must be a register, got {op!r}")
  kind = cx.lookup(op.name, ins.line)
  if kind[0] != "reg": raise err(ins, f"{op.name} is not a register that can be written")
  slot, rtype = kind[1], kind[2]
  want, store = NP[ptype], NP[rtype]
  conv = bitconv(want, store, ptype in SIGNED)

  def w(st, m, v):
    if v.dtype != want: v = v.astype(want)
    if conv is not None: v = conv(v)
    if v.shape != st.L.shape: v = np.broadcast_to(v, st.L.shape)
    st.R[slot] = v if m is None else np.where(m, v, st.R[slot])
  return w


def reg_type(cx: FnCompiler, ins: P.Instr, op: Any) -> str:
  kind = cx.lookup(op.name, ins.line) if isinstance(op, P.Reg) else None
  if kind is None or kind[0] != "reg": raise err(ins, f"{op!r} must be a register")
  return kind[2]


def guarded(f: Closure, slot: int, neg: bool) -> Closure:
  def g(st, m):
    p = st.R[slot]
    if neg: p = ~p
    mm = p if m is None else (m & p)
    if mm.any(): f(st, mm)
  return g


def simple(cx, ins, ptype_out: str, ptypes_in: list[str], fn: Callable, dst: int = 0) -> Closure:
  """d = fn(*sources) with each operand read as its type."""
  w = write(cx, ins, ins.operands[dst], ptype_out)
  rs = [read(cx, ins, o, t) for o, t in zip(ins.operands[dst + 1:], ptypes_in)]
  if len(rs) != len(ptypes_in): raise err(ins, f"expected {len(ptypes_in) + 1} operands")
  if len(rs) == 1:
    r0 = rs[0]
    return lambda st, m: w(st, m, fn(r0(st)))
  if len(rs) == 2:
    r0, r1 = rs
    return lambda st, m: w(st, m, fn(r0(st), r1(st)))
  if len(rs) == 3:
    r0, r1, r2 = rs
    return lambda st, m: w(st, m, fn(r0(st), r1(st), r2(st)))
  return lambda st, m: w(st, m, fn(*[r(st) for r in rs]))


# ---------------------------------------------------------------------------- floats

def fdecode(ptype: str) -> Callable[[Any], np.ndarray]:
  if ptype == "f16": return N.f16_to_f64
  if ptype == "bf16": return N.bf16_to_f64
  return lambda v: np.asarray(v, dtype=f64)


def fencode(ptype: str) -> Callable[[np.ndarray], Any]:
  """Storage of float64 values already rounded to `ptype`."""
  if ptype in ("f16", "bf16"):
    fmt = FLOAT[ptype]
    return lambda x: N.encode(x, fmt)
  if ptype == "f32": return lambda x: np.asarray(x).astype(f32)
  return lambda x: np.asarray(x, dtype=f64)


def float_family(cx, ins, ptype: str, nin: int, compute: Callable[..., np.ndarray], mods: list[str],
                 dst: int = 0) -> Closure:
  """A float instruction on f16/bf16/f32/f64 or packed f16x2/bf16x2: inputs decoded to float64 (flushed with .ftz),
  `compute(*xs)` returns float64 values already rounded to the format; .sat/.relu applied; result encoded."""
  if ptype in ("f16x2", "bf16x2"):
    half = ptype[:-2]
    inner = _float_compute(half, compute, mods)
    def pair(*vs):
      lo = inner(*[np.asarray(v, dtype=np.uint32) & np.uint32(0xFFFF) for v in vs])
      hi = inner(*[np.asarray(v, dtype=np.uint32) >> np.uint32(16) for v in vs])
      return lo.astype(np.uint32) | (hi.astype(np.uint32) << np.uint32(16))
    return simple(cx, ins, ptype, [ptype] * nin, pair, dst)
  if ptype not in FLOAT: raise err(ins, f"float instruction on .{ptype}")
  return simple(cx, ins, ptype, [ptype] * nin, _float_compute(ptype, compute, mods), dst)


def _float_compute(ptype: str, compute: Callable, mods: list[str]) -> Callable:
  dec, enc = fdecode(ptype), fencode(ptype)
  do_ftz, sat, relu = "ftz" in mods and ptype == "f32", "sat" in mods, "relu" in mods
  def f(*vs):
    xs = [dec(v) for v in vs]
    if do_ftz: xs = [N.ftz(x) for x in xs]
    r = compute(*xs)
    if do_ftz: r = N.ftz(r)
    if sat: r = np.where(np.isnan(r), 0.0, np.clip(r, 0.0, 1.0))
    if relu: r = np.where(np.isnan(r), np.nan, np.maximum(r, 0.0))
    return enc(r)
  return f


def rmode(mods: list[str], default: str = "rn") -> str:
  got = [m for m in mods if m in ROUND]
  return got[0] if got else default


def _round(fmt: N.Fmt, mode: str) -> Callable[[np.ndarray], np.ndarray]:
  if fmt is N.F64: return lambda x: x
  return lambda x: N.round_to(x, None, fmt, mode)


def b_add(cx, ins, mods, types, sub: bool = False):
  t = types[0]
  if t in FLOAT or t in ("f16x2", "bf16x2"):
    fmt, mode = FLOAT.get(t, N.F16 if t == "f16x2" else N.BF16), rmode(mods)
    sign = -1.0 if sub else 1.0
    if t == "f32" and mode == "rn" and not ({"ftz", "sat"} & set(mods)):
      return simple(cx, ins, t, [t, t], np.subtract if sub else np.add)
    if t == "f64" and mode == "rn": return simple(cx, ins, t, [t, t], np.subtract if sub else np.add)
    return float_family(cx, ins, t, 2, lambda a, b: N.add_exact(a, sign * b, fmt, mode), mods)
  return _int_addsub(cx, ins, mods, t, sub)


def b_mul(cx, ins, mods, types):
  t = types[0]
  if t in FLOAT or t in ("f16x2", "bf16x2"):
    fmt, mode = FLOAT.get(t, N.F16 if t == "f16x2" else N.BF16), rmode(mods)
    if t in ("f32", "f64") and mode == "rn" and not ({"ftz", "sat"} & set(mods)): return simple(cx, ins, t, [t, t], np.multiply)
    return float_family(cx, ins, t, 2, lambda a, b: N.mul_exact(a, b, fmt, mode), mods)
  return _int_mul(cx, ins, mods, t)


def b_fma(cx, ins, mods, types):
  t = types[0]
  if t not in FLOAT and t not in ("f16x2", "bf16x2"): return _int_mad(cx, ins, mods, t)
  fmt, mode = FLOAT.get(t, N.F16 if t == "f16x2" else N.BF16), rmode(mods)
  if fmt is N.F64:
    if mode != "rn": return float_family(cx, ins, t, 3, lambda a, b, c: _fma64_directed(a, b, c, mode), mods)
    return float_family(cx, ins, t, 3, N.fma64, mods)
  return float_family(cx, ins, t, 3, lambda a, b, c: N.fma_small(a, b, c, fmt, mode), mods)


def _fma64_directed(a, b, c, mode):
  out = np.asarray(N.fma64(a, b, c), dtype=f64).copy()
  a, b, c = np.broadcast_arrays(a, b, c)
  for i in np.flatnonzero(np.isfinite(out) & np.isfinite(a) & np.isfinite(b) & np.isfinite(c)):
    v = Fraction(float(a.flat[i])) * Fraction(float(b.flat[i])) + Fraction(float(c.flat[i]))
    out.flat[i] = N.rational_round(v, N.F64, mode) if v != 0 else out.flat[i]
  return out


def b_mad(cx, ins, mods, types):
  if types[0] in FLOAT: return b_fma(cx, ins, mods + (["rn"] if not (set(mods) & ROUND) else []), types)
  return _int_mad(cx, ins, mods, types[0])


def b_div(cx, ins, mods, types):
  t = types[0]
  if t not in FLOAT: return _int_divrem(cx, ins, t, rem=False)
  fmt = FLOAT[t]
  if "approx" in mods:  # a * (1/b), the reciprocal flushed when subnormal: |b| in [2^126, 2^128] gives 0 (inf/b: NaN)
    def approx(a, b):
      r = N.ftz(N.round_to(1.0 / b, None, fmt, "rn"))
      return N.round_to(a * r, None, fmt, "rn")
    return float_family(cx, ins, t, 2, approx, mods)
  mode = "rn" if "full" in mods else rmode(mods)
  if t == "f32" and mode == "rn" and not ({"ftz", "sat"} & set(mods)): return simple(cx, ins, t, [t, t], np.divide)
  if t == "f64" and mode == "rn": return simple(cx, ins, t, [t, t], np.divide)
  return float_family(cx, ins, t, 2, lambda a, b: N.div_exact(a, b, fmt, mode), mods)


def b_rem(cx, ins, mods, types): return _int_divrem(cx, ins, types[0], rem=True)


def b_rcp(cx, ins, mods, types):
  t = types[0]
  fmt = FLOAT[t]
  if "approx" in mods:
    flush = "ftz" in mods
    def approx(a):
      r = N.round_to(1.0 / a, None, fmt, "rn") if fmt is not N.F64 else 1.0 / a
      return N.ftz(r, fmt) if flush else r
    return float_family(cx, ins, t, 1, approx, mods)
  mode = rmode(mods)
  return float_family(cx, ins, t, 1, lambda a: N.div_exact(np.ones_like(a), a, fmt, mode), mods)


def b_sqrt(cx, ins, mods, types):
  t = types[0]
  fmt, mode = FLOAT[t], ("rn" if "approx" in mods else rmode(mods))
  if t == "f32" and mode == "rn" and not ({"ftz", "sat"} & set(mods)): return simple(cx, ins, t, [t], np.sqrt)
  return float_family(cx, ins, t, 1, lambda a: N.sqrt_exact(a, fmt, mode), mods)


def _approx(fn: Callable[[np.ndarray], np.ndarray]) -> Callable:
  def b(cx, ins, mods, types):
    t = types[0]
    rnd = _round(FLOAT.get(t, N.F16 if t == "f16x2" else N.BF16), "rn")
    return float_family(cx, ins, t, 1, lambda a: rnd(fn(a)), mods)
  return b


def _rsqrt(a): return 1.0 / np.sqrt(a)


def b_abs(cx, ins, mods, types):
  t = types[0]
  if t in ("f32", "f64", "f16", "bf16", "f16x2", "bf16x2"):
    dt = NP[t]
    mask = dt.type(~(1 << (8 * dt.itemsize - 1)) & ((1 << 8 * dt.itemsize) - 1)) if t not in ("f16x2", "bf16x2") else np.uint32(0x7FFF7FFF)
    if t in ("f32", "f64"):
      u = UINT[dt.itemsize]
      um = u.type(~(1 << (8 * dt.itemsize - 1)) & ((1 << 8 * dt.itemsize) - 1))
      flush = "ftz" in mods and t == "f32"
      def fab(v):
        r = (np.asarray(v).view(u) & um).view(dt)
        return N.ftz(r.astype(f64)).astype(dt) if flush else r
      return simple(cx, ins, t, [t], fab)
    return simple(cx, ins, t, [t], lambda v: np.asarray(v) & mask)
  return simple(cx, ins, t, [t], lambda v: np.abs(v))


def b_neg(cx, ins, mods, types):
  t = types[0]
  if t in ("f32", "f64", "f16", "bf16", "f16x2", "bf16x2"):
    dt = NP[t]
    u = UINT[dt.itemsize]
    sign = u.type(1 << (8 * dt.itemsize - 1)) if t not in ("f16x2", "bf16x2") else np.uint32(0x80008000)
    flush = "ftz" in mods and t == "f32"
    def fneg(v):
      r = (np.asarray(v).view(u) ^ sign).view(dt)
      return N.ftz(r.astype(f64)).astype(dt) if flush else r
    return simple(cx, ins, t, [t], fneg)
  if t == "pred": return simple(cx, ins, t, [t], np.logical_not)
  return simple(cx, ins, t, [t], np.negative)


def _fminmax(is_max: bool, nan_mode: bool):
  def f(a, b):
    r = np.fmax(a, b) if is_max else np.fmin(a, b)
    both0 = (a == 0) & (b == 0)
    sa, sb = np.signbit(a), np.signbit(b)
    zsign = (sa & sb) if is_max else (sa | sb)
    r = np.where(both0, np.where(zsign, -0.0, 0.0), r)
    if nan_mode: r = np.where(np.isnan(a) | np.isnan(b), np.nan, r)
    return r
  return f


def b_minmax(is_max: bool):
  def b(cx, ins, mods, types):
    t = types[0]
    if t in FLOAT or t in ("f16x2", "bf16x2"):
      if "xorsign" in mods: raise err(ins, "min/max .xorsign.abs is not supported")
      return float_family(cx, ins, t, 2, _fminmax(is_max, "NaN" in mods), mods)
    if t in ("u16x2", "s16x2"): raise err(ins, "packed integer min/max is not supported")
    fn = np.maximum if is_max else np.minimum
    if "relu" in mods: return simple(cx, ins, t, [t, t], lambda a, b: np.maximum(fn(a, b), 0).astype(NP[t]))
    return simple(cx, ins, t, [t, t], fn)
  return b


def b_copysign(cx, ins, mods, types):
  t = types[0]  # d = |b| with the sign of a
  return float_family(cx, ins, t, 2, lambda a, b: np.copysign(b, a), mods)


def b_testp(cx, ins, mods, types):
  t = types[0]
  kind = mods[0]
  dec = fdecode(t)
  tiny = 2.0 ** FLOAT[t].emin
  tests = {"finite": np.isfinite, "infinite": np.isinf, "number": lambda x: ~np.isnan(x), "notanumber": np.isnan,
           "normal": lambda x: np.isfinite(x) & (np.abs(x) >= tiny), "subnormal": lambda x: (np.abs(x) < tiny) & (x != 0)}
  if kind not in tests: raise err(ins, f"testp.{kind}")
  fn = tests[kind]
  return simple(cx, ins, "pred", [t], lambda v: fn(dec(v)))


# ---------------------------------------------------------------------------- integers

def _wide_type(t: str) -> str:
  return {"s16": "s32", "u16": "u32", "s32": "s64", "u32": "u64", "s64": "s128", "u64": "u128"}[t]


def _mulhi(a, b, t: str):
  """High half of the double-width product."""
  dt = NP[t]
  size = dt.itemsize
  if size <= 4:
    wide = np.int64 if t in SIGNED else np.uint64
    return ((np.asarray(a).astype(wide) * np.asarray(b).astype(wide)) >> (8 * size)).astype(dt)
  au, bu = np.asarray(a).view(np.uint64), np.asarray(b).view(np.uint64)
  M = np.uint64(0xFFFFFFFF)
  s32 = np.uint64(32)
  al, ah, bl, bh = au & M, au >> s32, bu & M, bu >> s32
  ll, lh, hl, hh = al * bl, al * bh, ah * bl, ah * bh
  mid = (ll >> s32) + (lh & M) + (hl & M)
  hi = hh + (lh >> s32) + (hl >> s32) + (mid >> s32)
  if t in SIGNED:
    hi = hi - np.where(np.asarray(a) < 0, bu, np.uint64(0)) - np.where(np.asarray(b) < 0, au, np.uint64(0))
  return hi.view(dt)


def _int_mul(cx, ins, mods, t):
  if "wide" in mods:
    wt = _wide_type(t)
    wdt = NP[wt]
    return simple(cx, ins, wt, [t, t], lambda a, b: np.asarray(a).astype(wdt) * np.asarray(b).astype(wdt))
  if "hi" in mods: return simple(cx, ins, t, [t, t], lambda a, b: _mulhi(a, b, t))
  if "lo" in mods or len(mods) == 0: return simple(cx, ins, t, [t, t], np.multiply)
  raise err(ins, "mul form")


def _carry_out(st, m, c):
  st.CC = c if m is None else np.where(m, c, st.CC)


def _int_addsub(cx, ins, mods, t, sub: bool, carry_in: bool = False):
  dt = NP[t]
  if "sat" in mods:
    if t != "s32": raise err(ins, "add/sub .sat is defined for .s32")
    op = np.subtract if sub else np.add
    return simple(cx, ins, t, [t, t], lambda a, b: np.clip(op(np.asarray(a, np.int64), np.asarray(b, np.int64)), -2**31, 2**31 - 1).astype(dt))
  cc = "cc" in mods
  if not cc and not carry_in: return simple(cx, ins, t, [t, t], np.subtract if sub else np.add)
  if dt.itemsize not in (4, 8): raise err(ins, "carry arithmetic on this type")
  w = write(cx, ins, ins.operands[0], t)
  ra, rb = read(cx, ins, ins.operands[1], t), read(cx, ins, ins.operands[2], t)
  ut = UINT[dt.itemsize]
  def f(st, m):
    a, b = np.asarray(ra(st)).view(ut), np.asarray(rb(st)).view(ut)
    cin = st.CC.astype(ut) if carry_in else ut.type(0)
    if sub:
      d = a - b - cin
      c = (a < b) | ((a == b) & (cin != 0)) if carry_in else (a < b)
    else:
      s1 = a + b
      d = s1 + cin
      c = (s1 < a) | (d < s1)
    w(st, m, np.asarray(d).view(dt))
    if cc: _carry_out(st, m, np.broadcast_to(c, st.L.shape))
  return f


def _int_mad(cx, ins, mods, t):
  if len(ins.operands) != 4: raise err(ins, "mad takes 4 operands")
  if "wide" in mods:
    wt = _wide_type(t)
    wdt = NP[wt]
    return simple(cx, ins, wt, [t, t, wt], lambda a, b, c: np.asarray(a).astype(wdt) * np.asarray(b).astype(wdt) + c)
  hi = "hi" in mods
  cc = "cc" in mods
  if "sat" in mods:
    def madsat(a, b, c):
      return np.clip(_mulhi(a, b, t).astype(np.int64) + np.asarray(c, np.int64), -2**31, 2**31 - 1).astype(np.int32)
    return simple(cx, ins, t, [t, t, t], madsat)
  if not cc: return simple(cx, ins, t, [t, t, t], (lambda a, b, c: _mulhi(a, b, t) + c) if hi else (lambda a, b, c: a * b + c))
  return _madc(cx, ins, t, hi, carry_in=False, cc=True)


def _madc(cx, ins, t, hi: bool, carry_in: bool, cc: bool):
  dt = NP[t]
  ut = UINT[dt.itemsize]
  w = write(cx, ins, ins.operands[0], t)
  ra, rb, rc = (read(cx, ins, o, t) for o in ins.operands[1:4])
  def f(st, m):
    a, b, c = ra(st), rb(st), np.asarray(rc(st)).view(ut)
    p = np.asarray(_mulhi(a, b, t) if hi else np.multiply(a, b)).view(ut)
    cin = st.CC.astype(ut) if carry_in else ut.type(0)
    s1 = p + c
    d = s1 + cin
    w(st, m, np.asarray(d).view(dt))
    if cc: _carry_out(st, m, np.broadcast_to((s1 < p) | (d < s1), st.L.shape))
  return f


def b_addc(cx, ins, mods, types): return _int_addsub(cx, ins, mods, types[0], sub=False, carry_in=True)
def b_subc(cx, ins, mods, types): return _int_addsub(cx, ins, mods, types[0], sub=True, carry_in=True)


def b_madc(cx, ins, mods, types): return _madc(cx, ins, types[0], "hi" in mods, carry_in=True, cc="cc" in mods)


def _int_divrem(cx, ins, t, rem: bool):
  dt = NP[t]
  signed = t in SIGNED
  def f(a, b):
    a, b = np.asarray(a), np.asarray(b)
    zero = b == 0
    bs = np.where(zero, dt.type(1), b)
    if signed:
      r = np.fmod(a, bs)
      q = (a - r) // bs
    else: q, r = a // bs, a % bs
    if rem: return np.where(zero, a, r).astype(dt)
    return np.where(zero, dt.type(-1) if signed else np.iinfo(dt).max, q).astype(dt)
  return simple(cx, ins, t, [t, t], f)


def _shift_amount(b) -> np.ndarray: return np.asarray(b, dtype=np.uint32)


def b_shl(cx, ins, mods, types):
  t = types[0]
  dt = NP[t]
  n = 8 * dt.itemsize
  def f(a, b):
    s = _shift_amount(b)
    return np.where(s >= n, dt.type(0), np.asarray(a) << np.minimum(s, n - 1).astype(dt)).astype(dt)
  return simple(cx, ins, t, [t, "u32"], f)


def b_shr(cx, ins, mods, types):
  t = types[0]
  dt = NP[t]
  n = 8 * dt.itemsize
  signed = t in SIGNED
  def f(a, b):
    s = np.minimum(_shift_amount(b), n - 1 if signed else n).astype(np.uint64)
    a = np.asarray(a)
    if signed: return (a >> s.astype(dt)).astype(dt)
    return np.where(s >= n, dt.type(0), a >> np.minimum(s, n - 1).astype(dt)).astype(dt)
  return simple(cx, ins, t, [t, "u32"], f)


def b_shf(cx, ins, mods, types):
  left, clamp = "l" in mods, "clamp" in mods
  def f(a, b, c):
    n = np.asarray(c, dtype=np.uint64)
    n = np.minimum(n, 32) if clamp else (n & np.uint64(31))
    v = (np.asarray(b, dtype=np.uint64) << np.uint64(32)) | np.asarray(a, dtype=np.uint64)
    r = (v << n) >> np.uint64(32) if left else v >> n
    return (r & np.uint64(0xFFFFFFFF)).astype(np.uint32)
  return simple(cx, ins, "b32", ["b32", "b32", "u32"], f)


def b_bitop(fn: Callable):
  def b(cx, ins, mods, types): return simple(cx, ins, types[0], [types[0]] * 2, fn)
  return b


def b_not(cx, ins, mods, types):
  t = types[0]
  return simple(cx, ins, t, [t], np.logical_not if t == "pred" else np.invert)


def b_cnot(cx, ins, mods, types):
  t = types[0]
  dt = NP[t]
  return simple(cx, ins, t, [t], lambda a: (np.asarray(a) == 0).astype(dt))


def b_lop3(cx, ins, mods, types):
  def f(a, b, c, lut):
    a, b, c, lut = (np.asarray(x, dtype=np.uint32) for x in (a, b, c, lut))
    out = np.zeros(np.broadcast(a, b, c).shape, dtype=np.uint32)
    for k in range(8):
      sel = (a if k & 4 else ~a) & (b if k & 2 else ~b) & (c if k & 1 else ~c)
      out |= np.where((lut >> np.uint32(k)) & 1, sel, np.uint32(0))
    return out
  return simple(cx, ins, "b32", ["b32", "b32", "b32", "b32"], f)


def b_popc(cx, ins, mods, types):
  t = types[0]
  return simple(cx, ins, "u32", [t], lambda a: np.bitwise_count(np.asarray(a).view(UINT[NP[t].itemsize])).astype(np.uint32))


def b_clz(cx, ins, mods, types):
  t = types[0]
  n = 8 * NP[t].itemsize
  full = np.uint64((1 << n) - 1) if n < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
  def f(a):
    x = np.asarray(a).view(UINT[n // 8]).astype(np.uint64)
    out = np.zeros(x.shape, dtype=np.uint32)
    for s in (32, 16, 8, 4, 2, 1):  # binary search for the leading one, exact in integers
      if s >= n: continue
      z = (x >> np.uint64(n - s)) == 0
      out += np.where(z, np.uint32(s), np.uint32(0))
      x = np.where(z, (x << np.uint64(s)) & full, x)
    return np.where(np.asarray(a).view(UINT[n // 8]) == 0, np.uint32(n), out)
  return simple(cx, ins, "u32", [t], f)


def b_bfind(cx, ins, mods, types):
  t = types[0]
  n = 8 * NP[t].itemsize
  shiftamt = "shiftamt" in mods
  def f(a):
    a = np.asarray(a)
    u = a.view(UINT[n // 8]).astype(np.uint64)
    if t in SIGNED: u = np.where(a < 0, ~u & np.uint64((1 << n) - 1), u)
    pos = np.full(u.shape, -1, dtype=np.int64)
    for k in range(n):
      pos = np.where((u >> np.uint64(k)) & np.uint64(1), k, pos)
    if shiftamt: pos = np.where(pos >= 0, n - 1 - pos, -1)
    return pos.astype(np.uint32)
  return simple(cx, ins, "u32", [t], f)


def b_brev(cx, ins, mods, types):
  t = types[0]
  n = 8 * NP[t].itemsize
  def f(a):
    u = np.asarray(a).view(UINT[n // 8]).astype(np.uint64)
    out = np.zeros(u.shape, dtype=np.uint64)
    for k in range(n): out |= ((u >> np.uint64(k)) & np.uint64(1)) << np.uint64(n - 1 - k)
    return out.astype(UINT[n // 8]).view(NP[t])
  return simple(cx, ins, t, [t], f)


def b_bfe(cx, ins, mods, types):
  t = types[0]
  dt = NP[t]
  n = 8 * dt.itemsize
  def f(a, b, c):
    a = np.asarray(a)
    pos = np.minimum(np.asarray(b, dtype=np.int64) & 0xFF, n)
    ln = np.minimum(np.asarray(c, dtype=np.int64) & 0xFF, n)
    u = a.view(UINT[n // 8]).astype(np.uint64)
    shifted = u >> pos.astype(np.uint64)
    low = (np.uint64(1) << np.minimum(ln, 63).astype(np.uint64)) - np.uint64(1)
    field = np.where(ln >= 64, shifted, shifted & low)
    if t in SIGNED:
      top = np.minimum(pos + ln - 1, n - 1)
      sbit = np.where(ln == 0, 0, (u >> top.astype(np.uint64)) & np.uint64(1))
      fill = np.where(sbit != 0, ~((np.uint64(1) << np.minimum(ln, 63).astype(np.uint64)) - np.uint64(1)), np.uint64(0))
      field = np.where(ln >= n, field, field | fill)
    return field.astype(UINT[n // 8]).view(dt)
  return simple(cx, ins, t, [t, "u32", "u32"], f)


def b_bfi(cx, ins, mods, types):
  t = types[0]
  dt = NP[t]
  n = 8 * dt.itemsize
  ut = UINT[n // 8]
  def f(a, b, c, d):
    pos = np.minimum(np.asarray(c, dtype=np.uint64) & np.uint64(0xFF), n)
    ln = np.minimum(np.asarray(d, dtype=np.uint64) & np.uint64(0xFF), n)
    au, bu = np.asarray(a).view(ut).astype(np.uint64), np.asarray(b).view(ut).astype(np.uint64)
    mask = np.where(ln >= 64, np.uint64(0xFFFFFFFFFFFFFFFF), (np.uint64(1) << np.minimum(ln, 63)) - np.uint64(1))
    mask = np.where(pos >= n, np.uint64(0), mask << np.minimum(pos, 63))
    return ((bu & ~mask) | ((au << np.minimum(pos, 63)) & mask)).astype(ut).view(dt)
  return simple(cx, ins, t, [t, t, "u32", "u32"], f)


def b_prmt(cx, ins, mods, types):
  if mods: raise err(ins, f"prmt mode .{mods[0]} is not supported")
  def f(a, b, c):
    src = (np.asarray(b, dtype=np.uint64) << np.uint64(32)) | np.asarray(a, dtype=np.uint64)
    c = np.asarray(c, dtype=np.uint64)
    out = np.zeros(np.broadcast(src, c).shape, dtype=np.uint64)
    for k in range(4):
      sel = (c >> np.uint64(4 * k)) & np.uint64(0xF)
      byte = (src >> ((sel & np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)
      byte = np.where(sel & np.uint64(8), np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0)), byte)
      out |= byte << np.uint64(8 * k)
    return out.astype(np.uint32)
  return simple(cx, ins, "b32", ["b32", "b32", "b32"], f)


def b_dp4a(cx, ins, mods, types):
  ta, tb = types[0], types[1]
  def f(a, b, c):
    a, b = np.asarray(a, dtype=np.uint32), np.asarray(b, dtype=np.uint32)
    acc = np.asarray(c).astype(np.int64)
    for k in range(4):
      x = ((a >> np.uint32(8 * k)) & np.uint32(0xFF)).astype(np.int64)
      y = ((b >> np.uint32(8 * k)) & np.uint32(0xFF)).astype(np.int64)
      if ta == "s32": x = np.where(x >= 128, x - 256, x)
      if tb == "s32": y = np.where(y >= 128, y - 256, y)
      acc = acc + x * y
    return acc.astype(np.int64).astype(np.uint64).astype(np.uint32).view(NP["s32" if "s32" in (ta, tb) else "u32"])
  out_t = "s32" if "s32" in (ta, tb) else "u32"
  return simple(cx, ins, out_t, [ta, tb, out_t], f)


# ---------------------------------------------------------------------------- comparisons and selection

INT_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}
UNSIGNED_CMP = {"lo": "lt", "ls": "le", "hi": "gt", "hs": "ge"}
BOOL_OPS = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def compare(cmp: str, t: str, ins: P.Instr, ftz: bool = False) -> Callable[[Any, Any], np.ndarray]:
  if t in FLOAT or t in ("f16x2", "bf16x2"):
    if t in ("f16x2", "bf16x2"): raise err(ins, "packed comparisons are not supported")
    dec = fdecode(t) if t in ("f16", "bf16") else None
    unordered = cmp.endswith("u") and cmp not in ("num",)
    base = cmp[:-1] if unordered else cmp
    def f(a, b):
      if dec is not None: a, b = dec(a), dec(b)
      if ftz: a, b = N.ftz(np.asarray(a, f64)), N.ftz(np.asarray(b, f64))
      nan = np.isnan(a) | np.isnan(b)
      if cmp == "num": return ~nan
      if cmp == "nan": return nan
      if base not in INT_CMP: raise err(ins, f"comparison .{cmp}")
      r = INT_CMP[base](a, b)
      if base == "ne" and not unordered: r = r & ~nan
      return (r | nan) if unordered else r
    return f
  if cmp in UNSIGNED_CMP:
    fn, dt = INT_CMP[UNSIGNED_CMP[cmp]], UINT[NP[t].itemsize]
    return lambda a, b: fn(np.asarray(a).view(dt), np.asarray(b).view(dt))
  if cmp not in INT_CMP: raise err(ins, f"comparison .{cmp} on .{t}")
  return INT_CMP[cmp]


def b_setp(cx, ins, mods, types):
  t = types[0]
  cmp = mods[0]
  bop = next((BOOL_OPS[m] for m in mods[1:] if m in BOOL_OPS), None)
  fn = compare(cmp, t, ins, "ftz" in mods)
  d = ins.operands[0]
  p_op, q_op = (d.first, d.second) if isinstance(d, P.Pair) else (d, None)
  wp, wq = write(cx, ins, p_op, "pred"), (write(cx, ins, q_op, "pred") if q_op is not None else None)
  ra, rb = read(cx, ins, ins.operands[1], t), read(cx, ins, ins.operands[2], t)
  rc = read(cx, ins, ins.operands[3], "pred") if bop is not None else None
  def f(st, m):
    r = fn(ra(st), rb(st))
    if rc is not None:
      c = rc(st)
      p, q = bop(r, c), bop(~r, c)
    else: p, q = r, ~r
    wp(st, m, np.asarray(p))
    if wq is not None: wq(st, m, np.asarray(q))
  return f


def b_set(cx, ins, mods, types):
  dtype_, stype = types[0], types[1]
  cmp = mods[0]
  bop = next((BOOL_OPS[m] for m in mods[1:] if m in BOOL_OPS), None)
  fn = compare(cmp, stype, ins, "ftz" in mods)
  one = f32(1.0) if dtype_ == "f32" else NP[dtype_].type(-1 if dtype_ in SIGNED else np.iinfo(NP[dtype_]).max)
  zero = NP[dtype_].type(0)
  w = write(cx, ins, ins.operands[0], dtype_)
  ra, rb = read(cx, ins, ins.operands[1], stype), read(cx, ins, ins.operands[2], stype)
  rc = read(cx, ins, ins.operands[3], "pred") if bop is not None else None
  def f(st, m):
    r = fn(ra(st), rb(st))
    if rc is not None: r = bop(r, rc(st))
    w(st, m, np.where(r, one, zero))
  return f


def b_selp(cx, ins, mods, types):
  t = types[0]
  return simple(cx, ins, t, [t, t, "pred"], lambda a, b, c: np.where(c, a, b).astype(NP[t]))


def b_slct(cx, ins, mods, types):
  dt_, ct = types[0], types[1]
  flush = "ftz" in mods
  def f(a, b, c):
    c = np.asarray(c)
    if ct == "f32":
      c = N.ftz(c.astype(f64)) if flush else c
      return np.where(c >= 0, a, b).astype(NP[dt_])
    return np.where(c >= 0, a, b).astype(NP[dt_])
  return simple(cx, ins, dt_, [dt_, dt_, ct], f)


# ---------------------------------------------------------------------------- moves and conversions

def b_mov(cx, ins, mods, types):
  t = types[0]
  d, a = ins.operands[0], ins.operands[1]
  if isinstance(a, P.Vec): return _pack(cx, ins, t, d, a)
  if isinstance(d, P.Vec): return _unpack(cx, ins, t, d, a)
  return simple(cx, ins, t, [t], lambda v: v)


def _elem_type(ins: P.Instr, t: str, n: int) -> str:
  size = NP[t].itemsize // n
  if size not in (1, 2, 4) or NP[t].itemsize % n: raise err(ins, f"vector of {n} in .{t}")
  return {1: "b8", 2: "b16", 4: "b32"}[size]


def _pack(cx, ins, t, d, vec):
  et = _elem_type(ins, t, len(vec.items))
  bits = 8 * NP[et].itemsize
  rs = [read(cx, ins, o, et) if o is not None else (lambda st: np.uint8(0)) for o in vec.items]
  w = write(cx, ins, d, t)
  ut = UINT[NP[t].itemsize]
  def f(st, m):
    out = ut.type(0)
    for k, r in enumerate(rs): out = out | (np.asarray(r(st)).astype(ut) << ut.type(bits * k))
    w(st, m, np.asarray(out).view(NP[t]))
  return f


def _unpack(cx, ins, t, vec, a):
  et = _elem_type(ins, t, len(vec.items))
  bits = 8 * NP[et].itemsize
  ra = read(cx, ins, a, t)
  ws = [write(cx, ins, o, et) for o in vec.items]
  ut, ue = UINT[NP[t].itemsize], NP[et]
  mask = ut.type((1 << bits) - 1)
  def f(st, m):
    v = np.asarray(ra(st)).view(ut)
    for k, w in enumerate(ws): w(st, m, ((v >> ut.type(bits * k)) & mask).astype(ue))
  return f


def b_cvt(cx, ins, mods, types):
  if len(types) != 2: raise err(ins, "cvt needs a destination and a source type")
  dt_, st_ = types
  irnd = next((m for m in mods if m in IROUND), None)
  mode = rmode(mods)
  sat, flush, satfinite, relu = "sat" in mods, "ftz" in mods, "satfinite" in mods, "relu" in mods
  if dt_ in ("e4m3x2", "e5m2x2"): return _cvt_to_fp8(cx, ins, dt_, st_, satfinite, relu)
  if st_ in ("e4m3x2", "e5m2x2"): return _cvt_from_fp8(cx, ins, dt_, st_, relu)
  if dt_ in ("f16x2", "bf16x2"):
    fmt = FLOAT[dt_[:-2]]
    def pack(a, b):
      enc = lambda x: N.encode(_relu(N.round_to(np.asarray(x, f64), None, fmt, mode, satfinite), relu), fmt).astype(np.uint32)
      return (enc(a) << np.uint32(16)) | enc(b)
    return simple(cx, ins, dt_, [st_, st_], pack)
  src_float, dst_float = st_ in FLOAT, dt_ in FLOAT
  dec = fdecode(st_)
  if src_float and dst_float:
    fmt = FLOAT[dt_]
    def ff(a):
      x = dec(a)
      if flush: x = N.ftz(x)
      if irnd: x = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[irnd](x)
      r = x if fmt is N.F64 else N.round_to(x, None, fmt, mode, satfinite)
      if flush and dt_ == "f32": r = N.ftz(r)
      if sat: r = np.where(np.isnan(r), 0.0, np.clip(r, 0.0, 1.0))
      return fencode(dt_)(_relu(r, relu))
    if st_ == dt_ == "f32" and not (irnd or flush or sat): return simple(cx, ins, dt_, [st_], lambda a: a)
    if st_ == "f32" and dt_ == "f64" and not (flush or sat): return simple(cx, ins, dt_, [st_], lambda a: np.asarray(a).astype(f64))
    return simple(cx, ins, dt_, [st_], ff)
  if src_float:  # float -> int: round to an integral value (default .rzi? no: an irnd is required), saturate
    if irnd is None: raise err(ins, "float -> int cvt needs an integer rounding modifier")
    def fi(a):
      x = dec(a)
      if flush: x = N.ftz(x)
      return N.float_to_int(x, NP[dt_], irnd)
    return simple(cx, ins, dt_, [st_], fi)
  if dst_float:
    fmt = FLOAT[dt_]
    def itof(a):
      r = N.int_to_float(np.asarray(a), fmt, mode)
      if sat: r = np.clip(r, 0.0, 1.0)
      return fencode(dt_)(r)
    if st_ in ("s8", "u8", "s16", "u16", "s32", "u32") and dt_ in ("f32", "f64") and mode == "rn" and not sat:
      return simple(cx, ins, dt_, [st_], lambda a: np.asarray(a).astype(NP[dt_]))
    return simple(cx, ins, dt_, [st_], itof)
  # int -> int: extend by the source's signedness, truncate, or saturate with .sat
  sdt, ddt = NP[st_], NP[dt_]
  if sat:
    info = np.iinfo(ddt)
    def isat(a):
      a = np.asarray(a)
      if a.dtype == np.uint64 and info.max < 2 ** 64 - 1: return np.minimum(a, np.uint64(info.max)).astype(ddt)
      if a.dtype == np.int64 and ddt == np.uint64: return np.maximum(a, 0).astype(ddt)
      return np.clip(a.astype(np.int64) if a.dtype != np.uint64 else a, info.min, info.max).astype(ddt)
    return simple(cx, ins, dt_, [st_], isat)
  return simple(cx, ins, dt_, [st_], lambda a: np.asarray(a).astype(sdt).astype(ddt))


def _relu(x: np.ndarray, relu: bool) -> np.ndarray:
  return np.where(np.isnan(x), x, np.maximum(x, 0.0)) if relu else x


def _cvt_to_fp8(cx, ins, dt_, st_, satfinite, relu):
  fmt = N.E4M3 if dt_.startswith("e4m3") else N.E5M2
  if not satfinite: raise err(ins, "conversions to fp8 need .satfinite")
  def conv(x):
    r = N.round_to(_relu(np.asarray(x, f64), relu), None, fmt, "rn", True)
    return N.encode(r, fmt).astype(np.uint16)
  if st_ == "f32":
    return simple(cx, ins, dt_, ["f32", "f32"], lambda a, b: (conv(a) << np.uint16(8)) | conv(b))
  if st_ == "f16x2":
    def from_pair(a):
      a = np.asarray(a, np.uint32)
      hi, lo = (a >> np.uint32(16)).astype(np.uint16), (a & np.uint32(0xFFFF)).astype(np.uint16)
      return (conv(N.f16_to_f64(hi)) << np.uint16(8)) | conv(N.f16_to_f64(lo))
    return simple(cx, ins, dt_, ["f16x2"], from_pair)
  raise err(ins, f"cvt to {dt_} from {st_}")


def _cvt_from_fp8(cx, ins, dt_, st_, relu):
  fmt = N.E4M3 if st_.startswith("e4m3") else N.E5M2
  if dt_ != "f16x2": raise err(ins, f"cvt from {st_} to {dt_}")
  def f(a):
    a = np.asarray(a, dtype=np.uint16)
    lo = N.encode(_relu(N.decode_fp8(a & np.uint16(0xFF), fmt), relu), N.F16).astype(np.uint32)
    hi = N.encode(_relu(N.decode_fp8(a >> np.uint16(8), fmt), relu), N.F16).astype(np.uint32)
    return (hi << np.uint32(16)) | lo
  return simple(cx, ins, dt_, ["b16"], f)


def b_cvta(cx, ins, mods, types):
  t = types[0]
  to = "to" in mods
  space = next((m for m in mods if m in ("global", "shared", "local", "const", "param")), None)
  if space == "global" or space == "const": return simple(cx, ins, t, [t], lambda a: a)
  if space not in ("shared", "local"): raise err(ins, f"cvta for .{space}")
  base = np.uint64(SHARED_WINDOW if space == "shared" else LOCAL_WINDOW)
  if to: return simple(cx, ins, t, ["u64"], lambda a: (np.asarray(a, np.uint64) - base) & np.uint64(WINDOW_SIZE - 1))
  return simple(cx, ins, t, ["u64"], lambda a: np.asarray(a, np.uint64) + base)


def b_isspacep(cx, ins, mods, types):
  space = mods[0]
  def f(a):
    a = np.asarray(a, dtype=np.uint64)
    sh = (a >= np.uint64(SHARED_WINDOW)) & (a < np.uint64(SHARED_WINDOW + WINDOW_SIZE))
    lo = (a >= np.uint64(LOCAL_WINDOW)) & (a < np.uint64(LOCAL_WINDOW + WINDOW_SIZE))
    return {"shared": sh, "local": lo, "global": ~(sh | lo)}.get(space, np.zeros(a.shape, bool))
  return simple(cx, ins, "pred", ["u64"], f)


# ---------------------------------------------------------------------------- memory

SPACES = ("global", "shared", "local", "param", "const")


def address(cx, ins, op: Any) -> tuple[Callable[[Any], Any], Any]:
  """(reader of the address as uint64 per lane, the symbol when the base is one)."""
  if not isinstance(op, P.Addr): raise err(ins, f"expected an address operand [..], got {op!r}")
  off = np.uint64(op.offset & 0xFFFFFFFFFFFFFFFF)
  if op.base is None: return (lambda st: off), None
  name = op.base.name
  kind = cx.lookup(name, ins.line)
  if kind[0] == "reg":
    r = read(cx, ins, P.Reg(name), "u64" if P.TYPE_SIZES.get(kind[2], 8) == 8 else "u32")
    if op.offset == 0: return (lambda st: np.asarray(r(st)).astype(np.uint64, copy=False)), None
    return (lambda st: np.asarray(r(st)).astype(np.uint64, copy=False) + off), None
  if kind[0] == "sym":
    sym = kind[1]
    if sym.space == "param": return (lambda st: off), sym
    if sym.space == "shared": cx.cf.shared.add(sym.index)
    base = _symbol_address(ins, sym, np.dtype(np.uint64))
    return (lambda st: base(st) + off), sym
  raise err(ins, f"{name} can't be an address")


def _mem_type(ins, types) -> str:
  t = types[-1] if types else None
  if t is None or t not in NP: raise err(ins, f"memory access of type {t}")
  return t


def b_ld(cx, ins, mods, types):
  t = _mem_type(ins, types)
  space = next((m for m in mods if m in SPACES), "generic")
  nvec = next((int(m[1:]) for m in mods if m in ("v2", "v4", "v8")), 1)
  d = ins.operands[0]
  dests = list(d.items) if isinstance(d, P.Vec) else [d]
  if len(dests) != nvec: raise err(ins, f"{nvec} destinations expected")
  addr, sym = address(cx, ins, ins.operands[1])
  dt = NP[t] if t != "pred" else np.dtype(np.uint8)
  ws = [write(cx, ins, o, t) if (o is None or not isinstance(o, P.Reg) or reg_type(cx, ins, o) != "pred") else None for o in dests]
  if any(w is None for w in ws): raise err(ins, "loading into a predicate")
  if space == "param": return _ld_param(cx, ins, sym, t, ws, nvec)
  load = _accessor(space, "load")
  def f(st, m):
    a = addr(st)
    v = load(st, m, a, dt, nvec)
    if nvec == 1: ws[0](st, m, v)
    else:
      for k, w in enumerate(ws): w(st, m, v[:, k])
  return f


def _ld_param(cx, ins, sym, t, ws, nvec):
  if sym is None: raise err(ins, "ld.param needs a parameter symbol")
  off = ins.operands[1].offset
  dt = NP[t]
  size = dt.itemsize * nvec
  if off < 0 or off + size > sym.size: raise PTXError(f"PTX line {ins.line}: {size} bytes at offset {off} of parameter {sym.name} ({sym.size} bytes)")
  if sym.kparam:
    poff = sym.offset + off
    def kparam(st, m):
      raw = np.frombuffer(st.L.kparams, dtype=dt, count=nvec, offset=poff)
      for k, w in enumerate(ws): w(st, m, raw[k])
    return kparam
  key = id(sym)
  def fparam(st, m):
    buf = st.param(key, sym.size)
    v = np.ascontiguousarray(buf[:, off:off + size]).view(dt)
    for k, w in enumerate(ws): w(st, m, v[:, k])
  return fparam


def b_st(cx, ins, mods, types):
  t = _mem_type(ins, types)
  space = next((m for m in mods if m in SPACES), "generic")
  nvec = next((int(m[1:]) for m in mods if m in ("v2", "v4", "v8")), 1)
  addr, sym = address(cx, ins, ins.operands[0])
  s = ins.operands[1]
  srcs = list(s.items) if isinstance(s, P.Vec) else [s]
  if len(srcs) != nvec: raise err(ins, f"{nvec} sources expected")
  dt = NP[t]
  rs = [read(cx, ins, o, t) for o in srcs]
  if space == "param":
    if sym is None: raise err(ins, "st.param needs a parameter symbol")
    off, key = ins.operands[0].offset, id(sym)
    size = dt.itemsize * nvec
    if off < 0 or off + size > sym.size:
      raise PTXError(f"PTX line {ins.line}: {size} bytes at offset {off} of parameter {sym.name} ({sym.size} bytes)")
    def stp(st, m):
      buf = st.param(key, sym.size)
      vals = np.stack([np.broadcast_to(np.asarray(r(st), dtype=dt), st.L.shape) for r in rs], axis=1)
      raw = np.ascontiguousarray(vals).view(np.uint8)
      if m is None: buf[:, off:off + size] = raw
      else: buf[m, off:off + size] = raw[m]
    return stp
  store = _accessor(space, "store")
  def f(st, m):
    a = addr(st)
    if nvec == 1: v = rs[0](st)
    else: v = np.stack([np.broadcast_to(np.asarray(r(st), dtype=dt), st.L.shape) for r in rs], axis=1)
    store(st, m, a, dt, nvec, v)
  return f


def _accessor(space: str, kind: str) -> Callable:
  """A function doing the access through the Lanes object of the frame (its state-space routing and checks)."""
  if kind == "load": return lambda st, m, a, dt, nvec: st.L.load(space, m, a, dt, nvec)
  return lambda st, m, a, dt, nvec, v: st.L.store(space, m, a, dt, nvec, v)


ATOM_OPS = {"add", "min", "max", "inc", "dec", "and", "or", "xor", "exch", "cas"}


def b_atom(cx, ins, mods, types, red: bool = False):
  t = types[-1] if types else None
  if t is None or t not in NP: raise err(ins, "atomic type")
  space = next((m for m in mods if m in ("global", "shared")), "generic")
  op = next((m for m in mods if m in ATOM_OPS), None)
  if op is None: raise err(ins, "atomic operation")
  if t in ("f16x2", "bf16x2") or "v2" in mods or "v4" in mods or "v8" in mods: raise err(ins, "vector atomics are not supported")
  k = 0 if red else 1
  w = None if red else write(cx, ins, ins.operands[0], t)
  addr, _ = address(cx, ins, ins.operands[k])
  rb = read(cx, ins, ins.operands[k + 1], t)
  rc = read(cx, ins, ins.operands[k + 2], t) if op == "cas" else None
  dt = NP[t]
  def f(st, m):
    a = addr(st)
    old = st.L.atomic(space, m, a, dt, t, op, rb(st), rc(st) if rc is not None else None)
    if w is not None: w(st, m, old)
  return f


def b_red(cx, ins, mods, types): return b_atom(cx, ins, mods, types, red=True)


def b_nop(cx, ins, mods, types): return lambda st, m: None


# ---------------------------------------------------------------------------- control flow

def b_bra(cx, ins, mods, types):
  tgt = ins.operands[0]
  if not isinstance(tgt, P.Reg): raise err(ins, "bra target")
  kind = cx.lookup(tgt.name, ins.line)
  if kind[0] != "label": raise PTXError(f"PTX line {ins.line}: {tgt.name} is not a label")
  if ins.guard is None: return ("bra", kind[1])
  g = cx.lookup(ins.guard[0], ins.line)
  if g[0] != "reg" or g[2] != "pred": raise PTXError(f"PTX line {ins.line}: guard {ins.guard[0]} is not a predicate register")
  return ("cbra", kind[1], g[1], ins.guard[1])


def b_ret(cx, ins, mods, types):
  if ins.guard is None: return ("ret",)
  g = cx.lookup(ins.guard[0], ins.line)
  return ("cret", g[1], ins.guard[1])


def b_trap(cx, ins, mods, types): return ("trap",)


def b_bar(cx, ins, mods, types):
  if "warp" in mods: return lambda st, m: None  # bar.warp.sync: lanes run in lockstep
  if "arrive" in mods or "red" in mods or ("sync" not in mods and mods and mods[0] not in ("aligned", "cta")):
    raise err(ins, f"bar.{'.'.join(mods)} (only bar.sync / barrier.sync of all threads is supported)")
  if len(ins.operands) > 1: raise err(ins, "barriers with a thread count")
  if ins.operands and not (isinstance(ins.operands[0], P.Imm) and ins.operands[0].value == 0):
    raise err(ins, "barriers other than barrier 0")
  if ins.guard is not None: raise err(ins, "a guarded barrier")
  return ("bar",)


def b_call(cx, ins, mods, types):
  ops = list(ins.operands)
  rets: tuple = ()
  if ops and isinstance(ops[0], P.Paren):
    rets = ops.pop(0).items
  if not ops or not isinstance(ops[0], P.Reg): raise err(ins, "call target")
  name = ops.pop(0).name
  kind = cx.lookup(name, ins.line)
  if kind[0] != "func": raise err(ins, f"indirect call through {name}")
  args = ops.pop(0).items if ops and isinstance(ops[0], P.Paren) else ()
  if ops: raise err(ins, "call with a prototype / jump table")
  def syms(items):
    out = []
    for it in items:
      k = cx.lookup(it.name, ins.line) if isinstance(it, P.Reg) else None
      if k is None or k[0] != "sym" or k[1].space != "param": raise err(ins, f"call argument {it!r} must be a .param variable")
      out.append(k[1])
    return out
  ret_syms, arg_syms = syms(rets), syms(args)
  cx.cf.calls.add(name)
  def f(st, m): st.L.call(st, name, ret_syms, arg_syms, m)
  return f


# ---------------------------------------------------------------------------- warps

def b_shfl(cx, ins, mods, types):
  mode = next((x for x in mods if x in ("up", "down", "bfly", "idx")), None)
  if "sync" not in mods or mode is None: raise err(ins, "shfl needs .sync and a mode")
  cx.cf.warp_ops = True
  d = ins.operands[0]
  p_op, d_op = (d.second, d.first) if isinstance(d, P.Pair) else (None, d)
  w, wp = write(cx, ins, d_op, "b32"), (write(cx, ins, p_op, "pred") if p_op is not None else None)
  ra, rb, rc, rmask = (read(cx, ins, o, "b32") for o in ins.operands[1:5])
  def f(st, m): st.L.shfl(st, m, mode, ra(st), rb(st), rc(st), rmask(st), w, wp, ins)
  return f


def b_vote(cx, ins, mods, types):
  mode = next((x for x in mods if x in ("all", "any", "uni", "ballot")), None)
  if "sync" not in mods or mode is None: raise err(ins, "vote needs .sync and a mode")
  cx.cf.warp_ops = True
  t = "b32" if mode == "ballot" else "pred"
  w = write(cx, ins, ins.operands[0], t)
  rp, rmask = read(cx, ins, ins.operands[1], "pred"), read(cx, ins, ins.operands[2], "b32")
  def f(st, m): w(st, m, st.L.vote(st, m, mode, rp(st), rmask(st), ins))
  return f


def b_activemask(cx, ins, mods, types):
  cx.cf.warp_ops = True
  w = write(cx, ins, ins.operands[0], "b32")
  def f(st, m): w(st, m, st.L.ballot(m, np.ones(st.L.shape, bool) if m is None else m))
  return f


def b_redux(cx, ins, mods, types):
  op = next((x for x in mods if x in ("add", "min", "max", "and", "or", "xor")), None)
  t = types[0] if types else None
  if "sync" not in mods or op is None or t not in ("u32", "s32", "b32"): raise err(ins, "redux form")
  cx.cf.warp_ops = True
  w = write(cx, ins, ins.operands[0], t)
  ra, rmask = read(cx, ins, ins.operands[1], t), read(cx, ins, ins.operands[2], "b32")
  def f(st, m): w(st, m, st.L.redux(st, m, op, NP[t], ra(st), rmask(st), ins))
  return f


def b_mma(cx, ins, mods, types):
  shape = next((x for x in mods if x.startswith("m") and "n" in x and "k" in x), None)
  if "sync" not in mods or "aligned" not in mods or shape not in ("m16n8k16", "m16n8k8"):
    raise err(ins, "mma forms other than mma.sync.aligned.m16n8k16/m16n8k8 are not supported")
  if ("row" not in mods or "col" not in mods) or len(types) != 4: raise err(ins, "mma needs .row.col and four types")
  td, ta, tb, tc = types
  if ta != tb or ta not in ("f16", "bf16") or td not in ("f32", "f16") or tc not in ("f32", "f16") or (ta == "bf16" and td != "f32"):
    raise err(ins, f"mma with .{td}.{ta}.{tb}.{tc}")
  cx.cf.warp_ops = True
  k = 16 if shape == "m16n8k16" else 8
  D, A, B, C = ins.operands
  for v, n in ((D, 4 if td == "f32" else 2), (A, k // 4), (B, k // 8), (C, 4 if tc == "f32" else 2)):
    if not isinstance(v, P.Vec) or len(v.items) != n: raise err(ins, "mma operand vector sizes")
  wd = [write(cx, ins, o, "f32" if td == "f32" else "b32") for o in D.items]
  ra = [read(cx, ins, o, "b32") for o in A.items]
  rb = [read(cx, ins, o, "b32") for o in B.items]
  rc = [read(cx, ins, o, "f32" if tc == "f32" else "b32") for o in C.items]
  def f(st, m):
    st.L.mma(st, m, k, ta, td, tc, [r(st) for r in ra], [r(st) for r in rb], [r(st) for r in rc], wd, ins)
  return f


# ---------------------------------------------------------------------------- the table

BUILDERS: dict[str, Callable] = {
  "add": b_add, "sub": lambda cx, ins, mods, types: b_add(cx, ins, mods, types, sub=True), "mul": b_mul, "fma": b_fma,
  "mad": b_mad, "div": b_div, "rem": b_rem, "rcp": b_rcp, "sqrt": b_sqrt, "rsqrt": _approx(_rsqrt), "ex2": _approx(np.exp2),
  "lg2": _approx(np.log2), "sin": _approx(np.sin), "cos": _approx(np.cos), "tanh": _approx(np.tanh), "abs": b_abs,
  "neg": b_neg, "min": b_minmax(False), "max": b_minmax(True), "copysign": b_copysign, "testp": b_testp,
  "addc": b_addc, "subc": b_subc, "madc": b_madc,
  "and": b_bitop(lambda a, b: a & b), "or": b_bitop(lambda a, b: a | b), "xor": b_bitop(lambda a, b: a ^ b), "not": b_not,
  "cnot": b_cnot, "shl": b_shl, "shr": b_shr, "shf": b_shf, "lop3": b_lop3, "popc": b_popc, "clz": b_clz, "bfind": b_bfind,
  "brev": b_brev, "bfe": b_bfe, "bfi": b_bfi, "prmt": b_prmt, "dp4a": b_dp4a,
  "setp": b_setp, "set": b_set, "selp": b_selp, "slct": b_slct,
  "mov": b_mov, "cvt": b_cvt, "cvta": b_cvta, "isspacep": b_isspacep,
  "ld": b_ld, "ldu": b_ld, "st": b_st, "atom": b_atom, "red": b_red,
  "prefetch": b_nop, "prefetchu": b_nop, "membar": b_nop, "fence": b_nop, "nanosleep": b_nop, "pmevent": b_nop,
  "bra": b_bra, "ret": b_ret, "exit": b_ret, "trap": b_trap, "brkpt": b_trap, "bar": b_bar, "barrier": b_bar, "call": b_call,
  "shfl": b_shfl, "vote": b_vote, "activemask": b_activemask, "redux": b_redux, "mma": b_mma,
}


def build(cx: FnCompiler, ins: P.Instr) -> Any:
  """The closure (or terminator tuple) of one instruction."""
  base, mods, types = split_opcode(ins.opcode)
  b = BUILDERS.get(base)
  if b is None: raise err(ins, f"unimplemented PTX instruction {ins.opcode}")
  if base not in ("bra", "ret", "exit", "trap", "brkpt", "bar", "barrier", "call", "membar", "fence", "activemask", "prefetch",
                  "prefetchu", "nanosleep", "pmevent") and not types:
    raise err(ins, f"{ins.opcode} has no type")
  try: out = b(cx, ins, mods, types)
  except (Unimplemented, PTXError): raise
  except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
    raise err(ins, f"unsupported form of {ins.opcode} ({type(e).__name__}: {e})") from None
  if callable(out) and ins.guard is not None:
    g = cx.lookup(ins.guard[0], ins.line)
    if g[0] != "reg" or g[2] != "pred": raise PTXError(f"PTX line {ins.line}: guard {ins.guard[0]} is not a predicate register")
    out = guarded(out, g[1], ins.guard[1])
  return out
