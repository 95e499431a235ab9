"""Conformance tests for rearrange (einops patterns), qr, svd, contiguous_backward and from_blob against numpy
references (einops itself: the [conformance] extra); device-generic. QR/SVD values are checked on hypothesis-generated
matrices (tall, wide, batched, rank-deficient): reconstruction, orthogonality, triangularity, values vs numpy.linalg."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrad.device import Device
from plugrad.tensor import Tensor
from plugrad.tensor_ops import TensorError
from plugrad.testing.helpers import oracle


# ***** rearrange *****
_X = np.arange(2 * 3 * 4 * 6).reshape(2, 3, 4, 6).astype(np.float32)
_CASES = [  # (formula, sizes, numpy reference)
  ("a b c d -> d c b a", {}, lambda x: x.transpose(3, 2, 1, 0)),
  ("a b c d -> a (b c) d", {}, lambda x: x.reshape(2, 12, 6)),
  ("a b c (d1 d2) -> a d2 b d1 c", {"d1": 2}, lambda x: x.reshape(2, 3, 4, 2, 3).transpose(0, 4, 1, 3, 2)),
  ("a ... d -> d ... a", {}, lambda x: x.transpose(3, 1, 2, 0)),
  ("a ... -> a (...)", {}, lambda x: x.reshape(2, 72)),
  ("... d -> (d ...)", {}, lambda x: x.transpose(3, 0, 1, 2).reshape(-1)),
  ("a b c d -> a 1 b () c d 1", {}, lambda x: x.reshape(2, 1, 3, 1, 4, 6, 1)),
  ("a b c d -> (a b c d)", {}, lambda x: x.reshape(-1)),
  ("... -> ...", {}, lambda x: x),
  ("a b c (h w) -> (a h) (b c w)", {"w": 3}, lambda x: x.reshape(2, 3, 4, 2, 3).transpose(0, 3, 1, 2, 4).reshape(4, 36)),
]


@pytest.mark.parametrize("formula,sizes,ref", _CASES, ids=[c[0] for c in _CASES])
def test_rearrange_matches_numpy(formula, sizes, ref):
  got = Tensor(_X).rearrange(formula, **sizes)
  want = ref(_X)
  assert got.shape == want.shape
  np.testing.assert_array_equal(got.numpy(), want)


def test_rearrange_unit_axes_and_gradient():
  x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 1, 3))
  assert x.rearrange("a 1 b -> b a").shape == (3, 2)
  w = np.arange(6, dtype=np.float32).reshape(3, 2)
  (g,) = (x.rearrange("a () b -> b a") * Tensor(w)).sum().gradient(x)
  np.testing.assert_array_equal(g.numpy(), w.T.reshape(2, 1, 3))


@pytest.mark.parametrize("formula,sizes,match", [
  ("a b -> a", {}, "only one side"), ("a b c d", {}, "one '->'"), ("a b -> b a -> a b", {}, "one '->'"),
  ("a a b c -> a b c", {}, "twice"), ("a b c (d e) -> a b c d e", {}, "infer"), ("a b c -> a b c", {}, "has 3 dims"),
  ("a (b ...) c d -> a b c d", {}, "inside parentheses"), ("a b c (d1 d2) -> a b c d1 d2", {"d1": 5}, "split"),
  ("a b c d -> a b c d", {"e": 2}, "not on the left"), ("a b c d -> a b c d", {"a": 3}, "doesn't match"),
  ("a b c _d -> a b c _d", {}, "invalid axis"), ("a b c (d -> a b c d", {}, "unbalanced"), ("a b c d) -> a b c d", {}, "unbalanced"),
  ("a b c ((d)) -> a b c d", {}, "nested"), ("a b c d -> a b c d", {"a": -2}, "non-negative"),
])
def test_rearrange_errors_name_the_problem(formula, sizes, match):
  with pytest.raises(TensorError, match=match): Tensor(_X).rearrange(formula, **sizes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rearrange_fuzz_against_einops(data):
  """A random shape split into named axes, some grouped on the left, permuted and regrouped on the right."""
  einops = oracle("einops", "rearrange")  # in the [conformance] extra: missing, the test fails rather than skips
  n = data.draw(st.integers(1, 5))
  atoms = [f"x{i}" for i in range(n)]
  sizes = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
  def groups(order):
    out, i = [], 0
    while i < len(order):
      k = data.draw(st.integers(1, min(3, len(order) - i)))
      out.append(order[i:i + k]); i += k
    return out
  left = groups(atoms)
  right = groups(data.draw(st.permutations(atoms)))
  side = lambda gs: " ".join(g[0] if len(g) == 1 else "(" + " ".join(g) + ")" for g in gs)
  formula = f"{side(left)} -> {side(right)}"
  shape = tuple(int(np.prod([sizes[atoms.index(a)] for a in g])) for g in left)
  given_sizes = {g[0]: sizes[atoms.index(g[0])] for g in left if len(g) > 1}  # all but one per group would do; give one
  given_sizes.update({g[1]: sizes[atoms.index(g[1])] for g in left if len(g) > 2})
  x = np.arange(int(np.prod(shape))).reshape(shape).astype(np.float32)
  np.testing.assert_array_equal(Tensor(x).rearrange(formula, **given_sizes).numpy(), einops.rearrange(x, formula, **given_sizes))


# ***** qr / svd *****
def _matrix(data, batch: bool, rank_deficient: bool) -> np.ndarray:
  m, n = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
  b = (data.draw(st.integers(1, 2)),) if batch else ()
  vals = st.floats(-4, 4, allow_nan=False, width=32)
  if rank_deficient and min(m, n) > 1:
    r = data.draw(st.integers(1, min(m, n) - 1))
    left = np.array(data.draw(st.lists(vals, min_size=int(np.prod(b)) * m * r, max_size=int(np.prod(b)) * m * r)), np.float64).reshape(*b, m, r)
    right = np.array(data.draw(st.lists(vals, min_size=int(np.prod(b)) * r * n, max_size=int(np.prod(b)) * r * n)), np.float64).reshape(*b, r, n)
    return (left @ right).astype(np.float32)
  k = int(np.prod(b)) * m * n
  return np.array(data.draw(st.lists(vals, min_size=k, max_size=k)), np.float32).reshape(*b, m, n)


def _tol(a: np.ndarray) -> float: return 2e-5 * max(1.0, float(np.abs(a).max())) * max(a.shape[-2:])


@pytest.mark.slow  # (compiles ~100 kernels per new shape: the CPU pass of make test runs it, not the PYTHON ones)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), batch=st.booleans(), rank_deficient=st.booleans())
def test_qr_properties_and_values(data, batch, rank_deficient):
  a = _matrix(data, batch, rank_deficient)
  q, r = Tensor(a).qr()
  Tensor.realize_all(q, r)
  qn, rn = q.numpy().astype(np.float64), r.numpy().astype(np.float64)
  m, n = a.shape[-2:]
  assert qn.shape == a.shape[:-2] + (m, m) and rn.shape == a.shape
  tol = _tol(a)
  np.testing.assert_allclose(qn @ rn, a, atol=tol)
  np.testing.assert_allclose(np.swapaxes(qn, -1, -2) @ qn, np.broadcast_to(np.eye(m), qn.shape), atol=1e-5 * m)
  np.testing.assert_allclose(np.tril(rn, -1), 0, atol=tol)  # upper triangular (rounding-size entries below)
  wq, wr = np.linalg.qr(a.astype(np.float64), mode="complete")
  # LAPACK's sign convention: R's diagonal (and the first min(m, n) columns of Q) equal numpy's when the leading
  # min(m, n) columns are independent and well conditioned (a zero first column of a wide matrix is full rank overall,
  # but its reflection's sign is arbitrary), and no entry is so small that its square underflows in float32 (a column
  # [1, 2e-41] is upper triangular already in float32 arithmetic, so whether it is reflected is arbitrary too)
  lead = a[..., :, :min(m, n)].astype(np.float64)
  representable = np.all((a == 0) | (np.abs(a) >= 1e-18))
  if not rank_deficient and representable and np.all(np.linalg.matrix_rank(lead) == min(m, n)) and np.all(np.linalg.cond(lead) < 1e3):
    np.testing.assert_allclose(rn, wr, atol=tol * 10)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), batch=st.booleans(), rank_deficient=st.booleans(), full=st.booleans())
def test_svd_properties_and_values(data, batch, rank_deficient, full):
  a = _matrix(data, batch, rank_deficient)
  u, s, vh = Tensor(a).svd(full_matrices=full)
  Tensor.realize_all(u, s, vh)
  un, sn, vn = (t.numpy().astype(np.float64) for t in (u, s, vh))
  m, n = a.shape[-2:]
  k = min(m, n)
  assert un.shape == a.shape[:-2] + ((m, m) if full else (m, k)) and sn.shape == a.shape[:-2] + (k,)
  assert vn.shape == a.shape[:-2] + ((n, n) if full else (k, n))
  tol = _tol(a)
  np.testing.assert_allclose(sn, np.linalg.svd(a.astype(np.float64), compute_uv=False), atol=tol)
  assert np.all(np.diff(sn, axis=-1) <= tol) and np.all(sn >= 0)
  np.testing.assert_allclose((un[..., :, :k] * sn[..., None, :]) @ vn[..., :k, :], a, atol=tol)
  eye = lambda x: np.broadcast_to(np.eye(x.shape[-1]), x.shape[:-2] + (x.shape[-1], x.shape[-1]))
  np.testing.assert_allclose(np.swapaxes(un, -1, -2) @ un, eye(un), atol=1e-4 * max(m, n))  # orthonormal, also past the rank
  np.testing.assert_allclose(vn @ np.swapaxes(vn, -1, -2), np.swapaxes(eye(np.swapaxes(vn, -1, -2)), -1, -2), atol=1e-4 * max(m, n))


def test_qr_svd_need_a_matrix():
  with pytest.raises(TensorError, match="matrix"): Tensor([1.0, 2.0]).qr()
  with pytest.raises(TensorError, match="matrix"): Tensor([1.0, 2.0]).svd()


def test_qr_of_a_zero_column_and_int_input():
  q, r = Tensor([[0.0, 1.0], [0.0, 2.0]]).qr()  # no reflection for a zero column: Q R still reconstructs
  np.testing.assert_allclose(q.numpy() @ r.numpy(), [[0.0, 1.0], [0.0, 2.0]], atol=1e-6)
  q, r = Tensor([[3, 0], [4, 5]]).qr()
  np.testing.assert_allclose(r.numpy(), np.linalg.qr(np.array([[3.0, 0], [4, 5]]), mode="complete")[1], atol=1e-5)


# ***** contiguous_backward, from_blob *****
def test_contiguous_backward_keeps_values_and_gradients():
  x = Tensor([1.0, 2.0, 3.0])
  y = (x * 2).contiguous_backward()
  (g,) = (y * y).sum().gradient(x)  # (gradients first: a realized tensor is a buffer, docs/tensor_api.md)
  assert any(u.op.name == "CONTIGUOUS" for u in g.uop.toposort())  # the gradient through y is made contiguous
  np.testing.assert_allclose(g.numpy(), [8.0, 16.0, 24.0])
  np.testing.assert_array_equal(y.numpy(), [2.0, 4.0, 6.0])
  assert not any(u.op.name == "CONTIGUOUS" for u in (x * 2).sum().gradient(x)[0].uop.toposort())


def test_from_blob_wraps_host_memory_without_copying():
  if not Device[Device.DEFAULT].allocator.external_memory:  # a GPU (MOCK+AMD, NV) raises TensorError naming CPU/PYTHON
    with pytest.raises(TensorError, match="can't wrap external memory"): Tensor.from_blob(np.zeros(3, np.float32).ctypes.data, (3,))
    pytest.skip(f"{Device.DEFAULT}'s allocator can't wrap host memory")
  arr = np.arange(12, dtype=np.float32).reshape(3, 4)
  t = Tensor.from_blob(arr.ctypes.data, (3, 4), dtype="float32")
  np.testing.assert_array_equal(t.numpy(), arr)
  arr[1, 2] = 100.0  # the tensor reads the caller's memory
  assert t.numpy()[1, 2] == 100.0
  t.assign(t * 0 + 7).realize()  # and writes into it
  assert (arr == 7).all()
  with pytest.raises(TensorError, match="pointer"): Tensor.from_blob(0, (3,))
  with pytest.raises(TensorError, match="shape"): Tensor.from_blob(arr.ctypes.data, (-1, 2))
