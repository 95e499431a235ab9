"""Tensor ops mixin: matrix decompositions (QR, SVD) over the last two dims, batched over the others.

Both are lazy graphs of Tensor ops (matmuls, reductions, selects), so they run on every device, fuse like any other
computation and are differentiable. QR is Householder with LAPACK's sign convention (a column whose part below the
diagonal is zero is left alone), so Q and R equal numpy's/torch's for full-rank input. SVD is one-sided Jacobi
(Hestenes) on the R of a QR, with the pairs rotated in parallel rounds (a round-robin tournament), a fixed number of
sweeps, singular values sorted descending, and U completed to an orthonormal basis where singular values are zero.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from plugrad.dtype import dtypes
from plugrad.errors import TensorError

_SVD_SWEEPS = 8  # one-sided Jacobi converges quadratically: 8 sweeps reach float32 (and float64) accuracy for n <= 64


def _tournament(n: int) -> list[list[tuple[int, int]]]:
  """Rounds of disjoint column pairs covering every pair of range(n) once (the circle method; odd n sits one out)."""
  k = n + (n % 2)
  players = list(range(k))
  rounds = []
  for _ in range(k - 1):
    pairs = [(min(players[i], players[k - 1 - i]), max(players[i], players[k - 1 - i])) for i in range(k // 2)]
    rounds.append([p for p in pairs if p[1] < n])
    players = [players[0], players[-1], *players[1:-1]]
  return rounds


class LinalgMixin:
  __slots__ = ()

  def _matrix_operand(self: Any, name: str) -> tuple[Any, tuple, int, int]:
    if self.ndim < 2: raise TensorError(f"{name} needs a matrix (two or more dims), got shape {self.shape}")
    if not all(isinstance(s, int) for s in self.shape): raise TensorError(f"{name} needs a concrete shape, got {self.shape}")
    x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
    return x, tuple(self.shape[:-2]), self.shape[-2], self.shape[-1]

  def qr(self: Any) -> tuple[Any, Any]:
    """(Q, R) with Q (..., m, m) orthogonal and R (..., m, n) upper triangular, self = Q @ R (numpy's mode="complete").
    Householder reflections H = I - tau v v^T with v's pivot entry alpha - beta, beta = -sign(alpha) * ||x||; a column
    already zero below the diagonal gets tau = 0 (LAPACK's geqrf), so R's diagonal signs match numpy and torch."""
    a, batch, m, n = self._matrix_operand("qr")
    cls = type(self)
    rows = cls.arange(m, device=a.device)
    q = cls.eye(m, dtype=a.dtype, device=a.device).expand(*batch, m, m)
    r = a
    for j in range(min(m, n) if m > 1 else 0):
      col = r[..., :, j]                                                        # (..., m)
      x = (rows >= j).where(col, 0.0)
      scale = x.abs().max(-1, keepdim=True)                                     # scaled, so squares neither under- nor overflow
      x = x / (scale > 0).where(scale, 1.0)
      alpha = (rows == j).where(x, 0.0).sum(-1, keepdim=True)                   # (..., 1)
      below = (rows > j).where(x, 0.0).square().sum(-1, keepdim=True)
      norm = (alpha.square() + below).sqrt()
      neg = (x < 0).logical_or((x == 0).logical_and(x.reciprocal() < 0))        # the sign bit (-0.0 counts; a sum would lose it)
      negative = (rows == j).logical_and(neg).where(1.0, 0.0).sum(-1, keepdim=True) > 0
      beta = negative.where(norm, -norm)                                        # -sign(alpha) * norm
      v = (rows == j).where(alpha - beta, x)                                    # (..., m)
      vv = v.square().sum(-1, keepdim=True)
      tau = (below > 0).where(2.0 / (below > 0).where(vv, 1.0), 0.0)            # 2 / v.v, or no reflection
      v = v.unsqueeze(-1)                                                       # (..., m, 1)
      r = r - (tau.unsqueeze(-1) * v) @ (v.transpose(-2, -1) @ r)
      q = q - (q @ v) @ (tau.unsqueeze(-1) * v).transpose(-2, -1)
    return q, r

  def svd(self: Any, full_matrices: bool = True) -> tuple[Any, Any, Any]:
    """(U, S, Vh) with self = U @ diag(S) @ Vh, S (..., min(m, n)) descending and non-negative; U (..., m, m) and
    Vh (..., n, n) orthogonal (full_matrices=False: U (..., m, k), Vh (..., k, n), k = min(m, n)), as numpy.
    The signs of singular vector pairs are not numpy's (they are arbitrary there too)."""
    a, batch, m, n = self._matrix_operand("svd")
    if m < n:
      u, s, vh = a.transpose(-2, -1).svd(full_matrices)
      return vh.transpose(-2, -1), s, u.transpose(-2, -1)
    cls, dev, dt = type(self), a.device, a.dtype
    q, r = a.qr()
    w = r[..., :n, :]                       # (..., n, n): A = Q[:, :n] W, and W's SVD gives A's
    v = cls.eye(n, dtype=dt, device=dev).expand(*batch, n, n)
    for _ in range(_SVD_SWEEPS if n > 1 else 0):
      for pairs in _tournament(n):
        sel_p, sel_q = np.zeros((n, len(pairs)), np.float32), np.zeros((n, len(pairs)), np.float32)
        for i, (p, qq) in enumerate(pairs): sel_p[p, i] = sel_q[qq, i] = 1.0
        sp, sq = cls(sel_p, device=dev).cast(dt), cls(sel_q, device=dev).cast(dt)
        wp, wq = w @ sp, w @ sq             # (..., n, h): the pairs' columns
        alpha, beta, gamma = wp.square().sum(-2), wq.square().sum(-2), (wp * wq).sum(-2)
        rot = gamma != 0
        zeta = (beta - alpha) / (2.0 * rot.where(gamma, 1.0))
        t = rot.where((zeta < 0).where(-1.0, 1.0) / (zeta.abs() + (1.0 + zeta.square()).sqrt()), 0.0)
        c = (1.0 + t.square()).rsqrt()
        s = c * t
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
        def rotate(x: Any) -> Any:
          xp, xq = x @ sp, x @ sq
          return x + (xp * (c - 1.0) - xq * s) @ sp.transpose(-2, -1) + (xp * s + xq * (c - 1.0)) @ sq.transpose(-2, -1)
        w, v = rotate(w), rotate(v)
    sv = w.square().sum(-2).sqrt()          # (..., n): the column norms are the singular values
    sv, order = sv.sort(-1, descending=True)
    idx = order.unsqueeze(-2).expand(*batch, n, n)
    w, v = w.gather(-1, idx), v.gather(-1, idx)
    # columns of W / S are the left singular vectors; where S is (numerically) zero a QR completes them to a basis
    tol = sv[..., :1] * (max(m, n) * 2.0 ** -dtypes.finfo(dt)[1])
    live = (sv > tol).unsqueeze(-2)
    cand = live.where(w / live.where(sv.unsqueeze(-2), 1.0), 0.0)
    qc, rc = cand.qr()
    diag = (rc * cls.eye(n, dtype=dt, device=dev)).sum(-2, keepdim=True)  # (..., 1, n)
    un = qc * live.where((diag < 0).where(-1.0, 1.0), 1.0)
    if m > n: un = un.pad((0, m - n, 0, m - n)) + _tail_mask(cls, m, n, dt, dev)  # Q's last m - n columns stay
    u = q @ un
    return (u if full_matrices else u[..., :, :n]), sv, v.transpose(-2, -1)


def _tail_mask(cls: Any, m: int, n: int, dt: Any, dev: str) -> Any:
  """(m, m) with ones on the diagonal past n: the identity block that keeps Q's last m - n columns in U."""
  d = np.zeros((m, m), np.float32)
  d[np.arange(n, m), np.arange(n, m)] = 1.0
  return cls(d, device=dev).cast(dt)
