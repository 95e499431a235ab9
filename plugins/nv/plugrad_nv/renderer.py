"""CUDA C renderer: the linear kernel IR (docs/kernel_ir.md) as an `extern "C" __global__` function for NVRTC.

Rules (`pm_cuda`) in front of core's C-style rules: hardware ids (`SPECIAL gidx0..2` = blockIdx.x/y/z, `lidx0..2` =
threadIdx.x/y/z), workgroup memory (`DEFINE_LOCAL` -> `__shared__` arrays), `BARRIER` -> `__syncthreads()`,
`IF`/`ENDIF` from the base, tensor cores (`WMMA` -> `mma.sync.aligned.m16n8k16` inline PTX, f16/bf16 in, f32
accumulate), CUDA's types (half, __nv_bfloat16, __nv_fp8_*), math functions and bit-exact NaN/inf constants. Vector
values (WMMA fragments) are small structs `pg_<dtype>_<n>` (`pg_float16_8`) with `operator[]`.

The renderer maps nothing to threads itself: codegen's gpudims pass turns ranges into SPECIAL ids and sets
`ProgramSpec.global_size` (blocks per dim) / `local_size` (threads per block), which the engine passes to every launch.
A kernel without SPECIALs is one thread running its loops (`__launch_bounds__(1)`).
"""
from __future__ import annotations

import math
import re

from plugrad.codegen.cstyle import UNARY_MATH, CStyleRenderer, lane_by_lane
from plugrad.codegen.targets import CUDA
from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.upat import PatternMatcher, UPat

FP8 = (dtypes.fp8e4m3, dtypes.fp8e5m2)
HALF_LIKE = (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16, dtypes.float16)
MMA_IN = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}


def mma_shape(tc_name: str) -> tuple[int, int, int]:
  """(M, N, K) of a tensor-core name `WMMA_<M>_<N>_<K>_<in>_<out>` (codegen/tc.py)."""
  if (m := re.fullmatch(r"WMMA_(\d+)_(\d+)_(\d+)_\w+", tc_name)) is None: raise ValueError(f"not a tensor-core name: {tc_name!r}")
  return int(m.group(1)), int(m.group(2)), int(m.group(3))


def _wmma(ctx: CUDARenderer, x: UOp) -> str:
  a, b, c = x.src
  shape, din = mma_shape(x.arg), a.dtype.scalar()
  if shape != (16, 8, 16) or din not in MMA_IN or b.dtype.scalar() != din or x.dtype.scalar() != dtypes.float32 \
     or (a.dtype.count, b.dtype.count, c.dtype.count, x.dtype.count) != (8, 4, 4, 4) or c.dtype != x.dtype:
    raise NotImplementedError(f"CUDA renders mma m16n8k16 f16/bf16 -> f32 with (8, 4, 4) elements per lane, not {x.arg} "
                              f"with a {a.dtype}, b {b.dtype}, c {c.dtype} -> {x.dtype}")
  ctx.wmmas[x.arg] = (din, a.dtype, b.dtype, c.dtype)
  return f"pg_wmma_{x.arg}({ctx.r[a]}, {ctx.r[b]}, {ctx.r[c]})"


def to_fp8(ctx: CUDARenderer, dt: DType, expr: str) -> str:
  """A float expression converted to an fp8 type: E4M3 (no inf) through cuda_fp8.h's saturating constructor, E5M2
  through `pg_e5m2`, which doesn't saturate (overflow is inf, as OCP E5M2 says; the constructor would give 57344)."""
  return f"pg_e5m2({expr})" if dt == dtypes.fp8e5m2 else f"(({ctx.ctype(dt)})({expr}))"


def _fp8_alu(ctx: CUDARenderer, x: UOp) -> str | None:
  """fp8 has no arithmetic in CUDA: compute in float, convert the result back."""
  if x.op in (Ops.CAST, Ops.BITCAST, Ops.WHERE) or not any(s.dtype in FP8 for s in x.src): return None
  f = [f"((float){ctx.r[s]})" if s.dtype in FP8 else ctx.r[s] for s in x.src]
  if x.op in UNARY_MATH: v = f"{ctx.math_fns[dtypes.float32][UNARY_MATH.index(x.op)]}({f[0]})"
  elif x.op is Ops.NEG: v = f"(-{f[0]})"
  elif x.op is Ops.MULACC: v = f"fmaf({f[0]}, {f[1]}, {f[2]})"
  else: v = ctx.code_for_op[x.op](*f)
  return v if x.dtype not in FP8 else to_fp8(ctx, x.dtype, v)


