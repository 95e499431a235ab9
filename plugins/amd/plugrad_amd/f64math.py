"""float64 exp2, log2 and sin, and an accurate float32 sin, as LLVM IR functions: AMDGPU has no f64 instructions (or
libcalls) for them, and its float32 v_sin_f32 takes revolutions (x / 2pi, rounded: an absolute error growing with |x|)
over a limited range.

Each is range reduction plus a polynomial in double, accurate to a few ulp on the reduced range:
  exp2(x) = 2**n * e**(f*ln2), n = rint(x), |f| <= 1/2, Taylor to degree 14; x clamped to +-1100 so ldexp gives inf/0;
  log2(x) = e + log(m)/ln2 with frexp, m in [sqrt(1/2), sqrt(2)), log(m) = 2*atanh(s), s = (m-1)/(m+1), to s**25;
  sin(x)  = +-sin(r) or +-cos(r), r = x - k*pi/2 (three-part Cody-Waite), |r| <= pi/4, Taylor to degree 19/18.
float64 sin of very large arguments (|x| > 2**20) loses accuracy (no Payne-Hanek reduction).
float32 sin(x) = +-sin(r) or +-cos(r), |r| <= pi/4, polynomials in float32 (Taylor to degree 11/12, error < 1e-11):
  |x| < 2**16: r = x - k*pi/2 in float32 (three-part Cody-Waite with fma; the first step is exact), error ~2**-24;
  else (and inf/nan): x*2/pi mod 4 exactly in float64: 2/pi as 8 chunks of 28 bits, x (24 bits) times each chunk is
  exact, each product taken mod 4 is exact, their sum has ~2**-48 absolute error, so any float32 (up to 3.4e38)
  reduces to ~1e-14 absolute. The slow path is a branch: waves whose lanes are all small skip it.
"""
from __future__ import annotations

import math
import struct


def _c(v: float) -> str: return "0x%016X" % struct.unpack("<Q", struct.pack("<d", v))[0]


def _horner(name: str, x: str, coeffs: list[float]) -> list[str]:
  """%name = polynomial sum(coeffs[i] * x**i) by Horner's rule with fma."""
  out, acc = [], _c(coeffs[-1])
  for i, c in enumerate(reversed(coeffs[:-1])):
    out.append(f"  %{name}{i} = call double @llvm.fma.f64(double {acc}, double {x}, double {_c(c)})")
    acc = f"%{name}{i}"
  out.append(f"  %{name} = fadd double {acc}, 0.0")
  return out


def exp2_ir() -> str:
  ln2 = math.log(2)
  body = ["define internal double @pg_exp2_f64(double %x) alwaysinline {",
          "  %lo = call double @llvm.maxnum.f64(double %x, double -1100.0)",
          "  %cl = call double @llvm.minnum.f64(double %lo, double 1100.0)",
          "  %isn = fcmp uno double %x, %x",
          "  %n = call double @llvm.rint.f64(double %cl)",
          "  %f = fsub double %cl, %n",
          f"  %t = fmul double %f, {_c(ln2)}",
          *_horner("p", "%t", [1 / math.factorial(i) for i in range(15)]),
          "  %ni = fptosi double %n to i32",
          "  %r = call double @llvm.ldexp.f64.i32(double %p, i32 %ni)",
          "  %o = select i1 %isn, double %x, double %r",
          "  ret double %o", "}"]
  return "\n".join(body)


def log2_ir() -> str:
  body = ["define internal double @pg_log2_f64(double %x) alwaysinline {",
          "  %fr = call { double, i32 } @llvm.frexp.f64.i32(double %x)",
          "  %m0 = extractvalue { double, i32 } %fr, 0",
          "  %e0 = extractvalue { double, i32 } %fr, 1",
          f"  %small = fcmp olt double %m0, {_c(math.sqrt(0.5))}",
          "  %m2 = fmul double %m0, 2.0",
          "  %m = select i1 %small, double %m2, double %m0",
          "  %e1 = sub i32 %e0, 1",
          "  %e = select i1 %small, i32 %e1, i32 %e0",
          "  %num = fsub double %m, 1.0",
          "  %den = fadd double %m, 1.0",
          "  %s = fdiv double %num, %den",
          "  %s2 = fmul double %s, %s",
          *_horner("p", "%s2", [2 / (2 * i + 1) for i in range(13)]),
          "  %lnm = fmul double %p, %s",
          f"  %l2m = fmul double %lnm, {_c(1 / math.log(2))}",
          "  %ef = sitofp i32 %e to double",
          "  %r = fadd double %ef, %l2m",
          "  %neg = fcmp olt double %x, 0.0",
          "  %zero = fcmp oeq double %x, 0.0",
          "  %inf = fcmp oeq double %x, 0x7FF0000000000000",
          "  %isn = fcmp uno double %x, %x",
          "  %r1 = select i1 %zero, double 0xFFF0000000000000, double %r",
          "  %r2 = select i1 %inf, double 0x7FF0000000000000, double %r1",
          "  %r3 = select i1 %neg, double 0x7FF8000000000000, double %r2",
          "  %r4 = select i1 %isn, double %x, double %r3",
          "  ret double %r4", "}"]
  return "\n".join(body)


