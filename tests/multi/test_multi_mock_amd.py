"""Multi-device tensors on two emulated AMD GPUs (MOCK+AMD and MOCK+AMD:1: the amd plugin's runtime on its mock KFD,
kernels executed by the RDNA3 emulator): sharding, device-to-device copies, the allreduce of a reduction over the
shard axis and a sharded matmul, against numpy."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from plugrad import Tensor

pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("clang-19", "ld.lld-19")),
                                reason="the amd plugin compiles with clang-19 and ld.lld-19 (make sysdeps)")
GPUS = ("MOCK+AMD", "MOCK+AMD:1")


def test_shards_live_on_both_gpus_and_reduce_over_the_shard_axis():
  a = np.arange(48, dtype=np.float32).reshape(12, 4) / 7
  t = Tensor(a).shard(GPUS, axis=0)
  assert t.device == GPUS
  np.testing.assert_allclose((t * 2 + 1).numpy(), a * 2 + 1, rtol=1e-6)
  np.testing.assert_allclose(t.sum(0).numpy(), a.sum(0), rtol=1e-5)   # partial sums per GPU, then the allreduce
  np.testing.assert_allclose(t.max(1).numpy(), a.max(1), rtol=1e-6)   # within each shard: no communication


def test_sharded_matmul_and_copy_between_gpus():
  rng = np.random.default_rng(3)
  x, w = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 6)).astype(np.float32)
  y = Tensor(x).shard(GPUS, axis=1) @ Tensor(w).shard(GPUS, axis=0)   # contraction over the shard axis
  np.testing.assert_allclose(y.numpy(), x @ w, rtol=1e-4, atol=1e-5)
  moved = Tensor(x, device="MOCK+AMD").to("MOCK+AMD:1") + 1
  assert moved.device == "MOCK+AMD:1"
  np.testing.assert_allclose(moved.numpy(), x + 1, rtol=1e-6)
