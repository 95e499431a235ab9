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


def test_changed_non_tensor_argument_gets_its_own_capture():
  """k = 1, 2, 3, 4 returned the k=2 capture's result from the third call on; each value now has its own capture."""
  calls = []
  @TinyJit
  def f(x, k):
    calls.append(k)
    return (x * k).realize()
  x = Tensor([1., 2., 3.]).realize()
  for k in [1, 2, 3, 4, 2, 2, 2, 3, 3, 3.0, -0.0, 0.0]:
    assert f(x, k).tolist() == [k * 1., k * 2., k * 3.], k
  assert calls == [1, 2, 3, 4, 2, 3, 3.0, -0.0, 0.0]  # 2 and 3 replayed once captured; 3.0 is another key than 3
  assert f(Tensor([2., 2., 2.]), 3).tolist() == [6., 6., 6.]  # a replay with a new input


def test_non_tensor_keys_kwargs_containers_and_objects():
  @TinyJit
  def f(x, *, opts, scale=1.0): return (x * opts["a"] + opts["b"][0] * scale).realize()
  x = Tensor([1., 2.]).realize()
  for a, b, s in [(1, (0,), 1.0), (2, (5,), 1.0), (2, (5,), 2.0), (1, (0,), 1.0)] * 3:
    assert f(x, opts={"a": a, "b": [b[0]]}, scale=s).tolist() == [a + b[0] * s, 2 * a + b[0] * s]
  class Scale:
    def __init__(self, k: float): self.k = k
  g = TinyJit(lambda x, m: (x * m.k).realize())
  m2, m3 = Scale(2.), Scale(3.)
  for _ in range(3): assert g(x, m2).tolist() == [2., 4.] and g(x, m3).tolist() == [3., 6.]  # objects by identity
  with pytest.raises(JitError, match="numpy array"): g(x, np.ones(2))


def test_jitted_method_of_two_instances():
  class Model:
    def __init__(self, k): self.w = Tensor(np.full((2, 2), k, np.float32)).realize()
    @TinyJit
    def __call__(self, x): return (x @ self.w).realize()
  a, b = Model(1.), Model(2.)
  x = Tensor(np.ones((1, 2), np.float32)).realize()
  for _ in range(4): assert a(x).tolist() == [[2., 2.]] and b(x).tolist() == [[4., 4.]]


def test_keyword_order_is_part_of_the_key():
  f = TinyJit(lambda a, b: (a - b).realize())
  one, two = Tensor([1.]).realize(), Tensor([2.]).realize()
  for _ in range(3): assert f(a=one, b=two).tolist() == [-1.] and f(b=two, a=one).tolist() == [-1.]


def test_too_many_keys_warns_and_stays_right():
  from plugrad.engine.jit import MAX_CAPTURES, JitWarning
  f = TinyJit(lambda x, k: (x + k).realize())
  x = Tensor([0.]).realize()
  with pytest.warns(JitWarning, match="more than"):
    for k in range(MAX_CAPTURES + 3): assert f(x, k).tolist() == [float(k)]
  assert len(f._captures) == MAX_CAPTURES
