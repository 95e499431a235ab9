"""TinyJit replay overhead: host time per kernel when replaying a captured 100-kernel graph on the CPU device.

Run: .venv/bin/python bench/bench_jit.py [--kernels 100] [--calls 200]
Each kernel is a tiny elementwise op on 16 floats, so the time is almost all host overhead (the issue's target is
<= 10 us per kernel). The same chain run eagerly (schedule cache hit, no JIT) is printed for comparison.
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
  best = []
  for _ in range(5):
    st = time.perf_counter()
    for _ in range(args.calls): jitted(x)
    best.append((time.perf_counter() - st) / args.calls)
  eager = []
  for _ in range(3):
    st = time.perf_counter()
    chain(x).realize()
    eager.append(time.perf_counter() - st)
  per = min(best) / args.kernels
  print(f"replay of {args.kernels} kernels: {min(best) * 1e3:.3f} ms per call (median {sorted(best)[2] * 1e3:.3f}), "
        f"{per * 1e6:.2f} us per kernel (target <= 10 us)")
  print(f"eager (schedule cache hit): {min(eager) * 1e3:.2f} ms per call, {min(eager) / args.kernels * 1e6:.1f} us per kernel")


if __name__ == "__main__":
  main()
