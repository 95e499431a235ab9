"""Conformance of multi-device tensors and TinyJit on the device under test, against numpy.

Multi-device: two instances of the device (`X` and `X:1`; docs/multi.md) hold sharded and replicated tensors;
elementwise ops, reductions over and across the shard axis (an allreduce), matmuls with either operand split, uneven
splits, gathers back to one device and gradients through shards. Copies of a contiguous range of a realized buffer
(`t[a:b].to(other)`, `shard` of a realized tensor, which each device copies its rows of) read the source through
`Buffer.view`, so they need the allocator's `_offset` (docs/backends.md).

TinyJit: a jitted function is run, captured, then replayed with new inputs (the Python body no longer runs), on one
device and across two; the replay swaps the new inputs' buffers, or the same views of them, into the captured kernels.
Sizes are small: the PYTHON reference device runs these too.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from plugrad.device import Device, parse_device
from plugrad.engine.jit import TinyJit
from plugrad.tensor import Tensor
from plugrad.testing.helpers import assert_close, rand_np


def two_devices() -> tuple[str, str]:
  """The device under test and a second instance of it (index 1 or, when DEV names index 1, index 0), same renderer."""
  d = parse_device(Device.DEFAULT)
  return Device.DEFAULT, dataclasses.replace(d, index=0 if d.index == 1 else 1).canonical


@pytest.fixture
def devs() -> tuple[str, str]:
  """The two devices the multi-device tests use (looked up at run time: collecting the suite opens no device)."""
  return two_devices()


def test_second_instance_is_its_own_device(devs: tuple[str, str]):
  a, b = Tensor([1.0, 2.0], device=devs[0]), Tensor([3.0, 4.0], device=devs[1])
  assert devs[0] != devs[1] and Device[devs[0]] is not Device[devs[1]]
  assert_close((b * 2).numpy(), np.float32([6, 8]))
  assert_close((a.to(devs[1]) + b).numpy(), np.float32([4, 6]))  # a copy between the two
  assert_close((b.to(devs[0]) - a).numpy(), np.float32([2, 2]))


@pytest.mark.parametrize("axis", [0, 1])
def test_shard_elementwise_and_reductions(axis: int, devs: tuple[str, str]):
  x, w = rand_np((6, 4)), rand_np((6, 4), seed=1)
  xs, ws = Tensor(x).shard(devs, axis=axis), Tensor(w).to(devs)
  assert xs.device == devs and ws.device == devs
  y = (xs * 2 + ws).relu()
  assert_close(y.numpy(), np.maximum(x * 2 + w, 0))
  assert_close(y.sum(axis).numpy(), np.maximum(x * 2 + w, 0).sum(axis))  # over the shard axis: an allreduce
  assert_close(y.sum(1 - axis).numpy(), np.maximum(x * 2 + w, 0).sum(1 - axis))
  assert_close(y.max().numpy(), np.maximum(x * 2 + w, 0).max())
  assert_close(y.to(devs[1]).numpy(), np.maximum(x * 2 + w, 0))  # gathered on the second device


def test_shard_uneven_splits_and_shards(devs: tuple[str, str]):
  x = rand_np((7, 3))
  xs = Tensor(x).shard(devs, axis=0, splits=[5, 2])
  assert xs.shard_bounds == ((0, 5), (5, 7))
  assert_close(xs.shards[0].numpy(), x[:5])
  assert_close(xs.shards[1].numpy(), x[5:])
  assert_close((xs.exp() - 1).sum(0).numpy(), (np.exp(x) - 1).sum(0), atol=1e-5, rtol=1e-5)


def test_shard_matmul_row_and_column_parallel(devs: tuple[str, str]):
  a, b = rand_np((8, 5)), rand_np((5, 6), seed=1)
  assert_close((Tensor(a).shard(devs, axis=0) @ Tensor(b).to(devs)).numpy(), a @ b, atol=1e-5, rtol=1e-5)  # rows of a split
  assert_close((Tensor(a).to(devs) @ Tensor(b).shard(devs, axis=1)).numpy(), a @ b, atol=1e-5, rtol=1e-5)  # columns of b
  assert_close((Tensor(a).shard(devs, axis=1) @ Tensor(b).shard(devs, axis=0)).numpy(), a @ b, atol=1e-5, rtol=1e-5)  # allreduce


def test_copy_of_a_buffer_range_to_the_other_device(devs: tuple[str, str]):
  """A contiguous slice of a realized buffer copies through a view of it (Allocator._offset)."""
  x = np.arange(24, dtype=np.float32)
  t = Tensor(x).realize()
  assert_close(t[5:17].to(devs[1]).numpy(), x[5:17])
  assert_close(t.reshape(4, 6)[1:3].to(devs[1]).numpy(), x.reshape(4, 6)[1:3])
  s = t.reshape(4, 6).shard(devs, axis=0)  # a realized tensor: each device copies its own rows
  assert_close(s.shards[1].numpy(), x.reshape(4, 6)[2:])
  assert_close((s + 1).numpy(), x.reshape(4, 6) + 1)


def test_gradients_through_shards(devs: tuple[str, str]):
  x, w = rand_np((6, 4)), rand_np((4, 3), seed=1)
  xt, wt = Tensor(x).shard(devs, axis=0), Tensor(w, requires_grad=True).to(devs)
  loss = ((xt @ wt).relu() * 3).sum()
  (gw,) = loss.gradient(wt)
  mask = (x @ w > 0).astype(np.float32)
  assert_close(gw.numpy(), x.T @ (mask * 3), atol=1e-5, rtol=1e-5)
  assert_close(loss.numpy(), (np.maximum(x @ w, 0) * 3).sum(), atol=1e-4, rtol=1e-5)


# ***** TinyJit *****

def test_jit_replays_with_new_inputs():
  calls = []
  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tensor:
    calls.append(1)
    return ((a @ b) + 1).relu().sum(1).realize()
  for i in range(5):
    a, b = rand_np((3, 4), seed=2 * i), rand_np((4, 5), seed=2 * i + 1)
    assert_close(f(Tensor(a), Tensor(b)).numpy(), np.maximum(a @ b + 1, 0).sum(1), atol=1e-5, rtol=1e-5, msg=f"call {i}")
  assert len(calls) == 2 and len(f.captured) > 0  # run, capture, then three replays of the captured kernels


def test_jit_reads_views_of_its_inputs():
  """Kernels that read a slice of an input (a view of its buffer) see the slice of each new input."""
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x[2:6] * 2 + x[:4]).contiguous().realize()
  for i in range(4):
    x = rand_np((8,), seed=i)
    assert_close(f(Tensor(x)).numpy(), x[2:6] * 2 + x[:4], msg=f"call {i}")


def test_jit_keeps_state_between_replays():
  acc = Tensor.zeros(4).contiguous().realize()
  @TinyJit
  def step(x: Tensor) -> Tensor:
    acc.assign(acc + x).realize()
    return acc
  want = np.zeros(4, np.float32)
  for i in range(5):
    x = rand_np((4,), seed=i)
    want += x
    assert_close(step(Tensor(x)).numpy(), want, msg=f"step {i}")


def test_jit_on_sharded_inputs(devs: tuple[str, str]):
  w = rand_np((4, 3), seed=9)
  wt = Tensor(w).to(devs).realize()
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x @ wt).sum(0).realize()  # per-device matmuls, then an allreduce
  for i in range(4):
    x = rand_np((6, 4), seed=i)
    assert_close(f(Tensor(x).shard(devs, axis=0)).numpy(), (x @ w).sum(0), atol=1e-5, rtol=1e-5, msg=f"call {i}")
