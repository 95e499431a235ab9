"""Gradients of nn ops (matmul/einsum, normalization, softmax, conv/pool, attention, losses, interpolate, dropout)
against float64 finite differences."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from gradcheck import assert_directional, batch_gradcheck, distinct, gradcheck, rand

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

S = (3, 4)
LABELS = np.array([1, 3, 0])
ONE = (0,)  # wrt: only the first input (the others are data)


def probs(seed: int = 0) -> np.ndarray: return rand(*S, low=0.1, high=0.9, seed=seed)


NN = {
  "softmax": (lambda x: x.softmax(), [rand(*S)]),
  "softmax_axis0": (lambda x: x.softmax(0), [rand(*S, low=-5, high=5)]),
  "log_softmax": (lambda x: x.log_softmax(), [rand(*S)]),
  "log_softmax_3d": (lambda x: x.log_softmax(1), [rand(2, 3, 4)]),
  "layernorm": (lambda x: x.layernorm(), [rand(*S)]),
  "layernorm_axes": (lambda x: x.layernorm((1, 2)), [rand(2, 3, 4)]),
  "batchnorm": (lambda x, w, b, m, s: x.batchnorm(w, b, m, s), [rand(2, 3, 4), rand(3, seed=1), rand(3, seed=2), rand(3, seed=3),
                                                                  rand(3, low=0.5, high=2, seed=4)]),
  "batchnorm_no_affine_axis": (lambda x, m, s: x.batchnorm(None, None, m, s, axis=-1), [rand(*S), rand(4, seed=1), rand(4, low=0.5, high=2, seed=2)]),
  "matmul": (lambda a, b: a @ b, [rand(*S), rand(4, 2, seed=1)]),
  "matmul_batched_broadcast": (lambda a, b: a.matmul(b), [rand(2, 3, 4), rand(4, 2, seed=1)]),
  "matmul_vec": (lambda a, b: a @ b, [rand(*S), rand(4, seed=1)]),
  "dot_1d": (lambda a, b: a.dot(b), [rand(4), rand(4, seed=1)]),
  "rmatmul": (lambda a: rand(2, 3, seed=4).tolist() @ a, [rand(*S)]),
  "linear": (lambda x, w, b: x.linear(w, b), [rand(*S), rand(4, 2, seed=1), rand(2, seed=2)]),
  "einsum_matmul": (lambda a, b: Tensor.einsum("ij,jk->ik", a, b), [rand(*S), rand(4, 2, seed=1)]),
  "einsum_outer_trace": (lambda a, b: Tensor.einsum("ii,j->j", a, b), [rand(3, 3), rand(4, seed=1)]),
  "einsum_batch_transpose": (lambda a, b: Tensor.einsum("bij,bkj->bki", a, b), [rand(2, 3, 4), rand(2, 2, 4, seed=1)]),
  "conv1d": (lambda x, w, b: x.conv1d(w, b), [rand(2, 2, 6), rand(3, 2, 3, seed=1), rand(3, seed=2)]),
  "conv1d_stride_pad": (lambda x, w, b: x.conv1d(w, b, stride=2, padding=1), [rand(2, 2, 6), rand(3, 2, 3, seed=1), rand(3, seed=2)]),
  "conv2d": (lambda x, w, b: x.conv2d(w, b), [rand(1, 2, 5, 5), rand(3, 2, 3, 3, seed=1), rand(3, seed=2)]),
  "conv2d_stride_pad": (lambda x, w, b: x.conv2d(w, b, stride=2, padding=1), [rand(1, 2, 5, 5), rand(3, 2, 3, 3, seed=1), rand(3, seed=2)]),
  "conv2d_dilation": (lambda x, w, b: x.conv2d(w, b, dilation=2, padding=(1, 2)), [rand(1, 2, 5, 5), rand(3, 2, 3, 3, seed=1), rand(3, seed=2)]),
  "conv2d_groups": (lambda x, w: x.conv2d(w, groups=2, stride=(1, 2)), [rand(1, 4, 5, 5), rand(4, 2, 3, 3, seed=1)]),
  "conv_transpose2d": (lambda x, w, b: x.conv_transpose2d(w, b), [rand(1, 2, 3, 3), rand(2, 3, 3, 3, seed=1), rand(3, seed=2)]),
  "conv_transpose2d_stride": (lambda x, w, b: x.conv_transpose2d(w, b, stride=2, padding=1, output_padding=1),
                              [rand(1, 2, 3, 3), rand(2, 3, 3, 3, seed=1), rand(3, seed=2)]),
  "conv_transpose2d_groups": (lambda x, w: x.conv_transpose2d(w, groups=2, dilation=2), [rand(1, 2, 3, 3), rand(2, 1, 2, 2, seed=1)]),
  "avg_pool2d": (lambda x: x.avg_pool2d(), [rand(1, 2, 4, 4)]),
  "avg_pool2d_stride_pad": (lambda x: x.avg_pool2d(3, stride=2, padding=1, count_include_pad=False), [rand(1, 2, 5, 5)]),
  "avg_pool2d_ceil": (lambda x: x.avg_pool2d(2, ceil_mode=True), [rand(1, 2, 5, 5)]),
  "max_pool2d": (lambda x: x.max_pool2d(), [distinct(1, 2, 4, 4)]),
  "max_pool2d_overlap_pad": (lambda x: x.max_pool2d(3, stride=2, padding=1), [distinct(1, 2, 5, 5)]),
  "max_pool2d_dilation": (lambda x: x.max_pool2d(2, stride=1, dilation=2), [distinct(1, 2, 5, 5)]),
  "sdpa": (lambda q, k, v: q.scaled_dot_product_attention(k, v), [rand(2, 3, 4), rand(2, 5, 4, seed=1), rand(2, 5, 2, seed=2)]),
  "sdpa_bool_mask": (lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=Tensor(rand(3, 5, seed=9) > -1.2)),
                     [rand(2, 3, 4), rand(2, 5, 4, seed=1), rand(2, 5, 2, seed=2)]),
  "sdpa_float_mask": (lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=Tensor(rand(3, 5, seed=3))),
                      [rand(2, 3, 4), rand(2, 5, 4, seed=1), rand(2, 5, 2, seed=2)]),
  "sdpa_causal": (lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
                  [rand(2, 3, 4), rand(2, 5, 4, seed=1), rand(2, 5, 2, seed=2)]),  # L=3 < S=5: top-left aligned
  "cross_entropy_labels": (lambda x: x.cross_entropy(Tensor(LABELS)), [rand(*S)]),
  "cross_entropy_sum_smoothing": (lambda x: x.cross_entropy(Tensor(LABELS), reduction="sum", label_smoothing=0.2), [rand(*S)]),
  "cross_entropy_probs": (lambda x, y: x.cross_entropy(y.softmax()), [rand(*S), rand(*S, seed=1)]),
  "cross_entropy_none_1d": (lambda x: x.cross_entropy(Tensor(np.array(2)), reduction="none"), [rand(4)]),
  "sparse_categorical_crossentropy": (lambda x: x.sparse_categorical_crossentropy(Tensor(LABELS)), [rand(*S)]),
  "sparse_cce_ignore_smoothing": (lambda x: x.sparse_categorical_crossentropy(Tensor(np.array([1, -1, 3])), label_smoothing=0.1), [rand(*S)]),
  "binary_crossentropy": (lambda p, y: p.binary_crossentropy(y), [probs(), probs(1)]),
  "binary_crossentropy_none": (lambda p: p.binary_crossentropy(Tensor(probs(1)), reduction="none"), [probs()]),
  "binary_crossentropy_logits": (lambda x, y: x.binary_crossentropy_logits(y), [rand(*S, low=-4, high=4), probs(1)]),
  "bce_logits_pos_weight": (lambda x, w: x.binary_crossentropy_logits(Tensor(probs(1)), pos_weight=w), [rand(*S), rand(4, low=0.5, high=2, seed=2)]),
  "interpolate_linear": (lambda x: x.interpolate((3, 7)), [rand(1, 2, 3, 4)]),
  "interpolate_linear_down": (lambda x: x.interpolate((2, 3)), [rand(1, 2, 3, 4)]),
  "interpolate_align_corners": (lambda x: x.interpolate((5, 6), align_corners=True), [rand(1, 2, 3, 4)]),
  "interpolate_nearest": (lambda x: x.interpolate((5, 6), mode="nearest"), [rand(1, 2, 3, 4)]),
  "interpolate_nearest_exact": (lambda x: x.interpolate((5, 3), mode="nearest-exact"), [rand(1, 2, 3, 4)]),
}


@functools.lru_cache(maxsize=None)
def _results() -> dict:
  """All NN cases checked together: one stacked graph per tuple of input shapes (see batch_gradcheck)."""
  return batch_gradcheck(NN)


@pytest.mark.parametrize("name", list(NN))
def test_nn(name):
  assert_directional(name, _results()[name])


@pytest.mark.parametrize("name", ["softmax", "conv2d_groups", "sdpa_causal"])
def test_nn_alone(name):
  # a few cases on their own graph too, through the general check
  fn, xs = NN[name]
  gradcheck(fn, *xs)


def test_softmax_grad_sums_to_zero():
  # softmax rows sum to 1, so the gradient of any function of them, summed along the row, is 0 for a row-constant cotangent
  x = Tensor(rand(*S))
  (g,) = (x.softmax() * Tensor(np.array([[1.0], [2.0], [3.0]]))).sum().gradient(x)
  np.testing.assert_allclose(g.numpy(), 0, atol=1e-12)


def test_cross_entropy_grad_closed_form():
  # d/dx mean CE = (softmax(x) - onehot) / N
  x = rand(*S)
  t = Tensor(x)
  (g,) = t.cross_entropy(Tensor(LABELS)).gradient(t)
  sm = np.exp(x - x.max(1, keepdims=True))
  sm /= sm.sum(1, keepdims=True)
  np.testing.assert_allclose(g.numpy(), (sm - np.eye(4)[LABELS]) / 3, rtol=1e-10, atol=1e-14)


def test_max_pool2d_grad_routes_to_the_max():
  x = distinct(1, 1, 4, 4)
  t = Tensor(x)
  (g,) = t.max_pool2d().sum().gradient(t)
  want = np.zeros_like(x)
  for i in range(2):
    for j in range(2):
      w = x[0, 0, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
      a, b = np.unravel_index(w.argmax(), w.shape)
      want[0, 0, 2 * i + a, 2 * j + b] = 1
  np.testing.assert_array_equal(g.numpy(), want)


def test_dropout_grad_is_the_mask_scaling():
  x = Tensor(rand(4, 8, low=0.5, high=1.5))
  Tensor.manual_seed(1234)
  with Tensor.train():
    y = x.dropout(0.25)
    (g,) = (y * 1).sum().gradient(x)
  Tensor.realize_all(y, g)
  yv, gv = y.numpy(), g.numpy()
  kept = yv != 0
  assert 0 < kept.sum() < kept.size, "a 4x8 dropout(0.25) should keep some and drop some"
  np.testing.assert_allclose(gv, np.where(kept, 1 / 0.75, 0.0), rtol=1e-12)
  np.testing.assert_allclose(yv, x.numpy() * gv, rtol=1e-12)
  # the same seed gives the same mask (and so the same gradient)
  Tensor.manual_seed(1234)
  with Tensor.train():
    (g2,) = x.dropout(0.25).sum().gradient(x)
  np.testing.assert_array_equal(g2.numpy(), gv)


def test_dropout_eval_mode_is_identity_grad():
  x = Tensor(rand(*S))
  with Tensor.test():
    (g,) = x.dropout(0.5).sum().gradient(x)
  np.testing.assert_array_equal(g.numpy(), np.ones(S))


def test_float32_softmax_matmul_grad_dtype():
  a = Tensor(rand(*S).astype(np.float32))
  w = Tensor(rand(4, 2, seed=1).astype(np.float32))
  ga, gw = (a @ w).softmax().log().sum().gradient(a, w)
  assert ga.dtype == dtypes.float32 and gw.dtype == dtypes.float32
  # d/dz sum_j log_softmax(z)_j = 1 - C softmax(z), then back through z = a @ w
  av, wv = rand(*S), rand(4, 2, seed=1)
  z = av @ wv
  sm = np.exp(z - z.max(1, keepdims=True))
  dz = 1 - 2 * sm / sm.sum(1, keepdims=True)
  np.testing.assert_allclose(ga.numpy(), dz @ wv.T, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(gw.numpy(), av.T @ dz, rtol=1e-4, atol=1e-5)


def test_avg_pool2d_ceil_two_channels_sum():
  # unrolling the outer reduce left one copy of the inner window reduce independent of it: the linearizer gives it
  # its own loop (it used to emit an END for a range opened in another scope)
  np.testing.assert_allclose(Tensor.ones(1, 2, 5, 5).avg_pool2d(2, ceil_mode=True).sum().numpy(), 18.0)
  x = np.random.default_rng(0).random((1, 2, 5, 5), dtype=np.float32)
  ref = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)))
  cnt = np.pad(np.ones((5, 5)), ((0, 1), (0, 1))).reshape(3, 2, 3, 2).sum((1, 3))
  ref = ref.reshape(1, 2, 3, 2, 3, 2).sum((3, 5)) / cnt
  np.testing.assert_allclose(Tensor(x).avg_pool2d(2, ceil_mode=True).sum().numpy(), ref.sum(), rtol=1e-5)


def test_interpolate_linear_float64_weights_are_float64():
  got = Tensor(np.array([[[0.0, 1.0, 2.0]]])).interpolate((7,)).numpy().ravel()
  np.testing.assert_allclose(got, np.clip((np.arange(7) + 0.5) * 3 / 7 - 0.5, 0, 2), rtol=1e-13, atol=1e-15)
