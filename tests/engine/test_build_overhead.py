"""The cost structure of building and realizing small graphs, counted (objects, nodes, walks), not timed: what a scalar
operand or a relu makes, that realize-plan signatures are computed when nodes are built (a warm realize walks no
graph), that the shortcuts for binary signatures give the general merge's answer, and that a realized graph is freed
as soon as its last user drops it (no reference cycle left for the cycle collector)."""
import gc
import weakref

import numpy as np
import pytest

import plugrad.tensor as tensor_mod
import plugrad.uop.ops as ops_mod
from plugrad import Tensor
from plugrad.engine import plan
from plugrad.uop.ops import Ops, UOp


def _t(a) -> Tensor: return Tensor(np.asarray(a, np.float32)).realize()


class _CountingLive:
  """Stands in for the live-tensor set: counts the tensors made, delegates everything to the real set."""
  def __init__(self, real): self.real, self.added = real, 0
  def add(self, t): self.added += 1; self.real.add(t)
  def __iter__(self): return iter(self.real)
  def __len__(self): return len(self.real)


@pytest.fixture
def live(monkeypatch):
  c = _CountingLive(tensor_mod._all_tensors)
  monkeypatch.setattr(tensor_mod, "_all_tensors", c)
  if (real_add := getattr(tensor_mod, "_live_add", None)) is not None:  # Tensor's own constructor adds the reference itself
    def counting_add(ref):
      c.added += 1
      real_add(ref)
    monkeypatch.setattr(tensor_mod, "_live_add", counting_add)
  return c


def _new_nodes(fn):
  """(result, how many UOps fn created)."""
  first = next(ops_mod._seq)
  ret = fn()
  return ret, next(ops_mod._seq) - first - 1


@pytest.mark.parametrize("op,tensors,nodes", [(lambda t: t * 1.01, 1, 1), (lambda t: 0.5 + t, 1, 1), (lambda t: t < 2, 1, 1),
                                              (lambda t: t - 3, 3, 2), (lambda t: t / 4, 2, 1)])
def test_scalar_operand_makes_no_broadcast_tensors(live, op, tensors, nodes):
  """A Python scalar next to a tensor is one cached broadcast constant: no tensors for the constant, its reshape and
  its expand (and no new nodes for them) each time. (`t - 3` is t + -(3); `t / 4` wraps the constant for its casts.)"""
  a = _t(np.arange(8))
  want = op(a).numpy()  # the first use makes the constant (kept for the next uses); this graph is freed
  live.added = 0
  out, made = _new_nodes(lambda: op(a))
  assert live.added == tensors and 1 <= made <= nodes  # was 4 tensors and 4 nodes for `t * 1.01` (-3 may be cached)
  np.testing.assert_allclose(out.numpy(), want)


def test_relu_and_where_make_one_tensor(live):
  a = _t(np.arange(8) - 4.0)
  a.relu().numpy(); (a < 0).where(a, 2.5).numpy()
  live.added = 0
  r, made = _new_nodes(lambda: a.relu())
  assert live.added == 1 and made == 4  # CMPLT, CMPEQ, OR, WHERE
  live.added = 0
  w = (a < 0).where(a, 2.5)
  assert live.added == 2  # the condition and the where
  np.testing.assert_allclose(r.numpy(), np.maximum(np.arange(8) - 4.0, 0))
  np.testing.assert_allclose(w.numpy(), np.where(np.arange(8) < 4, np.arange(8) - 4.0, 2.5))


def test_warm_realize_computes_no_signature(monkeypatch):
  """Every node Tensor builds gets its structure id from its sources' when it is made: the warm realize of a freshly
  built 30-node chain is one lookup, not a walk over the chain (it was, at ~2 us a node)."""
  def chain(t):
    for i in range(10): t = t * 1.01 + 0.5 if i % 2 else (t * 0.99).relu()
    return t
  a = _t(np.linspace(-1, 1, 16))
  ref = chain(a).realize().numpy()
  t = chain(a)  # fresh nodes (the first chain's graph is gone): their signatures are computed here
  nodes = [n for n in t.uop.toposort(memo=False) if n.op not in (Ops.UNIQUE, Ops.DEVICE)]  # (a buffer's own sources)
  assert len(nodes) >= 30 and all(n._cache is not None and "plan" in n._cache for n in nodes)
  calls = []
  real = plan._node_sig
  monkeypatch.setattr(plan, "_node_sig", lambda n, kids: calls.append(n) or real(n, kids))
  t.realize()
  assert not calls  # nothing computed at realize
  np.testing.assert_allclose(t.numpy(), ref)


def test_graph_on_new_data_is_seeded(monkeypatch):
  """A tensor made from data (a new buffer) is a leaf whose signature needs nothing: the graph built on it is
  seeded from the start, so its first warm realize walks nothing either."""
  x0 = _t(np.arange(6))
  ((x0 * 2).reshape(2, 3).sum(1) + 1).realize()  # the structure, planned
  x = Tensor(np.arange(6, dtype=np.float32) * 3)  # new data, never realized before
  t = (x * 2).reshape(2, 3).sum(1) + 1
  nodes = [n for n in t.uop.toposort(memo=False) if n.op not in (Ops.UNIQUE, Ops.DEVICE)]  # (a buffer's own sources)
  assert len(nodes) >= 5 and all(n._cache is not None and "plan" in n._cache for n in nodes)
  calls = []
  real = plan._node_sig
  monkeypatch.setattr(plan, "_node_sig", lambda n, kids: calls.append(n) or real(n, kids))
  np.testing.assert_allclose(t.numpy(), (np.arange(6) * 6).reshape(2, 3).sum(1) + 1)
  assert not calls


