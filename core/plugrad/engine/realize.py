"""Run a schedule: allocate buffers, compile kernels (cached per device and AST), launch them, copy between devices.

BUFFER uops map to device Buffers through `BUFFERS` (weakly: a Buffer lives as long as its uop is referenced).
DEBUG=1 prints each schedule's kernel count and time; DEBUG=2 each kernel with its time, GFLOPS and GB/s;
DEBUG=4 the generated source; DEBUG=5 each kernel's AST; DEBUG=6 also its linearized program.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

from plugrad.codegen import ProgramSpec, get_program
from plugrad.device import Buffer, Device, Program
from plugrad.helpers import getenv
from plugrad.schedule.kernelize import ScheduleItem
from plugrad.uop.ops import Ops, UOp, pretty
from plugrad.uop.symbolic import sym_infer

BUFFERS: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()


def buffer_for(u: UOp) -> Buffer:
  """The device Buffer behind a BUFFER uop (created, unallocated, on first use)."""
  if (b := BUFFERS.get(u)) is not None: return b
  if u.op is Ops.BUFFER: b = Buffer(u.src[1].arg, u.arg, u.dtype)
  elif u.op is Ops.BUFFER_VIEW: b = buffer_for(u.src[0]).view(u.arg[0], u.dtype, u.arg[1])
  else: raise TypeError(f"buffer_for needs a BUFFER or BUFFER_VIEW uop, got {u.op}")
  BUFFERS[u] = b
  return b


@dataclass
class CompiledRunner:
  spec: ProgramSpec
  prg: Program
  device: str


_RUNNERS: dict[tuple[str, UOp], CompiledRunner] = {}
GlobalCounters = {"kernels": 0, "compiles": 0, "time": 0.0}


def get_runner(device: str, ast: UOp) -> CompiledRunner:
  """The compiled program for `ast` on `device` (compiled once per process, and cached on disk by the compiler)."""
  if (r := _RUNNERS.get((device, ast))) is not None: return r
  dev = Device[device]
  spec = get_program(ast, dev.renderer)
  if (debug := getenv("DEBUG", 0)) >= 5:
    print(f"kernel {spec.name} AST:\n{pretty(ast, max_lines=1 << 30)}")
    if debug >= 6: print("linearized:\n" + "\n".join(f"  {i:4d} {u.op.name:14s} {u.dtype!r:40s} {u.arg!r}" for i, u in enumerate(spec.uops)))
  if debug >= 4: print(spec.src)
  lib = dev.compiler.compile_cached(spec.src)
  GlobalCounters["compiles"] += 1
  r = _RUNNERS[(device, ast)] = CompiledRunner(spec, dev.load(spec.name, lib), device)
  return r


def run_schedule(items: list[ScheduleItem]) -> None:
  """Execute schedule items in order."""
  debug = getenv("DEBUG", 0)
  st = time.perf_counter()
  for it in items:
    bufs = [buffer_for(b).ensure_allocated() for b in it.bufs]
    if it.ast.op is Ops.COPY:
      bufs[0].copy_from(bufs[1])
      continue
    runner = get_runner(bufs[0].device, it.ast)
    vals = tuple(it.var_vals[v] if v in it.var_vals else _missing(v) for v in runner.spec.vars)
    et = runner.prg(*[b._buf for b in bufs], vals=vals, wait=debug >= 2)
    GlobalCounters["kernels"] += 1
    if debug >= 2 and et is not None:
      var_vals = {v: it.var_vals[v] for v in runner.spec.vars}
      flops = sym_infer(runner.spec.flops, var_vals)
      print(f"  {runner.device:8s} {runner.spec.name:30s} {et * 1e6:9.1f} us  {flops / max(et, 1e-9) / 1e9:8.2f} GFLOPS "
            f"{runner.spec.mem_bytes / max(et, 1e-9) / 1e9:8.2f} GB/s")
  if debug >= 1 and items:
    print(f"schedule: {len(items)} items in {(time.perf_counter() - st) * 1e3:.2f} ms")


def _missing(v: UOp):
  raise RuntimeError(f"kernel needs a value for variable {v.arg[0]!r}, which was not bound")
