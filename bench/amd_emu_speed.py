"""RDNA3 emulator speed on warm kernels (BENCHMARKS.md), against the peer that runs the same kernels without machine
code: the PYTHON device's GPU interpreter (EMULATE=AMD), which executes the linear IR of the same gfx1100-optimized
kernel AST (same launch, same group reductions / WMMA). Interleaved, best of N per side.

  .venv/bin/python bench/amd_emu_speed.py [N]

Each workload runs once per device first (compile, decode), then N timed runs each. Figures: wall time per run on
DEV=MOCK+AMD (whole runtime: queues, mock, emulator) and on EMULATE=AMD DEV=PYTHON, and the emulator's wave-instructions
per second over the timed MOCK+AMD runs.
"""
from __future__ import annotations

import os
import sys
import time

os.environ["EMULATE"] = "AMD"  # read when the PYTHON device is created: it emulates gfx1100's launch limits and WMMA

import numpy as np

from plugrad import Tensor
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad_amd.mock import rdna3

RNG = np.random.default_rng(0)
A = RNG.standard_normal(2**18).astype(np.float32)
M = RNG.standard_normal((128, 128)).astype(np.float16)
X = RNG.standard_normal((64, 256)).astype(np.float32)
WORK = {
  "sum 2**18 f32 (group reduce)": lambda d: Tensor(A, device=d).sum(),
  "matmul 128^3 f16 (WMMA)": lambda d: Tensor(M, device=d).matmul(Tensor(M, device=d), dtype=dtypes.float32),
  "softmax(1) 64x256 f32": lambda d: Tensor(X, device=d).softmax(axis=1),
  "elementwise exp2*x+1 2**18": lambda d: (Tensor(A, device=d).exp2() * Tensor(A, device=d) + 1),
}


def once(fn, dev: str) -> float:
  t = fn(dev)
  Device[dev].synchronize()
  st = time.perf_counter()
  t.realize()
  Device[dev].synchronize()
  return time.perf_counter() - st


def main() -> int:
  n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
  print(f"load {os.getloadavg()[0]:.1f}; best of {n}, interleaved")
  print("| workload | MOCK+AMD s | EMULATE=AMD PYTHON s | ratio (PYTHON / MOCK+AMD) | wave-instructions | M wave-instr/s |")
  print("|---|---|---|---|---|---|")
  for name, fn in WORK.items():
    once(fn, "MOCK+AMD"), once(fn, "PYTHON")  # compile / decode
    mock, py, inst, secs = [], [], 0, 0.0
    for _ in range(n):
      i0, s0 = rdna3.STATS.instructions, rdna3.STATS.seconds
      mock.append(once(fn, "MOCK+AMD"))
      inst, secs = inst + rdna3.STATS.instructions - i0, secs + rdna3.STATS.seconds - s0
      py.append(once(fn, "PYTHON"))
    print(f"| {name} | {min(mock):.3f} | {min(py):.3f} | {min(py) / min(mock):.1f}x | {inst // n} | {inst / secs / 1e6:.2f} |")
  return 0


if __name__ == "__main__": sys.exit(main())
