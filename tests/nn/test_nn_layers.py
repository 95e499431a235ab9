"""plugrad.nn layers: forward passes against numpy references written here, running statistics, init shapes/bounds,
and bad-input errors. Torch (when installed) is a second oracle."""
import math

import numpy as np
import pytest

from plugrad import nn
from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

RNG = np.random.default_rng(0)


def rnd(*shape, lo=-1.0, hi=1.0): return RNG.uniform(lo, hi, shape).astype(np.float32)


def close(a, b, atol=1e-5, rtol=1e-5): np.testing.assert_allclose(a, b, atol=atol, rtol=rtol)


def set_params(layer, **vals):
  """Overwrite layer params with known numpy values (returns them)."""
  for k, v in vals.items(): setattr(layer, k, Tensor(v))
  return vals


# ***** numpy references *****
def np_conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
  nd = w.ndim - 2
  st, pd, dl = [(v,) * nd if isinstance(v, int) else tuple(v) for v in (stride, padding, dilation)]
  x = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pd])
  n, cin = x.shape[:2]
  cout, cing, ks = w.shape[0], w.shape[1], w.shape[2:]
  outs = [(x.shape[2 + i] - dl[i] * (ks[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
  out = np.zeros((n, cout, *outs), np.float64)
  og = cout // groups
  for o in range(cout):
    g = o // og
    xs = x[:, g * cing:(g + 1) * cing]
    for pos in np.ndindex(*outs):
      for kk in np.ndindex(*ks):
        idx = tuple(pos[i] * st[i] + kk[i] * dl[i] for i in range(nd))
        out[(slice(None), o, *pos)] += (xs[(slice(None), slice(None), *idx)] * w[(o, slice(None), *kk)]).sum(1)
  if b is not None: out += b.reshape(1, -1, *[1] * nd)
  return out


def np_conv_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
  nd = w.ndim - 2
  st, pd, op, dl = [(v,) * nd if isinstance(v, int) else tuple(v) for v in (stride, padding, output_padding, dilation)]
  n, cin, ins = x.shape[0], x.shape[1], x.shape[2:]
  cog, ks = w.shape[1], w.shape[2:]
  cig = cin // groups
  full = [(ins[i] - 1) * st[i] + dl[i] * (ks[i] - 1) + 1 + op[i] for i in range(nd)]
  out = np.zeros((n, cog * groups, *full), np.float64)
  for c in range(cin):
    g = c // cig
    for pos in np.ndindex(*ins):
      for kk in np.ndindex(*ks):
        o = tuple(pos[i] * st[i] + kk[i] * dl[i] for i in range(nd))
        out[(slice(None), slice(g * cog, (g + 1) * cog), *o)] += x[(slice(None), c, *pos)][:, None] * w[(c, slice(None), *kk)][None]
  out = out[(slice(None), slice(None), *[slice(pd[i], full[i] - pd[i]) for i in range(nd)])]
  if b is not None: out += b.reshape(1, -1, *[1] * nd)
  return out


def np_norm(x, axes, eps):
  m = x.mean(axes, keepdims=True)
  return (x - m) / np.sqrt(((x - m) ** 2).mean(axes, keepdims=True) + eps)


# ***** Linear / Conv *****
def test_linear():
  lin = nn.Linear(5, 3)
  assert lin.weight.shape == (3, 5) and lin.bias.shape == (3,)
  w, b = lin.weight.numpy(), lin.bias.numpy()
  assert np.abs(w).max() <= 1 / math.sqrt(5) + 1e-6 and np.abs(b).max() <= 1 / math.sqrt(5) + 1e-6  # kaiming_uniform(a=sqrt 5) bound
  assert np.std(w) > 0
  x = rnd(2, 4, 5)
  close(lin(Tensor(x)).numpy(), x @ w.T + b)
  assert nn.Linear(5, 3, bias=False).bias is None
  with pytest.raises(RuntimeError, match="in_features=5"): lin(Tensor(rnd(2, 4)))


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1, dilation=2, groups=2)])
def test_conv2d(kw):
  conv = nn.Conv2d(4, 6, 3, **kw)
  assert conv.weight.shape == (6, 4 // kw.get("groups", 1), 3, 3) and conv.bias.shape == (6,)
  x = rnd(1, 4, 6, 5)
  close(conv(Tensor(x)).numpy(), np_conv(x, conv.weight.numpy(), conv.bias.numpy(), **kw), atol=1e-4)


def test_conv2d_rect_kernel_no_bias_and_errors():
  conv = nn.Conv2d(2, 3, (1, 3), padding=(0, 1), bias=False)
  assert conv.bias is None and conv.weight.shape == (3, 2, 1, 3)
  x = rnd(1, 2, 3, 4)
  close(conv(Tensor(x)).numpy(), np_conv(x, conv.weight.numpy(), padding=(0, 1)), atol=1e-5)
  with pytest.raises(ValueError, match="divisible by groups"): nn.Conv2d(3, 4, 3, groups=2)
  with pytest.raises(ValueError, match="kernel_size"): nn.Conv2d(3, 4, 0)
  with pytest.raises(RuntimeError, match="channels"): conv(Tensor(rnd(1, 3, 4, 4)))


def test_conv1d():
  conv = nn.Conv1d(3, 4, 3, stride=2, padding=1)
  assert conv.weight.shape == (4, 3, 3)
  x = rnd(2, 3, 9)
  close(conv(Tensor(x)).numpy(), np_conv(x, conv.weight.numpy(), conv.bias.numpy(), stride=2, padding=1), atol=1e-5)


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1, output_padding=1, groups=2, dilation=2)])
def test_conv_transpose2d(kw):
  conv = nn.ConvTranspose2d(4, 6, 2, **kw)
  assert conv.weight.shape == (4, 6 // kw.get("groups", 1), 2, 2)
  x = rnd(1, 4, 2, 3)
  close(conv(Tensor(x)).numpy(), np_conv_transpose(x, conv.weight.numpy(), conv.bias.numpy(), **kw), atol=1e-4)


def test_conv_transpose1d():
  conv = nn.ConvTranspose1d(2, 3, 2, stride=2)
  x = rnd(1, 2, 4)
  close(conv(Tensor(x)).numpy(), np_conv_transpose(x, conv.weight.numpy(), conv.bias.numpy(), stride=2), atol=1e-5)


# ***** BatchNorm *****
def test_batchnorm_train_eval_and_running_stats():
  bn = nn.BatchNorm2d(3, momentum=0.2)
  assert bn.running_mean.numpy().tolist() == [0, 0, 0] and bn.running_var.numpy().tolist() == [1, 1, 1]
  assert bn.num_batches_tracked.dtype == dtypes.int64 and bn.num_batches_tracked.numpy().tolist() == [0]
  w, b = set_params(bn, weight=rnd(3), bias=rnd(3)).values()
  rm, rv = np.zeros(3), np.ones(3)
  xs = [rnd(4, 3, 2, 3, lo=0, hi=2), rnd(4, 3, 2, 3, lo=-1, hi=3)]
  with Tensor.train():
    for x in xs:
      out = bn(Tensor(x)).numpy()
      close(out, np_norm(x, (0, 2, 3), 1e-5) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1), atol=1e-4)
      rm = 0.8 * rm + 0.2 * x.mean((0, 2, 3))
      rv = 0.8 * rv + 0.2 * x.var((0, 2, 3), ddof=1)
  close(bn.running_mean.numpy(), rm, atol=1e-5)
  close(bn.running_var.numpy(), rv, atol=1e-5)
  assert bn.num_batches_tracked.numpy().tolist() == [2]
  x = rnd(2, 3, 2, 2)
  with Tensor.train(False):  # eval: running stats, no update
    out = bn(Tensor(x)).numpy()
  ref = (x - rm.reshape(1, 3, 1, 1)) / np.sqrt(rv.reshape(1, 3, 1, 1) + 1e-5) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)
  close(out, ref, atol=1e-4)
  close(bn.running_mean.numpy(), rm, atol=1e-5)
  assert bn.num_batches_tracked.numpy().tolist() == [2]


