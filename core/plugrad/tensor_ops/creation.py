"""Tensor ops mixin: creation. Methods here are written only in terms of Tensor's primitives (see plugrad/tensor.py).

Random numbers come from Threefry-2x32 (20 rounds, Random123) computed on the device with uint32 ops: each call is
keyed by (seed, call counter) and hashes an arange of counters, so `manual_seed(s)` followed by the same calls
reproduces the same values on every device.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from plugrad.uop.ops import UOp
from plugrad.uop.symbolic import sint
from plugrad.errors import TensorError
from plugrad.dtype import DType, dtypes, to_dtype
from plugrad.uop.ops import Ops

_ROT = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA
_MASK = 0xFFFFFFFF


def _shape(shape: tuple) -> tuple:
  shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
  for s in shape:
    if isinstance(s, bool) or (isinstance(s, int) and s < 0) or not isinstance(s, (int, UOp)):
      raise TensorError(f"invalid shape {shape}: dimensions must be non-negative ints")
  return shape


def _bit_arange(Tensor: Any, n: int, device: str | None) -> Any:
  """int32 [0, n) (int64 past 2**31) built reduce-free: the sum over bits b of 2**b * (a periodic 0/1 pattern made of
  padded ones)."""
  dt = dtypes.int32 if n <= 2 ** 31 else dtypes.int64
  if n <= 1: return Tensor.zeros(n, dtype=dt, device=device)
  k = (n - 1).bit_length()
  ret = None
  for b in range(k):
    half = 1 << b
    bit = Tensor.full((half,), half, dt, device)._pad(((half, 0),))  # period 2**(b+1): half zeros, half 2**b
    bit = bit.reshape(1, 2 * half).expand(1 << (k - b - 1), 2 * half).reshape(1 << k).shrink(((0, n),))
    ret = bit if ret is None else ret._alu(Ops.ADD, bit)
  return ret


def _u32(x: Any, v: int) -> Any: return x._const_like(v & _MASK, dtypes.uint32)


def _rotl(x: Any, r: int) -> Any:
  return x._alu(Ops.SHL, _u32(x, r))._alu(Ops.OR, x._alu(Ops.SHR, _u32(x, 32 - r)))


def _addk(x: Any, k: Any) -> Any:
  """x + k (uint32, wrapping) for a Python int or a 0-d uint32 tensor k."""
  return x._alu(Ops.ADD, _u32(x, k) if isinstance(k, int) else k._expand_to(x.shape))


def threefry2x32(x0: Any, x1: Any, k0: Any, k1: Any) -> tuple[Any, Any]:
  """Threefry-2x32 with 20 rounds of the uint32 counter tensors (x0, x1) under the key (k0, k1): Python ints, or 0-d
  uint32 tensors (then the key is loaded, not baked into the kernel, so new keys don't compile new kernels)."""
  if isinstance(k0, int) and isinstance(k1, int): ks = (k0 & _MASK, k1 & _MASK, (_PARITY ^ k0 ^ k1) & _MASK)
  else: ks = (k0, k1, k0._alu(Ops.XOR, k1)._alu(Ops.XOR, _u32(k0, _PARITY)))
  x0, x1 = _addk(x0, ks[0]), _addk(x1, ks[1])
  for r in range(20):
    x0 = x0._alu(Ops.ADD, x1)
    x1 = _rotl(x1, _ROT[r % 8])._alu(Ops.XOR, x0)
    if r % 4 == 3:
      i = r // 4 + 1
      x0, x1 = _addk(x0, ks[i % 3]), _addk(_addk(x1, ks[(i + 1) % 3]), i)
  return x0, x1


def _float_bits(dt: DType) -> int:
  """How many random bits fit a float dtype exactly in [0, 1) (23 for float32 and wider)."""
  return min(23, dtypes.finfo(dt)[1] + 1)


class CreationMixin:
  __slots__ = ()
  _seed: int = int(time.time())
  _device_rng_counter: int = 0

  # ***** *_like *****
  def zeros_like(self, **kw) -> Any: return self.full_like(0, **kw)
  def ones_like(self, **kw) -> Any: return self.full_like(1, **kw)
  def full_like(self, fill_value, **kw) -> Any:
    return type(self).full(self.shape, fill_value, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device), **kw)
  def empty_like(self, **kw) -> Any:
    return type(self).empty(self.shape, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device), **kw)
  def rand_like(self, **kw) -> Any:
    return type(self).rand(self.shape, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device), **kw)
  def randn_like(self, **kw) -> Any:
    return type(self).randn(self.shape, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device), **kw)

  # ***** ranges *****
  @classmethod
  def arange(cls, start, stop=None, step=1, dtype: DType | str | None = None, device: str | None = None, **kw) -> Any:
    """Values from start (inclusive) to stop (exclusive) by step; int dtype for int arguments, float otherwise."""
    if stop is None: start, stop = 0, start
    if isinstance(stop, UOp):  # symbolic length: the first `stop` values of an arange of its largest value
      if start != 0 or step != 1: raise TensorError("a symbolic arange supports only arange(stop) with start 0, step 1")
      idx = _bit_arange(cls, int(stop.vmax), device).shrink(((0, stop),))
      return idx.cast(to_dtype(dtype)) if dtype is not None else idx
    for v in (start, stop, step):
      if isinstance(v, bool) or not isinstance(v, (int, float)): raise TypeError(f"arange arguments must be numbers, got {v!r}")
    if step == 0: raise TensorError("arange step must be nonzero")
    if not all(math.isfinite(v) for v in (start, stop, step)):
      raise TensorError(f"arange bounds and step must be finite, got {start}, {stop}, {step}")
    isfloat = any(isinstance(v, float) for v in (start, stop, step))
    n = max(0, math.ceil((stop - start) / step))
    last = start + (n - 1) * step if n else start
    big = not isfloat and not all(dtypes.min(dtypes.default_int) <= v <= dtypes.max(dtypes.default_int) for v in (start, last))
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float if isfloat else dtypes.int64 if big else dtypes.default_int
    if n and dtypes.is_int(dt) and not all(dtypes.min(dt) <= v <= dtypes.max(dt) for v in (start, last)):  # tinygrad; torch wraps
      raise OverflowError(f"arange({start}, {stop}, {step}) runs from {start} to {last}, outside {dt}'s range "
                          f"{dtypes.min(dt)}..{dtypes.max(dt)}")
    idx = _bit_arange(cls, n, device)
    if dtypes.is_float(dt) or isfloat:
      acc = dt if dtypes.is_float(dt) else dtypes.default_float
      ret = idx.cast(acc) * step + start if (start, step) != (0, 1) else idx.cast(acc)
    else: ret = idx.cast(dt) * step + start if (start, step) != (0, 1) else idx.cast(dt)
    ret = ret.cast(dt)
    if kw.get("requires_grad") is not None: ret.requires_grad = kw["requires_grad"]
    return ret

  def triu(self, diagonal: sint = 0) -> Any:
    """The upper triangle of the last two dims: elements with column - row >= diagonal, others 0 (symbolic sizes and
    diagonals allowed)."""
    return self._tri(diagonal, upper=True)

  def tril(self, diagonal: sint = 0) -> Any:
    """The lower triangle of the last two dims: elements with column - row <= diagonal, others 0."""
    return self._tri(diagonal, upper=False)

  def _tri(self, diagonal: sint, upper: bool) -> Any:
    if self.ndim < 2: raise TensorError(f"triu/tril need at least 2 dims, got shape {self.shape}")
    Tensor = type(self)
    r, c = self.shape[-2], self.shape[-1]
    rows = Tensor.arange(r, device=self.device).reshape(r, 1)
    cols = Tensor.arange(c, device=self.device).reshape(1, c)
    d = cols - rows
    keep = (d >= diagonal) if upper else (d <= diagonal)
    return keep._expand_to(self.shape).where(self, 0)

  @classmethod
  def linspace(cls, start, stop, steps: int, dtype: DType | str | None = None, device: str | None = None, **kw) -> Any:
    """`steps` evenly spaced values from start to stop, both included."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0: raise TensorError(f"linspace steps must be an int >= 0, got {steps!r}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if dt == dtypes.bool: raise TensorError("linspace with dtype=bool is not supported (as in torch)")
    Tensor = cls
    if steps == 1: return Tensor.full((1,), start, dt, device, **kw)
    acc = dt if dtypes.is_float(dt) else dtypes.default_float
    ret = Tensor.arange(steps, device=device).cast(acc) * ((stop - start) / max(steps - 1, 1)) + start
    return ret.cast(dt)

  @classmethod
  def eye(cls, n: int, m: int | None = None, dtype: DType | str | None = None, device: str | None = None, **kw) -> Any:
    """An n x m matrix with ones on the diagonal (a padded, reshaped column of ones: no compute)."""
    m = n if m is None else m
    for v in (n, m):
      if not isinstance(v, int) or isinstance(v, bool) or v < 0: raise TensorError(f"eye sizes must be ints >= 0, got n={n}, m={m}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    Tensor, k = cls, max(n, m)
    if k == 0: return Tensor.zeros(n, m, dtype=dt, device=device, **kw)
    x = Tensor.ones(k, 1, dtype=dt, device=device)._pad(((0, 0), (0, k))).reshape(k * (k + 1)).shrink(((0, k * k),)).reshape(k, k)
    ret = x.shrink(((0, n), (0, m)))
    if kw.get("requires_grad") is not None: ret.requires_grad = kw["requires_grad"]
    return ret

  # ***** random *****
  @classmethod
  def manual_seed(cls, seed: int = 0) -> None:
    """Reset the device RNG: the same seed followed by the same calls gives the same numbers."""
    Tensor = cls
    Tensor._seed, Tensor._device_rng_counter = int(seed), 0

  @classmethod
  def _random_bits(cls, n: int, device: str | None) -> Any:
    """n uniformly random uint32 values (one Threefry call on an arange of counters), advancing the call counter."""
    Tensor = cls
    Tensor._device_rng_counter += 1
    seed, ctr = Tensor._seed, Tensor._device_rng_counter
    half = (n + 1) // 2
    key = Tensor(np.array([seed & _MASK, ((seed >> 32) ^ (ctr >> 32)) & _MASK, ctr & _MASK], np.uint32), device=device)
    k0, k1, c1 = (key.shrink(((i, i + 1),)).reshape(()) for i in range(3))
    c0 = _bit_arange(cls, half, device).cast(dtypes.uint32)
    x0, x1 = threefry2x32(c0, c1._expand_to(c0.shape), k0, k1)
    bits = x0.reshape(half, 1)._pad(((0, 0), (0, 1)))._alu(Ops.ADD, x1.reshape(half, 1)._pad(((0, 0), (1, 0))))
    return bits.reshape(2 * half).shrink(((0, n),))

  @classmethod
  def rand(cls, *shape, dtype: DType | str | None = None, device: str | None = None, **kw) -> Any:
    """Uniform random floats in [0, 1) from 23 random bits (fewer for half and bfloat16, so 1.0 can't appear)."""
    Tensor = cls
    shape = _shape(shape)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if not dtypes.is_float(dt): raise TensorError(f"rand needs a float dtype, got {dt}")
    n = math.prod(shape)
    if n == 0: return Tensor.zeros(shape, dtype=dt, device=device, **kw)
    nb = _float_bits(dt)
    bits = Tensor._random_bits(n, device)
    u = bits._alu(Ops.SHR, _u32(bits, 32 - nb)).cast(dtypes.float32) * (2.0 ** -nb)
    ret = u.cast(dt).reshape(shape)
    if kw.get("requires_grad") is not None: ret.requires_grad = kw["requires_grad"]
    return ret

  @classmethod
  def randn(cls, *shape, dtype: DType | str | None = None, device: str | None = None, **kw) -> Any:
    """Standard normal samples by Box-Muller from two uniforms."""
    Tensor = cls
    shape = _shape(shape)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if not dtypes.is_float(dt): raise TensorError(f"randn needs a float dtype, got {dt}")
    u = Tensor.rand(2, *shape, dtype=dtypes.float32, device=device)
    u1, u2 = u.shrink(((0, 1),) + ((None,) * len(shape))), u.shrink(((1, 2),) + ((None,) * len(shape)))
    r = ((1 - u1).log() * -2).sqrt()
    ret = (r * (u2 * (2 * math.pi) + math.pi / 2)._alu(Ops.SIN)).reshape(shape).cast(dt)
    if kw.get("requires_grad") is not None: ret.requires_grad = kw["requires_grad"]
    return ret

  @classmethod
  def randint(cls, *args, low: int = 0, high: int = 10, dtype: DType | str | None = None, device: str | None = None, **kw) -> Any:
    """Uniform random ints in [low, high). Both `randint(*shape, low=, high=)` (tinygrad) and `randint(low, high, shape)` /
    `randint(high, shape)` (torch) work."""
    Tensor = cls
    if args and isinstance(args[-1], (tuple, list)):
      bounds, shape = args[:-1], tuple(args[-1])
      if len(bounds) == 1: low, high = 0, bounds[0]
      elif len(bounds) == 2: low, high = bounds
      elif bounds: raise TypeError(f"randint takes (high, shape) or (low, high, shape), got {args}")
    else: shape = _shape(args)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
    if not isinstance(low, int) or not isinstance(high, int): raise TypeError(f"randint bounds must be ints, got low={low!r}, high={high!r}")
    if not dtypes.is_int(dt): raise TensorError(f"randint needs an int dtype, got {dt}")
    if high <= low: raise TensorError(f"randint needs low < high, got low={low}, high={high}")
    if high - low > 1 << 32: raise TensorError(f"randint range {high - low} is wider than 2**32")
    n = math.prod(shape)
    if n == 0: return Tensor.zeros(shape, dtype=dt, device=device, **kw)
    bits = Tensor._random_bits(n, device)
    off = bits._alu(Ops.MOD, _u32(bits, high - low)) if high - low < 1 << 32 else bits
    ret = (off.cast(dtypes.int64) + low).cast(dt).reshape(shape)
    if kw.get("requires_grad") is not None: ret.requires_grad = kw["requires_grad"]
    return ret

  @classmethod
  def uniform(cls, *shape, low: float = 0.0, high: float = 1.0, dtype: DType | str | None = None, device: str | None = None, **kw) -> Any:
    """Uniform samples in [low, high)."""
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    u = cls.rand(*shape, dtype=dt if dtypes.is_float(dt) else dtypes.float32, device=device)
    ret = (u * (high - low) + low).cast(dt)
    if kw.get("requires_grad") is not None: ret.requires_grad = kw["requires_grad"]
    return ret

  @classmethod
  def normal(cls, *shape, mean: float = 0.0, std: float = 1.0, dtype: DType | str | None = None, device: str | None = None, **kw) -> Any:
    ret = cls.randn(*shape, dtype=dtype, device=device) * std + mean
    if kw.get("requires_grad") is not None: ret.requires_grad = kw["requires_grad"]
    return ret

  @classmethod
  def randperm(cls, n: int, device: str | None = None, dtype: DType | str = dtypes.int32, **kw) -> Any:
    """A random permutation of 0..n-1: the argsort of n uniform numbers (O(n**2) work, like sort)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0: raise TensorError(f"randperm needs an int n >= 0, got {n!r}")
    return cls.rand(n, device=device).argsort().cast(to_dtype(dtype))

  def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Any:
    """int32 samples of category indices with probabilities proportional to the (1-D or 2-D) weights. Without
    replacement only one sample per row is supported (as tinygrad)."""
    if self.ndim not in (1, 2): raise TensorError(f"multinomial needs 1-D or 2-D weights, got shape {self.shape}")
    if not isinstance(num_samples, int) or num_samples < 1: raise TensorError(f"multinomial num_samples must be an int >= 1, got {num_samples!r}")
    if not replacement and num_samples != 1: raise TensorError("multinomial without replacement supports only num_samples=1")
    w = self.reshape(1, -1) if self.ndim == 1 else self
    cdf = w.float().cumsum(1)
    cdf = cdf / cdf[:, -1:]
    u = type(self).rand(w.shape[0], num_samples, 1, device=self.device)
    ret = (u >= cdf.unsqueeze(1)).cast(dtypes.int32).sum(2).minimum(w.shape[1] - 1)
    return ret.reshape(num_samples) if self.ndim == 1 else ret

  @classmethod
  def scaled_uniform(cls, *shape, **kw) -> Any:
    """uniform(-1, 1) scaled by 1/sqrt(numel)."""
    shape = _shape(shape)
    return cls.uniform(*shape, low=-1.0, high=1.0, **kw) * (math.prod(shape) ** -0.5)

  @classmethod
  def glorot_uniform(cls, *shape, **kw) -> Any:
    """Xavier/Glorot uniform: bound sqrt(6 / (fan_in + fan_out)) with fan_out = shape[0], fan_in = prod(shape[1:])."""
    shape = _shape(shape)
    bound = math.sqrt(6 / max(1, shape[0] + math.prod(shape[1:])))
    return cls.uniform(*shape, low=-1.0, high=1.0, **kw) * bound

  @classmethod
  def kaiming_uniform(cls, *shape, a: float = 0.01, **kw) -> Any:
    """He uniform: bound sqrt(3) * gain / sqrt(fan_in), gain = sqrt(2 / (1 + a**2)), fan_in = prod(shape[1:])."""
    shape = _shape(shape)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(max(1, math.prod(shape[1:])))
    return cls.uniform(*shape, low=-bound, high=bound, **kw)

  @classmethod
  def kaiming_normal(cls, *shape, a: float = 0.01, **kw) -> Any:
    """He normal: std gain / sqrt(fan_in)."""
    shape = _shape(shape)
    std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(max(1, math.prod(shape[1:])))
    return cls.normal(*shape, mean=0.0, std=std, **kw)

