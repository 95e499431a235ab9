"""Codegen: kernel AST -> optimized AST -> linear program -> source, as one declared list of named passes.

`PIPELINE` is the whole of codegen, in the order it runs; `get_program` runs it and nothing else. Each `Pass` says
whether it is a `graph_rewrite` with a PatternMatcher (`rewrite=True`) or still a named imperative step, and what it
does. As built:

  merge ranges    reduce ranges every index reads as one contiguous run (a*nb + b) become one range (codegen/opt.py:
                  merge_reduce_ranges; loop targets, only when the heuristic chooses: explicit Opts name the caller's
                  ranges). A graph_rewrite per merged pair.
  optimize        the caller's Opts (the scheduler's choice: schedule/optimize.py) or else the heuristic's
                  (codegen/heuristic.py, from `renderer.caps`), applied one by one
                  (the rewrites registered by codegen/opt.py, codegen/gpuopt.py). An Opt splits and retypes ranges:
                  UPCAST/UPCAST_OVERLAP/SPLIT/UNROLL/GROUPOUT mark a range of copies; VECTOR a range of vector lanes.
                  GROUP/GROUPTOP leave a reduce across a group's threads; LOCAL splits a range into workgroups and
                  threads (a partial workgroup's accesses gated); TC retypes the matmul's reduce range (the last Opt).
                  A step: choosing the Opts is not a rewrite.
  expand          the marked copies made, in the order the Opts marked them: stores replicated for an "upcast" range,
                  REDUCEs split into k for an "unroll" one; then the grouped reduces lowered into local memory,
                  barriers and a combine (codegen/group.py), then the simplifier (codegen/expand.py).
  tensor cores    the reduce range TC marked becomes the tile's warps, fragments, shared-memory staging and WMMAs
                  (codegen/gpuopt.py: `lower_tensor_cores`; renderers with tensor cores): a graph_rewrite whose rules
                  replace each store of the matmul by its C fragments' stores (stage 2: the SINK's one store by the
                  staged output), over the tile's fragments built once.
  vectorize       the vector lane range becomes vector values (codegen/vectorize.py; renderers with `vector_lanes`):
                  a graph_rewrite per lane range (pre-order rules decide loads, stores and reduces over the lane on
                  the node as it came in, post-order rules build vector ops), then one for the dot accumulators.
  gpudims         global/local ranges become SPECIAL hardware ids (codegen/gpudims.py; GPU renderers): a substitution.
  decompositions  the renderer's `extra_matcher` (ops the target lacks, rewritten into ones it has) as a graph_rewrite.
  reduce ranges   a REDUCE sharing a RANGE with another in a different loop nest gets fresh copies (codegen/linearize.py).
  accumulators    every REDUCE becomes a register accumulator: its reset, its update (MULACC per product of a float
                  sum, WMMA accumulating in place) and END(update, *ranges) closing its loops (codegen/accumulate.py).
  linearize       the flat program (codegen/linearize.py): which ENDs share a loop nest, what is computed before the
                  loops and the statement order. A step: ordering is not a rewrite.
  param slots     every buffer slot stays a parameter, in slot order (a step).
  render          the renderer's rules (`Renderer.render`: string rules for C/CUDA/AMDGPU) turn the program into source.

DEBUG>=5 prints each pass's name and the size of what it produced; VIZ=1 records a marker rewrite named
`pass <name>` (the AST after the pass) in the kernel's group, between the pass's own rewrites.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from plugrad.codegen.gpudims import LaunchDims, gpudims, uses_gpudims
from plugrad.codegen import opt  # noqa: F401  (the rewrites register their optimization kinds on import)
from plugrad.codegen.gpuopt import lower_tensor_cores
from plugrad.codegen.expand import expand
from plugrad.codegen.facts import Dots
from plugrad.codegen.heuristic import optimize, optimize_gpu
from plugrad.codegen.accumulate import lower_reduces
from plugrad.codegen.linearize import linearize_program, unshare_ranges
from plugrad.codegen.opt import merge_reduce_ranges
from plugrad.codegen.optops import Opt, apply_opt
from plugrad.codegen.vectorize import vectorize
from plugrad.helpers import getenv
from plugrad.runtime.renderer import Renderer
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import prod, sint, sym_infer
from plugrad.viz import capture


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
  """`ast` with the given optimizations (any registered kind: codegen/optops.py)."""
  for o in opts: ast = apply_opt(ast, o, renderer.caps)
  return ast


@dataclass
class KernelState:
  """What the passes hand each other: the kernel AST being rewritten (`source` is the scheduler's, kept for the name
  and the parameter slots), the caller's Opts (None: the heuristic's), then the launch dims, linear program and source."""
  source: UOp
  renderer: Renderer
  opts: list[Opt] | None
  ast: UOp
  dims: LaunchDims | None = None
  uops: list[UOp] = field(default_factory=list)
  src: str = ""


@dataclass(frozen=True)
class Pass:
  """One named codegen pass: `run` updates the state; `rewrite` says whether it is a graph_rewrite with a
  PatternMatcher (True) or still an imperative step (False), `doc` what it does."""
  name: str
  run: Callable[[KernelState], None]
  rewrite: bool
  doc: str


def _merge_ranges(k: KernelState) -> None:
  # only for the heuristic's choice on loop targets: explicit opts name the caller's ranges (GPU kernels: not measured)
  if k.opts is None and not uses_gpudims(k.renderer.caps) and not getenv("NOOPT", 0): k.ast = merge_reduce_ranges(k.ast)


def _optimize(k: KernelState) -> None:
  caps = k.renderer.caps
  if k.opts is not None: k.ast = apply_opts(k.ast, k.opts, k.renderer)
  else: k.ast = optimize_gpu(k.ast, caps) if uses_gpudims(caps) else optimize(k.ast, caps)


def _expand(k: KernelState) -> None: k.ast = expand(k.ast)


def _tensor_cores(k: KernelState) -> None:
  if k.renderer.caps.tensor_cores: k.ast = lower_tensor_cores(k.ast)


def _vectorize(k: KernelState) -> None:
  if (caps := k.renderer.caps).vector_lanes: k.ast = vectorize(k.ast, caps.vector_ops, Dots.of(caps), caps.f16_vectors)


def _gpudims(k: KernelState) -> None:
  k.dims = gpudims(k.ast, k.renderer.caps)
  k.ast = k.dims.ast


def _decompositions(k: KernelState) -> None:
  if (pm := k.renderer.extra_matcher) is not None: k.ast = graph_rewrite(k.ast, pm, name=f"{k.renderer.name} decompositions")


def _reduce_ranges(k: KernelState) -> None: k.ast = unshare_ranges(k.ast)


def _accumulators(k: KernelState) -> None: k.ast = lower_reduces(k.ast)


def _linearize(k: KernelState) -> None: k.uops = linearize_program(k.ast)


def _param_slots(k: KernelState) -> None:
  # every buffer slot stays a parameter, also one whose loads the optimizer folded away (an unrolled reduce whose
  # where() picks another buffer at every step): runtimes pass buffers by slot, so a dropped one shifted the rest
  slots = {u.arg: u for u in (*k.source.toposort(), *k.uops) if u.op is Ops.DEFINE_GLOBAL}
  k.uops = [slots[s] for s in sorted(slots)] + [u for u in k.uops if u.op is not Ops.DEFINE_GLOBAL]


def _render(k: KernelState) -> None: k.src = k.renderer.render(kernel_name(k.source), k.uops)


PIPELINE: tuple[Pass, ...] = (
  Pass("merge ranges", _merge_ranges, True, "reduce ranges read as one contiguous run become one range (opt.py; loop targets, heuristic only)"),
  Pass("optimize", _optimize, False, "apply the heuristic's or the caller's Opts: each splits/retypes ranges (heuristic.py; opt.py, gpuopt.py)"),
  Pass("expand", _expand, True, "ranges the Opts marked as copies (UPCAST, SPLIT, UNROLL) become the copies (expand.py)"),
  Pass("tensor cores", _tensor_cores, True, "the reduce range TC marked: warps, fragments, staging, WMMAs (gpuopt.py)"),
  Pass("vectorize", _vectorize, True, "vector lane ranges become vector values (vectorize.py; renderers with vector_lanes)"),
  Pass("gpudims", _gpudims, True, "global/local ranges become SPECIAL hardware ids under the launch limits (gpudims.py)"),
  Pass("decompositions", _decompositions, True, "the renderer's extra_matcher: ops the target lacks rewritten into ones it has"),
  Pass("reduce ranges", _reduce_ranges, True, "a REDUCE sharing a RANGE across loop nests gets fresh copies (linearize.py)"),
  Pass("accumulators", _accumulators, True, "each REDUCE becomes a register accumulator: reset, update, loops' END (accumulate.py)"),
  Pass("linearize", _linearize, False, "order the program: loop nests, what runs before them, statement order (linearize.py)"),
  Pass("param slots", _param_slots, False, "every buffer slot stays a parameter, in slot order"),
  Pass("render", _render, False, "the renderer's rules turn the linear program into source (Renderer.render)"),
)


def _show(i: int, p: Pass, k: KernelState) -> None:
  """DEBUG>=5: the pass's name and what it produced; VIZ=1: a marker rewrite `pass <name>` holding the AST after it."""
  if capture.VIZ and (rec := capture.TRACE.begin_rewrite(f"pass {p.name}", k.ast, False, False)) is not None: rec.out = k.ast
  if getenv("DEBUG", 0) >= 5:
    what = f"{len(k.src)} chars" if p.name == "render" else f"{len(k.uops)} uops" if k.uops else f"{len(k.ast.toposort())} nodes"
    print(f"  codegen pass {i} {p.name:15s} {'rewrite' if p.rewrite else 'step':7s} {what}")


