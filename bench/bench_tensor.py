"""Benchmark Tensor ops on the CPU device against numpy in the same run, with the hardware floor of each.

Not a test. Run from the repo root (unset the OpenBLAS overrides some machines set, they slow numpy down):

  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/bench_tensor.py           # full table
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/bench_tensor.py --quick   # smaller sizes
  ... --json                                                                                      # one JSON object
  ... --matmul                                                                                    # the matmul rows only
  CPU_MARCH=x86-64-v3 OPENBLAS_CORETYPE=Haswell ... --matmul    # AVX2 code on both sides (on an AVX-512 box)
  CPU_THREADS=1 OPENBLAS_NUM_THREADS=1 ... --matmul               # one core each

Each row times the user-visible op (`Tensor` expression -> `realize()`, warm: compiled and scheduled before) and
its numpy peer, best of several runs; `ratio` is numpy's time / plugrad's (> 1: plugrad is faster). Floors: bytes
that must move / 25 GB/s (the dev machine's read bandwidth with both cores; --bw overrides) and FLOPs / peak, where
peak = cores x clock x FP32 FLOPs per cycle per core, both measured (`measure_peak`: a dependent integer-add chain
gives the clock, independent vector FMA chains the FLOPs per cycle; best of many short runs, since a shared machine
preempts long ones; --flops-per-cycle overrides). `x floor` is how many times slower than the floor a result is.
Overheads: a 10-op elementwise chain, cold (fresh process, empty PLUGRAD_CACHE_DIR: schedule + codegen + compile)
and warm (same program again), its cProfile breakdown, and the per-launch cost of the CPU launcher options.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alternate import best_of_blocks

from plugrad.tensor import Tensor


def best2(fa, fb, reps: int) -> tuple[float, float]:
  """Best times of `fa` (ours) and `fb` (the peer) over alternating blocks of calls (bench/alternate.py: a threaded
  peer's spinning threads would otherwise take a core from the call after it)."""
  ta, tb = best_of_blocks(fa, fb, reps)
  return min(ta), min(tb)


def best(fn, reps: int) -> float:
  fn()
  ts = []
  for _ in range(reps):
    st = time.perf_counter(); fn(); ts.append(time.perf_counter() - st)
  return min(ts)


PEAK_SRC = r"""
typedef float vf __attribute__((vector_size(LANES * 4)));
#ifdef __clang__
#define FMA_FN static vf fma_v(vf a, vf b, vf c) { _Pragma("clang fp contract(fast)") return a * b + c; }
#else
#define FMA_FN __attribute__((optimize("fp-contract=fast"))) static vf fma_v(vf a, vf b, vf c) { return a * b + c; }
#endif
FMA_FN
/* CHAINS independent FMA chains of LANES floats: FLOPs = 2 * LANES * CHAINS * iters */
float peak(long long iters, float seed) {
  vf acc[CHAINS], m = (vf){} + 0.999f, c = (vf){} + seed;
  for (int j = 0; j < CHAINS; j++) acc[j] = (vf){} + (float)j;
  for (long long i = 0; i < iters; i++) {
#pragma unroll
    for (int j = 0; j < CHAINS; j++) acc[j] = fma_v(acc[j], m, c);
  }
  float s = 0; for (int j = 0; j < CHAINS; j++) for (int l = 0; l < LANES; l++) s += acc[j][l];
  return s;
}
/* a chain of dependent integer adds, 8 per trip: one add per cycle, so adds / seconds is the clock */
long long clock_chain(long long iters, long long y) {
  long long x = 0;
  for (long long i = 0; i < iters; i++) {
    __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                     "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0" : "+r"(x) : "r"(y));
  }
  return x;
}
"""


def measure_peak(threads: int) -> dict:
  """The clock (a dependent integer-add chain: one add per cycle) and the FP32 FMA peak (independent vector FMA
  chains, `threads` threads at once), measured with the CPU device's compiler; FLOPs per cycle per core follow."""
  import platform
  import threading

  from plugrad.device import Device
  from plugrad_cpu.device import load_library, simd_shape
  lanes, regs = simd_shape()
  chains = max(8, regs - 8)
  dev = Device["CPU"]
  src = PEAK_SRC.replace("LANES", str(lanes)).replace("CHAINS", str(chains))
  if platform.machine() not in ("x86_64", "AMD64"): src = src.split("/* a chain")[0]
  lib = load_library(dev.compiler.compile_cached(src), "the peak benchmark")
  lib.peak.restype, lib.peak.argtypes = ctypes.c_float, [ctypes.c_longlong, ctypes.c_float]
  def timed(fn, n, k, arg=1.0):  # short runs, best of many: a shared machine's cores get preempted in long ones
    ts = []
    for _ in range(30):
      # the threads are started first and released together: timing their start (~0.5 ms apart on the 2-core VM)
      # read 2 cores at 180-186 GFLOPS, against 194-197 released at once and torch's 197 on a conv
      go = threading.Barrier(k + 1)
      def run() -> None:
        go.wait()
        fn(n, arg)
      th = [threading.Thread(target=run) for _ in range(k)]
      for t in th: t.start()
      go.wait()
      st = time.perf_counter()
      for t in th: t.join()
      ts.append(time.perf_counter() - st)
    return min(ts)
  n = 2_000_000  # ~10 ms a run: the thread start and join (~50 us) stay under 1% of it
  t1, tn = timed(lib.peak, n, 1), timed(lib.peak, n, threads)
  out = {"lanes": lanes, "chains": chains, "gflops_1core": 2 * lanes * chains * n / t1 / 1e9,
         "gflops_all": threads * 2 * lanes * chains * n / tn / 1e9}
  if hasattr(lib, "clock_chain"):
    lib.clock_chain.restype, lib.clock_chain.argtypes = ctypes.c_longlong, [ctypes.c_longlong, ctypes.c_longlong]
    m = 1_000_000
    out["ghz"] = 8 * m / timed(lib.clock_chain, m, 1, 1) / 1e9
    out["flops_per_cycle"] = out["gflops_1core"] / out["ghz"]
  return out


def machine(bw: float, fpc: int | None) -> dict:
  cores = int(os.environ.get("CPU_THREADS", 0)) or os.cpu_count() or 1  # the cores plugrad runs on (the peak's core count)
  info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
  mhz = next((float(ln.split(":")[1]) for ln in info.splitlines() if ln.startswith("cpu MHz")), 2000.0)
  flags = next((ln.split(":")[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
  model = next((ln.split(":")[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
  simd = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"
  pk = measure_peak(cores)
  if fpc is None and "ghz" in pk: mhz, fpc = pk["ghz"] * 1e3, round(pk["flops_per_cycle"])
  fpc = fpc or (32 if "fma" in flags else 8)
  blas = "?"
  try:
    from threadpoolctl import threadpool_info
    blas = "; ".join(f"{d.get('internal_api')} {d.get('version')} kernel={d.get('architecture')} threads={d.get('num_threads')}"
                     for d in threadpool_info() if d.get("user_api") == "blas")
  except ImportError: blas = "threadpoolctl not installed"
  return {"model": model, "cores": cores, "mhz": mhz, "simd": simd, "fma": "fma" in flags, "flops_per_cycle": fpc,
          "peak_gflops": cores * mhz * 1e6 * fpc / 1e9, "peak_measured": pk, "bw_gbs": bw, "numpy": np.__version__, "blas": blas,
          "cpu_threads": os.environ.get("CPU_THREADS", str(cores)),
          "openblas_env": {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}}


def row(name: str, t_pg: float, t_np: float, unit: str, amount: float, floor_s: float) -> dict:
  return {"name": name, "plugrad_ms": t_pg * 1e3, "numpy_ms": t_np * 1e3, "ratio": t_np / t_pg, "unit": unit,
          "plugrad": amount / t_pg / 1e9, "numpy": amount / t_np / 1e9, "floor_ms": floor_s * 1e3, "x_floor": t_pg / floor_s}


def bench_ops(q: bool, m: dict, reps: int) -> list[dict]:
  rng = np.random.default_rng(0)
  bw, peak = m["bw_gbs"] * 1e9, m["peak_gflops"] * 1e9
  rows = []
  n = (1 << 22) if q else (1 << 24)
  a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  rows.append(row(f"add {n >> 20}M f32", best(lambda: (ta + tb).realize(), reps), best(lambda: np.add(a, b), reps), "GB/s", 12 * n, 12 * n / bw))
  rows.append(row(f"sum {n >> 20}M f32", best(lambda: ta.sum().realize(), reps), best(lambda: a.sum(), reps), "GB/s", 4 * n, 4 * n / bw))
  s = 1024 if q else 4096
  x = rng.standard_normal((s, s), dtype=np.float32)
  tx = Tensor(x).realize()
  def np_softmax():
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
  rows.append(row(f"softmax ({s},{s})", best(lambda: tx.softmax(-1).realize(), reps), best(np_softmax, reps), "GB/s", 8 * s * s, 8 * s * s / bw))
  rows += bench_matmuls(q, m, reps)
  rows.append(bench_conv(4 if q else 32, peak, reps))
  rows.append(bench_q4_matvec(2048 if q else 8192, 4096, bw, reps))
  return rows


def bench_matmuls(q: bool, m: dict, reps: int) -> list[dict]:
  """f32 matmuls (square, then the LLM's shapes: a few tokens, skinny M, against a large K) and 16-bit inputs."""
  rng = np.random.default_rng(0)
  peak = m["peak_gflops"] * 1e9
  rows = []
  shapes = [(s, s, s) for s in ((256, 512, 1024) if q else (256, 512, 1024, 2048, 4096))]
  shapes += [(16, 4096, 4096), (64, 4096, 4096), (128, 576, 1536)] if not q else [(16, 2048, 2048)]
  for m_, k_, n_ in shapes:
    x, y = rng.standard_normal((m_, k_), dtype=np.float32), rng.standard_normal((k_, n_), dtype=np.float32)
    tx, ty = Tensor(x).realize(), Tensor(y).realize()
    fl = 2 * m_ * k_ * n_
    err = float(np.abs((tx @ ty).numpy() - x @ y).max())
    if err > 1e-3 * k_ ** 0.5: raise RuntimeError(f"matmul {m_}x{k_}x{n_} differs from numpy by {err}")
    r = max(2, reps // 2) if fl > 1e10 else reps * 2
    t_pg, t_np = best2(lambda: (tx @ ty).realize(), lambda: x @ y, r)
    rows.append(row(f"matmul {m_}" if m_ == k_ == n_ else f"matmul {m_}x{k_}x{n_}", t_pg, t_np, "GFLOPS", fl, fl / peak))
  # attention's prefill scores: x @ y.T with both operands read along the reduce axis (4 query heads of one key head,
  # gemma3's shape); numpy's peer is the same batched product through BLAS
  h, t, d = (4, 456, 256) if not q else (4, 128, 64)
  x, y = rng.standard_normal((h, t, d), dtype=np.float32), rng.standard_normal((t, d), dtype=np.float32)
  tx, ty = Tensor(x).realize(), Tensor(y).realize()
  fl = 2 * h * t * t * d
  err = float(np.abs((tx @ ty.T).numpy() - x @ y.T).max())
  if err > 1e-3 * d ** 0.5: raise RuntimeError(f"scores {h}x{t}x{t}x{d} differ from numpy by {err}")
  t_pg, t_np = best2(lambda: (tx @ ty.T).realize(), lambda: x @ y.T, reps * 2)
  rows.append(row(f"scores {h}x{t}x{t} over {d} (x @ y.T)", t_pg, t_np, "GFLOPS", fl, fl / peak))
  for dt, npdt in (("float16", np.float16), ("bfloat16", None)):  # 16-bit inputs, float32 accumulation and output
    s = 1024
    x, y = rng.standard_normal((s, s), dtype=np.float32), rng.standard_normal((s, s), dtype=np.float32)
    tx, ty = Tensor(x).cast(dt).realize(), Tensor(y).cast(dt).realize()
    x16, y16 = tx.cast("float32").numpy(), ty.cast("float32").numpy()  # numpy's peer: the same values in float32 (no f16 BLAS)
    f = lambda: tx.matmul(ty, dtype="float32").realize()
    err = float(np.abs(f().numpy() - x16 @ y16).max())
    if err > 1e-2: raise RuntimeError(f"{dt} matmul differs from numpy by {err}")
    fl = 2 * s ** 3
    t_pg, t_np = best2(f, lambda: x16 @ y16, reps)
    rows.append(row(f"matmul {s} {dt} in, f32 acc", t_pg, t_np, "GFLOPS", fl, fl / peak))
  return rows


def bench_q4_matvec(n: int, k: int, bw: float, reps: int) -> dict:
  """LLM decode's kernel: x (1, k) @ W.T with W in the llm app's repacked Q4_1 layout (uint8 nibbles (n, k/2), float32
  block scales and mins (n, k/32)), dequantized inside the matvec. GB/s of those weight bytes; the numpy peer is the
  same product on the float32 weights (4x the bytes), the floor the weight bytes at the read bandwidth."""
  rng = np.random.default_rng(2)
  qs = rng.integers(0, 256, (n * k // 32, 16), dtype=np.uint8)
  sc, mn = rng.uniform(0.01, 0.1, (n * k // 32, 1)).astype(np.float32), rng.uniform(-1, 0, (n * k // 32, 1)).astype(np.float32)
  x = rng.standard_normal((1, k), dtype=np.float32)
  w = (sc * np.concatenate([qs & 15, qs >> 4], 1) + mn).astype(np.float32).reshape(n, k)
  from plugrad.uop.ops import Ops
  tq, tsc, tmn, tx = Tensor(qs).realize(), Tensor(sc).realize(), Tensor(mn).realize(), Tensor(x).realize()
  q, sh = tq.reshape(-1, 1, 16)._broadcasted(Tensor(np.array([0, 4], np.uint8)).reshape(1, 2, 1))
  tw = (tsc * (q._alu(Ops.SHR, sh) & 15).reshape(-1, 32).cast("float32") + tmn).reshape(n, k)
  err = float(np.abs((tx @ tw.T).numpy() - x @ w.T).max())
  if err > 1e-2 * float(np.abs(x @ w.T).max()): raise RuntimeError(f"q4 matvec differs from numpy by {err}")
  nbytes = qs.nbytes + sc.nbytes + mn.nbytes
  return row(f"q4_1 matvec {n}x{k}", best(lambda: (tx @ tw.T).realize(), reps), best(lambda: x @ w.T, reps), "GB/s", nbytes, nbytes / bw)


def bench_conv(bs: int, peak: float, reps: int) -> dict:
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal((bs, 64, 56, 56), dtype=np.float32), rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
  tx, tw = Tensor(x).realize(), Tensor(w).realize()
  from numpy.lib.stride_tricks import sliding_window_view
  def np_conv():  # im2col + one matmul (BLAS): the usual CPU conv
    cols = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(bs * 56 * 56, 64 * 9)
    return (cols @ w.reshape(64, -1).T).reshape(bs, 56, 56, 64).transpose(0, 3, 1, 2)
  got = tx.conv2d(tw, padding=1).numpy()
  err = float(np.abs(got - np_conv()).max())
  if err > 1e-2: raise RuntimeError(f"conv2d result differs from numpy by {err}")
  fl = 2 * bs * 64 * 56 * 56 * 64 * 9
  return row(f"conv2d {bs}x64x56x56 3x3", best(lambda: tx.conv2d(tw, padding=1).realize(), max(1, reps // 2)),
             best(np_conv, max(1, reps // 2)), "GFLOPS", fl, fl / peak)


OVERHEAD_SCRIPT = r"""
import json, sys, time, cProfile, pstats, io
import numpy as np
from plugrad.tensor import Tensor
x = Tensor(np.arange(64, dtype=np.float32)).realize()
def chain(t):
  for i in range(10): t = (t * 1.5 + 0.25) if i % 2 == 0 else t.maximum(0.5)
  return t
st = time.perf_counter(); chain(x).realize(); cold = time.perf_counter() - st
for _ in range(20): chain(x).realize()
ts = []
for _ in range(200):
  st = time.perf_counter(); chain(x).realize(); ts.append(time.perf_counter() - st)
pr = cProfile.Profile(); pr.enable()
for _ in range(200): chain(x).realize()
pr.disable()
st = pstats.Stats(pr)
parts = {}
for (fname, line, fn), (cc, nc, tt, ct, callers) in st.stats.items():
  key = fname.split("/plugrad/")[-1] + ":" + fn
  parts[key] = max(parts.get(key, 0.0), ct / 200)
print(json.dumps({"cold_ms": cold * 1e3, "warm_ms": sorted(ts)[len(ts) // 2] * 1e3, "warm_min_ms": min(ts) * 1e3,
                  "profile_ms": sorted(((round(v * 1e3, 4), k) for k, v in parts.items()), reverse=True)[:40]}))
"""


def bench_overhead() -> dict:
  with tempfile.TemporaryDirectory(prefix="plugrad-bench-cache-") as d:
    env = dict(os.environ, PLUGRAD_CACHE_DIR=d)
    p = subprocess.run([sys.executable, "-c", OVERHEAD_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
  if p.returncode != 0: raise RuntimeError(f"overhead subprocess failed:\n{p.stderr}")
  return json.loads(p.stdout.strip().splitlines()[-1])


def bench_launch(reps: int = 2000) -> dict:
  """Per-launch cost (us) of a tiny threaded kernel: direct 1-thread call, C pool on 2 threads, Python threads + ctypes."""
  from concurrent.futures import ThreadPoolExecutor

  from plugrad.device import Device
  from plugrad.engine.realize import buffer_for, runner_of
  x = Tensor(np.ones(64, np.float32)).realize()
  (it,) = (x + 1).schedule()
  prg = runner_of(it).prg
  bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
  dev = Device["CPU"]
  cbufs, cvals = (ctypes.c_void_p * len(bufs))(*[b.ctypes.data for b in bufs]), (ctypes.c_int32 * 1)()
  fn = prg.fn
  fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
  def per(f) -> float: return best(lambda: [f() for _ in range(reps)], 3) / reps * 1e6
  out = {"direct ctypes call, 1 thread": per(lambda: fn(cbufs, cvals, 0, 1)),
         "Program call (engine path), picks 1 thread": per(lambda: prg(*bufs)),
         "C pool, 2 threads": per(lambda: dev.pool_launch(prg._fn_ptr, prg._work_ptr, cbufs, cvals, 2, 0))}
  with ThreadPoolExecutor(2) as ex:
    def py2(): [f.result() for f in [ex.submit(fn, cbufs, cvals, i, 2) for i in range(2)]]
    out["Python ThreadPoolExecutor, 2 threads"] = per(py2) if reps <= 2000 else 0.0
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
  ap.add_argument("--json", action="store_true", help="print one JSON object")
  ap.add_argument("--matmul", action="store_true", help="only the matmul rows")
  ap.add_argument("--bw", type=float, default=25.0, help="read bandwidth floor in GB/s (default 25)")
  ap.add_argument("--flops-per-cycle", type=int, default=None, help="FP32 FLOPs per cycle per core (default 32 with FMA)")
  args = ap.parse_args()
  m = machine(args.bw, args.flops_per_cycle)
  reps = 3 if args.quick else 5
  if args.matmul: res = {"machine": m, "ops": bench_matmuls(args.quick, m, reps), "overhead": None, "launch_us": None}
  else:
    res = {"machine": m, "ops": bench_ops(args.quick, m, reps), "overhead": bench_overhead(), "launch_us": bench_launch(500 if args.quick else 2000)}
  if args.json: print(json.dumps(res, indent=1)); return
  pk = m["peak_measured"]
  print(f"{m['model']}: {m['cores']} cores @ {m['mhz']:.0f} MHz (measured), {m['simd']}{'+fma' if m['fma'] else ''}; "
        f"peak {m['peak_gflops']:.0f} GFLOPS ({m['flops_per_cycle']} FLOPs/cycle/core; FMA chains measured {pk['gflops_1core']:.0f} GFLOPS "
        f"on 1 core, {pk['gflops_all']:.0f} on {m['cores']} at once), load {os.getloadavg()[0]:.1f}, bandwidth floor {m['bw_gbs']} GB/s; "
        f"numpy {m['numpy']}, BLAS: {m['blas']}; "
        f"CPU_THREADS={m['cpu_threads']}; OPENBLAS env: {m['openblas_env'] or 'unset'}")
  heads = ("benchmark", "plugrad ms", "numpy ms", "plugrad", "numpy", "ratio", "floor ms", "x floor")
  print("| " + " | ".join(f"{h:{'<' if i == 0 else '>'}{w - 2}s}" for i, (h, w) in enumerate(zip(heads, (30, 12, 11, 16, 16, 8, 10, 9)))) + " |")
  print("|" + "|".join("-" * w for w in (30, 12, 11, 16, 16, 8, 10, 9)) + "|")
  for r in res["ops"]:
    print(f"| {r['name']:28s} | {r['plugrad_ms']:10.2f} | {r['numpy_ms']:9.2f} | {r['plugrad']:7.1f} {r['unit']:>6s} | "
          f"{r['numpy']:7.1f} {r['unit']:>6s} | {r['ratio']:6.2f} | {r['floor_ms']:8.2f} | {r['x_floor']:7.1f} |")
  if (o := res["overhead"]) is None: return
  print(f"\n10-op elementwise chain (64 elements): cold {o['cold_ms']:.1f} ms (schedule + codegen + compile, empty cache), "
        f"warm {o['warm_ms']:.3f} ms median ({o['warm_min_ms']:.3f} min)")
  print("warm breakdown (cProfile, cumulative ms per realize, top entries):")
  for ms, k in o["profile_ms"][:25]: print(f"  {ms:8.4f}  {k}")
  print("\nlaunch overhead per call (us): " + ", ".join(f"{k}: {v:.1f}" for k, v in res["launch_us"].items()))


if __name__ == "__main__":
  main()
