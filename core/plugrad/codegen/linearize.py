"""Linearize a kernel AST into the flat UOp program that renderers and the PYTHON device consume.

The AST is SINK(STORE(INDEX(DEFINE_GLOBAL, idx[, gate]), value), ...) whose values use RANGE loop variables
(arg = (id, "global" | "reduce")) and REDUCE(value, *ranges, arg=op) nodes. The output list opens every
global range first (in id order), then emits each node after its sources. A REDUCE becomes an accumulator:

  DEFINE_REG acc; STORE(INDEX(acc, 0), identity); RANGE r...; <body>; STORE(INDEX(acc, 0), acc OP body);
  END r...; LOAD(INDEX(AFTER(acc, END), 0))

REDUCEs over the same ranges that can run together share one loop nest (one accumulator each: this is what register
blocking in codegen/opt.py relies on), and a float ADD of a product updates with MULACC(a, b, acc) (a sum of
products with one MULACC per product).
Loop-invariant parts of a reduce body are emitted before its loops, so a value is only used inside the scope
that declared it. `dtypes.index` is lowered to int32 (int64 when some index value does not fit in int32).
See docs/kernel_ir.md for the contract.
"""
from __future__ import annotations

import sys
from typing import Callable, TypeVar

from plugrad.dtype import AddrSpace, DType, dtypes
from plugrad.uop.ops import GroupOp, Ops, UOp

T = TypeVar("T")


def reduce_identity(op: Ops, dt: DType):
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtypes.min(dt)
  raise ValueError(f"no identity for reduce op {op}")


