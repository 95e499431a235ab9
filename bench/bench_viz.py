"""What VIZ/PROFILE recording costs: many small graph_rewrite calls and a cached realize() of a small kernel, with the
recording off (the default) and on, in one run. Not a test. Run from the repo root:

  .venv/bin/python bench/bench_viz.py

Off is the figure that matters (the hooks must cost nothing; docs/viz.md compares it with the commit before the hooks);
on is the in-run peer. Recording keeps every node alive, so "on" can even be faster here (hash-cons hits).
"""
from __future__ import annotations

import json
import time

import numpy as np

from plugrad import Tensor
from plugrad.uop import UOp, graph_rewrite, pm_symbolic
from plugrad.viz import capture


def small_rewrites_us() -> float:
  x = UOp.variable("x", 0, 100)
  exprs = [(x + i) * 1 + 0 for i in range(200)]
  t = time.perf_counter()
  for _ in range(20):
    for e in exprs: graph_rewrite(e, pm_symbolic)
  return (time.perf_counter() - t) / (20 * len(exprs)) * 1e6


def realize_us(a: Tensor) -> float:
  t = time.perf_counter()
  for _ in range(200): (a * 2 + 1).realize()
  return (time.perf_counter() - t) / 200 * 1e6


def main() -> None:
  a = Tensor(np.ones((16, 16), dtype=np.float32))
  realize_us(a)
  out: dict[str, dict[str, float]] = {"off": {}, "on": {}}
  for _ in range(3):  # alternate, keep the best of each: the machine's load drifts
    for name, on in (("off", False), ("on", True)):
      capture.enable(viz=on, profile=on)
      for k, v in (("small_rewrite_us", min(small_rewrites_us() for _ in range(3))), ("cached_realize_us", min(realize_us(a) for _ in range(3)))):
        out[name][k] = min(out[name].get(k, v), v)
      capture.TRACE.clear()
  capture.enable(viz=False, profile=False)
  out["on/off"] = {k: out["on"][k] / out["off"][k] for k in out["off"]}
  print(json.dumps(out, indent=1))


if __name__ == "__main__": main()
