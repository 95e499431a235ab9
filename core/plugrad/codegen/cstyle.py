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
  restrict = "restrict"        # the pointer qualifier of buffer parameters (CUDA spells it __restrict__)
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

  # dtypes the target compiler lacks: stored as 16-bit patterns in memory, computed as float, rounded after every op
  emulated: frozenset[DType] = frozenset()

  def ctype(self, dt: DType) -> str:
    if isinstance(dt, PtrDType):
      if dt.base in self.emulated and dt.addrspace is not AddrSpace.REG: return "unsigned short*"
      return self.ctype(dt.base) + "*"
    if dt in self.emulated: return "float"
    if dt.count > 1: return self.vector_type(dt)
    if dt not in self.type_map: raise NotImplementedError(f"{type(self).__name__} has no C type for {dt}")
    return self.type_map[dt]

  def vector_type(self, dt: DType) -> str:
    """The C name of vector type `dt` (renderers with vector types override this and declare it in their prelude)."""
    raise NotImplementedError(f"{type(self).__name__} does not render vector type {dt}")

  def render_const(self, v, dt: DType) -> str:
    if dt.count > 1: return f"(({self.ctype(dt)}){{{', '.join([self.render_const(v, dt.scalar())] * dt.count)}}})"
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
    if src in self.emulated:  # the value is a float: its 16-bit pattern is the conversion back to storage
      bits = f"{self._CONV[src][1]}({x})"
      return bits if dst == dtypes.uint16 else self.render_bitcast(bits, dtypes.uint16, dst)
    if dst in self.emulated:
      bits = x if src == dtypes.uint16 else self.render_bitcast(x, src, dtypes.uint16)
      return f"{self._CONV[dst][0]}((unsigned short)({bits}))"
    return self._render_bitcast(x, src, dst)

  def _render_bitcast(self, x: str, src: DType, dst: DType) -> str:
    return f"({{union {{ {self.ctype(src)} a; {self.ctype(dst)} b; }} u_; u_.a = {x}; u_.b;}})"

  def render_params(self, uops: list[UOp]) -> list[str]:
    params = []
    for u in uops:
      if u.op is Ops.DEFINE_GLOBAL: params.append(f"{self.buffer_prefix}{self.ctype(u.dtype)} {self.restrict} data{u.arg}")
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
      elif op is Ops.LOAD and dt.count > 1 and src[0].dtype.base.count == 1:  # k contiguous elements of a buffer
        r[u] = f"val{n}"
        emit(f"{self.ctype(dt)} {r[u]};" if src[0] not in gates else f"{self.ctype(dt)} {r[u]} = {self.render_const(0, dt)};")
        emit((f"if ({gates[src[0]]}) " if src[0] in gates else "") + f"__builtin_memcpy(&{r[u]}, &{r[src[0]]}, sizeof({r[u]}));")
        if (hint := self.load_hint(u, f"&{r[src[0]]}")): emit(hint)
      elif op is Ops.LOAD:
        mem = self._from_storage(r[src[0]], src[0].dtype)
        val = mem if src[0] not in gates else f"({gates[src[0]]}?{mem}:{self.render_const(0, dt)})"
        r[u] = f"val{n}"
        emit(f"{self.ctype(dt)} {r[u]} = {val};")
      elif op is Ops.STORE and src[1].dtype.count > 1 and src[0].dtype.base.count == 1:
        st = f"{{ {self.ctype(src[1].dtype)} v_ = {r[src[1]]}; __builtin_memcpy(&{r[src[0]]}, &v_, sizeof(v_)); }}"
        emit(f"if ({gates[src[0]]}) {st}" if src[0] in gates else st)
      elif op is Ops.STORE:
        st = f"{r[src[0]]} = {self._to_storage(r[src[1]], src[0].dtype)};"
        emit(f"if ({gates[src[0]]}) {st}" if src[0] in gates else st)
      elif op is Ops.GEP:
        r[u] = f"alu{n}"
        emit(f"{self.ctype(dt)} {r[u]} = {r[src[0]]}[{u.arg[0]}];")
      elif op is Ops.VECTORIZE:
        r[u] = f"alu{n}"
        emit(f"{self.ctype(dt)} {r[u]} = (({self.ctype(dt)}){{{', '.join(r[s] for s in src)}}});")
      else:
        r[u] = f"alu{n}"
        expr = self.render_alu(u, [r[s] for s in src])
        if dt in self.emulated and op is not Ops.BITCAST: expr = self._round_emulated(expr, dt)
        emit(f"{self.ctype(dt)} {r[u]} = {expr};")
      n += 1
    return lines

  # ***** emulated 16-bit floats *****
  _CONV = {dtypes.float16: ("pg_h2f", "pg_f2h"), dtypes.bfloat16: ("pg_b2f", "pg_f2b")}

  def _from_storage(self, x: str, ptr: DType) -> str:
    return f"{self._CONV[ptr.base][0]}({x})" if isinstance(ptr, PtrDType) and ptr.base in self.emulated and ptr.addrspace is not AddrSpace.REG else x

  def _to_storage(self, x: str, ptr: DType) -> str:
    return f"{self._CONV[ptr.base][1]}({x})" if isinstance(ptr, PtrDType) and ptr.base in self.emulated and ptr.addrspace is not AddrSpace.REG else x

  def _round_emulated(self, x: str, dt: DType) -> str:
    to_f, from_f = self._CONV[dt]
    return f"{to_f}({from_f}({x}))"

  def emulation_prelude(self, src: str) -> str:
    """C helpers for the emulated types that `src` uses: IEEE half and bfloat16 conversions, round to nearest even."""
    out = []
    if "pg_h2f" in src or "pg_f2h" in src: out.append(HALF_C)
    if "pg_b2f" in src or "pg_f2b" in src: out.append(BF16_C)
    return "\n".join(out)

  def load_hint(self, u: UOp, addr: str) -> str | None:
    """A statement emitted after vector load `u` of address `addr` (e.g. a software prefetch); None for nothing."""
    return None

  def render_range(self, u: UOp, name: str, end: str) -> str:
    """The loop header opening RANGE `u` (a renderer may override it, e.g. to split the outer loop across threads)."""
    return f"for ({self.ctype(u.dtype)} {name} = 0; {name} < {end}; {name}++) {{"

  def render_vector_alu(self, u: UOp, args: list[str]) -> str:
    """A vector ALU op (codegen/vectorize.py): C vector extensions compute +, -, *, /, &, |, ^, <<, >> lane by lane."""
    op, dt = u.op, u.dtype
    if op is Ops.CAST: return f"__builtin_convertvector({args[0]}, {self.ctype(dt)})"
    if op is Ops.RECIPROCAL: return f"({self.render_const(1, dt)}/{args[0]})"
    if op is Ops.NEG: return f"(-{args[0]})"
    if op is Ops.MULACC: return f"(({args[0]}*{args[1]})+{args[2]})"
    if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR): return self.code_for_op[op](*args)
    # anything else lane by lane: the scalar op on each lane, gathered into a vector
    scalar = UOp(op, dt.scalar(), tuple(UOp(Ops.NOOP, s.dtype.scalar()) for s in u.src), u.arg)
    return f"(({self.ctype(dt)}){{{', '.join(self.render_alu(scalar, [f'{a}[{i}]' for a in args]) for i in range(dt.count))}}})"

  def render_alu(self, u: UOp, args: list[str]) -> str:
    op, dt = u.op, u.dtype
    if dt.count > 1: return self.render_vector_alu(u, args)
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
    src = f"{self.kernel_prefix} {name}({', '.join(self.render_params(uops))}) {{\n" + "\n".join(body) + "\n}\n"
    return (self.emulation_prelude(src) + "\n" + src) if self.emulated else src