def _cast_through_float(ctx: CUDARenderer, x: UOp) -> str | None:
  """Conversions from or to half-like types go through float (CUDA's conversions between them are ambiguous)."""
  s = x.src[0].dtype
  if x.dtype == dtypes.fp8e5m2: return to_fp8(ctx, x.dtype, f"(float){ctx.r[x.src[0]]}")
  if (s in HALF_LIKE and x.dtype != dtypes.float32) or (x.dtype in HALF_LIKE and s != dtypes.float32):
    return f"(({ctx.ctype(x.dtype)})(float){ctx.r[x.src[0]]})"
  return None


def _vector_load(ctx: CUDARenderer, x: UOp, idx: UOp) -> str | None:
  if x.dtype.count == 1: return None
  g = ctx.r[idx.src[2]] if len(idx.src) > 2 else None
  return f"*(({ctx.ctype(x.dtype)}*)&{ctx.r[idx]})" if g is None else f"({g}?*(({ctx.ctype(x.dtype)}*)&{ctx.r[idx]}):{ctx.render_const(0, x.dtype)})"


def _vector_store(ctx: CUDARenderer, idx: UOp, val: UOp) -> str | None:
  if val.dtype.count == 1: return None
  st = f"*(({ctx.ctype(val.dtype)}*)&{ctx.r[idx]}) = {ctx.r[val]};"
  return st if len(idx.src) <= 2 else f"if ({ctx.r[idx.src[2]]}) {st}"


pm_cuda = PatternMatcher([
  (UPat(Ops.WMMA, name="x"), _wmma),
  (UPat(Ops.BITCAST, name="x"), lambda ctx, x: f"pg_bitcast<{ctx.ctype(x.dtype)}>({ctx.r[x.src[0]]})"),
  # vectors (WMMA fragments): structs, loaded and stored whole, any ALU on them lane by lane
  (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), allow_any_len=True, name="x"), _vector_load),
  (UPat(Ops.STORE, src=(UPat(Ops.INDEX, name="idx"), UPat.var("val"))), _vector_store),
  (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}, name="x"), lambda ctx, x: lane_by_lane(ctx, x) if x.dtype.count > 1 else None),
  (UPat(GroupOp.ALU, name="x"), _fp8_alu),
  (UPat(Ops.RECIPROCAL, name="x"), lambda ctx, x: f"({ctx.render_const(1, x.dtype)}/{ctx.r[x.src[0]]})" if dtypes.is_float(x.dtype) else None),
  (UPat(Ops.MULACC, (dtypes.float32, dtypes.float64), name="x"),
   lambda ctx, x: f"fma{'f' if x.dtype == dtypes.float32 else ''}({ctx.r[x.src[0]]}, {ctx.r[x.src[1]]}, {ctx.r[x.src[2]]})"),
  (UPat(Ops.CAST, name="x"), _cast_through_float),
]) + CStyleRenderer.string_rewrite


def _once(guard: str, lines: list[str]) -> str:
  """Definitions wrapped in an include guard, so that several kernels' sources can be compiled as one unit."""
  return "\n".join([f"#ifndef {guard}", f"#define {guard}", *lines, "#endif"])


