"""Benchmark the core IR: UOp construction rate, graph_rewrite(pm_symbolic) throughput, and simplify on a deep chain.

Not a test. Run from the repo root:

  .venv/bin/python bench/bench_uop.py            # table
  .venv/bin/python bench/bench_uop.py --json     # one JSON object
  .venv/bin/python bench/bench_uop.py --quick    # smaller sizes, for a smoke run

The rewrite workload is many random integer index expressions (ADD/MUL/IDIV/MOD/CMPLT by constants over ten bounded
variables, with shared subexpressions) under one SINK. As a peer the same expressions go through sympy (when it is
installed): built (sympy canonicalises sums and products on construction) and passed to `sympy.simplify`, on a sample
of the roots since sympy is far slower; the ratio is plugrad's nodes/s over sympy's. sympy is a test-time peer only,
not a project dependency, and it does not know the variable bounds, so it cannot do the range-based folds plugrad does
(`x//16 -> 0` for `x < 16`) while it does try many more rewrites: the ratio compares throughput, not output quality.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time

from plugrad.dtype import dtypes
from plugrad.uop import Ops, UOp, graph_rewrite, pm_symbolic

VARS = [("gidx0", 4096), ("gidx1", 1024), ("gidx2", 256), ("lidx0", 128), ("lidx1", 64), ("lidx2", 32), ("ridx0", 16), ("ridx1", 8),
        ("ridx2", 4), ("upc", 2)]
CONSTS = [1, 2, 3, 4, 8, 16, 32, 64, 128, 256]


def best_median(fn, runs: int) -> tuple[float, float]:
  times = []
  for _ in range(runs):
    gc.collect()
    times.append(fn())
  return min(times), statistics.median(times)


# ***** (a) construction *****
def bench_construction(n: int, runs: int) -> dict:
  a = UOp.variable("a", 0, 1 << 20)
  consts = [UOp.const(dtypes.index, i) for i in range(n)]
  keep: list[UOp] = []

  def fresh() -> float:
    keep.clear()
    gc.collect()
    t0 = time.perf_counter()
    keep.extend(UOp(Ops.ADD, dtypes.index, (a, c)) for c in consts)
    return time.perf_counter() - t0

  def hits() -> float:
    t0 = time.perf_counter()
    for c in consts: UOp(Ops.ADD, dtypes.index, (a, c))
    return time.perf_counter() - t0

  def operator_path() -> float:  # `a + i`: ufix -> const (truncate) -> ADD, the way index math is written
    t0 = time.perf_counter()
    for i in range(n): a + i
    return time.perf_counter() - t0

  fb, fm = best_median(fresh, runs)
  hb, hm = best_median(hits, runs)  # `keep` still holds the nodes, so every build is a cache hit
  ob, om = best_median(operator_path, runs)
  keep.clear()
  return {"n": n, "fresh_best": n / fb, "fresh_median": n / fm, "hit_best": n / hb, "hit_median": n / hm, "op_best": n / ob, "op_median": n / om}


# ***** (b) rewrite throughput *****
def gen_exprs(target_nodes: int, seed: int) -> list[tuple]:
  """Random expression DAGs as nested tuples: ("var", i) | ("const", c) | (op, a, c) | ("add", a, b) | ("lt", a, c).
  One node in eight reuses an earlier subtree, so the roots share subexpressions."""
  rng = random.Random(seed)
  pool: list[tuple] = []

  def gen(depth: int) -> tuple:
    if pool and rng.random() < 0.125: return rng.choice(pool)
    if depth == 0 or rng.random() < 0.15:
      t: tuple = ("var", rng.randrange(len(VARS))) if rng.random() < 0.85 else ("const", rng.choice(CONSTS))
    else:
      op = rng.choice(["add", "add", "mul", "mul", "idiv", "mod"])
      t = ("add", gen(depth - 1), gen(depth - 1)) if op == "add" else (op, gen(depth - 1), rng.choice(CONSTS))
    pool.append(t)
    return t

  roots: list[tuple] = []
  conv, seen = uop_converter(), set()
  while len(seen) < target_nodes:  # count the distinct UOps as they are made (hash-consing merges equal subtrees)
    r = gen(rng.randrange(3, 9))
    if rng.random() < 0.25: r = ("lt", r, rng.choice(CONSTS) * rng.randrange(1, 64))
    roots.append(r)
    stack = [conv(r)]
    while stack:
      u = stack.pop()
      if u not in seen: seen.add(u); stack.extend(u.src)
  return roots


def uop_converter():
  """A function turning gen_exprs tuples into UOps, memoised on the tuples' identity (shared subtrees stay shared)."""
  vs = [UOp.variable(name, 0, n - 1) for name, n in VARS]
  memo: dict[int, tuple[tuple, UOp]] = {}

  def conv(t: tuple) -> UOp:
    if (hit := memo.get(id(t))) is not None: return hit[1]
    k = t[0]
    if k == "var": u = vs[t[1]]
    elif k == "const": u = UOp.const(dtypes.index, t[1])
    elif k == "add": u = conv(t[1]) + conv(t[2])
    elif k == "mul": u = conv(t[1]) * t[2]
    elif k == "idiv": u = conv(t[1]) // t[2]
    elif k == "mod": u = conv(t[1]) % t[2]
    else: u = conv(t[1]) < t[2]
    memo[id(t)] = (t, u)  # keep t alive so its id is not reused
    return u
  return conv


