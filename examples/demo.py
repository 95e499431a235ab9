"""plugrad demo: a small Tensor program on the default device (DEV=... to choose one).

It builds a lazy graph (a matmul, a softmax and a reduction), shows how the scheduler splits it into kernels,
runs it, and checks the result against numpy.
"""
from __future__ import annotations

import time

import numpy as np

from plugrad import Device, Tensor


def main() -> None:
  name = Device.DEFAULT
  print(f"default device: {name} (renderer {Device[name].renderer.name})")
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
  x = (Tensor(a) @ Tensor(b)).softmax(axis=1)
  out = (x * 2 + 1).sum(axis=0)
  items = out.schedule()
  print(f"lazy graph -> {len(items)} kernels, reading and writing " + ", ".join(f"{len(it.bufs)}" for it in items) + " buffers")
  st = time.perf_counter()
  got = out.numpy()
  print(f"ran in {(time.perf_counter() - st) * 1e3:.1f} ms (first run includes compiling; kernels are cached on disk)")
  e = np.exp(a @ b - (a @ b).max(1, keepdims=True))
  want = (e / e.sum(1, keepdims=True) * 2 + 1).sum(0)
  if getattr(Device[name], "fake", False): print(f"{name} computes nothing (schedule and codegen only): no result to check")
  else: print(f"max |error| vs numpy: {np.abs(got - want).max():.2e}")
  if not getattr(Device[name], "fake", False): print(f"([1, 2, 3] * 2) on {name}: {(Tensor([1, 2, 3]) * 2).tolist()}")


if __name__ == "__main__": main()
