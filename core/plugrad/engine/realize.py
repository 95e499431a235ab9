"""Run a schedule: allocate buffers, compile kernels (cached per device, AST and the Opts the scheduler chose), launch them,
copy between devices.

BUFFER uops map to device Buffers through `BUFFERS` (weakly: a Buffer lives as long as its uop is referenced).
DEBUG=1 prints each schedule's kernel count and time; DEBUG=2 each kernel with its time, GFLOPS and GB/s;
DEBUG=4 the generated source; DEBUG=5 each kernel's AST; DEBUG=6 also its linearized program.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from plugrad.codegen import ProgramSpec, get_program, kernel_name
from plugrad.codegen.optops import Opt
from plugrad.device import Buffer, Device, Program
from plugrad.helpers import getenv
from plugrad.schedule.kernelize import ScheduleItem
from plugrad.uop.ops import Ops, UOp, pretty
from plugrad.viz import capture, profile

def buffer_for(u: UOp) -> Buffer:
  """The device Buffer behind a BUFFER uop (created, unallocated, on first use). It is kept in the uop's cache, so it
  lives exactly as long as the uop."""
  if (c := u._cache) is not None and (b := c.get("buffer")) is not None: return b
  if u.op is Ops.BUFFER:
    b = Buffer(u.src[1].arg, u.arg, u.dtype)
    if c is not None and c.get("internal"): b.internal = True
  elif u.op is Ops.BUFFER_VIEW: b = buffer_for(u.src[0]).view(u.arg[0], u.dtype, u.arg[1])
  else: raise TypeError(f"buffer_for needs a BUFFER or BUFFER_VIEW uop, got {u.op}")
  u._cached()["buffer"] = b
  return b


def set_buffer(u: UOp, b: Buffer) -> Buffer:
  """Make `b` the Buffer behind BUFFER uop `u` (a fresh output whose Buffer the caller built)."""
  if u.op is not Ops.BUFFER or b.size != u.arg or b.dtype != u.dtype: raise ValueError(f"buffer {b!r} doesn't match {u.op} {u.dtype} {u.arg}")
  u._cached()["buffer"] = b
  return b


@dataclass
class CompiledRunner:
  spec: ProgramSpec
  prg: Program
  device: str


_RUNNERS: dict[tuple[str, UOp, tuple[Opt, ...] | None], CompiledRunner] = {}


GlobalCounters = {"kernels": 0, "compiles": 0}


def get_runner(device: str, ast: UOp, opts: tuple[Opt, ...] | None = None) -> CompiledRunner:
  """The compiled program for `ast` on `device` with optimizations `opts` (None: the codegen pipeline chooses), compiled
  once per process and cached on disk by the compiler. The scheduler chose a ScheduleItem's opts: `runner_of(item)`."""
  if (r := _RUNNERS.get(key := (device, ast, opts))) is not None: return r
  dev = Device[device]
  with capture.group("kernel", lambda: f"{kernel_name(ast)} {device}") as g:  # VIZ=1: codegen passes grouped per kernel
    if opts is None: spec = get_program(ast, dev.renderer)
    else:
      capture.annotate("opts", list(opts))  # VIZ=1: shown with the kernel
      spec = get_program(ast, dev.renderer, list(opts))
    if g is not None: g.info.update(name=spec.name, device=device, ast=ast, spec=spec)
  if (debug := getenv("DEBUG", 0)) >= 5:
    print(f"kernel {spec.name} AST:\n{pretty(ast, max_lines=1 << 30)}")
    if debug >= 6: print("linearized:\n" + "\n".join(f"  {i:4d} {u.op.name:14s} {u.dtype!r:40s} {u.arg!r}" for i, u in enumerate(spec.uops)))
  if debug >= 4: print(spec.src)
  lib = dev.compiler.compile_cached(spec.src)
  GlobalCounters["compiles"] += 1
  # the runner keeps its spec without the linear uops (the source holds the program; VIZ's record and DEBUG>=6 saw
  # them above): runners live as long as the process, and their uops were ~6,000 of a 135M LLM's ~21,000 live UOps, 4.9 MB
  r = _RUNNERS[key] = CompiledRunner(replace(spec, uops=[]), dev.load(spec.name, lib), device)
  return r


