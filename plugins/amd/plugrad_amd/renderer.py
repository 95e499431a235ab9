"""AMDGPU renderer: the linear kernel IR (docs/kernel_ir.md) as LLVM IR for the amdgcn-amd-amdhsa target.

No device libraries: hardware ids are the `llvm.amdgcn.workgroup.id.*` / `llvm.amdgcn.workitem.id.*` intrinsics,
math is LLVM's own intrinsics (exp2, log2, sqrt, trunc, fma; sin after our range reduction, f64math.py), barriers are `llvm.amdgcn.s.barrier` between
workgroup-scope fences, tensor cores are `llvm.amdgcn.wmma.*` (RDNA3/4, wave32) and `llvm.amdgcn.mfma.*` (CDNA,
wave64). Buffers are `ptr addrspace(1)`, DEFINE_LOCAL an `addrspace(3)` global, accumulators `addrspace(5)` allocas
(promoted to registers by clang -O3). Loops are blocks with a counter in an alloca; a gated LOAD/STORE branches
around the access so a false gate never touches memory.

The source carries no metadata: launch sizes travel in `ProgramSpec.global_size` (workgroups per dim, symbolic where
the kernel is) / `local_size` (work-items per workgroup), which the engine passes to every launch. The renderer only
checks the work-item ids it is given (gidx0..2 / lidx0..2, a constant workgroup size within `local_max_threads`) and
states the workgroup size to the backend as the `amdgpu-flat-work-group-size` attribute.
"""
from __future__ import annotations

import math
import re
import struct
from typing import Any

import numpy as np

from plugrad.codegen import targets
from plugrad.codegen.targets import GPUTarget
from plugrad.dtype import AddrSpace, DType, PtrDType, dtypes, f32_to_fp8, fp8_to_f32
from plugrad.runtime.renderer import Renderer
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad_amd import f64math



# ---------------------------------------------------------------------------- targets (capabilities as data)

# each family's record in core's codegen/targets.py: launch limits, wave size, LDS, tensor cores (the records EMULATE=AMD*
# runs too); nothing here restates them
FAMILY_TARGETS: dict[str, GPUTarget] = {"RDNA3": targets.AMD, "RDNA4": targets.AMD_RDNA4, "CDNA3": targets.AMD_CDNA3, "CDNA2": targets.AMD_CDNA2}
# arch -> its family and tensor-core instruction kind (fp8 is converted in software everywhere: AMDGPURenderer.fp8_cast);
# "wave" is the family record's warp size (the runtime's dispatch reads it)
ARCHS: dict[str, dict[str, Any]] = {arch: {"family": fam, "tc": tc, "wave": FAMILY_TARGETS[fam].warp_size} for arch, fam, tc in (
  ("gfx1100", "RDNA3", "wmma_gfx11"), ("gfx1101", "RDNA3", "wmma_gfx11"), ("gfx1102", "RDNA3", "wmma_gfx11"),
  ("gfx1200", "RDNA4", "wmma_gfx12"), ("gfx1201", "RDNA4", "wmma_gfx12"), ("gfx90a", "CDNA2", "mfma"),
  ("gfx940", "CDNA3", "mfma"), ("gfx941", "CDNA3", "mfma"), ("gfx942", "CDNA3", "mfma"))}

# tensor-core intrinsics by (kind, a lanes, c lanes, input dtype): (intrinsic, extra trailing args)
TC_INTRINSICS: dict[tuple[str, int, int, str], tuple[str, str]] = {
  ("wmma_gfx11", 16, 8, "half"): ("llvm.amdgcn.wmma.f32.16x16x16.f16", ""),
  ("wmma_gfx11", 16, 8, "bfloat"): ("llvm.amdgcn.wmma.f32.16x16x16.bf16", ""),
  ("wmma_gfx12", 8, 8, "half"): ("llvm.amdgcn.wmma.f32.16x16x16.f16.v8f32.v8f16", ""),
  ("wmma_gfx12", 8, 8, "bfloat"): ("llvm.amdgcn.wmma.f32.16x16x16.bf16.v8f32.v8i16", ""),
  ("mfma", 4, 4, "half"): ("llvm.amdgcn.mfma.f32.16x16x16f16", ", i32 0, i32 0, i32 0"),
  ("mfma", 4, 4, "bfloat"): ("llvm.amdgcn.mfma.f32.16x16x16bf16.1k", ", i32 0, i32 0, i32 0"),
}


# ---------------------------------------------------------------------------- LLVM types and constants

LTYPES = {dtypes.bool: "i1", dtypes.int8: "i8", dtypes.uint8: "i8", dtypes.int16: "i16", dtypes.uint16: "i16", dtypes.int32: "i32",
          dtypes.uint32: "i32", dtypes.int64: "i64", dtypes.uint64: "i64", dtypes.float16: "half", dtypes.bfloat16: "bfloat",
          dtypes.float32: "float", dtypes.float64: "double", dtypes.fp8e4m3: "i8", dtypes.fp8e5m2: "i8"}
FP8 = (dtypes.fp8e4m3, dtypes.fp8e5m2)
_FSUFFIX = {"half": "f16", "bfloat": "bf16", "float": "f32", "double": "f64"}


