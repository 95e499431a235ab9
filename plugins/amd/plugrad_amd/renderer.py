"""AMDGPU renderer: the linear kernel IR (docs/kernel_ir.md) as LLVM IR for the amdgcn-amd-amdhsa target.

No device libraries: hardware ids are the `llvm.amdgcn.workgroup.id.*` / `llvm.amdgcn.workitem.id.*` intrinsics,
math is LLVM's own intrinsics (exp2, log2, sqrt, trunc, fma; sin after our range reduction, f64math.py), barriers are `llvm.amdgcn.s.barrier` between
workgroup-scope fences, tensor cores are `llvm.amdgcn.wmma.*` (RDNA3/4, wave32) and `llvm.amdgcn.mfma.*` (CDNA,
wave64). Buffers are `ptr addrspace(1)`, DEFINE_LOCAL an `addrspace(3)` global, accumulators `addrspace(5)` allocas
(promoted to registers by clang -O3). Loops are blocks with a counter in an alloca; a gated LOAD/STORE branches
around the access so a false gate never touches memory.

The renderer is rule tables, like the C and CUDA renderers (see "rules" below): `string_rewrite` (pm_amd) renders
the program's ops, `alu_decomps` then `alu_rewrite` the ALU ops, `cast_rewrite` conversions. The decompositions are
rules of their own: bfloat16/fp8 arithmetic in float32, fp8 and bf16 conversions by bit manipulation, float16 sin in
float32, pow as exp2(y*log2|x|) with sign rules. They emit LLVM IR, so the C/CUDA renderers can't share them.

The source carries no metadata: launch sizes travel in `ProgramSpec.global_size` (workgroups per dim, symbolic where
the kernel is) / `local_size` (work-items per workgroup), which the engine passes to every launch. The renderer only
checks the work-item ids it is given (gidx0..2 / lidx0..2, a constant workgroup size within `local_max_threads`) and
states the workgroup size to the backend as the `amdgpu-flat-work-group-size` attribute.
"""
from __future__ import annotations

import math
import re
import struct
from typing import Any, ClassVar

import numpy as np

from plugrad.codegen import targets
from plugrad.codegen.targets import GPUTarget
from plugrad.dtype import AddrSpace, DType, PtrDType, dtypes, f32_to_fp8, fp8_to_f32
from plugrad.runtime.renderer import Renderer
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.upat import PatternMatcher, UPat
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


# ---------------------------------------------------------------------------- rules
# The renderer is three rule tables (PatternMatchers of `(UPat, fn)` rules, like codegen/cstyle.py's string rules): a
# rule gets the renderer as `ctx` and the uop `x`, emits LLVM instructions through ctx (ctx.emit, ctx._new and the
# helpers below) and returns the LLVM value of `x` ("" for a uop that has none), or None to decline without emitting
# anything (the next rule is tried). `ctx.val(u)` is the value of a rendered uop. A decomposition renders the ops it
# decomposes into through the same tables, on holes (`ctx.hole(dtype, value)`: a NOOP standing for a value a rule
# already computed). The first rule that returns a value wins, so a subclass extends a table by putting rules in front.

def _src(x: UOp) -> DType: return x.src[0].dtype


# ---- conversions (pm_casts): CAST to x.dtype with C semantics (float -> int truncates; bool is != 0)

def _cast_same(ctx: AMDGPURenderer, x: UOp) -> str | None: return ctx.val(x.src[0]) if _src(x) == x.dtype else None


def _cast_lanes(ctx: AMDGPURenderer, x: UOp) -> str | None:
  src, dst = _src(x), x.dtype
  if src.count == 1 and dst.count == 1: return None
  if src.count != dst.count: raise NotImplementedError(f"AMDGPU renderer: cast {src} -> {dst} changes the lane count")
  return ctx._cast_ins(ctx.val(x.src[0]), src.scalar(), dst.scalar(), ltype(src), ltype(dst))


