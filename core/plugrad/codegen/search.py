"""The optimizations a kernel runs with (`kernel_opts`, asked by the scheduler once per kernel): BEAM's, else the heuristic's.

BEAM search picks a kernel's optimizations by timing candidates on the device and remembers the winner on disk.
With `BEAM=n` (n >= 1) `beam_opts(ast, device)` searches for each new kernel. Starting from no optimization
and from the heuristic's choice, each round extends every kept candidate by one optimization (UPCAST/UNROLL/SPLIT on
any renderer, LOCAL/GROUP/GROUPTOP on GPU renderers, OUTER/BLOCK/PACK on CPU ones: each registered kind's BEAM rule in
codegen/optops.py), compiles and times them
on the device with scratch buffers, and keeps the n fastest; it stops when a round improves nothing (at most
`BEAM_ROUNDS`, default 3; at most `BEAM_CANDIDATES`, default 48, timed per round). A winner other than the heuristic's
choice is timed against it again, alternating (`BEAM_CONFIRM` times, default 5), and kept only when at least 3% faster
(on a busy machine a lucky timing is not a better kernel). The winner is stored as JSON
under `$PLUGRAD_CACHE_DIR/beam/` keyed by sha256 of the
kernel AST, the device name and the renderer's arch, so a later process reuses it without timing. Kernels with
symbolic sizes keep the heuristic (their timing would depend on the variables). Works on every device, CPU included.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

from plugrad.codegen import apply_opts, get_program
from plugrad.codegen.gpudims import uses_gpudims
from plugrad.codegen.facts import ranges_of
from plugrad.codegen.opt import merge_reduce_ranges
from plugrad.codegen.heuristic import choose_gpu_opts, heuristic_opts
from plugrad.codegen.optops import Opt, beam_actions
from plugrad.codegen.pack import pack_candidate, split_packs
from plugrad.device import Buffer, Device
from plugrad.helpers import cache_dir, getenv
from plugrad.uop.ops import Ops, UOp

def _key(ast: UOp, device: str, arch: str | None) -> str:
  return hashlib.sha256(f"{ast!r}\0{device}\0{arch}".encode()).hexdigest()


def _actions(ast: UOp, gpu: bool, orig: UOp | None = None, opts: tuple[Opt, ...] = ()) -> list[Opt]:
  """One more optimization for `ast` (the kernel with `opts` applied): every registered kind's BEAM rule
  (codegen/optops.py) and, on CPU renderers and the unoptimized kernel `orig`, packing of an operand along a global
  range (PACK adds a kernel, so it is planned on `orig`)."""
  acts = beam_actions(ast, gpu)
  if not gpu and orig is not None and not any(o.kind == "PACK" for o in opts):
    for r in ranges_of(orig).values():
      if r.arg[1] == "global" and len(r.arg) == 2:
        acts += [Opt("PACK", r.arg[0], a) for a in (16, 32) if pack_candidate(orig, r, a, []) is not None]
  return acts


def _apply(ast: UOp, opts: list[Opt], renderer) -> UOp:
  """`ast` with `opts` (PACK as codegen/pack.py's plan: the main kernel reading the packed layout)."""
  if any(o.kind == "PACK" for o in opts):
    plan = split_packs(ast, opts)
    return apply_opts(plan.ast, plan.opts, renderer)
  return apply_opts(ast, opts, renderer)


def scratch_buffers(ast: UOp, device: str) -> list[Buffer]:
  """Buffers for timing `ast`'s parameters, written once (zeros): a fresh host allocation is only mapped to the
  shared zero page until written, so a kernel timed on it reads one cached page (a matmul ran 10-20% faster than on
  real data and the search ranked candidates by that)."""
  globs = sorted((n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL), key=lambda n: n.arg)
  bufs = [Buffer(device, max(g.dtype.size, 1), g.dtype.base).ensure_allocated() for g in globs]
  for b in bufs: b.copyin(memoryview(bytearray(b.nbytes)))
  return bufs


def _time(ast: UOp, opts: list[Opt], device: str, bufs: list[Buffer]) -> float:
  """Seconds of the best of 3 launches of `ast` compiled with `opts`, packing kernels included, every chunk of a
  chunked PACK (each on the first chunk's buffers: the same work) (inf when the opts don't fit or fail)."""
  dev = Device[device]
  def load(a: UOp, o: list[Opt] | None = None) -> tuple:
    spec = get_program(a, dev.renderer, o)
    kw = {} if spec.local_size is None else dict(zip(("global_size", "local_size"), spec.launch_dims({})))
    return dev.load(spec.name, dev.compiler.compile_cached(spec.src)), kw
  try:
    pre: list[tuple] = []
    chunks, rest = 1, None
    if any(o.kind == "PACK" for o in opts):
      plan = split_packs(ast, opts)
      for pk in plan.packs:
        pre.append((load(pk.ast)[0], Buffer(device, pk.size, pk.dtype).ensure_allocated(), [bufs[i] for i in pk.srcs]))
      (prg, kw), main = load(plan.ast, plan.opts), [bufs[s] if s >= 0 else pre[-1 - s][1] for s in plan.slots]
      if plan.rest is not None:   # the sum so far: the output's scratch twin
        sofar = Buffer(device, bufs[0].size, bufs[0].dtype).ensure_allocated()
        chunks, rest = plan.chunks, load(plan.rest.ast, plan.rest.opts)[0]
        rest_bufs = [sofar if s == plan.sofar else bufs[s] if s >= 0 else pre[-1 - s][1] for s in plan.rest.slots]
    else: (prg, kw), main = load(ast, opts), bufs
    def once() -> float:
      t = 0.0
      for c in range(chunks):
        t += sum(p(sc._buf, *[b._buf for b in srcs], wait=True) or 0.0 for p, sc, srcs in pre)
        t += ((rest if c else prg)(*[b._buf for b in (rest_bufs if c else main)], wait=True, **kw) or float("inf"))
      return t
    return min(once() for _ in range(3))
  except (ValueError, AssertionError, RuntimeError, NotImplementedError): return float("inf")


def beam_search(ast: UOp, device: str, width: int) -> list[Opt]:
  """The fastest optimizations found by a beam of `width` (see the module docstring)."""
  dev = Device[device]
  gpu = uses_gpudims(dev.renderer.caps)
  bufs = scratch_buffers(ast, device)
  start = choose_gpu_opts(ast, dev.renderer.caps) if gpu else heuristic_opts(ast, dev.renderer.caps)
  scored = sorted({(_time(ast, o, device, bufs), tuple(o)) for o in ([], start)}, key=lambda x: x[0])
  best = scored[0]
  for _ in range(getenv("BEAM_ROUNDS", 3)):
    cands = set()
    for _, opts in scored[:width]:
      try: cur = _apply(ast, list(opts), dev.renderer)
      except (ValueError, AssertionError): continue
      cands.update(opts + (a,) for a in _actions(cur, gpu, ast, opts))
    cands_l = sorted(cands, key=lambda c: [(o.kind, o.rid, o.amount, o.arg) for o in c])[:getenv("BEAM_CANDIDATES", 48)]
    scored = sorted(((_time(ast, list(c), device, bufs), c) for c in cands_l), key=lambda x: x[0])
    if not scored or scored[0][0] >= best[0]: break
    best = scored[0]
  if list(best[1]) != list(start) and start:  # confirm against the heuristic, alternating (a busy machine's noise
    tb, ts = [], []                           # must not replace it with something slower)
    for _ in range(getenv("BEAM_CONFIRM", 5)): tb.append(_time(ast, list(best[1]), device, bufs)); ts.append(_time(ast, start, device, bufs))
    if min(tb) > min(ts) * 0.97: return list(start)
  return list(best[1])


_BEAM_WRITES = [0]   # bumped whenever a search stores a winner: lookups remembered before it may be stale


def beam_opts(ast: UOp, device: str) -> list[Opt] | None:
  """The searched optimizations for `ast` on `device`: searched when BEAM is set and none are cached; what an earlier
  search found is reused from the disk cache without BEAM too (BEAM_REUSE=0: only with BEAM). None: use the heuristic."""
  width = getenv("BEAM", 0)
  if (width <= 0 and not getenv("BEAM_REUSE", 1)) or any(n.op is Ops.DEFINE_VAR for n in ast.toposort()): return None
  dev = Device[device]
  path = cache_dir() / "beam" / _key(ast, device, dev.renderer.arch)
  try: return [Opt(o[0], o[1], o[2], tuple(o[3]) if len(o) > 3 else ()) for o in json.loads(path.read_text())]
  except (OSError, ValueError, TypeError): pass
  if width <= 0: return None
  st = time.perf_counter()
  opts = beam_search(ast, device, width)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps([[o.kind, o.rid, o.amount, list(o.arg)] for o in opts]))
  tmp.replace(path)
  _BEAM_WRITES[0] += 1
  if getenv("DEBUG", 0) >= 1: print(f"BEAM={width}: {opts} in {time.perf_counter() - st:.2f} s")
  return opts


