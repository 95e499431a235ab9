"""plugrad.nn.optim: each optimizer's updates over 3 steps with hand-set grads against the update equations written in
numpy (float64), weight decay variants, schedule-cache reuse across steps, lr changes, clip_grad_norm_, and errors."""
import math

import numpy as np
import pytest

from plugrad.nn.optim import LAMB, SGD, Adam, AdamW, OptimizerGroup, clip_grad_norm_
from plugrad.schedule.kernelize import SCHEDULE_STATS
from plugrad.tensor import Tensor

SHAPES = [(3, 4), (5,)]


def make(seed=0):
  rng = np.random.default_rng(seed)
  p0 = [rng.uniform(-1, 1, s).astype(np.float32) for s in SHAPES]
  grads = [[rng.uniform(-1, 1, s).astype(np.float32) for s in SHAPES] for _ in range(3)]
  return p0, grads


def run(opt_fn, p0, grads):
  params = [Tensor(p.copy()) for p in p0]
  opt = opt_fn(params)
  out = []
  with Tensor.train():
    for gs in grads:
      for p, g in zip(params, gs): p.grad = Tensor(g)
      opt.step()
      out.append([p.numpy() for p in params])
  return opt, out


# ***** numpy references (one step, float64) *****
def np_sgd(p, g, b, lr, momentum, wd, nesterov, classic):
  g = g + wd * p
  if classic: g = g * lr
  if momentum:
    b = momentum * b + g
    g = g + momentum * b if nesterov else b
  if not classic: g = g * lr
  return p - g, b


def np_lamb(p, g, m, v, t, lr, b1, b2, eps, wd, adam):
  m = b1 * m + (1 - b1) * g
  v = b2 * v + (1 - b2) * g * g
  up = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * p
  if not adam:
    r1, r2 = np.sqrt((p * p).sum()), np.sqrt((up * up).sum())
    up = up * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0)
  return p - lr * up, m, v


SGD_CASES = [dict(), dict(momentum=0.9), dict(momentum=0.9, nesterov=True), dict(momentum=0.8, weight_decay=0.1),
             dict(momentum=0.9, weight_decay=0.05, classic=True), dict(weight_decay=0.2)]


@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd(kw):
  p0, grads = make()
  opt, got = run(lambda ps: SGD(ps, lr=0.1, **kw), p0, grads)
  ps, bs = [p.astype(np.float64) for p in p0], [np.zeros(s) for s in SHAPES]
  a = dict(momentum=kw.get("momentum", 0.0), wd=kw.get("weight_decay", 0.0), nesterov=kw.get("nesterov", False), classic=kw.get("classic", False))
  for step, gs in enumerate(grads):
    for i, g in enumerate(gs): ps[i], bs[i] = np_sgd(ps[i], g, bs[i], 0.1, **a)
    for i in range(len(SHAPES)): np.testing.assert_allclose(got[step][i], ps[i], atol=1e-6, rtol=1e-5)
  if a["momentum"]:
    for b, rb in zip(opt.b, bs): np.testing.assert_allclose(b.numpy(), rb, atol=1e-6, rtol=1e-5)


LAMB_CASES = [(Adam, dict(lr=0.01), dict(eps=1e-8, wd=0.0, adam=True)),
              (Adam, dict(lr=0.05, b1=0.8, b2=0.99, eps=1e-3), dict(eps=1e-3, wd=0.0, adam=True)),
              (AdamW, dict(lr=0.01), dict(eps=1e-8, wd=0.01, adam=True)),
              (AdamW, dict(lr=0.02, weight_decay=0.3), dict(eps=1e-8, wd=0.3, adam=True)),
              (LAMB, dict(lr=0.01), dict(eps=1e-6, wd=0.0, adam=False)),
              (LAMB, dict(lr=0.01, weight_decay=0.1), dict(eps=1e-6, wd=0.1, adam=False))]


