"""What SQTT costs on the mock AMD GPU: a float32 matmul launched on DEV=MOCK+AMD without tracing, then with SQTT=1
PROFILE=1 (thread trace programmed through PM4, the RDNA3 emulator writing packets, the plugin decoding them onto the
kernel's disassembly), each in a fresh process, same sizes, compile cache warm. Reports seconds a launch (best of
--reps after one warm-up), the traced/untraced ratio, and the trace's waves and instructions.

  .venv/bin/python bench/bench_sqtt.py [--n 32] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, sys, time
import numpy as np
from plugrad import Tensor
from plugrad.viz import capture
n, reps = int(sys.argv[1]), int(sys.argv[2])
a = Tensor(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)).realize()
b = Tensor(np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)).realize()
(a @ b).realize()
best = float("inf")
for _ in range(reps):
  t0 = time.perf_counter(); (a @ b).realize().numpy(); best = min(best, time.perf_counter() - t0)
kt = capture.TRACE.kernel_traces
print(json.dumps({"s": best, "waves": len(kt[-1].waves) if kt else 0, "insts": sum(len(w.insts) for w in kt[-1].waves) if kt else 0}))
"""


def run(n: int, reps: int, traced: bool) -> dict:
  env = {**os.environ, "DEV": "MOCK+AMD"}
  for k in ("SQTT", "PROFILE", "VIZ"): env.pop(k, None)
  if traced: env.update(SQTT="1", PROFILE="1", PROFILE_PATH=os.devnull)
  out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(reps)], env=env, capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=32)
  ap.add_argument("--reps", type=int, default=3)
  args = ap.parse_args()
  off, on = run(args.n, args.reps, False), run(args.n, args.reps, True)
  print(f"{args.n}x{args.n} f32 matmul on MOCK+AMD: untraced {off['s']:.3f} s, SQTT {on['s']:.3f} s = {on['s'] / off['s']:.2f}x; "
        f"trace: {on['waves']} waves, {on['insts']} instructions")


if __name__ == "__main__": main()
