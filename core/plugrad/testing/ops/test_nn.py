"""Conformance tests for linear algebra and nn functional ops (matmul/einsum, activations, norms, conv, pools, attention,
losses, interpolate) against numpy reference implementations written here with explicit loops on small shapes."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
from plugrad.testing.helpers import assert_close, check_op, rand_np, require_dtype

erf_np = np.vectorize(math.erf, otypes=[np.float64])




def T(a) -> Tensor: return Tensor(np.asarray(a))
def f32(a) -> np.ndarray: return np.asarray(a, dtype=np.float32)


# ***** matmul / dot / einsum *****
@pytest.mark.parametrize("sa,sb", [((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)),
                                   ((2, 1, 3, 4), (3, 4, 2)), ((1, 3, 4), (2, 4, 5)), ((1, 1), (1, 1))])
def test_matmul_shapes(sa, sb):
  check_op([sa, sb], lambda a, b: a @ b)
  check_op([sa, sb], lambda a, b: a.dot(b), lambda a, b: np.matmul(a, b))


def test_matmul_one_kernel():
  a, b = T(rand_np((3, 4))), T(rand_np((4, 5), seed=1))
  assert len((a @ b).schedule()) == 1
  assert len((T(rand_np((2, 3, 4))) @ T(rand_np((2, 4, 5), seed=1))).schedule()) == 1


def test_matmul_dtypes():
  a, b = rand_np((3, 8), dtypes.int32, -5, 5), rand_np((8, 2), dtypes.int32, -5, 5, seed=1)
  assert_close((T(a) @ T(b)).numpy(), a @ b)
  assert_close((T(f32([[1, 2]])) @ [[3.0], [4.0]]).numpy(), f32([[11]]))  # list operand on the right
  assert_close(([[1.0, 2.0]] @ T(f32([[3], [4]]))).numpy(), f32([[11]]))


def test_matmul_half_acc():
  require_dtype(dtypes.float16)
  h, g = rand_np((4, 64), dtypes.float16, 0, 1), rand_np((64, 3), dtypes.float16, 0, 1, seed=1)
  want = h.astype(np.float32) @ g.astype(np.float32)
  got = T(h).matmul(T(g))
  assert got.dtype == dtypes.float16
  assert_close(got.numpy(), want.astype(np.float16), dtype=dtypes.float16)
  for kw in ({"dtype": dtypes.float32}, {"acc_dtype": dtypes.float32}):
    acc = T(h).matmul(T(g), **kw)
    assert acc.dtype == dtypes.float32
    assert_close(acc.numpy(), (h * 1).astype(np.float32) @ g.astype(np.float32), atol=2e-2, rtol=2e-3)


def test_matmul_errors():
  with pytest.raises(RuntimeError, match=r"\(3, 4\).*\(5, 2\)"): T(rand_np((3, 4))) @ T(rand_np((5, 2)))
  with pytest.raises(RuntimeError, match=r"\(4,\).*\(3,\)"): T(rand_np((4,))).dot(T(rand_np((3,))))
  with pytest.raises(RuntimeError, match="at least 1 dim"): T(np.float32(2)) @ T(rand_np((3,)))
  with pytest.raises(RuntimeError, match="batch"): T(rand_np((2, 3, 4))) @ T(rand_np((3, 4, 5)))


@pytest.mark.parametrize("formula,shapes", [
  ("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)]), ("ii->", [(4, 4)]), ("ii", [(4, 4)]), ("ii->i", [(4, 4)]),
  ("ij->ji", [(3, 4)]), ("ij", [(3, 4)]), ("ji", [(3, 4)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("i,i->", [(5,), (5,)]),
  ("i,j->ij", [(3,), (4,)]), ("ij->", [(3, 4)]), ("ijk->kj", [(2, 3, 4)]), ("iij->j", [(3, 3, 2)]), ("iji->j", [(3, 2, 3)]),
  ("ij,ij,ij->i", [(2, 3), (2, 3), (2, 3)]), ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]), ("i...->...", [(3, 2, 4)]),
  ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]), ("aB", [(2, 3)]), ("Ab,bA->", [(2, 3), (3, 2)]),
  ("...i,...i->...", [(2, 1, 3), (4, 3)]), ("i...,i...", [(2, 3, 1), (2, 1, 4)])])
def test_einsum(formula, shapes):
  check_op(shapes, lambda *xs: Tensor.einsum(formula, *xs), lambda *xs: np.einsum(formula, *xs), atol=1e-5)


def test_einsum_list_operands_and_kernel():
  a, b = rand_np((3, 4)), rand_np((4, 5), seed=1)
  out = Tensor.einsum("ij,jk->ik", [T(a), T(b)])
  assert len(out.schedule()) == 1
  assert_close(out.numpy(), a @ b, atol=1e-5)


def test_einsum_errors():
  a = T(rand_np((3, 4)))
  with pytest.raises(ValueError, match="operand"): Tensor.einsum("ij,jk->ik", a)
  with pytest.raises(ValueError, match="shape"): Tensor.einsum("ijk->i", a)
  with pytest.raises(ValueError, match="size 4 .* 5"): Tensor.einsum("ij,jk->ik", a, T(rand_np((5, 2))))
  with pytest.raises(ValueError, match="equal dims"): Tensor.einsum("ii->i", a)
  with pytest.raises(ValueError, match="no operand"): Tensor.einsum("ij->iz", a)
  with pytest.raises(ValueError, match="a-z"): Tensor.einsum("i1->i", a)
  with pytest.raises(ValueError, match="'...' dim"): Tensor.einsum("...i,...i", T(rand_np((2, 3))), T(rand_np((4, 3))))


# ***** activations *****
def np_sigmoid(x): return 1 / (1 + np.exp(-x.astype(np.float64)))
def np_softplus(x, beta=1.0): return np.logaddexp(0, beta * x.astype(np.float64)) / beta

ACTS = {
  "leaky_relu": (lambda t: t.leaky_relu(), lambda x: np.where(x < 0, 0.01 * x, x)),
  "leaky_relu_02": (lambda t: t.leaky_relu(0.2), lambda x: np.where(x < 0, 0.2 * x, x)),
  "elu": (lambda t: t.elu(), lambda x: np.where(x > 0, x, np.expm1(x))),
  "elu_a": (lambda t: t.elu(0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(x))),
  "celu": (lambda t: t.celu(2.0), lambda x: np.where(x > 0, x, 2.0 * np.expm1(x / 2.0))),
  "selu": (lambda t: t.selu(), lambda x: 1.0507 * np.where(x > 0, x, 1.67326 * np.expm1(x))),
  "gelu": (lambda t: t.gelu(), lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
  "gelu_erf": (lambda t: t.gelu(approximate="none"), lambda x: 0.5 * x * (1 + erf_np(x / math.sqrt(2)))),
  "quick_gelu": (lambda t: t.quick_gelu(), lambda x: x * np_sigmoid(1.702 * x)),
  "silu": (lambda t: t.silu(), lambda x: x * np_sigmoid(x)),
  "swish": (lambda t: t.swish(), lambda x: x * np_sigmoid(x)),
  "sigmoid": (lambda t: t.sigmoid(), np_sigmoid),
  "logsigmoid": (lambda t: t.logsigmoid(), lambda x: -np_softplus(-x)),
  "tanh": (lambda t: t.tanh(), np.tanh),
  "hardsigmoid": (lambda t: t.hardsigmoid(), lambda x: np.clip(x / 6 + 0.5, 0, 1)),
  "hardswish": (lambda t: t.hardswish(), lambda x: x * np.clip(x + 3, 0, 6) / 6),
  "relu6": (lambda t: t.relu6(), lambda x: np.clip(x, 0, 6)),
  "hardtanh": (lambda t: t.hardtanh(), lambda x: np.clip(x, -1, 1)),
  "softplus": (lambda t: t.softplus(), np_softplus),
  "softplus_beta": (lambda t: t.softplus(beta=2.0), lambda x: np_softplus(x, 2.0)),
  "mish": (lambda t: t.mish(), lambda x: x * np.tanh(np_softplus(x))),
  "softsign": (lambda t: t.softsign(), lambda x: x / (1 + np.abs(x))),
}


@pytest.mark.parametrize("name", list(ACTS))
def test_activation(name):
  """Random values, the kinks (0, +-3, +-6) and extremes where a naive exp overflows; results must stay finite."""
  fn, ref = ACTS[name]
  x = np.concatenate([rand_np((40,), low=-8, high=8), f32([0.0, -0.0, 1e-3, -1e-3, 3.0, -3.0, 6.0, -6.0]),
                      f32([-1e4, -200.0, -90.0, -30.0, 30.0, 90.0, 200.0, 1e4])])
  with np.errstate(over="ignore", invalid="ignore"): want = ref(x.astype(np.float64)).astype(np.float32)
  got = fn(T(x)).numpy()
  assert np.isfinite(got).all(), f"{name} not finite: {got}"
  assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_activation_int_input():
  assert_close(T(np.array([-2, 0, 2], np.int32)).sigmoid().numpy(), np_sigmoid(np.array([-2, 0, 2])).astype(np.float32))
  assert T(np.array([1], np.int32)).gelu().dtype == dtypes.float32


def test_gelu_bad_approximate():
  with pytest.raises(ValueError, match="approximate"): T(f32([1])).gelu(approximate="fast")


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_log_softmax(axis):
  x = rand_np((3, 4, 5), low=-20, high=20)
  m = x - x.max(axis, keepdims=True)
  lse = np.log(np.exp(m).sum(axis, keepdims=True))
  assert_close(T(x).softmax(axis).numpy(), np.exp(m - lse), atol=1e-6)
  assert_close(T(x).log_softmax(axis).numpy(), m - lse, atol=1e-5)


def test_softmax_stable_and_kernels():
  x = f32([[1000.0, 1001.0, 999.0], [-1000.0, -1e4, 0.0]])
  got = T(x).softmax().numpy()
  m = x - x.max(-1, keepdims=True)
  assert_close(got, np.exp(m) / np.exp(m).sum(-1, keepdims=True), atol=1e-6)
  assert np.isfinite(T(x).log_softmax().numpy()).all()
  xn = f32([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0]])  # a nan poisons its own row only, like torch
  for got in (T(xn).softmax().numpy(), T(xn).log_softmax().numpy()):
    assert np.isnan(got[0]).all() and np.isfinite(got[1]).all()
  assert len(T(rand_np((4, 8))).softmax().schedule()) <= 3
  assert len(T(rand_np((4, 8))).log_softmax().schedule()) <= 3
  require_dtype(dtypes.float16)
  assert T(rand_np((2, 3), dtypes.float16)).softmax().dtype == dtypes.float16
  assert T(rand_np((2, 3), dtypes.float16)).softmax(dtype=dtypes.float32).dtype == dtypes.float32


# ***** normalization *****
def test_layernorm():
  x = rand_np((2, 3, 8))
  for axis in (-1, (1, 2)):
    mu = x.mean(axis, keepdims=True)
    want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis, keepdims=True) + 1e-5)
    assert_close(T(x).layernorm(axis).numpy(), want, atol=1e-5)
  assert_close(T(x).layernorm(eps=0.5).numpy(), (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 0.5), atol=1e-5)


def test_batchnorm():
  x, w, b, mu = rand_np((2, 3, 4, 4)), rand_np((3,), seed=1), rand_np((3,), seed=2), rand_np((3,), seed=3)
  inv = rand_np((3,), low=0.5, high=2, seed=4)
  c = lambda v: v.reshape(1, 3, 1, 1)
  assert_close(T(x).batchnorm(T(w), T(b), T(mu), T(inv)).numpy(), (x - c(mu)) * c(w) * c(inv) + c(b), atol=1e-5)
  assert_close(T(x).batchnorm(None, None, T(mu), T(inv)).numpy(), (x - c(mu)) * c(inv), atol=1e-5)
  x2 = rand_np((5, 3))
  assert_close(T(x2).batchnorm(T(w), T(b), T(mu), T(inv)).numpy(), (x2 - mu) * w * inv + b, atol=1e-5)


# ***** convolution *****
def np_conv(x, w, b=None, groups=1, stride=1, dilation=1, pads=None):
  """Direct N-d cross-correlation; pads: (before, after) per spatial dim, negative crops."""
  nd = w.ndim - 2
  st, dl = (stride,) * nd if isinstance(stride, int) else stride, (dilation,) * nd if isinstance(dilation, int) else dilation
  pads = pads or [(0, 0)] * nd
  x = np.pad(x, [(0, 0), (0, 0)] + [(max(p, 0), max(q, 0)) for p, q in pads])
  x = x[(slice(None), slice(None), *[slice(-min(p, 0), x.shape[2 + i] + min(q, 0)) for i, (p, q) in enumerate(pads)])]
  bs, cout, ks = x.shape[0], w.shape[0], w.shape[2:]
  cin_g, cout_g = w.shape[1], cout // groups
  outs = [(x.shape[2 + i] - dl[i] * (ks[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
  ret = np.zeros((bs, cout, *outs), np.float64)
  for g in range(groups):
    xg, wg = x[:, g * cin_g:(g + 1) * cin_g].astype(np.float64), w[g * cout_g:(g + 1) * cout_g].astype(np.float64)
    for o in itertools.product(*[range(v) for v in outs]):
      win = xg[(slice(None), slice(None), *[slice(o[i] * st[i], o[i] * st[i] + dl[i] * (ks[i] - 1) + 1, dl[i]) for i in range(nd)])]
      ret[(slice(None), slice(g * cout_g, (g + 1) * cout_g), *o)] = np.tensordot(win, wg, axes=(list(range(1, nd + 2)), list(range(1, nd + 2))))
  if b is not None: ret += b.reshape(1, -1, *[1] * nd)
  return ret.astype(np.float32)


@pytest.mark.parametrize("xs,ws,kw,pads", [
  ((2, 3, 6, 7), (4, 3, 3, 3), {}, None),
  ((1, 2, 7, 7), (3, 2, 3, 2), {"padding": 1}, [(1, 1), (1, 1)]),
  ((1, 2, 8, 9), (2, 2, 3, 3), {"stride": 2, "padding": (1, 2)}, [(1, 1), (2, 2)]),
  ((1, 4, 7, 7), (6, 2, 3, 3), {"groups": 2, "dilation": 2}, None),
  ((1, 4, 6, 6), (4, 1, 3, 3), {"groups": 4, "padding": 1, "stride": (1, 2)}, [(1, 1), (1, 1)]),
  ((1, 2, 6, 7), (3, 2, 2, 3), {"padding": (1, 0, 2, 1)}, [(2, 1), (1, 0)]),  # (left, right, top, bottom)
  ((1, 1, 5, 5), (1, 1, 1, 1), {"stride": 3}, None),
  ((1, 1, 9, 9), (2, 1, 2, 2), {"stride": 3, "dilation": 3}, None),
  ((1, 2, 4, 4), (2, 2, 4, 4), {}, None),
  ((1, 2, 6, 6), (2, 2, 3, 3), {"padding": (-1, 0, 0, -1)}, [(0, -1), (-1, 0)]),
])
def test_conv2d(xs, ws, kw, pads):
  x, w, b = rand_np(xs), rand_np(ws, seed=1), rand_np((ws[0],), seed=2)
  npkw = {k: v for k, v in kw.items() if k != "padding"}
  assert_close(T(x).conv2d(T(w), **kw).numpy(), np_conv(x, w, pads=pads, **npkw), atol=1e-5, rtol=1e-5)
  assert_close(T(x).conv2d(T(w), T(b), **kw).numpy(), np_conv(x, w, b, pads=pads, **npkw), atol=1e-5, rtol=1e-5)


def test_conv_padding_strings_and_linear():
  x, w = rand_np((1, 2, 5, 6)), rand_np((3, 2, 3, 2), seed=1)
  assert_close(T(x).conv2d(T(w), padding="same").numpy(), np_conv(x, w, pads=[(1, 1), (0, 1)]), atol=1e-5)
  assert_close(T(x).conv2d(T(w), padding="same", dilation=2).numpy(), np_conv(x, w, dilation=2, pads=[(2, 2), (1, 1)]), atol=1e-5)
  assert_close(T(x).conv2d(T(w), padding="valid").numpy(), np_conv(x, w), atol=1e-5)
  with pytest.raises(ValueError, match="stride 1"): T(x).conv2d(T(w), padding="same", stride=2)
  with pytest.raises(ValueError, match="same"): T(x).conv2d(T(w), padding="full")
  a, lw, lb = rand_np((2, 4)), rand_np((4, 3), seed=1), rand_np((3,), seed=2)
  assert_close(T(a).linear(T(lw), T(lb)).numpy(), a @ lw + lb, atol=1e-5)
  assert_close(T(a).linear(T(lw[:, 0])).numpy(), a * lw[:, 0], atol=1e-6)


def test_conv_one_kernel():
  x, w, b = T(rand_np((1, 3, 6, 6))), T(rand_np((4, 3, 3, 3), seed=1)), T(rand_np((4,), seed=2))
  assert len(x.conv2d(w).schedule()) == 1
  assert len(x.conv2d(w, b, padding=1, stride=2).schedule()) == 1


@pytest.mark.parametrize("kw,pads", [({}, None), ({"padding": 2, "stride": 2}, [(2, 2)]), ({"dilation": 2, "groups": 2}, None),
                                     ({"padding": (0, 3)}, [(0, 3)])])
def test_conv1d_and_3d(kw, pads):
  x, w, b = rand_np((2, 4, 9)), rand_np((2, 4 // kw.get("groups", 1), 3), seed=1), rand_np((2,), seed=2)
  npkw = {k: v for k, v in kw.items() if k != "padding"}
  assert_close(T(x).conv1d(T(w), T(b), **kw).numpy(), np_conv(x, w, b, pads=pads, **npkw), atol=1e-5)
  x3, w3 = rand_np((1, 2, 4, 5, 4)), rand_np((2, 2, 2, 3, 2), seed=1)
  assert_close(T(x3).conv2d(T(w3), padding=1).numpy(), np_conv(x3, w3, pads=[(1, 1)] * 3), atol=1e-5)


def test_conv_errors():
  x = T(rand_np((1, 4, 5, 5)))
  with pytest.raises(RuntimeError, match=r"4 channels.*\(2, 3, 3, 3\)"): x.conv2d(T(rand_np((2, 3, 3, 3))))
  with pytest.raises(RuntimeError, match="groups=3"): x.conv2d(T(rand_np((3, 2, 3, 3))), groups=3)
  with pytest.raises(RuntimeError, match="not divisible"): x.conv2d(T(rand_np((3, 2, 3, 3))), groups=2)
  with pytest.raises(RuntimeError, match="larger"): x.conv2d(T(rand_np((2, 4, 6, 6))))
  with pytest.raises(RuntimeError, match="bias"): x.conv2d(T(rand_np((2, 4, 3, 3))), T(rand_np((3,))))
  with pytest.raises(RuntimeError, match="4-D input"): T(rand_np((4, 5, 5))).conv2d(T(rand_np((2, 4, 3, 3))))
  with pytest.raises(ValueError, match="stride"): x.conv2d(T(rand_np((2, 4, 3, 3))), stride=0)
  with pytest.raises(ValueError, match="padding"): x.conv2d(T(rand_np((2, 4, 3, 3))), padding=(1, 2, 3))
  with pytest.raises(ValueError, match="groups"): x.conv2d(T(rand_np((2, 4, 3, 3))), groups=0)
  with pytest.raises(RuntimeError, match="3-D"): x.conv1d(T(rand_np((2, 4, 3, 3))))


def np_conv_transpose(x, w, b=None, groups=1, stride=1, dilation=1, padding=0, output_padding=0):
  nd = w.ndim - 2
  tup = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)
  st, dl, pd, op = tup(stride), tup(dilation), tup(padding), tup(output_padding)
  cin, cout_g, ks = w.shape[0], w.shape[1], w.shape[2:]
  cin_g, ins = cin // groups, x.shape[2:]
  full = [(i - 1) * s + d * (k - 1) + 1 + o for i, s, d, k, o in zip(ins, st, dl, ks, op)]
  out = np.zeros((x.shape[0], cout_g * groups, *full), np.float64)
  for g in range(groups):
    for i in itertools.product(*[range(v) for v in ins]):
      for k in itertools.product(*[range(v) for v in ks]):
        pos = tuple(ii * s + kk * d for ii, s, kk, d in zip(i, st, k, dl))
        cs = slice(g * cin_g, (g + 1) * cin_g)
        contrib = np.einsum("bc,co->bo", x[(slice(None), cs, *i)], w[(cs, slice(None), *k)])
        out[(slice(None), slice(g * cout_g, (g + 1) * cout_g), *pos)] += contrib
  out = out[(slice(None), slice(None), *[slice(p, f - p) for p, f in zip(pd, full)])]
  if b is not None: out += b.reshape(1, -1, *[1] * nd)
  return out.astype(np.float32)


@pytest.mark.parametrize("xs,ws,kw", [
  ((1, 2, 4, 4), (2, 3, 3, 3), {}), ((2, 2, 3, 4), (2, 2, 3, 2), {"stride": 2}), ((1, 2, 4, 4), (2, 3, 3, 3), {"stride": 2, "padding": 1}),
  ((1, 2, 3, 3), (2, 1, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}), ((1, 4, 3, 3), (4, 1, 2, 2), {"groups": 2, "dilation": 2}),
  ((1, 2, 3, 4), (2, 2, 3, 3), {"stride": (2, 3), "padding": (2, 1), "output_padding": (1, 2)}), ((1, 1, 3, 3), (1, 1, 2, 2), {"padding": 1}),
])
def test_conv_transpose2d(xs, ws, kw):
  x, w, b = rand_np(xs), rand_np(ws, seed=1), rand_np((ws[1] * kw.get("groups", 1),), seed=2)
  assert_close(T(x).conv_transpose2d(T(w), **kw).numpy(), np_conv_transpose(x, w, **kw), atol=1e-5)
  assert_close(T(x).conv_transpose2d(T(w), T(b), **kw).numpy(), np_conv_transpose(x, w, b, **kw), atol=1e-5)


def test_conv_transpose_errors():
  x = T(rand_np((1, 2, 3, 3)))
  with pytest.raises(RuntimeError, match="channels"): x.conv_transpose2d(T(rand_np((3, 2, 3, 3))))
  with pytest.raises(ValueError, match="output_padding"): x.conv_transpose2d(T(rand_np((2, 2, 3, 3))), stride=2, output_padding=2)
  with pytest.raises(RuntimeError, match="divisible"): x.conv_transpose2d(T(rand_np((2, 2, 3, 3))), groups=4)


# ***** pooling *****
def np_pool(x, k, s=None, d=1, pads=0, ceil_mode=False, mode="max", count_include_pad=True):
  nd = len(k)
  s = s or k
  tup = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)
  s, d, p = tup(s), tup(d), tup(pads)
  ins = x.shape[-nd:]
  outs = []
  for i, kk, ss, dd, pp in zip(ins, k, s, d, p):
    span = i + 2 * pp - dd * (kk - 1) - 1
    o = (-(-span // ss) if ceil_mode else span // ss) + 1
    if ceil_mode and (o - 1) * ss >= i + pp: o -= 1
    outs.append(o)
  out = np.zeros(x.shape[:-nd] + tuple(outs), np.float64)
  for o in itertools.product(*[range(v) for v in outs]):
    idx = [np.arange(kk) * dd + oo * ss - pp for kk, dd, oo, ss, pp in zip(k, d, o, s, p)]
    real = [ix[(ix >= 0) & (ix < i)] for ix, i in zip(idx, ins)]
    win = x[(Ellipsis, *np.ix_(*real))].reshape(*x.shape[:-nd], -1).astype(np.float64)
    if mode == "max": out[(Ellipsis, *o)] = win.max(-1)
    else:
      cnt = math.prod(len(r) for r in real) if not count_include_pad else \
        math.prod(int(((ix >= -pp) & (ix < i + pp)).sum()) for ix, i, pp in zip(idx, ins, p))
      out[(Ellipsis, *o)] = win.sum(-1) / cnt
  return out.astype(x.dtype)


POOLS = [((2, 2), {}), ((3, 2), {"stride": (2, 1), "padding": 1}), ((3, 3), {"stride": 2, "padding": 1, "ceil_mode": True}),
         ((2, 2), {"dilation": 2}), ((3, 3), {"stride": 3, "ceil_mode": True}), ((2, 3), {"stride": 4})]


@pytest.mark.parametrize("k,kw", POOLS)
def test_max_pool2d(k, kw):
  x = rand_np((2, 2, 7, 8))
  npkw = {"s": kw.get("stride"), "d": kw.get("dilation", 1), "pads": kw.get("padding", 0), "ceil_mode": kw.get("ceil_mode", False)}
  assert_close(T(x).max_pool2d(k, **kw).numpy(), np_pool(x, k, **npkw))


@pytest.mark.parametrize("k,kw", POOLS)
@pytest.mark.parametrize("include", [True, False])
def test_avg_pool2d(k, kw, include):
  x = rand_np((2, 2, 7, 8))
  npkw = {"s": kw.get("stride"), "d": kw.get("dilation", 1), "pads": kw.get("padding", 0), "ceil_mode": kw.get("ceil_mode", False)}
  assert_close(T(x).avg_pool2d(k, count_include_pad=include, **kw).numpy(), np_pool(x, k, mode="avg", count_include_pad=include, **npkw), atol=1e-6)


def test_pool_misc():
  x = rand_np((1, 2, 6, 6))
  assert len(T(x).max_pool2d().schedule()) == 1
  assert_close(T(x).max_pool2d(3).numpy(), np_pool(x, (3, 3)))  # int kernel_size -> 2-D
  xi = rand_np((1, 1, 4, 4), dtypes.int32, -100, 100)
  assert_close(T(xi).max_pool2d(3, stride=1, padding=1).numpy(), np_pool(xi, (3, 3), 1, pads=1))  # padding never wins on ints
  assert_close(T(rand_np((3, 8))).avg_pool2d((2,)).numpy(), rand_np((3, 8)).reshape(3, 4, 2).mean(-1), atol=1e-6)  # 1-D window
  assert T(xi).avg_pool2d().dtype == dtypes.float32


def test_max_pool2d_indices():
  x = rand_np((1, 2, 5, 6))
  x[0, 0, 0, :2] = 3.0  # a tie inside one window: torch returns the first index
  for kw in ({}, {"stride": 1, "padding": 1}, {"ceil_mode": True}):
    out, idx = T(x).max_pool2d((2, 2), return_indices=True, **kw)
    want = np_pool(x, (2, 2), kw.get("stride"), pads=kw.get("padding", 0), ceil_mode=kw.get("ceil_mode", False))
    assert_close(out.numpy(), want)
    got = idx.numpy()
    assert got.dtype == np.int32
    assert_close(np.take_along_axis(x.reshape(1, 2, -1), got.reshape(1, 2, -1), -1).reshape(got.shape), want)  # points at the max
    assert (got >= 0).all() and (got < 30).all()
  assert T(x).max_pool2d((2, 2), return_indices=True)[1].numpy()[0, 0, 0, 0] == 0


def test_pool_errors():
  x = T(rand_np((1, 1, 4, 4)))
  with pytest.raises(RuntimeError, match="larger"): x.max_pool2d((5, 5))
  with pytest.raises(ValueError, match="half"): x.max_pool2d((2, 2), padding=2)
  with pytest.raises(ValueError, match="kernel_size"): x.avg_pool2d((0, 2))
  with pytest.raises(ValueError, match="stride"): x.avg_pool2d((2, 2), stride=(1, 1, 1))
  with pytest.raises(RuntimeError, match="at least 3 dims"): T(rand_np((4, 4))).max_pool2d((2, 2, 2))


# ***** attention *****
def np_sdpa(q, k, v, mask=None, causal=False):
  s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
  if causal: mask = np.tril(np.ones(s.shape[-2:], bool))
  if mask is not None: s = s + (np.where(mask, 0, -np.inf) if mask.dtype == bool else mask)
  s = np.exp(s - s.max(-1, keepdims=True))
  return ((s / s.sum(-1, keepdims=True)) @ v).astype(np.float32)


@pytest.mark.parametrize("lq,lk", [(3, 5), (5, 3)])
def test_sdpa(lq, lk):
  q, k, v = rand_np((2, 2, lq, 4)), rand_np((2, 2, lk, 4), seed=1), rand_np((2, 2, lk, 3), seed=2)
  assert_close(T(q).scaled_dot_product_attention(T(k), T(v)).numpy(), np_sdpa(q, k, v), atol=1e-5)
  assert_close(T(q).scaled_dot_product_attention(T(k), T(v), is_causal=True).numpy(), np_sdpa(q, k, v, causal=True), atol=1e-5)
  bmask = rand_np((lq, lk), dtypes.bool, seed=3)
  bmask[:, 0] = True  # every query sees a key
  assert_close(T(q).scaled_dot_product_attention(T(k), T(v), T(bmask)).numpy(), np_sdpa(q, k, v, bmask), atol=1e-5)
  fmask = rand_np((2, 1, lq, lk), seed=4)
  assert_close(T(q).scaled_dot_product_attention(T(k), T(v), attn_mask=T(fmask)).numpy(), np_sdpa(q, k, v, fmask), atol=1e-5)


def test_sdpa_gqa():
  q, k, v = rand_np((1, 4, 3, 2)), rand_np((1, 2, 5, 2), seed=1), rand_np((1, 2, 5, 3), seed=2)
  want = np_sdpa(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), causal=True)
  assert_close(T(q).scaled_dot_product_attention(T(k), T(v), is_causal=True, enable_gqa=True).numpy(), want, atol=1e-5)
  with pytest.raises(RuntimeError, match="multiple"): T(rand_np((1, 3, 3, 2))).scaled_dot_product_attention(T(k), T(v), enable_gqa=True)


def test_sdpa_errors():
  q = T(rand_np((1, 3, 4)))
  with pytest.raises(RuntimeError, match="is_causal"): q.scaled_dot_product_attention(q, q, T(np.ones((3, 3), bool)), is_causal=True)
  with pytest.raises(RuntimeError, match="embedding"): q.scaled_dot_product_attention(T(rand_np((1, 3, 5))), q)
  with pytest.raises(RuntimeError, match="lengths"): q.scaled_dot_product_attention(q, T(rand_np((1, 2, 4))))


# ***** dropout, one_hot, losses *****
def test_dropout():
  x = T(rand_np((4, 4)))
  assert x.dropout(0.5) is x
  with pytest.raises(ValueError, match="probability"): x.dropout(1.5)
  if not hasattr(Tensor, "rand"): pytest.skip("training-mode dropout needs Tensor.rand, which this build doesn't have yet")
  Tensor.training = True
  try:
    ones = Tensor.ones(64, 64)
    y = ones.dropout(0.25).numpy()
    assert np.isclose(y, 0).sum() + np.isclose(y, 1 / 0.75).sum() == y.size
    assert 0.15 < (y == 0).mean() < 0.35
    assert (ones.dropout(1.0).numpy() == 0).all()
  finally: Tensor.training = False


def test_one_hot():
  y = np.array([[0, 2], [3, 1]], np.int32)
  got = T(y).one_hot(5)
  assert got.dtype == dtypes.int32
  assert_close(got.numpy(), np.eye(5, dtype=np.int32)[y])
  assert_close(T(y).one_hot(3).numpy(), np.eye(4, dtype=np.int32)[y][..., :3])  # 3 is out of range: a row of zeros
  with pytest.raises(TypeError, match="integer"): T(f32([1.0])).one_hot(3)
  with pytest.raises(ValueError, match="not inferred"): T(y).one_hot(-1)  # as tinygrad: num_classes is given


def np_log_softmax(x, axis):
  m = x.astype(np.float64) - x.max(axis, keepdims=True)
  return m - np.log(np.exp(m).sum(axis, keepdims=True))


def np_reduce(v, reduction):
  return {"none": v, "sum": v.sum(), "mean": v.mean()}[reduction].astype(np.float32)


@pytest.mark.parametrize("reduction,ls", [("mean", 0.0), ("sum", 0.1), ("none", 0.1)])
def test_cross_entropy(reduction, ls):
  x, y = rand_np((4, 5)), np.array([0, 4, 2, 2], np.int32)
  oh = np.eye(5)[y] * (1 - ls) + ls / 5
  want = np_reduce(-(np_log_softmax(x, 1) * oh).sum(1), reduction)
  assert_close(T(x).cross_entropy(T(y), reduction, ls).numpy(), want, atol=1e-5)
  probs = rand_np((4, 5), low=0, high=1, seed=1)
  probs /= probs.sum(1, keepdims=True)
  want = np_reduce(-(np_log_softmax(x, 1) * (probs * (1 - ls) + ls / 5)).sum(1), reduction)
  assert_close(T(x).cross_entropy(T(probs), reduction, ls).numpy(), want, atol=1e-5)
  x4, y4 = rand_np((2, 3, 2, 2)), rand_np((2, 2, 2), dtypes.int32, 0, 2)  # classes on axis 1 with extra dims
  oh4 = np.moveaxis(np.eye(3)[y4], -1, 1) * (1 - ls) + ls / 3
  assert_close(T(x4).cross_entropy(T(y4), reduction, ls).numpy(), np_reduce(-(np_log_softmax(x4, 1) * oh4).sum(1), reduction), atol=1e-5)


@pytest.mark.parametrize("reduction,ls,ignore", [("mean", 0.0, -1), ("mean", 0.2, 2), ("sum", 0.2, -1), ("none", 0.0, 2), ("mean", 0.2, -1)])
def test_sparse_categorical_crossentropy(reduction, ls, ignore):
  x, y = rand_np((2, 3, 4)), np.array([[0, 2, 3], [-1, 1, 2]], np.int32)
  lp = np_log_softmax(x, -1)
  keep = y != ignore
  nll = -np.where(keep, np.take_along_axis(lp, np.clip(y, 0, 3)[..., None], -1)[..., 0], 0) * (y >= 0)
  loss = (1 - ls) * nll + ls * -lp.mean(-1) * keep
  want = loss.sum() / keep.sum() if reduction == "mean" else np_reduce(loss, reduction)
  got = T(x).sparse_categorical_crossentropy(T(y), ignore_index=ignore, label_smoothing=ls, reduction=reduction)
  assert_close(got.numpy(), np.asarray(want, np.float32), atol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy(reduction):
  p, y = rand_np((3, 4), low=0.01, high=0.99), rand_np((3, 4), low=0, high=1, seed=1).round()
  want = np_reduce(-(y * np.log(p) + (1 - y) * np.log(1 - p)), reduction)
  assert_close(T(p).binary_crossentropy(T(y), reduction).numpy(), want, atol=1e-5)
  x = rand_np((3, 4), low=-30, high=30)
  lp, l1p = -np.logaddexp(0, -x.astype(np.float64)), -np.logaddexp(0, x.astype(np.float64))
  want = np_reduce(-(y * lp + (1 - y) * l1p), reduction)
  assert_close(T(x).binary_crossentropy_logits(T(y), reduction).numpy(), want, atol=1e-5, rtol=1e-5)
  pw = rand_np((4,), low=0.5, high=2, seed=2)
  want = np_reduce(-(pw * y * lp + (1 - y) * l1p), reduction)
  assert_close(T(x).binary_crossentropy_logits(T(y), reduction, pos_weight=T(pw)).numpy(), want, atol=1e-5, rtol=1e-5)
  assert np.isfinite(T(f32([0.0, 1.0])).binary_crossentropy(T(f32([1.0, 0.0])), "none").numpy()).all()  # logs clamped at -100


def test_loss_errors():
  x, y = T(rand_np((4, 5))), T(np.array([0, 1, 2, 3], np.int32))
  with pytest.raises(ValueError, match="reduction"): x.cross_entropy(y, reduction="avg")
  with pytest.raises(ValueError, match="label_smoothing"): x.cross_entropy(y, label_smoothing=1.5)
  with pytest.raises(ValueError, match=r"\(3,\).*\(4, 5\)"): x.cross_entropy(T(np.array([0, 1, 2], np.int32)))
  with pytest.raises(ValueError, match="labels"): x.sparse_categorical_crossentropy(T(np.array([0, 1], np.int32)))
  with pytest.raises(ValueError, match="reduction"): x.binary_crossentropy_logits(x, reduction="x")


# ***** interpolate *****
def np_interp_axis(x, axis, n_out, mode, align_corners):
  n_in = x.shape[axis]
  o = np.arange(n_out)
  if mode == "nearest": idx = (o * n_in) // n_out
  elif mode == "nearest-exact": idx = ((2 * o + 1) * n_in) // (2 * n_out)
  if mode.startswith("nearest"): return np.take(x, idx, axis)
  if align_corners: pos = o * ((n_in - 1) / (n_out - 1)) if n_out > 1 else o * 0.0
  else: pos = np.maximum((o + 0.5) * (n_in / n_out) - 0.5, 0)
  lo = np.minimum(np.floor(pos).astype(int), n_in - 1)
  hi = np.minimum(lo + 1, n_in - 1)
  shp = [1] * x.ndim
  shp[axis] = n_out
  w = (pos - lo).reshape(shp)
  return np.take(x, lo, axis) * (1 - w) + np.take(x, hi, axis) * w


@pytest.mark.parametrize("mode", ["linear", "nearest", "nearest-exact"])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("size", [(7,), (3, 2, 8)])
def test_interpolate(mode, align, size):
  if align and mode.startswith("nearest"): return
  x = rand_np((1, 2, 4, 5, 3)[-len(size) - 2:])
  want = x.astype(np.float64)
  for ax, n in zip(range(x.ndim - len(size), x.ndim), size): want = np_interp_axis(want, ax, n, mode, align)
  assert_close(T(x).interpolate(size, mode=mode, align_corners=align).numpy(), want.astype(np.float32), atol=1e-5)


def test_interpolate_misc():
  xi = rand_np((1, 1, 3, 3), dtypes.int32, 0, 9)
  got = T(xi).interpolate((6, 5), mode="nearest")
  assert got.dtype == dtypes.int32
  assert_close(got.numpy(), np_interp_axis(np_interp_axis(xi, 2, 6, "nearest", False), 3, 5, "nearest", False))
  x = rand_np((1, 1, 3, 4))
  assert_close(T(x).interpolate((3, 4)).numpy(), x)
  assert_close(T(x).interpolate((6, 2), mode="bilinear").numpy(),
               np_interp_axis(np_interp_axis(x.astype(np.float64), 2, 6, "linear", False), 3, 2, "linear", False).astype(np.float32), atol=1e-5)
  with pytest.raises(ValueError, match="size"): T(x).interpolate((0, 2))
  with pytest.raises(ValueError, match="size"): T(x).interpolate((1, 1, 1, 1, 1))
  with pytest.raises(ValueError, match="mode"): T(x).interpolate((2, 2), mode="cubic")
  with pytest.raises(ValueError, match="needs 2"): T(x).interpolate((2,), mode="bilinear")
  with pytest.raises(ValueError, match="align_corners"): T(x).interpolate((2, 2), mode="nearest", align_corners=True)