def test_batchnorm_1d_no_affine_no_tracking():
  bn = nn.BatchNorm1d(4, affine=False, track_running_stats=False, eps=1e-3)
  assert bn.weight is None and bn.bias is None and not hasattr(bn, "running_mean")
  x = rnd(5, 4)
  close(bn(Tensor(x)).numpy(), np_norm(x, (0,), 1e-3), atol=1e-4)  # batch stats even in eval
  x3 = rnd(2, 4, 3)
  with Tensor.train(): close(bn(Tensor(x3)).numpy(), np_norm(x3, (0, 2), 1e-3), atol=1e-4)


@pytest.mark.parametrize("shape,affine,train", [((6, 3, 4, 5), True, True), ((7, 4), False, True), ((3, 2, 4, 2, 3), True, True),
                                                ((6, 3, 4, 5), True, False)])
def test_batchnorm_gradients_match_torch(shape, affine, train):
  """Input, weight and bias gradients of BatchNorm (then a ReLU, so the output gradient is an expression) against
  torch float64: over the batch statistics (train) through the closed-form CUSTOM_GRAD, over the running ones (eval)
  through autograd."""
  torch = pytest.importorskip("torch", reason="PyTorch is not installed (the oracle of this test)")
  rng = np.random.default_rng(4)
  c = shape[1]
  x, dy, w, b = rng.standard_normal(shape), rng.standard_normal(shape), rng.uniform(0.5, 1.5, c), rng.standard_normal(c)
  rm, rv = rng.standard_normal(c) * 0.1, rng.uniform(0.5, 2, c)
  bn = nn.BatchNorm(c, affine=affine)
  px = Tensor(x, requires_grad=True)
  if affine: bn.weight, bn.bias = Tensor(w, requires_grad=True), Tensor(b, requires_grad=True)
  bn.running_mean, bn.running_var = Tensor(rm), Tensor(rv)
  with Tensor.train(train):
    bn(px).relu().backward(Tensor(dy))
  tx = torch.tensor(x, requires_grad=True)
  tw, tb = (torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)) if affine else (None, None)
  ty = torch.nn.functional.batch_norm(tx, torch.tensor(rm), torch.tensor(rv), tw, tb, training=train)
  torch.relu(ty).backward(torch.tensor(dy))
  close(px.grad.numpy(), tx.grad.numpy(), atol=1e-9, rtol=1e-9)
  if affine:
    close(bn.weight.grad.numpy(), tw.grad.numpy(), atol=1e-9, rtol=1e-9)
    close(bn.bias.grad.numpy(), tb.grad.numpy(), atol=1e-9, rtol=1e-9)


