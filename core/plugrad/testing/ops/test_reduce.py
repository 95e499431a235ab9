"""Conformance: reductions (sum, prod, max, min, mean, var, std, any, all, logsumexp, argmax, argmin) and cumulative ops
(cumsum, cumprod, cummax, cummin, logcumsumexp) against numpy: axis forms, keepdim, dtypes, 0-d/empty inputs, errors,
long axes, and a hypothesis fuzz of random elementwise/reduce chains."""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
from plugrad.testing.helpers import assert_close, check_op, rand_np

# every op over a few axis forms (None, int, negative, tuple) with and without keepdim; kept small: each is a compiled kernel
CASES = [(None, False), (0, True), (-1, False), ((0, 2), True), ((-1, 0, 1), False), ((1,), False)]


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean", "prod", "var", "std", "logsumexp"])
def test_float_reductions(op):
  x = rand_np((2, 3, 4), seed=1)
  t = Tensor(x)
  np_fn = {"var": lambda a, **k: np.var(a, ddof=1, **k), "std": lambda a, **k: np.std(a, ddof=1, **k),
           "logsumexp": lambda a, **k: np.log(np.exp(a.astype(np.float64)).sum(**k)).astype(np.float32)}.get(op) or getattr(np, op)
  for axis, keepdim in CASES[:4] if op in ("var", "std", "logsumexp") else CASES:
    assert_close(getattr(t, op)(axis, keepdim).numpy(), np_fn(x, axis=axis, keepdims=keepdim), msg=f"{op} {axis} {keepdim}")


def test_int_reductions():
  x = rand_np((3, 5), dtypes.int32, -50, 50, seed=3)
  t = Tensor(x)
  for name in ("max", "min", "any", "all", "argmax", "argmin", "sum", "mean"):
    for axis in (None, 1):
      want = getattr(x, name)(axis)
      want = want.astype(np.int32) if name in ("argmax", "argmin", "sum") else want.astype(np.float32) if name == "mean" else want
      assert_close(getattr(t, name)(axis).numpy(), want, msg=f"{name} {axis}")


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.bool])
def test_small_int_bool_reductions(dt):
  x = rand_np((3, 5), dt, -128, 127, seed=3) if not dtypes.is_unsigned(dt) else rand_np((3, 5), dt, 0, 255, seed=3)
  t = Tensor(x)
  assert_close(t.max(1).numpy(), x.max(1))
  assert_close(t.min(0).numpy(), x.min(0))
  assert_close(t.argmin(1).numpy(), x.argmin(1).astype(np.int32))
  # sum accumulates in sum_acc_dtype: signed/bool -> int32, unsigned -> uint32 (numpy: int64/uint64)
  assert_close(t.sum().numpy(), x.sum().astype(np.uint32 if dtypes.is_unsigned(dt) else np.int32))
  if dt == dtypes.bool:
    assert_close(t.any(1).numpy(), x.any(1))
    assert_close(t.all(0).numpy(), x.all(0))


def test_sum_dtype_arg_and_wrap():
  x = np.array([100, 100, 100], np.int8)
  assert_close(Tensor(x).sum().numpy(), np.int32(300))
  assert_close(Tensor(x).sum(dtype=dtypes.int8).numpy(), x.sum(dtype=np.int8))
  assert_close(Tensor(x).prod().numpy(), x.prod(dtype=np.int8))  # prod keeps the input dtype (wraps)
  assert Tensor(np.ones(3, np.float32)).sum(dtype="float64").dtype == dtypes.float64