def _cast_fp8(ctx: AMDGPURenderer, x: UOp) -> str | None:
  """Decomposition: fp8 <-> other types through float32, by bit manipulation (AMDGPURenderer.fp8_cast)."""
  if _src(x) not in FP8 and x.dtype not in FP8: return None
  return ctx.fp8_cast(ctx.val(x.src[0]), _src(x), x.dtype)


def _cast_half_bf16(ctx: AMDGPURenderer, x: UOp) -> str | None:
  """Decomposition: float16 <-> bfloat16 through float32."""
  if {_src(x), x.dtype} != {dtypes.float16, dtypes.bfloat16}: return None
  return ctx.cast(ctx.cast(ctx.val(x.src[0]), _src(x), dtypes.float32), dtypes.float32, x.dtype)


def _cast_bf16(ctx: AMDGPURenderer, x: UOp) -> str | None:
  """Decomposition: bfloat16 <-> float32 as bit operations (the backend can't select every bf16 conversion), other
  types through float32."""
  if dtypes.bfloat16 not in (_src(x), x.dtype): return None
  if _src(x) == dtypes.bfloat16: return ctx.cast(ctx.bf16_to_f32(ctx.val(x.src[0])), dtypes.float32, x.dtype)
  return ctx.f32_to_bf16(ctx.cast(ctx.val(x.src[0]), _src(x), dtypes.float32))


def _cast_ins(ctx: AMDGPURenderer, x: UOp) -> str: return ctx._cast_ins(ctx.val(x.src[0]), _src(x), x.dtype, ltype(_src(x)), ltype(x.dtype))


pm_casts = PatternMatcher([(UPat(Ops.CAST, name="x"), fn) for fn in (_cast_same, _cast_lanes, _cast_fp8, _cast_half_bf16, _cast_bf16, _cast_ins)])


# ---- decompositions of ALU ops, tried before an op reserves its result's name (pm_alu_decomps)

EMULATED = (dtypes.bfloat16, *FP8)  # computed in float32


def _in_float32(ctx: AMDGPURenderer, x: UOp) -> str | None:
  """Decomposition: arithmetic on bfloat16 and fp8 in float32 (fp8 has none; the bf16 math intrinsics need float):
  their sources are widened, the op rendered on float32, the result narrowed back (a comparison keeps its bool)."""
  cmp = x.op in GroupOp.Comparison
  if x.op is Ops.WHERE or (_src(x) if cmp else x.dtype).scalar() not in EMULATED: return None
  n = (_src(x) if cmp else x.dtype).count
  f32 = dtypes.float32.vec(n) if n > 1 else dtypes.float32
  src = tuple(ctx.hole(f32, ctx.cast(ctx.val(s), s.dtype, f32)) if s.dtype.scalar() in EMULATED else s for s in x.src)
  res = ctx.render_alu(UOp(x.op, x.dtype if cmp else f32, src, x.arg))
  return res if cmp else ctx.cast(res, f32, x.dtype)


pm_alu_decomps = pm_casts + PatternMatcher([
  (UPat(Ops.BITCAST, name="x"), lambda ctx, x: ctx._bitcast(ctx.val(x.src[0]), _src(x), x.dtype)),
  (UPat(GroupOp.ALU, name="x"), _in_float32),
])


# ---- ALU ops (pm_alu): `ctx.out` is the name reserved for the result (a rule that calls a helper leaves it unused)

def _ins(ctx: AMDGPURenderer, text: str) -> str:
  """`ctx.out = <text>`: the op as one instruction."""
  ctx.emit(f"{ctx.out} = {text}")
  return ctx.out


def _a(ctx: AMDGPURenderer, x: UOp) -> list[str]: return [ctx.val(s) for s in x.src]


def _bool_of(dt: DType) -> str: return ltype(dtypes.bool.vec(dt.count)) if dt.count > 1 else "i1"


UNARY = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}
ARITH = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul"}
BOOL_ARITH = {Ops.ADD: "or", Ops.SUB: "xor", Ops.MUL: "and"}
FCMP, ICMP = {Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}, {Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}


