"""BEAM search vs the CPU heuristic on the kernels the issue names: matmuls, x @ W.T, the digits CNN's convolutions and
their gradients, a ResNet-style 3x3 layer. Not a test.

  .venv/bin/python bench/bench_beam.py [--width 2] [--rounds 2] [--json]

For each kernel: the heuristic's opts and the search's winner (codegen/search.py, run here with an empty temporary
PLUGRAD_CACHE_DIR so nothing cached is reused), then both timed alternately (best of 7, packing kernels included), and
the ratio heuristic time / search time (> 1: the search found faster opts).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from plugrad import Tensor
from plugrad.codegen.heuristic import heuristic_opts
from plugrad.device import Buffer, Device
from plugrad.uop.ops import Ops


def kernels() -> list[tuple[str, object]]:
  rng = np.random.default_rng(0)
  def r(*s: int) -> Tensor: return Tensor(rng.standard_normal(s, dtype=np.float32)).realize()
  def grad_kernel(x: Tensor, f) -> object:
    x.requires_grad = True
    f(x).sum().backward()
    return max((it for it in x.grad.schedule() if it.ast.op is Ops.SINK), key=lambda it: it.ast.src[0].src[0].src[0].dtype.size).ast
  out = [("matmul 512", (r(512, 512) @ r(512, 512)).schedule()[-1].ast),
         ("x @ W.T 2048x256x768", (r(2048, 256) @ r(768, 256).T).schedule()[-1].ast)]
  w1, w2 = r(16, 1, 3, 3), r(32, 16, 3, 3)
  x2 = r(64, 16, 4, 4)
  out.append(("digits conv2 fwd 64x16x4x4", x2.conv2d(w2, padding=1).schedule()[-1].ast))
  out.append(("digits conv2 input grad", grad_kernel(r(64, 16, 4, 4), lambda x: x.conv2d(w2, padding=1).relu())))
  out.append(("digits conv1 fwd 64x1x8x8", r(64, 1, 8, 8).conv2d(w1, padding=1).schedule()[-1].ast))
  out.append(("resnet 3x3 32x64x14x14 fwd", r(32, 64, 14, 14).conv2d(r(64, 64, 3, 3), padding=1).schedule()[-1].ast))
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--width", type=int, default=2)
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--candidates", type=int, default=32)
  ap.add_argument("--json", action="store_true")
  a = ap.parse_args()
  os.environ.update(BEAM_ROUNDS=str(a.rounds), BEAM_CANDIDATES=str(a.candidates), PLUGRAD_CACHE_DIR=tempfile.mkdtemp(prefix="plugrad-beam-"))
  from plugrad.codegen import search
  dev = Device["CPU"]
  rows = []
  for name, ast in kernels():
    heur = heuristic_opts(ast, dev.renderer.caps)
    st = time.perf_counter()
    found = search.beam_search(ast, "CPU", a.width)
    s_search = time.perf_counter() - st
    globs = sorted((n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL), key=lambda n: n.arg)
    bufs = [Buffer("CPU", max(g.dtype.size, 1), g.dtype.base).ensure_allocated() for g in globs]
    th, tf = [], []
    for _ in range(7): th.append(search._time(ast, heur, "CPU", bufs)); tf.append(search._time(ast, found, "CPU", bufs))
    rows.append({"kernel": name, "heuristic_us": min(th) * 1e6, "beam_us": min(tf) * 1e6, "ratio": min(th) / min(tf),
                 "search_s": s_search, "heuristic": [(o.kind, o.rid, o.amount) for o in heur], "beam": [(o.kind, o.rid, o.amount) for o in found]})
    if not a.json:
      r = rows[-1]
      print(f"{name:30s} heuristic {r['heuristic_us']:9.1f} us  BEAM={a.width} {r['beam_us']:9.1f} us  x{r['ratio']:.2f}  "
            f"(search {s_search:.1f} s; load {os.getloadavg()[0]:.1f})\n    heuristic {r['heuristic']}\n    beam      {r['beam']}", flush=True)
  if a.json: print(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