def test_var_correction_and_means():
  x = rand_np((4, 6), seed=5)
  t = Tensor(x)
  for c in (0, 1, 2):
    assert_close(t.var(1, correction=c).numpy(), np.var(x, axis=1, ddof=c), msg=f"var c={c}")
    assert_close(t.std(0, keepdim=True, correction=c).numpy(), np.std(x, axis=0, ddof=c, keepdims=True), msg=f"std c={c}")
  v, m = t.var_mean(1)
  assert_close(v.numpy(), np.var(x, axis=1, ddof=1))
  assert_close(m.numpy(), x.mean(1))
  s, m = t.std_mean(None, correction=0)
  assert_close(s.numpy(), np.std(x))
  assert_close(m.numpy(), x.mean())
  assert_close(Tensor(x[:, :1]).var(1).numpy(), np.full(4, np.nan, np.float32))  # n - correction == 0 -> nan, like numpy
  assert_close(Tensor(np.array([1, 2, 4], np.int32)).var().numpy(), np.float32(np.var([1, 2, 4], ddof=1)))


def test_logsumexp_stability():
  x = np.array([[1000.0, 1000.0, -1000.0], [-1e30, -np.inf, -1e30], [-np.inf, -np.inf, -np.inf], [np.inf, 1.0, 2.0]], np.float32)
  want = np.array([1000 + np.log(2), -1e30 + np.log(2), -np.inf, np.inf], np.float32)
  assert_close(Tensor(x).logsumexp(1).numpy(), want)
  assert_close(Tensor(x).logsumexp(1, keepdim=True).numpy(), want[:, None])


def test_argmax_ties_and_nan():
  x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -5, -5, -1]], np.float32)
  t = Tensor(x)
  for axis in (None, 0, 1, -1):
    assert_close(t.argmax(axis).numpy(), np.argmax(x, axis).astype(np.int32))
    assert_close(t.argmin(axis).numpy(), np.argmin(x, axis).astype(np.int32))
  assert_close(t.argmax(1, keepdim=True).numpy(), np.argmax(x, 1, keepdims=True).astype(np.int32))
  assert_close(t.argmax(keepdim=True).numpy(), np.argmax(x, keepdims=True).astype(np.int32))
  n = np.array([[1, np.nan, 5, np.nan], [np.inf, 2, -np.inf, 1]], np.float32)
  assert_close(Tensor(n).argmax(1).numpy(), np.argmax(n, 1).astype(np.int32))
  assert_close(Tensor(n).argmin(1).numpy(), np.argmin(n, 1).astype(np.int32))
  assert_close(Tensor(np.array(3.0, np.float32)).argmax().numpy(), np.int32(0))
  big = rand_np((3000,), seed=9)
  assert_close(Tensor(big).argmax().numpy(), np.int32(big.argmax()))


def test_0d_reductions():
  x = np.array(2.5, np.float32)
  t = Tensor(x)
  for name in ("sum", "max", "min", "mean", "prod"): assert_close(getattr(t, name)().numpy(), getattr(np, name)(x), msg=name)
  for name in ("mean", "min", "var"): assert getattr(t, name)(0).shape == ()  # axis 0/-1 of a 0-d tensor is allowed (torch)
  assert_close(t.mean(-1).numpy(), x)
  assert_close(t.argmax(0).numpy(), np.int32(0))
  assert_close(t.logsumexp().numpy(), x)
  assert_close(t.any().numpy(), np.bool_(True))
  assert_close(t.cumsum().numpy(), x)


def test_empty_reductions():
  x = np.zeros((0, 3), np.float32)
  t = Tensor(x)
  assert_close(t.sum(0).numpy(), x.sum(0))
  assert_close(t.sum().numpy(), x.sum())
  assert_close(t.prod(0).numpy(), x.prod(0))
  assert_close(t.sum(1).numpy(), x.sum(1))
  assert_close(t.max(1).numpy(), x.max(1))  # reducing a non-empty axis of an empty tensor is fine
  assert_close(t.any(0).numpy(), x.any(0))
  assert_close(t.all(0, keepdim=True).numpy(), x.all(0, keepdims=True))
  assert_close(t.logsumexp(0).numpy(), np.full(3, -np.inf, np.float32))
  assert_close(t.mean(0).numpy(), np.full(3, np.nan, np.float32))
  for fn in (lambda: t.max(0), lambda: t.min(), lambda: t.max()):
    with pytest.raises(RuntimeError, match="empty"): fn()
  for fn in (lambda: t.argmax(0), lambda: t.argmin(), lambda: t.argmax()):
    with pytest.raises(ValueError, match="empty"): fn()
  for name in ("cumsum", "cumprod", "logcumsumexp"):
    assert getattr(t, name)(0).shape == (0, 3) and getattr(t, name)(1).numpy().shape == (0, 3)
  assert t.cummax(0)[0].shape == (0, 3) and t.cummax(1)[1].numpy().shape == (0, 3)


