"""TinyJit replay overhead: host time per kernel when replaying a captured 100-kernel graph on the CPU device.

Run: .venv/bin/python bench/bench_jit.py [--kernels 100] [--calls 200]
Each kernel is a tiny elementwise op on 16 floats, so the time is almost all host overhead (the issue's target is
<= 10 us per kernel). Replay is timed batched (the device's batch runner, the default) and item by item (as with
JIT_BATCH=0), alternating in one process; the same chain run eagerly (schedule cache hit, no JIT) is printed for comparison.
"""
import argparse
import time

import numpy as np

from plugrad import Tensor, TinyJit


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--kernels", type=int, default=100)
  ap.add_argument("--calls", type=int, default=200)
  args = ap.parse_args()

  def chain(x: Tensor) -> Tensor:
    for _ in range(args.kernels): x = (x + 1).contiguous()
    return x

  jitted = TinyJit(chain)
  x = Tensor(np.zeros(16, np.float32)).realize()
  for _ in range(3): jitted(x)
  assert jitted.cnt == 2 and len(jitted.captured) == args.kernels
  plan, times = jitted.plan, {"batched": [], "item by item": []}
  for r in range(10):
    for mode in times if r % 2 == 0 else reversed(list(times)):
      jitted.plan = plan if mode == "batched" else []
      st = time.perf_counter()
      for _ in range(args.calls): jitted(x)
      times[mode].append((time.perf_counter() - st) / args.calls)
  jitted.plan = plan
  eager = []
  for _ in range(3):
    st = time.perf_counter()
    chain(x).realize()
    eager.append(time.perf_counter() - st)
  for mode, best in times.items():
    per = min(best) / args.kernels
    print(f"replay of {args.kernels} kernels, {mode}: {min(best) * 1e3:.3f} ms per call (median {sorted(best)[len(best) // 2] * 1e3:.3f}), "
          f"{per * 1e6:.2f} us per kernel (target <= 10 us)")
  print(f"eager (schedule cache hit): {min(eager) * 1e3:.2f} ms per call, {min(eager) / args.kernels * 1e6:.1f} us per kernel")


if __name__ == "__main__":
  main()
