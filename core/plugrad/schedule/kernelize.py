"""The scheduler: split a lazy tensor graph into kernels and build each kernel's AST.

Everything fuses by default: a kernel computes its output by indexing straight through elementwise and movement
ops and into reductions (see indexing.py). A node is realized into its own buffer (ends a kernel) only when it
must be: a tensor being realized, CONTIGUOUS, COPY, ASSIGN, and a REDUCE_AXIS whose result is broadcast by an
EXPAND (inlining it there would recompute the reduction once per broadcast element).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from plugrad.dtype import dtypes
from plugrad.schedule.indexing import TRUE, KernelContext, pm_index
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import pm_symbolic

_unique = itertools.count()


def new_buffer(device: str, size: int, dtype) -> UOp:
  """A fresh BUFFER node: (UNIQUE, DEVICE) sources make each one distinct."""
  return UOp(Ops.BUFFER, dtype, (UOp(Ops.UNIQUE, arg=next(_unique)), UOp(Ops.DEVICE, arg=device)), arg=size)


def device_of(u: UOp) -> str:
  """The device a tensor-level node lives on (from its DEVICE source, searched through its first sources)."""
  x = u
  while True:
    if x.op is Ops.DEVICE: return x.arg
    if x.op is Ops.BUFFER: return x.src[1].arg
    if x.op is Ops.COPY: return x.src[1].arg
    if not x.src: raise RuntimeError(f"{u.op} has no device")
    x = next((s for s in x.src if s.op is not Ops.DEFINE_VAR and s.op is not Ops.BIND), x.src[0])


def is_buffer_view(u: UOp) -> bool:
  """True for a BUFFER seen through movement ops only (already realized, no kernel needed)."""
  while u.op in GroupOp.Movement: u = u.src[0]
  return u.op is Ops.BUFFER


def buffer_of(u: UOp) -> UOp:
  while u.op in GroupOp.Movement: u = u.src[0]
  return u


@dataclass
class ScheduleItem:
  """One step: a kernel (`ast` is a SINK) or a COPY (`ast` is the COPY node) over `bufs` (BUFFER uops, output first)."""
  ast: UOp
  bufs: list[UOp]
  var_vals: dict[UOp, int] = field(default_factory=dict)


def _must_realize(nodes: list[UOp], targets: list[UOp]) -> set[UOp]:
  realize = {t for t in targets if not is_buffer_view(t)}
  for n in nodes:
    if n.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN): realize.add(n)
    if n.op is Ops.COPY and not is_buffer_view(n.src[0]): realize.add(n.src[0])
    if n.op is Ops.EXPAND:  # reductions broadcast by this expand must be computed once, into a buffer
      for x in n.src[0].toposort(gate=lambda y: y.op is not Ops.REDUCE_AXIS and not is_buffer_view(y)):
        if x.op is Ops.REDUCE_AXIS: realize.add(x)
  return realize


def _kernel_ast(value: UOp, out: UOp, ctx: KernelContext, store_target: UOp | None = None) -> UOp:
  """SINK(STORE(out[idx], value[idx])) over ranges of value's shape, with indexing pushed to loads and simplified."""
  shape = value.shape
  idxs = tuple(UOp.const(dtypes.index, 0) if s == 1 else ctx.new_range(s, "global") for s in shape)
  ctx.param(out)
  val = UOp(Ops.AT, value.dtype, (value, TRUE, *idxs))
  if store_target is not None:  # ASSIGN: store through the target's view of its buffer
    dest = UOp(Ops.AT, store_target.dtype, (store_target, TRUE, *idxs))
  else: dest = UOp(Ops.AT, out.dtype, (view_as(out, shape), TRUE, *idxs))
  sink = UOp.sink_of(dest, val)
  sink = graph_rewrite(sink, pm_index, ctx=ctx, bottom_up=True, name="indexing")
  dest, val = sink.src
  if dest.op is not Ops.LOAD: raise RuntimeError(f"can't store into a {store_target.op if store_target is not None else out.op} view")
  ast = UOp.sink_of(UOp(Ops.STORE, dtypes.void, (dest.src[0], val)))
  return graph_rewrite(ast, pm_symbolic, name="simplify kernel")


def create_schedule(targets: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """Kernels (in run order) that realize `targets`, and the map from each realized node to its buffer view."""
  sink = UOp.sink_of(*targets)
  nodes = list(sink.toposort(gate=lambda u: not is_buffer_view(u)))
  realize = _must_realize(nodes, targets)
  becomes: dict[UOp, UOp] = {}
  items: list[ScheduleItem] = []
  for n in nodes:
    if n not in realize: continue
    src = n.substitute(becomes, walk=True) if becomes else n  # earlier kernels' outputs are buffers now
    if src.op is Ops.COPY:
      out = new_buffer(src.src[1].arg, src.numel(), src.dtype)
      items.append(ScheduleItem(src, [out, buffer_of(src.src[0])]))
      becomes[n] = view_as(out, n.shape)
      continue
    ctx = KernelContext()
    if src.op is Ops.ASSIGN:
      target, value = src.src
      out = buffer_of(target)
      ast = _kernel_ast(value, out, ctx, store_target=target)
      becomes[n] = target
    else:
      value = src.src[0] if src.op is Ops.CONTIGUOUS else src
      out = new_buffer(device_of(src), value.numel(), src.dtype)
      ast = _kernel_ast(value, out, ctx)
      becomes[n] = view_as(out, n.shape)
    items.append(ScheduleItem(ast, list(ctx.bufs), dict(ctx.var_vals)))
  return items, becomes


def view_as(u: UOp, shape: tuple) -> UOp:
  """`u` reshaped to `shape` (itself if it has that shape)."""
  return u if u.shape == tuple(shape) else UOp(Ops.RESHAPE, u.dtype, (u,), tuple(shape))