def test_axis_errors():
  t = Tensor.ones(2, 3)
  for fn in (lambda: t.sum(2), lambda: t.mean(-3), lambda: t.var((0, 5)), lambda: t.argmax(2), lambda: t.cumsum(3), lambda: t.min(2)):
    with pytest.raises(IndexError, match="out of range"): fn()
  with pytest.raises(ValueError, match="duplicate"): t.mean((0, 0))
  with pytest.raises(ValueError, match="duplicate"): t.var((1, -1))
  with pytest.raises(TypeError): t.cumsum(0.5)


# ***** cumulative ops *****
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5), 1), ((2, 3, 4), -2), ((1,), 0), ((2, 600), 1)])
def test_cumulative(shape, axis):
  x = rand_np(shape, low=0.5, high=1.5, seed=2)
  t = Tensor(x)
  assert_close(t.cumsum(axis).numpy(), np.cumsum(x, axis), atol=1e-4, rtol=1e-5)
  assert_close(t.cumprod(axis).numpy(), np.cumprod(x, axis, dtype=np.float64).astype(np.float32), atol=1e-6, rtol=1e-4)
  assert_close(t.cummax(axis)[0].numpy(), np.maximum.accumulate(x, axis))
  assert_close(t.cummin(axis)[0].numpy(), np.minimum.accumulate(x, axis))
  assert_close(t.logcumsumexp(axis).numpy(), np.logaddexp.accumulate(x.astype(np.float64), axis).astype(np.float32), rtol=1e-5)


def test_cumulative_ints_and_edges():
  i = rand_np((4, 6), dtypes.int32, -9, 9, seed=4)
  assert_close(Tensor(i).cumsum(1).numpy(), i.cumsum(1).astype(np.int32))
  assert_close(Tensor(i).cumprod(0).numpy(), i.cumprod(0).astype(np.int32))
  assert_close(Tensor(i).cummax(1)[0].numpy(), np.maximum.accumulate(i, 1))
  assert_close(Tensor(i).cummin(0)[0].numpy(), np.minimum.accumulate(i, 0))
  b = rand_np((9,), dtypes.bool, seed=5)
  assert_close(Tensor(b).cumsum().numpy(), b.cumsum().astype(np.int32))
  assert_close(Tensor(b).cummax()[0].numpy(), np.maximum.accumulate(b))
  x = np.array([-1000.0, 0.0, -np.inf, 1000.0, -1000.0], np.float32)
  with np.errstate(all="ignore"): assert_close(Tensor(x).logcumsumexp().numpy(), np.logaddexp.accumulate(x))
  y = np.array([1.0, np.inf, 2.0, -np.inf], np.float32)
  with np.errstate(all="ignore"): assert_close(Tensor(y).cumsum().numpy(), np.cumsum(y))
  assert_close(Tensor(y).cummax()[0].numpy(), np.maximum.accumulate(y))


def test_cumsum_long_axis_fast():
  x = rand_np((100_000,), dtypes.int32, -5, 5, seed=6)
  t0 = time.perf_counter()
  got = Tensor(x).cumsum().numpy()
  assert time.perf_counter() - t0 < 5.0  # well under a second once compiled; the bound leaves room for a cold compiler
  assert_close(got, np.cumsum(x).astype(np.int32))
  f = rand_np((70_000,), seed=7)
  assert_close(Tensor(f).cumsum().numpy(), np.cumsum(f.astype(np.float64)).astype(np.float32), atol=1e-3, rtol=1e-5)


