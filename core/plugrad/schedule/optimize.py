"""The scheduler's last pass: every kernel's optimizations chosen once, and operand packing split into kernels of its own.

For each kernel item, codegen/search.py's `kernel_opts` gives the kernel to compile and its optimizations (BEAM's, or
the CPU heuristic's; None on GPU renderers, whose pipeline chooses). The item carries them (`ScheduleItem.opts`), so
codegen applies them without choosing again. A PACK among them (codegen/pack.py) becomes what it is, more kernels: each
packing kernel is an item of its own writing a scratch buffer, an intermediate like any other (the schedule's and
TinyJit's memory planners place it), and the main kernel reads it. A PACK in chunks (codegen/pack.py `chunk_reduce`)
becomes a pack and a main item per chunk, reading views of the item's buffers (`range_view`), the partial sums
alternating between the output and one more intermediate. The engine runs the items in order and knows nothing of
packing.
"""
from __future__ import annotations

from typing import Callable

from plugrad.codegen.pack import split_packs
from plugrad.codegen.search import kernel_opts
from plugrad.dtype import DType
from plugrad.schedule.item import ScheduleItem, range_view
from plugrad.uop.ops import Ops, UOp


def _device(it: ScheduleItem) -> str:
  """The device of a normalized item (its output's PARAM placeholder: ("out"|"in", i, size, device))."""
  return next(p.arg[3] for p in it.bufs[0].toposort() if p.op is Ops.PARAM)


def optimize_items(items: list[ScheduleItem], new_out: Callable[[str, int, DType], UOp]) -> list[ScheduleItem]:
  """`items` with each kernel's optimizations chosen and its packing kernels split off (see the module docstring);
  `new_out(device, size, dtype)` makes the placeholder of a fresh intermediate buffer (the packed operand)."""
  out: list[ScheduleItem] = []
  for it in items:
    if it.ast.op is not Ops.SINK:
      out.append(it)
      continue
    dev = _device(it)
    ast, opts = kernel_opts(it.ast, dev)
    if opts is None or not any(o.kind == "PACK" for o in opts):
      out.append(ScheduleItem(ast, it.bufs, it.var_vals, opts))
      continue
    plan = split_packs(ast, list(opts))
    scratch = [new_out(dev, pk.size, pk.dtype) for pk in plan.packs]
    pks = [(pk, *kernel_opts(pk.ast, dev)) for pk in plan.packs]
    # chunked: the sums so far alternate between the output and a second buffer, so the last chunk's is the output
    sums = [it.bufs[0], new_out(dev, *_size_and_dtype(ast))] if plan.chunks > 1 else [it.bufs[0]]
    for c in range(plan.chunks):
      def buf(s: int) -> UOp:   # the item's buffer of slot s, as chunk c's kernels see it
        if s == 0: return sums[(plan.chunks - 1 - c) % 2]
        if s == plan.sofar: return sums[(plan.chunks - c) % 2]   # the sum so far (the later chunks' extra slot)
        return range_view(it.bufs[s], c * plan.steps[s], plan.sizes[s]) if s in plan.steps else it.bufs[s]
      for (pk, pk_ast, pk_opts), sc in zip(pks, scratch): out.append(ScheduleItem(pk_ast, [sc, *[buf(s) for s in pk.srcs]], {}, pk_opts))
      main = plan if c == 0 or plan.rest is None else plan.rest
      out.append(ScheduleItem(main.ast, [buf(s) if s >= 0 else scratch[-1 - s] for s in main.slots], it.var_vals, tuple(main.opts)))
  return out


def _size_and_dtype(ast: UOp) -> tuple[int, DType]:
  """The element count and dtype of kernel `ast`'s output buffer (parameter 0)."""
  out = next(x for x in ast.toposort() if x.op is Ops.DEFINE_GLOBAL and x.arg == 0)
  return out.dtype.size, out.dtype.base
