"""Train a small CNN on scikit-learn's bundled 8x8 digits (1797 real images, no download) with Adam under TinyJit.

The whole train step (forward, backward, Adam update, BatchNorm running stats) is one jitted function: call 1 runs
it, call 2 captures its kernels, every later call replays them with the new batch's buffers. The train/test split
is fixed (SPLIT_SEED); --seed sets the weight init and the batch order, so a run is deterministic.

Data parallel on one host: --devices CPU:0,CPU:1 replicates the weights on each device and splits every batch
across them (BatchNorm's batch statistics reduce over the whole batch through allreduce: the loss curve is the one
device's, up to float rounding). Across processes or hosts: `mpirun -np 2 python examples/train_digits.py
--distributed` gives each rank 1/N of every global batch and sums the gradients with MPI before each Adam step; as
PyTorch's DDP without SyncBatchNorm, BatchNorm then uses each rank's own statistics, so with --no-bn the final weights
match one process's with the same global batch (docs/distributed.md).

  python examples/train_digits.py [--steps 300] [--batch 64] [--seed 0] [--lr 3e-3] [--devices CPU:0,CPU:1]
                                  [--distributed] [--no-bn] [--save weights.npz]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from tqdm import tqdm

from plugrad import Tensor, TinyJit, distributed, nn
from plugrad.nn.optim import Adam
from plugrad.nn.state import get_parameters, get_state_dict

SPLIT_SEED, TEST_FRACTION = 1234, 0.2


def load_digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(X_train, Y_train, X_test, Y_test): images as float32 (N, 1, 8, 8) scaled to [0, 1], labels as int32 (N,).
  The split is a fixed seeded permutation, stratified by class so both halves have every digit in proportion."""
  from sklearn.datasets import load_digits
  d = load_digits()
  X, Y = (d.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8), d.target.astype(np.int32)
  rng = np.random.default_rng(SPLIT_SEED)
  test_idx = []
  for c in range(10):
    idx = rng.permutation(np.flatnonzero(Y == c))
    test_idx.append(idx[:round(len(idx) * TEST_FRACTION)])
  test = np.sort(np.concatenate(test_idx))
  train = np.setdiff1d(np.arange(len(Y)), test)
  return X[train], Y[train], X[test], Y[test]


def _own_buffers(bn: nn.BatchNorm) -> None:
  """Workaround: BatchNorm's bias/running_mean (zeros) and weight/running_var (ones) are equal lazy constants, one
  hash-consed UOp each, so realizing them gives each pair one shared buffer and the in-place running-stat update
  would overwrite the affine parameters. Rebuild them from numpy so each has a buffer of its own."""
  for name in ("weight", "bias", "running_mean", "running_var"):
    t = getattr(bn, name)
    setattr(bn, name, Tensor(np.full(t.shape, 1.0 if name in ("weight", "running_var") else 0.0, np.float32), requires_grad=t.requires_grad))


class DigitsNet:
  """conv3x3(1->16) -> BN -> ReLU -> maxpool 2 -> conv3x3(16->32) -> BN -> ReLU -> Linear(32*4*4 -> 10).
  Pooling before the second conv makes it work on 4x4 maps: it does 4x fewer FLOPs than on the 8x8 maps."""
  def __init__(self, bn: bool = True):
    self.c1 = nn.Conv2d(1, 16, 3, padding=1, bias=not bn)
    self.c2 = nn.Conv2d(16, 32, 3, padding=1, bias=not bn)
    if bn:
      self.bn1, self.bn2 = nn.BatchNorm(16), nn.BatchNorm(32)
      for b in (self.bn1, self.bn2): _own_buffers(b)
    self.l1 = nn.Linear(32 * 4 * 4, 10)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.c1(x)
    x = (self.bn1(x) if hasattr(self, "bn1") else x).relu().max_pool2d(2)
    x = self.c2(x)
    x = (self.bn2(x) if hasattr(self, "bn2") else x).relu()
    return self.l1(x.flatten(1))


def make_train_step(model: DigitsNet, opt: Adam) -> TinyJit:
  """A jitted step(x, y) -> loss: forward, backward and the optimizer update, realized together."""
  @TinyJit
  @Tensor.train()
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    return loss.realize(*opt.schedule_step())
  return step


def make_distributed_steps(model: DigitsNet, opt: Adam) -> tuple[TinyJit, TinyJit]:
  """For --distributed: a jitted grads(x, y) -> (loss, *grads) on this rank's part of the batch, and a jitted
  apply(*grads) doing the Adam step; between them the caller sums the gradients over the ranks with MPI."""
  @TinyJit
  @Tensor.train()
  def grads(x: Tensor, y: Tensor) -> list[Tensor]:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    out = [loss, *(p.grad for p in opt.params)]
    Tensor.realize_all(*out)
    return out
  @TinyJit
  @Tensor.train()
  def apply(*gs: Tensor) -> Tensor:
    for p, g in zip(opt.params, gs): p.grad = g
    ts = opt.schedule_step()
    Tensor.realize_all(*ts)
    return ts[0]
  return grads, apply