def test_reduce_broadcast_chain():
  check_op([(3, 1), (1, 4)], lambda a, b: (a * b).sum(1) + (a - b).max(0).mean(), lambda a, b: (a * b).sum(1) + (a - b).max(0).mean())
  check_op([(2, 3, 4)], lambda a: (a - a.mean(-1, keepdim=True)).square().sum((0, 2)),
           lambda a: np.square(a - a.mean(-1, keepdims=True)).sum((0, 2)))


# ***** fuzz: random chains of elementwise and reduce ops *****
_UNARY = [("exp", lambda a: np.exp(np.clip(a, -5, 5)), lambda t: t.clip(-5, 5).exp()), ("abs", np.abs, lambda t: t.abs()),
          ("tanh", np.tanh, lambda t: t.tanh()), ("sin", np.sin, lambda t: t.sin()),
          ("sqrt_abs", lambda a: np.sqrt(np.abs(a)), lambda t: t.abs().sqrt()),
          ("floor", np.floor, lambda t: t.floor()), ("atan", np.arctan, lambda t: t.atan()), ("square", np.square, lambda t: t.square()),
          ("erf", lambda a: np.vectorize(__import__("math").erf, otypes=[np.float32])(a), lambda t: t.erf())]
_REDUCE = ["sum", "max", "min", "mean", "logsumexp", "cumsum", "cummax", "argmax"]


def _fuzz_step(draw, t, a):
  kind = draw(st.sampled_from(["unary", "binary", "reduce"]))
  if kind == "unary":
    _, nf, tf = draw(st.sampled_from(_UNARY))
    return tf(t), nf(a).astype(np.float32)
  if kind == "binary":
    c = np.float32(draw(st.sampled_from([0.5, -1.25, 2.0])))
    op = draw(st.sampled_from(["add", "mul", "sub", "maximum", "minimum", "rsub"]))
    tfn = {"add": lambda: t + float(c), "mul": lambda: t * float(c), "sub": lambda: t - t.max(), "maximum": lambda: t.maximum(float(c)),
           "minimum": lambda: t.minimum(float(c)), "rsub": lambda: float(c) - t}[op]
    nfn = {"add": lambda: a + c, "mul": lambda: a * c, "sub": lambda: a - a.max(), "maximum": lambda: np.maximum(a, c),
           "minimum": lambda: np.minimum(a, c), "rsub": lambda: c - a}[op]
    return tfn(), nfn().astype(np.float32)
  if a.ndim == 0: return t, a
  name = draw(st.sampled_from(_REDUCE))
  ax = draw(st.integers(-a.ndim, a.ndim - 1))
  keep = draw(st.booleans())
  if name == "cumsum": return t.cumsum(ax), np.cumsum(a, ax)
  if name == "cummax": return t.cummax(ax)[0], np.maximum.accumulate(a, ax)
  if name == "argmax": return t.argmax(ax, keep).float(), np.argmax(a, ax, keepdims=keep).astype(np.float32)
  if name == "logsumexp":
    return t.logsumexp(ax, keep), np.log(np.exp(a.astype(np.float64)).sum(ax, keepdims=keep)).astype(np.float32)
  return getattr(t, name)(ax, keep), getattr(np, name)(a, axis=ax, keepdims=keep).astype(np.float32)


@st.composite
def _chains(draw):
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
  a = rand_np(shape, seed=draw(st.integers(0, 50)))
  t = Tensor(a)
  for _ in range(draw(st.integers(1, 4))):
    t, a = _fuzz_step(draw, t, a)
  return t, a


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(_chains())
def test_fuzz_elementwise_reduce_chains(chain):
  t, a = chain
  got = t.numpy()
  assert_close(got, np.asarray(a, np.float32), atol=1e-4, rtol=1e-4, check_dtype=False)
