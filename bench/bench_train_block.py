"""Benchmark one training step of a ResNet basic block plus a small head: plugrad (TinyJit replay) vs PyTorch CPU, same run.

Not a test. Run from the repo root:

  .venv/bin/python bench/bench_train_block.py [--channels 64] [--size 32] [--batch 64] [--steps 40] [--threads N] [--json]

The network: x (N, C, H, W) -> conv3x3(C->C, pad 1, no bias) -> BatchNorm2d -> ReLU -> conv3x3(C->C) -> BatchNorm2d
-> + x -> ReLU -> global average pool -> Linear(C, 10) -> cross entropy. A step is forward + backward + SGD with
momentum 0.9 (+ BatchNorm running stats), input copy-in included. plugrad runs it as one jitted step (call 1 runs,
call 2 captures, later calls replay); torch runs the same network with the same initial weights on the same batches
with torch.set_num_threads = CPU_THREADS (default all cores). The first step's loss must agree (1e-3 relative) or the
run fails. Steps alternate between the two in blocks after a pause (bench/alternate.py); reported: median and best
step times, `speedup` = torch / plugrad (> 1: plugrad is faster), the convolutions' GFLOP/s (conv1 forward + weight
gradient, conv2 forward + input and weight gradients: x is data, so conv1's input gradient is never computed; each
pass is 2*N*C*C*9*H*W FLOPs), plugrad's kernels per step and where its time goes (each captured kernel timed alone,
summed per kernel name, with its share of the total and codegen's FLOP estimate, which counts a fused multiply-add
as one FLOP: a convolution kernel's real rate is twice the one shown).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import kernel_profile, load_example, race_steps, torch_train_step

from plugrad import Device, Tensor, nn
from plugrad.nn.optim import SGD
from plugrad.nn.state import get_parameters

LR, MOMENTUM, CLASSES = 0.01, 0.9, 10


class BasicBlockNet:
  """A ResNet basic block (identity shortcut) followed by global average pooling and a linear classifier."""
  def __init__(self, c: int):
    self.c1, self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.Conv2d(c, c, 3, padding=1, bias=False)
    self.bn1, self.bn2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
    for bn in (self.bn1, self.bn2):  # ones/zeros are shared lazy constants: give each its own buffer (as train_digits.py)
      for name in ("weight", "bias", "running_mean", "running_var"):
        t = getattr(bn, name)
        setattr(bn, name, Tensor(np.full(t.shape, 1.0 if name in ("weight", "running_var") else 0.0, np.float32), requires_grad=t.requires_grad))
    self.fc = nn.Linear(c, CLASSES)

  def __call__(self, x: Tensor) -> Tensor:
    h = self.bn1(self.c1(x)).relu()
    h = (self.bn2(self.c2(h)) + x).relu()
    return self.fc(h.mean(axis=(2, 3)))

  def params(self) -> list[Tensor]:
    return [self.c1.weight, self.bn1.weight, self.bn1.bias, self.c2.weight, self.bn2.weight, self.bn2.bias, self.fc.weight, self.fc.bias]


def torch_model(torch, m: BasicBlockNet, c: int):
  """The same network in torch, with the plugrad model's initial weights copied in."""
  tnn = torch.nn
  class Net(tnn.Module):
    def __init__(self):
      super().__init__()
      self.c1, self.bn1 = tnn.Conv2d(c, c, 3, padding=1, bias=False), tnn.BatchNorm2d(c)
      self.c2, self.bn2 = tnn.Conv2d(c, c, 3, padding=1, bias=False), tnn.BatchNorm2d(c)
      self.fc = tnn.Linear(c, CLASSES)
    def forward(self, x):
      h = torch.relu(self.bn1(self.c1(x)))
      h = torch.relu(self.bn2(self.c2(h)) + x)
      return self.fc(h.mean(dim=(2, 3)))
  net = Net()
  dst = [net.c1.weight, net.bn1.weight, net.bn1.bias, net.c2.weight, net.bn2.weight, net.bn2.bias, net.fc.weight, net.fc.bias]
  with torch.no_grad():
    for p, t in zip(dst, m.params(), strict=True): p.copy_(torch.from_numpy(t.numpy()))
  return net


