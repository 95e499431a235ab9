"""Gradient edge cases against PyTorch (CPU): unused and folded-away inputs get zeros, no nan at extreme inputs,
values outside a function's domain, pow's special cases, stacked max, float16 matmul accumulation."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

torch = pytest.importorskip("torch")  # a test extra (core/pyproject.toml)
F = torch.nn.functional


def _grad(fn, vals, tfn=None):
  x = Tensor(np.asarray(vals, np.float32))
  (g,) = fn(x).sum().gradient(x)
  tx = torch.tensor(np.asarray(vals, np.float32), requires_grad=True)
  (tfn or fn)(tx).sum().backward()
  return g.numpy(), tx.grad.numpy()


def test_unused_and_folded_inputs_get_zeros():
  x, y = Tensor([1.0, 2.0]), Tensor([3.0])
  assert (x * 2).sum().gradient(y)[0].tolist() == [0.0]
  assert (x ** 0).sum().gradient(x)[0].tolist() == [0.0, 0.0]
  z = Tensor.ones(0, 3)
  assert z.sum().gradient(z)[0].shape == (0, 3)
  assert (x[2:2].sum() + y.sum()).gradient(x)[0].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("name,fn,tfn,vals", [
  ("sigmoid", lambda x: x.sigmoid(), torch.sigmoid, [-1000.0, 1000.0, -80.0, 0.0, float("inf"), -float("inf")]),
  ("gelu", lambda x: x.gelu(), lambda x: F.gelu(x, approximate="tanh"), [-1000.0, 1000.0, -50.0, 3.0]),
  ("gelu_erf", lambda x: x.gelu(approximate="none"), F.gelu, [-1000.0, 1000.0, -50.0, 3.0]),
  ("quick_gelu", lambda x: x.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x), [-1000.0, 1000.0, -60.0]),
  ("silu", lambda x: x.silu(), F.silu, [-1000.0, 1000.0]),
  ("tanh", lambda x: x.tanh(), torch.tanh, [-1e30, 1e30, -50.0]),
  ("acosh", lambda x: x.acosh(), torch.acosh, [0.5, -2.0, 1.5, 1.0]),
  ("atanh", lambda x: x.atanh(), torch.atanh, [1.5, -1.5, 1.0, -1.0, 0.5, 1e-3]),
  ("pow_neg_frac", lambda x: x ** 0.3, None, [-2.0, -0.5, 2.0, float("-inf"), float("inf")]),
  ("pow_zero_exp", lambda x: x ** 0, None, [float("inf"), -float("inf"), 0.0, 2.0]),
  ("pow_tensor_zero", lambda x: x ** Tensor([0.0, 0.0, 0.0]), lambda x: x ** torch.tensor([0.0, 0.0, 0.0]), [float("inf"), -float("inf"), 2.0]),
  # e * b**(e-1) is inf at a zero base for 0 < e < 1 (both zeros) and at +inf for e > 1; finite elsewhere
  ("pow_zero_base_frac", lambda x: x ** 0.3, None, [0.0, -0.0, 1.0, 0.5]),
  ("pow_zero_base_frac_tensor", lambda x: x ** Tensor([0.3, 0.7, 0.3, 1.5, 2.5]), lambda x: x ** torch.tensor([0.3, 0.7, 0.3, 1.5, 2.5]),
   [0.0, -0.0, 4.0, 0.0, 0.0]),
  ("pow_inf_base_big_exp", lambda x: x ** 2.5, None, [float("inf"), 2.0, 0.0]),
  ("pow_inf_base_tensor", lambda x: x ** Tensor([1.5, 3.5, 0.5, 0.7]), lambda x: x ** torch.tensor([1.5, 3.5, 0.5, 0.7]),
   [float("inf"), float("inf"), float("inf"), 3.0]),
])
def test_extreme_gradients_match_torch(name, fn, tfn, vals):
  got, want = _grad(fn, vals, tfn)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=name)


def test_stack_max_gradient_is_one_not_reciprocal():
  x, y = Tensor([3.0, 1.0], requires_grad=True), Tensor([1.0, 2.0], requires_grad=True)
  Tensor.stack(x, y).max(0).sum().backward()
  assert x.grad.tolist() == [1.0, 0.0] and y.grad.tolist() == [0.0, 1.0]


def test_float16_matmul_backward_accumulates_in_float32():
  r = np.random.default_rng(0)
  a, b = r.uniform(-1, 1, (64, 64)).astype(np.float16), r.uniform(-1, 1, (64, 64)).astype(np.float16)
  ta, tb = Tensor(a), Tensor(b)
  ga, gb = (ta @ tb).sum().gradient(ta, tb)
  assert ga.dtype == dtypes.float16
  ones = np.ones((64, 64), np.float32)
  want_a, want_b = (ones @ b.astype(np.float32).T).astype(np.float16), (a.astype(np.float32).T @ ones).astype(np.float16)
  np.testing.assert_array_equal(ga.numpy(), want_a)  # one rounding of the float32 sum: bit-exact
  np.testing.assert_array_equal(gb.numpy(), want_b)


_POW_BASES = [0.0, -0.0, float("inf"), -float("inf"), 2.0, -2.0, 1.0, -1.0, 0.5, float("nan")]
_POW_EXPS = [0.0, 1.0, 2.0, 3.0, 4.0, 2.5, 1.5, 0.5, 0.3, -1.0, -2.0, -0.5, -1.5, float("inf"), -float("inf")]


def test_pow_gradients_on_the_special_value_grid_match_torch():
  """Every (base, exponent) pair of special values with a tensor exponent: both gradients equal torch's. Before the
  CUSTOM_GRAD rule: 0**1 gave 0 (torch 1), -inf**e for e > 1 gave 0 (torch +-inf by e's parity), 0**e for e < 0 gave 0
  (torch -+inf), and the exponent gradient of negative bases was finite (torch nan: log of a negative base)."""
  bv = np.array([b for b in _POW_BASES for _ in _POW_EXPS], np.float32)
  ev = np.array([e for _ in _POW_BASES for e in _POW_EXPS], np.float32)
  b, e = Tensor(bv), Tensor(ev)
  gb, ge = (b ** e).sum().gradient(b, e)
  tb, te = torch.tensor(bv, requires_grad=True), torch.tensor(ev, requires_grad=True)
  (tb ** te).sum().backward()
  for name, got, want in (("d/dbase", gb, tb.grad), ("d/dexp", ge, te.grad)):
    bad = [(float(x), float(y), float(g), float(w)) for x, y, g, w in zip(bv, ev, got.numpy(), want.numpy())
           if not (g == w or (np.isnan(g) and np.isnan(w)) or (np.isfinite(w) and abs(g - w) <= 1e-5 * abs(w)))]
    assert not bad, f"{name} (base, exp, ours, torch): {bad}"


@pytest.mark.parametrize("e", _POW_EXPS)
def test_pow_python_exponent_gradients_match_torch(e):
  got, want = _grad(lambda x: x ** e, _POW_BASES)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=0, equal_nan=True, err_msg=f"x ** {e}")


def test_pow_second_order_and_reverse():
  x = Tensor([0.5, 2.0, 3.0])
  (g,) = (x ** 3.0).sum().gradient(x)
  (gg,) = g.sum().gradient(x)  # d2/dx2 x**3 = 6x: the gradient graph is differentiable
  np.testing.assert_allclose(gg.numpy(), [3.0, 12.0, 18.0], rtol=1e-5)
  (ge,) = (2.0 ** x).sum().gradient(x)  # a Python base: only the exponent's gradient, 2**x * ln 2
  np.testing.assert_allclose(ge.numpy(), 2.0 ** np.array([0.5, 2.0, 3.0]) * np.log(2), rtol=1e-5)
