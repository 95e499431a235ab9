"""C-style renderer base: linearized UOps (docs/kernel_ir.md) to C-like source, as rules.

`CStyleRenderer.string_rewrite` is a PatternMatcher of `(UPat, fn)` rules whose functions return source text: the
expression of a value (the driver declares it, `T alu5 = <expr>;`), the expression a later uop uses directly (for
the ops in `INLINE_OPS`: parameters, constants, indexing), or the statement(s) of a control or memory op. A rule gets
the renderer as `ctx`: `ctx.r[u]` is the C name/expression of an already rendered uop (and, before the rule runs,
the name chosen for `u` itself), `ctx.ctype(dt)` the C type. The first rule that returns a string wins, so a
backend extends the base by putting its own rules in front, e.g.

    class MyRenderer(CStyleRenderer):
      string_rewrite = PatternMatcher([(UPat(Ops.SQRT, dtypes.float32, name="x"), lambda ctx, x: f"my_sqrtf({ctx.r[x.src[0]]})")]) \\
        + CStyleRenderer.string_rewrite

A rule returns None to decline (the next rule is tried); an op no rule renders is a NotImplementedError. The syntax
pieces the rules share are data or small methods: `type_map`, `code_for_op` (infix operators), `math_fns`,
`kernel_prefix`, `buffer_prefix`, `restrict`, `special_ids` / `shared_prefix` / `barrier` (GPU targets),
`render_const`, `render_bitcast`, `vector_type`. See docs/backends.md.

Types the target compiler lacks (`emulated`: by default fp8, float16 and bfloat16, the types plain C can't be shown to
have; a subclass removes those its compiler has) are stored as 8/16-bit patterns and computed as float, rounded to the type after every op, with
IEEE/OCP round-to-nearest-even conversions in C (HALF_C, BF16_C, FP8_C).
"""
from __future__ import annotations

import math
import re
from typing import Callable, ClassVar

from plugrad.dtype import AddrSpace, DType, PtrDType, dtypes
from plugrad.runtime.renderer import Renderer
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.upat import PatternMatcher, UPat


def _binop(sym: str) -> Callable[..., str]: return lambda a, b: f"({a}{sym}{b})"


class Stmt(str):
  """A rule result that is complete statement(s) (one per line) rather than the expression of the uop's value."""


INLINE_OPS = frozenset({Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST, Ops.AFTER, Ops.INDEX})  # used in place, never declared
STATEMENT_OPS = frozenset({Ops.RANGE, Ops.END, Ops.IF, Ops.ENDIF, Ops.STORE, Ops.DEFINE_REG, Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.SPECIAL})
UNARY_MATH = (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC)
_VEC_INFIX = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR)


# ***** the base rules *****

def _gate(ctx: CStyleRenderer, idx: UOp) -> str | None: return ctx.r[idx.src[2]] if len(idx.src) > 2 else None


def _vector_load(ctx: CStyleRenderer, x: UOp, idx: UOp) -> str | None:
  """k contiguous elements of a scalar buffer into a vector value (memcpy: no alignment assumed)."""
  if x.dtype.count == 1 or idx.src[0].dtype.base.count != 1: return None
  name, t, g = ctx.r[x], ctx.ctype(x.dtype), _gate(ctx, idx)
  read = ctx.vector_from_storage(name, ctx.r[idx], x.dtype) if ctx._stored(idx.dtype) else \
    f"__builtin_memcpy(&{name}, &{ctx.r[idx]}, sizeof({name}));"
  lines = [f"{t} {name};" if g is None else f"{t} {name} = {ctx.render_const(0, x.dtype)};", ("" if g is None else f"if ({g}) ") + read]
  return Stmt("\n".join(lines))


def _scalar_load(ctx: CStyleRenderer, x: UOp, idx: UOp) -> str:
  mem = ctx.from_storage(ctx.r[idx], idx.dtype)
  return mem if (g := _gate(ctx, idx)) is None else f"({g}?{mem}:{ctx.render_const(0, x.dtype)})"


