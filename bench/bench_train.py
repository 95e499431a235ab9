"""Benchmark one training step of examples/train_digits.py's CNN: plugrad (TinyJit replay) vs PyTorch CPU, same run.

Not a test. Run from the repo root:

  .venv/bin/python bench/bench_train.py [--steps 50] [--batch 64] [--threads N] [--json]

A step is forward + backward + Adam update (+ BatchNorm running stats) on a batch of 8x8 digits, input copy-in
included. plugrad runs the jitted step of the example (call 1 runs, call 2 captures, later calls replay); torch runs
the same architecture with the same initial weights and the same thread count (torch.set_num_threads = CPU_THREADS,
which defaults to all cores). Both are warmed up, then the steps alternate between the two in blocks after a pause
(bench/alternate.py: machine load hits both alike, and neither side's spinning threads slow the other) and the median
and best per-step wall times are reported; `ratio` = plugrad / torch (> 1: plugrad is slower). Also reported: the
first step's loss in both (the same model and batch must give the same loss), plugrad's per-step kernel count, and
where the time goes (each captured kernel timed alone, wait=True, sorted, with its GFLOP/s, and a cProfile of 10 steps
splitting the step into kernel launches and host work).
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alternate import best_of_blocks

from plugrad import Device, Tensor
from plugrad.nn.optim import Adam
from plugrad.nn.state import get_parameters


def load_example():
  path = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"
  spec = importlib.util.spec_from_file_location("train_digits", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def torch_model(torch, m):
  """The same network in torch, with the plugrad model's initial weights copied in."""
  nn = torch.nn
  net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.Flatten(),
                      nn.Linear(32 * 4 * 4, 10))
  src = [m.c1.weight, m.bn1.weight, m.bn1.bias, m.c2.weight, m.bn2.weight, m.bn2.bias, m.l1.weight, m.l1.bias]
  with torch.no_grad():
    for p, t in zip(net.parameters(), src, strict=True): p.copy_(torch.from_numpy(t.numpy()))
  return net


def torch_train_step(torch, net, opt):
  """One torch training step on numpy (x, integer labels): zero_grad, cross entropy, backward, the optimizer's step."""
  def run(x: np.ndarray, y: np.ndarray):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y).long())
    loss.backward()
    opt.step()
    return loss
  return run


def race_steps(ours, theirs, batches: list, steps: int) -> dict:
  """Both steps on batches[0] (ours timed: its first call schedules, compiles and runs), on two more (TinyJit
  captures, then replays), then `steps` steps each over the batches in alternating blocks (bench/alternate.py).
  Returns the first losses, our first call's seconds and every timed step of each."""
  st = time.perf_counter()
  loss0_ours = float(ours(batches[0]).item())
  first_s = time.perf_counter() - st
  loss0_theirs = float(theirs(batches[0]).item())
  for b in batches[1:3]: ours(b), theirs(b)
  rest = batches[3:] or batches
  next_ours, next_theirs = itertools.cycle(rest), itertools.cycle(rest)
  t_ours, t_theirs = best_of_blocks(lambda: ours(next(next_ours)), lambda: theirs(next(next_theirs)), steps)
  return {"loss0_ours": loss0_ours, "loss0_theirs": loss0_theirs, "first_s": first_s, "ours": t_ours, "theirs": t_theirs}


def kernel_profile(step, reps: int = 3) -> list[dict]:
  """Each captured item timed alone (best of reps, waiting for completion)."""
  out = []
  for ei in step.captured:
    if ei.runner is None:
      ts = []
      for _ in range(reps):
        st = time.perf_counter(); ei.run(); ts.append(time.perf_counter() - st)
      out.append({"name": "COPY", "s": min(ts), "gflops": 0.0})
      continue
    s = min(ei.run(wait=True) for _ in range(reps))
    out.append({"name": ei.runner.spec.name, "s": s, "flops": int(ei.runner.spec.flops), "gflops": ei.runner.spec.flops / s / 1e9 if s else 0.0,
                "bufs": " ".join(str(b.size) for b in ei.bufs)})  # elements per buffer: output first, then the inputs
  return out