def to_uop(roots: list[tuple]) -> UOp:
  conv = uop_converter()
  return UOp.sink_of(*(conv(r) for r in roots))


def bench_rewrite(target_nodes: int, runs: int, seed: int = 0) -> dict:
  roots = gen_exprs(target_nodes, seed)
  times, sizes, out_sizes = [], [], []
  for _ in range(runs):
    gc.collect()
    sink = to_uop(roots)  # rebuilt each run: no bounds or rewrites cached on the nodes from a previous run
    n = len(sink.toposort())
    t0 = time.perf_counter()
    out = graph_rewrite(sink, pm_symbolic, name="bench")
    times.append(time.perf_counter() - t0)
    sizes.append(n)
    out_sizes.append(len(out.toposort()))
    del sink, out
  n = sizes[0]
  return {"roots": len(roots), "nodes": n, "nodes_after": out_sizes[0], "best_s": min(times), "median_s": statistics.median(times),
          "best": n / min(times), "median": n / statistics.median(times)}, roots


def bench_deep_chain(depth: int, runs: int) -> dict:
  def one() -> float:
    a = UOp.variable("a", 0, 1000)
    x = a
    for i in range(depth): x = ((x + (i % 7)) * 2) // 2  # each level simplifies to x + i%7
    t0 = time.perf_counter()
    s = x.simplify()
    dt = time.perf_counter() - t0
    assert s.op is Ops.ADD and s.src[1].arg == sum(i % 7 for i in range(depth)), s.render(simplify=False)
    return dt
  b, m = best_median(one, runs)
  return {"depth": depth, "nodes": 3 * depth + 1, "best_s": b, "median_s": m}


