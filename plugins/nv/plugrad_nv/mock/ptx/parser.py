"""PTX text -> a syntax tree (`Module` of `Function`s whose bodies are nested `Scope`s of instructions, labels and
declarations), for the PTX interpreter (plugrad_nv.mock.ptx).

Covers the PTX that NVRTC emits (and what hand-written kernels commonly use): `.version/.target/.address_size`,
module variables in the global/const/shared spaces with initializers, `.entry` and `.func` definitions and
prototypes with parameters and return values, performance directives (`.maxntid`, `.reqntid`, ...), nested `{ }`
scopes, `.reg/.local/.shared/.param` declarations (`%r<13>` ranges), labels, guarded instructions and every operand
form (registers, immediates incl. `0f`/`0d` hex floats, `[base+offset]` addresses, `{a, b}` vectors, `p|q` pairs,
`!p`, call argument lists). Anything else is a `PTXSyntaxError` naming the line.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Union


class PTXSyntaxError(ValueError):
  """The PTX text could not be parsed; the message names the line."""


_TOKEN = re.compile(r"""
  (?P<ws>[ \t\r\n]+) | (?P<comment>//[^\n]*|/\*.*?\*/) | (?P<str>"(?:[^"\\\n]|\\.)*") |
  (?P<hexf>0[fF][0-9a-fA-F]{8}(?![\w$])|0[dD][0-9a-fA-F]{16}(?![\w$])) |
  (?P<dec>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+) |
  (?P<num>0[xX][0-9a-fA-F]+U?|0[bB][01]+U?|\d+U?) |
  (?P<id>[A-Za-z_$%][\w$]*(?:(?:\.|::)[\w$]+)*) |
  (?P<dir>\.[A-Za-z_][\w$]*(?:::[\w$]+)*) |
  (?P<punct>[{}()\[\],;:@!+\-=<>|])
""", re.X | re.S)


@dataclass(frozen=True)
class Tok:
  kind: str
  text: str
  line: int
  pos: int


def tokenize(src: str) -> list[Tok]:
  out, pos, line = [], 0, 1
  while pos < len(src):
    m = _TOKEN.match(src, pos)
    if m is None:
      raise PTXSyntaxError(f"PTX line {line}: unexpected character {src[pos]!r}: {_line_of(src, line)!r}")
    kind = m.lastgroup
    if kind not in ("ws", "comment"): out.append(Tok(kind, m.group(), line, pos))
    line += m.group().count("\n")
    pos = m.end()
  return out


def _line_of(src: str, line: int) -> str:
  lines = src.splitlines()
  return lines[line - 1].strip() if 0 < line <= len(lines) else ""


# ---------------------------------------------------------------------------- syntax tree

@dataclass(frozen=True)
class Reg:
  name: str

@dataclass(frozen=True)
class Imm:
  """An immediate: `value` is an int (kind "int", or the raw bits of kind "f32"/"f64" hex floats) or a float ("float")."""
  value: Union[int, float]
  kind: str

@dataclass(frozen=True)
class Sym:
  name: str

@dataclass(frozen=True)
class Neg:
  """`!%p` as an operand."""
  reg: Reg

@dataclass(frozen=True)
class Addr:
  """`[base+offset]`: base is a register, a symbol or None (an absolute address)."""
  base: Union[Reg, Sym, None]
  offset: int

@dataclass(frozen=True)
class Vec:
  """`{a, b, ...}`; None stands for the sink `_`."""
  items: tuple

@dataclass(frozen=True)
class Pair:
  """`p|q`: the two destinations of setp / shfl."""
  first: Reg
  second: Reg

@dataclass(frozen=True)
class Paren:
  """`(a, b)`: the return / argument lists of `call`."""
  items: tuple

Operand = Union[Reg, Imm, Sym, Neg, Addr, Vec, Pair, Paren, None]


@dataclass
class Instr:
  opcode: str
  operands: list
  guard: tuple[str, bool] | None  # (predicate register, negated)
  line: int
  text: str

@dataclass
class Label:
  name: str
  line: int

@dataclass
class Var:
  """A declaration: `.reg .b32 %r<4>`, `.shared .align 16 .b8 buf[1024]`, `.param .u64 p`, `.global .u32 x = 5`."""
  space: str          # reg, local, shared, param, global, const
  type: str           # b32, f32, pred, u64, ...
  names: list[tuple[str, int]]  # (name, element count; 0 for an unsized extern array, 1 for a scalar)
  align: int
  line: int
  vector: int = 1     # .v2 / .v4 element count
  init: list | None = None
  extern: bool = False

@dataclass
class Scope:
  items: list = field(default_factory=list)

@dataclass
class Function:
  name: str
  kind: str                   # "entry" or "func"
  params: list[Var]
  rets: list[Var]
  body: Scope | None          # None: a prototype
  directives: dict[str, tuple[int, ...]]
  line: int

@dataclass
class Module:
  version: str = ""
  target: tuple[str, ...] = ()
  address_size: int = 64
  variables: list[Var] = field(default_factory=list)
  functions: dict[str, Function] = field(default_factory=dict)


TYPE_SIZES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2, "b32": 4, "u32": 4, "s32": 4,
              "f32": 4, "f16x2": 4, "bf16x2": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8, "b128": 16, "pred": 1,
              "e4m3": 1, "e5m2": 1, "e4m3x2": 2, "e5m2x2": 2, "tf32": 4}
SPACES = ("reg", "local", "shared", "param", "global", "const", "sreg", "tex")
PERF_DIRECTIVES = ("maxntid", "reqntid", "minnctapersm", "maxnctapersm", "maxnreg", "maxclusterrank", "reqnctapercluster",
                   "explicitcluster", "noreturn", "pragma", "blocksareclusters")


# ---------------------------------------------------------------------------- the parser

class Parser:
  def __init__(self, src: str) -> None:
    self.src, self.toks, self.i = src, tokenize(src), 0

  # ---- token helpers
  def err(self, msg: str, tok: Tok | None = None) -> PTXSyntaxError:
    tok = tok or (self.toks[self.i] if self.i < len(self.toks) else (self.toks[-1] if self.toks else Tok("eof", "", 1, 0)))
    return PTXSyntaxError(f"PTX line {tok.line}: {msg}: {_line_of(self.src, tok.line)!r}")

  def peek(self, k: int = 0) -> Tok | None:
    return self.toks[self.i + k] if self.i + k < len(self.toks) else None

  def next(self) -> Tok:
    if self.i >= len(self.toks): raise self.err("unexpected end of the PTX text")
    self.i += 1
    return self.toks[self.i - 1]

  def at(self, text: str) -> bool:
    t = self.peek()
    return t is not None and t.text == text

  def accept(self, text: str) -> bool:
    if self.at(text):
      self.i += 1
      return True
    return False

  def expect(self, text: str) -> Tok:
    t = self.peek()
    if t is None or t.text != text: raise self.err(f"expected {text!r}, got {t.text if t else 'end of text'!r}")
    return self.next()

  def ident(self, what: str = "a name") -> str:
    t = self.next()
    if t.kind != "id": raise self.err(f"expected {what}, got {t.text!r}", t)
    return t.text

  def integer(self) -> int:
    neg = self.accept("-")
    t = self.next()
    if t.kind != "num": raise self.err(f"expected an integer, got {t.text!r}", t)
    v = _int(t.text)
    return -v if neg else v

  # ---- module
  def module(self) -> Module:
    mod = Module()
    while self.peek() is not None:
      t = self.peek()
      if t.text == ".version": self.next(); mod.version = self._version()
      elif t.text == ".target":
        self.next()
        tg = [self.ident("a target")]
        while self.accept(","): tg.append(self.ident("a target"))
        mod.target = tuple(tg)
      elif t.text == ".address_size":
        self.next()
        mod.address_size = self.integer()
        if mod.address_size != 64: raise self.err("only .address_size 64 is supported", t)
      elif t.text in (".file", ".loc"): self._skip_debug()
      elif t.text == ".section": raise self.err(".section (debug information) is not supported: compile without -G/-lineinfo", t)
      else: self._module_item(mod)
    return mod

  def _version(self) -> str:
    t = self.next()
    if t.kind not in ("dec", "num"): raise self.err(f"expected a version number, got {t.text!r}", t)
    return t.text

  def _skip_debug(self) -> None:
    line = self.next().line
    while self.peek() is not None and self.peek().line == line: self.next()

  def _module_item(self, mod: Module) -> None:
    linkage = []
    while self.peek() is not None and self.peek().text in (".visible", ".extern", ".weak", ".common"): linkage.append(self.next().text)
    t = self.peek()
    if t is None: raise self.err("declaration expected after a linkage directive")
    if t.text in (".entry", ".func"):
      fn = self._function()
      if fn.name in mod.functions and mod.functions[fn.name].body is not None and fn.body is not None:
        raise self.err(f"function {fn.name} is defined twice", t)
      if fn.name not in mod.functions or fn.body is not None: mod.functions[fn.name] = fn
    elif t.text in (".global", ".const", ".shared"):
      v = self._var(extern=".extern" in linkage)
      self.expect(";")
      mod.variables.append(v)
    else: raise self.err(f"unexpected {t.text!r} at module level", t)

  def _function(self) -> Function:
    t = self.next()
    kind = t.text[1:]
    rets: list[Var] = []
    if kind == "func" and self.at("("): rets = self._params()
    name = self.ident("a function name")
    params = self._params() if self.at("(") else []
    directives: dict[str, tuple[int, ...]] = {}
    while self.peek() is not None and self.peek().kind == "dir" and self.peek().text[1:] in PERF_DIRECTIVES:
      d = self.next().text[1:]
      if d == "pragma":
        self.next()
        self.accept(";")
        continue
      vals: list[int] = []
      if d not in ("explicitcluster", "noreturn", "blocksareclusters"):
        vals.append(self.integer())
        while self.accept(","): vals.append(self.integer())
      directives[d] = tuple(vals)
    if self.accept(";"): return Function(name, kind, params, rets, None, directives, t.line)
    self.expect("{")
    return Function(name, kind, params, rets, self._scope(), directives, t.line)

  def _params(self) -> list[Var]:
    self.expect("(")
    out: list[Var] = []
    if self.accept(")"): return out
    while True:
      t = self.peek()
      if t is None or t.text not in (".param", ".reg"): raise self.err("expected a .param declaration")
      out.append(self._var())
      if self.accept(")"): return out
      self.expect(",")

  # ---- declarations
  def _var(self, extern: bool = False) -> Var:
    t = self.next()
    space = t.text[1:]
    if space not in SPACES: raise self.err(f"unknown state space {t.text}", t)
    align, vector, typ = 0, 1, None
    while self.peek() is not None and self.peek().kind == "dir":
      d = self.next()
      if d.text == ".align": align = self.integer()
      elif d.text in (".v2", ".v4", ".v8"): vector = int(d.text[2:])
      elif d.text in (".ptr", ".global", ".shared", ".const", ".local"): continue  # .ptr .global .align N kernel-param attributes
      elif d.text[1:] in TYPE_SIZES: typ = d.text[1:]
      else: raise self.err(f"unexpected {d.text} in a declaration", d)
    if typ is None: raise self.err("declaration without a type", t)
    names = self._declarator()
    while self.at(","):
      if self.peek(1) is None or self.peek(1).kind != "id": break  # the next parameter of a list, not another name
      self.next()
      names += self._declarator()
    init = None
    if self.accept("="): init = self._initializer()
    return Var(space, typ, names, align, t.line, vector, init, extern)

  def _declarator(self) -> list[tuple[str, int]]:
    """[(name, element count)]: one entry, or n for a register range `%r<n>` (%r0 .. %r(n-1))."""
    name = self.ident("a variable name")
    if self.accept("<"):
      n = self.integer()
      self.expect(">")
      if not 0 <= n <= 1 << 16: raise self.err(f"register range <{n}> out of bounds")
      return [(f"{name}{k}", 1) for k in range(n)]
    count = 1
    while self.accept("["):
      if self.accept("]"):
        count = 0
        continue
      n = self.integer()
      if n < 0: raise self.err(f"negative array size {n}")
      count *= n
      self.expect("]")
    return [(name, count)]

  def _initializer(self) -> list:
    if not self.accept("{"): return [self._init_value()]
    out: list = []
    if self.accept("}"): return out
    while True:
      if self.at("{"): out += self._initializer()
      else: out.append(self._init_value())
      if self.accept("}"): return out
      self.expect(",")

  def _init_value(self) -> Imm | Sym:
    op = self._operand()
    if isinstance(op, (Imm, Sym)): return op
    if isinstance(op, Reg) and not op.name.startswith("%"): return Sym(op.name)
    raise self.err("initializers must be numbers or symbol names")

  # ---- function bodies
  def _scope(self) -> Scope:
    sc = Scope()
    while True:
      t = self.peek()
      if t is None: raise self.err("missing '}' at the end of a function body")
      if t.text == "}":
        self.next()
        return sc
      if t.text == "{":
        self.next()
        sc.items.append(self._scope())
      elif t.kind == "dir":
        if t.text[1:] in SPACES:
          sc.items.append(self._var())
          self.expect(";")
        elif t.text == ".pragma":
          self.next()
          self.next()
          self.expect(";")
        elif t.text in (".loc", ".file"): self._skip_debug()
        else: raise self.err(f"unexpected directive {t.text} in a function body", t)
      elif t.kind == "id" and self.peek(1) is not None and self.peek(1).text == ":":
        self.next(); self.next()
        sc.items.append(Label(t.text, t.line))
      else: sc.items.append(self._instruction())

  def _instruction(self) -> Instr:
    start = self.peek()
    guard = None
    if self.accept("@"):
      neg = self.accept("!")
      guard = (self.ident("a guard predicate"), neg)
    t = self.next()
    if t.kind != "id": raise self.err(f"expected an instruction, got {t.text!r}", t)
    ops: list = []
    if not self.at(";"):
      ops.append(self._operand())
      while self.accept(","): ops.append(self._operand())
    end = self.expect(";")
    text = " ".join(self.src[start.pos:end.pos + 1].split())
    return Instr(t.text, ops, guard, t.line, text)

  def _operand(self) -> Operand:
    t = self.peek()
    if t is None: raise self.err("expected an operand")
    if t.text == "{":
      self.next()
      items = [self._vec_item()]
      while self.accept(","): items.append(self._vec_item())
      self.expect("}")
      return Vec(tuple(items))
    if t.text == "(":
      self.next()
      items: list = []
      if not self.accept(")"):
        items.append(self._operand())
        while self.accept(","): items.append(self._operand())
        self.expect(")")
      return Paren(tuple(items))
    if t.text == "[": return self._address()
    if t.text == "!":
      self.next()
      return Neg(Reg(self.ident("a predicate")))
    if t.text == "-" or t.kind in ("num", "hexf", "dec"): return self._number()
    if t.kind == "id":
      self.next()
      if t.text == "_": return None
      if self.accept("|"): return Pair(Reg(t.text), Reg(self.ident("a predicate")))
      return Reg(t.text)
    raise self.err(f"unexpected {t.text!r} in an operand", t)

  def _vec_item(self) -> Operand:
    op = self._operand()
    if not (op is None or isinstance(op, (Reg, Imm))): raise self.err("vector elements must be registers, immediates or _")
    return op

  def _number(self) -> Imm:
    neg = self.accept("-")
    t = self.next()
    if t.kind == "hexf":
      bits = int(t.text[2:], 16)
      kind = "f32" if t.text[1] in "fF" else "f64"
      if neg: bits ^= (1 << 31) if kind == "f32" else (1 << 63)
      return Imm(bits, kind)
    if t.kind == "dec": return Imm(-float(t.text) if neg else float(t.text), "float")
    if t.kind != "num": raise self.err(f"expected a number, got {t.text!r}", t)
    v = _int(t.text)
    return Imm(-v if neg else v, "int")

  def _address(self) -> Addr:
    self.expect("[")
    base: Reg | Sym | None = None
    off = 0
    t = self.peek()
    if t is not None and t.kind == "id":
      self.next()
      base = Reg(t.text) if t.text.startswith("%") else Sym(t.text)
      if self.accept("+"): off = self.integer()
      elif self.at("-"): off = self.integer()
    else: off = self.integer()
    self.expect("]")
    return Addr(base, off)


def _int(text: str) -> int:
  t = text.rstrip("U")
  if t[:2] in ("0x", "0X"): return int(t[2:], 16)
  if t[:2] in ("0b", "0B"): return int(t[2:], 2)
  if len(t) > 1 and t[0] == "0": return int(t, 8)  # PTX octal literals
  return int(t)


def parse(src: str) -> Module:
  """Parse PTX source text; PTXSyntaxError names the line of anything unexpected."""
  if not isinstance(src, str): raise TypeError(f"PTX source must be str, got {type(src).__name__}")
  return Parser(src).module()


def float_bits_to_float(imm: Imm) -> float:
  """The value of a hex-float immediate."""
  if imm.kind == "f32": return struct.unpack("<f", struct.pack("<I", imm.value & 0xFFFFFFFF))[0]
  if imm.kind == "f64": return struct.unpack("<d", struct.pack("<Q", imm.value & 0xFFFFFFFFFFFFFFFF))[0]
  return float(imm.value)