def _sin_f16(ctx: AMDGPURenderer, x: UOp) -> str | None:
  """Decomposition: float16 has no sin, it is computed in float32."""
  if x.dtype.scalar() != dtypes.float16: return None
  f32 = dtypes.float32.vec(x.dtype.count) if x.dtype.count > 1 else dtypes.float32
  return ctx.cast(ctx.intrinsic("sin", f32, [ctx.cast(ctx.val(x.src[0]), x.dtype, f32)]), f32, x.dtype)


def _neg(ctx: AMDGPURenderer, x: UOp) -> str:
  a, lt = ctx.val(x.src[0]), ltype(x.dtype)
  if x.dtype == dtypes.bool: return _ins(ctx, f"xor i1 {a}, true")
  return _ins(ctx, f"fneg {lt} {a}" if is_float(x.dtype) else f"sub {lt} {render_const(0, x.dtype)}, {a}")


def _arith(ctx: AMDGPURenderer, x: UOp) -> str:
  a, b = _a(ctx, x)
  name = BOOL_ARITH[x.op] if x.dtype.scalar() == dtypes.bool else ARITH[x.op]
  return _ins(ctx, f"{'f' if is_float(x.dtype) else ''}{name} {ltype(x.dtype)} {a}, {b}")


def _shift(ctx: AMDGPURenderer, x: UOp) -> str:
  a, b = _a(ctx, x)
  ins = "shl" if x.op is Ops.SHL else "lshr" if dtypes.is_unsigned(x.dtype) else "ashr"
  return _ins(ctx, f"{ins} {ltype(x.dtype)} {a}, {ctx.cast(b, x.src[1].dtype, x.dtype)}")


def _cmp(ctx: AMDGPURenderer, x: UOp) -> str:
  a, b = _a(ctx, x)
  sdt = _src(x)
  if is_float(sdt): return _ins(ctx, f"fcmp {FCMP[x.op]} {ltype(sdt)} {a}, {b}")
  unsigned = dtypes.is_unsigned(sdt) or sdt.scalar() == dtypes.bool
  return _ins(ctx, f"icmp {ICMP.get(x.op) or ('ult' if unsigned else 'slt')} {ltype(sdt)} {a}, {b}")


def _max(ctx: AMDGPURenderer, x: UOp) -> str:
  """max(a, b) as a select; for floats a NaN `a` wins (a > b or a is NaN), as the other backends compute it."""
  out, (a, b), lt, dt = ctx.out, _a(ctx, x), ltype(x.dtype), x.dtype
  c = ctx._new()
  if is_float(dt):
    n, o = ctx._new(), ctx._new()
    ctx.emit(f"{c} = fcmp ogt {lt} {a}, {b}")
    ctx.emit(f"{n} = fcmp uno {lt} {a}, {a}")
    ctx.emit(f"{o} = or {_bool_of(dt)} {c}, {n}")
    c = o
  else: ctx.emit(f"{c} = icmp {'ugt' if dtypes.is_unsigned(dt) or dt.scalar() == dtypes.bool else 'sgt'} {lt} {a}, {b}")
  ctx.emit(f"{out} = select {_bool_of(dt)} {c}, {lt} {a}, {lt} {b}")
  return out


def _mulacc(ctx: AMDGPURenderer, x: UOp) -> str:
  out, (a, b, c), lt = ctx.out, _a(ctx, x), ltype(x.dtype)
  if is_float(x.dtype): return ctx.intrinsic("fma", x.dtype, [a, b, c])
  m = ctx._new()
  ctx.emit(f"{m} = mul {lt} {a}, {b}")
  ctx.emit(f"{out} = add {lt} {m}, {c}")
  return out


