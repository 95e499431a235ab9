"""Gradient checking for autograd tests: plugrad's analytic gradient against float64 finite differences.

`gradcheck(fn, *arrays)` differentiates loss = (fn(*xs) * r).sum() for a fixed random cotangent r (so the whole Jacobian
is exercised), then compares grad . v with the central difference (L(x + eps v) - L(x - eps v)) / 2 eps along a few
random directions v. Both sides run plugrad's own forward, so the check needs no second implementation of the op.
`full_fd_grad` is the elementwise (one coordinate at a time) version, used on tiny inputs to check the helper itself.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

Fn = Callable[..., Tensor]


def rand(*shape: int, low: float = -2.0, high: float = 2.0, seed: int = 0) -> np.ndarray:
  """Deterministic float64 input of `shape`, uniform in [low, high)."""
  return np.random.default_rng(seed).uniform(low, high, size=shape)


def away(*shape: int, lo: float = 0.3, hi: float = 2.0, seed: int = 0) -> np.ndarray:
  """Deterministic float64 input with |x| in [lo, hi) and random signs: away from the kinks of abs/relu/sign at 0."""
  rng = np.random.default_rng(seed)
  return rng.uniform(lo, hi, size=shape) * rng.choice([-1.0, 1.0], size=shape)


def distinct(*shape: int, seed: int = 0) -> np.ndarray:
  """A float64 permutation of well separated values (spacing 0.25): no ties for max/min/sort-like ops."""
  n = int(np.prod(shape)) if shape else 1
  return (np.random.default_rng(seed).permutation(n) * 0.25 - n * 0.125).reshape(shape)


def _loss(fn: Fn, arrays: Sequence[np.ndarray], r: np.ndarray | None, requires_grad: bool = False) -> tuple[Tensor, list[Tensor]]:
  xs = [Tensor(a, dtype=dtypes.float64, requires_grad=requires_grad) for a in arrays]
  out = fn(*xs)
  assert isinstance(out, Tensor), f"fn must return a Tensor, got {type(out).__name__}"
  assert out.dtype == dtypes.float64, f"fn(float64 inputs) returned {out.dtype}: the check needs float64 all the way"
  return (out * Tensor(r, dtype=dtypes.float64)).sum() if r is not None else out.sum(), xs


def analytic_grad(fn: Fn, arrays: Sequence[np.ndarray], r: np.ndarray) -> list[np.ndarray]:
  """d/dx_i of (fn(*xs) * r).sum(), via Tensor.gradient, as numpy arrays."""
  loss, xs = _loss(fn, arrays, r)
  grads = loss.gradient(*xs)
  for x, g in zip(xs, grads):
    assert g.shape == x.shape, f"gradient shape {g.shape} != input shape {x.shape}"
    assert g.dtype == dtypes.float64, f"gradient dtype {g.dtype} != input dtype float64"
  Tensor.realize_all(*grads)  # one schedule: kernels shared between the inputs' gradients are built once
  return [g.numpy() for g in grads]


def _value(fn: Fn, arrays: Sequence[np.ndarray], r: np.ndarray) -> float:
  return float(_loss(fn, arrays, r)[0].numpy())


def cotangent(fn: Fn, arrays: Sequence[np.ndarray], seed: int = 1) -> np.ndarray:
  """A fixed random cotangent with the shape of fn's output."""
  shape = fn(*[Tensor(a, dtype=dtypes.float64) for a in arrays]).shape
  return np.random.default_rng(seed).uniform(0.5, 1.5, size=shape) * np.random.default_rng(seed + 1).choice([-1.0, 1.0], size=shape)


