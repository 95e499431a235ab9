"""examples/train_digits.py: a short jitted training run reaches >= 90% test accuracy on the real digits data, and the
trained model's eval-mode predictions equal an independent numpy forward pass over the same weights."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

_path = Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"
_spec = importlib.util.spec_from_file_location("train_digits", _path)
td = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(td)

STEPS = 150


@pytest.fixture(scope="module")
def trained():
  return td.train(steps=STEPS, batch=64, seed=0, progress=False)


def _np_forward(m, X: np.ndarray) -> np.ndarray:
  """float64 eval-mode forward of DigitsNet from its weights (direct convolution, running-stat BatchNorm)."""
  def conv3x3_same(x, w):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    H, W = x.shape[2:]
    return sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + H, j:j + W], w[:, :, i, j]) for i in range(3) for j in range(3))
  def bn(x, b):
    s = lambda t: t.numpy().astype(np.float64).reshape(1, -1, 1, 1)
    return (x - s(b.running_mean)) / np.sqrt(s(b.running_var) + b.eps) * s(b.weight) + s(b.bias)
  def pool2(x): return x.reshape(*x.shape[:2], x.shape[2] // 2, 2, x.shape[3] // 2, 2).max(axis=(3, 5))
  w = lambda t: t.numpy().astype(np.float64)
  x = pool2(np.maximum(bn(conv3x3_same(X.astype(np.float64), w(m.c1.weight)), m.bn1), 0))
  x = np.maximum(bn(conv3x3_same(x, w(m.c2.weight)), m.bn2), 0)
  return x.reshape(len(x), -1) @ w(m.l1.weight).T + w(m.l1.bias)


def test_split_is_fixed_and_stratified():
  a, b = td.load_digits_split(), td.load_digits_split()
  for x, y in zip(a, b): np.testing.assert_array_equal(x, y)
  X_train, Y_train, X_test, Y_test = a
  assert len(X_train) + len(X_test) == 1797 and X_train.shape[1:] == (1, 8, 8) and 0 <= X_train.min() and X_train.max() <= 1
  assert set(np.bincount(Y_test)) <= set(range(33, 39))  # about 20% of each class's ~180 images


def test_short_training_reaches_90_percent(trained):
  model, step = trained
  assert step.cnt == 2 and len(step.captured) > 10  # the later steps were replays of the captured kernels
  _, _, X_test, Y_test = td.load_digits_split()
  acc = td.evaluate(model, X_test, Y_test)
  assert acc >= 0.90, f"test accuracy {acc:.3f} after {STEPS} steps"
  # the running statistics moved away from their init, and the affine parameters are separate buffers from them
  assert int(model.bn1.num_batches_tracked.item()) == STEPS
  assert not np.allclose(model.bn1.running_mean.numpy(), 0) and not np.allclose(model.bn1.running_var.numpy(), 1)
  assert not np.array_equal(model.bn1.bias.numpy(), model.bn1.running_mean.numpy())


def test_eval_forward_matches_numpy(trained):
  model, _ = trained
  _, _, X_test, Y_test = td.load_digits_split()
  X, Y = X_test[:120], Y_test[:120]
  with td.Tensor.train(False): got = model(td.Tensor(X)).numpy()
  want = _np_forward(model, X)
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
  assert td.evaluate(model, X, Y) == pytest.approx(float((want.argmax(-1) == Y).mean()), abs=1.5 / len(Y))


def test_training_is_deterministic():
  """The same seed gives bit-identical weights; another seed gives other weights (init and batch order)."""
  from plugrad.nn.state import get_state_dict
  def weights(seed): return {k: v.numpy() for k, v in get_state_dict(td.train(steps=3, seed=seed, progress=False)[0]).items()}
  a, b, c = weights(3), weights(3), weights(4)
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  assert not np.array_equal(a["l1.weight"], c["l1.weight"])


@pytest.mark.parametrize("kw", [{"steps": 0}, {"batch": 1}, {"batch": 5000}, {"steps": 2.5}])
def test_bad_arguments_raise(kw):
  with pytest.raises(ValueError, match="steps|batch"): td.train(progress=False, **kw)