@pytest.mark.parametrize("cls,kw,ref", LAMB_CASES)
def test_adam_family(cls, kw, ref):
  p0, grads = make(1)
  opt, got = run(lambda ps: cls(ps, **kw), p0, grads)
  b1, b2 = kw.get("b1", 0.9), kw.get("b2", 0.999)
  ps, ms, vs = [p.astype(np.float64) for p in p0], [np.zeros(s) for s in SHAPES], [np.zeros(s) for s in SHAPES]
  for step, gs in enumerate(grads):
    for i, g in enumerate(gs): ps[i], ms[i], vs[i] = np_lamb(ps[i], g, ms[i], vs[i], step + 1, kw["lr"], b1, b2, **ref)
    for i in range(len(SHAPES)): np.testing.assert_allclose(got[step][i], ps[i], atol=2e-6, rtol=1e-5)
  for m, rm in zip(opt.m, ms): np.testing.assert_allclose(m.numpy(), rm, atol=1e-6, rtol=1e-5)
  for v, rv in zip(opt.v, vs): np.testing.assert_allclose(v.numpy(), rv, atol=1e-7, rtol=1e-5)
  np.testing.assert_allclose(opt.b1_t.numpy(), b1 ** 3, rtol=1e-6)
  np.testing.assert_allclose(opt.b2_t.numpy(), b2 ** 3, rtol=1e-6)


def test_lamb_trust_ratio_zero_param():
  """With all-zero params the trust ratio falls back to 1: the first step is a plain Adam step."""
  p = Tensor(np.zeros(4, np.float32))
  opt = LAMB([p], lr=0.1)
  with Tensor.train():
    p.grad = Tensor(np.array([1, -2, 3, -4], np.float32))
    opt.step()
  np.testing.assert_allclose(p.numpy(), -0.1 * np.sign([1, -2, 3, -4]), rtol=1e-5)


@pytest.mark.parametrize("make_opt", [lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01), lambda ps: AdamW(ps, lr=0.01),
                                      lambda ps: LAMB(ps, lr=0.01)])
def test_steps_hit_schedule_cache(make_opt):
  params = [Tensor(np.ones(s, np.float32)) for s in SHAPES]
  opt = make_opt(params)
  rng = np.random.default_rng(3)
  stats = []
  with Tensor.train():
    for step in range(5):
      for p in params: p.grad = Tensor(rng.uniform(-1, 1, p.shape).astype(np.float32))
      if step == 3: opt.set_lr(0.05)  # a new lr is data, not a new kernel
      before = dict(SCHEDULE_STATS)
      opt.step()
      stats.append((SCHEDULE_STATS["hits"] - before["hits"], SCHEDULE_STATS["misses"] - before["misses"]))
  assert stats[1:] == [(1, 0)] * 4, stats  # steps 2..5: one schedule call each, all cache hits


def test_set_lr_changes_update():
  p = Tensor(np.zeros(3, np.float32))
  opt = SGD([p], lr=1.0)
  with Tensor.train():
    p.grad = Tensor(np.ones(3, np.float32))
    opt.step()
    opt.set_lr(0.25)
    p.grad = Tensor(np.ones(3, np.float32))
    opt.step()
  np.testing.assert_allclose(p.numpy(), [-1.25] * 3)


def test_optimizer_params_buffers_and_errors():
  a, b = Tensor(np.ones(2, np.float32)), Tensor(np.ones(2, np.float32), requires_grad=False)
  opt = SGD([a, b, a], lr=0.1)
  assert opt.params == [a] and opt.buffers == [b] and a.requires_grad is True
  with pytest.raises(RuntimeError, match="Tensor.training"): opt.step()
  with Tensor.train():
    with pytest.raises(RuntimeError, match=r"param 0 \(shape \(2,\)\) has no .grad"): opt.step()
    a.grad = Tensor(np.ones(3, np.float32))
    with pytest.raises(RuntimeError, match="grad shape"): opt.step()
    a.grad = Tensor(np.ones(2, np.float32))
    opt.step()
  np.testing.assert_allclose(a.numpy(), [0.9, 0.9])
  np.testing.assert_allclose(b.numpy(), [1.0, 1.0])
  opt.zero_grad()
  assert a.grad is None
  with pytest.raises(ValueError, match="no parameters"): SGD([b])
  with pytest.raises(ValueError, match="nesterov"): SGD([a], nesterov=True)
  with pytest.raises(ValueError, match="b1"): Adam([a], b1=1.0)
  with pytest.raises(TypeError, match="Tensors"): SGD([np.ones(2)])


def test_optimizer_group():
  a, b = Tensor(np.zeros(2, np.float32)), Tensor(np.zeros(3, np.float32))
  og = OptimizerGroup(SGD([a], lr=1.0), Adam([b], lr=0.1))
  assert len(og) == 2 and og[0].params == [a] and og.params == [a, b]
  with Tensor.train():
    a.grad, b.grad = Tensor(np.ones(2, np.float32)), Tensor(np.full(3, 2.0, np.float32))
    og.step()
  np.testing.assert_allclose(a.numpy(), [-1, -1])
  np.testing.assert_allclose(b.numpy(), [-0.1] * 3, rtol=1e-5)  # first Adam step moves by lr * sign(g)
  og.zero_grad()
  assert a.grad is None and b.grad is None


