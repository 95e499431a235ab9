"""pow (a CUSTOM_GRAD node) and contiguous_backward on sharded tensors: lowered per device like elementwise ops, with
torch's pow derivatives (0**1 has gradient 1) as on one device."""
from __future__ import annotations

import numpy as np

from plugrad.tensor import Tensor

DEVS = ("CPU:0", "CPU:1")


def test_sharded_pow_and_contiguous_backward_gradients():
  a = np.array([[0.5, 2.0], [3.0, 0.0]], np.float32)
  e = np.array([[2.0, 0.5], [1.0, 1.0]], np.float32)
  x, t = Tensor(a).shard(DEVS, axis=0), Tensor(e).shard(DEVS, axis=0)
  y = (x ** t).contiguous_backward()
  gx, gt = (y * 2).sum().gradient(x, t)
  np.testing.assert_allclose(gx.numpy(), 2 * e * a ** (e - 1), rtol=1e-6)  # d/db at 0**1 is 1 (torch), also per device
  with np.errstate(divide="ignore"):
    want_e = np.where(a == 0, 0.0, 2 * a ** e * np.log(a))
  np.testing.assert_allclose(gt.numpy(), want_e, rtol=1e-6)
  np.testing.assert_allclose(y.numpy(), a ** e, rtol=1e-6)
