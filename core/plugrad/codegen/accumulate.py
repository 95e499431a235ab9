"""Reduce lowering: every REDUCE becomes an accumulator in a register, as one graph_rewrite (codegen's "accumulators"
pass, after "reduce ranges" and before "linearize").

REDUCE(body, *R, arg=op) of dtype dt becomes, in the graph (docs/kernel_ir.md):

  acc    = DEFINE_REG(dt.ptr(1, REG), arg=i)     i unique in the kernel (the linearizer renumbers in emission order)
  slot   = INDEX(acc, 0)
  init   = STORE(slot, identity of op)            the reset, made where the loops over R are entered
  cur    = LOAD(slot, init)                       the running value inside the loops, read after the reset
  upd    = STORE(slot, update(cur, body))
  end    = END(upd, *R)                           the loops over R, closed after the update
  result = LOAD(INDEX(AFTER(acc, end), 0))        the value after the loops: what replaces the REDUCE

`update`: a WMMA body (tensor cores, integer dots) accumulates in its third operand, WMMA(a, b, cur); a float sum
adds each of its terms that varies with R on its own, one MULACC(a, b, acc) per product (acc + a*b + c*d: the order
of a reduction's additions is the kernel's to choose, as vector lanes and SPLIT already do); any other reduce is
op(cur, body). The linearizer (codegen/linearize.py) decides only where these go: which ENDs over the same ranges share
one loop nest, what is computed before the loops, and the order of the statements.
"""
from __future__ import annotations

import itertools

from plugrad.dtype import AddrSpace, DType, dtypes
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import PatternMatcher, UPat, graph_rewrite


def reduce_identity(op: Ops, dt: DType):
  """The value a reduction by `op` over no elements has (0, 1, the dtype's lowest)."""
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtypes.min(dt)
  raise ValueError(f"no identity for reduce op {op}")


def identity_value(op: Ops, dt: DType) -> UOp:
  """The reduce identity of `op` as a value of `dt` (a VECTORIZE of scalar constants for a vector accumulator)."""
  if dt.count == 1: return UOp.const(dt, reduce_identity(op, dt))
  return UOp(Ops.VECTORIZE, dt, (UOp.const(dt.scalar(), reduce_identity(op, dt.scalar())),) * dt.count)


def _sum_terms(body: UOp, ranges: tuple[UOp, ...]) -> list[UOp]:
  """The terms of a float sum `body` that are added to the accumulator one by one: an ADD that varies with `ranges`
  is split into its operands (left to right); a loop-invariant one stays one term (computed once, before the loops)."""
  varies: dict[UOp, bool] = {}
  for n in body.toposort():
    varies[n] = n in ranges or any(varies[s] for s in n.src)
  terms, todo = [], [body]
  while todo:
    if (x := todo.pop()).op is Ops.ADD and varies[x] and x.dtype == body.dtype: todo += reversed(x.src)
    else: terms.append(x)
  return terms


def _update(red: UOp, cur: UOp) -> UOp:
  """The accumulator's new value from its running value `cur` and the reduce's body (see the module docstring)."""
  body, op, dt = red.src[0], red.arg, red.dtype
  if op is Ops.ADD and body.op is Ops.WMMA: return UOp(Ops.WMMA, dt, (body.src[0], body.src[1], cur), body.arg)
  if op is not Ops.ADD or not dtypes.is_float(dt): return UOp(op, dt, (cur, body))
  for t in _sum_terms(body, red.src[1:]):
    cur = UOp(Ops.MULACC, dt, (t.src[0], t.src[1], cur)) if t.op is Ops.MUL else UOp(Ops.ADD, dt, (cur, t))
  return cur


def lower_reduce(ids: itertools.count, red: UOp) -> UOp:
  """The value after the loops of `red`'s accumulator (see the module docstring); `ids` numbers the accumulators."""
  acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(1, AddrSpace.REG), arg=next(ids))
  zero = UOp.const(dtypes.index, 0)
  slot = UOp(Ops.INDEX, acc.dtype, (acc, zero))
  init = UOp(Ops.STORE, dtypes.void, (slot, identity_value(red.arg, red.dtype)))
  upd = UOp(Ops.STORE, dtypes.void, (slot, _update(red, UOp(Ops.LOAD, red.dtype, (slot, init)))))
  end = UOp(Ops.END, dtypes.void, (upd, *red.src[1:]))
  return UOp(Ops.LOAD, red.dtype, (UOp(Ops.INDEX, acc.dtype, (UOp(Ops.AFTER, acc.dtype, (acc, end)), zero)),))


pm_accumulators = PatternMatcher([(UPat(Ops.REDUCE, name="red"), lambda ctx, red: lower_reduce(ctx, red))])


def lower_reduces(ast: UOp) -> UOp:
  """`ast` with every REDUCE lowered to an accumulator (codegen's "accumulators" pass)."""
  return graph_rewrite(ast, pm_accumulators, ctx=itertools.count(), name="accumulators")


# ---------------------------------------------------------------------------- reading the lowered form back

def on_register(n: UOp) -> bool:
  """Whether `n` is accumulator plumbing: the DEFINE_REG itself, or an INDEX/AFTER/LOAD/STORE of one."""
  if n.op is Ops.DEFINE_REG: return True
  if n.op in (Ops.INDEX, Ops.AFTER): return getattr(n.dtype, "addrspace", None) is AddrSpace.REG
  return n.op in (Ops.LOAD, Ops.STORE) and n.src[0].op is Ops.INDEX and on_register(n.src[0])


def running_value(n: UOp) -> bool:
  """Whether `n` is an accumulator's running value inside its loops (`cur`: a LOAD of the slot itself, not after an END)."""
  return n.op is Ops.LOAD and n.src[0].op is Ops.INDEX and n.src[0].src[0].op is Ops.DEFINE_REG


def loop_parts(end: UOp) -> tuple[UOp, UOp, UOp]:
  """(init, cur, result) of the accumulator an END of the lowered form closes (module docstring)."""
  upd = end.src[0]
  slot = upd.src[0]
  cur = next(n for n in upd.src[1].toposort(gate=lambda x: x.op is not Ops.END) if n.op is Ops.LOAD and n.src[0] is slot)
  acc = slot.src[0]
  result = UOp(Ops.LOAD, cur.dtype, (UOp(Ops.INDEX, acc.dtype, (UOp(Ops.AFTER, acc.dtype, (acc, end)), slot.src[1])),))
  return cur.src[1], cur, result