class Linearizer:
  def __init__(self, ast: UOp):
    self.ast = ast
    idx_nodes = [n for n in ast.toposort() if n.dtype == dtypes.index]
    big = any(n.vmin < -2**31 or n.vmax >= 2**31 for n in idx_nodes)
    self.idx_dtype = dtypes.int64 if big else dtypes.int32
    self.out: list[UOp] = []
    self.done: dict[UOp, UOp] = {}
    self.rsets: dict[UOp, frozenset[UOp]] = {}
    self.open: set[UOp] = set()
    self.reduces: dict[UOp, bool] = {}
    self.n_acc = 0

  def rset(self, n: UOp) -> frozenset[UOp]:
    """The RANGEs `n` depends on that are still open at `n` (a REDUCE closes its own)."""
    if (r := self.rsets.get(n)) is not None: return r
    for x in n.toposort(gate=lambda y: y not in self.rsets):  # only the part not computed before (was quadratic)
      if x in self.rsets: continue
      r = frozenset().union(*(self.rsets[s] for s in x.src)) if x.src else frozenset()
      if x.op is Ops.RANGE: r = r | {x}
      if x.op is Ops.REDUCE: r = r - set(x.src[1:])
      self.rsets[x] = r
    return self.rsets[n]

  def identity(self, op: Ops, dt: DType) -> UOp:
    """The reduce identity of `op` as a value of `dt` (a VECTORIZE of scalar constants for a vector accumulator)."""
    if dt.count == 1: return UOp.const(dt, reduce_identity(op, dt))
    return UOp(Ops.VECTORIZE, dt, (UOp.const(dt.scalar(), reduce_identity(op, dt.scalar())),) * dt.count)

  def dt(self, d: DType) -> DType: return self.idx_dtype if d == dtypes.index else d

  def push(self, n: UOp) -> UOp:
    self.out.append(n)
    return n

  def emit(self, node: UOp) -> UOp:
    if (d := self.done.get(node)) is not None: return d
    if node.op is Ops.REDUCE: return self.emit_reduce(node)
    new_src = self.emit_srcs(node.src) if node.op in GroupOp.ALU else tuple(self.emit(s) for s in node.src)
    n = UOp(node.op, self.dt(node.dtype), new_src, node.arg, node.tag)
    self.done[node] = self.push(n)
    return n

  def has_reduce(self, n: UOp) -> bool:
    if (r := self.reduces.get(n)) is None:
      for x in n.toposort(gate=lambda y: y not in self.reduces):
        if x not in self.reduces: self.reduces[x] = x.op is Ops.REDUCE or any(self.reduces[s] for s in x.src)
      r = self.reduces[n]
    return r

  def emit_srcs(self, srcs: tuple[UOp, ...]) -> tuple[UOp, ...]:
    """An ALU op's `srcs` emitted, those with a REDUCE first: the others are then computed after its loops and aren't
    live across them (a sub-block's scale times its sum of products: the scale is read after the sum; 14 stack slots
    used instead of 30 in an 8-lane Q5_0 product, which ran 10% slower). A STORE's address keeps its place before the
    loops, so the matmul and convolution tiles' code stays as it was."""
    for s in srcs:
      if self.has_reduce(s): self.emit(s)
    return tuple(self.emit(s) for s in srcs)

  def siblings(self, red: UOp) -> list[UOp]:
    """REDUCEs over exactly `red`'s ranges that can share its loop: computable now and independent of each other."""
    group = [red]
    for x in self.ast.toposort():
      if x.op is not Ops.REDUCE or x is red or x in self.done or x.src[1:] != red.src[1:]: continue
      if not self.rset(x) <= self.open or any(g in x.toposort() or x in g.toposort() for g in group): continue
      group.append(x)
    return group

  def emit_reduce(self, red: UOp) -> UOp:
    """Emit `red` and every sibling REDUCE over the same ranges in one loop nest, each with its own accumulator."""
    ranges = red.src[1:]
    group = self.siblings(red)
    for r in group:
      for n in r.src[0].toposort():  # hoist everything (also inside nested reduces) that doesn't need the new loops
        if n not in self.done and self.rset(n) <= self.open and n.op is not Ops.RANGE: self.emit(n)
    zero = self.emit(UOp.const(self.idx_dtype, 0))
    accs = []
    for r in group:
      dt = self.dt(r.dtype)
      acc = self.push(UOp(Ops.DEFINE_REG, dt.ptr(1, AddrSpace.REG), arg=self.n_acc))
      self.n_acc += 1
      slot = self.push(UOp(Ops.INDEX, acc.dtype, (acc, zero)))
      accs.append((r, dt, acc, slot, self.push(UOp(Ops.STORE, dtypes.void, (slot, self.emit(self.identity(r.arg, dt)))))))
    opened = [self.emit(UOp(Ops.RANGE, r.dtype, r.src, r.arg)) for r in ranges]
    self.open.update(ranges)
    for r, dt, acc, slot, init in accs:
      body = r.src[0]
      wmma = r.arg is Ops.ADD and body.op is Ops.WMMA  # acc + A@B (+0) -> WMMA(a, b, acc)
      cur = self.push(UOp(Ops.LOAD, dt, (slot, init)))  # the init source orders this load after the reset
      if wmma: new = self.push(UOp(Ops.WMMA, dt, (*(self.emit(s) for s in body.src[:2]), cur), body.arg))
      elif r.arg is Ops.ADD and dtypes.is_float(dt): new = self.accumulate(body, cur, dt)
      else: new = self.push(UOp(r.arg, dt, (cur, self.emit(body))))
      self.push(UOp(Ops.STORE, dtypes.void, (slot, new)))
    end = None
    for r in reversed(opened): end = self.push(UOp(Ops.END, dtypes.void, (r,) if end is None else (r, end)))
    self.open.difference_update(ranges)
    for r, dt, acc, slot, init in accs:
      after = self.push(UOp(Ops.AFTER, acc.dtype, (acc, end)))
      self.done[r] = self.push(UOp(Ops.LOAD, dt, (self.push(UOp(Ops.INDEX, acc.dtype, (after, zero))),)))
    return self.done[red]

  def accumulate(self, body: UOp, cur: UOp, dt: DType) -> UOp:
    """cur + body for a float sum. A sum of products (a gradient flowing back through two matmuls: acc + (a*b + c*d))
    updates the accumulator with one MULACC per product (acc + a*b + c*d), other terms with adds: the order of a
    reduction's additions is the kernel's to choose (vector lanes, SPLIT), so regrouping them is allowed."""
    terms, todo = [], [body]
    while todo:
      if (x := todo.pop()).op is Ops.ADD and x not in self.done and x.dtype == body.dtype: todo += reversed(x.src)
      else: terms.append(x)
    for t in terms:
      new = UOp(Ops.MULACC, dt, (*self.emit_srcs(t.src[:2]), cur)) if t.op is Ops.MUL else UOp(Ops.ADD, dt, (cur, self.emit(t)))
      cur = self.push(new)
    return cur

  def run(self) -> list[UOp]:
    topo = self.ast.toposort()
    for n in sorted((n for n in topo if n.op is Ops.DEFINE_GLOBAL), key=lambda n: n.arg): self.emit(n)
    for n in sorted((n for n in topo if n.op is Ops.DEFINE_VAR), key=lambda n: n.arg[0]): self.emit(n)
    for n in sorted((n for n in topo if n.op is Ops.SPECIAL), key=lambda n: n.arg): self.emit(n)  # GPU ids (codegen/gpudims.py)
    for n in sorted((n for n in topo if n.op is Ops.DEFINE_LOCAL), key=lambda n: n.arg): self.emit(n)
    globals_ = sorted((n for n in topo if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda n: n.arg[0])
    for r in globals_: self.emit(r)
    self.open.update(globals_)
    for s in self.ast.src: self.emit(s)
    end = None
    for r in reversed(globals_): end = self.push(UOp(Ops.END, dtypes.void, (self.done[r],) if end is None else (self.done[r], end)))
    return self.out


def unshare_reduce_ranges(ast: UOp) -> UOp:
  """Give a REDUCE fresh copies of its loop ranges when another REDUCE uses the same RANGE inside a different set of
  enclosing loops (e.g. unrolling an outer reduce made one copy of an inner reduce independent of it): each loop nest
  is then emitted once, in its own scope."""
  while True:
    reds = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    if len({r for red in reds for r in red.src[1:]}) == sum(len(red.src) - 1 for red in reds): return ast  # nothing shared
    lin, first, clash = Linearizer(ast), {}, None
    for red in reds:
      ctx = lin.rset(red)
      for r in red.src[1:]:
        if first.setdefault(r, ctx) != ctx: clash = red
      if clash is not None: break
    if clash is None: return ast
    nid = max(n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE) + 1
    fresh = {r: UOp(Ops.RANGE, r.dtype, r.src, (nid + i, r.arg[1])) for i, r in enumerate(clash.src[1:])}
    ast = ast.substitute({clash: UOp(Ops.REDUCE, clash.dtype, (clash.src[0].substitute(fresh), *fresh.values()), clash.arg)})


def _deep(fn: Callable[[UOp], T], ast: UOp) -> T:
  """fn(ast) with room for the recursion of deep kernels (the emitter recurses along the value chains)."""
  if ast.op is not Ops.SINK: raise ValueError(f"linearize needs a SINK kernel AST, got {ast.op}")
  old = sys.getrecursionlimit()
  sys.setrecursionlimit(max(old, 20000))
  try: return fn(ast)
  finally: sys.setrecursionlimit(old)


def unshare_ranges(ast: UOp) -> UOp:
  """`unshare_reduce_ranges` of a kernel AST (codegen's "reduce ranges" pass)."""
  return _deep(unshare_reduce_ranges, ast)


def linearize_program(ast: UOp) -> list[UOp]:
  """The flat program of a kernel AST whose reduce ranges are already unshared (codegen's "linearize" pass)."""
  return _deep(lambda a: Linearizer(a).run(), ast)


def linearize(ast: UOp) -> list[UOp]:
  """The flat program for a kernel AST (see the module docstring)."""
  return linearize_program(unshare_ranges(ast))