# ***** peer: sympy *****
def bench_sympy(roots: list[tuple], budget_s: float, runs: int) -> dict | None:
  try:
    import sympy
  except ImportError:
    return None
  syms = [sympy.Symbol(name, integer=True, nonnegative=True) for name, _ in VARS]

  def conv(t: tuple, memo: dict):
    if (e := memo.get(id(t))) is not None: return e
    k = t[0]
    if k == "var": e = syms[t[1]]
    elif k == "const": e = sympy.Integer(t[1])
    elif k == "add": e = conv(t[1], memo) + conv(t[2], memo)
    elif k == "mul": e = conv(t[1], memo) * t[2]
    elif k == "idiv": e = sympy.floor(conv(t[1], memo) / t[2])  # all values are non-negative, so floor == truncation
    elif k == "mod": e = sympy.Mod(conv(t[1], memo), t[2])
    else: e = sympy.Lt(conv(t[1], memo), t[2])
    memo[id(t)] = e
    return e

  # the sample: roots in order until the time budget of the first run is spent; later runs redo the same sample
  sample, per_run, failed = [], [], 0
  for r in range(runs):
    sympy.core.cache.clear_cache()
    t0, done = time.perf_counter(), 0
    todo = roots if r == 0 else sample
    for root in todo:
      try: sympy.simplify(conv(root, {}))
      except (ArithmeticError, RecursionError, sympy.core.evalf.PrecisionExhausted):
        if r == 0: failed += 1  # sympy gives up on some floor/Mod nests; the time spent still counts
      done += 1
      if r == 0 and time.perf_counter() - t0 > budget_s: break
    if r == 0: sample = roots[:done]
    per_run.append(time.perf_counter() - t0)
  n = len(to_uop(sample).toposort()) - 1  # plugrad nodes in the sample, without the SINK
  return {"version": sympy.__version__, "roots": len(sample), "nodes": n, "failed": failed, "best": n / min(per_run),
          "median": n / statistics.median(per_run)}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
  ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--sympy-budget", type=float, default=10.0, help="seconds of sympy work in the first peer run")
  args = ap.parse_args()
  n_build, n_nodes, depth, runs = (20_000, 10_000, 500, 2) if args.quick else (200_000, 100_000, 2000, args.runs)
  sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))  # sympy and the tuple walkers recurse

  res = {"python": platform.python_version(), "machine": platform.machine(), "runs": runs}
  res["construction"] = bench_construction(n_build, runs)
  res["rewrite"], roots = bench_rewrite(n_nodes, runs)
  res["deep_chain"] = bench_deep_chain(depth, runs)
  peer = bench_sympy(roots, 2.0 if args.quick else args.sympy_budget, min(runs, 3))
  res["sympy"] = peer
  if peer is not None: res["ratio_vs_sympy"] = res["rewrite"]["median"] / peer["median"]

  if args.json:
    print(json.dumps(res, indent=1))
    return
  c, r, d = res["construction"], res["rewrite"], res["deep_chain"]
  rows = [("UOp construction, fresh nodes", f"{c['n']} ADDs", c["fresh_best"], c["fresh_median"], "nodes/s"),
          ("UOp construction, cache hits", f"{c['n']} ADDs", c["hit_best"], c["hit_median"], "nodes/s"),
          ("UOp construction, `a + i`, then freed", f"{c['n']} CONST+ADD", c["op_best"], c["op_median"], "exprs/s"),
          ("graph_rewrite(pm_symbolic)", f"{r['nodes']} -> {r['nodes_after']} nodes", r["best"], r["median"], "nodes/s"),
          ("UOp.simplify deep chain", f"depth {d['depth']}, {d['nodes']} nodes", d["best_s"] * 1e3, d["median_s"] * 1e3, "ms")]
  if peer is not None:
    size = f"{peer['roots']} roots, {peer['nodes']} nodes, {peer['failed']} fail"
    rows.append((f"peer: sympy {peer['version']} simplify", size, peer["best"], peer["median"], "nodes/s"))
  w = max(len(x[0]) for x in rows)
  print(f"{'benchmark':<{w}}  {'size':<28} {'best':>12} {'median':>12}  unit")
  for name, size, b, m, unit in rows: print(f"{name:<{w}}  {size:<28} {b:>12,.1f} {m:>12,.1f}  {unit}")
  if peer is None: print("peer: sympy is not installed; no ratio")
  else: print(f"plugrad graph_rewrite / sympy simplify (median nodes/s): {res['ratio_vs_sympy']:,.0f}x")


if __name__ == "__main__":
  main()