def evaluate(model: DigitsNet, X: np.ndarray, Y: np.ndarray) -> float:
  """Accuracy with BatchNorm in eval mode (running statistics)."""
  with Tensor.train(False):
    pred = model(Tensor(X, device=_model_device(model))).argmax(axis=-1).numpy()
  return float((pred == Y).mean())


def _model_device(model: DigitsNet):
  return model.l1.weight.device


def train(steps: int = 300, batch: int = 64, seed: int = 0, lr: float = 3e-3, progress: bool = True, devices: tuple[str, ...] | None = None,
          dist: bool = False, bn: bool = True, losses: list[float] | None = None) -> tuple[DigitsNet, TinyJit]:
  """Train a fresh DigitsNet for `steps` jitted Adam steps on batches drawn epoch by epoch; returns (model, step).
  `devices`: data parallel over them (weights replicated, batches split). `dist`: data parallel over the MPI ranks.
  `losses` (a list) receives every step's loss (of the global batch; under MPI, this rank's part)."""
  for name, v, lo in (("steps", steps, 1), ("batch", batch, 2)):
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
      raise ValueError(f"{name} must be an int >= {lo} (BatchNorm needs batch >= 2), got {v!r}")
  X_train, Y_train, _, _ = load_digits_split()
  if batch > len(X_train): raise ValueError(f"batch={batch} is larger than the training set ({len(X_train)} images)")
  rank, world = distributed.init() if dist else (0, 1)
  if batch % world: raise ValueError(f"--distributed: the global batch {batch} must split evenly over {world} ranks")
  Tensor.manual_seed(seed)
  rng = np.random.default_rng(seed)
  model = DigitsNet(bn)
  if devices is not None:
    for t in get_state_dict(model).values(): t.to_(devices).realize()
  opt = Adam(get_parameters(model), lr=lr)
  step = make_train_step(model, opt) if not dist else None
  grads, apply = make_distributed_steps(model, opt) if dist else (None, None)
  def data(a: np.ndarray) -> Tensor: return Tensor(a).shard(devices, axis=0) if devices is not None else Tensor(a)
  order, pos = rng.permutation(len(X_train)), 0
  with tqdm(range(steps), disable=not progress or rank != 0, desc="train") as bar:
    for i in bar:
      if pos + batch > len(order): order, pos = rng.permutation(len(X_train)), 0  # a new epoch
      idx = order[pos:pos + batch]
      pos += batch
      if dist:
        mine = idx[rank * batch // world:(rank + 1) * batch // world]  # this rank's part of the global batch
        loss, *gs = grads(data(X_train[mine]), data(Y_train[mine]))
        for g in gs: distributed.allreduce_(g)  # in place: the gradient buffers the jitted step wrote
        for g in gs: g.assign(g / world).realize()
        apply(*gs)
      else: loss = step(data(X_train[idx]), data(Y_train[idx]))
      if losses is not None: losses.append(loss.item())
      if i % 25 == 0 or i == steps - 1: bar.set_postfix(loss=f"{loss.item():.4f}")
  return model, step if step is not None else apply


def main(steps: int = 300, batch: int = 64, seed: int = 0, lr: float = 3e-3, progress: bool = True, devices: tuple[str, ...] | None = None,
         dist: bool = False, bn: bool = True, save: str | None = None) -> float:
  """Train, print and return the test accuracy; `save` writes the final weights (npz, state-dict names)."""
  st = time.perf_counter()
  model, _ = train(steps, batch, seed, lr, progress, devices, dist, bn)
  if save is not None and (not dist or distributed.rank() == 0):
    np.savez(save, **{k: v.numpy() for k, v in get_state_dict(model).items()})
  train_s = time.perf_counter() - st
  _, _, X_test, Y_test = load_digits_split()
  acc = evaluate(model, X_test, Y_test)
  print(f"test accuracy {acc * 100:.2f}% ({round(acc * len(Y_test))}/{len(Y_test)}) after {steps} steps of batch {batch}; "
        f"training took {train_s:.1f} s (including the first two steps' compile and capture)")
  return acc


if __name__ == "__main__":
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
  ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
  ap.add_argument("--seed", type=int, default=0, help="seed for weight init and batch order (default 0)")
  ap.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
  ap.add_argument("--devices", type=str, default=None, help="data parallel over these devices, e.g. CPU:0,CPU:1")
  ap.add_argument("--distributed", action="store_true", help="data parallel over MPI ranks (run under mpirun)")
  ap.add_argument("--no-bn", action="store_true", help="the net without BatchNorm (convolutions with biases)")
  ap.add_argument("--save", type=str, default=None, help="write the final weights to this .npz")
  a = ap.parse_args()
  main(a.steps, a.batch, a.seed, a.lr, devices=tuple(a.devices.split(",")) if a.devices else None, dist=a.distributed, bn=not a.no_bn,
       save=a.save)
