"""Conformance tests for the tinygrad-parity ops (sort/argsort/topk, cummax/cummin indices, isclose, copysign, fmod,
log10, logaddexp, normalize, softmin, nll_loss, max_unpool2d, masked_select, nonzero, diag/diagonal, meshgrid, unfold,
clone) against numpy references written here; device-generic, small shapes."""
from __future__ import annotations

import math

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
from plugrad.testing.helpers import assert_close, rand_np


def T(a) -> Tensor: return Tensor(np.asarray(a))


def _with_ties(shape, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(-3, 4, size=shape).astype(np.float32)  # many equal values: stability matters


@pytest.mark.parametrize("shape,dim", [((7,), 0), ((3, 6), 1), ((3, 6), 0), ((2, 3, 4), -2), ((1,), 0)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable(shape, dim, descending):
  x = _with_ties(shape)
  v, i = T(x).sort(dim, descending)
  key = -x if descending else x
  want_i = np.argsort(key, axis=dim, kind="stable")
  assert i.dtype == dtypes.int32
  assert_close(i.numpy(), want_i.astype(np.int32))
  assert_close(v.numpy(), np.take_along_axis(x, want_i, dim))
  assert_close(T(x).argsort(dim, descending).numpy(), want_i.astype(np.int32))


def test_sort_nan_last_ints_and_edges():
  x = np.array([3.0, np.nan, 1.0, -np.inf, 1.0, np.inf], np.float32)
  v, i = T(x).sort()
  assert_close(i.numpy(), np.argsort(x, kind="stable").astype(np.int32))  # numpy also sorts nan last
  assert_close(v.numpy(), np.sort(x))
  n = rand_np((4, 5), dtypes.int32, -3, 3, seed=2)
  assert_close(T(n).sort(1)[0].numpy(), np.sort(n, 1))
  v, i = T(np.float32(2.5)).sort()
  assert v.shape == () and i.item() == 0
  assert T(np.zeros((2, 0), np.float32)).sort()[1].shape == (2, 0)


@pytest.mark.parametrize("k,largest", [(1, True), (3, True), (2, False), (6, True), (0, True)])
def test_topk(k, largest):
  x = rand_np((4, 6), seed=3)
  v, i = T(x).topk(k, largest=largest)
  order = np.argsort(-x if largest else x, axis=-1, kind="stable")[:, :k]
  assert_close(i.numpy(), order.astype(np.int32))
  assert_close(v.numpy(), np.take_along_axis(x, order, -1))
  with pytest.raises(ValueError, match="topk"): T(x).topk(7)


def _cum_ref(x: np.ndarray, axis: int, better) -> tuple[np.ndarray, np.ndarray]:
  xm = np.moveaxis(x, axis, -1)
  vals, idxs = np.empty_like(xm), np.empty(xm.shape, np.int32)
  for pre in np.ndindex(*xm.shape[:-1]):
    best, bi = None, 0
    for j, v in enumerate(xm[pre]):
      if best is None or better(v, best) or v == best: best, bi = v, j
      vals[pre + (j,)], idxs[pre + (j,)] = best, bi
  return np.moveaxis(vals, -1, axis), np.moveaxis(idxs, -1, axis)


@pytest.mark.parametrize("shape,axis", [((6,), 0), ((3, 5), 1), ((4, 3), 0)])
def test_cummax_cummin_indices(shape, axis):
  x = _with_ties(shape, seed=4)
  for fn, better in (("cummax", lambda a, b: a > b), ("cummin", lambda a, b: a < b)):
    v, i = getattr(T(x), fn)(axis)
    wv, wi = _cum_ref(x, axis, better)
    assert_close(v.numpy(), wv, msg=fn)
    assert_close(i.numpy(), wi, msg=fn)  # ties: the last index reaching the running value, as torch
  iv, ii = T(np.array([2, 5, 5, 1], np.int32)).cummin()
  assert_close(iv.numpy(), np.array([2, 2, 2, 1], np.int32)) and assert_close(ii.numpy(), np.array([0, 0, 0, 3], np.int32))


def test_elementwise_new_ops():
  a, b = rand_np((3, 5), seed=5), rand_np((3, 5), seed=6)
  b[0, :3] = [0.0, -0.0, np.inf]
  assert_close(T(a).copysign(T(b)).numpy(), np.copysign(a, b))
  with np.errstate(invalid="ignore"): assert_close(T(a).fmod(T(b)).numpy(), np.fmod(a, b), atol=1e-5)
  assert_close(T(a).abs().log10().numpy(), np.log10(np.abs(a)), atol=1e-6, rtol=1e-6)
  big = np.array([1000.0, -np.inf, 3.0, np.nan, -1000.0], np.float32)
  other = np.array([999.0, -np.inf, np.inf, 1.0, 5.0], np.float32)
  with np.errstate(all="ignore"): assert_close(T(big).logaddexp(T(other)).numpy(), np.logaddexp(big, other))
  assert_close(T(a).logaddexp(T(b)).numpy(), np.logaddexp(a, b), atol=1e-6)
  i, j = rand_np((8,), dtypes.int32, -9, 9, seed=7), np.array([3, -3, 2, 5, -4, 7, 1, -1], np.int32)
  assert_close(T(i).fmod(T(j)).numpy(), np.fmod(i, j))
  x, y = a.copy(), a + np.float32(1e-6)
  y[0, 0], x[0, 1], y[0, 1], x[0, 2], y[0, 2] = np.nan, np.inf, np.inf, np.nan, np.nan
  assert_close(T(x).isclose(T(y)).numpy(), np.isclose(x, y))
  assert_close(T(x).isclose(T(y), equal_nan=True, rtol=0, atol=0).numpy(), np.isclose(x, y, rtol=0, atol=0, equal_nan=True))


def test_normalize_softmin():
  x = rand_np((3, 4), seed=8)
  assert_close(T(x).normalize().numpy(), x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12))
  assert_close(T(x).normalize(p=1, dim=0).numpy(), x / np.abs(x).sum(0, keepdims=True), atol=1e-6)
  e = np.exp(-x - (-x).max(-1, keepdims=True))
  assert_close(T(x).softmin().numpy(), e / e.sum(-1, keepdims=True))
  assert_close(T(np.float32(3.0)).softmax().numpy(), np.float32(1.0))
  assert_close(T(np.float32(3.0)).log_softmax().numpy(), np.float32(0.0))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction):
  logp = np.log(np.random.default_rng(9).dirichlet(np.ones(5), size=4)).astype(np.float32)
  y, w = np.array([1, 4, 0, 2]), np.array([0.5, 1.0, 2.0, 1.0, 3.0], np.float32)
  per = -w[y] * logp[np.arange(4), y]
  per[2] = 0.0  # target 0 is ignored below
  want = {"none": per, "sum": per.sum(), "mean": per.sum() / (w[y].sum() - w[0])}[reduction]
  got = T(logp).nll_loss(T(y.astype(np.int32)), weight=T(w), ignore_index=0, reduction=reduction)
  assert_close(got.numpy(), np.asarray(want, np.float32), atol=1e-6)


def test_max_unpool2d_inverts_pool():
  x = rand_np((1, 2, 4, 6), seed=10)
  out, idx = T(x).max_pool2d(2, return_indices=True)
  up = out.max_unpool2d(idx, 2).numpy()
  want = np.zeros_like(x)
  for n, c, i, j in np.ndindex(1, 2, 2, 3):
    win = x[n, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
    a, b = np.unravel_index(np.argmax(win), win.shape)
    want[n, c, 2 * i + a, 2 * j + b] = win[a, b]
  assert_close(up, want)


def test_masked_select_nonzero():
  x = rand_np((3, 4), seed=11)
  assert_close(T(x).masked_select(T(x > 0)).numpy(), x[x > 0])
  assert_close(T(x).masked_select(T(np.array([True, False, True, False]))).numpy(), x[:, [0, 2]].reshape(-1))
  assert_close(T(x > 0.5).nonzero().numpy(), np.argwhere(x > 0.5).astype(np.int32))
  assert T(np.zeros((2, 3), np.float32)).nonzero().shape == (0, 2)


@pytest.mark.parametrize("offset", [0, 1, -1, 3, -2, 7])
def test_diagonal_and_diag(offset):
  x = rand_np((3, 5), seed=12)
  assert_close(T(x).diagonal(offset).numpy(), np.diagonal(x, offset))
  assert_close(T(x).diag(offset).numpy(), np.diag(x, offset))
  v = rand_np((4,), seed=13)
  assert_close(T(v).diag(offset).numpy(), np.diag(v, offset))
  y = rand_np((2, 3, 4), seed=14)
  assert_close(T(y).diagonal(offset, 2, 1).numpy(), np.diagonal(y, offset, 2, 1))


def test_meshgrid_unfold_clone():
  a, b = np.arange(3, dtype=np.int32), np.arange(4, 6, dtype=np.int32)
  for indexing in ("ij", "xy"):
    for g, w in zip(T(a).meshgrid(T(b), indexing=indexing), np.meshgrid(a, b, indexing=indexing)): assert_close(g.numpy(), w)
  x = rand_np((3, 10), seed=15)
  for dim, size, step in ((1, 3, 2), (0, 2, 1), (1, 10, 1), (1, 1, 4)):
    want = np.lib.stride_tricks.sliding_window_view(x, size, axis=dim)
    want = np.take(want, np.arange(0, want.shape[dim], step), axis=dim)
    assert_close(T(x).unfold(dim, size, step).numpy(), want)
  long = np.arange(60, dtype=np.float32)  # more than 16 windows: the gather path
  assert_close(T(long).unfold(0, 4, 3).numpy(), np.lib.stride_tricks.sliding_window_view(long, 4)[::3])
  c = T(x).clone()
  assert_close(c.numpy(), x) and c is not None


def test_dtype_min_max_properties():
  assert dtypes.int8.min == -128 and dtypes.uint16.max == 65535 and dtypes.float32.max == math.inf and dtypes.bool.min is False
