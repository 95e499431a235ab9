"""Per-realize host overhead of a cached kernel (no TinyJit) vs torch eager's per-op time, in the same process.

Run: .venv/bin/python bench/bench_overhead.py [--rounds 7] [--calls 300]
(before/after: PYTHONPATH=<old checkout>/core:<old checkout>/plugins/cpu runs it against an older tree)
Cases (all warm: the schedule and the kernel are cached before timing):
- add: `(a + b).realize()` of two realized 16-float tensors (the kernel itself is a few ns: the time is host overhead)
- chain: a 10-op elementwise chain on a 16-float tensor, fused into one kernel, built and realized per call
- matmul 256: `(x @ y).realize()` on realized 256x256 float32 tensors; its host time is the wall time minus the time of
  the same compiled kernels replayed by the CPU batch runner (one C call, ~0.1 us of host time per kernel)
Each figure is split into building the lazy graph (the Tensor ops) and `realize()`. torch runs the same ops eagerly on
tensors of the same shapes, alternating with ours (ours, torch, ours, ...), best of `--rounds` rounds of `--calls` calls.
"""
import argparse
import os
import time

import numpy as np
import torch

from plugrad import Tensor, TinyJit

try: from plugrad.engine import plan  # (absent before realize plans: the bench then runs for the "before" figures)
except ImportError: plan = None


def timed(fn, calls: int) -> tuple[float, float]:
  """(wall seconds, calling-thread CPU seconds) per call."""
  st, ct = time.perf_counter(), time.thread_time()
  for _ in range(calls): fn()
  return (time.perf_counter() - st) / calls, (time.thread_time() - ct) / calls


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--calls", type=int, default=300)
  args = ap.parse_args()
  torch.set_num_threads(int(os.environ.get("CPU_THREADS", os.cpu_count() or 1)))
  rng = np.random.default_rng(0)
  a_np, b_np = rng.random(16, np.float32), rng.random(16, np.float32)
  x_np, y_np = rng.random((256, 256), np.float32), rng.random((256, 256), np.float32)
  a, b, x, y = (Tensor(v).realize() for v in (a_np, b_np, x_np, y_np))
  ta, tb, tx, ty = (torch.from_numpy(v) for v in (a_np, b_np, x_np, y_np))

  def chain(t):
    for i in range(10): t = t * 1.01 + 0.5 if i % 2 else (t * 0.99).relu()
    return t
  built: list = []
  cases = {"add": (lambda: a + b, lambda: ta + tb), "chain (10 ops)": (lambda: chain(a), lambda: chain(ta)),
           "matmul 256": (lambda: x @ y, lambda: tx @ ty)}
  # the matmul's kernels alone: captured by TinyJit, replayed through the CPU batch runner (~0.1 us of host time)
  jit = TinyJit(lambda p, q: (p @ q).realize())
  for _ in range(3): jit(x, y)
  batch = jit.plan[0][0]
  if batch is None or len(jit.plan) != 1: raise RuntimeError("matmul 256 did not capture as one CPU batch")
  zero = (lambda: None, lambda: None)

  res: dict[str, dict[str, tuple[float, float]]] = {}
  for name, (ours, theirs) in cases.items():
    for _ in range(20): ours().realize(); theirs()
    kernel = (lambda: batch({}, [])) if name == "matmul 256" else zero[0]
    best = {k: (1e9, 1e9) for k in ("build", "total", "kernel", "torch")}
    for _ in range(args.rounds):  # interleaved: ours, the kernel alone, torch
      for k, fn in (("build", lambda: built.append(ours()) or built.pop()), ("total", lambda: ours().realize()),
                    ("kernel", kernel), ("torch", theirs)):
        w, c = timed(fn, args.calls)
        best[k] = (min(best[k][0], w), min(best[k][1], c))
    res[name] = best

  # matmul's host path alone: the same realize with each launch's C call made a no-op (machine load can't leak in)
  pl = None if plan is None else plan.lookup(plan.targets_signature([(x @ y).uop]))
  prgs = [] if pl is None else [it.runner.prg for it in pl.items if it.runner is not None]
  saved = [(p.fn, p._const_work) for p in prgs]
  for p in prgs: p.fn, p._const_work = (lambda *_: None), (0, 1)
  stub = min(timed(lambda: (x @ y).realize(), args.calls)[1] for _ in range(args.rounds))
  for p, (fn, cw) in zip(prgs, saved): p.fn, p._const_work = fn, cw

  us = lambda v: f"{v * 1e6:8.1f}"
  print(f"load: {os.getloadavg()[0]:.2f} (1-min average), CPU_THREADS={os.environ.get('CPU_THREADS', 'all')}; "
        "CPU time of the calling thread, best of rounds (wall time in parentheses)")
  print(f"{'case':16s} {'build':>8s} {'realize':>8s} {'kernel':>8s} {'host':>8s} {'torch':>8s} {'host/torch':>10s} {'(wall)':>9s} {'(torch)':>9s}")
  for name, r in res.items():
    build, total, kern, th = r["build"][1], r["total"][1], r["kernel"][1] if name == "matmul 256" else 0.0, r["torch"][1]
    print(f"{name:16s} {us(build)} {us(total - build - kern)} {us(kern)} {us(total - kern)} {us(th)} {(total - kern) / th:9.2f}x "
          f"{us(r['total'][0]):>9s} {us(r['torch'][0]):>9s}")
  if prgs: print(f"matmul 256 with its {len(prgs)} launches stubbed (the C call a no-op): build + realize {us(stub)} us, "
                 f"realize {us(stub - res['matmul 256']['build'][1])} us")
  else: print("matmul 256 did not take a realize plan")
  print("build: the Tensor ops alone; realize: realize() without the kernel; kernel: matmul's kernels replayed by the\n"
        "batch runner; host = build + realize; torch: one eager call of the same ops (the chain: 10 ops), kernels included")


if __name__ == "__main__":
  main()