def _vector_store(ctx: CStyleRenderer, idx: UOp, val: UOp) -> str | None:
  if val.dtype.count == 1 or idx.src[0].dtype.base.count != 1: return None
  st = f"{{ {ctx.ctype(val.dtype)} v_ = {ctx.r[val]}; __builtin_memcpy(&{ctx.r[idx]}, &v_, sizeof(v_)); }}"
  return st if (g := _gate(ctx, idx)) is None else f"if ({g}) {st}"


def _scalar_store(ctx: CStyleRenderer, idx: UOp, val: UOp) -> str:
  st = f"{ctx.r[idx]} = {ctx.to_storage(ctx.r[val], idx.dtype)};"
  return st if (g := _gate(ctx, idx)) is None else f"if ({g}) {st}"


def lane_by_lane(ctx: CStyleRenderer, x: UOp) -> str:
  """A vector op the target has no vector form of: the scalar op rendered on each lane, gathered into a vector."""
  args = [ctx.r[s] for s in x.src]
  holes = tuple(UOp(Ops.NOOP, s.dtype.scalar(), arg=i) for i, s in enumerate(x.src))
  scalar = UOp(x.op, x.dtype.scalar(), holes, x.arg)
  lanes = []
  for lane in range(x.dtype.count):
    for h, a in zip(holes, args): ctx.r[h] = f"{a}[{lane}]"
    lanes.append(ctx.render_uop(scalar))
  return ctx.vector_literal(x.dtype, lanes)


def _vector_alu(ctx: CStyleRenderer, x: UOp) -> str | None:
  """Vector ALU ops (codegen/vectorize.py): C vector extensions compute infix ops lane by lane."""
  if x.dtype.count == 1: return None
  a = [ctx.r[s] for s in x.src]
  if x.op is Ops.CAST: return f"__builtin_convertvector({a[0]}, {ctx.ctype(x.dtype)})"
  if x.op is Ops.RECIPROCAL: return f"({ctx.render_const(1, x.dtype)}/{a[0]})"
  if x.op is Ops.NEG: return f"(-{a[0]})"
  if x.op is Ops.MULACC: return f"(({a[0]}*{a[1]})+{a[2]})"
  if x.op in _VEC_INFIX: return ctx.code_for_op[x.op](*a)
  return lane_by_lane(ctx, x)


def _unary_math(ctx: CStyleRenderer, x: UOp) -> str | None:
  if (fns := ctx.math_fns.get(x.dtype)) is None: return None
  return f"{fns[UNARY_MATH.index(x.op)]}({ctx.r[x.src[0]]})"


def _in_float32(ctx: CStyleRenderer, x: UOp) -> str:
  """A float op on a type without math functions (half-like): the float32 op on the value converted to float."""
  hole = UOp(Ops.NOOP, dtypes.float32, arg=0)
  ctx.r[hole] = f"(float){ctx.r[x.src[0]]}"
  return f"(({ctx.ctype(x.dtype)}){ctx.render_uop(UOp(x.op, dtypes.float32, (hole,), x.arg))})"


def _pow(ctx: CStyleRenderer, x: UOp) -> str:
  fns = ctx.math_fns.get(x.dtype, ctx.math_fns[dtypes.float32])
  return f"(({ctx.ctype(x.dtype)}){fns[5]}({ctx.r[x.src[0]]}, {ctx.r[x.src[1]]}))"


def _infix(ctx: CStyleRenderer, x: UOp) -> str | None:
  if (fn := ctx.code_for_op.get(x.op)) is None: return None
  s = fn(*[ctx.r[s] for s in x.src])
  # C promotes small ints to int: cast back so wraparound matches the dtype
  small = x.op in GroupOp.ALU and x.dtype.itemsize < 4 and x.dtype != dtypes.bool and x.op not in GroupOp.Comparison
  return f"(({ctx.ctype(x.dtype)}){s})" if small else s


def _special(ctx: CStyleRenderer, x: UOp) -> str | None:
  if (ids := ctx.special_ids) is None: return None
  if (m := re.fullmatch(r"([a-z]+)([0-2])", str(x.arg))) is None or m.group(1) not in ids:
    raise ValueError(f"SPECIAL name must be one of {', '.join(f'{k}0..2' for k in ids)}, got {x.arg!r}")
  t = ctx.ctype(x.dtype)
  return f"const {t} {ctx.r[x]} = ({t}){ids[m.group(1)]}.{'xyz'[int(m.group(2))]};"