def kernel_opts(ast: UOp, device: str) -> tuple[UOp, tuple[Opt, ...] | None]:
  """The kernel to compile for `ast` on `device` and its optimizations, chosen once per schedule: BEAM's (searched, or
  cached on disk); else, on renderers without launch dimensions, the heuristic's on the kernel with its contiguous
  reduce ranges merged (the `merge ranges` pass, which explicit opts skip); else None (the codegen pipeline's own
  choice: the GPU heuristic, or NOOPT). A PACK among them adds kernels, which the scheduler splits off (codegen/pack.py's
  `split_packs`). Remembered on the AST per device, capability record and the settings that decide it (a disk cache
  lookup hashes the whole AST: ~50 us a kernel, paid once, not per schedule)."""
  caps = Device[device].renderer.caps
  key = ("kernel_opts", device, caps, getenv("BEAM", 0), getenv("BEAM_REUSE", 1), getenv("NOOPT", 0), os.environ.get("PLUGRAD_CACHE_DIR"),
         _BEAM_WRITES[0])
  memo = ast._cached()
  if (hit := memo.get(key)) is None:
    if (beam := beam_opts(ast, device)) is not None: hit = (None, tuple(beam))
    elif uses_gpudims(caps) or getenv("NOOPT", 0): hit = (None, None)
    else:
      merged = merge_reduce_ranges(ast)
      # (the AST itself is remembered as None: a reference from its own cache would be a cycle only a collection frees)
      hit = (None if merged is ast else merged, tuple(heuristic_opts(merged, caps)))
    memo[key] = hit
  return (ast if hit[0] is None else hit[0]), hit[1]
