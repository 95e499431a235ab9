"""Realize plans (engine/plan.py): a warm realize of a structure seen before runs its cached plan, with right values
for new buffers, bound variables, freed and reused buffers, TinyJit, and caches that were cleared."""
import numpy as np
import pytest

import plugrad.tensor as tensor_mod
from plugrad import Tensor, TinyJit
from plugrad.engine import plan
from plugrad.schedule import kernelize
from plugrad.schedule.kernelize import SCHEDULE_STATS
from plugrad.uop.buffers import is_buffer_view
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.shape import device_of
from plugrad.viz import capture


def _t(a) -> Tensor: return Tensor(np.asarray(a, np.float32)).realize()


@pytest.fixture
def schedules(monkeypatch):
  """Counts calls of the scheduler from Tensor (the slow path)."""
  calls = []
  real = tensor_mod.create_schedule
  def counting(*a, **k):
    calls.append(1)
    return real(*a, **k)
  monkeypatch.setattr(tensor_mod, "create_schedule", counting)
  return calls


def test_second_realize_takes_the_plan(schedules):
  rng = np.random.default_rng(0)
  xs = [rng.random(37, np.float32) for _ in range(4)]
  a, b = _t(xs[0]), _t(xs[1])
  ((a * 3 + b).relu()).realize()  # first: scheduled (and planned)
  n, hits = len(schedules), plan.PLAN_STATS["hits"]
  for i in range(3):
    a2, b2 = _t(xs[i % 4] + i), _t(xs[(i + 1) % 4])  # new buffers each time, same structure
    out = (a2 * 3 + b2).relu().numpy()
    np.testing.assert_allclose(out, np.maximum((xs[i % 4] + i) * 3 + xs[(i + 1) % 4], 0), rtol=1e-6)
  assert len(schedules) == n and plan.PLAN_STATS["hits"] == hits + 3


def test_plan_hit_counts_as_schedule_cache_hit():
  a, b = _t(np.ones(5)), _t(np.ones(5))
  (a - b).realize()
  h, m = SCHEDULE_STATS["hits"], SCHEDULE_STATS["misses"]
  (a - b * 1).realize(); (_t(np.zeros(5)) - _t(np.ones(5))).realize()
  assert SCHEDULE_STATS["misses"] == m + 1 and SCHEDULE_STATS["hits"] == h + 1  # `b * 1` is a new structure


def test_shared_inputs_are_not_confused():
  x, y = _t(np.arange(6)), _t(np.arange(6) * 10)
  np.testing.assert_allclose((x + y).numpy(), np.arange(6) * 11)
  np.testing.assert_allclose((x + x).numpy(), np.arange(6) * 2)  # one leaf used twice: another structure
  np.testing.assert_allclose((y + x).numpy(), np.arange(6) * 11)
  np.testing.assert_allclose((x + x).numpy(), np.arange(6) * 2)


def test_negative_zero_and_nan_constants_are_other_structures():
  x = _t([1.0, -2.0])
  with np.errstate(divide="ignore"):  # (a broken structure key gives the second the first's kernel: [inf, -inf])
    assert list(1 / (x * 0.0).numpy()) == [np.inf, -np.inf]
    assert list(1 / (x * -0.0).numpy()) == [-np.inf, np.inf]
  assert np.isnan((x + float("nan")).numpy()).all() and np.isnan((x + float("nan")).numpy()).all()


def test_reused_output_never_clobbers_a_live_result():
  a, b = _t(np.full(8, 1.0)), _t(np.full(8, 2.0))
  (a + b).realize()  # dropped: its buffer may be reused
  kept = (a + b).realize()
  views = [(kept + 0).realize(), kept.reshape(2, 4)]
  others = [(_t(np.full(8, float(i))) + b).realize() for i in range(4)]  # same structure, other inputs
  np.testing.assert_allclose(kept.numpy(), 3.0)
  np.testing.assert_allclose(views[1].numpy(), np.full((2, 4), 3.0))
  for i, o in enumerate(others): np.testing.assert_allclose(o.numpy(), i + 2.0)


def test_output_reused_when_unreachable():
  a, b = _t(np.ones(16)), _t(np.ones(16))
  for _ in range(3): (a * b).realize()
  before = plan.PLAN_STATS["reused"]
  (a * b).realize()
  assert plan.PLAN_STATS["reused"] == before + (1 if plan._getrefcount is not None else 0)


def test_after_inputs_are_freed():
  a, b = _t(np.arange(10)), _t(np.ones(10))
  np.testing.assert_allclose((a * b + 1).numpy(), np.arange(10) + 1)
  del a, b
  c, d = _t(np.arange(10) * 2), _t(np.full(10, 3.0))
  np.testing.assert_allclose((c * d + 1).numpy(), np.arange(10) * 6 + 1)


def test_bound_variables_take_each_realizes_value():
  v = UOp.variable("pv", 1, 100)
  x = _t(np.arange(4))
  for val in (3, 7, 3, 50):
    out = (x + Tensor.from_sint(v.bind(val)).cast("float32")).numpy()
    np.testing.assert_allclose(out, np.arange(4) + val)