pm_alu = PatternMatcher([
  (UPat(Ops.SIN, name="x"), _sin_f16),
  (UPat(tuple(UNARY), name="x"), lambda ctx, x: ctx.intrinsic(UNARY[x.op], x.dtype, [ctx.val(x.src[0])]) if is_float(x.dtype) else None),
  (UPat(Ops.RECIPROCAL, name="x"), lambda ctx, x: _ins(ctx, f"fdiv {ltype(x.dtype)} {render_const(1, x.dtype)}, {ctx.val(x.src[0])}")),
  (UPat(Ops.NEG, name="x"), _neg),
  (UPat(tuple(ARITH), name="x"), _arith),
  (UPat(Ops.FDIV, name="x"), lambda ctx, x: _ins(ctx, f"fdiv {ltype(x.dtype)} {', '.join(_a(ctx, x))}")),
  (UPat((Ops.IDIV, Ops.MOD), name="x"), lambda ctx, x: ctx.int_divmod(x.op, x.dtype, _a(ctx, x))),
  (UPat((Ops.AND, Ops.OR, Ops.XOR), name="x"), lambda ctx, x: _ins(ctx, f"{x.op.name.lower()} {ltype(x.dtype)} {', '.join(_a(ctx, x))}")),
  (UPat((Ops.SHL, Ops.SHR), name="x"), _shift),
  (UPat((Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ), name="x"), _cmp),
  (UPat(Ops.MAX, name="x"), _max),
  (UPat(Ops.WHERE, name="x"), lambda ctx, x: _ins(ctx, "select {} {}, {lt} {}, {lt} {}".format(ltype(_src(x)), *_a(ctx, x), lt=ltype(x.dtype)))),
  (UPat(Ops.MULACC, name="x"), _mulacc),
  (UPat(Ops.POW, name="x"), lambda ctx, x: ctx.pow(x.dtype, _a(ctx, x))),  # a decomposition: exp2/log2 and selects
])


# ---- the program's ops (pm_amd, the renderer's string_rewrite)

def _param(ctx: AMDGPURenderer, decl: str, name: str) -> str:
  ctx.params.append(f"{decl} {name}")
  return name


def _define_local(ctx: AMDGPURenderer, x: UOp) -> str:
  lname, size = (x.arg if isinstance(x.arg, tuple) else (f"lds{x.arg}", x.dtype.size))
  ctx.globals_.append(f"@{lname} = internal addrspace(3) global [{size} x {mtype(x.dtype.base)}] undef, align 16")
  return f"@{lname}"


def _define_reg(ctx: AMDGPURenderer, x: UOp) -> str:
  ctx.allocas.append(f"%acc{x.arg} = alloca [{max(x.dtype.size, 1)} x {mtype(x.dtype.base)}], align 16, addrspace(5)")
  return f"%acc{x.arg}"


def _index(ctx: AMDGPURenderer, x: UOp) -> str:
  base = x.src[0].dtype
  p = ctx._new("p")
  ctx.emit(f"{p} = getelementptr inbounds {mtype(base.base)}, {ltype(base)} {ctx.val(x.src[0])}, {ltype(x.src[1].dtype)} {ctx.val(x.src[1])}")
  if len(x.src) > 2: ctx.gates[x] = ctx.val(x.src[2])
  return p


def _ptr(ctx: AMDGPURenderer, idx: UOp) -> str: return f"{ltype(idx.src[0].dtype) if idx.op is Ops.INDEX else ltype(idx.dtype)} {ctx.val(idx)}"


def _store(ctx: AMDGPURenderer, x: UOp) -> str:
  idx, v = x.src[0], x.src[1]
  ptr = _ptr(ctx, idx)
  if idx in ctx.gates: ctx.gated(ctx.gates[idx], lambda: ctx.store(ptr, ctx.val(v), v.dtype))
  else: ctx.store(ptr, ctx.val(v), v.dtype)
  return ""


def _range(ctx: AMDGPURenderer, x: UOp) -> str:
  """A loop: a counter in an alloca, a head block testing it, the body; END increments and branches back."""
  n = f"r{len(ctx.loops)}_{ctx._new('x')[2:]}"
  cnt, lt = f"%{n}_i", ltype(x.dtype)
  ctx.allocas.append(f"{cnt} = alloca {lt}, addrspace(5)")
  ctx.emit(f"store {lt} 0, ptr addrspace(5) {cnt}")
  ctx.br(f"{n}_head")
  ctx.label(f"{n}_head")
  iv = ctx._new("idx")
  ctx.emit(f"{iv} = load {lt}, ptr addrspace(5) {cnt}")
  c = ctx._new()
  ctx.emit(f"{c} = icmp slt {lt} {iv}, {ctx.val(x.src[0])}")
  ctx.emit(f"br i1 {c}, label %{n}_body, label %{n}_exit")
  ctx.label(f"{n}_body")
  ctx.loops.append((x, n, cnt))
  return iv