def runner_of(it: ScheduleItem) -> CompiledRunner:
  """The compiled program of kernel item `it` (with the optimizations the scheduler chose for it)."""
  return get_runner(buffer_for(it.bufs[0]).device, it.ast, it.opts)


@dataclass
class ExecItem:
  """One runnable step: a compiled kernel over Buffers (runner set) or a buffer copy (runner None)."""
  runner: CompiledRunner | None
  bufs: list[Buffer]
  var_vals: dict[str, int]

  def run(self, var_vals: dict[str, int] | None = None, wait: bool = False) -> float | None:
    if capture.PROFILE: return profile.run_item(self, var_vals)  # PROFILE=1: timed and recorded (plugrad/viz/profile.py)
    return self._run(var_vals, wait)

  def _run(self, var_vals: dict[str, int] | None, wait: bool) -> float | None:
    if self.runner is None:
      self.bufs[0].copy_from(self.bufs[1])
      return None
    spec = self.runner.spec
    if spec.vars:
      vv = self.var_vals if var_vals is None else var_vals
      vals = tuple(vv[v.arg[0]] if v.arg[0] in vv else _missing(v) for v in spec.vars)
    else: vals = ()
    GlobalCounters["kernels"] += 1
    if spec.local_size is None: return self.runner.prg(*[b._buf for b in self.bufs], vals=vals, wait=wait)  # loops (CPU): its own mapping
    glb, lcl = spec.launch_dims({v.arg[0]: x for v, x in zip(spec.vars, vals)})
    return self.runner.prg(*[b._buf for b in self.bufs], global_size=glb, local_size=lcl, vals=vals, wait=wait)


CAPTURING: list[list[ExecItem]] = []  # TinyJit pushes a list here to record the ExecItems that run


def lower_item(it: ScheduleItem) -> ExecItem:
  """The ExecItem for a schedule item: allocate its buffers and get (compile) its program."""
  bufs = [buffer_for(b).ensure_allocated() for b in it.bufs]
  runner = None if it.ast.op is Ops.COPY else runner_of(it)
  return ExecItem(runner, bufs, {v.arg[0]: val for v, val in it.var_vals.items()})


def _run_one(ei: ExecItem, debug: int) -> None:
  et = ei.run(wait=debug >= 2)
  if CAPTURING: CAPTURING[-1].append(ei)
  if debug >= 2 and et is not None and ei.runner is not None:
    spec = ei.runner.spec
    flops = profile.kernel_flops(spec, ei.var_vals)
    print(f"  {ei.runner.device:8s} {spec.name:30s} {et * 1e6:9.1f} us  {flops / max(et, 1e-9) / 1e9:8.2f} GFLOPS "
          f"{spec.mem_bytes / max(et, 1e-9) / 1e9:8.2f} GB/s")


def run_schedule(items: list[ScheduleItem]) -> None:
  """Execute schedule items in order (recording them when a TinyJit is capturing)."""
  debug = getenv("DEBUG", 0)
  st = time.perf_counter()
  for it in items: _run_one(lower_item(it), debug)
  if debug >= 1 and items:
    print(f"schedule: {len(items)} items in {(time.perf_counter() - st) * 1e3:.2f} ms")


def run_exec_items(eis: list[ExecItem], debug: int) -> None:
  """Run ExecItems lowered already (a cached plan, engine/plan.py) exactly as run_schedule runs its items."""
  st = time.perf_counter() if debug >= 1 else 0.0
  for ei in eis: _run_one(ei, debug)
  if debug >= 1 and eis:
    print(f"schedule: {len(eis)} items in {(time.perf_counter() - st) * 1e3:.2f} ms")


def _missing(v: UOp):
  raise RuntimeError(f"kernel needs a value for variable {v.arg[0]!r}, which was not bound")
