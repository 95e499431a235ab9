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
from plugrad.helpers import getenv
from plugrad.uop.rewrite import graph_rewrite, graph_rewrite_map
from plugrad.uop.upat import PatternMatcher, UPat
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
    if x.op is Ops.PARAM and isinstance(x.arg, tuple) and len(x.arg) == 4: return x.arg[3]
    if x.op is Ops.COPY: return x.src[1].arg
    if not x.src: raise RuntimeError(f"{u.op} has no device")
    x = next((s for s in x.src if s.op is not Ops.DEFINE_VAR and s.op is not Ops.BIND), x.src[0])


def is_buffer_view(u: UOp) -> bool:
  """True for a BUFFER (or a scheduler placeholder for one) seen through movement ops only: no kernel needed."""
  while u.op in GroupOp.Movement: u = u.src[0]
  return u.op in (Ops.BUFFER, Ops.PARAM, Ops.BUFFER_VIEW)


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


def _reads_other_elements_of_output(ast: UOp) -> bool:
  """True if the kernel loads from its output buffer (slot 0) at an index other than the one it stores to."""
  dest = ast.src[0].src[0]
  return any(u.op is Ops.LOAD and u.src[0].src[0].arg == 0 and u.src[0].src[0].op is Ops.DEFINE_GLOBAL and u.src[0] is not dest
             for u in ast.toposort())


def _placeholder(kind: str, i: int, size: int, device: str, dtype) -> UOp:
  return UOp(Ops.PARAM, dtype, arg=(kind, i, size, device))


def _schedule_normalized(sink: UOp) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """Schedule a graph whose buffers are PARAM placeholders; outputs get ("out", j) placeholders."""
  targets = list(sink.src)
  nodes = list(sink.toposort(gate=lambda u: not is_buffer_view(u)))
  realize = _must_realize(nodes, targets)
  becomes: dict[UOp, UOp] = {}
  items: list[ScheduleItem] = []
  n_out = 0
  def new_out(device: str, size: int, dtype) -> UOp:
    nonlocal n_out
    n_out += 1
    return _placeholder("out", n_out - 1, size, device, dtype)
  for n in nodes:
    if n not in realize: continue
    src = n.substitute(becomes, walk=True) if becomes else n  # earlier kernels' outputs are buffers now
    if src.op is Ops.COPY:
      out = new_out(src.src[1].arg, src.numel(), src.dtype)
      items.append(ScheduleItem(src, [out, buffer_of(src.src[0])]))
      becomes[n] = view_as(out, n.shape)
      continue
    ctx = KernelContext()
    if src.op is Ops.ASSIGN:
      target, value = src.src
      out = buffer_of(target)
      ast = _kernel_ast(value, out, ctx, store_target=target)
      if _reads_other_elements_of_output(ast):  # e.g. x.assign(x.flip(0)): compute the value into a temporary first
        tmp = new_out(device_of(src), value.numel(), value.dtype)
        tctx = KernelContext()
        items.append(ScheduleItem(_kernel_ast(value, tmp, tctx), list(tctx.bufs), {v: -1 for v in value.toposort() if v.op is Ops.DEFINE_VAR}))
        ctx = KernelContext()
        ast = _kernel_ast(view_as(tmp, value.shape), out, ctx, store_target=target)
      becomes[n] = target
    else:
      value = src.src[0] if src.op is Ops.CONTIGUOUS else src
      out = new_out(device_of(src), value.numel(), src.dtype)
      ast = _kernel_ast(value, out, ctx)
      becomes[n] = view_as(out, n.shape)
    items.append(ScheduleItem(ast, list(ctx.bufs), {v: -1 for v in ast.toposort() if v.op is Ops.DEFINE_VAR}))
  return items, becomes


class _Normalize:
  """Replaces BUFFERs by ("in", i) placeholders and BINDs by their variables, so equal programs on different data
  have the same graph (the schedule cache key)."""
  def __init__(self): self.inputs: list[UOp] = []; self.var_vals: dict[UOp, int] = {}
  def buffer(self, b: UOp) -> UOp:
    self.inputs.append(b)
    return _placeholder("in", len(self.inputs) - 1, b.arg, b.src[1].arg, b.dtype)
  def bind(self, b: UOp) -> UOp:
    var, val = b.unbind()
    if self.var_vals.setdefault(var, val) != val: raise RuntimeError(f"bind mismatch on {var.arg[0]}: {self.var_vals[var]} != {val}")
    return var


