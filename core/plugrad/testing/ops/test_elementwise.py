"""Conformance: elementwise math (arithmetic, division/modulo/power, bitwise and logical ops, rounding, transcendentals,
comparisons, casts) against numpy, including broadcasting, 0-d and empty tensors, inf/nan edges and the error cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
from plugrad.testing.helpers import assert_close, check_op, rand_np, require_dtype

EDGES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-4, -1e-4, 3.0, -7.25, np.inf, -np.inf, np.nan], np.float32)


def _with_edges(low: float, high: float, n: int = 24) -> np.ndarray:
  return np.concatenate([rand_np((n,), dtypes.float32, low, high, seed=7), EDGES])


def _np_erf(x): return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


# name, numpy fn, input range (random part), rtol
UNARY = [
  ("exp", np.exp, -10, 10, 2e-6), ("exp2", np.exp2, -10, 10, 1e-6), ("log", np.log, 0, 100, 1e-6), ("log2", np.log2, 0, 100, 1e-6),
  ("sqrt", np.sqrt, 0, 100, 1e-6), ("rsqrt", lambda x: 1 / np.sqrt(x), 0.01, 100, 1e-6), ("reciprocal", np.reciprocal, -5, 5, 1e-6),
  ("sin", np.sin, -20, 20, 1e-6), ("cos", np.cos, -20, 20, 1e-6), ("tan", np.tan, -1.5, 1.5, 5e-6),
  ("asin", np.arcsin, -1, 1, 1e-6), ("acos", np.arccos, -1, 1, 1e-6), ("atan", np.arctan, -50, 50, 1e-6),
  ("sinh", np.sinh, -10, 10, 2e-6), ("cosh", np.cosh, -10, 10, 2e-6), ("tanh", np.tanh, -10, 10, 1e-6),
  ("asinh", np.arcsinh, -50, 50, 1e-6), ("acosh", np.arccosh, 1, 50, 1e-6), ("atanh", np.arctanh, -1, 1, 1e-6),
  ("erf", _np_erf, -4, 4, 1e-6), ("abs", np.abs, -5, 5, 0), ("sign", np.sign, -5, 5, 0), ("square", np.square, -5, 5, 1e-6),
  ("floor", np.floor, -5, 5, 0), ("ceil", np.ceil, -5, 5, 0), ("trunc", np.trunc, -5, 5, 0), ("round", np.round, -5, 5, 0),
  ("neg", np.negative, -5, 5, 0), ("isnan", np.isnan, -5, 5, 0), ("isinf", np.isinf, -5, 5, 0), ("isfinite", np.isfinite, -5, 5, 0),
]


@pytest.mark.parametrize("name,np_fn,low,high,rtol", UNARY, ids=[u[0] for u in UNARY])
def test_unary_float32(name, np_fn, low, high, rtol):
  """Random values in the op's usual domain plus the edges 0, -0, +-1, +-0.5, tiny, inf, -inf, nan (numpy's nan/inf too)."""
  x = _with_edges(low, high)
  with np.errstate(all="ignore"): want = np_fn(x)
  got = getattr(Tensor(x), name)().numpy()
  assert_close(got, want, atol=1e-6 if rtol else 0, rtol=rtol or 0, msg=name)


def test_unary_accuracy_dense():
  """Dense grids where the approximations are weakest: near the zeros and across the reduction boundaries."""
  x = np.concatenate([np.linspace(-1, 1, 201), np.linspace(-1e-3, 1e-3, 21)]).astype(np.float32)
  for name, fn in [("asin", np.arcsin), ("acos", np.arccos), ("atan", np.arctan), ("atanh", np.arctanh), ("tanh", np.tanh),
                   ("sinh", np.sinh), ("asinh", np.arcsinh), ("erf", _np_erf)]:
    with np.errstate(all="ignore"): want = fn(x)
    assert_close(getattr(Tensor(x), name)().numpy(), want, atol=1e-7, rtol=2e-6, msg=name)


def test_unary_large_arguments():
  x = np.array([100.0, -1000.0, 12345.6, 1e5, 3e18, -3e18, 1e30], np.float32)
  assert_close(Tensor(x).cos().numpy(), np.cos(x), atol=1e-6, rtol=0)
  assert_close(Tensor(x).sin().numpy(), np.sin(x), atol=1e-6, rtol=0)
  assert_close(Tensor(x).asinh().numpy(), np.arcsinh(x), rtol=1e-6)
  assert_close(Tensor(np.abs(x)).acosh().numpy(), np.arccosh(np.abs(x)), rtol=1e-6)
  assert_close(Tensor(x).tanh().numpy(), np.tanh(x))
  assert_close(Tensor(x).atan().numpy(), np.arctan(x))


def test_unary_int_and_bool_inputs():
  i = np.array([-3, -1, 0, 2, 7], np.int32)
  for name, fn in [("exp", np.exp), ("sqrt", np.sqrt), ("sin", np.sin), ("log2", np.log2)]:
    with np.errstate(all="ignore"): want = fn(i).astype(np.float32)
    assert_close(getattr(Tensor(i), name)().numpy(), want, msg=name)
  for name, fn in [("abs", np.abs), ("sign", np.sign), ("square", np.square), ("neg", np.negative)]:
    assert_close(getattr(Tensor(i), name)().numpy(), fn(i), msg=name)
  for name in ("floor", "ceil", "trunc", "round"): assert_close(getattr(Tensor(i), name)().numpy(), i)  # ints stay ints (torch)
  u = np.array([0, 1, 200, 255], np.uint8)
  assert_close(Tensor(u).abs().numpy(), u)
  assert_close((-Tensor(u)).numpy(), -u)
  b = np.array([True, False, True])
  assert_close(Tensor(b).abs().numpy(), b)
  assert_close(Tensor(b).isnan().numpy(), np.isnan(b))
  assert_close(Tensor(i).isinf().numpy(), np.isinf(i))
  assert_close(Tensor(i).isfinite().numpy(), np.isfinite(i))


def test_round_half_to_even():
  x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, -0.49999997, 2.5000002, 8388607.5, 1e30, -np.inf, np.nan], np.float32)
  assert_close(Tensor(x).round().numpy(), np.round(x))


def test_isinf_flags():
  x = EDGES
  assert_close(Tensor(x).isinf(detect_positive=False).numpy(), np.isneginf(x))
  assert_close(Tensor(x).isinf(detect_negative=False).numpy(), np.isposinf(x))
  assert_close(Tensor(x).isinf(False, False).numpy(), np.zeros(x.shape, bool))


def test_nan_to_num():
  assert_close(Tensor(EDGES).nan_to_num().numpy(), np.nan_to_num(EDGES))
  assert_close(Tensor(EDGES).nan_to_num(1.0, 2.0, -3.0).numpy(), np.nan_to_num(EDGES, nan=1.0, posinf=2.0, neginf=-3.0))


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)])
def test_unary_0d_and_empty(shape):
  x = rand_np(shape, dtypes.float32, 0.1, 2)
  for name, fn in [("exp", np.exp), ("sqrt", np.sqrt), ("cos", np.cos), ("erf", _np_erf), ("round", np.round), ("isnan", np.isnan)]:
    assert_close(getattr(Tensor(x), name)().numpy(), fn(x), msg=name)


# ***** binary arithmetic *****
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (3,)), ((0, 3), (1, 3))])
def test_binary_broadcasting(shapes):
  check_op(shapes, lambda a, b: a + b * a - b / (a * a + 1))
  check_op(shapes, lambda a, b: a.maximum(b), np.maximum)
  check_op(shapes, lambda a, b: a.minimum(b), np.minimum)
  check_op(shapes, lambda a, b: a.lerp(b, 0.25), lambda a, b: a + (b - a) * np.float32(0.25))


def test_minimum_nan_and_ints():
  a = np.array([1.0, np.nan, 3.0, -np.inf], np.float32)
  b = np.array([np.nan, 2.0, 1.0, 0.0], np.float32)
  assert_close(Tensor(a).minimum(Tensor(b)).numpy(), np.minimum(a, b))
  check_op([(3, 4), (4,)], lambda a, b: a.minimum(b), np.minimum, dtype=dtypes.int32, low=-100, high=100)
  check_op([(5,), (5,)], lambda a, b: a.minimum(b), np.minimum, dtype=dtypes.bool)
  assert_close(Tensor(np.array([0, 255], np.uint8)).minimum(3).numpy(), np.minimum(np.array([0, 255], np.uint8), 3))


def test_floordiv_mod_int():
  a = np.array([7, -7, 7, -7, 0, 5, -5, 6, -2147483648], np.int32)
  b = np.array([2, 2, -2, -2, 3, 5, 5, -3, -1], np.int32)
  with np.errstate(all="ignore"): want_div, want_mod = a // b, a % b  # INT_MIN // -1 wraps in numpy too
  assert_close((Tensor(a) // Tensor(b)).numpy(), want_div)
  assert_close((Tensor(a) % Tensor(b)).numpy(), want_mod)
  assert_close((Tensor(a) // 3).numpy(), a // 3)
  assert_close((Tensor(a) % -3).numpy(), a % -3)
  assert_close((10 // Tensor(b)).numpy(), 10 // b)
  assert_close((10 % Tensor(b)).numpy(), 10 % b)
  assert_close(Tensor(a).idiv(Tensor(b)).numpy(), np.trunc(a.astype(np.float64) / b).astype(np.int64).astype(np.int32))
  with np.errstate(all="ignore"):
    assert_close((Tensor(a) // 0).numpy(), a // 0)  # numpy: 0, no trap
    assert_close((Tensor(a) % 0).numpy(), a % 0)
  u = np.array([7, 200, 0], np.uint8)
  assert_close((Tensor(u) // Tensor(np.array([2, 7, 3], np.uint8))).numpy(), u // np.array([2, 7, 3], np.uint8))
  assert_close((Tensor(u) % 3).numpy(), u % np.uint8(3))


def test_floordiv_mod_float():
  a = _with_edges(-10, 10)[:-3]
  b = np.resize(np.array([2.0, -2.0, 0.75, -1.5, 3.0, -0.3], np.float32), a.shape)
  assert_close((Tensor(a) // Tensor(b)).numpy(), np.floor_divide(a, b))
  assert_close((Tensor(a) % Tensor(b)).numpy(), np.mod(a, b), atol=1e-5)
  with np.errstate(all="ignore"):
    z = np.array([1.0, -1.0, 0.0], np.float32)
    assert_close((Tensor(z) // 0.0).numpy(), z // np.float32(0.0))
  check_op([(3, 4), (4,)], lambda a, b: a // b, np.floor_divide, dtype=dtypes.int32, low=1, high=9)
  # a float scalar with an int tensor promotes to float, like torch
  assert_close((Tensor(np.array([7, -7], np.int32)) // 2.0).numpy(), np.array([3.0, -4.0], np.float32))


def test_pow():
  x = np.array([-3.0, -2.0, -0.5, 0.0, -0.0, 0.5, 1.0, 2.0, np.inf, -np.inf, np.nan], np.float32)
  with np.errstate(all="ignore"):
    for e in (0, 1, 2, 3, -1, -2, 0.5, 2.0, -1.5, 1 / 3):
      assert_close((Tensor(x) ** e).numpy(), x ** np.float32(e), rtol=2e-6, msg=f"x ** {e}")
    ex = np.array([2.0, 3.0, 0.5, 0.0, -1.0, 2.5, np.nan, 0.0, 2.0, 3.0, 0.0], np.float32)
    assert_close((Tensor(x) ** Tensor(ex)).numpy(), x ** ex, rtol=2e-6)
    y = np.array([-3.0, -1.0, 1.0, 0.5, 2.0], np.float32)
    ey = np.array([-3.0, np.inf, np.nan, -np.inf, 0.1], np.float32)
    assert_close((Tensor(y) ** Tensor(ey)).numpy(), y ** ey, rtol=2e-6)
    assert_close((2 ** Tensor(x)).numpy(), np.float32(2) ** x, rtol=2e-6)
  check_op([(3, 4), (4,)], lambda a, b: a ** b, np.power, low=0.1, high=3, rtol=5e-6)


def test_pow_int():
  i = np.array([-3, -2, -1, 0, 1, 2, 3, 7], np.int32)
  for e in (0, 1, 2, 3, 5, 11):
    assert_close((Tensor(i) ** e).numpy(), i ** e, msg=f"x ** {e}")
  e = np.array([0, 3, 5, 2, 31, 10, 4, 11], np.int32)
  assert_close((Tensor(i) ** Tensor(e)).numpy(), i ** e)
  assert_close((Tensor(np.array([2, 3], np.int64)) ** 40).numpy(), np.array([2, 3], np.int64) ** 40)
  assert_close((2 ** Tensor(np.array([0, 1, 10], np.int32))).numpy(), 2 ** np.array([0, 1, 10], np.int32))
  neg = Tensor(np.array([2, 1, -1, -1, 0], np.int32)) ** Tensor(np.array([-1, -5, -3, -2, 2], np.int32))
  assert_close(neg.numpy(), np.array([0, 1, -1, 1, 0], np.int32))  # torch's truncation for negative int exponents
  assert (Tensor(i) ** 0.5).dtype == dtypes.float32
  with pytest.raises(ValueError, match="negative"): Tensor(i) ** -1


# ***** comparisons *****
def test_comparisons():
  a = np.array([1.0, 2.0, np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
  b = np.array([2.0, 2.0, 1.0, np.inf, 0.0, -0.0, np.nan], np.float32)
  ta, tb = Tensor(a), Tensor(b)
  for op in ("__lt__", "__gt__", "__eq__", "__ne__"):
    assert_close(getattr(ta, op)(tb).numpy(), getattr(a, op)(b), msg=op)
  check_op([(3, 1), (1, 4)], lambda x, y: x < y, dtype=dtypes.int32, low=-3, high=3)
  check_op([(3, 4), ()], lambda x, y: x == y, dtype=dtypes.int32, low=-3, high=3)
  assert_close((Tensor(np.array([1, 2, 3], np.int32)) != 2.5).numpy(), np.array([1, 2, 3]) != 2.5)


def test_comparisons_nan_ge_le():
  a, b = np.array([np.nan, 1.0, 2.0], np.float32), np.array([1.0, np.nan, 2.0], np.float32)
  assert_close((Tensor(a) >= Tensor(b)).numpy(), a >= b)
  assert_close((Tensor(a) <= Tensor(b)).numpy(), a <= b)


def test_comparisons_ge_le():
  check_op([(3, 4), (4,)], lambda x, y: x >= y, low=-2, high=2)
  check_op([(3, 4), (3, 1)], lambda x, y: x <= y, dtype=dtypes.int32, low=-2, high=2)


# ***** logical and bitwise *****
def test_logical():
  a, b = rand_np((4, 5), dtypes.bool, seed=1), rand_np((5,), dtypes.bool, seed=2)
  ta, tb = Tensor(a), Tensor(b)
  assert_close(ta.logical_and(tb).numpy(), np.logical_and(a, b))
  assert_close(ta.logical_or(tb).numpy(), np.logical_or(a, b))
  assert_close(ta.logical_xor(tb).numpy(), np.logical_xor(a, b))
  assert_close(ta.logical_not().numpy(), np.logical_not(a))
  f = np.array([0.0, 1.5, -2.0, np.nan], np.float32)
  assert_close(Tensor(f).logical_and(Tensor(np.array([1, 1, 0, 1], np.int32))).numpy(), np.logical_and(f, [1, 1, 0, 1]))
  assert_close(Tensor(f).logical_not().numpy(), np.logical_not(f))


@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.uint8, dtypes.int8, dtypes.bool])
def test_bitwise(dt):
  a, b = rand_np((3, 4), dt, -100, 100, seed=1), rand_np((4,), dt, -100, 100, seed=2)
  if dtypes.is_unsigned(dt): a, b = rand_np((3, 4), dt, 0, 255, seed=1), rand_np((4,), dt, 0, 255, seed=2)
  ta, tb = Tensor(a), Tensor(b)
  assert_close((ta & tb).numpy(), a & b)
  assert_close((ta | tb).numpy(), a | b)
  assert_close((ta ^ tb).numpy(), a ^ b)
  assert_close((~ta).numpy(), ~a)
  assert_close(ta.bitwise_xor(tb).numpy(), np.bitwise_xor(a, b))
  if dt != dtypes.bool:
    assert_close((ta & 5).numpy(), a & np.array(5, a.dtype))
    assert_close((6 | ta).numpy(), np.array(6, a.dtype) | a)


def test_shifts():
  a = np.array([1, -1, 5, -8, 1 << 20, 3, 7, -7], np.int32)
  s = np.array([0, 1, 3, 2, 10, 31, 32, 40], np.int32)
  assert_close((Tensor(a) << Tensor(s)).numpy(), np.where(s < 32, a << np.minimum(s, 31), 0).astype(np.int32))
  assert_close((Tensor(a) >> Tensor(s)).numpy(), np.where(s < 32, a >> np.minimum(s, 31), np.where(a < 0, -1, 0)).astype(np.int32))
  assert_close((Tensor(a) << 2).numpy(), a << 2)
  assert_close((Tensor(a) >> 1).numpy(), a >> 1)
  assert_close(Tensor(a).lshift(3).numpy(), a << 3)
  assert_close((1 << Tensor(np.array([0, 4, 9], np.int32))).numpy(), 1 << np.array([0, 4, 9], np.int32))
  u = np.array([255, 128, 1], np.uint8)
  assert_close((Tensor(u) >> 3).numpy(), u >> 3)
  assert_close((Tensor(u) << 1).numpy(), u << np.uint8(1))


def test_bitwise_errors():
  f = Tensor([1.0, 2.0])
  for fn in (lambda: f & f, lambda: f | 1, lambda: f ^ f, lambda: ~f, lambda: f << 1, lambda: f >> 1, lambda: f.idiv(2)):
    with pytest.raises(TypeError, match="integer"): fn()


# ***** where, clip *****
def test_where_and_clip():
  c, a, b = rand_np((3, 1), dtypes.bool), rand_np((1, 4), seed=1), rand_np((3, 4), seed=2)
  assert_close(Tensor(c).where(Tensor(a), Tensor(b)).numpy(), np.where(c, a, b))
  assert_close(Tensor(c).where(Tensor(a), 0.5).numpy(), np.where(c, a, np.float32(0.5)))
  x = _with_edges(-5, 5)
  assert_close(Tensor(x).clip(-1, 2).numpy(), np.clip(x, -1, 2))
  assert_close(Tensor(x).clamp(min_=0.5).numpy(), np.clip(x, 0.5, None))
  assert_close(Tensor(x).clip(max_=-1).numpy(), np.clip(x, None, -1))
  lo, hi = rand_np((4,), seed=3) - 1, rand_np((4,), seed=4) + 1
  assert_close(Tensor(b).clip(Tensor(lo), Tensor(hi)).numpy(), np.clip(b, lo, hi))
  i = np.arange(-5, 5, dtype=np.int32)
  assert_close(Tensor(i).clip(-2, 3).numpy(), np.clip(i, -2, 3))
  with pytest.raises(ValueError, match="min_"): Tensor(x).clip()


def test_broadcast_error():
  with pytest.raises(ValueError, match="broadcast"): Tensor.ones(3, 4) // Tensor.ones(3)
  with pytest.raises(ValueError, match="broadcast"): Tensor.ones(2, 3).pow(Tensor.ones(4))
  with pytest.raises(ValueError, match="broadcast"): Tensor.ones(2).minimum(Tensor.ones(3))


# ***** casts and bitcasts *****
def test_cast_methods():
  x = np.array([-2.7, -0.5, 0.0, 1.5, 3.9, 200.2], np.float32)
  t = Tensor(x)
  assert_close(t.int().numpy(), x.astype(np.int32))
  assert_close(t.long().numpy(), x.astype(np.int64))
  assert_close(t.bool().numpy(), x.astype(bool))
  assert_close(t.double().numpy(), x.astype(np.float64))
  assert_close(t.int().float().numpy(), x.astype(np.int32).astype(np.float32))
  assert t.half().dtype == dtypes.float16 and t.short().dtype == dtypes.int16
  assert_close(Tensor(np.array([True, False])).float().numpy(), np.array([1.0, 0.0], np.float32))


def test_bitcast_same_size():
  x = EDGES
  assert_close(Tensor(x).bitcast(dtypes.int32).numpy(), x.view(np.int32))
  assert_close(Tensor(x).bitcast(dtypes.uint32).numpy(), x.view(np.uint32))
  i = x.view(np.int32)
  assert_close(Tensor(i).bitcast(dtypes.float32).numpy(), x)
  assert_close((Tensor(i) + 0).bitcast(dtypes.uint32).numpy(), x.view(np.uint32))


def test_bitcast_half():
  require_dtype(dtypes.float16)  # skips only where the renderer says it has no float16 (NotImplementedError)
  h = np.array([1.0, -2.0, 0.5, np.inf], np.float16)
  assert_close(Tensor(h).bitcast(dtypes.int16).numpy(), h.view(np.int16))
  assert_close(Tensor(h.view(np.int16)).bitcast(dtypes.float16).numpy(), h)
