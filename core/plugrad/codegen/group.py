"""Grouped reductions lowered: a REDUCE across a workgroup's threads becomes local memory, barriers and a combine.

GROUP and GROUPTOP (codegen/gpuopt.py) only split a reduce range R into a per-thread loop and a thread range: every
REDUCE over R becomes `REDUCE(REDUCE(x, inner, ...), lane)`, the inner REDUCE a thread's partial over its share of R
and the outer one over `lane`, the group's thread range (arg `(id, "local", "group")`). That is still the plain
reduction (a loop over lane, a valid kernel for any renderer); `lower_groups`, run by the expand pass
(codegen/expand.py) once it has made the marked copies (each copy's reduce then gets its own buffer), turns each
outer REDUCE into the workgroup's exchange:

  each thread stores its partial to a DEFINE_LOCAL slot, a BARRIER, then the k partials are combined: a tree when k is
  a power of two (step s: threads l < s store op(local[l], local[l+s]) into local[l], a BARRIER after each; every
  thread then reads local[0]), else every thread loops over them, `REDUCE(LOAD(local[base*k + j], BARRIER), j)`.

Only thread `lane == 0` stores the kernel's outputs that don't depend on the lane. The reduces of one GROUP are lowered
together, smallest first (softmax's max before the sum that reads it), each with its own local buffer.
"""
from __future__ import annotations

import math

from plugrad.dtype import AddrSpace, dtypes
from plugrad.uop.ops import Ops, UOp


def is_group_lane(r: UOp) -> bool: return r.op is Ops.RANGE and r.arg[1:] == ("local", "group")


def is_grouped(n: UOp) -> bool:
  """Whether `n` is a REDUCE across a group's threads (what GROUP/GROUPTOP leave for `lower_groups`)."""
  return n.op is Ops.REDUCE and len(n.src) == 2 and is_group_lane(n.src[1])


def _combine(red: UOp, buf: UOp, base: UOp, lane: UOp, k: int, partial: UOp, j: UOp) -> UOp:
  """The k partials of a workgroup combined through local memory: a tree of log2(k) halving steps (thread l < s adds
  slot l+s into slot l, a BARRIER after each) when k is a power of two, else a serial loop over the k slots."""
  def ix(i: UOp, gate: UOp | None = None) -> UOp: return UOp(Ops.INDEX, buf.dtype, (buf, base + i) if gate is None else (buf, base + i, gate))
  bar = UOp(Ops.BARRIER, dtypes.void, (UOp(Ops.STORE, dtypes.void, (ix(lane), partial)),))
  if k & (k - 1): return UOp(Ops.REDUCE, red.dtype, (UOp(Ops.LOAD, red.dtype, (ix(j), bar)), j), red.arg)
  s = k // 2
  while s >= 1:
    act = lane < s
    a, b = UOp(Ops.LOAD, red.dtype, (ix(lane, act), bar)), UOp(Ops.LOAD, red.dtype, (ix(lane + s, act), bar))
    bar = UOp(Ops.BARRIER, dtypes.void, (UOp(Ops.STORE, dtypes.void, (ix(lane, act), UOp(red.arg, red.dtype, (a, b)))),))
    s //= 2
  return UOp(Ops.LOAD, red.dtype, (ix(UOp.const(dtypes.index, 0)), bar))


def lower_groups(ast: UOp) -> UOp:
  """`ast` with every REDUCE across a group's threads lowered (see the module docstring); `ast` itself when none."""
  topo = ast.toposort()
  if not (pending := [n for n in topo if is_grouped(n)]): return ast
  lane = pending[0].src[1]
  k = lane.src[0].arg
  others = sorted((r for r in topo if r.op is Ops.RANGE and r.arg[1] == "local" and not is_group_lane(r)), key=lambda r: r.arg[0])
  base: UOp = UOp.const(dtypes.index, 0)
  for r in others: base = base * r.src[0] + r  # this thread's slot among the workgroup's other threads
  nthreads = math.prod(r.src[0].arg for r in others) * k
  n_bufs = len([x for x in topo if x.op is Ops.DEFINE_LOCAL])
  nid = max(r.arg[0] for r in topo if r.op is Ops.RANGE) + 1
  while pending:   # the smallest first: a later one may read it (its partial is then rebuilt on the combined value)
    red = min(pending, key=lambda n: len(n.toposort()))
    buf = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(nthreads, AddrSpace.LOCAL), arg=(f"temp{n_bufs}", nthreads))
    j = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, k),), (nid, "reduce"))   # the serial combine's loop (k not a power of two)
    ast = ast.substitute({red: _combine(red, buf, base * k, lane, k, red.src[0], j)}, walk=True)
    n_bufs, nid = n_bufs + 1, nid + 1
    pending = [n for n in ast.toposort() if is_grouped(n)]
  # only thread 0 of the group stores (every thread holds the same combined value)
  first = lane.eq(0)
  stores = [st.replace(src=(st.src[0].replace(src=(*st.src[0].src[:2], first if len(st.src[0].src) < 3 else st.src[0].src[2] & first)), *st.src[1:]))
            if lane not in st.src[0].toposort() else st for st in ast.src]
  return UOp(Ops.SINK, dtypes.void, tuple(stores))