def gradcheck(fn: Fn, *arrays: np.ndarray, wrt: Sequence[int] | None = None, n_dirs: int = 2, eps: float = 1e-6,
              atol: float = 1e-6, rtol: float = 1e-5, seed: int = 0, r: np.ndarray | None = None) -> list[np.ndarray]:
  """Check the gradient of fn at `arrays` (float64) against central differences along `n_dirs` random directions.

  `wrt` selects which inputs are perturbed (default: all); the others are held fixed. Returns the analytic gradients."""
  arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
  wrt = list(range(len(arrays))) if wrt is None else list(wrt)
  r = cotangent(fn, arrays, seed + 1) if r is None else r
  grads = analytic_grad(fn, arrays, r)
  rng = np.random.default_rng(seed + 100)
  for d in range(n_dirs):
    vs = {i: rng.standard_normal(arrays[i].shape) for i in wrt}
    norm = np.sqrt(sum(float((v * v).sum()) for v in vs.values())) or 1.0
    vs = {i: v / norm for i, v in vs.items()}
    plus = [a + eps * vs[i] if i in vs else a for i, a in enumerate(arrays)]
    minus = [a - eps * vs[i] if i in vs else a for i, a in enumerate(arrays)]
    fd = (_value(fn, plus, r) - _value(fn, minus, r)) / (2 * eps)
    an = sum(float((grads[i] * vs[i]).sum()) for i in wrt)
    assert abs(an - fd) <= atol + rtol * abs(fd), f"direction {d}: analytic grad.v = {an!r}, finite difference = {fd!r} (diff {an - fd:.3g})"
  return grads


def full_fd_grad(fn: Fn, arrays: Sequence[np.ndarray], r: np.ndarray, i: int = 0, eps: float = 1e-6) -> np.ndarray:
  """Central-difference gradient of (fn(*xs) * r).sum() wrt input i, one coordinate at a time (2 forwards per element)."""
  arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
  g = np.zeros_like(arrays[i])
  for idx in np.ndindex(*arrays[i].shape):
    e = np.zeros_like(arrays[i])
    e[idx] = eps
    g[idx] = (_value(fn, [a + e if j == i else a for j, a in enumerate(arrays)], r) -
              _value(fn, [a - e if j == i else a for j, a in enumerate(arrays)], r)) / (2 * eps)
  return g


def backward_grads(fn: Fn, *arrays: np.ndarray) -> list[np.ndarray]:
  """Gradients of fn(*xs).sum() via Tensor.backward (`.grad`), as numpy arrays; for cross-checks with gradient()."""
  loss, xs = _loss(fn, [np.asarray(a, dtype=np.float64) for a in arrays], None, requires_grad=True)
  loss.backward()
  return [x.grad.numpy() for x in xs]


def kinkfree(*shape: int, kinks: Sequence[float] = (0.0,), low: float = -2.0, high: float = 2.0, margin: float = 0.15, seed: int = 0) -> np.ndarray:
  """Deterministic float64 input in [low, high) with every value at least `margin` from each point in `kinks`."""
  x = rand(*shape, low=low, high=high, seed=seed)
  for _ in range(8):
    near = np.zeros(x.shape, dtype=bool)
    for k in kinks: near |= np.abs(x - k) < margin
    if not near.any(): return x
    x = np.where(near, x + 2.5 * margin, x)
    x = np.where(x >= high, x - (high - low) + 0.37 * margin, x)
  raise AssertionError(f"could not place {shape} values in [{low}, {high}) away from {kinks}")