def test_conflicting_binds_still_raise():
  v = UOp.variable("pq", 1, 9)
  x = _t(np.zeros(2))
  s = lambda k: Tensor.from_sint(v.bind(k)).cast("float32")
  (x + s(2) + s(2)).realize()
  (x + s(3) + s(3)).realize()
  with pytest.raises(RuntimeError, match="bind mismatch"): (x + s(2) + s(3)).realize()


def test_tinyjit_over_planned_realizes():
  f = TinyJit(lambda p, q: (p * 2 + q).realize())
  rng = np.random.default_rng(1)
  outs = []
  for i in range(5):
    p, q = rng.random(9, np.float32), rng.random(9, np.float32)
    outs.append((f(_t(p), _t(q)), p * 2 + q))
    ((_t(p) * 2 + _t(q)) * 1).realize(); (_t(q) * 2 + _t(p)).realize()  # eager realizes of the same structure in between
    np.testing.assert_allclose(outs[-1][0].numpy(), outs[-1][1], rtol=1e-6)
  assert f.cnt == 2


def test_cleared_caches_take_the_normal_path(monkeypatch, schedules):
  a, b = _t(np.ones(3)), _t(np.ones(3))
  (a / b).realize()
  n = len(schedules)
  monkeypatch.setattr(kernelize, "_SCHEDULE_CACHE", {})
  np.testing.assert_allclose((a / b).numpy(), 1.0)
  assert len(schedules) == n + 1


def test_viz_takes_the_normal_path(monkeypatch, schedules):
  a = _t(np.ones(3))
  (a.exp2()).realize()
  n = len(schedules)
  monkeypatch.setattr(capture, "VIZ", True)
  assert plan.lookup(plan.targets_signature([a.exp2().uop])) is None
  monkeypatch.setattr(capture, "VIZ", False)
  (a.exp2()).realize()
  assert len(schedules) == n


def test_matmul_plan_with_packing_kernels(schedules):
  rng = np.random.default_rng(2)
  xs = [rng.random((64, 64), np.float32) for _ in range(3)]
  (_t(xs[0]) @ _t(xs[1])).realize()
  n = len(schedules)
  for i in range(3):
    np.testing.assert_allclose((_t(xs[i]) @ _t(xs[(i + 1) % 3])).numpy(), xs[i] @ xs[(i + 1) % 3], rtol=1e-4, atol=1e-4)
  assert len(schedules) == n


def test_intermediate_buffers_are_not_planned():
  x = _t(np.arange(8))
  y = x - x.sum()  # the sum is realized into its own buffer first
  key = plan.targets_signature([y.uop])
  y.realize()
  assert plan._PLANS.get(key[0], 0) is None
  np.testing.assert_allclose((x - x.sum()).numpy(), np.arange(8) - 28)


def test_lazy_tensor_over_a_realized_node_is_repointed():
  a, b = _t(np.ones(4)), _t(np.ones(4))
  (a + b).realize()
  c = a + b
  d = c * 3  # built on c's node: must read c's buffer after c realizes
  c.realize()
  assert is_buffer_view(c.uop) and c.uop in d.uop.toposort()
  np.testing.assert_allclose(d.numpy(), 6.0)


def test_device_of_caches_the_chain():
  x = _t(np.ones(3))
  y = x
  for _ in range(50): y = y + 1
  device_of(y.uop)
  n, k = y.uop, 0
  while n.op is Ops.ADD:
    assert n._cache is not None and n._cache.get("device") == "CPU"
    n, k = n.src[0], k + 1
  assert k == 50


def test_large_outputs_are_not_kept(monkeypatch):
  monkeypatch.setattr(plan, "REUSE_MAX_BYTES", 32)
  a = _t(np.ones(64))
  for _ in range(3): (a + 2).realize()
  p = plan.lookup(plan.targets_signature([(a + 2).uop]))
  assert p is not None and p.last == [None]
  np.testing.assert_allclose((a + 2).numpy(), 3.0)


def test_plan_table_is_bounded(monkeypatch):
  monkeypatch.setattr(plan, "MAX_PLANS", 4)
  x = _t(np.ones(3))
  for i in range(10): np.testing.assert_allclose((x * (i + 0.5)).numpy(), i + 0.5)
  assert len(plan._PLANS) <= 4


def test_unplannable_shared_subgraphs_are_walked_once(monkeypatch):
  # regression: a node found unplannable was not recognized as already signed, so every path into it walked it again:
  # a chain of diamonds over a symbolic slice took 2^depth steps (the batched LLM prefill never finished)
  calls = []
  real = plan._node_sig
  monkeypatch.setattr(plan, "_node_sig", lambda n, kids: calls.append(n) or real(n, kids))
  v = UOp.variable("pd", 1, 8).bind(5)
  y = _t(np.ones(8))[:v]
  for _ in range(16): y = y + y * 0.5
  assert plan.signature(y.uop) is None
  assert len(calls) == len(set(calls)) <= len(y.uop.toposort())
  calls.clear()
  assert plan.signature(y.uop) is None and calls == []  # memoized: the second look costs nothing
