"""CUDA C renderer: the linear kernel IR (docs/kernel_ir.md) as an `extern "C" __global__` function for NVRTC.

Global ranges become thread/block ids (docs/nv.md): the innermost global range (the contiguous output axis) runs on
x = blockIdx.x*Lx + threadIdx.x, the next one on y (block threads too when x is narrow), all outer ones folded into
blockIdx.z. A range whose size the block doesn't divide, or whose size is symbolic, is guarded with `if`; a dimension
whose grid could exceed the hardware limit (65535 blocks for y/z) becomes a grid-stride loop, which is correct for any
size. Reduce ranges stay serial loops per thread. The launch geometry is appended to the source as a
`/* plugrad-launch {...} */` comment whose grid entries are expression trees over the kernel's variables
(`launch_dims` evaluates them at launch).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Union

from plugrad.codegen.cstyle import CStyleRenderer
from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.uop.ops import Ops, UOp

Expr = Union[int, str, list]  # int | variable name | [op, a, b]
GRID_YZ_MAX, GRID_X_MAX = 65535, 2**31 - 1
LAUNCH_TAG = "plugrad-launch"
_EXPR_OPS = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.MAX: "max"}


def size_expr(u: UOp) -> Expr | None:
  """An index expression (CONSTs, DEFINE_VARs, + - * // % max) as a JSON-able tree; None if it uses anything else."""
  if u.op is Ops.CONST: return int(u.arg)
  if u.op is Ops.DEFINE_VAR: return u.arg[0]
  if u.op in _EXPR_OPS and len(u.src) == 2:
    a, b = size_expr(u.src[0]), size_expr(u.src[1])
    return None if a is None or b is None else [_EXPR_OPS[u.op], a, b]
  return None


def eval_expr(e: Expr, vals: dict[str, int]) -> int:
  """Evaluate a launch expression; // and % truncate toward zero like the kernel's C."""
  if isinstance(e, int): return e
  if isinstance(e, str):
    if e not in vals: raise RuntimeError(f"launch size needs variable {e!r}, which was not given")
    return vals[e]
  op, a, b = e[0], eval_expr(e[1], vals), eval_expr(e[2], vals)
  if op == "+": return a + b
  if op == "-": return a - b
  if op == "*": return a * b
  if op in ("//", "%", "cdiv"):
    if b == 0: raise ZeroDivisionError(f"launch size expression {e!r} divides by zero with {vals}")
    if op == "cdiv": return -((-a) // b)
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return q if op == "//" else a - q * b
  if op == "max": return max(a, b)
  if op == "min": return min(a, b)
  raise ValueError(f"unknown launch expression op {op!r}")


def parse_launch(src: str) -> dict[str, Any]:
  """The launch metadata the renderer put in `src`; ValueError when it has none."""
  m = re.search(r"/\* " + LAUNCH_TAG + r" (\{.*?\}) \*/", src)
  if m is None: raise ValueError(f"CUDA source has no /* {LAUNCH_TAG} ... */ metadata (was it rendered by CUDARenderer?)")
  return json.loads(m.group(1))


def launch_dims(meta: dict[str, Any], vals: tuple[int, ...] | dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
  """(grid, block) for a launch with the kernel's variable values (a tuple in parameter order, or a name -> value dict)."""
  names = meta.get("vars", [])
  if not isinstance(vals, dict):
    if len(vals) != len(names): raise ValueError(f"kernel takes {len(names)} variable value(s) {names}, got {len(vals)}")
    vals = dict(zip(names, vals))
  grid = tuple(max(1, eval_expr(e, vals)) for e in meta["grid"])
  return grid, tuple(meta["block"])  # type: ignore[return-value]


def _pick_local(size: int | None, vmax: int, cap: int) -> int:
  """Threads per block along a dimension: all of a small constant size, a power of two dividing it, else `cap`."""
  if size is not None:
    if size <= cap: return max(size, 1)
    return next((k for k in (cap, cap // 2, cap // 4, cap // 8) if k >= 32 and size % k == 0), cap)
  return max(1, min(cap, vmax))


def reindent(lines: list[str]) -> list[str]:
  """Indent by brace depth (the thread-mapping headers span several lines, which the base renderer indents as one)."""
  out, d = [], 1
  for ln in "\n".join(lines).split("\n"):
    if not (t := ln.strip()): continue
    lead = len(t) - len(t.lstrip("}"))
    d -= lead
    out.append("  " * d + t)
    d += t.count("{") - (t.count("}") - lead)
  return out


class CUDARenderer(CStyleRenderer):
  """CUDA C for NVRTC. `arch` is the target (sm_90 by default); see the module docstring for the thread mapping."""
  name, device, suffix = "CUDA", "NV", "CUDA"
  has_local, has_shared, supports_float4 = True, False, False
  restrict = "__restrict__"
  global_max, local_max, shared_max = (GRID_X_MAX, GRID_YZ_MAX, GRID_YZ_MAX), (1024, 1024, 64), 48 * 1024
  upcast_max = 16       # outputs/accumulators per thread for codegen/opt.py (register blocking)
  block_threads = 256   # threads per block the launch plan aims for
  grid_x_max, grid_yz_max = GRID_X_MAX, GRID_YZ_MAX  # hardware grid limits (tests lower them to exercise grid-stride loops)
  default_arch = "sm_90"  # NVDevice makes a subclass with the GPU's own arch
  type_map = {**CStyleRenderer.type_map, dtypes.bool: "bool", dtypes.float16: "half", dtypes.bfloat16: "__nv_bfloat16",
              dtypes.fp8e4m3: "__nv_fp8_e4m3", dtypes.fp8e5m2: "__nv_fp8_e5m2"}
  math_fns = {dtypes.float32: ("exp2f", "log2f", "sinf", "sqrtf", "truncf", "powf"), dtypes.float64: ("exp2", "log2", "sin", "sqrt", "trunc", "pow")}

  def __init__(self, arch: str | None = None) -> None:
    super().__init__(arch or self.default_arch)
    if not re.fullmatch(r"sm_\d+a?", self.arch): raise ValueError(f"CUDA arch must look like sm_90, got {self.arch!r}")

  @classmethod
  def accepts_arch(cls, arch: str) -> bool: return re.fullmatch(r"sm_\d+a?", arch) is not None

  # ---- scalars
  def render_const(self, v, dt: DType) -> str:
    if dtypes.is_float(dt) and (math.isnan(v) or math.isinf(v)):
      if dt == dtypes.float64: s = f"__longlong_as_double({'0x7ff8' if math.isnan(v) else ('0xfff0' if v < 0 else '0x7ff0')}000000000000LL)"
      else: s = f"__int_as_float({'0x7fc00000' if math.isnan(v) else ('(int)0xff800000' if v < 0 else '0x7f800000')})"
      return s if dt in (dtypes.float32, dtypes.float64) else f"(({self.ctype(dt)}){s})"
    if dt in (dtypes.fp8e4m3, dtypes.fp8e5m2): return f"(({self.ctype(dt)}){float(v)!r}f)"
    return super().render_const(v, dt)

  def render_bitcast(self, x: str, src: DType, dst: DType) -> str: return f"pg_bitcast<{self.ctype(dst)}>({x})"

  def render_alu(self, u: UOp, args: list[str]) -> str:
    fp8 = (dtypes.fp8e4m3, dtypes.fp8e5m2)
    if u.op is Ops.RECIPROCAL and dtypes.is_float(u.dtype) and u.dtype not in fp8: return f"({self.render_const(1, u.dtype)}/{args[0]})"
    if u.op is Ops.MULACC and u.dtype in (dtypes.float32, dtypes.float64):
      return f"fma{'f' if u.dtype == dtypes.float32 else ''}({args[0]}, {args[1]}, {args[2]})"
    if u.op not in (Ops.CAST, Ops.BITCAST, Ops.WHERE) and any(s.dtype in fp8 for s in u.src):  # fp8 has no arithmetic: compute in float
      f = [f"((float){a})" if s.dtype in fp8 else a for a, s in zip(args, u.src)]
      if u.op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC): v = self.render_unary_math(u.op, f[0], dtypes.float32)
      elif u.op is Ops.NEG: v = f"(-{f[0]})"
      elif u.op is Ops.MULACC: v = f"fmaf({f[0]}, {f[1]}, {f[2]})"
      else: v = self.code_for_op[u.op](*f)
      return v if u.dtype not in fp8 else f"(({self.ctype(u.dtype)})({v}))"
    if u.op is Ops.CAST and u.src[0].dtype in (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16, dtypes.float16) and u.dtype != dtypes.float32:
      return f"(({self.ctype(u.dtype)})(float){args[0]})"  # half-like -> anything through float (avoids ambiguous conversions)
    if u.op is Ops.CAST and u.dtype in (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16, dtypes.float16) and u.src[0].dtype not in (dtypes.float32,):
      return f"(({self.ctype(u.dtype)})(float){args[0]})"
    return super().render_alu(u, args)

  # ---- thread mapping
  def _c(self, e: Expr) -> str:
    if isinstance(e, (int, str)): return str(e)
    if e[0] == "max": return f"max({self._c(e[1])}, {self._c(e[2])})"
    return f"({self._c(e[1])}{'/' if e[0] == '//' else e[0]}{self._c(e[2])})"

  def plan(self, uops: list[UOp]) -> dict[str, Any]:
    """Decide how each global range maps to ids: fills self._open[range] -> C header, returns the launch metadata."""
    g = [u for u in uops if u.op is Ops.RANGE and u.arg[1] == "global"]
    self._open: dict[UOp, str] = {}
    grid: list[Expr] = [1, 1, 1]
    block = [1, 1, 1]
    def info(r: UOp) -> tuple[Expr, int, int | None]:
      e = size_expr(r.src[0])
      vmax = max(int(r.src[0].vmax), 1)
      return (e if e is not None else vmax), vmax, (e if isinstance(e, int) else None)
    def mapped(r: UOp, axis: str, gi: int, lim: int, local: int, cap: int) -> None:
      e, vmax, const = info(r)
      block[gi] = local = _pick_local(const, vmax, cap) if local == 0 else local
      t = self.ctype(r.dtype)
      nm = f"gidx{r.arg[0]}"
      base = f"(({t})blockIdx.{axis}*{local}+({t})threadIdx.{axis})" if local > 1 else f"(({t})blockIdx.{axis})"
      blocks: Expr = (["cdiv", e, local] if local > 1 else e) if not isinstance(e, int) else -(-e // local)
      if -(-vmax // local) <= lim:  # the grid covers the range: one id per iteration, guarded unless it divides exactly
        grid[gi] = blocks
        exact = const is not None and const % local == 0
        self._open[r] = f"const {t} {nm} = {base};\n  " + ("{" if exact else f"if ({nm} < {{END}}) {{")
      else:  # grid-stride loop
        grid[gi] = ["min", blocks, lim]
        step = f"({t})gridDim.{axis}*{local}" if local > 1 else f"({t})gridDim.{axis}"
        self._open[r] = f"for ({t} {nm} = {base}; {nm} < {{END}}; {nm} += {step}) {{"
    if g: mapped(g[-1], "x", 0, self.grid_x_max, 0, self.block_threads)
    if len(g) >= 2:
      ly = 1
      if block[0] < 64:
        _, vy, _ = info(g[-2])
        ly = max(1, min(self.block_threads // block[0], 1 << max(vy - 1, 0).bit_length(), 1024 // block[0]))
      mapped(g[-2], "y", 1, self.grid_yz_max, ly, ly)
    if len(g) >= 3:  # fold every outer range into z
      folded = g[:-2]
      exprs = [info(r) for r in folded]
      total: Expr = exprs[0][0]
      for e, _, _ in exprs[1:]: total = ["*", total, e]
      vtot = math.prod(v for _, v, _ in exprs)
      # a size with no launch expression is decomposed by its upper bound and skipped past its real end (needs a loop)
      unsized = [size_expr(r.src[0]) is None for r in folded]
      direct = vtot <= self.grid_yz_max and not any(unsized)
      grid[2] = total if direct else ["min", total, self.grid_yz_max]
      t = "long long"
      head = "{ const long long zl = blockIdx.z;" if direct else f"for (long long zl = blockIdx.z; zl < {self._c(total)}; zl += gridDim.z) {{"
      for i, r in enumerate(folded):
        stride: Expr = 1
        for e, _, _ in exprs[i + 1:]: stride = e if stride == 1 else ["*", stride, e]
        val = f"(zl/{self._c(stride)})" if i == 0 else f"((zl/{self._c(stride)})%{self._c(exprs[i][0])})"
        t = self.ctype(r.dtype)
        skip = f" if (gidx{r.arg[0]} >= {{END}}) continue;" if unsized[i] else ""
        self._open[r] = (head + "\n  " if i == 0 else "{ ") + f"const {t} gidx{r.arg[0]} = ({t}){val};{skip}"
    return {"grid": grid, "block": block, "vars": [u.arg[0] for u in uops if u.op is Ops.DEFINE_VAR]}

  def render_range(self, u: UOp, name: str, end: str) -> str:
    if u in getattr(self, "_open", {}): return self._open[u].replace("{END}", end)
    return super().render_range(u, name, end)

  def render(self, name: str, uops: list) -> str:
    meta = self.plan(uops)
    body = reindent(self.render_body(uops))
    used = {u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype for u in uops}
    pre = []
    if dtypes.float16 in used: pre.append("#include <cuda_fp16.h>")
    if dtypes.bfloat16 in used: pre.append("#include <cuda_bf16.h>")
    if used & {dtypes.fp8e4m3, dtypes.fp8e5m2}: pre.append("#include <cuda_fp8.h>")
    if any(u.op is Ops.BITCAST for u in uops):
      pre.append("#ifndef PG_BITCAST\n#define PG_BITCAST\n"
                 "template <class D, class S> __device__ __forceinline__ D pg_bitcast(S s) { D d; memcpy(&d, &s, sizeof(D)); return d; }\n#endif")
    threads = math.prod(meta["block"])
    src = "\n".join([*pre, f'extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(self.render_params(uops))}) {{', *body, "}",
                     f"/* {LAUNCH_TAG} {json.dumps(meta, separators=(',', ':'))} */", ""])
    return src