def host_share(pg_step, batches) -> tuple[float, float]:
  """(seconds per step, seconds per step inside kernel launches: ExecItem.run or the CPU's batched JIT replay) over the
  given steps under cProfile: the rest is host work
  (input copy-in, the jit's signature checks and buffer swaps, Python)."""
  import cProfile
  import pstats
  pr = cProfile.Profile()
  st = time.perf_counter()
  pr.enable()
  for idx in batches: pg_step(idx)
  pr.disable()
  total = time.perf_counter() - st
  stats = pstats.Stats(pr).stats  # type: ignore[attr-defined]
  in_run = sum(v[3] for (f, _, name), v in stats.items()   # item-by-item launches, or a device's batched replay
               if (name == "run" and f.endswith("realize.py")) or (name == "__call__" and f.endswith("plugrad_cpu/device.py")))
  return total / len(batches), in_run / len(batches)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=50, help="timed steps per framework (default 50)")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--threads", type=int, default=None, help="CPU_THREADS for plugrad and torch (default: env or all cores)")
  ap.add_argument("--json", action="store_true")
  a = ap.parse_args()
  if a.threads is not None: os.environ["CPU_THREADS"] = str(a.threads)
  threads = int(os.environ.get("CPU_THREADS", os.cpu_count() or 1))
  import torch
  torch.set_num_threads(threads)
  td = load_example()
  X, Y, _, _ = td.load_digits_split()
  rng = np.random.default_rng(0)
  batches = [rng.choice(len(X), a.batch, replace=False) for _ in range(a.steps + 3)]

  Tensor.manual_seed(0)
  m = td.DigitsNet()
  net = torch_model(torch, m)
  opt = Adam(get_parameters(m), lr=1e-3)
  topt = torch.optim.Adam(net.parameters(), lr=1e-3)
  step = td.make_train_step(m, opt)
  dev = Device[Device.DEFAULT]
  net.train()

  def pg_step(idx) -> Tensor:
    loss = step(Tensor(X[idx]), Tensor(Y[idx]))
    dev.synchronize()
    return loss
  t_step = torch_train_step(torch, net, topt)

  race = race_steps(pg_step, lambda idx: t_step(X[idx], Y[idx]), batches, len(batches) - 3)
  loss0_pg, loss0_torch, first_s, pg_t, torch_t = race["loss0_ours"], race["loss0_theirs"], race["first_s"], race["ours"], race["theirs"]
  prof = kernel_profile(step)
  prof_step, prof_run = host_share(pg_step, batches[3:13])
  kern_s = sum(p["s"] for p in prof)
  pg_med, t_med = statistics.median(pg_t), statistics.median(torch_t)
  res = {"date": time.strftime("%Y-%m-%d"), "threads": threads, "batch": a.batch, "steps": a.steps, "torch": torch.__version__,
         "plugrad_first_step_s": first_s, "loss0": {"plugrad": loss0_pg, "torch": loss0_torch},
         "plugrad_ms": {"median": pg_med * 1e3, "best": min(pg_t) * 1e3}, "torch_ms": {"median": t_med * 1e3, "best": min(torch_t) * 1e3},
         "ratio_median": pg_med / t_med, "ratio_best": min(pg_t) / min(torch_t),
         "kernels": sum(p["name"] != "COPY" for p in prof), "copies": sum(p["name"] == "COPY" for p in prof),
         "kernel_sum_ms": kern_s * 1e3,
         "profiled_step_ms": prof_step * 1e3, "profiled_in_kernels_ms": prof_run * 1e3, "host_ms": (prof_step - prof_run) * 1e3,
         "top": sorted(prof, key=lambda p: -p["s"])[:8]}
  if a.json:
    print(json.dumps(res, indent=1))
    return
  print(f"{res['date']}  threads={threads}  batch={a.batch}  steps={a.steps}  torch {torch.__version__}")
  print(f"first step's loss: plugrad {loss0_pg:.6f}  torch {loss0_torch:.6f}  (same weights and batch)")
  print(f"plugrad first call (schedule + compile + run): {first_s:.2f} s")
  print(f"step time  plugrad median {pg_med * 1e3:8.2f} ms  best {min(pg_t) * 1e3:8.2f} ms")
  print(f"           torch   median {t_med * 1e3:8.2f} ms  best {min(torch_t) * 1e3:8.2f} ms")
  print(f"ratio plugrad/torch: median {res['ratio_median']:.2f}x  best {res['ratio_best']:.2f}x")
  print(f"plugrad per step: {res['kernels']} kernels + {res['copies']} copies; sum of the kernels timed alone {kern_s * 1e3:.2f} ms")
  print(f"cProfile of 10 steps: {prof_step * 1e3:.2f} ms/step, of which {prof_run * 1e3:.2f} ms in kernel launches "
        f"and {res['host_ms']:.2f} ms host work")
  for p in res["top"]: print(f"  {p['name']:<32} {p['s'] * 1e3:8.3f} ms  {100 * p['s'] / kern_s:5.1f}%  {p['gflops']:6.2f} GFLOP/s")


if __name__ == "__main__":
  main()
