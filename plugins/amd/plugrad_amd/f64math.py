"""float64 exp2, log2 and sin as LLVM IR functions: AMDGPU has no f64 instructions (or libcalls) for them.

Each is range reduction plus a polynomial in double, accurate to a few ulp on the reduced range:
  exp2(x) = 2**n * e**(f*ln2), n = rint(x), |f| <= 1/2, Taylor to degree 14; x clamped to +-1100 so ldexp gives inf/0;
  log2(x) = e + log(m)/ln2 with frexp, m in [sqrt(1/2), sqrt(2)), log(m) = 2*atanh(s), s = (m-1)/(m+1), to s**25;
  sin(x)  = +-sin(r) or +-cos(r), r = x - k*pi/2 (three-part Cody-Waite), |r| <= pi/4, Taylor to degree 19/18.
sin of very large arguments (|x| > 2**20) loses accuracy (no Payne-Hanek reduction).
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


HELPERS = {"exp2": exp2_ir, "log2": log2_ir, "sin": sin_ir}
DECLS = ["declare double @llvm.fma.f64(double, double, double)", "declare double @llvm.rint.f64(double)",
         "declare double @llvm.maxnum.f64(double, double)", "declare double @llvm.minnum.f64(double, double)",
         "declare double @llvm.ldexp.f64.i32(double, i32)", "declare { double, i32 } @llvm.frexp.f64.i32(double)"]