pm_normalize = PatternMatcher([(UPat(Ops.BUFFER, name="b"), lambda ctx, b: ctx.buffer(b)),
                               (UPat(Ops.BIND, name="b"), lambda ctx, b: ctx.bind(b))])
_SCHEDULE_CACHE: dict[UOp, tuple[list[ScheduleItem], dict[UOp, UOp]]] = {}
SCHEDULE_STATS = {"hits": 0, "misses": 0}


def create_schedule(targets: list[UOp], keep: set[UOp] | None = None) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """Kernels (in run order) that realize `targets`, and the map from each realized node to its buffer view.
  Schedules are cached by the structure of the graph (buffers and bound values abstracted), so running the same
  program on new data skips scheduling and codegen. Intermediate buffers not in `keep` (or targets) may share memory."""
  norm = _Normalize()
  mapping = graph_rewrite_map(UOp.sink_of(*targets), None, ctx=norm, bpm=pm_normalize, walk=True, name="normalize")
  nsink = mapping[UOp.sink_of(*targets)]
  if (cached := _SCHEDULE_CACHE.get(nsink)) is None:
    cached = _SCHEDULE_CACHE[nsink] = _schedule_normalized(nsink)
    SCHEDULE_STATS["misses"] += 1
    if getenv("DEBUG", 0) >= 1: print(f"schedule cache miss: {len(cached[0])} items")
  else: SCHEDULE_STATS["hits"] += 1
  items_t, becomes_t = cached
  kept_outs = {buffer_of(becomes_t[mapping[n]]) for n in (*targets, *(keep or ())) if n in mapping and mapping[n] in becomes_t}
  outs = plan_buffers(items_t, kept_outs)
  def real(p: UOp) -> UOp: return norm.inputs[p.arg[1]] if p.arg[0] == "in" else outs[p]
  sub_map = {p: real(p) for it in items_t for b in it.bufs for p in b.toposort() if p.op is Ops.PARAM}
  items = [ScheduleItem(it.ast, [sub_map[b] if b.op is Ops.PARAM else b.substitute(sub_map) for b in it.bufs],
                        {v: norm.var_vals[v] for v in it.var_vals}) for it in items_t]
  becomes = {n: becomes_t[m].substitute(sub_map, walk=True) for n, m in mapping.items() if m in becomes_t}
  return items, becomes


def plan_buffers(items: list[ScheduleItem], kept: set[UOp]) -> dict[UOp, UOp]:
  """Real BUFFERs for the ("out", j) placeholders: an intermediate that is not kept reuses the memory of an earlier
  intermediate of the same device, dtype and size whose last reader has run."""
  last_use: dict[UOp, int] = {}
  for i, it in enumerate(items):
    for b in it.bufs:
      for p in b.toposort():
        if p.op is Ops.PARAM: last_use[p] = i
  free: dict[tuple, list[UOp]] = {}
  outs: dict[UOp, UOp] = {}
  for i, it in enumerate(items):
    for p in it.bufs:
      if p.op is not Ops.PARAM or p.arg[0] != "out" or p in outs: continue
      key = (p.arg[3], p.dtype, p.arg[2])
      outs[p] = free[key].pop() if p not in kept and free.get(key) else new_buffer(p.arg[3], p.arg[2], p.dtype)
    for p in it.bufs:
      if p.op is Ops.PARAM and p.arg[0] == "out" and last_use[p] == i and p not in kept:
        free.setdefault((p.arg[3], p.dtype, p.arg[2]), []).append(outs[p])
  return outs


def view_as(u: UOp, shape: tuple) -> UOp:
  """`u` reshaped to `shape` (itself if it has that shape)."""
  return u if u.shape == tuple(shape) else UOp(Ops.RESHAPE, u.dtype, (u,), tuple(shape))