HALF_C = """static inline float pg_h2f(unsigned short h) {
  unsigned int s = (unsigned int)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, b;
  if (e == 0x1f) b = s | 0x7f800000 | (m << 13);
  else if (e) b = s | ((e + 112) << 23) | (m << 13);
  else if (!m) b = s;
  else { e = 113; while (!(m & 0x400)) { m <<= 1; e--; } b = s | (e << 23) | ((m & 0x3ff) << 13); }
  union { unsigned int u; float f; } c; c.u = b; return c.f;
}
static inline unsigned short pg_f2h(float f) {
  union { float f; unsigned int u; } c; c.f = f;
  unsigned int u = c.u, s = (u >> 16) & 0x8000, a = u & 0x7fffffff;
  if (a >= 0x7f800000) return (unsigned short)(s | 0x7c00 | (a > 0x7f800000 ? 0x200 : 0));
  if (a >= 0x477ff000) return (unsigned short)(s | 0x7c00);
  if (a < 0x38800000) {  /* subnormal or zero half: round the shifted mantissa to nearest even */
    if (a < 0x33000000) return (unsigned short)s;
    unsigned int m = (a & 0x7fffff) | 0x800000, sh = 126 - (a >> 23), r = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (unsigned short)(s | r);
  }
  unsigned int r = a + 0xfff + ((a >> 13) & 1);
  return (unsigned short)(s | ((r - 0x38000000) >> 13));
}"""

BF16_C = """static inline float pg_b2f(unsigned short b) { union { unsigned int u; float f; } c; c.u = (unsigned int)b << 16; return c.f; }
static inline unsigned short pg_f2b(float f) {
  union { float f; unsigned int u; } c; c.f = f;
  if ((c.u & 0x7fffffff) > 0x7f800000) return (unsigned short)((c.u >> 16) | 0x40);
  return (unsigned short)((c.u + 0x7fff + ((c.u >> 16) & 1)) >> 16);
}"""
