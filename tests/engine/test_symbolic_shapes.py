"""Symbolic shapes: bound Variables in shapes, one compile for every bound value, and the results equal concrete ones."""
import numpy as np
import pytest

from plugrad import Tensor, TinyJit, Variable
from plugrad.engine.realize import GlobalCounters

rng = np.random.default_rng(0)
X = rng.standard_normal((12, 6)).astype(np.float32)
W = rng.standard_normal((6, 5)).astype(np.float32)


def softmax(a, axis=-1):
  e = np.exp(a - a.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def test_ops_on_symbolic_rows_equal_concrete():
  v = Variable("rows", 1, 12)
  x, w = Tensor(X), Tensor(W)
  for n in (1, 4, 12):
    xs = x[:v.bind(n)]
    np.testing.assert_allclose((xs * 2 + 1).numpy(), X[:n] * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(xs.sum(axis=1).numpy(), X[:n].sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((xs @ w).numpy(), X[:n] @ W, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(xs.softmax(axis=1).numpy(), softmax(X[:n], 1), rtol=1e-5, atol=1e-6)
    assert xs.shape[1] == 6 and repr(xs.shape[0]) == f"<rows with rows={n}>"


def test_ten_lengths_compile_once():
  v = Variable("len", 1, 12)
  x, w = Tensor(X), Tensor(W)
  def run(n): return ((x[:v.bind(n)] @ w).relu().softmax(axis=1) * 3).numpy()
  run(5)
  before = GlobalCounters["compiles"]
  for n in range(1, 11): np.testing.assert_allclose(run(n), softmax(np.maximum(X[:n] @ W, 0), 1) * 3, rtol=1e-5, atol=1e-6)
  assert GlobalCounters["compiles"] == before  # every kernel was compiled once, for the symbolic length


def test_arange_triu_tril_and_attention_mask():
  t, s = Variable("T", 1, 8), Variable("sp", 0, 8)
  for T, sp in ((1, 0), (3, 2), (5, 0)):
    np.testing.assert_array_equal(Tensor.arange(t.bind(T)).numpy(), np.arange(T))
    m = Tensor.full((1, 1, t.bind(T), s.bind(sp) + t.bind(T)), float("-inf")).triu(s.bind(sp) + 1)
    np.testing.assert_array_equal(m.numpy()[0, 0], np.triu(np.full((T, sp + T), -np.inf, np.float32), sp + 1))
    sq = Tensor(X[:8, :5])[:t.bind(T)]
    for k in (-1, 0, 2):
      np.testing.assert_array_equal(sq.triu(k).numpy(), np.triu(X[:T, :5], k))
      np.testing.assert_array_equal(sq.tril(k).numpy(), np.tril(X[:T, :5], k))


def test_attention_with_symbolic_sequence():
  t = Variable("seq", 1, 12)
  q = rng.standard_normal((1, 2, 12, 4)).astype(np.float32)
  for T in (2, 7):
    qt = Tensor(q)[:, :, :t.bind(T)]
    out = qt.scaled_dot_product_attention(qt, qt, is_causal=True).numpy()
    qq = q[:, :, :T]
    sc = qq @ qq.transpose(0, 1, 3, 2) / 2.0 + np.triu(np.full((T, T), -np.inf), 1)
    np.testing.assert_allclose(out, softmax(sc) @ qq, rtol=1e-5, atol=1e-5)


def test_bind_mismatch():
  v = Variable("n", 1, 10)
  x = Tensor(X[:10, 0])
  with pytest.raises(RuntimeError, match="bind mismatch on n"): (x[:v.bind(3)].sum() + x[:v.bind(4)].sum()).realize()


def test_jit_with_symbolic_length():
  v = Variable("m", 1, 12)
  w = Tensor(W).realize()
  @TinyJit
  def f(x, n): return (x[:n] @ w).sum(axis=1)
  x = Tensor(X).realize()
  for n in (3, 4, 6, 9, 12):
    out = f(x, v.bind(n))
    np.testing.assert_allclose(out.numpy(), (X[:n] @ W).sum(1), rtol=1e-5, atol=1e-5)