def _end(ctx: AMDGPURenderer) -> str:
  r, n, cnt = ctx.loops.pop()
  nx = ctx._new()
  ctx.emit(f"{nx} = add {ltype(r.dtype)} {ctx.r[r]}, 1")
  ctx.emit(f"store {ltype(r.dtype)} {nx}, ptr addrspace(5) {cnt}")
  ctx.br(f"{n}_head")
  ctx.label(f"{n}_exit")
  return ""


def _if(ctx: AMDGPURenderer, x: UOp) -> str:
  n = ctx._new("if")[1:]
  ctx.emit(f"br i1 {ctx.val(x.src[0])}, label %{n}_then, label %{n}_end")
  ctx.label(f"{n}_then")
  ctx.ifs.append(n)
  return ""


def _endif(ctx: AMDGPURenderer) -> str:
  n = ctx.ifs.pop()
  ctx.br(f"{n}_end")
  ctx.label(f"{n}_end")
  return ""


def _barrier(ctx: AMDGPURenderer) -> str:
  ctx.emit('fence syncscope("workgroup") release')
  ctx.emit("call void @llvm.amdgcn.s.barrier()")
  ctx.emit('fence syncscope("workgroup") acquire')
  ctx.decls.add("declare void @llvm.amdgcn.s.barrier()")
  return ""


def _vectorize(ctx: AMDGPURenderer, x: UOp) -> str:
  """insertelement lane by lane (one source: broadcast)."""
  cur = "poison"
  for i in range(x.dtype.count):
    s = x.src[i] if len(x.src) > 1 else x.src[0]
    nv = ctx._new()
    ctx.emit(f"{nv} = insertelement {ltype(x.dtype)} {cur}, {ltype(s.dtype)} {ctx.val(s)}, i32 {i}")
    cur = nv
  return cur


def _gep(ctx: AMDGPURenderer, x: UOp) -> str:
  out = ctx._new()
  ctx.emit(f"{out} = extractelement {ltype(_src(x))} {ctx.val(x.src[0])}, i32 {x.arg[0]}")
  return out


pm_amd = PatternMatcher([
  (UPat(Ops.DEFINE_GLOBAL, name="x"), lambda ctx, x: _param(ctx, f"ptr addrspace(1) noalias align {max(x.dtype.base.itemsize, 1)}", f"%data{x.arg}")),
  (UPat(Ops.DEFINE_VAR, name="x"), lambda ctx, x: _param(ctx, ltype(x.dtype), f"%{x.arg[0]}")),
  (UPat(Ops.CONST, name="x"), lambda x: render_const(x.arg, x.dtype)),
  (UPat(Ops.SPECIAL, name="x"), lambda ctx, x: ctx.special(x)),
  (UPat(Ops.DEFINE_LOCAL, name="x"), _define_local),
  (UPat(Ops.DEFINE_REG, name="x"), _define_reg),
  (UPat(Ops.AFTER, name="x"), lambda ctx, x: ctx.r[x.src[0]]),
  (UPat(Ops.INDEX, name="x"), _index),
  (UPat(Ops.LOAD, name="x"), lambda ctx, x: ctx.render_load(x)),
  (UPat(Ops.STORE, name="x"), _store),
  (UPat(Ops.RANGE, name="x"), _range),
  (UPat(Ops.END), _end),
  (UPat(Ops.IF, name="x"), _if),
  (UPat(Ops.ENDIF), _endif),
  (UPat(Ops.BARRIER), _barrier),
  (UPat(Ops.VECTORIZE, name="x"), _vectorize),
  (UPat(Ops.GEP, name="x"), _gep),
  (UPat(Ops.WMMA, name="x"), lambda ctx, x: ctx.wmma(x)),
  (UPat(Ops.NOOP, name="x"), lambda ctx, x: ctx.val(x.src[0])),
  (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}, name="x"), lambda ctx, x: ctx.render_alu(x)),
])