def elementwise_batch_check(fns: Sequence[Fn], arrays: Sequence[np.ndarray], eps: float = 1e-6, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
  """(analytic, finite-difference) gradients of (f_k(x_k) * r_k).sum() for many ELEMENTWISE unary fns at once.

  The fns are stacked into one graph (a couple of kernels instead of two per op). An elementwise fn has a diagonal
  Jacobian, so perturbing every element by +-eps at once gives the full gradient r * (f(x+eps) - f(x-eps)) / 2eps in two
  forward evaluations; the result is per element, so a wrong op or element is pinpointed."""
  x = np.stack([np.asarray(a, dtype=np.float64) for a in arrays])
  r = np.random.default_rng(seed).uniform(0.5, 1.5, size=x.shape) * np.random.default_rng(seed + 1).choice([-1.0, 1.0], size=x.shape)
  def f(t: Tensor) -> Tensor: return Tensor.stack(*[fn(t[k]) for k, fn in enumerate(fns)])
  t = Tensor(x, dtype=dtypes.float64)
  (g,) = (f(t) * Tensor(r, dtype=dtypes.float64)).sum().gradient(t)
  assert g.dtype == dtypes.float64 and g.shape == x.shape, f"gradient {g.dtype} {g.shape} for input float64 {x.shape}"
  an = g.numpy()
  fd = r * (f(Tensor(x + eps, dtype=dtypes.float64)).numpy() - f(Tensor(x - eps, dtype=dtypes.float64)).numpy()) / (2 * eps)
  return [(an[k], fd[k]) for k in range(len(fns))]


def batch_gradcheck(cases: dict[str, tuple[Fn, np.ndarray | list[np.ndarray]]], n_dirs: int = 2, eps: float = 1e-6,
                    seed: int = 0) -> dict[str, list[tuple[float, float]]]:
  """Directional gradient checks of many fns at once: {name: [(analytic grad.v, finite difference), ...]}.

  A case is (fn, array) or (fn, [arrays]) for a fn of several inputs. Cases are grouped by input shapes; each group is
  stacked into one graph whose output is the concatenation of every (fn_k(inputs_k) * r_k) flattened, so a group needs a
  few kernels instead of a few per case. Segment k of that output only depends on case k's inputs, so perturbing every
  case along its own direction at once still checks each case separately."""
  norm = {n: (fn, [np.asarray(a, dtype=np.float64) for a in (xs if isinstance(xs, list) else [xs])]) for n, (fn, xs) in cases.items()}
  groups: dict[tuple, list[str]] = {}
  for name, (_, xs) in norm.items(): groups.setdefault(tuple(a.shape for a in xs), []).append(name)
  out: dict[str, list[tuple[float, float]]] = {}
  rng = np.random.default_rng(seed + 100)
  for names in groups.values():
    fns, K = [norm[n][0] for n in names], len(names)
    xs = [np.stack([norm[n][1][j] for n in names]) for j in range(len(norm[names[0]][1]))]
    def f(ts: list[Tensor]) -> Tensor:
      parts = [fn(*[t[k] for t in ts]).reshape(-1) for k, fn in enumerate(fns)]
      return parts[0].cat(*parts[1:]) if K > 1 else parts[0]
    def tensors(arrs: list[np.ndarray]) -> list[Tensor]: return [Tensor(a, dtype=dtypes.float64) for a in arrs]
    sizes = [int(np.prod(fn(*[t[k] for t in tensors(xs)]).shape)) for k, fn in enumerate(fns)]
    offs = np.cumsum([0, *sizes])
    r = np.random.default_rng(seed + 1).uniform(0.5, 1.5, size=offs[-1]) * np.random.default_rng(seed + 2).choice([-1.0, 1.0], size=offs[-1])
    ts = tensors(xs)
    grads = (f(ts) * Tensor(r, dtype=dtypes.float64)).sum().gradient(*ts)
    for t, g in zip(ts, grads): assert g.dtype == dtypes.float64 and g.shape == t.shape, f"gradient {g.dtype} {g.shape} for input float64 {t.shape}"
    Tensor.realize_all(*grads)
    gv = [g.numpy() for g in grads]
    res: list[list[tuple[float, float]]] = [[] for _ in names]
    for _ in range(n_dirs):
      vs = [rng.standard_normal(a.shape) for a in xs]
      scale = np.sqrt(sum((v * v).reshape(K, -1).sum(1) for v in vs))  # a unit direction per case
      vs = [v / scale.reshape(-1, *[1] * (v.ndim - 1)) for v in vs]
      plus, minus = f(tensors([a + eps * v for a, v in zip(xs, vs)])), f(tensors([a - eps * v for a, v in zip(xs, vs)]))
      Tensor.realize_all(plus, minus)
      dl = (plus.numpy() - minus.numpy()) * r / (2 * eps)
      for k in range(K): res[k].append((float(sum((g[k] * v[k]).sum() for g, v in zip(gv, vs))), float(dl[offs[k]:offs[k + 1]].sum())))
    out.update(zip(names, res))
  return out


def assert_directional(name: str, pairs: list[tuple[float, float]], atol: float = 1e-6, rtol: float = 1e-5) -> None:
  """Each (analytic, finite difference) pair from batch_gradcheck agrees."""
  for d, (an, fd) in enumerate(pairs):
    assert abs(an - fd) <= atol + rtol * abs(fd), f"{name} direction {d}: analytic grad.v = {an!r}, finite difference = {fd!r} (diff {an - fd:.3g})"
