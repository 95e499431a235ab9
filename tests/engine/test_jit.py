"""TinyJit: run, capture, replay with new inputs; multiple outputs, kwargs, methods, errors, JIT=0."""
import numpy as np
import pytest

from plugrad import Tensor, TinyJit
from plugrad.engine.jit import JitError

rng = np.random.default_rng(0)
W = rng.standard_normal((8, 8)).astype(np.float32)


def test_capture_then_replay_matches_eager():
  w = Tensor(W).realize()
  calls = []
  @TinyJit
  def f(x):
    calls.append(1)
    return ((x @ w).relu() + 1).sum(axis=1)
  for i in range(5):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(f(Tensor(x)).numpy(), (np.maximum(x @ W, 0) + 1).sum(1), rtol=1e-5, atol=1e-5)
  assert len(calls) == 2 and f.cnt == 2  # called for the plain run and the capture, then replayed
  assert len(f.captured) >= 1


def test_multiple_outputs_and_kwargs():
  @TinyJit
  def f(a, *, b):
    return a + b, a * b
  for _ in range(4):
    a, b = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    s, p = f(Tensor(a), b=Tensor(b))
    np.testing.assert_allclose(s.numpy(), a + b, rtol=1e-6)
    np.testing.assert_allclose(p.numpy(), a * b, rtol=1e-6)


def test_outputs_are_reused_buffers():
  f = TinyJit(lambda x: x * 2)
  outs = [f(Tensor(np.full(3, i, np.float32))) for i in range(4)]
  assert outs[2] is outs[3]  # replays return the capture's tensors, refilled
  np.testing.assert_array_equal(outs[3].numpy(), [6, 6, 6])


def test_method():
  class Model:
    def __init__(self): self.w = Tensor(W).realize()
    @TinyJit
    def __call__(self, x): return x @ self.w
  m = Model()
  for _ in range(4):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(m(Tensor(x)).numpy(), x @ W, rtol=1e-5, atol=1e-5)


def test_changed_input_shape_or_dtype_is_an_error():
  f = TinyJit(lambda x: x + 1)
  for _ in range(3): f(Tensor(np.zeros(4, np.float32)))
  with pytest.raises(JitError, match=r"input 0 changed"): f(Tensor(np.zeros(5, np.float32)))
  with pytest.raises(JitError, match=r"input 0 changed"): f(Tensor(np.zeros(4, np.int32)))
  with pytest.raises(JitError, match="2 tensor inputs"): TinyJit.__call__(f, Tensor(np.zeros(4, np.float32)), Tensor(np.zeros(4, np.float32)))
  f.reset()
  np.testing.assert_array_equal(f(Tensor(np.zeros(5, np.float32))).numpy(), np.ones(5))


def test_jit_disabled(monkeypatch):
  monkeypatch.setenv("JIT", "0")
  calls = []
  @TinyJit
  def f(x):
    calls.append(1)
    return x + 1
  for i in range(4): assert f(Tensor([float(i)])).tolist() == [i + 1.0]
  assert len(calls) == 4


def test_not_callable():
  with pytest.raises(TypeError, match="needs a callable"): TinyJit(3)