class AMDGPURenderer(Renderer):
  """LLVM IR for one gfx arch (gfx1100 by default; AMDDevice makes a subclass with the GPU's own arch)."""
  name, device, suffix = "AMDGPU", "AMD", "AMDGPU"
  caps = targets.AMD.caps()
  default_arch = "gfx1100"
  string_rewrite: ClassVar[PatternMatcher] = pm_amd          # the program's ops
  alu_decomps: ClassVar[PatternMatcher] = pm_alu_decomps      # casts, bitcasts, bf16/fp8 arithmetic in float32
  alu_rewrite: ClassVar[PatternMatcher] = pm_alu              # the other ALU ops
  cast_rewrite: ClassVar[PatternMatcher] = pm_casts           # conversions (also those the decompositions make)

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

  def hole(self, dt: DType, value: str) -> UOp:
    """A NOOP of dtype `dt` standing for LLVM value `value` (a source of the uops a decomposition renders)."""
    self._holes += 1
    h = UOp(Ops.NOOP, dt, arg=("hole", self._holes))
    self.r[h] = value
    return h

  # ---- ALU
  def render_alu(self, x: UOp) -> str:
    """An ALU op (or CAST/BITCAST) by the rule tables: decompositions first, then the op's own rule."""
    if (res := self.alu_decomps.apply(x, self)) is not None: return res
    self.out = self._new()
    if (res := self.alu_rewrite.apply(x, self)) is None: raise NotImplementedError(f"AMDGPU renderer can't render {x.op} on {x.dtype}")
    return res

  def cast(self, x: str, src: DType, dst: DType) -> str:
    """LLVM value `x` of `src` converted to `dst` by the conversion rules (cast_rewrite)."""
    if src == dst: return x
    return self.cast_rewrite.apply(UOp(Ops.CAST, dst, (self.hole(src, x),)), self)

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
    self._n, self._holes, self._lines, self._block = 0, 0, [], "entry"
    self.r: dict[UOp, str] = {}
    self.decls: set[str] = set()
    self.helpers: set[str] = set()
    self.f32_helpers: set[str] = set()
    self.globals_: list[str] = []
    self.allocas: list[str] = []
    self.params: list[str] = []
    self.gates: dict[UOp, str] = {}
    self.loops: list[tuple[UOp, str, str]] = []
    self.ifs: list[str] = []
    for u in uops:
      if (res := self.string_rewrite.apply(u, self)) is None: raise NotImplementedError(f"AMDGPU renderer can't render {u.op} on {u.dtype}")
      self.r[u] = res
    specials = [u for u in uops if u.op is Ops.SPECIAL]
    threads = math.prod(self.workgroup_size(specials))
    attrs = (f'"amdgpu-flat-work-group-size"="1,{threads}" "uniform-work-group-size"="true" '
             f'"target-cpu"="{self.arch}" "amdgpu-no-implicitarg-ptr"')
    body = ["entry:", *("  " + a for a in self.allocas), *self._lines, "  ret void"]
    if self.helpers: self.decls.update(f64math.DECLS)
    if self.f32_helpers: self.decls.update(f64math.F32_DECLS)
    helpers = [f64math.HELPERS[h]() for h in sorted(self.helpers)] + [f64math.F32_HELPERS[h]() for h in sorted(self.f32_helpers)]
    out = ['target triple = "amdgcn-amd-amdhsa"', *self.globals_, *sorted(self.decls), *helpers, "",
           f"define amdgpu_kernel void @{name}({', '.join(self.params)}) #0 {{", *body, "}", f"attributes #0 = {{ nounwind {attrs} }}", ""]
    return "\n".join(out)

  def render_load(self, u: UOp) -> str:
    """A LOAD; a gated one branches around the access and yields 0 (a phi) when the gate is false."""
    idx, dt, gates = u.src[0], u.dtype, self.gates
    ptr = _ptr(self, idx)
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