def test_batchnorm_errors():
  bn = nn.BatchNorm(3)
  with pytest.raises(RuntimeError, match="3 channels"): bn(Tensor(rnd(2, 4, 2)))
  with Tensor.train(), pytest.raises(ValueError, match="more than 1 value per channel"): bn(Tensor(rnd(1, 3)))


# ***** other norms *****
def test_layernorm():
  ln = nn.LayerNorm((3, 4), eps=1e-4)
  assert ln.weight.shape == (3, 4)
  w, b = set_params(ln, weight=rnd(3, 4), bias=rnd(3, 4)).values()
  x = rnd(2, 3, 4, lo=-3, hi=5)
  close(ln(Tensor(x)).numpy(), np_norm(x, (1, 2), 1e-4) * w + b, atol=1e-4)
  ln2 = nn.LayerNorm(4, elementwise_affine=False)
  assert ln2.weight is None
  close(ln2(Tensor(x)).numpy(), np_norm(x, (2,), 1e-5), atol=1e-4)
  with pytest.raises(RuntimeError, match="normalized_shape"): ln(Tensor(rnd(3, 5)))


def test_layernorm2d():
  ln = nn.LayerNorm2d(3)
  w, b = set_params(ln, weight=rnd(3), bias=rnd(3)).values()
  x = rnd(2, 3, 2, 2)
  close(ln(Tensor(x)).numpy(), np_norm(x, (1,), 1e-5) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1), atol=1e-4)


def half_ok():
  try: return (Tensor(np.ones(2, np.float16)) * 2).numpy().tolist() == [2, 2]
  except Exception: return False


def test_rmsnorm():
  rms = nn.RMSNorm(4)
  w = set_params(rms, weight=rnd(4))["weight"]
  x = rnd(3, 4)
  close(rms(Tensor(x)).numpy(), x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * w, atol=1e-5)
  x64 = x.astype(np.float64)
  out = nn.RMSNorm(4, eps=1e-3, elementwise_affine=False)(Tensor(x64))
  assert out.dtype == dtypes.float64
  close(out.numpy(), x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-3), atol=1e-12)
  with pytest.raises(RuntimeError, match="dim=4"): rms(Tensor(rnd(4, 3)))


def test_rmsnorm_half():
  if not half_ok(): pytest.skip("float16 kernels don't compile on this device")
  xh = rnd(2, 4).astype(np.float16)
  out = nn.RMSNorm(4, elementwise_affine=False)(Tensor(xh))
  assert out.dtype == dtypes.float16
  xf = xh.astype(np.float32)
  close(out.numpy().astype(np.float32), xf / np.sqrt((xf ** 2).mean(-1, keepdims=True) + 1e-6), atol=2e-3, rtol=2e-3)


def test_groupnorm():
  gn = nn.GroupNorm(2, 4)
  w, b = set_params(gn, weight=rnd(4), bias=rnd(4)).values()
  x = rnd(3, 4, 2, 3, lo=-2, hi=4)
  ref = np_norm(x.reshape(3, 2, -1), (2,), 1e-5).reshape(x.shape) * w.reshape(1, 4, 1, 1) + b.reshape(1, 4, 1, 1)
  close(gn(Tensor(x)).numpy(), ref, atol=1e-4)
  with pytest.raises(ValueError, match="divisible by num_groups"): nn.GroupNorm(3, 4)
  with pytest.raises(RuntimeError, match="4 channels"): gn(Tensor(rnd(1, 3, 2)))