def _oracle(n: UOp, memo: dict) -> tuple:
  """(structure key, leaves) of n by the general rule: leaves in first-appearance order, each source's leaves as
  positions in them."""
  if n in memo: return memo[n]
  if n.op in plan._LEAF_OPS: ret: tuple = (("leaf", plan._node_sig(n, [])[1]), (n,))
  else:
    kids = [_oracle(s, memo) for s in n.src]
    leaves: list = []
    for _, kl in kids:
      leaves += [x for x in kl if x not in leaves]
    ret = ((n.op, n.dtype._key, n.arg, tuple((k, tuple(leaves.index(x) for x in kl)) for k, kl in kids)), tuple(leaves))
  memo[n] = ret
  return ret


def test_binary_signature_shortcuts_match_the_general_merge():
  """Random graphs over three buffers and constants: two nodes get the same structure id exactly when the general
  rule gives them the same key, and each node's leaves are the general rule's."""
  rng = np.random.default_rng(1)
  base = [_t(rng.random(6)) for _ in range(3)]
  by_key: dict = {}
  for _ in range(60):
    pool = list(base)
    for _ in range(int(rng.integers(1, 6))):
      x, y = pool[int(rng.integers(len(pool)))], pool[int(rng.integers(len(pool)))]
      pick = int(rng.integers(4))
      pool.append(x + y if pick == 0 else x * 2.0 if pick == 1 else (x < y).where(x, y) if pick == 2 else x.relu() - y)
    for t in pool[3:]:
      sig = plan.signature(t.uop)
      key, leaves = _oracle(t.uop, {})
      assert sig[2] == leaves
      assert by_key.setdefault(key, sig[1]) == sig[1]
  ids = list(by_key.values())
  assert len(set(ids)) == len(ids)  # different keys, different ids


def test_realized_graph_is_freed_without_the_cycle_collector():
  """A realize's temporary SINK memoized its toposort, which holds the SINK itself: a reference cycle keeping the
  realized graph (and what its nodes hold) alive until Python's cycle collector ran."""
  a, b = _t(np.arange(4)), _t(np.ones(4))
  gc.collect()
  gc.disable()
  try:
    t = (a + b) * 7.25  # a structure not scheduled before: the normal path (scheduler, memory planner)
    node = weakref.ref(t.uop)
    np.testing.assert_allclose(t.numpy(), (np.arange(4) + 1) * 7.25)
    del t
    assert node() is None
  finally:
    gc.enable()


def test_toposort_memo_false_leaves_no_memo():
  a = _t(np.arange(3))
  s = UOp.sink_of((a + 1).uop, (a * 2).uop)
  assert len(s.toposort(memo=False)) == len(s.toposort())
  s2 = UOp.sink_of((a - 1).uop)
  s2.toposort(memo=False)
  assert s2._cache is None or "topo" not in s2._cache
  assert list(s2.toposort(memo=False))[-1] is s2 and s2.op is Ops.SINK


def test_matmul_2d_makes_one_tensor_and_the_general_graph(live):
  """`a @ b` of two 2-D float tensors builds its 8 nodes directly (was 7 Tensors: each reshape, permute, expand and the
  multiply a Tensor of its own; 70 -> 22 us for matmul 256): the very graph the general path makes (same nodes, so the
  same kernels and gradients), and the general path still serves batches, vectors and mixed or accumulation dtypes."""
  an, bn = np.random.default_rng(0).standard_normal((2, 6, 5)).astype(np.float32)[:, :, :5], np.ones((5, 4), np.float32)
  a, b = _t(an[0]), _t(bn)
  live.added = 0
  out = a @ b
  assert live.added == 1
  general = (a.reshape(6, 1, 5) * b.reshape(1, 5, 4).permute(0, 2, 1)).sum(-1)
  assert out.uop is general.uop
  np.testing.assert_allclose(out.numpy(), an[0] @ bn, rtol=1e-6)
  ga, gb = Tensor(an[0], requires_grad=True), Tensor(bn, requires_grad=True)
  (ga @ gb).square().sum().backward()
  y = an[0].astype(np.float64) @ bn
  np.testing.assert_allclose(ga.grad.numpy(), 2 * y @ bn.T, rtol=1e-5)
  np.testing.assert_allclose(gb.grad.numpy(), an[0].T.astype(np.float64) @ (2 * y), rtol=1e-5)
  for x, w in [(_t(an), b), (_t(an[0, 0]), b), (a, _t(bn[:, 0])), (a.cast("float16"), b.cast("float16"))]:
    ref = x.numpy().astype(np.float32) @ w.numpy().astype(np.float32)
    np.testing.assert_allclose((x @ w).numpy().astype(np.float32), ref, rtol=2e-3, atol=2e-3)
  np.testing.assert_allclose(a.dot(b, dtype="float64").numpy(), an[0].astype(np.float64) @ bn, rtol=1e-6)
