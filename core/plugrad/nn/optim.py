"""Optimizers (SGD, LAMB, Adam, AdamW) and gradient clipping.

Every piece of state that changes between steps (lr, momentum buffers, Adam's m/v and the bias-correction powers
b1**t, b2**t) lives in realized device tensors that a step updates in place with `assign`; only constants (betas, eps,
weight decay, momentum) are baked into kernels. So every step builds the same graph over the same buffers, the
scheduler's cache returns the same kernels, and `step()` realizes params and state together in one call.
Changing the learning rate between steps: `opt.lr.assign(Tensor(new_lr))` (or `opt.set_lr(x)`), no recompile.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from plugrad.dtype import DType, dtypes
from plugrad.uop.shape import device_of
from plugrad.schedule.multi import multi
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops


def _dedup(ts: Sequence[Tensor]) -> list[Tensor]: return list({id(t): t for t in ts}.values())


def _buf(shape: tuple, value: float, dtype: DType, device: str) -> Tensor:
  """A realized tensor filled with value, written from the host (no kernel), outside autograd."""
  if dtype.np is not None: return Tensor(np.full(shape, value, dtype.np), device=device, requires_grad=False)
  return Tensor.full(shape, value, dtype, device, requires_grad=False).contiguous().realize()


class Optimizer:
  """Base: holds params (requires_grad None becomes True) and buffers (requires_grad False: realized with each step),
  and the learning rate as a realized 0-d float32 tensor `lr`. Subclasses implement `_step(params, grads)`, which
  assigns the new params and returns the state tensors it updated."""
  def __init__(self, params: Sequence[Tensor], lr: float):
    params = list(params)
    for x in params:
      if not isinstance(x, Tensor): raise TypeError(f"optimizer params must be Tensors, got {type(x).__name__}")
      if x.requires_grad is None: x.requires_grad = True
    self.params = _dedup([x for x in params if x.requires_grad])
    if not self.params: raise ValueError("optimizer got no parameters (or all have requires_grad=False)")
    self.buffers = _dedup([x for x in params if not x.requires_grad])
    self.device = self.params[0].device
    for p in self.params:
      if p.device != self.device: raise RuntimeError(f"optimizer params must be on one device, got {self.device} and {p.device}")
    self.lr = _buf((), lr, dtypes.float32, self.device)
    Tensor.realize_all(*self.params, *self.buffers)

  def set_lr(self, lr: float) -> None:
    """New learning rate for the next steps, written into the lr buffer (the step kernels don't change)."""
    self.lr.assign(Tensor(np.array(lr, np.float32), device=self.device)).realize()

  def zero_grad(self) -> None:
    for p in self.params: p.grad = None

  def step(self) -> None:
    """Apply one update: realizes the new params and optimizer state together."""
    Tensor.realize_all(*self.schedule_step())

  def schedule_step(self) -> list[Tensor]:
    """Assign the updates lazily and return every tensor that must be realized to apply them (state, params, buffers)."""
    if not Tensor.training:
      raise RuntimeError("optimizer step with Tensor.training=False; wrap training in `with Tensor.train():` (or set Tensor.training)")
    grads = []
    for i, p in enumerate(self.params):
      if p.grad is None: raise RuntimeError(f"optimizer param {i} (shape {p.shape}) has no .grad; run backward() first or leave it out")
      if tuple(p.grad.shape) != tuple(p.shape): raise RuntimeError(f"param {i}: grad shape {p.grad.shape} doesn't match param shape {p.shape}")
      grads.append(p.grad)
    return _dedup([*self._step(self.params, grads), *self.params, *self.buffers])

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]: raise NotImplementedError

  def _zeros_like(self, ts: list[Tensor], dtype: DType | None = None) -> list[Tensor]:
    # a sharded param's state is sharded the same way (each device keeps the state of its own rows)
    return [_buf(tuple(t.shape), 0, dtype or t.dtype, t.device) if t.uop.op is not Ops.MULTI else
            Tensor(multi([_buf(tuple(s.shape), 0, dtype or t.dtype, device_of(s)).uop for s in t.uop.src], t.uop.arg))
            for t in ts]


class OptimizerGroup(Optimizer):
  """Several optimizers (e.g. different lrs for different params) stepped as one: one realize for all of them."""
  def __init__(self, *optimizers: Optimizer):
    if not optimizers: raise ValueError("OptimizerGroup needs at least one optimizer")
    self.optimizers = list(optimizers)
    self.params = _dedup([p for o in optimizers for p in o.params])
    self.buffers = _dedup([b for o in optimizers for b in o.buffers])
  def __getitem__(self, i: int) -> Optimizer: return self.optimizers[i]
  def __len__(self) -> int: return len(self.optimizers)
  def zero_grad(self) -> None:
    for o in self.optimizers: o.zero_grad()
  def set_lr(self, lr: float) -> None:
    for o in self.optimizers: o.set_lr(lr)
  def schedule_step(self) -> list[Tensor]: return _dedup([t for o in self.optimizers for t in o.schedule_step()])