def _define_local(ctx: CStyleRenderer, x: UOp) -> str | None:
  if ctx.shared_prefix is None: return None
  return f"{ctx.shared_prefix}{ctx.ctype(x.dtype.base)} {ctx.r[x]}[{x.arg[1]}];"


base_rewrite = PatternMatcher([
  # parameters, constants, addresses: used in place
  (UPat(Ops.DEFINE_GLOBAL, name="x"), lambda x: f"data{x.arg}"),
  (UPat(Ops.DEFINE_VAR, name="x"), lambda x: x.arg[0]),
  (UPat(Ops.CONST, name="x"), lambda ctx, x: ctx.render_const(x.arg, x.dtype)),
  (UPat(Ops.AFTER, name="x"), lambda ctx, x: ctx.r[x.src[0]]),
  (UPat(Ops.INDEX, name="x"), lambda ctx, x: f"{ctx.r[x.src[0]]}[{ctx.r[x.src[1]]}]"),
  # control flow
  (UPat(Ops.RANGE, name="x"), lambda ctx, x: f"for ({ctx.ctype(x.dtype)} {ctx.r[x]} = 0; {ctx.r[x]} < {ctx.r[x.src[0]]}; {ctx.r[x]}++) {{"),
  (UPat((Ops.END, Ops.ENDIF)), lambda: "}"),
  (UPat(Ops.IF, name="x"), lambda ctx, x: f"if ({ctx.r[x.src[0]]}) {{"),
  (UPat(Ops.SPECIAL, name="x"), _special),
  (UPat(Ops.BARRIER), lambda ctx: ctx.barrier),
  # memory
  (UPat(Ops.DEFINE_REG, name="x"), lambda ctx, x: f"{ctx.ctype(x.dtype.base)} {ctx.r[x]}[{max(x.dtype.size, 1)}];"),
  (UPat(Ops.DEFINE_LOCAL, name="x"), _define_local),
  (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), allow_any_len=True, name="x"), _vector_load),
  (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), allow_any_len=True, name="x"), _scalar_load),
  (UPat(Ops.STORE, src=(UPat(Ops.INDEX, name="idx"), UPat.var("val"))), _vector_store),
  (UPat(Ops.STORE, src=(UPat(Ops.INDEX, name="idx"), UPat.var("val"))), _scalar_store),
  # vectors
  (UPat(Ops.GEP, name="x"), lambda ctx, x: f"{ctx.r[x.src[0]]}[{x.arg[0]}]"),
  (UPat(Ops.VECTORIZE, name="x"), lambda ctx, x: ctx.vector_literal(x.dtype, [ctx.r[s] for s in x.src])),
  (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}, name="x"), _vector_alu),
  # scalar ALU
  (UPat(Ops.CAST, name="x"), lambda ctx, x: f"(({ctx.ctype(x.dtype)}){ctx.r[x.src[0]]})"),
  (UPat(Ops.BITCAST, name="x"), lambda ctx, x: ctx.render_bitcast(ctx.r[x.src[0]], x.src[0].dtype, x.dtype)),
  (UPat(Ops.NEG, dtypes.bool, name="x"), lambda ctx, x: f"(!{ctx.r[x.src[0]]})"),
  (UPat(Ops.NEG, name="x"), lambda ctx, x: f"(-{ctx.r[x.src[0]]})"),
  (UPat(UNARY_MATH, name="x"), _unary_math),
  (UPat(UNARY_MATH, name="x"), _in_float32),
  (UPat(Ops.POW, name="x"), _pow),
  (UPat(GroupOp.ALU, name="x"), _infix),
])


