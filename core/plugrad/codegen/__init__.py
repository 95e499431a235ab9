"""Codegen: kernel AST -> linearized program -> source, packaged as a ProgramSpec."""
from __future__ import annotations

from dataclasses import dataclass, field

from plugrad.codegen.gpudims import gpudims, uses_gpudims
from plugrad.codegen.gpuopt import apply_gpu_opt, optimize_gpu
from plugrad.codegen.linearize import linearize
from plugrad.codegen.opt import Dots, Opt, optimize
from plugrad.codegen.vectorize import vectorize
from plugrad.runtime.renderer import Renderer
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.symbolic import prod, sint, sym_infer


@dataclass
class ProgramSpec:
  """A rendered kernel: its name, source, linear uops, parameters, launch dimensions and cost estimates.

  `global_size` is the number of workgroups per hardware dim (ints, or index expressions over the kernel's variables),
  `local_size` the threads per workgroup (None for renderers that run loops instead of hardware ids: the CPU)."""
  name: str
  src: str
  uops: list[UOp]
  globals: list[UOp]            # DEFINE_GLOBAL per slot
  vars: list[UOp]               # DEFINE_VAR in parameter order
  global_size: list[sint] = field(default_factory=lambda: [1, 1, 1])
  local_size: list[int] | None = None
  flops: sint = 0
  mem_bytes: int = 0

  def launch_dims(self, var_vals: dict | None = None) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(global_size, local_size) as ints, symbolic sizes evaluated with the bound variables (name or DEFINE_VAR -> int)."""
    vv = var_vals or {}
    try: glb = tuple(int(sym_infer(g, vv)) for g in self.global_size)
    except KeyError as e: raise RuntimeError(f"kernel {self.name}: launch size needs {e.args[0]}") from None
    return glb, None if self.local_size is None else tuple(self.local_size)


def kernel_name(ast: UOp) -> str:
  """E_<dims> for elementwise kernels, r_<dims>_<reduce dims> when the kernel reduces; symbolic dims print as their name."""
  ranges = sorted((n for n in ast.toposort() if n.op is Ops.RANGE), key=lambda r: r.arg[0])
  def dim(r: UOp) -> str: return str(r.src[0].arg) if r.src[0].op is Ops.CONST else "s"
  g = [dim(r) for r in ranges if r.arg[1] == "global"] or ["1"]
  red = [dim(r) for r in ranges if r.arg[1] != "global"]
  return ("r_" if red else "E_") + "_".join(g + red)


def estimate_flops(uops: list[UOp]) -> sint:
  """ALU operations executed, each weighted by the trip count of its enclosing loops."""
  flops: sint = 0
  mult: list[sint] = []
  for u in uops:
    if u.op is Ops.RANGE: mult.append(u.src[0].arg if u.src[0].op is Ops.CONST else u.src[0])
    elif u.op is Ops.END: mult.pop()
    elif u.op in GroupOp.ALU and u.dtype.scalar().name not in ("int32", "int64", "bool"): flops = flops + prod(mult) * u.dtype.count
  return flops


def apply_opts(ast: UOp, opts: list[Opt], renderer: Renderer) -> UOp:
  """`ast` with the given optimizations (LOCAL/GROUP/GROUPTOP/TC for GPU renderers, the CPU ones for any)."""
  for o in opts: ast = apply_gpu_opt(ast, o, renderer.caps)
  return ast


def get_program(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> ProgramSpec:
  """Optimize (codegen/opt.py, or codegen/gpuopt.py for GPU renderers; `opts` replaces the heuristic's choice; vector
  lanes become vector types with codegen/vectorize.py where the renderer has them), map ranges to hardware ids
  (codegen/gpudims.py), linearize and render a kernel AST for `renderer`."""
  caps = renderer.caps
  if opts is not None: opt = apply_opts(ast, opts, renderer)
  else: opt = optimize_gpu(ast, caps) if uses_gpudims(caps) else optimize(ast, caps)
  if caps.vector_lanes: opt = vectorize(opt, caps.vector_ops, Dots.of(caps))
  dims = gpudims(opt, caps)
  uops = linearize(dims.ast)
  # every buffer slot stays a parameter, also one whose loads the optimizer folded away (an unrolled reduce whose
  # where() picks another buffer at every step): runtimes pass buffers by slot, so a dropped one shifted the rest
  slots = {u.arg: u for u in (*ast.toposort(), *uops) if u.op is Ops.DEFINE_GLOBAL}
  uops = [slots[k] for k in sorted(slots)] + [u for u in uops if u.op is not Ops.DEFINE_GLOBAL]
  name = kernel_name(ast)
  glbls = [u for u in uops if u.op is Ops.DEFINE_GLOBAL]
  mem = sum(g.dtype.size * g.dtype.base.itemsize for g in glbls if isinstance(g.dtype.size, int) and g.dtype.size > 0)
  return ProgramSpec(name, renderer.render(name, uops), uops, glbls, [u for u in uops if u.op is Ops.DEFINE_VAR],
                     global_size=dims.global_size, local_size=dims.local_size, flops=_mul(estimate_flops(uops), _threads(dims)), mem_bytes=mem)


def _mul(a: sint, b: sint) -> sint:
  """a * b where both may be symbolic with different int dtypes (linearized loop bounds are int32, launch sizes index)."""
  if isinstance(a, UOp) and isinstance(b, UOp) and a.dtype != b.dtype: a = a.cast(b.dtype)
  return a * b


def _threads(dims) -> sint:
  """Threads a launch runs (each executes the linear program once)."""
  return prod(dims.global_size) * prod(dims.local_size) if dims.local_size is not None else 1
