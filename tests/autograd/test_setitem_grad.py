"""Gradients through __setitem__: overwritten parts get zero gradient, assigned values get theirs, chains work."""
import numpy as np
import pytest

from plugrad import Tensor

W = np.arange(1, 7, dtype=np.float32)


def weights(n=6): return Tensor(W[:n])


def test_slice_assign_into_realized_leaf():
  z = Tensor(np.arange(6, dtype=np.float32), requires_grad=True).realize()
  x = Tensor([10.0, 20, 30], requires_grad=True)
  z[:3] = x
  (z * weights()).sum().backward()
  np.testing.assert_array_equal(z.numpy(), [10, 20, 30, 3, 4, 5])
  np.testing.assert_array_equal(z.grad.numpy(), [0, 0, 0, 4, 5, 6])  # overwritten parts: zero
  np.testing.assert_array_equal(x.grad.numpy(), [1, 2, 3])


def test_overlapping_assignments():
  z = Tensor(np.zeros(6, np.float32), requires_grad=True)
  x, y = Tensor(np.ones(4, np.float32), requires_grad=True), Tensor(np.full(4, 2, np.float32), requires_grad=True)
  z[:4] = x
  z[2:] = y
  (z * weights()).sum().backward()
  np.testing.assert_array_equal(z.numpy(), [1, 1, 2, 2, 2, 2])
  np.testing.assert_array_equal(z.grad.numpy(), np.zeros(6))
  np.testing.assert_array_equal(x.grad.numpy(), [1, 2, 0, 0])  # x's tail was overwritten by y
  np.testing.assert_array_equal(y.grad.numpy(), [3, 4, 5, 6])


def test_augmented_assignment():
  z = Tensor(np.arange(4, dtype=np.float32), requires_grad=True)
  x = Tensor([1.0, 2.0], requires_grad=True)
  z[:2] += x
  (z * z).sum().backward()
  np.testing.assert_array_equal(z.numpy(), [1, 3, 2, 3])
  np.testing.assert_array_equal(x.grad.numpy(), [2, 6])  # d(z0^2)/dx0 = 2*z0
  np.testing.assert_array_equal(z.grad.numpy(), [2, 6, 4, 6])  # the += keeps the old value's gradient


def test_non_leaf_target():
  w = Tensor([1.0, 2, 3, 4], requires_grad=True)
  z = w * 2
  z[:2] = Tensor([5.0, 5.0])
  z.sum().backward()
  np.testing.assert_array_equal(w.grad.numpy(), [0, 0, 2, 2])


def test_tensor_index_target():
  t = Tensor(np.zeros((3, 3), np.float32), requires_grad=True)
  v = Tensor(np.ones((2, 2), np.float32), requires_grad=True)
  t[Tensor([0, 2]), :2] = v
  (t * Tensor(np.arange(9, dtype=np.float32).reshape(3, 3))).sum().backward()
  np.testing.assert_array_equal(t.grad.numpy(), [[0, 0, 2], [3, 4, 5], [0, 0, 8]])
  np.testing.assert_array_equal(v.grad.numpy(), [[0, 1], [6, 7]])


def test_chain_of_unrealized_setitems():
  x = Tensor([1.0, 2, 3, 4], requires_grad=True)
  z = x * 1
  for i in range(3): z[i] = z[i + 1] * 2  # each step reads the previous state
  z.sum().backward()
  # z = [8x3, 4x3, 2x3... ] computed step by step: z0=2*x1, z1=2*x2, z2=2*x3, z3=x3
  np.testing.assert_array_equal(z.numpy(), [4, 6, 8, 4])
  np.testing.assert_array_equal(x.grad.numpy(), [0, 2, 2, 3])


def test_setitem_on_used_requires_grad_tensor_raises():
  q = Tensor([1.0, 2.0], requires_grad=True)
  r = q * 2  # noqa: F841  (another use of q)
  with pytest.raises(RuntimeError, match="can't setitem on a tensor that already has other uses and requires grad"): q[0] = 5.0


def test_setitem_without_grad_stays_in_place():
  z = Tensor(np.zeros(4, np.float32)).realize()
  view = z[1:3]
  z[1:3] = Tensor([7.0, 8.0])
  np.testing.assert_array_equal(view.numpy(), [7, 8])  # other views of the buffer see the write