class CStyleRenderer(Renderer):
  """Renders the kernel IR as C through `string_rewrite` (see the module docstring); subclasses add rules and data."""
  string_rewrite: ClassVar[PatternMatcher] = base_rewrite
  kernel_prefix = "void"
  buffer_prefix = ""
  restrict = "restrict"        # the pointer qualifier of buffer parameters (CUDA spells it __restrict__)
  arg_int_type = "int"
  float_suffix = "f"
  special_ids: ClassVar[dict[str, str] | None] = None  # GPU ids: {"gidx": "blockIdx", "lidx": "threadIdx"} -> gidx0 = blockIdx.x
  shared_prefix: ClassVar[str | None] = None           # declaration prefix of DEFINE_LOCAL arrays ("__shared__ ")
  barrier: ClassVar[str | None] = None                 # the BARRIER statement ("__syncthreads();")
  type_map: dict[DType, str] = {
    dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short", dtypes.uint16: "unsigned short",
    dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long", dtypes.uint64: "unsigned long long",
    dtypes.float16: "_Float16", dtypes.bfloat16: "__bf16", dtypes.float32: "float", dtypes.float64: "double"}  # no fp8: C has none
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

  # dtypes the target compiler lacks: stored as their bit patterns in memory, computed as float, rounded after every op.
  # By default every type plain C can't be shown to have: fp8 (C has none), _Float16 and __bf16 (gcc < 13 has no __bf16,
  # clang < 15 no _Float16 on x86). A renderer whose compiler has one natively takes it out (ClangRenderer probes its
  # compiler; CUDARenderer has them all); a type neither emulated nor in type_map is a NotImplementedError, never bytes.
  emulated: frozenset[DType] = frozenset({dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2})

  def __init__(self, arch: str | None = None) -> None:
    super().__init__(arch)
    self.r: dict[UOp, str] = {}

  # ***** syntax pieces the rules use *****
  def ctype(self, dt: DType) -> str:
    if isinstance(dt, PtrDType):
      if dt.base in self.emulated and dt.addrspace is not AddrSpace.REG: return self.ctype(_STORAGE[dt.base.itemsize]) + "*"
      return self.ctype(dt.base) + "*"
    if dt in self.emulated: return "float"
    if dt.count > 1: return self.vector_type(dt)
    if dt not in self.type_map: raise NotImplementedError(f"{type(self).__name__} has no C type for {dt}")
    return self.type_map[dt]

  def vector_type(self, dt: DType) -> str:
    """The C name of vector type `dt` (renderers with vector types override this and declare it in their prelude)."""
    raise NotImplementedError(f"{type(self).__name__} does not render vector type {dt}")

  def vector_literal(self, dt: DType, lanes: list[str]) -> str:
    """A vector value of type `dt` from one expression per lane (a C compound literal)."""
    return f"(({self.ctype(dt)}){{{', '.join(lanes)}}})"

  def render_const(self, v, dt: DType) -> str:
    """The C literal of constant `v` of type `dt`."""
    if dt.count > 1: return self.vector_literal(dt, [self.render_const(v, dt.scalar())] * dt.count)
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

  def render_bitcast(self, x: str, src: DType, dst: DType) -> str:
    """Reinterpret the bits of `x` (type `src`) as `dst`; emulated types go through their storage bit pattern."""
    if src in self.emulated:  # the value is a float: its bit pattern is the conversion back to storage
      bits, st = f"{_CONV[src][1]}({x})", _STORAGE[src.itemsize]
      return bits if dst == st else self.render_bitcast(bits, st, dst)
    if dst in self.emulated:
      st = _STORAGE[dst.itemsize]
      bits = x if src == st else self.render_bitcast(x, src, st)
      return f"{_CONV[dst][0]}(({self.ctype(st)})({bits}))"
    return f"({{union {{ {self.ctype(src)} a; {self.ctype(dst)} b; }} u_; u_.a = {x}; u_.b;}})"

  def from_storage(self, x: str, ptr: DType) -> str:
    """A value loaded through pointer type `ptr`: emulated types convert their bit pattern to float."""
    return f"{_CONV[ptr.base][0]}({x})" if self._stored(ptr) else x

  def to_storage(self, x: str, ptr: DType) -> str:
    return f"{_CONV[ptr.base][1]}({x})" if self._stored(ptr) else x

  def vector_from_storage(self, name: str, addr: str, dt: DType) -> str:
    """A statement setting vector `name` (the float lanes of emulated `dt`) from the stored elements at `addr`;
    renderers whose capability record has `f16_vectors` say how (no other renderer is given such loads)."""
    raise NotImplementedError(f"{type(self).__name__} has no vector loads of emulated {dt}")

  def _stored(self, ptr: DType) -> bool:
    return isinstance(ptr, PtrDType) and ptr.base in self.emulated and ptr.addrspace is not AddrSpace.REG

  def emulation_prelude(self, src: str) -> str:
    """C helpers for the emulated types that `src` uses (round-to-nearest-even conversions); "" when none."""
    return "\n".join(code for names, code in _PRELUDES if any(n + "(" in src for n in names))

  # ***** the driver *****
  def render_uop(self, u: UOp) -> str:
    """The text the first matching rule gives `u`; NotImplementedError when no rule renders it."""
    if (s := self.string_rewrite.apply(u, self)) is None:
      raise NotImplementedError(f"{type(self).__name__} can't render {u.op} of {u.dtype} ({len(u.src)} sources, arg {u.arg!r})")
    return s

  def name_for(self, u: UOp, n: int) -> str:
    """The C name of the value of the `n`-th uop."""
    if u.op is Ops.RANGE: return f"{'g' if u.arg[1] == 'global' else 'r'}idx{u.arg[0]}"
    if u.op is Ops.DEFINE_REG: return f"acc{u.arg}"
    if u.op is Ops.DEFINE_LOCAL: return str(u.arg[0])
    if u.op is Ops.SPECIAL: return str(u.arg)
    return f"val{n}" if u.op is Ops.LOAD else f"alu{n}"

  def render_body(self, uops: list[UOp]) -> list[str]:
    """The kernel body, one string per line, indented by block depth."""
    self.r = {}
    lines: list[str] = []
    depth = 1
    for n, u in enumerate(uops):
      self.r[u] = self.name_for(u, n)
      s = self.render_uop(u)
      if u.op in INLINE_OPS:
        self.r[u] = s
        continue
      if u.op in (Ops.END, Ops.ENDIF): depth -= 1
      if not (u.op in STATEMENT_OPS or isinstance(s, Stmt) or u.dtype == dtypes.void):
        if u.dtype in self.emulated and u.op in GroupOp.ALU | {Ops.CAST}: s = self.round_emulated(s, u.dtype)
        s = f"{self.ctype(u.dtype)} {self.r[u]} = {s};"
      lines.extend("  " * depth + ln for ln in s.split("\n"))
      if u.op in (Ops.RANGE, Ops.IF): depth += 1
    return lines

  def round_emulated(self, x: str, dt: DType) -> str:
    to_f, from_f = _CONV[dt]
    return f"{to_f}({from_f}({x}))"

  def render_params(self, uops: list[UOp]) -> list[str]:
    params = []
    for u in uops:
      if u.op is Ops.DEFINE_GLOBAL: params.append(f"{self.buffer_prefix}{self.ctype(u.dtype)} {self.restrict} data{u.arg}")
      elif u.op is Ops.DEFINE_VAR: params.append(f"const {self.arg_int_type} {u.arg[0]}")
    return params

  def render(self, name: str, uops: list) -> str:
    body = self.render_body(uops)
    src = f"{self.kernel_prefix} {name}({', '.join(self.render_params(uops))}) {{\n" + "\n".join(body) + "\n}\n"
    return f"{pre}\n{src}" if (pre := self.emulation_prelude(src)) else src