def run_pipeline(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None, passes: tuple[Pass, ...] | None = None) -> KernelState:
  """The state after running `passes` (by default the whole PIPELINE) on kernel `ast` for `renderer`."""
  k = KernelState(ast, renderer, opts, ast)
  for i, p in enumerate(PIPELINE if passes is None else passes):
    p.run(k)
    _show(i, p, k)
  return k


def get_program(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> ProgramSpec:
  """The kernel AST `ast` rendered for `renderer` by the PIPELINE (`opts` replaces the heuristic's choice)."""
  k = run_pipeline(ast, renderer, opts)
  assert k.dims is not None, "the pipeline has no gpudims pass"
  glbls = [u for u in k.uops if u.op is Ops.DEFINE_GLOBAL]
  mem = sum(g.dtype.size * g.dtype.base.itemsize for g in glbls if isinstance(g.dtype.size, int) and g.dtype.size > 0)
  return ProgramSpec(kernel_name(ast), k.src, k.uops, glbls, [u for u in k.uops if u.op is Ops.DEFINE_VAR], global_size=k.dims.global_size,
                     local_size=k.dims.local_size, flops=_mul(estimate_flops(k.uops), _threads(k.dims)), mem_bytes=mem)


def _mul(a: sint, b: sint) -> sint:
  """a * b where both may be symbolic with different int dtypes (linearized loop bounds are int32, launch sizes index)."""
  if isinstance(a, UOp) and isinstance(b, UOp) and a.dtype != b.dtype: a = a.cast(b.dtype)
  return a * b


def _threads(dims) -> sint:
  """Threads a launch runs (each executes the linear program once)."""
  return prod(dims.global_size) * prod(dims.local_size) if dims.local_size is not None else 1
