"""Autograd semantics: requires_grad, .grad accumulation, detach, gradient() arguments and errors, inference_mode,
shared subexpressions and higher-order gradients."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

X = np.array([0.5, -1.0, 2.0])


def t(requires_grad: bool | None = None, vals=X) -> Tensor: return Tensor(np.array(vals, dtype=np.float64), requires_grad=requires_grad)


# ***** requires_grad and backward *****
def test_requires_grad_default_is_none():
  assert Tensor([1.0]).requires_grad is None
  assert Tensor([1.0], requires_grad=True).requires_grad is True


def test_backward_fills_grad_for_requires_grad_true_and_none():
  # tinygrad's rule: requires_grad=None ("not decided", the default) is eligible, only False opts out
  a, b, c = t(None), t(True), t(False)
  (a * b * c).sum().backward()
  assert c.grad is None
  np.testing.assert_allclose(b.grad.numpy(), X * X)
  np.testing.assert_allclose(a.grad.numpy(), X * X)


def test_backward_with_default_requires_grad():
  x, w = Tensor.eye(3, dtype=dtypes.float64), Tensor([[2.0, 0.0, -2.0]], dtype=dtypes.float64)  # tinygrad's README example
  w.matmul(x).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [[2.0] * 3, [0.0] * 3, [-2.0] * 3])
  np.testing.assert_allclose(w.grad.numpy(), [[1.0, 1.0, 1.0]])


def test_backward_with_nothing_eligible_raises():
  x = t(False)
  with pytest.raises(RuntimeError, match="requires_grad=False"):
    (x * 2).sum().backward()


def test_backward_returns_self_and_grad_dtype_shape():
  x = t(True)
  loss = (x * x).sum()
  assert loss.backward() is loss
  assert x.grad.shape == x.shape and x.grad.dtype == dtypes.float64
  np.testing.assert_allclose(x.grad.numpy(), 2 * X)


def test_backward_accumulates_over_calls():
  x = t(True)
  (x * x).sum().backward()
  (x * 3).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), 2 * X + 3)


def test_backward_on_realized_leaf_and_intermediate_with_requires_grad():
  x = t(True).realize()
  y = x * 2
  y.requires_grad = True
  (y * y).sum().backward()
  np.testing.assert_allclose(y.grad.numpy(), 2 * (2 * X))
  np.testing.assert_allclose(x.grad.numpy(), 8 * X)


def test_backward_non_scalar_needs_gradient():
  x = t(True)
  with pytest.raises(RuntimeError, match="non-scalar"):
    (x * 2).backward()
  (x * x).backward(Tensor(np.array([1.0, 2.0, 3.0])))
  np.testing.assert_allclose(x.grad.numpy(), 2 * X * [1, 2, 3])


def test_backward_without_any_requires_grad_raises():
  with pytest.raises(RuntimeError, match="requires_grad"):
    (t(None) * 2).sum().backward()


# ***** gradient() *****
def test_gradient_non_scalar_needs_gradient_arg():
  x = t()
  with pytest.raises(RuntimeError, match=r"non-scalar.*\(3,\)"):
    (x * 2).gradient(x)
  (g,) = (x * 2).gradient(x, gradient=Tensor(np.array([1.0, 0.0, -1.0])))
  np.testing.assert_allclose(g.numpy(), [2.0, 0.0, -2.0])


def test_gradient_arg_shape_mismatch_raises():
  x = t()
  with pytest.raises(ValueError, match="shape"):
    (x * 2).gradient(x, gradient=Tensor(np.ones(4)))


def test_gradient_target_not_in_graph():
  x, y = t(), t(vals=[1.0, 2.0])
  loss = (x * x).sum()
  gx, gy = loss.gradient(x, y)  # zeros for an input the output doesn't depend on, as tinygrad and torch (materialize_grads)
  np.testing.assert_allclose(gx.numpy(), 2 * X)
  assert gy.shape == (2,) and gy.dtype == y.dtype
  np.testing.assert_array_equal(gy.numpy(), [0.0, 0.0])


def test_gradient_through_comparison_only_is_not_in_graph():
  x = t()
  loss = (x > 0).where(1.0, 2.0).sum()
  np.testing.assert_array_equal(loss.gradient(x)[0].numpy(), [0.0, 0.0, 0.0])


def test_gradient_of_self_and_of_intermediate():
  x = t()
  y = x * 2
  loss = (y * y).sum()
  gy, gx = loss.gradient(y, x)
  np.testing.assert_allclose(gy.numpy(), 4 * X)
  np.testing.assert_allclose(gx.numpy(), 8 * X)
  np.testing.assert_array_equal(loss.gradient(loss)[0].numpy(), 1.0)


def test_gradient_does_not_touch_grad_or_need_requires_grad():
  x = t(None)
  (g,) = (x * x).sum().gradient(x)
  assert x.grad is None
  np.testing.assert_allclose(g.numpy(), 2 * X)


# ***** dtypes *****
def test_integer_output_cannot_be_differentiated():
  x = Tensor([1, 2, 3])
  with pytest.raises(RuntimeError, match="float"):
    (x * 2).sum().gradient(x)


def test_integer_input_gets_no_gradient():
  i = Tensor([1, 2, 3])
  (g,) = (i.cast(dtypes.float64) * 2.5).sum().gradient(i)
  assert g.dtype == dtypes.int32
  np.testing.assert_array_equal(g.numpy(), [0, 0, 0])


def test_float32_gradient_dtype():
  x = Tensor(X.astype(np.float32))
  (g,) = (x * x).sum().gradient(x)
  assert g.dtype == dtypes.float32
  np.testing.assert_allclose(g.numpy(), 2 * X, rtol=1e-6)


def test_gradient_through_cast_to_and_from_float32():
  x = t()
  (g,) = (x.cast(dtypes.float32) * 3).cast(dtypes.float64).sum().gradient(x)
  assert g.dtype == dtypes.float64
  np.testing.assert_allclose(g.numpy(), [3.0, 3.0, 3.0])


# ***** detach, inference_mode, train *****
def test_detach_stops_gradient():
  x = t()
  d = x.detach()
  assert d.requires_grad is False
  (g,) = (x * d).sum().gradient(x)
  np.testing.assert_allclose(g.numpy(), X)  # not 2x
  np.testing.assert_array_equal((d * d).sum().gradient(x)[0].numpy(), [0.0, 0.0, 0.0])


def test_detach_in_backward():
  x = t(True)
  (x.detach().exp() * x).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), np.exp(X))


def test_inference_mode_makes_backward_raise():
  x = t(True)
  loss = (x * x).sum()
  with Tensor.inference_mode():
    with pytest.raises(RuntimeError, match="no_grad"):
      loss.backward()
    with pytest.raises(RuntimeError, match="no_grad"):
      loss.gradient(x)
    np.testing.assert_allclose((x * 2).numpy(), 2 * X)  # forward still works
  assert x.grad is None
  loss.backward()  # allowed again after the block
  np.testing.assert_allclose(x.grad.numpy(), 2 * X)


def test_inference_mode_decorator_and_nesting_restore():
  @Tensor.inference_mode()
  def f(): return Tensor.no_grad
  assert f() is True and Tensor.no_grad is False
  with Tensor.inference_mode():
    with Tensor.inference_mode(): pass
    assert Tensor.no_grad is True
  assert Tensor.no_grad is False


def test_train_mode_does_not_change_plain_gradients():
  x = t()
  with Tensor.train():
    (g,) = (x * x).sum().gradient(x)
  np.testing.assert_allclose(g.numpy(), 2 * X)


# ***** graph structure *****
def test_diamond_gradients_add_up():
  x = t()
  y = x * 2
  z = (y * y + y.exp() + y).sum()  # y feeds three branches
  (g,) = z.gradient(x)
  yv = 2 * X
  np.testing.assert_allclose(g.numpy(), 2 * (2 * yv + np.exp(yv) + 1))


def test_same_tensor_both_operands():
  x = t()
  (g,) = (x * x + x / x.exp()).sum().gradient(x)
  np.testing.assert_allclose(g.numpy(), 2 * X + (1 - X) * np.exp(-X))


def test_gradient_wrt_two_leaves_sharing_a_subgraph():
  a, b = t(), t(vals=[1.5, 0.5, -0.5])
  s = a * b
  ga, gb = (s.sin() + s * s).sum().gradient(a, b)
  sv = X * np.array([1.5, 0.5, -0.5])
  np.testing.assert_allclose(ga.numpy(), (np.cos(sv) + 2 * sv) * [1.5, 0.5, -0.5])
  np.testing.assert_allclose(gb.numpy(), (np.cos(sv) + 2 * sv) * X)


def test_broadcast_leaf_gradient_is_reduced():
  w = Tensor(np.array([1.0, 2.0, 3.0]))
  x = Tensor(np.arange(6, dtype=np.float64).reshape(2, 3))
  (g,) = (x * w).sum().gradient(w)
  np.testing.assert_allclose(g.numpy(), [3.0, 5.0, 7.0])


# ***** higher order *****
def test_second_derivative_of_cube_is_6x():
  x = t()
  (g,) = (x ** 3).sum().gradient(x)
  (gg,) = g.sum().gradient(x)
  (ggg,) = gg.sum().gradient(x)  # before realizing: a realized tensor is a buffer, its graph is gone (as tinygrad)
  np.testing.assert_allclose(g.numpy(), 3 * X * X)
  np.testing.assert_allclose(gg.numpy(), 6 * X)
  np.testing.assert_allclose(ggg.numpy(), [6.0, 6.0, 6.0])


def test_second_derivative_transcendental():
  x = t()
  (g,) = (x.sin() * x.exp()).sum().gradient(x)
  (gg,) = g.sum().gradient(x)
  np.testing.assert_allclose(gg.numpy(), 2 * np.cos(X) * np.exp(X), rtol=1e-12)


def test_mixed_second_derivative():
  x, y = t(), t(vals=[1.0, 2.0, -1.0])
  (gx,) = (x * x * y * y * y).sum().gradient(x)  # 2 x y^3
  (gxy,) = gx.sum().gradient(y)  # 6 x y^2
  np.testing.assert_allclose(gxy.numpy(), 6 * X * np.array([1.0, 2.0, -1.0]) ** 2)


def test_hessian_vector_product_of_softmax_loss():
  # the gradient graph of a reduce-heavy function is itself differentiable: compare H.v with finite differences of grad
  w, v = np.array([0.3, -0.2, 0.5, 0.1]), np.array([1.0, -0.5, 0.25, 2.0])
  def grad_at(wv: np.ndarray, with_hvp: bool = False):
    wt = Tensor(wv)
    (g,) = (wt.log_softmax() * Tensor(np.array([0.1, 0.7, 0.1, 0.1]))).sum().gradient(wt)
    if not with_hvp: return g.numpy()
    return (g * Tensor(v)).sum().gradient(wt)[0].numpy()
  eps = 1e-6
  fd = (grad_at(w + eps * v) - grad_at(w - eps * v)) / (2 * eps)
  np.testing.assert_allclose(grad_at(w, True), fd, atol=1e-7, rtol=1e-6)


# ***** leaves made from constants *****
def test_gradient_wrt_ones_leaf():
  z, w = Tensor.ones(3), Tensor.ones(3)
  np.testing.assert_array_equal((z * w).sum().gradient(z)[0].numpy(), [1.0, 1.0, 1.0])


def test_backward_scalar_leaf_with_equal_constant_in_graph():
  a, b = Tensor(2.0, requires_grad=True), Tensor(3.0)
  (a * b + b * 2.0).backward()
  assert a.grad.item() == 3.0


def test_gradient_wrt_buffer_leaves_with_equal_values():
  # list/numpy data gets its own buffer: equal values don't alias
  z, w = Tensor([1.0, 1.0, 1.0]), Tensor([1.0, 1.0, 1.0])
  np.testing.assert_array_equal((z * w).sum().gradient(z)[0].numpy(), [1.0, 1.0, 1.0])