def ltype(dt: DType) -> str:
  """The LLVM type of a value of `dt` (registers: bool is i1)."""
  if isinstance(dt, PtrDType): return f"ptr addrspace({ {AddrSpace.GLOBAL: 1, AddrSpace.LOCAL: 3, AddrSpace.REG: 5}[dt.addrspace] })"
  if dt.count > 1: return f"<{dt.count} x {ltype(dt.scalar())}>"
  if dt not in LTYPES: raise NotImplementedError(f"AMDGPU renderer has no LLVM type for {dt}")
  return LTYPES[dt]


def mtype(dt: DType) -> str:
  """The LLVM type of `dt` in memory (bool is a byte)."""
  return "i8" if dt == dtypes.bool else ltype(dt)


def is_float(dt: DType) -> bool: return dtypes.is_float(dt) and dt.scalar() not in FP8


def fp8_value(code: int, dt: DType) -> float:
  """The float an fp8 byte encodes (core's tables: e4m3 is the 'fn' variant, no infinities, 0x7f/0xff NaN; e5m2 IEEE-like)."""
  return float(fp8_to_f32(code, dt))


def fp8_bits(v: float, dt: DType) -> int:
  """The fp8 byte of `v` as core converts it (through float32, nearest even; e4m3 saturates to +-448, e5m2 overflows to
  inf; NaN is 0x7f): constants fold exactly as the kernel's own conversions compute."""
  with np.errstate(over="ignore"): return int(f32_to_fp8(np.float32(v), dt))


def render_const(v: Any, dt: DType) -> str:
  """An LLVM constant of scalar type `dt` (floats as exact hex: LLVM rejects inexact decimal float literals)."""
  if dt.count > 1: return "<" + ", ".join(f"{ltype(dt.scalar())} {render_const(v, dt.scalar())}" for _ in range(dt.count)) + ">"
  if dt == dtypes.bool: return "true" if v else "false"
  if dt in (dtypes.float32, dtypes.float64):
    f = float(v)
    if dt == dtypes.float32 and math.isfinite(f):
      try: f = struct.unpack("<f", struct.pack("<f", f))[0]
      except OverflowError: f = math.copysign(math.inf, f)
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", f))[0]
  if dt == dtypes.float16:
    try: bits = struct.unpack("<H", struct.pack("<e", float(v)))[0]
    except OverflowError: bits = 0xFC00 if v < 0 else 0x7C00
    return "0xH%04X" % bits
  if dt == dtypes.bfloat16:
    f = float(v)
    u = struct.unpack("<I", struct.pack("<f", f))[0] if math.isfinite(f) or math.isinf(f) else 0x7FC00000
    if math.isnan(f): u = 0x7FC00000
    return "0xR%04X" % (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF if not math.isnan(f) else 0x7FC0)
  if dt in FP8: iv = fp8_bits(v, dt)
  else: iv = int(v) & ((1 << dt.itemsize * 8) - 1)
  bits = dt.itemsize * 8
  return str(iv - (1 << bits) if iv >= 1 << (bits - 1) else iv)


