"""plugrad.nn: layers as plain Python objects holding Tensors (tinygrad style: no Module base class).

Each layer's parameters are attributes named like torch/tinygrad (`weight`, `bias`, `running_mean`, ...), so
`plugrad.nn.state.get_state_dict` finds them by walking attributes and torch checkpoints map onto them by name.
Initialization follows tinygrad: kaiming_uniform(a=sqrt(5)) weights and uniform(+-1/sqrt(fan_in)) biases for
Linear/Conv, glorot_uniform for Embedding, ones/zeros for the norms. A layer is called on a Tensor: `layer(x)`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from plugrad.dtype import dtypes
from plugrad.uop.buffers import is_buffer_view
from plugrad.tensor import Tensor
from plugrad.tensor_ops.nn import grad_once
from plugrad.uop.ops import Ops, UOp


def _ks(v: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
  t = (v,) * n if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
  if not t or not all(isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in t):
    raise ValueError(f"{name} must be a positive int or a tuple of positive ints, got {v!r}")
  return t


def _check_channels(name: str, in_ch: int, out_ch: int, groups: int) -> None:
  if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1: raise ValueError(f"{name}: groups must be a positive int, got {groups!r}")
  if in_ch % groups: raise ValueError(f"{name}: in_channels={in_ch} must be divisible by groups={groups}")
  if out_ch % groups: raise ValueError(f"{name}: out_channels={out_ch} must be divisible by groups={groups}")


def _channel_shape(x: Tensor, name: str, c: int) -> tuple[int, ...]:
  """Shape that lays a per-channel (c,) parameter along axis 1 of x; checks x has c channels."""
  if x.ndim < 2 or x.shape[1] != c: raise RuntimeError(f"{name}: expected input with {c} channels on axis 1, got shape {x.shape}")
  return (1, c) + (1,) * (x.ndim - 2)


class Linear:
  """y = x @ weight.T + bias with weight (out_features, in_features), like torch."""
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    bound = 1 / math.sqrt(in_features)
    self.weight = Tensor.kaiming_uniform(out_features, in_features, a=math.sqrt(5))
    self.bias = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim == 0 or x.shape[-1] != self.weight.shape[1]:
      raise RuntimeError(f"Linear: input shape {x.shape} doesn't end in in_features={self.weight.shape[1]}")
    return x.linear(self.weight.transpose(), self.bias)


class Conv2d:
  """torch's Conv2d (also N-d when kernel_size is a tuple of another length): weight (out, in/groups, *kernel).
  padding: int, tuple, or 'same'/'valid'."""
  _nd = 2
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
               padding: int | Sequence[int] | str = 0, dilation: int | Sequence[int] = 1, groups: int = 1, bias: bool = True):
    _check_channels(type(self).__name__, in_channels, out_channels, groups)
    self.kernel_size = _ks(kernel_size, self._nd, "kernel_size")
    self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
    self.weight = Tensor.kaiming_uniform(out_channels, in_channels // groups, *self.kernel_size, a=math.sqrt(5))
    bound = 1 / math.sqrt(math.prod(self.weight.shape[1:]))
    self.bias = Tensor.uniform(out_channels, low=-bound, high=bound) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


class Conv1d(Conv2d):
  """torch's Conv1d: x (N, C, L), weight (out, in/groups, k)."""
  _nd = 1


class ConvTranspose2d:
  """torch's ConvTranspose2d: weight (in, out/groups, *kernel)."""
  _nd = 2
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
               padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
               groups: int = 1, bias: bool = True):
    _check_channels(type(self).__name__, in_channels, out_channels, groups)
    self.kernel_size = _ks(kernel_size, self._nd, "kernel_size")
    self.stride, self.padding, self.output_padding, self.dilation, self.groups = stride, padding, output_padding, dilation, groups
    self.weight = Tensor.kaiming_uniform(in_channels, out_channels // groups, *self.kernel_size, a=math.sqrt(5))
    bound = 1 / math.sqrt(math.prod(self.weight.shape[1:]))
    self.bias = Tensor.uniform(out_channels, low=-bound, high=bound) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding, self.output_padding)


class ConvTranspose1d(ConvTranspose2d):
  _nd = 1