def sin_ir() -> str:
  p1 = 1.5707963267341256  # pi/2 in three parts: p1 + p2 + p3
  p2 = 6.077100506506192e-11
  p3 = 2.0222662487959506e-21
  body = ["define internal double @pg_sin_f64(double %x) alwaysinline {",
          f"  %q = fmul double %x, {_c(2 / math.pi)}",
          "  %k = call double @llvm.rint.f64(double %q)",
          f"  %r1 = call double @llvm.fma.f64(double %k, double {_c(-p1)}, double %x)",
          f"  %r2 = call double @llvm.fma.f64(double %k, double {_c(-p2)}, double %r1)",
          f"  %r = call double @llvm.fma.f64(double %k, double {_c(-p3)}, double %r2)",
          "  %r_2 = fmul double %r, %r",
          *_horner("ps", "%r_2", [(-1) ** i / math.factorial(2 * i + 1) for i in range(10)]),
          "  %sn = fmul double %ps, %r",
          *_horner("cs", "%r_2", [(-1) ** i / math.factorial(2 * i) for i in range(10)]),
          "  %kl = fptosi double %k to i64",
          "  %quad = and i64 %kl, 3",
          "  %odd = trunc i64 %quad to i1",
          "  %hi = icmp uge i64 %quad, 2",
          "  %v = select i1 %odd, double %cs, double %sn",
          "  %nv = fneg double %v",
          "  %res = select i1 %hi, double %nv, double %v",
          "  %fin = fcmp one double %x, 0x7FF0000000000000",
          "  %fin2 = fcmp one double %x, 0xFFF0000000000000",
          "  %ok = and i1 %fin, %fin2",
          "  %out = select i1 %ok, double %res, double 0x7FF8000000000000",
          "  ret double %out", "}"]
  return "\n".join(body)


