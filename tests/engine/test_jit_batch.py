"""TinyJit batched replay (the device's `batch_runner`, one C call per stretch of CPU kernels): the same results as
replaying item by item (JIT_BATCH=0), with inputs swapped, symbolic variables changing and copies in the capture."""
import numpy as np
import pytest

from plugrad import Tensor, TinyJit, Variable
from plugrad.device import Device
from plugrad.engine.realize import GlobalCounters

rng = np.random.default_rng(1)
W = rng.standard_normal((16, 16)).astype(np.float32)
X = rng.standard_normal((12, 16)).astype(np.float32)


@pytest.fixture(autouse=True)
def _on_cpu(monkeypatch):
  """The batch runner under test is the CPU device's: these tests run there whatever DEV says (DEV=PYTHON has none)."""
  monkeypatch.setattr(Device, "DEFAULT", "CPU")


def _batched(f: TinyJit) -> int:
  """How many captured kernels a batch runner replays."""
  return sum(len(its) for b, its, _ in f.plan if b is not None)


def _mlp(w: Tensor):
  def f(x, y): return ((x @ w).relu() + y).softmax(axis=1) * 2 - y
  return f


def _ref(x, y):
  z = np.maximum(x @ W, 0) + y
  e = np.exp(z - z.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True) * 2 - y


@pytest.mark.parametrize("batch", ["1", "0"])
def test_replay_matches_numpy_with_inputs_swapped(monkeypatch, batch):
  monkeypatch.setenv("JIT_BATCH", batch)
  f = TinyJit(_mlp(Tensor(W).realize()))
  for _ in range(6):  # fresh input tensors (new buffers) every call, and the same tensor passed twice
    x, y = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(f(Tensor(x), Tensor(y)).numpy(), _ref(x, y), rtol=1e-5, atol=1e-5)
  tx = Tensor(x).realize()
  np.testing.assert_allclose(f(tx, tx).numpy(), _ref(x, x), rtol=1e-5, atol=1e-5)
  a, b = Tensor(y).realize(), Tensor(x).realize()  # swapped roles
  np.testing.assert_allclose(f(a, b).numpy(), _ref(y, x), rtol=1e-5, atol=1e-5)
  assert _batched(f) == (sum(e.runner is not None for e in f.captured) if batch == "1" else 0)
  assert (_batched(f) > 1) == (batch == "1")


def test_batch_is_used_and_counts_kernels():
  f = TinyJit(_mlp(Tensor(W).realize()))
  x = Tensor(X[:4]).realize()
  for _ in range(2): f(x, x)
  n = sum(e.runner is not None for e in f.captured)
  assert n > 1 and _batched(f) == n
  calls = []
  def spy(run):
    def call(var_vals, slots): calls.append(len(slots)); run(var_vals, slots)
    return call
  f.plan = [(spy(b) if b is not None else None, its, sl) for b, its, sl in f.plan]
  k0 = GlobalCounters["kernels"]
  np.testing.assert_allclose(f(x, x).numpy(), _ref(X[:4], X[:4]), rtol=1e-5, atol=1e-5)
  assert calls and GlobalCounters["kernels"] - k0 == n


@pytest.mark.parametrize("batch", ["1", "0"])
def test_symbolic_variables_change_between_replays(monkeypatch, batch):
  monkeypatch.setenv("JIT_BATCH", batch)
  v = Variable("rows", 1, 12)
  w = Tensor(W).realize()
  @TinyJit
  def f(x, n): return ((x[:n] @ w).relu().contiguous() * 3).sum(axis=1).contiguous() + 1
  x = Tensor(X).realize()
  for n in (3, 5, 12, 1, 7, 7, 2):
    np.testing.assert_allclose(f(x, v.bind(n)).numpy(), (np.maximum(X[:n] @ W, 0) * 3).sum(1) + 1, rtol=1e-5, atol=1e-4)
  x2 = rng.standard_normal((12, 16)).astype(np.float32)
  np.testing.assert_allclose(f(Tensor(x2), v.bind(9)).numpy(), (np.maximum(x2[:9] @ W, 0) * 3).sum(1) + 1, rtol=1e-5, atol=1e-4)
  assert (_batched(f) > 1) == (batch == "1")


def test_large_kernels_use_the_pool_in_a_batch():
  n = 512  # enough work per kernel for several cores when the machine has them
  a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
  f = TinyJit(lambda x, y: ((x @ y).relu() + x) @ y)
  for _ in range(3):
    a = rng.standard_normal((n, n)).astype(np.float32)
    out = f(Tensor(a), Tensor(b)).numpy()
    np.testing.assert_allclose(out, (np.maximum(a @ b, 0) + a) @ b, rtol=1e-3, atol=1e-2)
  assert _batched(f) > 1


@pytest.mark.parametrize("batch", ["1", "0"])
def test_copies_split_the_batches(monkeypatch, batch):
  monkeypatch.setenv("JIT_BATCH", batch)
  def g(x):
    y = ((x + 1).contiguous() * 3).contiguous().to("CPU:1")
    return ((y - 2).contiguous() * y).contiguous().to("CPU") + x
  f = TinyJit(g)
  for _ in range(4):
    a = rng.standard_normal(8).astype(np.float32)
    y = (a + 1) * 3
    np.testing.assert_allclose(f(Tensor(a, device="CPU")).numpy(), (y - 2) * y + a, rtol=1e-5, atol=1e-5)
  assert any(e.runner is None for e in f.captured)
  devs = [b.items[0].runner.device for b, _, _ in f.plan if b is not None]
  assert devs == (["CPU", "CPU:1"] if batch == "1" else [])