def np_clip(gs, max_norm, norm_type):
  total = max(np.abs(g).max() for g in gs) if norm_type == math.inf else sum((np.abs(g) ** norm_type).sum() for g in gs) ** (1 / norm_type)
  coef = min(1.0, max_norm / (total + 1e-6))
  return total, [g * coef for g in gs]


@pytest.mark.parametrize("max_norm,norm_type", [(0.5, 2.0), (100.0, 2.0), (0.3, math.inf), (1.0, 1.0)])
def test_clip_grad_norm(max_norm, norm_type):
  rng = np.random.default_rng(5)
  gs = [rng.uniform(-1, 1, s).astype(np.float32) for s in SHAPES]
  ps = [Tensor(np.zeros(s, np.float32)) for s in SHAPES] + [Tensor(np.zeros(2, np.float32))]  # the last has no grad
  for p, g in zip(ps, gs): p.grad = Tensor(g)
  total = clip_grad_norm_(ps, max_norm, norm_type)
  rt, rgs = np_clip([g.astype(np.float64) for g in gs], max_norm, norm_type)
  np.testing.assert_allclose(total.numpy(), rt, rtol=1e-5)
  for p, rg in zip(ps, rgs): np.testing.assert_allclose(p.grad.numpy(), rg, rtol=1e-5, atol=1e-7)
  assert ps[-1].grad is None


def test_clip_grad_norm_edge_cases():
  assert clip_grad_norm_([Tensor([1.0])], 1.0).item() == 0.0  # no grads at all
  p = Tensor(np.zeros(2, np.float32))
  p.grad = Tensor(np.array([3.0, 4.0], np.float32))
  np.testing.assert_allclose(clip_grad_norm_(p, 1.0).item(), 5.0)
  np.testing.assert_allclose(p.grad.numpy(), [0.6, 0.8], rtol=1e-5)
  with pytest.raises(ValueError, match="norm_type"): clip_grad_norm_(p, 1.0, norm_type=0)


def test_against_torch():
  torch = pytest.importorskip("torch")
  p0, grads = make(7)
  cases = [(lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
            lambda tp: torch.optim.SGD(tp, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)),
           (lambda ps: Adam(ps, lr=0.01), lambda tp: torch.optim.Adam(tp, lr=0.01, eps=1e-8)),
           (lambda ps: AdamW(ps, lr=0.01, weight_decay=0.1), lambda tp: torch.optim.AdamW(tp, lr=0.01, eps=1e-8, weight_decay=0.1))]
  for ours, theirs in cases:
    _, got = run(ours, p0, grads)
    tp = [torch.tensor(p.copy(), requires_grad=True) for p in p0]
    topt = theirs(tp)
    for gs in grads:
      for p, g in zip(tp, gs): p.grad = torch.tensor(g)
      topt.step()
    for a, b in zip(got[-1], tp): np.testing.assert_allclose(a, b.detach().numpy(), atol=1e-6, rtol=1e-5)


def test_training_loop_with_backward():
  """Linear -> BatchNorm -> Linear trained with real gradients: the loss falls, BatchNorm stats are realized with the
  step, and from the second step on the optimizer step compiles nothing new."""
  from plugrad import nn
  from plugrad.nn.state import get_parameters
  Tensor.manual_seed(1)
  l1, bn, l2 = nn.Linear(4, 8), nn.BatchNorm(8), nn.Linear(8, 3)
  opt = AdamW(get_parameters([l1, bn, l2]), lr=0.05)
  assert any(t is bn.running_mean for t in opt.buffers) and any(t is bn.weight for t in opt.params)
  rng = np.random.default_rng(0)
  X = rng.normal(size=(16, 4)).astype(np.float32)
  Y = ((X[:, 0] > 0).astype(np.int32) + (X[:, 1] > 0)).astype(np.int32)
  losses, misses = [], []
  with Tensor.train():
    for _ in range(4):
      opt.zero_grad()
      loss = l2(bn(l1(Tensor(X))).relu()).sparse_categorical_crossentropy(Tensor(Y)).backward()
      before = SCHEDULE_STATS["misses"]
      opt.step()
      misses.append(SCHEDULE_STATS["misses"] - before)
      losses.append(loss.item())
  assert losses[-1] < losses[0] - 0.1, losses
  assert misses[1:] == [0, 0, 0], misses
  assert bn.num_batches_tracked.numpy().tolist() == [4]
