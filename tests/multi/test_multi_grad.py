"""Gradients of multi-device tensors against the same computation in float64 on one device: every placement
(replicated, or sharded on each axis) of both operands of matmul, elementwise ops, reductions, embedding gathers and
convolutions; a replicated weight made every way a user can make one (shard_, shard, to, realized or not); and a
hypothesis property over random small graphs whose tensors are each placed at random on 2-3 devices.

A replicated tensor's gradient is the sum of every use of any of its replicas, once (the allreduce of data-parallel
training). `x.to(devices)` makes the first replica the tensor itself and copies it to the others, so a sweep over the
graph also passes the copies' gradients down into the first replica: that had counted them twice."""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrad import Tensor

D2, D3 = ("CPU:0", "CPU:1"), ("CPU:0", "CPU:1", "CPU:2")


def place(a: np.ndarray, devs: tuple[str, ...] | None, axis: int | None, how: str = "shard_") -> tuple[Tensor, Tensor]:
  """(the tensor to differentiate, the tensor the computation reads) for `a` on `devs` (None: one device):
  `shard_` shards a leaf in place; `shard` differentiates the one-device leaf and reads its sharded copy; `to` makes
  a replica with `.to(devs)` and then asks for its gradient (the issue's `w.requires_grad = True`); `realized` the
  same after realizing it."""
  if devs is None:
    t = Tensor(a, requires_grad=True)
    return t, t
  if how == "shard_":
    t = Tensor(a, requires_grad=True)
    t.shard_(devs, axis)
    return t, t
  if how == "shard":
    t = Tensor(a, requires_grad=True)
    return t, t.shard(devs, axis)
  t = Tensor(a).shard(devs, axis) if axis is not None else Tensor(a).to(devs)
  if how == "realized": t.realize()
  t.requires_grad = True
  return t, t


def grads(fn: Callable[..., Tensor], arrays: list[np.ndarray], layouts: list[tuple[tuple[str, ...] | None, int | None]],
          how: str = "shard_") -> list[np.ndarray]:
  pairs = [place(a, devs, axis, how) for a, (devs, axis) in zip(arrays, layouts)]
  fn(*[used for _, used in pairs]).backward()
  out = []
  for t, _ in pairs:
    assert t.grad is not None and t.grad.shape == t.shape and t.grad.device == t.device
    if isinstance(t.device, tuple) and t.uop.arg is None: assert t.grad.shard_axis is None
    out.append(t.grad.numpy())
  return out


def check(fn: Callable[..., Tensor], arrays: list[np.ndarray], layouts, how: str = "shard_", rtol: float = 1e-4) -> None:
  """`fn`'s gradients with each array placed as `layouts` says, against float64 on one device."""
  want = grads(fn, [a.astype(np.float64) for a in arrays], [(None, None)] * len(arrays))
  got = grads(fn, arrays, layouts, how)
  for i, (g, w) in enumerate(zip(got, want)):
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, float(np.abs(w).max())), err_msg=f"operand {i}, layout {layouts[i]}")


