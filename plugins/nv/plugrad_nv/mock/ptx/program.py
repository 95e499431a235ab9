"""PTX syntax trees -> compiled programs: register slots with their storage types, symbols of every state space,
basic blocks of closures (built by plugrad_nv.mock.ptx.ops) and their terminators.

A compiled `Program` holds one `CFunc` per `.entry`/`.func`. Functions are compiled once per PTX text (the module
cache in plugrad_nv.mock.ptx.machine) and run many times: nothing here depends on a launch or a device. Addresses
that do (module globals, each kernel's shared-memory layout) are read at run time from per-launch tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from plugrad_nv.mock.ptx import parser as P

# numpy storage of each PTX type: halves and packed pairs are kept as raw bits
NP: dict[str, np.dtype] = {k: np.dtype(v) for k, v in {
  "pred": np.bool_, "b8": np.uint8, "u8": np.uint8, "s8": np.int8, "b16": np.uint16, "u16": np.uint16, "s16": np.int16,
  "f16": np.uint16, "bf16": np.uint16, "e4m3x2": np.uint16, "e5m2x2": np.uint16, "b32": np.uint32, "u32": np.uint32,
  "s32": np.int32, "f32": np.float32, "f16x2": np.uint32, "bf16x2": np.uint32, "tf32": np.uint32, "b64": np.uint64,
  "u64": np.uint64, "s64": np.int64, "f64": np.float64}.items()}
SIGNED = {"s8", "s16", "s32", "s64"}
UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
SINT = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}
SPECIAL_REGS = {f"%{n}.{c}" for n in ("tid", "ntid", "ctaid", "nctaid") for c in "xyz"} | {
  "%laneid", "%warpid", "%nwarpid", "%smid", "%nsmid", "%gridid", "%clock", "%clock_hi", "%clock64", "%globaltimer",
  "%globaltimer_lo", "%globaltimer_hi", "%lanemask_eq", "%lanemask_le", "%lanemask_lt", "%lanemask_ge", "%lanemask_gt",
  "%dynamic_smem_size", "%total_smem_size", "%aggr_smem_size"}
SHARED_WINDOW = 1 << 48   # generic addresses of the shared window: SHARED_WINDOW + shared offset
LOCAL_WINDOW = 2 << 48    # ... and of the local window
WINDOW_SIZE = 1 << 32
SHARED_LIMIT = 48 * 1024  # static shared memory a block may declare (sm_80, sm_90 without the opt-in attribute)


class Unimplemented(NotImplementedError):
  """An instruction (or form of one) the interpreter does not implement; names the PTX line."""


class PTXError(ValueError):
  """The PTX is well-formed text but not a valid program (undeclared register, unknown label, ...)."""


def bitconv(src: np.dtype, dst: np.dtype, signed: bool) -> Callable[[Any], Any] | None:
  """Converter of register bits between two storage types, as PTX's relaxed type rules allow: the same size is a
  reinterpretation, a narrower destination keeps the low bits, a wider one is sign- (`signed`) or zero-extended.
  None when nothing needs converting."""
  src, dst = np.dtype(src), np.dtype(dst)
  if src == dst: return None
  if dst == np.bool_: return lambda v: np.asarray(v) != 0
  if src == np.bool_: return lambda v: np.asarray(v).astype(dst)
  if src.itemsize == dst.itemsize: return lambda v: v.view(dst)
  if dst.itemsize < src.itemsize:
    us, ud = UINT[src.itemsize], UINT[dst.itemsize]
    return lambda v: v.view(us).astype(ud).view(dst)
  mid = SINT if signed else UINT
  ms, md = mid[src.itemsize], mid[dst.itemsize]
  return lambda v: v.view(ms).astype(md).view(dst)


@dataclass
class Symbol:
  """A variable: module globals/consts (address per loaded module: `Lanes.gaddr[index]`), shared variables (offset per
  kernel layout: `Lanes.saddr[index]`), local variables (offset in the function's frame), parameters."""
  name: str
  space: str
  size: int
  align: int
  line: int
  index: int = -1          # global/shared: slot in the per-launch address tables; param: position
  offset: int = 0          # local: offset in the frame; kernel param: offset in the parameter buffer
  init: list | None = None
  ptype: str = "b8"
  extern: bool = False
  fn: str = ""             # the function declaring it ("" for module scope)
  kparam: bool = False     # a kernel parameter (read from the launch's parameter buffer)


@dataclass
class Block:
  ops: list[Callable]
  instrs: list[P.Instr]
  term: tuple
  term_instr: P.Instr | None


@dataclass
class CFunc:
  name: str
  kind: str
  line: int
  blocks: list[Block] = field(default_factory=list)
  reg_types: list[np.dtype] = field(default_factory=list)
  local_size: int = 0
  params: list[Symbol] = field(default_factory=list)
  rets: list[Symbol] = field(default_factory=list)
  param_size: int = 0
  calls: set[str] = field(default_factory=set)
  shared: set[int] = field(default_factory=set)     # indices of shared symbols it names
  warp_ops: bool = False                            # uses shfl/vote/mma/redux: lanes must form whole warps
  directives: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class Program:
  module: P.Module
  functions: dict[str, CFunc]
  globals: list[Symbol]       # global/const variables: memory to allocate (and initialize) per loaded module
  shared: list[Symbol]        # shared variables of every scope
  source: str


TERMINATORS = {"bra", "ret", "exit", "trap"}
BARRIERS = {"bar", "barrier"}


class FnCompiler:
  """Compiles one function: resolves names through its scopes, allocates register slots, splits basic blocks."""
  def __init__(self, prog: Program, fn: P.Function, gsyms: dict[str, Symbol], funcs: dict[str, P.Function]) -> None:
    self.prog, self.fn, self.funcs = prog, fn, funcs
    self.cf = CFunc(fn.name, fn.kind, fn.line, directives=dict(fn.directives))
    self.scopes: list[dict[str, tuple]] = [{k: ("sym", v) for k, v in gsyms.items()}]
    self.labels: dict[str, int] = {}

  # ---- names
  def declare(self, v: P.Var) -> None:
    sc = self.scopes[-1]
    for name, count in v.names:
      if v.space == "reg":
        if v.type not in NP: raise PTXError(f"PTX line {v.line}: registers of type .{v.type} are not supported")
        if v.vector != 1: raise Unimplemented(f"PTX line {v.line}: vector registers (.v{v.vector}) are not supported")
        sc[name] = ("reg", len(self.cf.reg_types), v.type)
        self.cf.reg_types.append(NP[v.type])
        continue
      size = P.TYPE_SIZES[v.type] * v.vector * count
      align = v.align or P.TYPE_SIZES[v.type] * v.vector
      sym = Symbol(name, v.space, size, align, v.line, ptype=v.type, extern=v.extern or count == 0, fn=self.fn.name)
      if v.space == "local":
        off = -(-self.cf.local_size // align) * align
        sym.offset, self.cf.local_size = off, off + size
      elif v.space == "shared":
        sym.index = len(self.prog.shared)
        self.prog.shared.append(sym)
      elif v.space == "param": sym.index = -2  # a call-site parameter: per-lane storage in the frame
      else: raise Unimplemented(f"PTX line {v.line}: .{v.space} variables inside a function are not supported")
      sc[name] = ("sym", sym)

  def lookup(self, name: str, line: int) -> tuple:
    for sc in reversed(self.scopes):
      if name in sc: return sc[name]
    if name in SPECIAL_REGS: return ("sreg", name)
    if name in self.labels: return ("label", self.labels[name])
    if name in self.funcs: return ("func", name)
    raise PTXError(f"PTX line {line}: {name} is not declared")

  # ---- compile
  def compile(self, build_op: Callable[[FnCompiler, P.Instr], Any]) -> CFunc:
    cf = self.cf
    for i, p in enumerate(self.fn.params):
      cf.params += self._param_syms(p, "param", i)
    for i, r in enumerate(self.fn.rets): cf.rets += self._param_syms(r, "ret", i)
    items: list[tuple] = []
    self._flatten(self.fn.body, items)
    # basic blocks: a new one at each label and after each terminator / barrier
    blocks: list[list[tuple]] = [[]]
    for it in items:
      if it[0] == "label":
        if blocks[-1]: blocks.append([])
        self.labels[it[1].name] = len(blocks) - 1
      else:
        blocks[-1].append(it)
        base = it[1].opcode.split(".")[0]
        if base in TERMINATORS or (base in BARRIERS and it[1].opcode.split(".")[1:2] != ["warp"]): blocks.append([])
    if not blocks[-1]: blocks.pop()
    for blk in blocks:
      ops, instrs, term, term_instr = [], [], ("fall",), None
      for k, (_, ins, chain) in enumerate(blk):
        self.scopes = chain
        out = build_op(self, ins)
        if isinstance(out, tuple):
          if k != len(blk) - 1: raise PTXError(f"PTX line {ins.line}: control transfer in the middle of a block")
          term, term_instr = out, ins
        else:
          ops.append(out)
          instrs.append(ins)
      cf.blocks.append(Block(ops, instrs, term, term_instr))
    cf.local_size = -(-cf.local_size // 16) * 16
    return cf

  def _param_syms(self, p: P.Var, kind: str, index: int) -> list[Symbol]:
    out = []
    for name, count in p.names:
      size = P.TYPE_SIZES[p.type] * p.vector * max(count, 1)
      align = p.align or min(P.TYPE_SIZES[p.type] * p.vector, 8)
      sym = Symbol(name, "param", size, align, p.line, index=index, ptype=p.type, fn=self.fn.name)
      if self.fn.kind == "entry":
        sym.kparam = True
        sym.offset = -(-self.cf.param_size // align) * align
        self.cf.param_size = sym.offset + size
      self.scopes[0][name] = ("sym", sym)
      out.append(sym)
    return out

  def _flatten(self, sc: P.Scope, out: list[tuple]) -> None:
    self.scopes = self.scopes + [{}]
    chain = self.scopes
    for it in sc.items:
      if isinstance(it, P.Var): self.declare(it)
      elif isinstance(it, P.Label): out.append(("label", it))
      elif isinstance(it, P.Scope):
        self._flatten(it, out)
        self.scopes = chain
      else: out.append(("ins", it, chain))
    self.scopes = chain[:-1]


def compile_module(src: str, build_op: Callable[[FnCompiler, P.Instr], Any]) -> Program:
  """Parse and compile every function of a PTX module. Errors (syntax, undeclared names, unimplemented instructions)
  name the PTX line."""
  mod = P.parse(src)
  prog = Program(mod, {}, [], [], src)
  gsyms: dict[str, Symbol] = {}
  for v in mod.variables:
    for name, count in v.names:
      size = P.TYPE_SIZES[v.type] * v.vector * count
      sym = Symbol(name, v.space, size, v.align or P.TYPE_SIZES[v.type], v.line, init=v.init, ptype=v.type,
                   extern=v.extern or count == 0)
      if v.space == "shared":
        sym.index = len(prog.shared)
        prog.shared.append(sym)
      else:
        if v.space not in ("global", "const"): raise Unimplemented(f"PTX line {v.line}: module-level .{v.space} is not supported")
        sym.index = len(prog.globals)
        prog.globals.append(sym)
      gsyms[name] = sym
  for name, fn in mod.functions.items():
    if fn.body is None: continue
    prog.functions[name] = FnCompiler(prog, fn, gsyms, mod.functions).compile(build_op)
  for name, fn in mod.functions.items():
    if fn.body is None and name not in prog.functions:
      callers = [f.name for f in prog.functions.values() if name in f.calls]
      if callers: raise PTXError(f"PTX line {fn.line}: function {name} is declared but never defined (called from {callers[0]})")
  _propagate(prog)
  return prog


def _propagate(prog: Program) -> None:
  """Each function's shared symbols and warp-op use include those of the functions it calls."""
  changed = True
  while changed:
    changed = False
    for f in prog.functions.values():
      for c in list(f.calls):
        g = prog.functions[c]
        if not g.shared <= f.shared or (g.warp_ops and not f.warp_ops):
          f.shared |= g.shared
          f.warp_ops |= g.warp_ops
          changed = True
