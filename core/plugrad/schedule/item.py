"""The scheduler's unit of work: one kernel or copy over buffers, with the optimizations its kernel compiles with."""
from __future__ import annotations

from dataclasses import dataclass, field

from plugrad.codegen.optops import Opt
from plugrad.uop.ops import UOp


@dataclass
class ScheduleItem:
  """One step: a kernel (`ast` is a SINK) or a COPY (`ast` is the COPY node) over `bufs` (BUFFER uops, output first).
  `opts`: the optimizations the kernel is compiled with, chosen by the scheduler (schedule/optimize.py); None leaves
  the choice to the codegen pipeline (GPU renderers, NOOPT)."""
  ast: UOp
  bufs: list[UOp]
  var_vals: dict[UOp, int] = field(default_factory=dict)
  opts: tuple[Opt, ...] | None = None