class AMDGPURenderer(Renderer):
  """LLVM IR for one gfx arch (gfx1100 by default; AMDDevice makes a subclass with the GPU's own arch)."""
  name, device, suffix = "AMDGPU", "AMD", "AMDGPU"
  caps = targets.AMD.caps()
  default_arch = "gfx1100"

  def __init__(self, arch: str | None = None) -> None:
    super().__init__(arch or self.default_arch)
    if self.arch not in ARCHS: raise ValueError(f"AMDGPU arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
    self.target = ARCHS[self.arch]
    self.caps = FAMILY_TARGETS[self.target["family"]].caps()

  @classmethod
  def accepts_arch(cls, arch: str) -> bool: return arch in ARCHS

  # ---- emission helpers
  def _new(self, prefix: str = "v") -> str:
    self._n += 1
    return f"%{prefix}{self._n}"

  def emit(self, s: str) -> None: self._lines.append("  " + s)

  def label(self, name: str) -> None:
    self._lines.append(f"{name}:")
    self._block = name

  def br(self, target: str) -> None: self.emit(f"br label %{target}")

  def val(self, u: UOp) -> str:
    if u.op is Ops.CONST: return render_const(u.arg, u.dtype)
    if u not in self.r: raise RuntimeError(f"AMDGPU renderer: {u.op} used before it was rendered (the linear order is broken)")
    return self.r[u]

  # ---- ALU
  def cast(self, x: str, src: DType, dst: DType) -> str:
    """Value conversion (C semantics: float -> int truncates; bool is != 0)."""
    if src == dst: return x
    if src.count > 1 or dst.count > 1:
      if src.count != dst.count: raise NotImplementedError(f"AMDGPU renderer: cast {src} -> {dst} changes the lane count")
      return self._cast_ins(x, src.scalar(), dst.scalar(), ltype(src), ltype(dst))
    if src in FP8 or dst in FP8: return self.fp8_cast(x, src, dst)
    if src in (dtypes.float16, dtypes.bfloat16) and dst in (dtypes.float16, dtypes.bfloat16):
      return self.cast(self.cast(x, src, dtypes.float32), dtypes.float32, dst)
    if dtypes.bfloat16 in (src, dst):  # bf16 <-> float32 as bit operations (the backend can't select every bf16 conversion)
      if src == dtypes.bfloat16: return self.cast(self.bf16_to_f32(x), dtypes.float32, dst)
      return self.f32_to_bf16(self.cast(x, src, dtypes.float32))
    return self._cast_ins(x, src, dst, ltype(src), ltype(dst))

  def bf16_to_f32(self, x: str) -> str:
    b, w, sh, out = self._new(), self._new(), self._new(), self._new()
    self.emit(f"{b} = bitcast bfloat {x} to i16")
    self.emit(f"{w} = zext i16 {b} to i32")
    self.emit(f"{sh} = shl i32 {w}, 16")
    self.emit(f"{out} = bitcast i32 {sh} to float")
    return out

  def f32_to_bf16(self, x: str) -> str:
    """Round to nearest even on the bits; NaN stays a (quiet) NaN."""
    n = [self._new() for _ in range(9)]
    self.emit(f"{n[0]} = bitcast float {x} to i32")
    self.emit(f"{n[1]} = lshr i32 {n[0]}, 16")
    self.emit(f"{n[2]} = and i32 {n[1]}, 1")
    self.emit(f"{n[3]} = add i32 {n[0]}, 32767")
    self.emit(f"{n[4]} = add i32 {n[3]}, {n[2]}")
    self.emit(f"{n[5]} = lshr i32 {n[4]}, 16")
    self.emit(f"{n[6]} = fcmp uno float {x}, {x}")
    self.emit(f"{n[7]} = select i1 {n[6]}, i32 32704, i32 {n[5]}")
    self.emit(f"{n[8]} = trunc i32 {n[7]} to i16")
    out = self._new()
    self.emit(f"{out} = bitcast i16 {n[8]} to bfloat")
    return out

  def _cast_ins(self, x: str, src: DType, dst: DType, ls: str, ld: str) -> str:
    out = self._new()
    sb, db = src.itemsize * 8, dst.itemsize * 8
    if dst == dtypes.bool:
      zero = render_const(0, src) if ls == ltype(src) else "zeroinitializer"
      self.emit(f"{out} = {'fcmp une' if is_float(src) else 'icmp ne'} {ls} {x}, {zero}")
    elif is_float(src) and is_float(dst): self.emit(f"{out} = {'fpext' if db > sb else 'fptrunc'} {ls} {x} to {ld}")
    elif is_float(src): self.emit(f"{out} = {'fptoui' if dtypes.is_unsigned(dst) else 'fptosi'} {ls} {x} to {ld}")
    elif is_float(dst): self.emit(f"{out} = {'uitofp' if dtypes.is_unsigned(src) or src == dtypes.bool else 'sitofp'} {ls} {x} to {ld}")
    else:
      sbits = 1 if src == dtypes.bool else sb
      if sbits == db: return x
      ins = "trunc" if db < sbits else ("zext" if dtypes.is_unsigned(src) or src == dtypes.bool else "sext")
      self.emit(f"{out} = {ins} {ls} {x} to {ld}")
    return out

  def fp8_cast(self, x: str, src: DType, dst: DType) -> str:
    """fp8 <-> other types through float32, by bit manipulation (core's OCP e4m3fn/e5m2 semantics, as the C renderer's
    pg_f2e4m3 & co.): no arch's conversion instructions are used, since gfx94x's are the FNUZ variants (bias 8/16,
    one NaN) and the OCP ones of gfx12 handle overflow/NaN by their clamp bit, which LLVM's intrinsics don't expose."""
    if src in FP8:
      f = self.fp8_to_f32(x, src)
      return self.cast(f, dtypes.float32, dst) if dst not in FP8 else self.f32_to_fp8(f, dst)
    return self.f32_to_fp8(self.cast(x, src, dtypes.float32), dst)

  def _ir(self, lines: list[str]) -> dict[str, str]:
    """Emit `lines` (LLVM instructions naming locals as {name}) with fresh SSA names; returns name -> SSA value."""
    names: dict[str, str] = {}
    for ln in lines:
      lhs = ln.split(" = ", 1)[0].strip("{}")
      names[lhs] = self._new()
      self.emit(ln.format(**names))
    return names

  def fp8_to_f32(self, x: str, dt: DType) -> str:
    """e4m3fn: S.EEEE.MMM bias 7, no inf, S.1111.111 NaN; e5m2: S.EEEEE.MM bias 15, IEEE inf/NaN. Subnormals m * 2^-9 / 2^-16."""
    e4 = dt == dtypes.fp8e4m3
    mb, emask, ebias, sub = (3, 15, 120, 0.001953125) if e4 else (2, 31, 112, 0.0000152587890625)
    self.decls.add("declare float @llvm.rint.f32(float)")
    n = self._ir([
      f"{{w}} = zext i8 {x} to i32", "{sg} = and i32 {w}, 128", "{ss} = shl i32 {sg}, 24",
      f"{{e0}} = lshr i32 {{w}}, {mb}", f"{{e}} = and i32 {{e0}}, {emask}", f"{{m}} = and i32 {{w}}, {(1 << mb) - 1}",
      "{mf} = uitofp i32 {m} to float", f"{{sf}} = fmul float {{mf}}, {render_const(sub, dtypes.float32)}", "{sb} = bitcast float {sf} to i32",
      f"{{eb}} = add i32 {{e}}, {ebias}", "{eb2} = shl i32 {eb}, 23", f"{{ms}} = shl i32 {{m}}, {23 - mb}", "{nb} = or i32 {eb2}, {ms}",
      "{isz} = icmp eq i32 {e}, 0", "{r1} = select i1 {isz}, i32 {sb}, i32 {nb}",
      *(["{lo} = and i32 {w}, 127", "{isn} = icmp eq i32 {lo}, 127", "{r2} = select i1 {isn}, i32 2143289344, i32 {r1}"] if e4 else
        ["{top} = icmp eq i32 {e}, 31", "{inf} = or i32 {ms}, 2139095040", "{r2} = select i1 {top}, i32 {inf}, i32 {r1}"]),
      "{r3} = or i32 {r2}, {ss}", "{out} = bitcast i32 {r3} to float"])
    return n["out"]

  def f32_to_fp8(self, x: str, dt: DType) -> str:
    """Round to nearest even; NaN -> 0x7f; |x| past the largest finite value: e4m3 saturates to +-448, e5m2 becomes
    +-inf from 61440 (the halfway point to the next, absent, step) up; subnormals rint(|x| * 2^9 / 2^16)."""
    e4 = dt == dtypes.fp8e4m3
    # (mantissa shift, float32 bits of the saturation threshold / of the smallest normal, rounding bias, exponent offset, scale, code)
    sh, big, small, off, scale, top = (20, 0x43E00000, 0x3C800000, 120 << 3, 512.0, 0x7E) if e4 else \
      (21, 0x47700000, 0x38800000, 112 << 2, 65536.0, 0x7C)
    self.decls.add("declare float @llvm.rint.f32(float)")
    n = self._ir([
      f"{{u}} = bitcast float {x} to i32", "{s0} = lshr i32 {u}, 24", "{s} = and i32 {s0}, 128", "{a} = and i32 {u}, 2147483647",
      "{af} = bitcast i32 {a} to float", f"{{sc}} = fmul float {{af}}, {render_const(scale, dtypes.float32)}",
      "{rn} = call float @llvm.rint.f32(float {sc})", "{sub} = fptoui float {rn} to i32",
      f"{{l0}} = lshr i32 {{a}}, {sh}", "{l1} = and i32 {l0}, 1", f"{{t0}} = add i32 {{a}}, {(1 << (sh - 1)) - 1}", "{t1} = add i32 {t0}, {l1}",
      f"{{t2}} = lshr i32 {{t1}}, {sh}", f"{{nrm}} = sub i32 {{t2}}, {off}",
      f"{{issm}} = icmp ult i32 {{a}}, {small}", "{m1} = select i1 {issm}, i32 {sub}, i32 {nrm}",
      f"{{isbig}} = icmp uge i32 {{a}}, {big}", f"{{m2}} = select i1 {{isbig}}, i32 {top}, i32 {{m1}}", "{m3} = or i32 {m2}, {s}",
      "{isn} = icmp ugt i32 {a}, 2139095040", "{m4} = select i1 {isn}, i32 127, i32 {m3}", "{out} = trunc i32 {m4} to i8"])
    return n["out"]

  def intrinsic(self, name: str, dt: DType, args: list[str]) -> str:
    lt = ltype(dt)
    if dt == dtypes.float64 and name in f64math.HELPERS:  # no f64 instruction: our own IR function
      self.helpers.add(name)
      out = self._new()
      self.emit(f"{out} = call double @pg_{name}_f64(double {args[0]})")
      return out
    if dt == dtypes.float32 and name in f64math.F32_HELPERS:  # v_sin_f32 alone is inaccurate for large |x|: our reduction first
      self.f32_helpers.add(name)
      out = self._new()
      self.emit(f"{out} = call float @pg_{name}_f32(float {args[0]})")
      return out
    own = (dt.scalar() == dtypes.float64 and name in f64math.HELPERS) or (dt.scalar() == dtypes.float32 and name in f64math.F32_HELPERS)
    if dt.count > 1 and own:
      lanes = [self._new() for _ in range(dt.count)]
      cur = "poison"
      for i, ln in enumerate(lanes):
        self.emit(f"{ln} = extractelement {lt} {args[0]}, i32 {i}")
        r = self.intrinsic(name, dt.scalar(), [ln])
        nv = self._new()
        self.emit(f"{nv} = insertelement {lt} {cur}, {ltype(dt.scalar())} {r}, i32 {i}")
        cur = nv
      return cur
    suffix = (f"v{dt.count}" if dt.count > 1 else "") + _FSUFFIX[ltype(dt.scalar())]
    self.decls.add(f"declare {lt} @llvm.{name}.{suffix}({', '.join([lt] * len(args))})")
    out = self._new()
    self.emit(f"{out} = call {lt} @llvm.{name}.{suffix}({', '.join(f'{lt} {a}' for a in args)})")
    return out

  def alu(self, u: UOp, args: list[str]) -> str:
    op, dt = u.op, u.dtype
    sdt = u.src[0].dtype if u.src else dt
    if op is Ops.CAST: return self.cast(args[0], sdt, dt)
    if op is Ops.BITCAST:
      if sdt in FP8 or dt in FP8: return args[0] if mtype(sdt) == mtype(dt) else self._bitcast(args[0], sdt, dt)
      return self._bitcast(args[0], sdt, dt)
    # half-like and fp8 arithmetic: compute in float32 (fp8 has no arithmetic; bf16 math intrinsics need float)
    cdt = dt if op not in GroupOp.Comparison else sdt
    if cdt.scalar() in (dtypes.bfloat16, *FP8) and op is not Ops.WHERE:
      f32 = dtypes.float32.vec(cdt.count) if cdt.count > 1 else dtypes.float32
      widen = [s.dtype.scalar() in (dtypes.bfloat16, *FP8) for s in u.src]
      fargs = [self.cast(a, s.dtype, f32) if w else a for a, s, w in zip(args, u.src, widen)]
      fsrc = tuple(UOp(Ops.NOOP, f32 if w else s.dtype) for s, w in zip(u.src, widen))
      res = self.alu(UOp(op, f32 if op not in GroupOp.Comparison else dt, fsrc, u.arg), fargs)
      return res if op in GroupOp.Comparison else self.cast(res, f32, dt)
    lt = ltype(dt)
    fl = is_float(dt)
    out = self._new()
    if op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC):
      if dt.scalar() == dtypes.float16 and op in (Ops.SIN,):  # no f16 sin: through float
        f32 = dtypes.float32.vec(dt.count) if dt.count > 1 else dtypes.float32
        return self.cast(self.intrinsic("sin", f32, [self.cast(args[0], dt, f32)]), f32, dt)
      return self.intrinsic({Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}[op], dt, args)
    if op is Ops.RECIPROCAL: self.emit(f"{out} = fdiv {lt} {render_const(1, dt)}, {args[0]}")
    elif op is Ops.NEG:
      if dt == dtypes.bool: self.emit(f"{out} = xor i1 {args[0]}, true")
      elif fl: self.emit(f"{out} = fneg {lt} {args[0]}")
      else: self.emit(f"{out} = sub {lt} {render_const(0, dt)}, {args[0]}")
    elif op in (Ops.ADD, Ops.SUB, Ops.MUL):
      name = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul"}[op]
      if dt.scalar() == dtypes.bool: name = {Ops.ADD: "or", Ops.SUB: "xor", Ops.MUL: "and"}[op]
      self.emit(f"{out} = {'f' if fl else ''}{name} {lt} {args[0]}, {args[1]}")
    elif op is Ops.FDIV: self.emit(f"{out} = fdiv {lt} {args[0]}, {args[1]}")
    elif op in (Ops.IDIV, Ops.MOD): return self.int_divmod(op, dt, args)
    elif op in (Ops.AND, Ops.OR, Ops.XOR): self.emit(f"{out} = {op.name.lower()} {lt} {args[0]}, {args[1]}")
    elif op is Ops.SHL: self.emit(f"{out} = shl {lt} {args[0]}, {self.cast(args[1], u.src[1].dtype, dt)}")
    elif op is Ops.SHR: self.emit(f"{out} = {'lshr' if dtypes.is_unsigned(dt) else 'ashr'} {lt} {args[0]}, {self.cast(args[1], u.src[1].dtype, dt)}")
    elif op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
      st = ltype(sdt)
      if is_float(sdt): pred = {Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}[op]
      else: pred = {Ops.CMPLT: "ult" if dtypes.is_unsigned(sdt) or sdt.scalar() == dtypes.bool else "slt", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}[op]
      self.emit(f"{out} = {'fcmp' if is_float(sdt) else 'icmp'} {pred} {st} {args[0]}, {args[1]}")
    elif op is Ops.MAX:
      c = self._new()
      if fl:
        n = self._new()
        o = self._new()
        self.emit(f"{c} = fcmp ogt {lt} {args[0]}, {args[1]}")
        self.emit(f"{n} = fcmp uno {lt} {args[0]}, {args[0]}")
        self.emit(f"{o} = or {ltype(dtypes.bool.vec(dt.count)) if dt.count > 1 else 'i1'} {c}, {n}")
        c = o
      else: self.emit(f"{c} = icmp {'ugt' if dtypes.is_unsigned(dt) or dt.scalar() == dtypes.bool else 'sgt'} {lt} {args[0]}, {args[1]}")
      self.emit(f"{out} = select {ltype(dtypes.bool.vec(dt.count)) if dt.count > 1 else 'i1'} {c}, {lt} {args[0]}, {lt} {args[1]}")
    elif op is Ops.WHERE:
      self.emit(f"{out} = select {ltype(u.src[0].dtype)} {args[0]}, {lt} {args[1]}, {lt} {args[2]}")
    elif op is Ops.MULACC:
      if fl: return self.intrinsic("fma", dt, args)
      m = self._new()
      self.emit(f"{m} = mul {lt} {args[0]}, {args[1]}")
      self.emit(f"{out} = add {lt} {m}, {args[2]}")
    elif op is Ops.POW: return self.pow(dt, args)
    else: raise NotImplementedError(f"AMDGPU renderer can't render {op} on {dt}")
    return out

  def _bitcast(self, x: str, src: DType, dst: DType) -> str:
    if mtype(src) == mtype(dst): return x
    out = self._new()
    self.emit(f"{out} = bitcast {mtype(src)} {x} to {mtype(dst)}")
    return out

  def int_divmod(self, op: Ops, dt: DType, args: list[str]) -> str:
    """IDIV/MOD truncating toward zero; a zero divisor gives 0 (the reference's value) instead of undefined behavior."""
    lt = ltype(dt)
    z, safe, q, out = self._new(), self._new(), self._new(), self._new()
    self.emit(f"{z} = icmp eq {lt} {args[1]}, {render_const(0, dt)}")
    self.emit(f"{safe} = select i1 {z}, {lt} {render_const(1, dt)}, {lt} {args[1]}")
    ins = ("udiv" if op is Ops.IDIV else "urem") if dtypes.is_unsigned(dt) else ("sdiv" if op is Ops.IDIV else "srem")
    self.emit(f"{q} = {ins} {lt} {args[0]}, {safe}")
    self.emit(f"{out} = select i1 {z}, {lt} {render_const(0, dt)}, {lt} {q}")
    return out

  def pow(self, dt: DType, args: list[str]) -> str:
    """x**y as exp2(y*log2|x|), negative x only with an integer y (odd y flips the sign, else nan), y == 0 gives 1."""
    if dt.count > 1 or not is_float(dt): raise NotImplementedError(f"AMDGPU renderer: POW on {dt}")
    if dt != dtypes.float32 and dt != dtypes.float64:
      return self.cast(self.pow(dtypes.float32, [self.cast(a, dt, dtypes.float32) for a in args]), dtypes.float32, dt)
    lt, x, y = ltype(dt), args[0], args[1]
    ax = self.intrinsic("fabs", dt, [x])
    lg = self.intrinsic("log2", dt, [ax])
    m = self._new()
    self.emit(f"{m} = fmul {lt} {y}, {lg}")
    mag = self.intrinsic("exp2", dt, [m])
    yt = self.intrinsic("trunc", dt, [y])
    isint, neg, half, ht, odd, negmag = (self._new() for _ in range(6))
    self.emit(f"{isint} = fcmp oeq {lt} {yt}, {y}")
    self.emit(f"{neg} = fcmp olt {lt} {x}, {render_const(0, dt)}")
    self.emit(f"{half} = fmul {lt} {y}, {render_const(0.5, dt)}")
    ht2 = self.intrinsic("trunc", dt, [half])
    self.emit(f"{ht} = fcmp une {lt} {ht2}, {half}")
    self.emit(f"{odd} = and i1 {isint}, {ht}")
    self.emit(f"{negmag} = fneg {lt} {mag}")
    sgn, negres, res, y0, out = (self._new() for _ in range(5))
    self.emit(f"{sgn} = select i1 {odd}, {lt} {negmag}, {lt} {mag}")
    self.emit(f"{negres} = select i1 {isint}, {lt} {sgn}, {lt} {render_const(math.nan, dt)}")
    self.emit(f"{res} = select i1 {neg}, {lt} {negres}, {lt} {mag}")
    self.emit(f"{y0} = fcmp oeq {lt} {y}, {render_const(0, dt)}")
    self.emit(f"{out} = select i1 {y0}, {lt} {render_const(1, dt)}, {lt} {res}")
    return out

  # ---- memory
  def load(self, ptr: str, dt: DType) -> str:
    out = self._new()
    self.emit(f"{out} = load {mtype(dt)}, {ptr}, align {dt.scalar().itemsize if dt != dtypes.bool else 1}")
    if dt == dtypes.bool:
      b = self._new()
      self.emit(f"{b} = trunc i8 {out} to i1")
      return b
    return out

  def store(self, ptr: str, val: str, dt: DType) -> None:
    if dt == dtypes.bool:
      b = self._new()
      self.emit(f"{b} = zext i1 {val} to i8")
      val = b
    self.emit(f"store {mtype(dt)} {val}, {ptr}, align {dt.scalar().itemsize if dt != dtypes.bool else 1}")

  def gated(self, gate: str, body: Any) -> None:
    """Run `body()` (which emits code) only when `gate` is true."""
    n = self._new("g")[1:]
    self.emit(f"br i1 {gate}, label %{n}_then, label %{n}_join")
    self.label(f"{n}_then")
    body()
    self.br(f"{n}_join")
    self.label(f"{n}_join")

  # ---- the kernel
  def render(self, name: str, uops: list) -> str:
    self._n, self._lines, self._block = 0, [], "entry"
    self.r: dict[UOp, str] = {}
    self.decls: set[str] = set()
    self.helpers: set[str] = set()
    self.f32_helpers: set[str] = set()
    self.globals_: list[str] = []
    allocas: list[str] = []
    params: list[str] = []
    gates: dict[UOp, str] = {}
    loops: list[tuple[UOp, str, str]] = []
    ifs: list[str] = []
    specials = [u for u in uops if u.op is Ops.SPECIAL]
    for u in uops:
      op, dt, src = u.op, u.dtype, u.src
      if op is Ops.DEFINE_GLOBAL:
        self.r[u] = f"%data{u.arg}"
        params.append(f"ptr addrspace(1) noalias align {max(dt.base.itemsize, 1)} %data{u.arg}")
      elif op is Ops.DEFINE_VAR:
        self.r[u] = f"%{u.arg[0]}"
        params.append(f"{ltype(dt)} %{u.arg[0]}")
      elif op is Ops.CONST: self.r[u] = render_const(u.arg, dt)
      elif op is Ops.SPECIAL: self.r[u] = self.special(u)
      elif op is Ops.DEFINE_LOCAL:
        lname, size = (u.arg if isinstance(u.arg, tuple) else (f"lds{u.arg}", dt.size))
        self.globals_.append(f"@{lname} = internal addrspace(3) global [{size} x {mtype(dt.base)}] undef, align 16")
        self.r[u] = f"@{lname}"
      elif op is Ops.DEFINE_REG:
        self.r[u] = f"%acc{u.arg}"
        allocas.append(f"%acc{u.arg} = alloca [{max(dt.size, 1)} x {mtype(dt.base)}], align 16, addrspace(5)")
      elif op is Ops.AFTER: self.r[u] = self.r[src[0]]
      elif op is Ops.INDEX:
        base = src[0].dtype
        p = self._new("p")
        self.emit(f"{p} = getelementptr inbounds {mtype(base.base)}, {ltype(base)} {self.val(src[0])}, {ltype(src[1].dtype)} {self.val(src[1])}")
        self.r[u] = p
        if len(src) > 2: gates[u] = self.val(src[2])
      elif op is Ops.LOAD: self.r[u] = self.render_load(u, gates)
      elif op is Ops.STORE:
        idx, v = src[0], src[1]
        ptr = f"{ltype(idx.src[0].dtype) if idx.op is Ops.INDEX else ltype(idx.dtype)} {self.val(idx)}"
        if idx in gates: self.gated(gates[idx], lambda: self.store(ptr, self.val(v), v.dtype))
        else: self.store(ptr, self.val(v), v.dtype)
      elif op is Ops.RANGE:
        n = f"r{len(loops)}_{self._new('x')[2:]}"
        cnt = f"%{n}_i"
        allocas.append(f"{cnt} = alloca {ltype(dt)}, addrspace(5)")
        self.emit(f"store {ltype(dt)} 0, ptr addrspace(5) {cnt}")
        self.br(f"{n}_head")
        self.label(f"{n}_head")
        iv = self._new("idx")
        self.emit(f"{iv} = load {ltype(dt)}, ptr addrspace(5) {cnt}")
        c = self._new()
        self.emit(f"{c} = icmp slt {ltype(dt)} {iv}, {self.val(src[0])}")
        self.emit(f"br i1 {c}, label %{n}_body, label %{n}_exit")
        self.label(f"{n}_body")
        self.r[u] = iv
        loops.append((u, n, cnt))
      elif op is Ops.END:
        r, n, cnt = loops.pop()
        nx = self._new()
        self.emit(f"{nx} = add {ltype(r.dtype)} {self.r[r]}, 1")
        self.emit(f"store {ltype(r.dtype)} {nx}, ptr addrspace(5) {cnt}")
        self.br(f"{n}_head")
        self.label(f"{n}_exit")
      elif op is Ops.IF:
        n = self._new("if")[1:]
        self.emit(f"br i1 {self.val(src[0])}, label %{n}_then, label %{n}_end")
        self.label(f"{n}_then")
        ifs.append(n)
      elif op is Ops.ENDIF:
        n = ifs.pop()
        self.br(f"{n}_end")
        self.label(f"{n}_end")
      elif op is Ops.BARRIER:
        self.emit('fence syncscope("workgroup") release')
        self.emit("call void @llvm.amdgcn.s.barrier()")
        self.emit('fence syncscope("workgroup") acquire')
        self.decls.add("declare void @llvm.amdgcn.s.barrier()")
        self.r[u] = ""
      elif op is Ops.VECTORIZE:
        cur = "poison" if len(src) > 1 else None
        if cur is None:  # broadcast of one scalar
          cur = "poison"
        for i in range(dt.count):
          s = src[i] if len(src) > 1 else src[0]
          nv = self._new()
          self.emit(f"{nv} = insertelement {ltype(dt)} {cur}, {ltype(s.dtype)} {self.val(s)}, i32 {i}")
          cur = nv
        self.r[u] = cur
      elif op is Ops.GEP:
        out = self._new()
        self.emit(f"{out} = extractelement {ltype(src[0].dtype)} {self.val(src[0])}, i32 {u.arg[0]}")
        self.r[u] = out
      elif op.name == "WMMA": self.r[u] = self.wmma(u)
      elif op is Ops.NOOP: self.r[u] = self.val(src[0])
      else: self.r[u] = self.alu(u, [self.val(s) for s in src])
    threads = math.prod(self.workgroup_size(specials))
    attrs = (f'"amdgpu-flat-work-group-size"="1,{threads}" "uniform-work-group-size"="true" '
             f'"target-cpu"="{self.arch}" "amdgpu-no-implicitarg-ptr"')
    body = ["entry:", *("  " + a for a in allocas), *self._lines, "  ret void"]
    if self.helpers: self.decls.update(f64math.DECLS)
    if self.f32_helpers: self.decls.update(f64math.F32_DECLS)
    helpers = [f64math.HELPERS[h]() for h in sorted(self.helpers)] + [f64math.F32_HELPERS[h]() for h in sorted(self.f32_helpers)]
    out = ['target triple = "amdgcn-amd-amdhsa"', *self.globals_, *sorted(self.decls), *helpers, "",
           f"define amdgpu_kernel void @{name}({', '.join(params)}) #0 {{", *body, "}", f"attributes #0 = {{ nounwind {attrs} }}", ""]
    return "\n".join(out)

  def render_load(self, u: UOp, gates: dict[UOp, str]) -> str:
    idx = u.src[0]
    dt = u.dtype
    ptr = f"{ltype(idx.src[0].dtype) if idx.op is Ops.INDEX else ltype(idx.dtype)} {self.val(idx)}"
    if idx not in gates: return self.load(ptr, dt)
    pre = self._block
    n = self._new("g")[1:]
    self.emit(f"br i1 {gates[idx]}, label %{n}_then, label %{n}_join")
    self.label(f"{n}_then")
    v = self.load(ptr, dt)
    then_end = self._block
    self.br(f"{n}_join")
    self.label(f"{n}_join")
    out = self._new()
    self.emit(f"{out} = phi {ltype(dt)} [ {v}, %{then_end} ], [ {render_const(0, dt) if dt.count == 1 else 'zeroinitializer'}, %{pre} ]")
    return out

  def special(self, u: UOp) -> str:
    name = u.arg
    if not (isinstance(name, str) and re.fullmatch(r"[gl]idx[012]", name)): raise ValueError(f"SPECIAL {name!r}: expected gidx0..2 or lidx0..2")
    axis = "xyz"[int(name[-1])]
    fn = f"llvm.amdgcn.{'workgroup' if name[0] == 'g' else 'workitem'}.id.{axis}"
    self.decls.add(f"declare i32 @{fn}()")
    out = self._new("id")
    self.emit(f"{out} = call i32 @{fn}()")
    if u.dtype != dtypes.int32: return self.cast(out, dtypes.int32, u.dtype)
    return out

  def workgroup_size(self, specials: list[UOp]) -> tuple[int, int, int]:
    """Work-items per workgroup from the lidx SPECIALs (constants: the backend compiles for a fixed upper bound)."""
    block = [1, 1, 1]
    for s in specials:
      if s.arg[0] != "l" or not s.src: continue
      size = s.src[0]
      if size.op is not Ops.CONST: raise NotImplementedError(f"SPECIAL {s.arg}: workgroup size must be a constant, got {size}")
      block[int(s.arg[-1])] = int(size.arg)
    if math.prod(block) > self.caps.local_max_threads: raise ValueError(f"workgroup of {block} threads exceeds {self.caps.local_max_threads}")
    return block[0], block[1], block[2]

  def wmma(self, u: UOp) -> str:
    a, b, c = u.src[:3]
    kind = self.target["tc"]
    key = (kind, a.dtype.count, c.dtype.count, ltype(a.dtype.scalar()))
    if key not in TC_INTRINSICS: raise NotImplementedError(f"AMDGPU renderer: no tensor core on {self.arch} for {u.arg} "
                                                          f"(a {a.dtype}, c {c.dtype}); it has {[k for k in TC_INTRINSICS if k[0] == kind]}")
    fn, tail = TC_INTRINSICS[key]
    ta, tc = ltype(a.dtype), ltype(c.dtype)
    av, bv = self.val(a), self.val(b)
    if "v8i16" in fn or ("bf16" in fn and kind == "mfma") or (kind == "wmma_gfx11" and "bf16" in fn):  # bf16 operands travel as i16 vectors
      ti = f"<{a.dtype.count} x i16>"
      av2, bv2 = self._new(), self._new()
      self.emit(f"{av2} = bitcast {ta} {av} to {ti}")
      self.emit(f"{bv2} = bitcast {ta} {bv} to {ti}")
      av, bv, ta = av2, bv2, ti
    targs = ", i32, i32, i32" if tail else ""
    self.decls.add(f"declare {tc} @{fn}({ta}, {ta}, {tc}{targs})")
    out = self._new()
    self.emit(f"{out} = call {tc} @{fn}({ta} {av}, {ta} {bv}, {tc} {self.val(c)}{tail})")
    return out


class AMDGPURendererRDNA4(AMDGPURenderer):
  default_arch = "gfx1201"


class AMDGPURendererCDNA3(AMDGPURenderer):
  default_arch = "gfx942"


class AMDGPURendererCDNA2(AMDGPURenderer):
  default_arch = "gfx90a"