class CUDARenderer(CStyleRenderer):
  """CUDA C for NVRTC. `arch` is the target (sm_90 by default)."""
  name, device, suffix = "CUDA", "NV", "CUDA"
  string_rewrite = pm_cuda
  restrict = "__restrict__"
  special_ids = {"gidx": "blockIdx", "lidx": "threadIdx"}
  shared_prefix = "__shared__ __align__(16) "
  barrier = "__syncthreads();"
  caps = CUDA.caps()  # launch limits, shared memory and mma.sync shapes: core's codegen/targets.py record (sm_80+)
  default_arch = "sm_90"  # NVDevice makes a subclass with the GPU's own arch
  type_map = {**CStyleRenderer.type_map, dtypes.bool: "bool", dtypes.float16: "half", dtypes.bfloat16: "__nv_bfloat16",
              dtypes.fp8e4m3: "__nv_fp8_e4m3", dtypes.fp8e5m2: "__nv_fp8_e5m2"}
  math_fns = {dtypes.float32: ("exp2f", "log2f", "sinf", "sqrtf", "truncf", "powf"), dtypes.float64: ("exp2", "log2", "sin", "sqrt", "trunc", "pow")}
  emulated = frozenset()  # CUDA has half, __nv_bfloat16 and the fp8 types natively (type_map)

  def __init__(self, arch: str | None = None) -> None:
    super().__init__(arch or self.default_arch)
    self.vtypes: dict[str, tuple[str, int, int]] = {}
    self.wmmas: dict[str, tuple[DType, DType, DType, DType]] = {}
    if not re.fullmatch(r"sm_\d+a?", self.arch): raise ValueError(f"CUDA arch must look like sm_90, got {self.arch!r}")

  @classmethod
  def accepts_arch(cls, arch: str) -> bool: return re.fullmatch(r"sm_\d+a?", arch) is not None

  # ---- syntax
  def render_const(self, v, dt: DType) -> str:
    if dtypes.is_float(dt) and dt.count == 1 and (math.isnan(v) or math.isinf(v)):
      if dt == dtypes.float64: s = f"__longlong_as_double({'0x7ff8' if math.isnan(v) else ('0xfff0' if v < 0 else '0x7ff0')}000000000000LL)"
      else: s = f"__int_as_float({'0x7fc00000' if math.isnan(v) else ('(int)0xff800000' if v < 0 else '0x7f800000')})"
      if dt in FP8: return to_fp8(self, dt, s)
      return s if dt in (dtypes.float32, dtypes.float64) else f"(({self.ctype(dt)}){s})"
    if dt in FP8: return to_fp8(self, dt, f"{float(v)!r}f")
    return super().render_const(v, dt)

  def vector_type(self, dt: DType) -> str:
    name = f"pg_{dt.scalar().name}_{dt.count}"
    self.vtypes[name] = (self.ctype(dt.scalar()), dt.count, dt.itemsize)
    return name

  def vector_literal(self, dt: DType, lanes: list[str]) -> str: return f"{self.ctype(dt)}{{{', '.join(lanes)}}}"

  # ---- the kernel
  def launch_bound(self, uops: list[UOp]) -> int:
    """Threads per block the kernel is compiled for: the product of its thread-id (lidx) sizes, 1 without any."""
    n = 1
    for u in uops:
      if u.op is Ops.SPECIAL and str(u.arg).startswith("lidx"):
        n *= int(u.src[0].arg) if u.src[0].op is Ops.CONST else self.caps.local_max_threads
    return min(n, self.caps.local_max_threads)

  def render(self, name: str, uops: list) -> str:
    self.vtypes: dict[str, tuple[str, int, int]] = {}
    self.wmmas: dict[str, tuple[DType, DType, DType, DType]] = {}
    body = self.render_body(uops)
    params = self.render_params(uops)  # after the body: vector parameter types register themselves too
    used = {u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype for u in uops}
    used = {d.scalar() for d in used} | {s for _, a, b, c in self.wmmas.values() for s in (a.scalar(), b.scalar())}
    pre = []
    if dtypes.float16 in used: pre.append("#include <cuda_fp16.h>")
    if dtypes.bfloat16 in used: pre.append("#include <cuda_bf16.h>")
    if used & set(FP8): pre.append("#include <cuda_fp8.h>")
    if dtypes.fp8e5m2 in used:
      pre.append(_once("PG_E5M2", ["__device__ __forceinline__ __nv_fp8_e5m2 pg_e5m2(float f) { __nv_fp8_e5m2 r; "
                                   "r.__x = __nv_cvt_float_to_fp8(f, __NV_NOSAT, __NV_E5M2); return r; }"]))
    if any(u.op is Ops.BITCAST for u in uops):
      pre.append(_once("PG_BITCAST", ["template <class D, class S> __device__ __forceinline__ D pg_bitcast(S s) "
                                      "{ D d; memcpy(&d, &s, sizeof(D)); return d; }"]))
    for vname, (t, n, size) in self.vtypes.items():
      pre.append(_once(f"PG_{vname.upper()}", [f"struct __align__({min(size, 16)}) {vname} {{ {t} v[{n}]; "
                                              f"__device__ {t} &operator[](int i) {{ return v[i]; }} "
                                              f"__device__ const {t} &operator[](int i) const {{ return v[i]; }} }};"]))
    for tc, (din, a, b, c) in self.wmmas.items(): pre.append(_once(f"PG_{tc.upper()}", self.render_mma(tc, din, a, b, c)))
    return "\n".join([*pre, f'extern "C" __global__ void __launch_bounds__({self.launch_bound(uops)}) {name}({", ".join(params)}) {{',
                      *body, "}", ""])

  def render_mma(self, tc: str, din: DType, a: DType, b: DType, c: DType) -> list[str]:
    """The WMMA helper of tensor core `tc`: its fragments as 32-bit registers (two 16-bit values each, the lower
    element in the low half, as PTX packs .f16x2/.bf16x2) into one mma.sync."""
    ty, ta, tb, tc_ = MMA_IN[din], self.ctype(a), self.ctype(b), self.ctype(c)
    mma = f"pg_mma_m16n8k16_{ty}"
    return [
      f"__device__ __forceinline__ void {mma}(float *d, const unsigned *a, const unsigned *b, const float *c) {{",
      f'  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, '
      '{%10, %11, %12, %13};"',
      '    : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])',
      '    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));',
      "}",
      f"__device__ __forceinline__ {tc_} pg_wmma_{tc}({ta} a, {tb} b, {tc_} c) {{",
      f"  {tc_} d;",
      f"  {mma}(d.v, (const unsigned *)a.v, (const unsigned *)b.v, c.v);",
      "  return d;",
      "}"]