# ***** emulated floats: storage types and round-to-nearest-even conversions *****
_STORAGE = {1: dtypes.uint8, 2: dtypes.uint16}
_CONV = {dtypes.float16: ("pg_h2f", "pg_f2h"), dtypes.bfloat16: ("pg_b2f", "pg_f2b"),
         dtypes.fp8e4m3: ("pg_e4m3_2f", "pg_f2e4m3"), dtypes.fp8e5m2: ("pg_e5m2_2f", "pg_f2e5m2")}

# x86 with F16C (-march=native on every x86 since 2013) converts in hardware (vcvtph2ps/vcvtps2ph, round to nearest
# even; loops of it vectorize); elsewhere the portable forms below
HALF_C = """#if defined(__F16C__)
#include <immintrin.h>
static inline float pg_h2f(unsigned short h) { return _cvtsh_ss(h); }
static inline unsigned short pg_f2h(float f) { return _cvtss_sh(f, 0); }
#else
static inline float pg_h2f(unsigned short h) {  /* branch-free, so loops of it vectorize */
  unsigned int s = (unsigned int)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  union { unsigned int u; float f; } c, z;
  c.u = s | (e == 0x1f ? 0x7f800000u : (e + 112) << 23) | (m << 13);
  z.f = (float)m * 5.9604644775390625e-08f; z.u |= s;  /* zero or subnormal half: m * 2^-24, a normal float (exact) */
  return e ? c.f : z.f;
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
}
#endif"""

