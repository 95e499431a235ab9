"""Gradients of elementwise ops and activations against float64 finite differences (see gradcheck.py)."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from gradcheck import (analytic_grad, assert_directional, away, backward_grads, batch_gradcheck, elementwise_batch_check, full_fd_grad, gradcheck,
                       kinkfree, rand)

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

S = (3, 4)  # one shape for (almost) everything, so kernels are shared between tests


def pos(seed: int = 0) -> np.ndarray: return rand(*S, low=0.3, high=2.0, seed=seed)
def unit(seed: int = 0) -> np.ndarray: return rand(*S, low=-0.85, high=0.85, seed=seed)


# name -> (fn, input arrays)
UNARY = {
  "neg": (lambda x: -x, rand(*S)),
  "exp": (lambda x: x.exp(), rand(*S)),
  "exp2": (lambda x: x.exp2(), rand(*S)),
  "log": (lambda x: x.log(), pos()),
  "log2": (lambda x: x.log2(), pos()),
  "sqrt": (lambda x: x.sqrt(), pos()),
  "rsqrt": (lambda x: x.rsqrt(), pos()),
  "sin": (lambda x: x.sin(), rand(*S, low=-4, high=4)),
  "cos": (lambda x: x.cos(), rand(*S, low=-4, high=4)),
  "tan": (lambda x: x.tan(), rand(*S, low=-1.2, high=1.2)),
  "asin": (lambda x: x.asin(), unit()),
  "acos": (lambda x: x.acos(), unit()),
  "atan": (lambda x: x.atan(), rand(*S, low=-3, high=3)),
  "sinh": (lambda x: x.sinh(), rand(*S)),
  "cosh": (lambda x: x.cosh(), rand(*S)),
  "tanh": (lambda x: x.tanh(), rand(*S)),
  "asinh": (lambda x: x.asinh(), rand(*S, low=-3, high=3)),
  "acosh": (lambda x: x.acosh(), rand(*S, low=1.2, high=3)),
  "atanh": (lambda x: x.atanh(), unit()),
  "erf": (lambda x: x.erf(), rand(*S)),
  "reciprocal": (lambda x: x.reciprocal(), away(*S)),
  "abs": (lambda x: x.abs(), away(*S)),
  "square": (lambda x: x.square(), rand(*S)),
  "sigmoid": (lambda x: x.sigmoid(), rand(*S, low=-4, high=4)),
  "logsigmoid": (lambda x: x.logsigmoid(), rand(*S, low=-4, high=4)),
  "relu": (lambda x: x.relu(), away(*S)),
  "relu6": (lambda x: x.relu6(), kinkfree(*S, kinks=(0, 6), low=-3, high=8)),
  "leaky_relu": (lambda x: x.leaky_relu(0.1), away(*S)),
  "elu": (lambda x: x.elu(0.7), away(*S)),
  "celu": (lambda x: x.celu(0.7), away(*S)),
  "selu": (lambda x: x.selu(), away(*S)),
  "gelu_tanh": (lambda x: x.gelu(), rand(*S, low=-3, high=3)),
  "gelu_erf": (lambda x: x.gelu(approximate="none"), rand(*S, low=-3, high=3)),
  "quick_gelu": (lambda x: x.quick_gelu(), rand(*S, low=-3, high=3)),
  "silu": (lambda x: x.silu(), rand(*S, low=-3, high=3)),
  "hardsigmoid": (lambda x: x.hardsigmoid(), kinkfree(*S, kinks=(-3, 3), low=-5, high=5)),
  "hardswish": (lambda x: x.hardswish(), kinkfree(*S, kinks=(-3, 3), low=-5, high=5)),
  "hardtanh": (lambda x: x.hardtanh(), kinkfree(*S, kinks=(-1, 1), low=-3, high=3)),
  "softplus": (lambda x: x.softplus(), rand(*S, low=-4, high=4)),
  "softplus_beta": (lambda x: x.softplus(beta=2.0), rand(*S, low=-4, high=4)),
  "mish": (lambda x: x.mish(), rand(*S, low=-3, high=3)),
  "softsign": (lambda x: x.softsign(), away(*S)),
  "clip": (lambda x: x.clip(-1.0, 1.0), kinkfree(*S, kinks=(-1, 1))),
  "clamp_min": (lambda x: x.clamp(min_=0.5), kinkfree(*S, kinks=(0.5,))),
  "clamp_max": (lambda x: x.clamp(max_=-0.5), kinkfree(*S, kinks=(-0.5,))),
  "pow_int": (lambda x: x ** 3 + x ** 0, rand(*S)),
  "pow_neg_int": (lambda x: x ** -2, away(*S)),
  "pow_half": (lambda x: x ** 0.5, pos()),
  "pow_float": (lambda x: x ** 2.5, pos()),
  "pow_neg_float": (lambda x: x ** -1.5, pos()),
  "rpow": (lambda x: 2.0 ** x, rand(*S)),
  "rdiv": (lambda x: 1.5 / x, away(*S)),
  "scalar_arith": (lambda x: (1.5 + x) * (1.5 - x) + 1.5 * x - x / 1.5 + (x - 1.5) * (2 - x), rand(*S)),
  "trunc_plus_x": (lambda x: x.trunc() + x, kinkfree(*S, kinks=(-2, -1, 0, 1, 2))),
  "floor_ceil_round": (lambda x: x.floor() * x + x.ceil() + x.round() * x, kinkfree(*S, kinks=(-2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2))),
  "sign_times_x": (lambda x: x.sign() * x * x, away(*S)),
  "cast_roundtrip": (lambda x: (x.cast(dtypes.float32).cast(dtypes.float64) * 0 + x).exp(), rand(*S)),
}


@functools.lru_cache(maxsize=None)
def _unary_results() -> dict:
  """All UNARY ops checked in one stacked graph (elementwise ops: full finite differences from two forwards)."""
  return dict(zip(UNARY, elementwise_batch_check([fn for fn, _ in UNARY.values()], [x for _, x in UNARY.values()])))


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name):
  an, fd = _unary_results()[name]
  np.testing.assert_allclose(an, fd, atol=1e-6, rtol=1e-5, err_msg=f"{name}: analytic gradient vs finite differences")
  assert np.abs(an).max() > 0, f"{name}: gradient is all zeros"


@pytest.mark.parametrize("name", ["tanh", "pow_float"])
def test_unary_directional(name):
  # a few unary ops on their own (not stacked), through the general directional check
  fn, x = UNARY[name]
  gradcheck(fn, x)


def test_batch_check_detects_a_wrong_gradient():
  # x * x.detach() has gradient x but derivative 2x: only that op's slot may be flagged
  (a1, f1), (a2, f2) = elementwise_batch_check([lambda x: x * x.detach(), lambda x: x * x], [rand(*S), rand(*S)])
  assert not np.allclose(a1, f1, atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(a2, f2, atol=1e-6, rtol=1e-5)


BINARY = {
  "add": (lambda a, b: a + b, rand(*S), rand(4, seed=1)),
  "sub": (lambda a, b: a - b, rand(*S), rand(4, seed=1)),
  "mul": (lambda a, b: a * b, rand(*S), rand(4, seed=1)),
  "div": (lambda a, b: a / b, rand(*S), away(4, seed=1)),
  "pow_tensor": (lambda a, b: a ** b, pos(), rand(4, seed=1)),
  "pow_tensor_rev": (lambda a, b: a.pow(b, reverse=True), rand(*S), pos(1)[0]),
  "maximum": (lambda a, b: a.maximum(b), rand(*S), rand(4, seed=1) + 0.01),
  "minimum": (lambda a, b: a.minimum(b), rand(*S), rand(4, seed=1) + 0.01),
  "clip_tensor_bounds": (lambda a, b: a.clip(b - 1, b + 1), rand(*S, low=-3, high=3), rand(4, seed=1) + 0.03),
  "add_col_broadcast": (lambda a, b: a + b, rand(*S), rand(3, 1, seed=1)),
  "mul_scalar_tensor": (lambda a, b: a * b, rand(*S), rand(seed=1)),
}


@functools.lru_cache(maxsize=None)
def _binary_results() -> dict:
  return batch_gradcheck({n: (fn, [a, b]) for n, (fn, a, b) in BINARY.items()})


@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name):
  assert_directional(name, _binary_results()[name])


def test_binary_alone():
  # one broadcasting binary op on its own graph too, through the general check
  fn, a, b = BINARY["div"]
  gradcheck(fn, a, b)


def test_where_grad_both_branches():
  cond = rand(*S, seed=5) > 0
  g = gradcheck(lambda a, b: Tensor(cond).where(a, b), rand(*S), rand(4, seed=1))
  assert (g[0][~cond] == 0).all() and (g[0][cond] != 0).all()


def test_where_scalar_branch():
  cond = rand(*S, seed=5) > 0
  gradcheck(lambda a: Tensor(cond).where(a * a, 2.0), rand(*S))


def test_lerp():
  gradcheck(lambda a, b, w: a.lerp(b, w), rand(*S), rand(*S, seed=1), rand(4, seed=2, low=0, high=1))
  gradcheck(lambda a, b: a.lerp(b, 0.3), rand(*S), rand(*S, seed=1))


def test_composite_chain():
  gradcheck(lambda a, b: ((a * b).exp() + a.sin() * b.cos()).log() / (b * b + 1), rand(*S, low=-0.5, high=0.5), rand(*S, seed=1))


def test_float32_grad_dtype_and_value():
  x = Tensor(np.array([0.5, -1.0, 2.0], dtype=np.float32), requires_grad=True)
  (g,) = (x.exp() * x).sum().gradient(x)
  assert g.dtype == dtypes.float32
  xv = np.array([0.5, -1.0, 2.0])
  np.testing.assert_allclose(g.numpy(), np.exp(xv) * (1 + xv), rtol=1e-5)


def test_int_input_promoted_op_gradient_wrt_float():
  # float tensor combined with int tensor: gradient only to the float side
  i = Tensor(np.array([[1, 2, 3, 4]] * 3, dtype=np.int32))
  gradcheck(lambda a: a * i + a.exp() / i, rand(*S))


# ***** self-check of the helper: full elementwise finite differences on tiny inputs *****
SMALL = {
  "exp_mul": (lambda x: x.exp() * x, rand(2, 3)),
  "div": (lambda x: 1.0 / (x * x + 1), rand(2, 3)),
  "softmax": (lambda x: x.softmax(), rand(2, 3)),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_helper_full_fd(name):
  fn, x = SMALL[name]
  r = np.random.default_rng(3).uniform(-1, 1, size=fn(Tensor(x)).shape)
  (an,) = analytic_grad(fn, [x], r)
  np.testing.assert_allclose(an, full_fd_grad(fn, [x], r), atol=1e-7, rtol=1e-6)


def test_helper_closed_form():
  # the helper against a derivative we know: d/dx sum(r * x^2 sin x) = r (2x sin x + x^2 cos x)
  x = rand(2, 3)
  r = np.random.default_rng(3).uniform(-1, 1, size=x.shape)
  (g,) = gradcheck(lambda t: t * t * t.sin(), x, r=r)
  np.testing.assert_allclose(g, r * (2 * x * np.sin(x) + x * x * np.cos(x)), rtol=1e-10)


def test_helper_detects_wrong_gradient():
  # a forward whose analytic gradient is deliberately wrong (detach hides a dependence) must fail the check
  with pytest.raises(AssertionError, match="finite difference"):
    gradcheck(lambda x: x * x.detach(), rand(*S))


def test_backward_matches_gradient():
  fn = lambda a, b: (a * b).sin() + b.exp()
  a, b = rand(*S), rand(4, seed=1)
  ga, gb = backward_grads(fn, a, b)
  np.testing.assert_allclose(ga, np.cos(a * b) * b, rtol=1e-12)
  np.testing.assert_allclose(gb, (np.cos(a * b) * a).sum(0) + 3 * np.exp(b), rtol=1e-12)


# ***** non-differentiable points (dedicated tie tests): the conventions of torch/tinygrad *****
def _grad_at(fn, vals) -> np.ndarray:
  x = Tensor(np.array(vals, dtype=np.float64), requires_grad=True)
  return fn(x).sum().gradient(x)[0].numpy()


def test_maximum_tie_splits():
  x = Tensor(np.array([1.0, 2.0, 3.0]))
  y = Tensor(np.array([1.0, 1.0, 4.0]))
  gx, gy = x.maximum(y).sum().gradient(x, y)
  np.testing.assert_array_equal(gx.numpy(), [0.5, 1, 0])
  np.testing.assert_array_equal(gy.numpy(), [0.5, 0, 1])


def test_minimum_tie_splits():
  x = Tensor(np.array([1.0, 2.0, 3.0]))
  y = Tensor(np.array([1.0, 1.0, 4.0]))
  gx, gy = x.minimum(y).sum().gradient(x, y)
  np.testing.assert_array_equal(gx.numpy(), [0.5, 0, 1])
  np.testing.assert_array_equal(gy.numpy(), [0.5, 1, 0])


def test_clip_at_bound_passes_gradient():
  # torch: clamp's gradient is 1 on [min, max] inclusive
  np.testing.assert_array_equal(_grad_at(lambda x: x.clip(-1.0, 1.0), [-2.0, -1.0, 0.0, 1.0, 2.0]), [0, 1, 1, 1, 0])


def test_relu_grad_at_zero():
  np.testing.assert_array_equal(_grad_at(lambda x: x.relu(), [-1.0, 0.0, 1.0]), [0, 0, 1])


def test_abs_grad_at_zero():
  np.testing.assert_array_equal(_grad_at(lambda x: x.abs(), [-1.0, 0.0, 1.0]), [-1, 0, 1])


def test_sqrt_at_zero_is_inf():
  assert math.isinf(_grad_at(lambda x: x.sqrt(), [0.0])[0])


# ***** pow's special cases (0 ** 0 = 1, 1 ** x = 1, ...) must not cut the gradient *****
def test_pow_float_exponent_grad_at_base_one():
  np.testing.assert_allclose(_grad_at(lambda x: x ** 1.5, [1.0, 4.0]), [1.5, 3.0])


def test_rpow_grad_at_exponent_zero():
  np.testing.assert_allclose(_grad_at(lambda x: 2.0 ** x, [0.0, 1.0]), np.log(2) * np.array([1.0, 2.0]))


def test_pow_tensor_exponent_grad_at_base_zero():
  e = Tensor(np.array([2.0, 2.5]))
  np.testing.assert_allclose(_grad_at(lambda x: x ** e, [0.0, 0.0]), [0.0, 0.0])


def test_pow_int_exponent_grad_at_zero_and_one():
  # the square-and-multiply path (Python int exponents) has no special cases
  np.testing.assert_allclose(_grad_at(lambda x: x ** 3, [0.0, 1.0, -2.0]), [0.0, 3.0, 12.0])


# ***** the where-NaN trap: a masked-off branch that is inf/nan at x must not poison the gradient (0 * inf = nan) *****
def test_grads_at_zero_are_finite():
  for name, fn, want in [("sinh", lambda x: x.sinh(), 1.0), ("tanh", lambda x: x.tanh(), 1.0), ("erf", lambda x: x.erf(), 2 / math.sqrt(math.pi)),
                         ("sigmoid", lambda x: x.sigmoid(), 0.25), ("softplus", lambda x: x.softplus(), 0.5), ("gelu", lambda x: x.gelu(), 0.5),
                         ("mish", lambda x: x.mish(), 0.6), ("tan", lambda x: x.tan(), 1.0), ("acos", lambda x: x.acos(), -1.0)]:
    np.testing.assert_allclose(_grad_at(fn, [0.0]), [want], rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("name", ["atan", "asin", "asinh", "atanh"])
def test_inverse_trig_hyperbolic_grad_at_zero(name):
  np.testing.assert_allclose(_grad_at(lambda x: getattr(x, name)(), [0.0]), [1.0])
