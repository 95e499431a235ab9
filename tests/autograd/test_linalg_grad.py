"""Gradients of qr and svd against torch.linalg (float64 on both sides): QR complete mode on square and wide matrices
(torch differentiates mode="complete" only for m <= n), singular values of square, tall, wide and batched ones."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

torch = pytest.importorskip("torch")  # a test extra (core/pyproject.toml)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4), (2, 3, 3)])
def test_qr_gradient_matches_torch(shape):
  r = np.random.default_rng(sum(shape))
  a, wq, wr = r.standard_normal(shape), r.standard_normal(shape[:-1] + (shape[-2],)), r.standard_normal(shape)
  x = Tensor(a, dtype=dtypes.float64)
  q, rr = x.qr()
  (g,) = ((q * Tensor(wq)).sum() + (rr * Tensor(wr)).sum()).gradient(x)
  tx = torch.tensor(a, requires_grad=True)
  tq, tr = torch.linalg.qr(tx, mode="complete")
  ((tq * torch.tensor(wq)).sum() + (tr * torch.tensor(wr)).sum()).backward()
  np.testing.assert_allclose(g.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("shape", [(3, 3), (4, 2)])  # (~15 s and ~3 s: the backward graph of 8 Jacobi sweeps)
def test_singular_value_gradient_matches_torch(shape):
  r = np.random.default_rng(sum(shape) + 1)
  a = r.standard_normal(shape)
  k = min(shape[-2:])
  w = np.arange(1.0, k + 1)
  x = Tensor(a, dtype=dtypes.float64)
  _, s, _ = x.svd()
  (g,) = (s * Tensor(w)).sum().gradient(x)
  tx = torch.tensor(a, requires_grad=True)
  (torch.linalg.svdvals(tx) * torch.tensor(w)).sum().backward()
  np.testing.assert_allclose(g.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-8)
