"""C-style renderer base: linearized UOps (docs/kernel_ir.md) to C-like source.

Subclasses (the C renderer of the cpu plugin, later CUDA and HIP) set the type names, the kernel prefix, the
parameter syntax and the math function names; the statement structure (loops, accumulators, gated loads and
stores) is shared here.
"""
from __future__ import annotations

import math
from typing import Callable

from plugrad.dtype import AddrSpace, DType, PtrDType, dtypes
from plugrad.runtime.renderer import Renderer
from plugrad.uop.ops import GroupOp, Ops, UOp


def _binop(sym: str) -> Callable[..., str]: return lambda a, b: f"({a}{sym}{b})"


class CStyleRenderer(Renderer):
  """Renders the kernel IR as C. Override `type_map`, `kernel_prefix`, `buffer_prefix`, `code_for_op` as needed."""
  kernel_prefix = "void"
  buffer_prefix = ""
  arg_int_type = "int"
  float_suffix = "f"
  type_map: dict[DType, str] = {
    dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short", dtypes.uint16: "unsigned short",
    dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long", dtypes.uint64: "unsigned long long",
    dtypes.float16: "_Float16", dtypes.bfloat16: "__bf16", dtypes.float32: "float", dtypes.float64: "double",
    dtypes.fp8e4m3: "unsigned char", dtypes.fp8e5m2: "unsigned char"}
  code_for_op: dict[Ops, Callable[..., str]] = {
    Ops.ADD: _binop("+"), Ops.SUB: _binop("-"), Ops.MUL: _binop("*"), Ops.FDIV: _binop("/"), Ops.IDIV: _binop("/"), Ops.MOD: _binop("%"),
    Ops.CMPLT: _binop("<"), Ops.CMPNE: _binop("!="), Ops.CMPEQ: _binop("=="), Ops.AND: _binop("&"), Ops.OR: _binop("|"),
    Ops.XOR: _binop("^"), Ops.SHL: _binop("<<"), Ops.SHR: _binop(">>"),
    Ops.MAX: lambda a, b: f"((({a}>{b})||({a}!={a}))?{a}:{b})", Ops.WHERE: lambda c, a, b: f"({c}?{a}:{b})",
    Ops.MULACC: lambda a, b, c: f"(({a}*{b})+{c})",
    Ops.RECIPROCAL: lambda a: f"(1/{a})"}
  # math functions per float type: (exp2, log2, sin, sqrt, trunc, pow)
  math_fns: dict[DType, tuple[str, ...]] = {
    dtypes.float32: ("__builtin_exp2f", "__builtin_log2f", "__builtin_sinf", "__builtin_sqrtf", "__builtin_truncf", "__builtin_powf"),
    dtypes.float64: ("__builtin_exp2", "__builtin_log2", "__builtin_sin", "__builtin_sqrt", "__builtin_trunc", "__builtin_pow")}

  def ctype(self, dt: DType) -> str:
    if isinstance(dt, PtrDType): return self.ctype(dt.base) + "*"
    if dt.count > 1: raise NotImplementedError(f"{type(self).__name__} does not render vector type {dt}")
    if dt not in self.type_map: raise NotImplementedError(f"{type(self).__name__} has no C type for {dt}")
    return self.type_map[dt]

  def render_const(self, v, dt: DType) -> str:
    if dt == dtypes.bool: return "1" if v else "0"
    if dtypes.is_float(dt):
      if math.isnan(v): s = "__builtin_nanf(\"\")" if dt != dtypes.float64 else "__builtin_nan(\"\")"
      elif math.isinf(v): s = ("-" if v < 0 else "") + ("__builtin_inff()" if dt != dtypes.float64 else "__builtin_inf()")
      else: s = repr(float(v)) + ("" if dt == dtypes.float64 else self.float_suffix)
      return s if dt in (dtypes.float32, dtypes.float64) else f"(({self.ctype(dt)}){s})"
    if dt in (dtypes.int64,): return f"{int(v)}LL"
    if dt in (dtypes.uint64,): return f"{int(v)}ULL"
    if dt == dtypes.uint32: return f"{int(v)}u"
    if dt == dtypes.int32 and v == -2**31: return "(-2147483647-1)"
    return str(int(v)) if dt == dtypes.int32 else f"(({self.ctype(dt)}){int(v)})"

  def render_unary_math(self, op: Ops, a: str, dt: DType) -> str:
    fns = self.math_fns.get(dt)
    if fns is None:  # half-like floats: compute in float32
      return f"(({self.ctype(dt)}){self.render_unary_math(op, f'(float){a}', dtypes.float32)})"
    i = {Ops.EXP2: 0, Ops.LOG2: 1, Ops.SIN: 2, Ops.SQRT: 3, Ops.TRUNC: 4}[op]
    return f"{fns[i]}({a})"

  def render_bitcast(self, x: str, src: DType, dst: DType) -> str:
    return f"({{union {{ {self.ctype(src)} a; {self.ctype(dst)} b; }} u_; u_.a = {x}; u_.b;}})"

  def render_params(self, uops: list[UOp]) -> list[str]:
    params = []
    for u in uops:
      if u.op is Ops.DEFINE_GLOBAL: params.append(f"{self.buffer_prefix}{self.ctype(u.dtype)} restrict data{u.arg}")
      elif u.op is Ops.DEFINE_VAR: params.append(f"const {self.arg_int_type} {u.arg[0]}")
    return params

  def render_body(self, uops: list[UOp]) -> list[str]:
    r: dict[UOp, str] = {}
    gates: dict[UOp, str] = {}
    lines, depth, n = [], 1, 0

    def emit(s: str) -> None: lines.append("  " * depth + s)

    for u in uops:
      op, dt, src = u.op, u.dtype, u.src
      if op is Ops.DEFINE_GLOBAL: r[u] = f"data{u.arg}"
      elif op is Ops.DEFINE_VAR: r[u] = u.arg[0]
      elif op is Ops.CONST: r[u] = self.render_const(u.arg, dt)
      elif op is Ops.RANGE:
        r[u] = f"{'g' if u.arg[1] == 'global' else 'r'}idx{u.arg[0]}"
        emit(self.render_range(u, r[u], r[src[0]]))
        depth += 1
      elif op is Ops.END:
        depth -= 1
        emit("}")
      elif op is Ops.DEFINE_REG:
        r[u] = f"acc{u.arg}"
        emit(f"{self.ctype(dt.base)} {r[u]}[{max(dt.size, 1)}];")
      elif op is Ops.AFTER: r[u] = r[src[0]]
      elif op is Ops.INDEX:
        r[u] = f"{r[src[0]]}[{r[src[1]]}]"
        if len(src) > 2: gates[u] = r[src[2]]
      elif op is Ops.LOAD:
        val = r[src[0]] if src[0] not in gates else f"({gates[src[0]]}?{r[src[0]]}:{self.render_const(0, dt)})"
        r[u] = f"val{n}"
        emit(f"{self.ctype(dt)} {r[u]} = {val};")
      elif op is Ops.STORE:
        st = f"{r[src[0]]} = {r[src[1]]};"
        emit(f"if ({gates[src[0]]}) {st}" if src[0] in gates else st)
      else:
        r[u] = f"alu{n}"
        emit(f"{self.ctype(dt)} {r[u]} = {self.render_alu(u, [r[s] for s in src])};")
      n += 1
    return lines

  def render_range(self, u: UOp, name: str, end: str) -> str:
    """The loop header opening RANGE `u` (a renderer may override it, e.g. to split the outer loop across threads)."""
    return f"for ({self.ctype(u.dtype)} {name} = 0; {name} < {end}; {name}++) {{"

  def render_alu(self, u: UOp, args: list[str]) -> str:
    op, dt = u.op, u.dtype
    if op is Ops.CAST: return f"(({self.ctype(dt)}){args[0]})"
    if op is Ops.BITCAST: return self.render_bitcast(args[0], u.src[0].dtype, dt)
    if op is Ops.NEG: return f"(!{args[0]})" if dt == dtypes.bool else f"(-{args[0]})"
    if op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC): return self.render_unary_math(op, args[0], dt)
    if op is Ops.POW:
      fns = self.math_fns.get(dt, self.math_fns[dtypes.float32])
      return f"(({self.ctype(dt)}){fns[5]}({args[0]}, {args[1]}))"
    if op in self.code_for_op:
      s = self.code_for_op[op](*args)
      # C promotes small ints to int: cast back so wraparound matches the dtype
      return f"(({self.ctype(dt)}){s})" if op in GroupOp.ALU and dt.itemsize < 4 and dt != dtypes.bool and op not in GroupOp.Comparison else s
    raise NotImplementedError(f"{type(self).__name__} can't render {op}")

  def render(self, name: str, uops: list) -> str:
    body = self.render_body(uops)
    return f"{self.kernel_prefix} {name}({', '.join(self.render_params(uops))}) {{\n" + "\n".join(body) + "\n}\n"


def is_local(dt: DType) -> bool: return isinstance(dt, PtrDType) and dt.addrspace is AddrSpace.LOCAL
