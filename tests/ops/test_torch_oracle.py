"""Every Tensor op forward and backward against PyTorch (CPU, float64 inputs) on hypothesis-generated shapes and values.

torch==2.13.0 (CPU build) is in core's [test] extra, so CI runs these. Each case is (plugrad fn, torch fn, input
ranges); both get the same random arrays, the forward values must match and so must the gradients of
sum(out * r) for a random r. A handful of examples per op keeps the suite to about a minute.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrad.tensor import Tensor

torch = pytest.importorskip("torch")  # a test extra (see core/pyproject.toml); skipped only outside CI
F = torch.nn.functional

pytestmark = pytest.mark.filterwarnings("ignore:var\\(\\). degrees of freedom:UserWarning")  # torch's var of one element: nan like ours
SETTINGS = settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
seeds = st.integers(0, 2 ** 16)

# name -> (plugrad fn, torch fn, (low, high) of the inputs, arity)
UNARY = {
  "neg": (lambda x: -x, lambda x: -x), "exp": (lambda x: x.exp(), torch.exp), "log": (lambda x: x.log(), torch.log, (0.1, 3)),
  "log2": (lambda x: x.log2(), torch.log2, (0.1, 3)), "log10": (lambda x: x.log10(), torch.log10, (0.1, 3)),
  "sqrt": (lambda x: x.sqrt(), torch.sqrt, (0.1, 3)), "rsqrt": (lambda x: x.rsqrt(), torch.rsqrt, (0.1, 3)),
  "sin": (lambda x: x.sin(), torch.sin), "cos": (lambda x: x.cos(), torch.cos), "tan": (lambda x: x.tan(), torch.tan, (-1, 1)),
  "asin": (lambda x: x.asin(), torch.asin, (-0.9, 0.9)), "acos": (lambda x: x.acos(), torch.acos, (-0.9, 0.9)),
  "atan": (lambda x: x.atan(), torch.atan), "sinh": (lambda x: x.sinh(), torch.sinh), "cosh": (lambda x: x.cosh(), torch.cosh),
  "tanh": (lambda x: x.tanh(), torch.tanh), "asinh": (lambda x: x.asinh(), torch.asinh), "acosh": (lambda x: x.acosh(), torch.acosh, (1.1, 4)),
  "atanh": (lambda x: x.atanh(), torch.atanh, (-0.9, 0.9)), "erf": (lambda x: x.erf(), torch.erf),
  "abs": (lambda x: x.abs(), torch.abs), "sign": (lambda x: x.sign(), torch.sign), "square": (lambda x: x.square(), torch.square),
  "reciprocal": (lambda x: x.reciprocal(), torch.reciprocal, (0.5, 3)), "relu": (lambda x: x.relu(), torch.relu),
  "sigmoid": (lambda x: x.sigmoid(), torch.sigmoid), "silu": (lambda x: x.silu(), F.silu),
  "gelu": (lambda x: x.gelu(), lambda x: F.gelu(x, approximate="tanh")),
  "gelu_erf": (lambda x: x.gelu(approximate="none"), F.gelu), "quick_gelu": (lambda x: x.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x)),
  "elu": (lambda x: x.elu(), F.elu), "celu": (lambda x: x.celu(), F.celu), "selu": (lambda x: x.selu(), lambda x: 1.0507 * F.elu(x, 1.67326)),
  "leaky_relu": (lambda x: x.leaky_relu(), F.leaky_relu), "relu6": (lambda x: x.relu6(), F.relu6, (-8, 8)),
  "hardtanh": (lambda x: x.hardtanh(), F.hardtanh), "hardswish": (lambda x: x.hardswish(), F.hardswish, (-5, 5)),
  "hardsigmoid": (lambda x: x.hardsigmoid(), F.hardsigmoid, (-5, 5)), "softplus": (lambda x: x.softplus(), F.softplus),
  "mish": (lambda x: x.mish(), F.mish), "softsign": (lambda x: x.softsign(), F.softsign), "logsigmoid": (lambda x: x.logsigmoid(), F.logsigmoid),
  "floor": (lambda x: x.floor(), torch.floor), "ceil": (lambda x: x.ceil(), torch.ceil), "trunc": (lambda x: x.trunc(), torch.trunc),
  "clamp": (lambda x: x.clip(-0.5, 0.7), lambda x: x.clamp(-0.5, 0.7)),
  "sum": (lambda x: x.sum(), torch.sum), "sum_last": (lambda x: x.sum(-1, keepdim=True), lambda x: x.sum(-1, keepdim=True)),
  "mean": (lambda x: x.mean(0), lambda x: x.mean(0)), "prod": (lambda x: x.prod(-1), lambda x: x.prod(-1), (0.5, 1.5)),
  "max": (lambda x: x.max(-1), lambda x: x.amax(-1)), "min": (lambda x: x.min(0), lambda x: x.amin(0)),
  "var": (lambda x: x.var(), lambda x: x.var()), "std": (lambda x: x.std(-1, correction=0), lambda x: x.std(-1, correction=0)),
  "logsumexp": (lambda x: x.logsumexp(-1), lambda x: x.logsumexp(-1)), "cumsum": (lambda x: x.cumsum(-1), lambda x: x.cumsum(-1)),
  "cumprod": (lambda x: x.cumprod(0), lambda x: x.cumprod(0), (0.5, 1.5)), "cummax": (lambda x: x.cummax(-1)[0], lambda x: x.cummax(-1)[0]),
  "cummin": (lambda x: x.cummin(0)[0], lambda x: x.cummin(0)[0]), "logcumsumexp": (lambda x: x.logcumsumexp(0), lambda x: x.logcumsumexp(0)),
  "softmax": (lambda x: x.softmax(-1), lambda x: x.softmax(-1)), "log_softmax": (lambda x: x.log_softmax(0), lambda x: x.log_softmax(0)),
  "softmin": (lambda x: x.softmin(-1), lambda x: F.softmin(x, -1)), "normalize": (lambda x: x.normalize(dim=-1), lambda x: F.normalize(x, dim=-1)),
  "flip": (lambda x: x.flip(0), lambda x: x.flip(0)), "transpose": (lambda x: x.transpose(0, -1), lambda x: x.transpose(0, -1)),
  "flatten": (lambda x: x.flatten(), torch.flatten), "reshape_none": (lambda x: x.reshape(None, -1), lambda x: x.reshape(x.shape[0], -1)),
  "pad": (lambda x: x.pad((1, 2)), lambda x: F.pad(x, (1, 2))), "roll": (lambda x: x.roll(1, 0), lambda x: x.roll(1, 0)),
  "repeat": (lambda x: x.repeat((2,) * x.ndim), lambda x: x.repeat((2,) * x.ndim)), "clone": (lambda x: x.clone(), lambda x: x.clone()),
  "getitem": (lambda x: x[::-1][..., :1], lambda x: x.flip(0)[..., :1]), "unsqueeze": (lambda x: x.unsqueeze(1), lambda x: x.unsqueeze(1)),
  "sort": (lambda x: x.sort(-1)[0], lambda x: torch.sort(x, dim=-1, stable=True)[0]),
  "topk": (lambda x: x.topk(1)[0], lambda x: torch.topk(x, 1)[0]), "unfold": (lambda x: x.unfold(0, 1, 1), lambda x: x.unfold(0, 1, 1)),
  "diagonal": (lambda x: x.reshape(x.shape[0], -1).diagonal(), lambda x: x.reshape(x.shape[0], -1).diagonal()),
  "stack": (lambda x: Tensor.stack((x, x * 2)).max(0), lambda x: torch.stack((x, x * 2)).amax(0)),
  "masked_fill": (lambda x: x.masked_fill(x > 0, 0.5), lambda x: x.masked_fill(x > 0, 0.5)),
}
BINARY = {
  "add": (lambda a, b: a + b, torch.add), "sub": (lambda a, b: a - b, torch.sub), "mul": (lambda a, b: a * b, torch.mul),
  "div": (lambda a, b: a / b, torch.div, (0.5, 2)), "pow": (lambda a, b: a ** b, torch.pow, (0.5, 2)),
  "maximum": (lambda a, b: a.maximum(b), torch.maximum), "minimum": (lambda a, b: a.minimum(b), torch.minimum),
  "copysign": (lambda a, b: a.copysign(b), torch.copysign), "fmod": (lambda a, b: a.fmod(b), torch.fmod, (0.5, 2)),
  "logaddexp": (lambda a, b: a.logaddexp(b), torch.logaddexp), "lerp": (lambda a, b: a.lerp(b, 0.3), lambda a, b: torch.lerp(a, b, 0.3)),
  "where": (lambda a, b: (a > b).where(a, b), lambda a, b: torch.where(a > b, a, b)),
  "cat": (lambda a, b: a.cat(b, dim=0), lambda a, b: torch.cat((a, b), 0)),
}


def _arrays(shape, n, rng_range, seed):
  lo, hi = rng_range
  r = np.random.default_rng(seed)
  return [r.uniform(lo, hi, size=shape) for _ in range(n)]


def _compare(fn, tfn, arrays):
  xs = [Tensor(a) for a in arrays]
  out = fn(*xs)
  txs = [torch.tensor(a, requires_grad=True) for a in arrays]
  tout = tfn(*txs)
  r = np.random.default_rng(1).uniform(-1, 1, size=tout.shape)
  grads = (out * Tensor(r)).sum().gradient(*xs)  # before realizing out: a realized tensor is a buffer, its graph is gone
  Tensor.realize_all(out, *grads)
  np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), atol=1e-6, rtol=1e-6, err_msg="forward")
  (tout * torch.tensor(r)).sum().backward()
  for i, (g, tx) in enumerate(zip(grads, txs)):
    np.testing.assert_allclose(g.numpy(), tx.grad.numpy(), atol=1e-6, rtol=1e-6, err_msg=f"gradient of input {i}")


@pytest.mark.parametrize("name", list(UNARY))
@SETTINGS
@given(shape=shapes, seed=seeds)
def test_unary_matches_torch(name, shape, seed):
  fn, tfn, *rng_range = UNARY[name]
  _compare(fn, tfn, _arrays(shape, 1, rng_range[0] if rng_range else (-2, 2), seed))


@pytest.mark.parametrize("name", list(BINARY))
@SETTINGS
@given(shape=shapes, seed=seeds)
def test_binary_matches_torch(name, shape, seed):
  fn, tfn, *rng_range = BINARY[name]
  _compare(fn, tfn, _arrays(shape, 2, rng_range[0] if rng_range else (-2, 2), seed))


@SETTINGS
@given(n=st.integers(1, 3), c=st.integers(2, 5), seed=seeds)
def test_losses_match_torch(n, c, seed):
  x = np.random.default_rng(seed).uniform(-2, 2, size=(n, c))
  y = np.random.default_rng(seed + 1).integers(0, c, size=n)
  _compare(lambda t: t.log_softmax(1).nll_loss(Tensor(y.astype(np.int32))), lambda t: F.nll_loss(F.log_softmax(t, 1), torch.tensor(y)), [x])
  _compare(lambda t: t.cross_entropy(Tensor(y.astype(np.int32))), lambda t: F.cross_entropy(t, torch.tensor(y)), [x])


@SETTINGS
@given(b=st.integers(1, 2), m=st.integers(1, 4), k=st.integers(1, 4), n=st.integers(1, 4), seed=seeds)
def test_matmul_conv_pool_match_torch(b, m, k, n, seed):
  a, w = _arrays((b, m, k), 1, (-1, 1), seed)[0], _arrays((k, n), 1, (-1, 1), seed + 1)[0]
  _compare(lambda x, y: x @ y, lambda x, y: x @ y, [a, w])
  img, ker = _arrays((b, 2, m + 2, n + 2), 1, (-1, 1), seed)[0], _arrays((3, 2, 2, 2), 1, (-1, 1), seed + 2)[0]
  _compare(lambda x, y: x.conv2d(y, padding=1), lambda x, y: F.conv2d(x, y, padding=1), [img, ker])
  _compare(lambda x: x.avg_pool2d(2), lambda x: F.avg_pool2d(x, 2), [img])
