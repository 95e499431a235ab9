"""Linearize a kernel AST into the flat UOp program that renderers and the PYTHON device consume.

The input is the AST after codegen's "accumulators" pass (codegen/accumulate.py): SINK(STORE(INDEX(DEFINE_GLOBAL,
idx[, gate]), value), ...) whose values use RANGE loop variables (arg = (id, "global" | "reduce")) and whose reductions
are accumulators closed by END(update, *ranges). The linearizer only decides where things go. It opens every global
range first (in id order), then emits each node after its sources; an END becomes its loop nest:

  DEFINE_REG acc; STORE(INDEX(acc, 0), identity); RANGE r...; <update>; STORE(INDEX(acc, 0), new);
  END r...; LOAD(INDEX(AFTER(acc, END), 0))

ENDs over the same ranges that can run together share one loop nest (one accumulator each: this is what register
blocking in codegen/opt.py relies on). Loop-invariant parts of an update are emitted before its loops, so a value is
only used inside the scope that declared it. `dtypes.index` is lowered to int32 (int64 when some index value does not
fit in int32); accumulators are numbered in the order they are emitted. See docs/kernel_ir.md for the contract.
"""
from __future__ import annotations

import sys
from typing import Callable, TypeVar

from plugrad.codegen.accumulate import loop_parts, lower_reduces, on_register, running_value
from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.uop.ops import GroupOp, Ops, UOp

