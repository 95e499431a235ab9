"""In-place slice assign for KV caches: symbolic start/T, seen by later reads in the same graph, no full-buffer copies,
and the same results under TinyJit as without it."""
import numpy as np

from plugrad import Tensor, TinyJit, Variable
from plugrad.codegen import kernel_name
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
