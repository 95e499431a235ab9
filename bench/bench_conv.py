"""Benchmark conv2d forward, input gradient and weight gradient: plugrad vs PyTorch CPU (oneDNN), same run, same threads.

Not a test. Run from the repo root:

  .venv/bin/python bench/bench_conv.py [--threads N] [--reps 7] [--layers digits|resnet|all] [--json]

Each pass is a jitted plugrad function on realized inputs (forward: y = conv(x, w); input gradient: dx from dy;
weight gradient: dw from dy and x), timed per call with the device synchronized; torch runs `F.conv2d` and
`torch.ops.aten.convolution_backward` with the one gradient asked for. The two alternate in blocks of calls after a
pause (bench/alternate.py: machine load hits both alike, and neither side's spinning threads slow the other), best of
about `reps` calls each. `ratio` = torch time / plugrad time (> 1: plugrad is faster). The floor is the
pass's FLOPs (2 * N * Cout * Cin/groups * kh * kw * OH * OW, the same for all three passes) / the measured FP32 peak
of the cores used (bench_tensor.measure_peak: clock x FMA throughput). The load average is recorded with the figures.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alternate import best_of_blocks

from plugrad import Device, Tensor, TinyJit

# (name, batch, cin, cout, size, kernel, stride, padding)
DIGITS = [("digits conv1 1->16 8x8", 64, 1, 16, 8, 3, 1, 1), ("digits conv2 16->32 4x4", 64, 16, 32, 4, 3, 1, 1)]
RESNET = [("resnet 64->64 56x56", 32, 64, 64, 56, 3, 1, 1), ("resnet 128->128 28x28", 32, 128, 128, 28, 3, 1, 1),
          ("resnet 256->256 14x14", 32, 256, 256, 14, 3, 1, 1), ("resnet 64->128 56x56 s2", 32, 64, 128, 56, 3, 2, 1),
          ("resnet 128->256 28x28 s2", 32, 128, 256, 28, 3, 2, 1)]


def _peak(threads: int) -> float:
  spec = importlib.util.spec_from_file_location("bench_tensor", Path(__file__).with_name("bench_tensor.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.measure_peak(threads)["gflops_all"] * 1e9


def bench_layer(torch, layer, reps: int) -> dict:
  name, bs, cin, cout, size, k, s, p = layer
  rng = np.random.default_rng(0)
  x_np = rng.standard_normal((bs, cin, size, size)).astype(np.float32)
  w_np = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
  o = (size + 2 * p - k) // s + 1
  dy_np = rng.standard_normal((bs, cout, o, o)).astype(np.float32)
  x, w, dy = Tensor(x_np).realize(), Tensor(w_np).realize(), Tensor(dy_np).realize()
  dev = Device[Device.DEFAULT]

  @TinyJit
  def fwd(x, w): return x.conv2d(w, stride=s, padding=p).realize()
  def grads(x, w, dy):
    xx, ww = Tensor(x.uop, requires_grad=True), Tensor(w.uop, requires_grad=True)
    (xx.conv2d(ww, stride=s, padding=p) * dy).sum().backward()
    return xx.grad, ww.grad
  @TinyJit
  def dxf(x, w, dy): return grads(x, w, dy)[0].realize()
  @TinyJit
  def dwf(x, w, dy): return grads(x, w, dy)[1].realize()
  tx, tw, tdy = torch.from_numpy(x_np), torch.from_numpy(w_np), torch.from_numpy(dy_np)
  F = torch.nn.functional
  def t_bwd(mask):
    return torch.ops.aten.convolution_backward(tdy, tx, tw, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, mask)
  passes = {"forward": (lambda: fwd(x, w), lambda: F.conv2d(tx, tw, stride=s, padding=p), lambda: fwd(x, w).numpy(),
                        lambda: F.conv2d(tx, tw, stride=s, padding=p).numpy()),
            "input grad": (lambda: dxf(x, w, dy), lambda: t_bwd([True, False, False]), lambda: dxf(x, w, dy).numpy(),
                           lambda: t_bwd([True, False, False])[0].numpy()),
            "weight grad": (lambda: dwf(x, w, dy), lambda: t_bwd([False, True, False]), lambda: dwf(x, w, dy).numpy(),
                            lambda: t_bwd([False, True, False])[1].numpy())}
  fl = 2 * bs * cout * cin * k * k * o * o
  out = {"layer": name, "gflop": fl / 1e9}
  for pname, (ours, theirs, ours_np, theirs_np) in passes.items():
    err = float(np.abs(ours_np() - theirs_np()).max())  # also the jit's first two calls (run, capture)
    for _ in range(2): ours(); dev.synchronize(); theirs()
    with torch.no_grad(): tp, tt = best_of_blocks(lambda: (ours(), dev.synchronize()), theirs, reps)
    out[pname] = {"plugrad_ms": min(tp) * 1e3, "torch_ms": min(tt) * 1e3, "ratio": min(tt) / min(tp), "max_abs_err": err}
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--threads", type=int, default=None, help="CPU_THREADS for plugrad and torch (default: env or all cores)")
  ap.add_argument("--reps", type=int, default=7)
  ap.add_argument("--layers", choices=("digits", "resnet", "all"), default="all")
  ap.add_argument("--json", action="store_true")
  a = ap.parse_args()
  if a.threads is not None: os.environ["CPU_THREADS"] = str(a.threads)
  threads = int(os.environ.get("CPU_THREADS", os.cpu_count() or 1))
  import torch
  torch.set_num_threads(threads)
  peak = _peak(threads)
  layers = (DIGITS if a.layers != "resnet" else []) + (RESNET if a.layers != "digits" else [])
  load0 = os.getloadavg()[0]
  rows = [bench_layer(torch, layer, a.reps) for layer in layers]
  res = {"date": time.strftime("%Y-%m-%d %H:%M"), "threads": threads, "torch": torch.__version__, "peak_gflops": peak / 1e9,
         "load": [load0, os.getloadavg()[0]], "rows": rows}
  if a.json:
    print(json.dumps(res, indent=1))
    return
  print(f"{res['date']}  threads={threads}  torch {torch.__version__}  peak {peak / 1e9:.0f} GFLOPS  load {load0:.1f} -> {res['load'][1]:.1f}")
  print(f"{'layer':<26} {'pass':<12} {'plugrad ms':>10} {'torch ms':>9} {'torch/pg':>8} {'GFLOPS':>7} {'x floor':>7} {'max err':>8}")
  for r in rows:
    for pname in ("forward", "input grad", "weight grad"):
      v = r[pname]
      floor_ms = r["gflop"] / (peak / 1e9) * 1e3
      print(f"{r['layer']:<26} {pname:<12} {v['plugrad_ms']:10.3f} {v['torch_ms']:9.3f} {v['ratio']:8.2f} "
            f"{r['gflop'] / v['plugrad_ms'] * 1e3:7.1f} {v['plugrad_ms'] / floor_ms:7.1f} {v['max_abs_err']:8.1e}")


if __name__ == "__main__":
  main()
