"""Hypothesis fuzz of multi-device layouts: random shapes, device counts, shard axes and uneven splits, through a
random op (elementwise with a differently laid-out operand, reductions, reshapes, permutes, pads, shrinks, cat), every
result compared with numpy. 24 cases in make test (each new shape compiles kernels); PLUGRAD_FUZZ_EXAMPLES scales it
(make fuzz: 300)."""
from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrad import Tensor

DEVS = ("CPU:0", "CPU:1", "CPU:2")
N = min(300, max(24, int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200")) // 8))


@st.composite
def layouts(draw, shape: tuple):
  """(devices, axis, splits) for a tensor of `shape`: replicated, or split with sizes >= 1 (None: the default split)."""
  k = draw(st.integers(2, 3))
  axis = draw(st.sampled_from([None] + [i for i, s in enumerate(shape) if s >= k]))
  splits = None
  if axis is not None and draw(st.booleans()):
    cuts = sorted(draw(st.lists(st.integers(1, shape[axis] - 1), min_size=k - 1, max_size=k - 1, unique=True)))
    splits = [b - a for a, b in zip([0, *cuts], [*cuts, shape[axis]])]
  return DEVS[:k], axis, splits


@st.composite
def cases(draw):
  shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
  devs, axis, splits = draw(layouts(shape))
  op = draw(st.sampled_from(["ewise", "sum", "max", "reshape", "permute", "pad", "shrink", "cat"]))
  other = draw(st.sampled_from([None] + [i for i, s in enumerate(shape) if s >= len(devs)]))
  r = [draw(st.integers(0, len(shape) - 1)), draw(st.integers(0, 2)), draw(st.integers(0, 2))]
  return shape, devs, axis, splits, op, other, r


@settings(max_examples=N, deadline=None, derandomize=N <= 200, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_multi_layouts_match_numpy(case):
  shape, devs, axis, splits, op, other, r = case
  rng = np.random.default_rng(len(shape) * 7 + r[0])
  a = rng.standard_normal(shape).astype(np.float32)
  t = Tensor(a).shard(devs, axis, splits)
  assert np.array_equal(t.numpy(), a)
  d = r[0]
  if op == "ewise":
    b = rng.standard_normal(shape).astype(np.float32)
    got, want = (t * Tensor(b).shard(devs, other)).relu() - 1, np.maximum(a * b, 0) - 1
  elif op == "sum": got, want = t.sum(d), a.sum(d)
  elif op == "max": got, want = t.max(d, keepdim=True), a.max(d, keepdims=True)
  elif op == "reshape": got, want = t.reshape(-1), a.reshape(-1)
  elif op == "permute":
    order = tuple(np.random.default_rng(r[1]).permutation(len(shape)).tolist())
    got, want = t.permute(order), a.transpose(order)
  elif op == "pad":
    pads = tuple((r[1], r[2]) if i == d else (0, 0) for i in range(len(shape)))
    got, want = t.pad(pads), np.pad(a, pads)
  elif op == "shrink":
    lo = min(r[1], shape[d] - 1)
    hi = max(lo + 1, shape[d] - r[2])
    got, want = t.shrink(tuple((lo, hi) if i == d else None for i in range(len(shape)))), np.take(a, range(lo, hi), axis=d)
  else: got, want = Tensor.cat(t, t * 2, dim=d), np.concatenate([a, a * 2], d)
  assert got.device == tuple(Tensor(0, device=x).device for x in devs)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