def kernels_by_name(step) -> list[dict]:
  """bench_train.kernel_profile's per-item times (copies left out) summed per kernel name, largest first."""
  per: dict[str, dict] = defaultdict(lambda: {"s": 0.0, "count": 0, "flops": 0, "bufs": ""})
  for k in kernel_profile(step):
    if k["name"] == "COPY": continue
    p = per[k["name"]]
    p["s"] += k["s"]; p["count"] += 1; p["flops"] += k["flops"]; p["bufs"] = k["bufs"]
  total = sum(p["s"] for p in per.values())
  out = [{"name": k, **v, "share": v["s"] / total, "gflops": v["flops"] / v["s"] / 1e9 if v["s"] else 0.0} for k, v in per.items()]
  return sorted(out, key=lambda p: -p["s"])


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--channels", type=int, default=64)
  ap.add_argument("--size", type=int, default=32, help="H = W of the input (default 32)")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--steps", type=int, default=40, help="timed steps per framework (default 40)")
  ap.add_argument("--threads", type=int, default=None, help="CPU_THREADS for plugrad and torch (default: env or all cores)")
  ap.add_argument("--json", action="store_true")
  a = ap.parse_args()
  for name in ("channels", "size", "batch", "steps"):
    if getattr(a, name) < (2 if name == "batch" else 1): ap.error(f"--{name} must be >= {2 if name == 'batch' else 1}")
  if a.threads is not None: os.environ["CPU_THREADS"] = str(a.threads)
  threads = int(os.environ.get("CPU_THREADS", os.cpu_count() or 1))
  import torch
  torch.set_num_threads(threads)
  n, c, hw = a.batch, a.channels, a.size
  rng = np.random.default_rng(0)
  batches = [(rng.standard_normal((n, c, hw, hw), dtype=np.float32), rng.integers(0, CLASSES, n).astype(np.int32)) for _ in range(4)]

  Tensor.manual_seed(0)
  m = BasicBlockNet(c)
  net = torch_model(torch, m, c)
  net.train()
  opt = SGD(get_parameters(m), lr=LR, momentum=MOMENTUM)
  topt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)

  step = load_example().make_train_step(m, opt)   # the digits example's jitted step: forward, backward, update

  dev = Device[Device.DEFAULT]
  def pg_step(b) -> Tensor:
    loss = step(Tensor(b[0]), Tensor(b[1]))
    dev.synchronize()
    return loss
  t_step = torch_train_step(torch, net, topt)

  race = race_steps(pg_step, lambda b: t_step(*b), batches, a.steps)
  loss0_pg, loss0_torch, first_s, pg_t, torch_t = race["loss0_ours"], race["loss0_theirs"], race["first_s"], race["ours"], race["theirs"]
  print(f"first step's loss: plugrad {loss0_pg:.6f}  torch {loss0_torch:.6f}  (same weights and batch)", file=sys.stderr)
  if abs(loss0_pg - loss0_torch) > 1e-3 * abs(loss0_torch):
    sys.exit(f"FAIL: first step's loss differs: plugrad {loss0_pg} vs torch {loss0_torch} (> 1e-3 relative)")
  prof = kernels_by_name(step)
  kern_s = sum(p["s"] for p in prof)
  flops = 5 * 2 * n * c * c * 9 * hw * hw
  pg_med, t_med = statistics.median(pg_t), statistics.median(torch_t)
  res = {"date": time.strftime("%Y-%m-%d"), "threads": threads, "batch": n, "channels": c, "size": hw, "steps": len(pg_t),
         "torch": torch.__version__, "cpu_march": os.environ.get("CPU_MARCH", ""), "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
         "plugrad_first_step_s": first_s, "loss0": {"plugrad": loss0_pg, "torch": loss0_torch},
         "plugrad_ms": {"median": pg_med * 1e3, "best": min(pg_t) * 1e3}, "torch_ms": {"median": t_med * 1e3, "best": min(torch_t) * 1e3},
         "speedup_median": t_med / pg_med, "speedup_best": min(torch_t) / min(pg_t), "conv_gflop": flops / 1e9,
         "gflops": {"plugrad": flops / min(pg_t) / 1e9, "torch": flops / min(torch_t) / 1e9},
         "kernels": sum(p["count"] for p in prof), "kernel_sum_ms": kern_s * 1e3, "top": prof[:10]}
  if a.json:
    print(json.dumps(res, indent=1))
    return
  print(f"{res['date']}  threads={threads}  N={n} C={c} H=W={hw}  steps={len(pg_t)}  torch {torch.__version__}  "
        f"CPU_MARCH={res['cpu_march'] or '-'} ONEDNN_MAX_CPU_ISA={res['onednn_isa'] or '-'}")
  print(f"plugrad first call (schedule + compile + run): {first_s:.2f} s")
  print(f"step time  plugrad median {pg_med * 1e3:8.2f} ms  best {min(pg_t) * 1e3:8.2f} ms  ({res['gflops']['plugrad']:.1f} conv GFLOP/s at best)")
  print(f"           torch   median {t_med * 1e3:8.2f} ms  best {min(torch_t) * 1e3:8.2f} ms  ({res['gflops']['torch']:.1f} conv GFLOP/s at best)")
  faster = "plugrad faster" if res["speedup_median"] > 1 else "torch faster"
  print(f"speedup torch/plugrad (> 1: plugrad faster): median {res['speedup_median']:.2f}x  best {res['speedup_best']:.2f}x  -> {faster}")
  print(f"conv FLOPs per step: {flops / 1e9:.3f} GFLOP (5 conv passes of 2*N*C*C*9*H*W)")
  print(f"plugrad per step: {res['kernels']} kernels; sum of the kernels timed alone {kern_s * 1e3:.2f} ms "
        "(est. GFLOP/s: codegen's count, an FMA is 1; bufs: elements per buffer, output first)")
  for p in res["top"]:
    print(f"  {p['name']:<36} x{p['count']:<2} {p['s'] * 1e3:8.3f} ms  {100 * p['share']:5.1f}%  {p['gflops']:7.2f} est. GFLOP/s  bufs {p['bufs']}")


if __name__ == "__main__":
  main()
