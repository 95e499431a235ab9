"""Roofline distance of the GPU kernels codegen makes, counted on the emulated GPU (EMULATE=<target> DEV=PYTHON).

For sum / softmax / layernorm / float16 matmul this runs each kernel on the PYTHON device's GPU emulator and reads its counters
(plugrad.plugins.python.GPU_COUNTERS): 32-byte global-memory sectors moved per warp instruction, barriers, lane
utilization, WMMAs. The hardware-time estimate is max(sector bytes / bandwidth, FLOPs / peak) with the target's
figures (codegen/targets.py: H200 for CUDA); the roofline is max(unique bytes / bandwidth, FLOPs / peak). The ratio
says how far the kernel's memory traffic and math are from the floor. It ignores caches (every sector a warp
instruction touches counts, so re-reads an L2 would serve count as DRAM traffic), latency and occupancy.
Usage: python bench/bench_gpu_emu.py [TARGET] [MATMUL_N ...]   (default 128 256; sizes are small: the emulator is pure Python)
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("EMULATE", sys.argv[1] if len(sys.argv) > 1 else "CUDA")

import numpy as np

from plugrad import Tensor
from plugrad.codegen.targets import get_target
from plugrad.plugins.python import GPU_COUNTERS, reset_gpu_counters


def measure(name: str, make, min_bytes: int, flops: int, fdt: str) -> str:
  t = make()  # the inputs are realized already: the counters see only this expression's kernels
  reset_gpu_counters()
  t.realize()
  c = dict(GPU_COUNTERS)
  tgt = get_target(os.environ["EMULATE"])
  moved = 32 * (c["global_load_sectors"] + c["global_store_sectors"])
  est = max(moved / tgt.mem_bw, flops / tgt.peak_flops[fdt])
  floor = max(min_bytes / tgt.mem_bw, flops / tgt.peak_flops[fdt])
  util = c["active_lanes"] / max(c["lane_slots"], 1)
  return (f"| {name} | {c['launches']} | {moved / 1e6:.3f} | {min_bytes / 1e6:.3f} | {c['barriers']} | {util:.0%} | {c['wmma']} | "
          f"{est * 1e6:.2f} | {floor * 1e6:.2f} | {est / floor:.2f}x |")


def main() -> None:
  rng = np.random.default_rng(0)
  a = Tensor(rng.standard_normal((256, 1024)).astype(np.float32), device="PYTHON").realize()
  v = Tensor(rng.standard_normal(2**18).astype(np.float32), device="PYTHON").realize()
  s = Tensor(rng.standard_normal((64, 1024)).astype(np.float32), device="PYTHON").realize()
  sizes = [int(x) for x in sys.argv[2:]] or [128, 256]
  print(f"target {os.environ['EMULATE']}")
  print("| kernel | launches | MB moved | MB floor | barriers (per warp) | lanes active | WMMA | est. us | roofline us | distance |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  print(measure("sum(1) 256x1024 f32", lambda: a.sum(1), 4 * (256 * 1024 + 256), 256 * 1024, "float32"))
  print(measure("sum 2**18 f32", lambda: v.sum(), 4 * (2**18 + 1), 2**18, "float32"))
  print(measure("softmax(1) 64x1024 f32", lambda: s.softmax(1), 4 * 2 * 64 * 1024, 5 * 64 * 1024, "float32"))
  print(measure("layernorm 64x1024 f32", lambda: s.layernorm(), 4 * 2 * 64 * 1024, 7 * 64 * 1024, "float32"))
  for n in sizes:
    x = Tensor(rng.standard_normal((n, n)).astype(np.float16), device="PYTHON").realize()
    y = Tensor(rng.standard_normal((n, n)).astype(np.float16), device="PYTHON").realize()
    print(measure(f"matmul {n}^3 f16", lambda: (x @ y), 2 * 3 * n * n, 2 * n**3, "float16"))


if __name__ == "__main__": main()