class SGD(Optimizer):
  """SGD like torch (dampening 0): g += wd*p; b = momentum*b + g; g = g + momentum*b (nesterov) or b; p -= lr*g.
  classic=True applies lr before the momentum instead (b = momentum*b + lr*g; p -= b)."""
  def __init__(self, params: Sequence[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False, classic: bool = False):
    if nesterov and momentum <= 0: raise ValueError(f"nesterov momentum needs momentum > 0, got {momentum}")
    super().__init__(params, lr)
    self.momentum, self.wd, self.nesterov, self.classic = momentum, weight_decay, nesterov, classic
    self.b = self._zeros_like(self.params) if momentum else []

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    for i, (t, g) in enumerate(zip(params, grads)):
      if self.wd: g = g + self.wd * t.detach()
      if self.classic: g = g * self.lr
      if self.momentum:
        b = self.b[i].assign((self.momentum * self.b[i] + g).cast(self.b[i].dtype))
        g = g + self.momentum * b if self.nesterov else b
      if not self.classic: g = g * self.lr
      t.assign((t.detach() - g).cast(t.dtype))
    return self.b


class LAMB(Optimizer):
  """LAMB (and Adam/AdamW with adam=True). m, v in float32; up = m_hat / (sqrt(v_hat) + eps) + wd * p; without adam the
  step is scaled by the trust ratio |p| / |up| (1 when either norm is 0); p -= lr * ratio * up. b1_t, b2_t hold b1**t, b2**t."""
  def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False):
    for name, b in (("b1", b1), ("b2", b2)):
      if not 0.0 <= b < 1.0: raise ValueError(f"{name} must be in [0, 1), got {b}")
    super().__init__(params, lr)
    self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
    self.b1_t, self.b2_t = _buf((), 1, dtypes.float32, self.device), _buf((), 1, dtypes.float32, self.device)
    self.m = self._zeros_like(self.params, dtypes.float32)
    self.v = self._zeros_like(self.params, dtypes.float32)

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    b1_t, b2_t = self.b1_t.assign(self.b1_t * self.b1), self.b2_t.assign(self.b2_t * self.b2)
    for i, (t, g) in enumerate(zip(params, grads)):
      g = g.cast(dtypes.float32)
      m = self.m[i].assign(self.b1 * self.m[i] + (1.0 - self.b1) * g)
      v = self.v[i].assign(self.b2 * self.v[i] + (1.0 - self.b2) * (g * g))
      up = (m / (1.0 - b1_t)) / ((v / (1.0 - b2_t)).sqrt() + self.eps)
      if self.wd: up = up + self.wd * t.detach().cast(dtypes.float32)
      if not self.adam:
        r1, r2 = t.detach().cast(dtypes.float32).square().sum().sqrt(), up.square().sum().sqrt()
        up = up * (r1 > 0).where((r2 > 0).where(r1 / r2, 1.0), 1.0)
      t.assign((t.detach() - self.lr * up).cast(t.dtype))
    return [self.b1_t, self.b2_t, *self.m, *self.v]


class Adam(LAMB):
  """Adam (no weight decay): LAMB with adam=True."""
  def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    super().__init__(params, lr, b1, b2, eps, 0.0, adam=True)


class AdamW(LAMB):
  """AdamW: Adam with decoupled weight decay, p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)."""
  def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.01):
    super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True)


def clip_grad_norm_(parameters: Tensor | Sequence[Tensor], max_norm: float, norm_type: float = 2.0) -> Tensor:
  """Scale the .grad of `parameters` in place (lazily) so their joint norm is at most max_norm, like torch's
  (coefficient min(1, max_norm / (norm + 1e-6))). Returns the total norm before clipping as a lazy 0-d float32 tensor.
  norm_type: any p > 0 or math.inf. Params without a grad are skipped."""
  params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
  grads = [p.grad for p in params if p.grad is not None]
  if not isinstance(norm_type, (int, float)) or isinstance(norm_type, bool) or not norm_type > 0:
    raise ValueError(f"clip_grad_norm_: norm_type must be a positive number or inf, got {norm_type!r}")
  if not grads: return Tensor(0.0)
  gs = [g.cast(dtypes.float32) for g in grads]
  if norm_type == math.inf: total = Tensor.stack(*[g.abs().max() for g in gs]).max()
  else:
    parts = [(g.abs() ** norm_type).sum() if norm_type != 2 else g.square().sum() for g in gs]
    s = parts[0]
    for q in parts[1:]: s = s + q
    total = s.sqrt() if norm_type == 2 else s ** (1.0 / norm_type)
  coef = (max_norm / (total + 1e-6)).minimum(1.0)
  for p in params:
    if p.grad is not None: p.grad = (p.grad * coef).cast(p.grad.dtype)
  return total


__all__ = ["Optimizer", "OptimizerGroup", "SGD", "LAMB", "Adam", "AdamW", "clip_grad_norm_"]