def test_instancenorm():
  inn = nn.InstanceNorm(3)
  w, b = set_params(inn, weight=rnd(3), bias=rnd(3)).values()
  x = rnd(2, 3, 4, 2)
  close(inn(Tensor(x)).numpy(), np_norm(x, (2, 3), 1e-5) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1), atol=1e-4)
  close(nn.InstanceNorm(3, affine=False)(Tensor(x)).numpy(), np_norm(x, (2, 3), 1e-5), atol=1e-4)


# ***** Embedding / LSTMCell *****
def test_embedding():
  emb = nn.Embedding(6, 3)
  w = emb.weight.numpy()
  assert w.shape == (6, 3) and np.abs(w).max() <= math.sqrt(6 / 9) + 1e-6  # glorot bound
  idx = np.array([[0, 5, 2], [3, 3, 1]], np.int32)
  close(emb(Tensor(idx)).numpy(), w[idx], atol=0)
  close(emb(Tensor(np.array(4, np.int64))).numpy(), w[4], atol=0)
  with pytest.raises(IndexError, match="index 6 is out of range for vocab_size=6"): emb(Tensor([1, 6]))
  with pytest.raises(IndexError, match="index -1"): emb(Tensor([-1, 2]))
  with pytest.raises(TypeError, match="int tensor"): emb(Tensor([1.0]))


def np_sigmoid(x): return 1 / (1 + np.exp(-x))


def np_lstm(x, h, c, wih, whh, bih, bhh):
  gates = x @ wih.T + h @ whh.T + (bih + bhh if bih is not None else 0)
  i, f, g, o = np.split(gates, 4, axis=1)
  c2 = np_sigmoid(f) * c + np_sigmoid(i) * np.tanh(g)
  return np_sigmoid(o) * np.tanh(c2), c2


@pytest.mark.parametrize("bias", [True, False])
def test_lstmcell(bias):
  cell = nn.LSTMCell(3, 4, bias=bias)
  assert cell.weight_ih.shape == (16, 3) and cell.weight_hh.shape == (16, 4)
  assert (cell.bias_ih is None) == (not bias)
  ws = [cell.weight_ih.numpy(), cell.weight_hh.numpy()] + ([cell.bias_ih.numpy(), cell.bias_hh.numpy()] if bias else [None, None])
  assert np.abs(ws[0]).max() <= 0.5 + 1e-6  # uniform(+-1/sqrt(hidden))
  x, h, c = rnd(2, 3), rnd(2, 4), rnd(2, 4)
  h1, c1 = cell(Tensor(x), (Tensor(h), Tensor(c)))
  rh, rc = np_lstm(x, h, c, *ws)
  close(h1.numpy(), rh, atol=1e-5)
  close(c1.numpy(), rc, atol=1e-5)
  h0, c0 = cell(Tensor(x))
  rh, rc = np_lstm(x, np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32), *ws)
  close(h0.numpy(), rh, atol=1e-5)
  close(c0.numpy(), rc, atol=1e-5)


def test_lstmcell_errors():
  cell = nn.LSTMCell(3, 4)
  with pytest.raises(RuntimeError, match=r"\(batch, 3\)"): cell(Tensor(rnd(2, 5)))
  with pytest.raises(RuntimeError, match=r"\(2, 4\)"): cell(Tensor(rnd(2, 3)), (Tensor(rnd(2, 3)), Tensor(rnd(2, 4))))


# ***** torch as a second oracle (skipped when torch isn't installed) *****
def test_against_torch():
  torch = pytest.importorskip("torch")
  x = rnd(3, 4, 5, 5)
  conv = nn.Conv2d(4, 2, 3, stride=2, padding=1)
  tc = torch.nn.Conv2d(4, 2, 3, stride=2, padding=1)
  with torch.no_grad():
    tc.weight[:], tc.bias[:] = torch.tensor(conv.weight.numpy()), torch.tensor(conv.bias.numpy())
  close(conv(Tensor(x)).numpy(), tc(torch.tensor(x)).detach().numpy(), atol=1e-4)
  bn, tbn = nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)
  with Tensor.train(): out = bn(Tensor(x)).numpy()
  close(out, tbn.train()(torch.tensor(x)).detach().numpy(), atol=1e-4)
  close(bn.running_var.numpy(), tbn.running_var.numpy(), atol=1e-5)
  close(bn.running_mean.numpy(), tbn.running_mean.numpy(), atol=1e-5)
