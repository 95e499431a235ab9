"""In-place slice assign for KV caches: symbolic start/T, seen by later reads in the same graph, no full-buffer copies,
and the same results under TinyJit as without it."""
import gc
import weakref

import numpy as np

from plugrad import Tensor, TinyJit, Variable
from plugrad import tensor as tensor_module
from plugrad.codegen import kernel_name
from plugrad.engine import plan
from plugrad.uop.buffers import buffer_of

MAXT, D = 16, 4
rng = np.random.default_rng(0)


def attend(cache: Tensor, q: Tensor, x: Tensor, start, T) -> Tensor:
  """Write x into cache[start:start+T], then read the whole prefix (like attention over the KV cache)."""
  cache[:, start:start + T].assign(x)
  return (cache[:, :start + T] * q).sum(axis=2).softmax(axis=1)


def reference(keys: np.ndarray, q: np.ndarray) -> np.ndarray:
  s = (keys * q).sum(2)
  e = np.exp(s - s.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


def test_prefill_then_decode_under_jit_equals_eager():
  vs, vt = Variable("start", 0, MAXT - 1), Variable("T", 1, MAXT)
  q = Tensor(rng.standard_normal((1, 1, D)).astype(np.float32)).realize()
  seq = rng.standard_normal((1, MAXT, D)).astype(np.float32)
  cache = Tensor.zeros(1, MAXT, D).contiguous().realize()
  buf = buffer_of(cache.uop)
  # prefill 5 tokens at once (symbolic T), then decode one token at a time under the JIT (symbolic start)
  out = attend(cache, q, Tensor(seq)[:, :vt.bind(5)], vs.bind(0), vt.bind(5))
  np.testing.assert_allclose(out.numpy(), reference(seq[:, :5], q.numpy()), rtol=1e-5, atol=1e-6)
  step = TinyJit(lambda x, s: attend(cache, q, x, s, 1))
  for pos in range(5, 12):
    out = step(Tensor(seq[:, pos:pos + 1]), vs.bind(pos))
    np.testing.assert_allclose(out.numpy()[:, :pos + 1], reference(seq[:, :pos + 1], q.numpy()), rtol=1e-5, atol=1e-6)
  assert step.cnt == 2 and buffer_of(cache.uop) is buf  # replayed, and the cache never moved to another buffer
  np.testing.assert_array_equal(cache.numpy()[:, :12], seq[:, :12])


def test_assign_writes_only_the_slice():
  vs = Variable("start", 0, MAXT - 1)
  cache = Tensor.zeros(1, MAXT, D).contiguous().realize()
  buf = buffer_of(cache.uop)
  cache[:, vs.bind(3):vs.bind(3) + 1].assign(Tensor(np.ones((1, 1, D), np.float32)))
  items = cache.schedule()
  assert len(items) == 1  # just the write: no copy of the whole cache
  ast = items[0].ast
  assert kernel_name(ast) == "E_4" and items[0].bufs[0] is buf  # one token's D values, written in place
  cache.realize()
  want = np.zeros((1, MAXT, D), np.float32); want[:, 3] = 1
  np.testing.assert_array_equal(cache.numpy(), want)


def test_pending_writes_run_in_dependency_order():
  # like two KV caches of consecutive layers: a later write into c1 reads c0, which has its own pending write
  c0 = Tensor.zeros(4).contiguous().realize()
  c1 = Tensor.zeros(4).contiguous().realize()
  x = Tensor(np.ones(4, np.float32))
  c1[0:2].assign(x[:2] * 5)
  c0[0:2].assign(x[:2])
  r0 = c0.sum()
  c1[2:4].assign(x[2:] * r0)
  assert c1.sum().item() == 5 + 5 + 2 + 2
  np.testing.assert_array_equal(c0.numpy(), [1, 1, 0, 0])


def test_realizing_an_assign_runs_only_earlier_writes():
  c = Tensor.zeros(2).contiguous().realize()
  first = c[0:1].assign(Tensor([1.0]))
  c[0:1].assign(Tensor([7.0]))  # a later write into the same slot
  first.realize()
  from plugrad.engine.realize import buffer_for
  assert buffer_for(buffer_of(c.uop)).numpy().tolist() == [1.0, 0.0]  # the later write has not run yet
  assert c.numpy().tolist() == [7.0, 0.0]  # reading c runs the remaining write


def _collect() -> None:
  for _ in range(3): gc.collect()


def test_a_discarded_buffer_takes_its_pending_writes_with_it():
  # a model thrown away with unrealized in-place updates (BatchNorm's running statistics in training mode, a KV cache
  # written but never read): nothing can read the buffer any more, so it and its writes must be freed, not kept
  # forever (and while a write is pending every realize skips the plan cache's fast path)
  c = Tensor(np.zeros(4, np.float32))  # (not a realize plan's output: a plan keeps its last output for reuse)
  c[0:2].assign(Tensor([1.0, 2.0]) * 3)
  c.assign(c * 2)
  buf = weakref.ref(buffer_of(c.uop))
  del c
  _collect()
  assert buf() is None, "the buffer outlived every tensor that could read it"
  assert not tensor_module._pending_assigns, "a pending write into a freed buffer is still on the table"


def test_a_write_survives_its_own_tensor_while_the_buffer_lives():
  # the KV-cache pattern: the slice tensor that holds the write dies at once; a collection must not drop the write
  c = Tensor.zeros(4).contiguous().realize()
  c[1:3].assign(Tensor([5.0, 6.0]))
  _collect()
  assert c.numpy().tolist() == [0.0, 5.0, 6.0, 0.0]
  other = Tensor.zeros(4).contiguous().realize()
  other[0:1].assign(Tensor([9.0]))
  view = other[0:2]
  del other
  _collect()
  assert view.numpy().tolist() == [9.0, 0.0]  # a view of the buffer still reads it, so its write still runs


def test_a_pending_write_elsewhere_leaves_the_plan_path_open():
  # while a write into one buffer waits, realizes that don't read that buffer still run their cached plans; one that
  # reads it runs the write first
  a, b = Tensor(np.arange(4, dtype=np.float32)), Tensor(np.ones(4, np.float32))
  (a + b).realize(); (a + b).realize()  # the structure's plan is built
  b[0:1].assign(Tensor([5.0]))
  hits = plan.PLAN_STATS["hits"]
  assert (a * 2 + 1).realize().tolist() == [1.0, 3.0, 5.0, 7.0] and (a * 2 + 1).realize() is not None
  assert plan.PLAN_STATS["hits"] > hits, "a realize that reads no pending-written buffer skipped its plan"
  assert (a + b).tolist() == [5.0, 2.0, 3.0, 4.0]  # reads b: its write ran first
