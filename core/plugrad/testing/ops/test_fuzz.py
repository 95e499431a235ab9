"""Fuzzing: random chains of elementwise, movement and reduce ops on small shapes, run by plugrad and by numpy.

Each example draws a small float32 input and 1..7 steps; every step is applied to the Tensor and to the numpy array
alike, and the final values must agree. The chains exercise fusion (movement ops feeding reduces feeding elementwise
ops), gated loads (pad), negative strides (flip) and kernels split by realize(). Bounded and derandomized, so it is
deterministic and fast on any device.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrad.tensor import Tensor
from plugrad.testing.helpers import assert_close, rand_np

MAX_DIM, MAX_NDIM, MAX_NUMEL = 4, 4, 96


def _split(n: int, draw) -> tuple[int, ...]:
  """A random factorization of n into 1..3 dims (reshape target)."""
  dims = []
  for _ in range(draw(st.integers(0, 2))):
    divs = [d for d in range(1, n + 1) if n % d == 0]
    d = draw(st.sampled_from(divs))
    dims.append(d)
    n //= d
  return tuple(dims) + (n,)


def _step(draw, t, a: np.ndarray, seed: int):
  """Apply one randomly chosen op to Tensor t and array a; returns the new pair and a description."""
  shape = a.shape
  kind = draw(st.sampled_from(["unary", "binary", "reshape", "permute", "expand", "pad", "shrink", "flip", "reduce", "realize"]))
  if kind == "unary":
    f = draw(st.sampled_from(["add", "mul", "relu", "neg", "max0"]))
    c = draw(st.sampled_from([-1.5, -0.5, 0.25, 1.0, 2.0]))
    if f == "add": return t + c, a + np.float32(c), f"+{c}"
    if f == "mul": return t * c, a * np.float32(c), f"*{c}"
    if f == "relu": return t.relu(), np.maximum(a, np.float32(0)), "relu"
    if f == "neg": return -t, -a, "neg"
    return t.maximum(c), np.maximum(a, np.float32(c)), f"maximum({c})"
  if kind == "binary":  # a second input, broadcast along a random subset of axes
    bshape = tuple(1 if draw(st.booleans()) else s for s in shape)
    b = rand_np(bshape, seed=seed)
    f = draw(st.sampled_from(["add", "mul", "max"]))
    if f == "add": return t + Tensor(b), a + b, f"+b{bshape}"
    if f == "mul": return t * Tensor(b), a * b, f"*b{bshape}"
    return t.maximum(Tensor(b)), np.maximum(a, b), f"maximum(b{bshape})"
  if kind == "reshape":
    new = _split(a.size, draw)
    return t.reshape(new), a.reshape(new), f"reshape{new}"
  if kind == "permute":
    order = tuple(draw(st.permutations(range(a.ndim))))
    return t.permute(order), a.transpose(order), f"permute{order}"
  if kind == "expand" and a.ndim < MAX_NDIM:
    ax, k = draw(st.integers(0, a.ndim)), draw(st.integers(1, 3))
    if a.size * k > MAX_NUMEL: k = 1
    new = shape[:ax] + (k,) + shape[ax:]
    tt = t.reshape(shape[:ax] + (1,) + shape[ax:]).expand(new)
    return tt, np.broadcast_to(a.reshape(shape[:ax] + (1,) + shape[ax:]), new), f"expand{new}"
  if kind == "pad":
    pads = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in shape)
    if np.prod([s + b + e for s, (b, e) in zip(shape, pads)]) > MAX_NUMEL: pads = tuple((0, 0) for _ in shape)
    return t._pad(pads), np.pad(a, pads), f"pad{pads}"
  if kind == "shrink":
    bounds = []
    for s in shape:
      b = draw(st.integers(0, s - 1))
      bounds.append((b, draw(st.integers(b + 1, s))))
    return t.shrink(tuple(bounds)), a[tuple(slice(b, e) for b, e in bounds)], f"shrink{tuple(bounds)}"
  if kind == "flip":
    axes = tuple(i for i in range(a.ndim) if draw(st.booleans())) or (0,)
    return t.flip(axes), np.flip(a, axes), f"flip{axes}"
  if kind == "reduce" and a.ndim > 1:
    ax, keep = draw(st.integers(0, a.ndim - 1)), draw(st.booleans())
    if draw(st.booleans()): return t.sum(axis=ax, keepdim=keep), a.sum(axis=ax, keepdims=keep), f"sum({ax}, keepdim={keep})"
    return t.max(axis=ax, keepdim=keep), a.max(axis=ax, keepdims=keep), f"max({ax}, keepdim={keep})"
  if kind == "realize": return t.contiguous().realize(), a, "realize"
  return t, a, "noop"


@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_op_chains(data):
  shape = tuple(data.draw(st.lists(st.integers(1, MAX_DIM), min_size=1, max_size=3), label="shape"))
  a = rand_np(shape, seed=len(shape))
  t = Tensor(a)
  steps = []
  for i in range(data.draw(st.integers(1, 7), label="n_steps")):
    t, a, what = _step(data.draw, t, a, seed=100 + i)
    steps.append(what)
    assert t.shape == a.shape, f"shape {t.shape} != numpy's {a.shape} after {' -> '.join(steps)}"
  assert_close(t.numpy(), np.asarray(a, np.float32), atol=1e-4, rtol=1e-4, msg=f"chain {shape}: {' -> '.join(steps)}")


def test_fuzz_chain_reference():
  """A fixed chain through every op kind (also documents what the fuzzer generates)."""
  a, b = rand_np((2, 3, 4), seed=1), rand_np((2, 1, 4), seed=2)
  t = (Tensor(a) * Tensor(b)).permute(2, 0, 1)._pad(((0, 0), (1, 0), (0, 2))).flip((0, 2)).shrink(((1, 4), None, (1, 5)))
  t = t.reshape(3, 3, 2, 2).sum(axis=2).relu().max(axis=0, keepdim=True)
  n = np.pad((a * b).transpose(2, 0, 1), ((0, 0), (1, 0), (0, 2)))[::-1, :, ::-1][1:4, :, 1:5]
  n = np.maximum(n.reshape(3, 3, 2, 2).sum(axis=2), 0).max(axis=0, keepdims=True)
  assert_close(t.numpy(), n, atol=1e-5, rtol=1e-5)
