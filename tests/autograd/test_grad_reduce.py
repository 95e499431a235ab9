"""Gradients of reductions and cumulative ops against float64 finite differences, plus the tie conventions of max/min."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from gradcheck import assert_directional, batch_gradcheck, distinct, gradcheck, rand

from plugrad.tensor import Tensor

S = (3, 4)

REDUCE = {
  "sum": (lambda x: x.sum(), rand(*S)),
  "sum_axis0": (lambda x: x.sum(0), rand(*S)),
  "sum_axis1_keepdim": (lambda x: x.sum(1, keepdim=True), rand(*S)),
  "sum_3d_axes": (lambda x: x.sum((0, 2)), rand(2, 3, 4)),
  "prod": (lambda x: x.prod(), rand(*S, low=0.5, high=1.5)),
  "prod_axis_negative": (lambda x: x.prod(1), -rand(*S, low=0.5, high=1.5)),
  "max": (lambda x: x.max(), distinct(*S)),
  "max_axis0": (lambda x: x.max(0), distinct(*S)),
  "max_axis1_keepdim": (lambda x: x.max(1, keepdim=True), distinct(*S)),
  "min": (lambda x: x.min(), distinct(*S)),
  "min_axis1": (lambda x: x.min(1), distinct(*S)),
  "mean": (lambda x: x.mean(), rand(*S)),
  "mean_axis": (lambda x: x.mean(1), rand(*S)),
  "var": (lambda x: x.var(), rand(*S)),
  "var_axis_biased": (lambda x: x.var(0, correction=0), rand(*S)),
  "std": (lambda x: x.std(1), rand(*S)),
  "std_keepdim": (lambda x: x.std(0, keepdim=True), rand(*S)),
  "var_mean": (lambda x: (lambda v, m: v * m)(*x.var_mean(1)), rand(*S)),
  "std_mean": (lambda x: (lambda s, m: s + m * m)(*x.std_mean(0)), rand(*S)),
  "logsumexp": (lambda x: x.logsumexp(), rand(*S)),
  "logsumexp_axis": (lambda x: x.logsumexp(1), rand(*S, low=-5, high=5)),
  "logsumexp_keepdim": (lambda x: x.logsumexp(0, keepdim=True), rand(*S)),
  "cumsum": (lambda x: x.cumsum(1), rand(*S)),
  "cumsum_axis0": (lambda x: x.cumsum(0), rand(*S)),
  "cumsum_long": (lambda x: x.cumsum(0), rand(300)),  # > SCAN_BLOCK: the blocked scan path
  "cumprod": (lambda x: x.cumprod(1), rand(*S, low=0.5, high=1.5)),
  "cumprod_signs": (lambda x: x.cumprod(0), rand(*S, low=0.5, high=1.5) * np.sign(rand(*S, seed=3))),
  "cummax": (lambda x: x.cummax(1)[0], distinct(*S)),
  "cummin": (lambda x: x.cummin(0)[0], distinct(*S)),
  "logcumsumexp": (lambda x: x.logcumsumexp(1), rand(*S)),
  "logcumsumexp_axis0": (lambda x: x.logcumsumexp(0), rand(*S, low=-4, high=4)),
}


@functools.lru_cache(maxsize=None)
def _results() -> dict:
  """All REDUCE cases checked together: one stacked graph per input shape (see batch_gradcheck)."""
  return batch_gradcheck(REDUCE)


@pytest.mark.parametrize("name", list(REDUCE))
def test_reduce(name):
  assert_directional(name, _results()[name])


@pytest.mark.parametrize("name", ["max_axis0", "std"])
def test_reduce_alone(name):
  # a few cases on their own graph too, through the general check
  fn, x = REDUCE[name]
  gradcheck(fn, x)


def test_sum_of_broadcast_input():
  # expand then reduce: the adjoint of expand (a sum) meets the adjoint of sum (an expand)
  gradcheck(lambda x: (x.reshape(1, 4).expand(3, 4) * Tensor(rand(*S, seed=1))).max(1), rand(4))


def test_reduce_chain():
  gradcheck(lambda x: (x - x.max(1, keepdim=True)).exp().sum(1).log() + x.mean(0).sum(), distinct(*S))


# ***** ties: the gradient is split evenly between the tied maxima (tinygrad) *****
def test_max_tie_splits_evenly():
  x = Tensor([1.0, 3.0, 3.0])
  np.testing.assert_array_equal(x.max().gradient(x)[0].numpy(), [0, 0.5, 0.5])


def test_max_axis_ties():
  x = Tensor(np.array([[2.0, 2.0, 2.0, 1.0], [0.0, 5.0, 1.0, 5.0]]))
  (g,) = x.max(1).sum().gradient(x)
  np.testing.assert_allclose(g.numpy(), [[1 / 3, 1 / 3, 1 / 3, 0], [0, 0.5, 0, 0.5]])


def test_min_tie_splits_evenly():
  x = Tensor([1.0, -3.0, -3.0])
  np.testing.assert_array_equal(x.min().gradient(x)[0].numpy(), [0, 0.5, 0.5])


def test_prod_grad_without_zeros_closed_form():
  x = np.array([2.0, -0.5, 3.0])
  t = Tensor(x)
  np.testing.assert_allclose(t.prod().gradient(t)[0].numpy(), [-1.5, 6.0, -1.0])


def test_prod_grad_with_a_zero():
  t = Tensor([2.0, 0.0, 3.0])
  np.testing.assert_array_equal(t.prod().gradient(t)[0].numpy(), [0.0, 6.0, 0.0])


def test_cumprod_grad_with_a_zero():
  t = Tensor([2.0, 0.0, 3.0])
  # d/dx sum(cumprod(x)) = [1 + x1 + x1 x2, x0 + x0 x2, x0 x1] = [1, 8, 0]
  np.testing.assert_array_equal(t.cumprod(0).sum().gradient(t)[0].numpy(), [1.0, 8.0, 0.0])
