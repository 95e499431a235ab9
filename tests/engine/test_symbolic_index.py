"""Indexing with a bound symbolic Variable (a KV-cache position) eagerly, inside @function and under TinyJit, symbolic
slices in both, and the RuntimeError for one variable bound to two values in one graph."""
import numpy as np
import pytest

from plugrad import Tensor, TinyJit, Variable, function

TABLE = np.arange(12, dtype=np.float32).reshape(4, 3)


def test_index_with_bound_variable():
  v = Variable("sp", 0, 3)
  for i in range(4): np.testing.assert_array_equal(Tensor(TABLE)[v.bind(i)].numpy(), TABLE[i])
  np.testing.assert_array_equal(Tensor(TABLE)[:, v.bind(1)].numpy(), TABLE[:, 1])
  with pytest.raises(IndexError, match="out of bounds"): Tensor(TABLE)[Variable("big", 0, 9).bind(7)]


def test_function_adds_table_row_at_start_pos():
  table = Tensor(TABLE)
  @function
  def f(x, start_pos): return x + table[start_pos]
  v = Variable("start_pos", 0, 3)
  for i in (1, 2, 1):
    np.testing.assert_array_equal(f(Tensor.ones(3), v.bind(i)).numpy(), TABLE[i] + 1)


def test_symbolic_slice_in_function_and_jit():
  x = np.arange(8, dtype=np.float32)
  @function
  def f(a, n): return a[:n].sum()
  @TinyJit
  def j(a, n): return (a[:n] * 2).sum().realize()
  n = Variable("n", 1, 8)
  for k in (2, 5, 3, 6):
    assert f(Tensor(x), n.bind(k)).item() == x[:k].sum()
    assert j(Tensor(x), n.bind(k)).item() == 2 * x[:k].sum()


def test_jit_replays_index_with_new_binding():
  table = Tensor(TABLE)
  @TinyJit
  def j(x, p): return (x + table[p]).realize()
  v = Variable("p", 0, 3)
  for i in (0, 1, 2, 3, 1): np.testing.assert_array_equal(j(Tensor.ones(3), v.bind(i)).numpy(), TABLE[i] + 1)


def test_bind_mismatch_raises():
  vi = Variable("i", 0, 100)
  a = Tensor(np.arange(200, dtype=np.float32)).reshape(100, 2)
  with pytest.raises(RuntimeError, match="bind mismatch on i"): a[vi.bind(12)].cat(a[vi.bind(76)]).realize()
  np.testing.assert_array_equal(a[vi.bind(12)].cat(a[vi.bind(12)]).numpy(), [24, 25, 24, 25])
