"""The LLM's one-token quantized products per GGUF type, in one process: the integer forms (`quant.dot4_linear`,
int8 activations and byte dot products, ACT_BITS=8's, where the host has DOT4 and the codes fit; `quant.dot2_linear`,
int16 activations and pairwise int16 multiply-adds, over the sub-block layout; `quant.rows_linear`, the same
numerics over weights stored output rows in lanes, the default for Q4_0-Q8_0 where the host has dot2), the blockwise
float form (`quant.blockwise_linear`) and the fused dequantize-then-multiply (`x.linear(w.T)`), each through TinyJit;
with --opts, hand-picked optimizations of the integer form's main kernel against the heuristic's (what the
SPLIT/UPCAST choices in codegen/opt.py were measured with: `rows_linear`'s where the weight is stored that way).

Run: .venv/bin/python bench/bench_quant.py [--types Q5_0,Q6_K] [--shape 4864x896] [--rows 1] [--calls 30]
     .venv/bin/python bench/bench_quant.py --types Q4_K --shape 896x4864 --opts "VECTOR:2:8,UPCAST:0:4,UNROLL:3:2,SPLIT:1:2"
(`--opts` lists one variant per --opts flag: kind:range id:amount, comma-separated; range ids as the heuristic's line
prints them). Figures are medians (and minimums) of --calls calls, microseconds; errors are relative to the largest
output of the `gguf` package's float64 dequantization times x.
"""
import argparse
import os
import time

import gguf
import numpy as np

from plugrad import Tensor, TinyJit
from plugrad.apps.llm.quant import (_REPACKABLE, blockwise_linear, blockwise_of, dot2_linear, dot4_bound, dot4_linear, fits_dot4, repack,
                                   rows_linear, vector_lanes)
from plugrad.codegen import get_program
from plugrad.codegen.facts import ranges_of
from plugrad.codegen.heuristic import heuristic_opts
from plugrad.codegen.optops import Opt
from plugrad.device import Device
from plugrad.engine.realize import buffer_for, lower_item
from plugrad.nn.serialize import dequantize

GEOMETRY = {q: g for g, q in _REPACKABLE.items()}
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,),
              "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def weight(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> tuple[Tensor, np.ndarray]:
  """A repacked (rows, cols) weight of random blocks with finite float16 scales, and its float64 dequantization."""
  elems, tsize = GEOMETRY[qtype]
  b = rng.integers(0, 256, (rows * cols // elems, tsize), dtype=np.uint8)
  for off in F16_FIELDS[qtype]: b[:, off:off + 2] = rng.uniform(-2, 2, len(b)).astype(np.float16).view(np.uint8).reshape(-1, 2)
  ref = gguf.quants.dequantize(b.reshape(rows, -1), getattr(gguf.GGMLQuantizationType, qtype)).astype(np.float64)
  return Tensor(repack(dequantize(Tensor(b).realize(), qtype).reshape(rows, -1).uop)), ref


def timed(f, calls: int) -> tuple[float, float]:
  ts = []
  for _ in range(calls):
    t = time.perf_counter(); f(); Device[Device.DEFAULT].synchronize(); ts.append(time.perf_counter() - t)
  return float(np.median(ts)) * 1e6, min(ts) * 1e6


def forms(qtype: str, rows: int, cols: int, batch: int, calls: int, rng: np.random.Generator) -> None:
  seed = int(rng.integers(1 << 31))   # the same blocks twice: in the sub-block layout, and output rows in lanes ("rows")
  os.environ["ROW_LANES"] = "0"
  try: w, ref = weight(qtype, rows, cols, np.random.default_rng(seed))
  finally: del os.environ["ROW_LANES"]
  wr, _ = weight(qtype, rows, cols, np.random.default_rng(seed))
  bw, lanes = blockwise_of(w.uop), vector_lanes(w.device)
  x = Tensor(rng.standard_normal((batch, 1, cols)).astype(np.float32)).realize()
  want = x.numpy()[:, 0].astype(np.float64) @ ref.T
  fns = {"dot2": lambda x: dot2_linear(x, bw, rows, lanes).realize(), "dense": lambda x: x.linear(w.transpose()).realize()}
  if fits_dot4(bw, dot4_bound(w.device)): fns = {"dot4": lambda x: dot4_linear(x, bw, rows, lanes).realize(), **fns}
  if batch == 1: fns["blockwise"] = lambda x: blockwise_linear(x, bw, rows, lanes).realize()
  if (bwr := blockwise_of(wr.uop)).rows is not None: fns["rows"] = lambda x: rows_linear(x, bwr, rows).realize()
  for name, fn in fns.items():
    jit = TinyJit(fn)
    for _ in range(3): y = jit(x)
    err = np.abs(y.numpy()[:, 0] - want).max() / np.abs(want).max()
    med, best = timed(lambda: jit(x), calls)
    print(f"{qtype:5s} {rows}x{cols} rows {batch}  {name:9s} median {med:8.1f} us  min {best:8.1f}  rel. error {err:.1e}")


def opts_sweep(qtype: str, rows: int, cols: int, batch: int, calls: int, variants: list[str], rng: np.random.Generator) -> None:
  w, _ = weight(qtype, rows, cols, rng)
  x = Tensor(rng.standard_normal((batch, 1, cols)).astype(np.float32)).realize()
  bw = blockwise_of(w.uop)
  y = rows_linear(x, bw, rows) if bw.rows is not None else dot2_linear(x, bw, rows, vector_lanes(w.device))
  *pre, it = y.schedule()
  for p in pre: lower_item(p).run()
  dev = Device[Device.DEFAULT]
  base = heuristic_opts(it.ast, dev.renderer.caps)
  print("ranges", {k: (r.arg[1], r.src[0].arg) for k, r in ranges_of(it.ast).items()}, "\nheuristic", base)
  bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
  cands = {"heuristic": base} | {v: [Opt(k, int(r), int(a)) for k, r, a in (o.split(":") for o in v.split(","))] for v in variants}
  for _ in range(2):   # two passes: the box's phase drifts
    for label, opts in cands.items():
      spec = get_program(it.ast, dev.renderer, opts)
      f = dev.load(spec.name, dev.compiler.compile_cached(spec.src))
      med, best = timed(lambda: f(*bufs, vals=()), calls)
      print(f"  {label:60s} median {med:8.1f} us  min {best:8.1f}")


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--types", default="Q4_0,Q4_1,Q5_0,Q8_0,Q4_K,Q6_K")
  ap.add_argument("--shape", default="4864x896", help="rows x cols of the weight (qwen2's gate: 4864x896, down: 896x4864)")
  ap.add_argument("--rows", type=int, default=1, help="rows of x (4: the batched decode step)")
  ap.add_argument("--calls", type=int, default=30)
  ap.add_argument("--opts", action="append", default=[])
  a = ap.parse_args()
  rows, cols = map(int, a.shape.split("x"))
  rng = np.random.default_rng(0)
  for q in a.types.split(","):
    if q not in GEOMETRY: raise SystemExit(f"unknown type {q}: one of {', '.join(GEOMETRY)}")
    if cols % GEOMETRY[q][0]: print(f"{q:5s} skipped: its blocks of {GEOMETRY[q][0]} don't divide {cols} columns"); continue
    if a.opts: opts_sweep(q, rows, cols, a.rows, a.calls, a.opts, rng)
    else: forms(q, rows, cols, a.rows, a.calls, rng)


if __name__ == "__main__":
  main()