def _two_over_pi_bits(nbits: int) -> int:
  """floor(2/pi * 2**nbits), from pi by Machin's formula in integer fixed point (guard bits make it exact)."""
  g = nbits + 64
  def atan_inv(n: int) -> int:  # atan(1/n) * 2**g
    total, term, k, sign = 0, (1 << g) // n, 1, 1
    while term:
      total += sign * (term // k)
      term //= n * n
      k += 2
      sign = -sign
    return total
  pi = 16 * atan_inv(5) - 4 * atan_inv(239)  # pi * 2**g, off by a few units
  return (2 << (g + nbits)) // pi


_CHUNK, _NCHUNK = 28, 8
_TOP = _two_over_pi_bits(_CHUNK * _NCHUNK)
TWO_OVER_PI_CHUNKS = [((_TOP >> (_CHUNK * (_NCHUNK - 1 - i))) & ((1 << _CHUNK) - 1)) * 2.0 ** (-_CHUNK * (i + 1)) for i in range(_NCHUNK)]


def _cf(v: float) -> str:
  """A float32 constant in LLVM's hex form (a double holding the float32 value)."""
  return _c(struct.unpack("<f", struct.pack("<f", v))[0])


def _horner_f(name: str, x: str, coeffs: list[float]) -> list[str]:
  out, acc = [], _cf(coeffs[-1])
  for i, c in enumerate(reversed(coeffs[:-1])):
    out.append(f"  %{name}{i} = call float @llvm.fma.f32(float {acc}, float {x}, float {_cf(c)})")
    acc = f"%{name}{i}"
  out.append(f"  %{name} = fadd float {acc}, 0.0")
  return out


def sin_f32_ir() -> str:
  p1 = struct.unpack("<f", struct.pack("<f", math.pi / 2))[0]
  p2 = struct.unpack("<f", struct.pack("<f", math.pi / 2 - p1))[0]
  p3 = struct.unpack("<f", struct.pack("<f", math.pi / 2 - p1 - p2))[0]
  slow = ["slow:", "  %xd = fpext float %x to double"]
  terms = []
  for i, c in enumerate(TWO_OVER_PI_CHUNKS):
    slow += [f"  %t{i} = fmul double %xd, {_c(c)}", f"  %q{i} = fmul double %t{i}, 0.25",
             f"  %f{i} = call double @llvm.floor.f64(double %q{i})", f"  %m{i} = call double @llvm.fma.f64(double %f{i}, double -4.0, double %t{i})"]
    terms.append(f"%m{i}")
  acc = terms[-1]
  for i, t in enumerate(reversed(terms[:-1])):  # smallest terms first
    slow.append(f"  %a{i} = fadd double {acc}, {t}")
    acc = f"%a{i}"
  slow += [f"  %n = call double @llvm.rint.f64(double {acc})", f"  %fr = fsub double {acc}, %n",
           f"  %rd = fmul double %fr, {_c(math.pi / 2)}", "  %rs = fptrunc double %rd to float",
           "  %nok = fcmp ord double %n, 0.0", "  %n0 = select i1 %nok, double %n, double 0.0", "  %ks = fptosi double %n0 to i32",
           "  br label %poly"]
  body = ["define internal float @pg_sin_f32(float %x) alwaysinline {", "entry:",
          "  %ax = call float @llvm.fabs.f32(float %x)",
          "  %small = fcmp olt float %ax, 65536.0",
          "  br i1 %small, label %fast, label %slow",
          "fast:",
          f"  %qf = fmul float %x, {_cf(2 / math.pi)}",
          "  %k = call float @llvm.rint.f32(float %qf)",
          f"  %r1 = call float @llvm.fma.f32(float %k, float {_cf(-p1)}, float %x)",
          f"  %r2 = call float @llvm.fma.f32(float %k, float {_cf(-p2)}, float %r1)",
          f"  %rf = call float @llvm.fma.f32(float %k, float {_cf(-p3)}, float %r2)",
          "  %kf = fptosi float %k to i32",
          "  br label %poly",
          *slow,
          "poly:",
          "  %r = phi float [ %rf, %fast ], [ %rs, %slow ]",
          "  %kq = phi i32 [ %kf, %fast ], [ %ks, %slow ]",
          "  %r_2 = fmul float %r, %r",
          *_horner_f("ps", "%r_2", [(-1) ** i / math.factorial(2 * i + 1) for i in range(6)]),
          "  %sn = fmul float %ps, %r",
          *_horner_f("cs", "%r_2", [(-1) ** i / math.factorial(2 * i) for i in range(7)]),
          "  %quad = and i32 %kq, 3",
          "  %odd = trunc i32 %quad to i1",
          "  %hi = icmp uge i32 %quad, 2",
          "  %v = select i1 %odd, float %cs, float %sn",
          "  %nv = fneg float %v",
          "  %res = select i1 %hi, float %nv, float %v",
          "  %fin = fcmp one float %ax, 0x7FF0000000000000",
          "  %out = select i1 %fin, float %res, float 0x7FF8000000000000",
          "  ret float %out", "}"]
  return "\n".join(body)


HELPERS = {"exp2": exp2_ir, "log2": log2_ir, "sin": sin_ir}
F32_HELPERS = {"sin": sin_f32_ir}
F32_DECLS = ["declare float @llvm.fma.f32(float, float, float)", "declare float @llvm.rint.f32(float)", "declare float @llvm.fabs.f32(float)",
             "declare double @llvm.floor.f64(double)", "declare double @llvm.fma.f64(double, double, double)",
             "declare double @llvm.rint.f64(double)"]
DECLS = ["declare double @llvm.fma.f64(double, double, double)", "declare double @llvm.rint.f64(double)",
         "declare double @llvm.maxnum.f64(double, double)", "declare double @llvm.minnum.f64(double, double)",
         "declare double @llvm.ldexp.f64.i32(double, i32)", "declare { double, i32 } @llvm.frexp.f64.i32(double)"]
