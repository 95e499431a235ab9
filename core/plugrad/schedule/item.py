"""The scheduler's unit of work: one kernel or copy over buffers, with the optimizations its kernel compiles with."""
from __future__ import annotations

from dataclasses import dataclass, field

from plugrad.codegen.optops import Opt
from plugrad.uop.ops import Ops, UOp


@dataclass
class ScheduleItem:
  """One step: a kernel (`ast` is a SINK) or a COPY (`ast` is the COPY node) over `bufs` (BUFFER uops, output first).
  `opts`: the optimizations the kernel is compiled with, chosen by the scheduler (schedule/optimize.py); None leaves
  the choice to the codegen pipeline (GPU renderers, NOOPT)."""
  ast: UOp
  bufs: list[UOp]
  var_vals: dict[UOp, int] = field(default_factory=dict)
  opts: tuple[Opt, ...] | None = None


def base_size(b: UOp) -> int:
  """The element count of a BUFFER, BUFFER_VIEW or PARAM placeholder."""
  return b.arg if b.op is Ops.BUFFER else b.arg[0] if b.op is Ops.BUFFER_VIEW else b.arg[2]


def range_view(base: UOp, off: int, n: int, dtype=None) -> UOp:
  """`n` elements of `dtype` (default base's) starting `off` base elements into buffer `base`, as a BUFFER_VIEW (or base)."""
  dtype = dtype or base.dtype
  if off == 0 and dtype == base.dtype and n == base_size(base): return base
  boff = off * base.dtype.itemsize
  if base.op is Ops.BUFFER_VIEW: base, boff = base.src[0], boff + base.arg[1]
  return UOp(Ops.BUFFER_VIEW, dtype, (base,), (n, boff))