def rand(*shape: int, seed: int = 0) -> np.ndarray: return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("how", ["shard_", "shard", "to", "realized"])
def test_replicated_weight_times_batch_sharded_input(how):
  """The issue's reproducer: W replicated, x sharded on the batch: W's gradient is a.T @ ones, not 1.5x of it."""
  a, w = rand(8, 16), rand(16, 4, seed=1)
  x = Tensor(a).shard(D2, axis=0)
  W, used = place(w, D2, None, how)
  (x @ used).sum().backward()
  np.testing.assert_allclose(W.grad.numpy(), a.T.astype(np.float64) @ np.ones((8, 4)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("realize", [False, True])
def test_replica_made_by_to(realize):
  """`Tensor([[1.]]).to(D)` with requires_grad set afterwards: the gradient of x @ w summed is x's sum (10)."""
  w = Tensor([[1.0]]).to(D2)
  if realize: w.realize()
  w.requires_grad = True
  (Tensor(np.arange(1, 5, dtype=np.float32).reshape(4, 1)).shard(D2, axis=0) @ w).sum().backward()
  assert w.grad.numpy().tolist() == [[10.0]]


def test_replicated_weight_used_twice_and_through_copies():
  """A replica used on every device and again after a copy to one device: each use counted once."""
  w = rand(3, 3)
  W = Tensor(w, requires_grad=True)
  W.shard_(D3, None)
  x = Tensor(rand(6, 3, seed=2)).shard(D3, axis=0)
  loss = (x @ W).square().sum() + ((W.to("CPU:1") * 2).sum() + W.shards[2].sum().to("CPU:1")).to(D3)
  loss.backward()
  x64 = rand(6, 3, seed=2).astype(np.float64)
  want = 2 * x64.T @ (x64 @ w.astype(np.float64)) + 2 + 1
  np.testing.assert_allclose(W.grad.numpy(), want, rtol=1e-5)


AXES2 = [None, 0, 1]


@pytest.mark.parametrize("a_axis", AXES2)
@pytest.mark.parametrize("b_axis", AXES2)
def test_matmul_every_placement(a_axis, b_axis):
  check(lambda a, b: (a @ b).relu().sum(), [rand(6, 4), rand(4, 6, seed=1)], [(D2, a_axis), (D2, b_axis)])


@pytest.mark.parametrize("a_axis", AXES2)
@pytest.mark.parametrize("b_axis", AXES2)
def test_elementwise_every_placement(a_axis, b_axis):
  check(lambda a, b: ((a * b).exp() + a.maximum(b) * 2).sum(), [rand(4, 6), rand(4, 6, seed=1)], [(D2, a_axis), (D2, b_axis)])


@pytest.mark.parametrize("b_axis", [None, 0])
@pytest.mark.parametrize("a_axis", AXES2)
def test_broadcast_every_placement(a_axis, b_axis):
  """A bias-like (6,) operand broadcast over rows: its gradient sums over the (maybe sharded) rows."""
  check(lambda a, b: (a + b).square().mean(), [rand(4, 6), rand(6, seed=1)], [(D2, a_axis), (D2, b_axis)])


@pytest.mark.parametrize("axis", AXES2)
@pytest.mark.parametrize("op", ["sum0", "sum1", "max0", "max1", "mean", "logsumexp"])
def test_reductions_every_placement(axis, op):
  fns = {"sum0": lambda a: (a.sum(0) ** 2).sum(), "sum1": lambda a: (a.sum(1) ** 2).sum(), "max0": lambda a: a.max(0).sum(),
         "max1": lambda a: (a.max(1) * 3).sum(), "mean": lambda a: a.mean() * a.mean(), "logsumexp": lambda a: a.logsumexp(1).sum()}
  check(fns[op], [rand(6, 4)], [(D2, axis)])


@pytest.mark.parametrize("w_axis", AXES2)
@pytest.mark.parametrize("i_axis", [None, 0])
def test_embedding_gather_every_placement(w_axis, i_axis):
  """An embedding table gathered by (maybe sharded) ids, repeated ids among them: their rows' gradients add up."""
  idx = np.array([[1, 3, 3, 0], [2, 1, 5, 1]], np.int32)
  def fn(w: Tensor) -> Tensor:
    ids = Tensor(idx).to(w.device) if not isinstance(w.device, tuple) else Tensor(idx).shard(w.device, i_axis)
    return (w[ids] * Tensor(np.linspace(-1, 1, 4, dtype=np.float32)).cast(w.dtype).to(w.device)).square().sum()
  check(fn, [rand(6, 4)], [(D2, w_axis)])


@pytest.mark.parametrize("x_axis", [None, 0, 1])
@pytest.mark.parametrize("w_axis", [None, 0, 1])
def test_conv_every_placement(x_axis, w_axis):
  """conv2d with the input replicated or sharded on batch/channels and the weight replicated or sharded on
  output/input channels."""
  check(lambda x, w: x.conv2d(w, padding=1).relu().sum(), [rand(2, 2, 5, 5), rand(2, 2, 3, 3, seed=1)], [(D2, x_axis), (D2, w_axis)],
        rtol=2e-4)


# ***** a property over random small graphs *****
N = min(100, max(12, int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200")) // 16))
SHAPE = {"A": (4, 6), "B": (6, 4), "C": (4, 4), "v": (4,)}   # fixed shapes: each draw reuses the compiled kernels
UNARY = {"relu": Tensor.relu, "exp": lambda t: (t * 0.3).exp(), "square": Tensor.square, "tanh": Tensor.tanh, "neg": lambda t: -t}
BINARY = {"add": Tensor.__add__, "mul": Tensor.__mul__, "sub": Tensor.__sub__, "max": Tensor.maximum}


@st.composite
def graphs(draw):
  """A program over A (4,6), B (6,4), C (4,4), v (4,): h = A @ B (or B.T @ A.T, transposed), then a few steps each
  combining h with C, v or h itself, a unary op, or a reduction broadcast back; a sum or mean at the end. Each input is
  placed on 2 or 3 devices, replicated or sharded on an axis, and made by one of place's ways."""
  k = draw(st.sampled_from([2, 3]))
  devs = D2 if k == 2 else D3
  layout = {n: draw(st.sampled_from([None] + [i for i, s in enumerate(shape) if s >= k])) for n, shape in SHAPE.items()}
  how = {n: draw(st.sampled_from(["shard_", "shard", "to", "realized"])) for n in SHAPE}
  steps = draw(st.lists(st.one_of(
    st.tuples(st.just("bin"), st.sampled_from(sorted(BINARY)), st.sampled_from(["C", "v", "h"])),
    st.tuples(st.just("un"), st.sampled_from(sorted(UNARY)), st.just("")),
    st.tuples(st.just("red"), st.sampled_from(["sum", "max"]), st.sampled_from(["0", "1"]))), min_size=1, max_size=4))
  return devs, layout, how, draw(st.booleans()), steps, draw(st.sampled_from(["sum", "mean"]))


def run_graph(ins: dict[str, Tensor], transposed: bool, steps, final: str) -> Tensor:
  h = (ins["B"].T @ ins["A"].T).T if transposed else ins["A"] @ ins["B"]
  for kind, name, arg in steps:
    if kind == "bin": h = BINARY[name](h, h if arg == "h" else ins[arg])
    elif kind == "un": h = UNARY[name](h)
    else: h = h - getattr(h, name)(int(arg), keepdim=True) * 0.5
  return getattr(h, final)()


@settings(max_examples=N, deadline=None, derandomize=N <= 12, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_on_devices_match_one_device_float64(case):
  devs, layout, how, transposed, steps, final = case
  arrays = {n: rand(*s, seed=i) for i, (n, s) in enumerate(SHAPE.items())}
  def grads_of(placed: dict[str, tuple[Tensor, Tensor]]) -> dict[str, np.ndarray]:
    run_graph({n: used for n, (_, used) in placed.items()}, transposed, steps, final).backward()
    return {n: t.grad.numpy() for n, (t, _) in placed.items() if t.grad is not None}
  want = grads_of({n: place(a.astype(np.float64), None, None) for n, a in arrays.items()})
  got = grads_of({n: place(a, devs, layout[n], how[n]) for n, a in arrays.items()})
  assert sorted(got) == sorted(want)
  for n in want:
    assert got[n].dtype == np.float32 and want[n].dtype == np.float64
    np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want[n]).max())),
                               err_msg=f"{n} placed {layout[n]} by {how[n]} on {devs}")

