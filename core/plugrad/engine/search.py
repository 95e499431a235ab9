"""BEAM search: pick a kernel's optimizations by timing candidates on the device, and remember the winner on disk.

With `BEAM=n` (n >= 1) the engine asks `beam_opts(ast, device)` for each new kernel. Starting from no optimization
and from the heuristic's choice, each round extends every kept candidate by one optimization (UPCAST/UNROLL/SPLIT on
any renderer, LOCAL/GROUP/GROUPTOP on GPU renderers, with the amounts in `AMOUNTS` that fit), compiles and times them
on the device with scratch buffers, and keeps the n fastest; it stops when a round improves nothing (at most
`BEAM_ROUNDS`, default 3; at most `BEAM_CANDIDATES`, default 48, timed per round). The winner is stored as JSON
under `$PLUGRAD_CACHE_DIR/beam/` keyed by sha256 of the
kernel AST, the device name and the renderer's arch, so a later process reuses it without timing. Kernels with
symbolic sizes keep the heuristic (their timing would depend on the variables). Works on every device, CPU included.
"""
from __future__ import annotations

import hashlib
import json
import time

from plugrad.codegen import apply_opts, get_program
from plugrad.codegen.gpudims import uses_gpudims
from plugrad.codegen.gpuopt import choose_gpu_opts
from plugrad.codegen.opt import Opt, heuristic_opts, ranges_of
from plugrad.device import Buffer, Device
from plugrad.helpers import cache_dir, getenv
from plugrad.uop.ops import Ops, UOp

AMOUNTS = (2, 4, 8, 16, 32, 64, 128, 256)


def _key(ast: UOp, device: str, arch: str | None) -> str:
  return hashlib.sha256(f"{ast!r}\0{device}\0{arch}".encode()).hexdigest()


def _actions(ast: UOp, gpu: bool) -> list[Opt]:
  acts = []
  for r in ranges_of(ast).values():
    if len(r.arg) > 2 or r.src[0].op is not Ops.CONST: continue
    kinds = (["LOCAL", "UPCAST"] if r.arg[1] == "global" else ["GROUP", "GROUPTOP", "UNROLL", "SPLIT"]) if gpu else \
            (["UPCAST"] if r.arg[1] == "global" else ["UNROLL", "SPLIT"])
    for kind in kinds:
      for a in (r.src[0].arg,) if kind == "UNROLL" else AMOUNTS if kind in ("LOCAL", "GROUP", "GROUPTOP") else AMOUNTS[:4]:
        if a <= r.src[0].arg and (kind == "UNROLL" and a <= 16 or r.src[0].arg % a == 0 or kind in ("LOCAL", "GROUP", "GROUPTOP")):
          acts.append(Opt(kind, r.arg[0], a))
  return acts


def _time(ast: UOp, opts: list[Opt], device: str, bufs: list[Buffer]) -> float:
  """Seconds of the best of 3 launches of `ast` compiled with `opts` (inf when the opts don't fit or fail)."""
  dev = Device[device]
  try:
    spec = get_program(ast, dev.renderer, opts)
    prg = dev.load(spec.name, dev.compiler.compile_cached(spec.src))
    kw = {} if spec.local_size is None else dict(zip(("global_size", "local_size"), spec.launch_dims({})))
    return min(prg(*[b._buf for b in bufs], wait=True, **kw) or float("inf") for _ in range(3))
  except (ValueError, AssertionError, RuntimeError, NotImplementedError): return float("inf")


def beam_search(ast: UOp, device: str, width: int) -> list[Opt]:
  """The fastest optimizations found by a beam of `width` (see the module docstring)."""
  dev = Device[device]
  gpu = uses_gpudims(dev.renderer)
  globs = sorted((n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL), key=lambda n: n.arg)
  bufs = [Buffer(device, max(g.dtype.size, 1), g.dtype.base).ensure_allocated() for g in globs]
  start = choose_gpu_opts(ast, dev.renderer) if gpu else heuristic_opts(ast, dev.renderer)
  scored = sorted({(_time(ast, o, device, bufs), tuple(o)) for o in ([], start)}, key=lambda x: x[0])
  best = scored[0]
  for _ in range(getenv("BEAM_ROUNDS", 3)):
    cands = set()
    for _, opts in scored[:width]:
      try: cur = apply_opts(ast, list(opts), dev.renderer)
      except (ValueError, AssertionError): continue
      cands.update(opts + (a,) for a in _actions(cur, gpu))
    cands_l = sorted(cands, key=lambda c: [(o.kind, o.rid, o.amount, o.arg) for o in c])[:getenv("BEAM_CANDIDATES", 48)]
    scored = sorted(((_time(ast, list(c), device, bufs), c) for c in cands_l), key=lambda x: x[0])
    if not scored or scored[0][0] >= best[0]: break
    best = scored[0]
  return list(best[1])


def beam_opts(ast: UOp, device: str) -> list[Opt] | None:
  """The cached or searched optimizations for `ast` on `device` when BEAM is set (None: use the heuristic)."""
  if (width := getenv("BEAM", 0)) <= 0 or any(n.op is Ops.DEFINE_VAR for n in ast.toposort()): return None
  dev = Device[device]
  path = cache_dir() / "beam" / _key(ast, device, dev.renderer.arch)
  try: return [Opt(o[0], o[1], o[2], tuple(o[3]) if len(o) > 3 else ()) for o in json.loads(path.read_text())]
  except (OSError, ValueError, TypeError): pass
  st = time.perf_counter()
  opts = beam_search(ast, device, width)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps([[o.kind, o.rid, o.amount, list(o.arg)] for o in opts]))
  tmp.replace(path)
  if getenv("DEBUG", 0) >= 1: print(f"BEAM={width}: {opts} in {time.perf_counter() - st:.2f} s")
  return opts