BF16_C = """static inline float pg_b2f(unsigned short b) { union { unsigned int u; float f; } c; c.u = (unsigned int)b << 16; return c.f; }
static inline unsigned short pg_f2b(float f) {
  union { float f; unsigned int u; } c; c.f = f;
  if ((c.u & 0x7fffffff) > 0x7f800000) return (unsigned short)((c.u >> 16) | 0x40);
  return (unsigned short)((c.u + 0x7fff + ((c.u >> 16) & 1)) >> 16);
}"""

# OCP 8-bit floats. E4M3 is the "fn" variant: bias 7, no infinities, NaN = S.1111.111, largest finite 448; E5M2 is
# IEEE-like: bias 15, inf = S.11111.00. float -> fp8 rounds to nearest even; a magnitude past the largest finite value
# saturates to +-448 for E4M3 (inf too, as CUDA's __NV_SATFINITE and the PYTHON device do) and becomes +-inf for E5M2
# from 61440 (the halfway point to the next, absent, binade step) up; NaN becomes 0x7f. Subnormals: m * 2^-9 (E4M3)
# and m * 2^-16 (E5M2), rounded by scaling to an integer (exact) and rintf (round half to even).
FP8_C = """static inline float pg_e4m3_2f(unsigned char b) {
  unsigned int s = (unsigned int)(b & 0x80) << 24, e = (b >> 3) & 0xf, m = b & 7;
  union { unsigned int u; float f; } c;
  if (e == 0xf && m == 7) c.u = s | 0x7fc00000;
  else if (e == 0) { c.f = (float)m * 0.001953125f; c.u |= s; }
  else c.u = s | ((e + 120) << 23) | (m << 20);
  return c.f;
}
static inline unsigned char pg_f2e4m3(float f) {
  union { float f; unsigned int u; } c; c.f = f;
  unsigned int s = (c.u >> 24) & 0x80, a = c.u & 0x7fffffff;
  if (a > 0x7f800000) return 0x7f;
  if (a >= 0x43e00000) return (unsigned char)(s | 0x7e);
  if (a < 0x3c800000) { c.u = a; return (unsigned char)(s | (unsigned int)__builtin_rintf(c.f * 512.0f)); }
  return (unsigned char)(s | (((a + 0x7ffff + ((a >> 20) & 1)) >> 20) - (120 << 3)));
}
static inline float pg_e5m2_2f(unsigned char b) {
  unsigned int s = (unsigned int)(b & 0x80) << 24, e = (b >> 2) & 0x1f, m = b & 3;
  union { unsigned int u; float f; } c;
  if (e == 0x1f) c.u = s | 0x7f800000 | (m << 21);
  else if (e == 0) { c.f = (float)m * 0.0000152587890625f; c.u |= s; }
  else c.u = s | ((e + 112) << 23) | (m << 21);
  return c.f;
}
static inline unsigned char pg_f2e5m2(float f) {
  union { float f; unsigned int u; } c; c.f = f;
  unsigned int s = (c.u >> 24) & 0x80, a = c.u & 0x7fffffff;
  if (a > 0x7f800000) return 0x7f;
  if (a >= 0x47700000) return (unsigned char)(s | 0x7c);
  if (a < 0x38800000) { c.u = a; return (unsigned char)(s | (unsigned int)__builtin_rintf(c.f * 65536.0f)); }
  return (unsigned char)(s | (((a + 0xfffff + ((a >> 21) & 1)) >> 21) - (112 << 2)));
}"""

_PRELUDES = ((("pg_h2f", "pg_f2h"), HALF_C), (("pg_b2f", "pg_f2b"), BF16_C),
             (("pg_e4m3_2f", "pg_f2e4m3", "pg_e5m2_2f", "pg_f2e5m2"), FP8_C))
