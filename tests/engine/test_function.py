"""@function: traced CALL nodes with PARAM placeholders, implicit captures, dedup, symbolic inputs, nesting, gradients,
and schedule reuse across calls."""
import subprocess
import sys

import numpy as np
import pytest

from plugrad import Tensor, Variable, function
from plugrad.schedule.kernelize import SCHEDULE_STATS
from plugrad.uop.ops import Ops

W = np.arange(6, dtype=np.float32).reshape(3, 2) - 2


class Lin:
  def __init__(self, w): self.w = w
  @function
  def __call__(self, x): return (x @ self.w).relu()


def test_call_node_named_after_qualname_with_param_body():
  m = Lin(Tensor(W))
  y = m(Tensor(np.ones((2, 3), np.float32)))
  assert y.uop.op is Ops.CALL and y.uop.arg == "Lin.__call__"
  assert any(n.op is Ops.PARAM for n in y.uop.src[0].toposort())
  np.testing.assert_allclose(y.numpy(), np.maximum(np.ones((2, 3)) @ W, 0))


@pytest.mark.parametrize("realized", [True, False])
def test_implicit_capture_realized_or_not(realized):
  w = Tensor(W) if realized else Tensor(W) * 1  # unrealized: a lazy graph captured in the body
  if realized: w.realize()
  x = np.full((2, 3), 0.5, np.float32)
  np.testing.assert_allclose(Lin(w)(Tensor(x)).numpy(), np.maximum(x @ W, 0))


def test_duplicate_inputs_share_a_param_and_schedule_is_reused():
  @function
  def f(a, b): return a * b + a
  x = Tensor(np.arange(4, dtype=np.float32))
  out = f(x, x)
  assert len(out.uop.src) == 2  # body + one input: the duplicate was folded
  np.testing.assert_allclose(out.numpy(), np.arange(4) ** 2 + np.arange(4))
  hits = SCHEDULE_STATS["hits"]
  for i in range(3):
    y = Tensor(np.full(4, float(i), np.float32))
    np.testing.assert_allclose(f(y, y).numpy(), np.full(4, i * i + i))
  assert SCHEDULE_STATS["hits"] == hits + 3


def test_symbolic_slices_and_bound_variables():
  @function
  def f(a, b): return (a * b).sum()
  v = Variable("n", 1, 8)
  a, b = Tensor(np.arange(8, dtype=np.float32)), Tensor(np.ones(8, np.float32))
  for n in (2, 5, 8): assert f(a[:v.bind(n)], b[:v.bind(n)]).item() == sum(range(n))


def test_nested_calls():
  @function
  def inner(a, b): return a * b
  @function
  def outer(a): return inner(a, a + 1).sum()
  assert outer(Tensor([1.0, 2.0])).item() == 1 * 2 + 2 * 3


def test_gradients_flow_to_inputs_and_captured_params_and_unused_get_zero():
  w = Tensor(W, requires_grad=True)
  unused = Tensor(np.ones(3, np.float32), requires_grad=True)
  @function
  def f(x): return (x @ w).sum()
  x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
  loss = f(x) + (unused * 0).sum() * 0
  loss.backward()
  np.testing.assert_allclose(w.grad.numpy(), np.full((3, 2), 2.0))
  np.testing.assert_allclose(x.grad.numpy(), np.tile(W.sum(1), (2, 1)))
  np.testing.assert_allclose(unused.grad.numpy(), np.zeros(3))


def test_bad_use():
  with pytest.raises(TypeError, match="needs a callable"): function(3)
  with pytest.raises(TypeError, match="must return Tensors"): function(lambda x: 3)(Tensor([1.0]))


def test_debug_reports_schedule_cache_hits_and_misses():
  code = ("from plugrad import Tensor, function\n"
          "f = function(lambda a: a * 2 + 1)\n"
          "for i in range(3): f(Tensor([float(i)])).numpy()\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"DEBUG": "1", "PATH": "/usr/bin:/bin"}, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.count("schedule cache miss") >= 1 and out.stdout.count("schedule cache hit") >= 2