class BatchNorm:
  """Batch normalization over every axis but 1 (channels). In training mode (`Tensor.training`) it normalizes with
  the batch statistics and, with track_running_stats, updates running_mean/running_var in place (running_var with the
  unbiased batch variance, like torch) and counts num_batches_tracked; in eval mode it uses the running statistics."""
  def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float = 0.1):
    self.eps, self.track_running_stats, self.momentum, self.num_features = eps, track_running_stats, momentum, sz
    self.weight: Tensor | None = Tensor.ones(sz) if affine else None
    self.bias: Tensor | None = Tensor.zeros(sz) if affine else None
    self.num_batches_tracked = Tensor.zeros(1, dtype=dtypes.int64, requires_grad=False)
    if track_running_stats: self.running_mean, self.running_var = Tensor.zeros(sz, requires_grad=False), Tensor.ones(sz, requires_grad=False)

  def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, biased variance) per channel: the running ones in eval mode, the batch's in training mode."""
    shape = _channel_shape(x, type(self).__name__, self.num_features)
    if self.track_running_stats and not Tensor.training: return self.running_mean, self.running_var
    axes = tuple(i for i in range(x.ndim) if i != 1)
    mean = x.mean(axis=axes)
    y = x - mean.detach().reshape(shape)  # the variance's gradient through the mean is zero
    return mean, (y * y).mean(axis=axes)

  def __call__(self, x: Tensor) -> Tensor:
    mean, var = self.calc_stats(x)
    if self.track_running_stats and Tensor.training:
      n = x.numel() // x.shape[1]
      if n <= 1: raise ValueError(f"{type(self).__name__}: expected more than 1 value per channel when training, got input shape {x.shape}")
      m = self.momentum
      self.running_mean.assign(((1 - m) * self.running_mean + m * mean.detach()).cast(self.running_mean.dtype))
      self.running_var.assign(((1 - m) * self.running_var + (m * n / (n - 1)) * var.detach()).cast(self.running_var.dtype))
      self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    invstd = (var + self.eps).rsqrt()
    out = x.batchnorm(self.weight, self.bias, mean, invstd)
    if (self.track_running_stats and not Tensor.training) or not dtypes.is_float(out.dtype) or any(not isinstance(s, int) for s in x.shape) \
       or any(t is not None and t.uop.op is Ops.MULTI for t in (x, self.weight, self.bias)): return out
    # the batch statistics' gradient in closed form (torch's): two reductions instead of autograd's four
    params = tuple(t for t in (self.weight, self.bias) if t is not None)
    vjp = _BatchNormVJP(self.weight is not None, self.bias is not None)
    return Tensor(UOp(Ops.CUSTOM_GRAD, out.dtype, (out.uop, x.uop, mean.uop, invstd.uop, *(t.uop for t in params)), vjp))


@dataclass(frozen=True)
class _BatchNormVJP:
  """The vector-Jacobian product of a BatchNorm over its batch statistics (the arg of its CUSTOM_GRAD node, whose
  sources are the value, x, the per-channel mean and inverse standard deviation, then the weight and the bias where
  present), over every axis but 1: with xhat = (x - mean) * invstd and n values a channel,
  dx = weight * invstd / n * (n * g - sum(g) - xhat * sum(g * xhat)), dweight = sum(g * xhat), dbias = sum(g).
  Autograd through the statistics' own graphs computed four full-size reductions for the same (BatchNorm + ReLU
  backward); this is two."""
  weight: bool
  bias: bool
  def __call__(self, ctx: UOp, ret: UOp) -> tuple:
    x, mean, invstd, *params = (Tensor(u) for u in ret.src[1:])
    g, weight = grad_once(Tensor, ctx), params[0] if self.weight else None   # read by the two sums and dx
    shape, axes = (1, x.shape[1]) + (1,) * (x.ndim - 2), tuple(i for i in range(x.ndim) if i != 1)
    n = math.prod(x.shape) // x.shape[1]
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    gsum, gxsum = g.sum(axis=axes), (g * xhat).sum(axis=axes)
    scale = (invstd if weight is None else invstd * weight).reshape(shape)
    dx = (scale * (g * n - gsum.reshape(shape) - xhat * gxsum.reshape(shape)) / n).cast(x.dtype)
    grads = ([gxsum.cast(weight.dtype).uop] if weight is not None else []) + ([gsum.cast(params[-1].dtype).uop] if self.bias else [])
    return (None, dx.uop, None, None, *grads)


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
  """Normalizes over the trailing `normalized_shape` dims; weight/bias of that shape when elementwise_affine."""
  def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True):
    self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    self.axis, self.eps, self.elementwise_affine = tuple(-1 - i for i in range(len(self.normalized_shape))), eps, elementwise_affine
    self.weight = Tensor.ones(*self.normalized_shape) if elementwise_affine else None
    self.bias = Tensor.zeros(*self.normalized_shape) if elementwise_affine else None

  def __call__(self, x: Tensor) -> Tensor:
    n = len(self.normalized_shape)
    if x.ndim < n or tuple(x.shape[x.ndim - n:]) != self.normalized_shape:
      raise RuntimeError(f"LayerNorm: input shape {x.shape} doesn't end in normalized_shape {self.normalized_shape}")
    x = x.layernorm(eps=self.eps, axis=self.axis)
    return x if self.weight is None else x * self.weight + self.bias