T = TypeVar("T")


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
    self.loops: dict[UOp, bool] = {}
    self.running: dict[UOp, bool] = {}
    self.n_acc = 0

  def rset(self, n: UOp) -> frozenset[UOp]:
    """The RANGEs `n` depends on that are still open at `n` (a REDUCE or an END closes its own)."""
    if (r := self.rsets.get(n)) is not None: return r
    for x in n.toposort(gate=lambda y: y not in self.rsets):  # only the part not computed before (was quadratic)
      if x in self.rsets: continue
      r = frozenset().union(*(self.rsets[s] for s in x.src)) if x.src else frozenset()
      if x.op is Ops.RANGE: r = r | {x}
      if x.op in (Ops.REDUCE, Ops.END): r = r - set(x.src[1:])
      self.rsets[x] = r
    return self.rsets[n]

  def dt(self, d: DType) -> DType:
    """`d` with `dtypes.index` lowered (also as an accumulator's element type)."""
    if isinstance(d, PtrDType): return self.idx_dtype.ptr(d.size, d.addrspace) if d.base == dtypes.index else d
    return self.idx_dtype if d == dtypes.index else d

  def push(self, n: UOp) -> UOp:
    self.out.append(n)
    return n

  def emit(self, node: UOp) -> UOp:
    if (d := self.done.get(node)) is not None: return d
    if node.op is Ops.END: return self.emit_loops(node)
    if node.op is Ops.CONST and node.dtype == dtypes.index: return self.emit(node.replace(dtype=self.idx_dtype))
    if node.op is Ops.AFTER:
      for s in node.src[1:]: self.emit(s)   # what it waits for first (a loop nest before the accumulator it filled)
    new_src = self.emit_srcs(node.src) if node.op in GroupOp.ALU else tuple(self.emit(s) for s in node.src)
    if (d := self.done.get(node)) is not None: return d   # emitted meanwhile: a loop nest emits its results
    arg = node.arg
    if node.op is Ops.DEFINE_REG: arg, self.n_acc = self.n_acc, self.n_acc + 1
    n = UOp(node.op, self.dt(node.dtype), new_src, arg, node.tag)
    self.done[node] = self.push(n)
    return n

  def _flag(self, memo: dict[UOp, bool], n: UOp, leaf: Callable[[UOp], bool | None]) -> bool:
    """`leaf(x)` where it says True/False, else whether some source of x has the flag; memoized in `memo`."""
    if (r := memo.get(n)) is None:
      for x in n.toposort(gate=lambda y: y not in memo):
        if x not in memo: memo[x] = v if (v := leaf(x)) is not None else any(memo[s] for s in x.src)
      r = memo[n]
    return r

  def has_loop(self, n: UOp) -> bool:
    """Whether `n` needs a loop nest that is not open yet (it reads an accumulator after its END)."""
    return self._flag(self.loops, n, lambda x: True if x.op is Ops.END else None)

  def reads_running(self, n: UOp) -> bool:
    """Whether `n` is part of an accumulator's update (it reads a running value; a closed loop's result doesn't)."""
    return self._flag(self.running, n, lambda x: True if running_value(x) else False if x.op is Ops.END else None)

  def emit_srcs(self, srcs: tuple[UOp, ...]) -> tuple[UOp, ...]:
    """An ALU op's `srcs` emitted: the accumulator being updated first (the terms of a sum in their order), then those
    needing a loop nest, then the rest, which are so computed after those loops and aren't live across them (a
    sub-block's scale times its sum of products: the scale is read after the sum; 14 stack slots used instead of 30 in
    an 8-lane Q5_0 product, which ran 10% slower). A STORE's address keeps its place before the loops, so the matmul
    and convolution tiles' code stays as it was."""
    for s in srcs:
      if self.reads_running(s): self.emit(s)
    for s in srcs:
      if self.has_loop(s): self.emit(s)
    return tuple(self.emit(s) for s in srcs)

  def siblings(self, end: UOp) -> list[UOp]:
    """ENDs over exactly `end`'s ranges that can share its loop nest: computable now and independent of each other."""
    group = [end]
    for x in self.ast.toposort():
      if x.op is not Ops.END or x is end or x in self.done or x.src[1:] != end.src[1:]: continue
      if not self.rset(x) <= self.open or any(g in x.toposort() or x in g.toposort() for g in group): continue
      group.append(x)
    return group

  def terms(self, end: UOp) -> list[UOp]:
    """The operands of `end`'s update other than the running value, innermost update first (a sum's terms in order)."""
    chain, x = [], end.src[0].src[1]
    while not running_value(x):
      chain.append(x)
      x = next(s for s in x.src if self.reads_running(s))
    return [s for c in reversed(chain) for s in c.src if not self.reads_running(s)]

  def hoist(self, end: UOp) -> None:
    """Emit what `end`'s update computes that doesn't need its loops (also inside nested loop nests), before them."""
    def enter(n: UOp) -> bool: return not (n.op is Ops.DEFINE_REG or running_value(n) or n.op is Ops.STORE and not self.reads_running(n))
    for t in self.terms(end):
      for n in t.toposort(gate=enter):
        if n in self.done or n.op is Ops.RANGE or self.reads_running(n) or on_register(n): continue
        if self.rset(n) <= self.open: self.emit(n)

  def emit_loops(self, end: UOp) -> UOp:
    """Emit `end` and every sibling END over the same ranges in one loop nest, each with its own accumulator."""
    ranges = end.src[1:]
    group = self.siblings(end)
    for e in group: self.hoist(e)
    parts = [loop_parts(e) for e in group]
    for init, _, _ in parts: self.emit(init)
    opened = [self.emit(UOp(Ops.RANGE, r.dtype, r.src, r.arg)) for r in ranges]
    self.open.update(ranges)
    for e, (_, cur, _) in zip(group, parts):
      self.emit(cur)
      self.emit(e.src[0])
    closed = None
    for r in reversed(opened): closed = self.push(UOp(Ops.END, dtypes.void, (r,) if closed is None else (r, closed)))
    self.open.difference_update(ranges)
    for e in group: self.done[e] = closed
    for _, _, result in parts: self.emit(result)
    return closed

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
  """The flat program for a kernel AST with REDUCEs (its reduce ranges unshared, its REDUCEs made accumulators first)."""
  return linearize_program(lower_reduces(unshare_ranges(ast)))
