"""The CPU launcher's argument cache: pointer arrays are reused per set of buffers (by identity), never across buffers."""
from __future__ import annotations

import gc

import numpy as np

from plugrad.engine.realize import lower_item
from plugrad.tensor import Tensor


def test_one_program_many_buffer_sets():
  xs = [np.full(256, i, np.float32) for i in range(4)]
  ts = [Tensor(x).realize() for x in xs]
  items = [lower_item((t * 2 + 1).schedule()[-1]) for t in ts]
  assert len({id(it.runner.prg) for it in items}) == 1  # one compiled kernel, four sets of buffers
  for _ in range(3):
    for it, x in zip(items, xs):
      it.run()
      np.testing.assert_array_equal(np.frombuffer(bytes(it.bufs[0].copyout()), np.float32), x * 2 + 1)


def test_freed_buffers_are_not_reused_by_id():
  prg = None
  for i in range(20):  # buffers freed between launches may come back at the same id: the weakref check catches it
    t = Tensor(np.full(64, i, np.float32)).realize()
    it = lower_item((t + 1).schedule()[-1])
    prg = prg or it.runner.prg
    it.run()
    np.testing.assert_array_equal(np.frombuffer(bytes(it.bufs[0].copyout()), np.float32), np.full(64, i + 1, np.float32))
    del t, it
    gc.collect()