class LayerNorm2d(LayerNorm):
  """LayerNorm over the channel axis 1 of (N, C, H, W) input."""
  def __call__(self, x: Tensor) -> Tensor: return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RMSNorm:
  """x / sqrt(mean(x^2, last axis) + eps) * weight, computed in float32 (at least) and cast back to x's dtype."""
  def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
    self.eps, self.dim = eps, dim
    self.weight = Tensor.ones(dim) if elementwise_affine else None

  def _norm(self, x: Tensor) -> Tensor: return x * ((x * x).mean(-1, keepdim=True) + self.eps).rsqrt()

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim == 0 or x.shape[-1] != self.dim: raise RuntimeError(f"RMSNorm: input shape {x.shape} doesn't end in dim={self.dim}")
    y = self._norm(x.cast(dtypes.float32) if x.dtype.itemsize < 4 or not dtypes.is_float(x.dtype) else x).cast(x.dtype)
    return y if self.weight is None else y * self.weight


class GroupNorm:
  """Normalizes each of num_groups channel groups over (channels in group, spatial); per-channel affine."""
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    if num_groups < 1 or num_channels % num_groups:
      raise ValueError(f"{type(self).__name__}: num_channels={num_channels} must be divisible by num_groups={num_groups}")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight = Tensor.ones(num_channels) if affine else None
    self.bias = Tensor.zeros(num_channels) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    shape = _channel_shape(x, type(self).__name__, self.num_channels)
    x = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
    return x if self.weight is None else x * self.weight.reshape(shape) + self.bias.reshape(shape)


class InstanceNorm(GroupNorm):
  """Normalizes each (sample, channel) over the spatial dims; per-channel affine (GroupNorm with one channel a group)."""
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
    super().__init__(num_features, num_features, eps, affine)
    self.num_features = num_features


class Embedding:
  """Row lookup weight[idx] as a one-hot select and sum (one kernel, no gather op). Indices must be in
  [0, vocab_size): a realized index tensor is checked on the host (IndexError); lazy out-of-range indices give zeros."""
  def __init__(self, vocab_size: int, embed_size: int):
    self.vocab_sz, self.embed_sz = vocab_size, embed_size
    self.weight = Tensor.glorot_uniform(vocab_size, embed_size)

  def __call__(self, idx: Tensor) -> Tensor:
    if not dtypes.is_int(idx.dtype): raise TypeError(f"Embedding: indices must be an int tensor, got {idx.dtype}")
    if idx.numel() and is_buffer_view(idx.uop):
      vals = idx.numpy()
      lo, hi = int(vals.min()), int(vals.max())
      if lo < 0 or hi >= self.vocab_sz:
        raise IndexError(f"Embedding: index {lo if lo < 0 else hi} is out of range for vocab_size={self.vocab_sz}")
    hit = idx.unsqueeze(-1) == Tensor.arange(self.vocab_sz, dtype=idx.dtype, device=idx.device)
    return hit.unsqueeze(-1).where(self.weight, 0).sum(-2, dtype=self.weight.dtype)


class LSTMCell:
  """One LSTM step: (h, c) = cell(x, (h, c)) with gates i, f, g, o in that order (torch layout); hc=None starts at zeros."""
  def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
    stdv = 1.0 / math.sqrt(hidden_size)
    self.weight_ih = Tensor.uniform(hidden_size * 4, input_size, low=-stdv, high=stdv)
    self.weight_hh = Tensor.uniform(hidden_size * 4, hidden_size, low=-stdv, high=stdv)
    self.bias_ih = Tensor.uniform(hidden_size * 4, low=-stdv, high=stdv) if bias else None
    self.bias_hh = Tensor.uniform(hidden_size * 4, low=-stdv, high=stdv) if bias else None

  def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    hs = self.weight_hh.shape[1]
    if x.ndim != 2 or x.shape[1] != self.weight_ih.shape[1]:
      raise RuntimeError(f"LSTMCell: expected input (batch, {self.weight_ih.shape[1]}), got shape {x.shape}")
    if hc is None: hc = (Tensor.zeros(x.shape[0], hs, dtype=x.dtype, device=x.device),) * 2
    for t in hc:
      if tuple(t.shape) != (x.shape[0], hs): raise RuntimeError(f"LSTMCell: hidden/cell state must be ({x.shape[0]}, {hs}), got {t.shape}")
    gates = x.linear(self.weight_ih.transpose(), self.bias_ih) + hc[0].linear(self.weight_hh.transpose(), self.bias_hh)
    i, f, g, o = gates.chunk(4, dim=1)
    c = f.sigmoid() * hc[1] + i.sigmoid() * g.tanh()
    return (o.sigmoid() * c.tanh()).contiguous(), c.contiguous()


__all__ = ["Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "BatchNorm", "BatchNorm1d", "BatchNorm2d",
           "BatchNorm3d", "LayerNorm", "LayerNorm2d", "RMSNorm", "GroupNorm", "InstanceNorm", "Embedding", "LSTMCell"]
