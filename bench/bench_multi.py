"""Benchmark multi-device and MPI work, each figure against a peer measured in the same run.

Not a test. Run from the repo root:

  .venv/bin/python bench/bench_multi.py [--mb 64] [--reps 7] [--steps 30] [--json]

1. allreduce over CPU:0 and CPU:1 in one process (ring above RING_ALLREDUCE_BYTES, jitted so only the kernels and
   copies run) vs the host's copy bandwidth (numpy copyto of the same bytes), best of reps, interleaved. Reported:
   algorithm bandwidth (buffer bytes / time) and the ratio to memcpy; the floor is the ring's memory traffic (9
   buffer-sizes of reads and writes over both devices for k=2: per device a half-buffer copy, the add of the halves
   written into the result, the other half's copy and its write into the result) divided by the memcpy bandwidth
   (a memcpy is 2 buffer-sizes of traffic).
2. MPI allreduce of --mb MB float32 on 2 ranks (the script relaunches itself under `mpirun -np 2`): plugrad's
   `distributed.allreduce_` of a CPU tensor vs mpi4py's own `comm.Allreduce(IN_PLACE, ndarray)` on a numpy array,
   interleaved, best of reps; ratio = mpi4py time / plugrad time (1.0: as fast; the target is >= 0.8).
3. a data-parallel training step of examples/train_digits.py (jitted, batch 64) on CPU:0,CPU:1 vs on one CPU device.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from plugrad import Tensor, TinyJit
from plugrad.schedule import multi as M
from plugrad.uop.ops import Ops

ROOT = Path(__file__).resolve().parents[1]
D2 = ("CPU:0", "CPU:1")


def best(fn, reps: int) -> float:
  ts = []
  for _ in range(reps):
    st = time.perf_counter(); fn(); ts.append(time.perf_counter() - st)
  return min(ts)


def bench_allreduce(mb: int, reps: int) -> dict:
  n = mb * (1 << 20) // 4
  parts = [Tensor(np.full(n, 1.0 + i, np.float32), device=d).realize() for i, d in enumerate(D2)]
  @TinyJit
  def ar(a: Tensor, b: Tensor) -> Tensor:
    out = Tensor(M.allreduce([a.uop, b.uop], Ops.ADD))
    return out.realize()
  for _ in range(3): out = ar(*parts)
  assert all(np.allclose(s.numpy()[:10], 3.0) for s in out.shards)
  src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
  t_ar, t_cp = [], []
  for _ in range(reps):  # interleaved: machine load hits both alike
    t_ar.append(best(lambda: ar(*parts), 1))
    t_cp.append(best(lambda: np.copyto(dst, src), 1))
  nbytes = n * 4
  ar_s, cp_s = min(t_ar), min(t_cp)
  memcpy_gbs = 2 * nbytes / cp_s / 1e9  # read + write traffic
  floor_s = 9 * nbytes / (memcpy_gbs * 1e9)
  return {"buffer_mb": mb, "allreduce_ms": ar_s * 1e3, "algbw_gbs": nbytes / ar_s / 1e9, "memcpy_ms": cp_s * 1e3,
          "memcpy_traffic_gbs": memcpy_gbs, "allreduce_over_memcpy_time": ar_s / cp_s, "floor_ms": floor_s * 1e3,
          "distance_from_floor": ar_s / floor_s, "kernels_and_copies": len(ar.captured)}


def mpi_child(mb: int, reps: int) -> None:
  from mpi4py import MPI
  from plugrad import distributed
  rank, world = distributed.init()
  comm = MPI.COMM_WORLD
  n = mb * (1 << 20) // 4
  t = Tensor(np.zeros(n, np.float32)).realize()
  arr = np.zeros(n, np.float32)
  for _ in range(2):
    distributed.allreduce_(t); comm.Allreduce(MPI.IN_PLACE, arr)
  ours, peer = [], []
  for _ in range(reps):
    comm.Barrier(); st = time.perf_counter(); distributed.allreduce_(t); ours.append(time.perf_counter() - st)
    comm.Barrier(); st = time.perf_counter(); comm.Allreduce(MPI.IN_PLACE, arr); peer.append(time.perf_counter() - st)
  if rank == 0:
    o, p = min(ours), min(peer)
    print(json.dumps({"ranks": world, "buffer_mb": mb, "plugrad_ms": o * 1e3, "mpi4py_ms": p * 1e3, "ratio_mpi4py_over_plugrad": p / o,
                      "plugrad_algbw_gbs": n * 4 / o / 1e9}))


def bench_mpi(mb: int, reps: int) -> dict:
  mpirun = shutil.which("mpirun")
  if mpirun is None: return {"skipped": "no mpirun (make sysdeps)"}
  env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
  r = subprocess.run([mpirun, "-np", "2", "--oversubscribe", sys.executable, __file__, "--mpi-child", "--mb", str(mb), "--reps", str(reps)],
                     capture_output=True, text=True, env=env, timeout=600)
  if r.returncode != 0: raise RuntimeError(r.stdout + r.stderr)
  return json.loads(r.stdout.strip().splitlines()[-1])


def bench_data_parallel(steps: int) -> dict:
  spec = importlib.util.spec_from_file_location("train_digits_bench", ROOT / "examples" / "train_digits.py")
  td = importlib.util.module_from_spec(spec); spec.loader.exec_module(td)
  X, Y, _, _ = td.load_digits_split()
  out = {}
  runs = {}
  for name, devs in (("one_device", None), ("two_devices", D2)):
    Tensor.manual_seed(0)
    model = td.DigitsNet()
    if devs is not None:
      for t in td.get_state_dict(model).values(): t.to_(devs).realize()
    opt = td.Adam(td.get_parameters(model), lr=1e-3)
    step = td.make_train_step(model, opt)
    def data(a, devs=devs): return Tensor(a).shard(devs, axis=0) if devs is not None else Tensor(a)
    for i in range(3): step(data(X[:64]), data(Y[:64])).item()
    runs[name] = (step, data)
  ts: dict[str, list[float]] = {k: [] for k in runs}
  rng = np.random.default_rng(0)
  for _ in range(steps):  # interleaved
    idx = rng.choice(len(X), 64, replace=False)
    for name, (step, data) in runs.items():
      st = time.perf_counter(); step(data(X[idx]), data(Y[idx])).item(); ts[name].append(time.perf_counter() - st)
  for name in runs: out[f"{name}_ms"] = float(np.median(ts[name]) * 1e3)
  out["two_over_one"] = out["two_devices_ms"] / out["one_device_ms"]
  out["kernels_one"], out["kernels_two"] = len(runs["one_device"][0].captured), len(runs["two_devices"][0].captured)
  return out


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--mb", type=int, default=64)
  ap.add_argument("--reps", type=int, default=7)
  ap.add_argument("--steps", type=int, default=30)
  ap.add_argument("--json", action="store_true")
  ap.add_argument("--mpi-child", action="store_true", help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.mpi_child: return mpi_child(a.mb, a.reps)
  res = {"uptime": os.getloadavg(), "allreduce_2cpu": bench_allreduce(a.mb, a.reps), "mpi": bench_mpi(a.mb, a.reps),
         "data_parallel": bench_data_parallel(a.steps)}
  print(json.dumps(res, indent=None if a.json else 2))


if __name__ == "__main__":
  main()
