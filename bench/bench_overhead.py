"""Per-realize host overhead of a cached kernel (no TinyJit) vs torch eager's per-op time, in the same process.

Run: .venv/bin/python bench/bench_overhead.py [--rounds 7] [--calls 300]
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


def best_of(fn, calls: int) -> float:
  st = time.perf_counter()
  for _ in range(calls): fn()
  return (time.perf_counter() - st) / calls


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
  cases = {
    "add": (lambda: a + b, lambda: ta + tb, 1),
    "chain (10 ops)": (lambda: chain(a), lambda: chain(ta), 10),
    "matmul 256": (lambda: x @ y, lambda: tx @ ty, 1),
  }
  # the matmul's kernels alone: captured by TinyJit, replayed through the CPU batch runner
  jit = TinyJit(lambda p, q: (p @ q).realize())
  for _ in range(3): jit(x, y)
  batch = jit.plan[0][0]
  if batch is None or len(jit.plan) != 1: raise RuntimeError("matmul 256 did not capture as one CPU batch")
  kernel = lambda: batch({}, [])

  res: dict[str, dict[str, float]] = {}
  for name, (ours, theirs, _) in cases.items():
    for _ in range(20): ours().realize(); theirs()
    r = {"build": 1e9, "total": 1e9, "torch": 1e9, "kernel": 0.0}
    for _ in range(args.rounds):
      r["build"] = min(r["build"], best_of(lambda: built.append(ours()) or built.pop(), args.calls))
      r["total"] = min(r["total"], best_of(lambda: ours().realize(), args.calls))
      r["torch"] = min(r["torch"], best_of(theirs, args.calls))
    if name == "matmul 256": r["kernel"] = min(best_of(kernel, args.calls) for _ in range(args.rounds))
    res[name] = r

  print(f"load: {os.getloadavg()[0]:.2f}  (uptime 1-min average), CPU_THREADS={os.environ.get('CPU_THREADS', 'all')}")
  print(f"{'case':16s} {'build':>9s} {'realize':>9s} {'total':>9s} {'kernel':>9s} {'host':>9s} {'torch':>9s} {'host/torch':>10s}")
  for name, r in res.items():
    host = r["total"] - r["kernel"]
    realize = r["total"] - r["build"]
    print(f"{name:16s} {r['build'] * 1e6:7.1f}us {realize * 1e6:7.1f}us {r['total'] * 1e6:7.1f}us {r['kernel'] * 1e6:7.1f}us "
          f"{host * 1e6:7.1f}us {r['torch'] * 1e6:7.1f}us {host / r['torch']:9.2f}x")
  print("host = total - kernel (matmul: the kernels replayed by the batch runner); torch = one eager call of the same ops")


if __name__ == "__main__":
  main()
