"""Regressions of issue 45's Tensor API items: what tinygrad's own test suite (test_ops.py, test_setitem.py), run against
plugrad's public names, still caught. Each is checked against torch where torch has the op (the oracle), else against
tinygrad's documented semantics: shifts, nonzero / masked_select with `size`, circular pads and their gradients,
scatter argument validation, the exception classes of one_hot / stack / cat / arange, normalize on zero norms and p=0/inf,
sigmoid at extreme inputs, copysign's signed zeros and gradients, ints next to tensor indices, uint8 bilinear
resampling, and setitem through detach(), with unsafe dtypes, with gradient-eligible values and with stale readers.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

torch = pytest.importorskip("torch")  # the oracle (core's [test] extra)
F = torch.nn.functional


def same(got: Tensor, want, atol: float = 1e-6, rtol: float = 1e-5) -> None:
  want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
  g = got.numpy()
  assert g.shape == want.shape, f"shape {g.shape} != torch's {want.shape}"
  if g.dtype.kind == "f": np.testing.assert_allclose(g, want, atol=atol, rtol=rtol, equal_nan=True)
  else: np.testing.assert_array_equal(g, want)


def raises_like_torch(exc: type, plugrad_fn, torch_fn) -> None:
  """Both raise `exc` (the class tinygrad and torch raise)."""
  with pytest.raises(exc): torch_fn()
  with pytest.raises(exc): plugrad_fn()


# ***** shifts *****
def test_shifts_match_torch_on_ints():
  data = [[-1, -3, 1, 7], [0, -2 ** 31, 2 ** 31 - 1, -1]]
  t, tt = Tensor(data, dtype=dtypes.int32), torch.tensor(data, dtype=torch.int32)
  for s in (0, 2, 8, 31):
    same(t << s, tt << s)
    same(t >> s, tt >> s)
  amounts = [0, 2, 8, 31]
  same(t << Tensor(amounts, dtype=dtypes.int32), tt << torch.tensor(amounts, dtype=torch.int32))
  same(t >> Tensor(amounts, dtype=dtypes.int32), tt >> torch.tensor(amounts, dtype=torch.int32))
  u = [1, 3, 31, 200]
  same(Tensor(u, dtype=dtypes.uint8) << 2, torch.tensor(u, dtype=torch.uint8) << 2)
  same(Tensor(u, dtype=dtypes.uint8) >> 3, torch.tensor(u, dtype=torch.uint8) >> 3)
  same(3 << Tensor([1, 2], dtype=dtypes.int32), 3 << torch.tensor([1, 2], dtype=torch.int32))
  assert (Tensor([True, False]) << 1).tolist() == (torch.tensor([True, False]) << 1).tolist() == [2, 0]  # bool promotes


def test_shifts_refuse_floats_and_two_bools():
  """tinygrad and torch raise RuntimeError (torch's NotImplementedError is one); plugrad's error is also a TypeError."""
  ten, tor = Tensor([1, 2], dtype=dtypes.int32), torch.tensor([1, 2], dtype=torch.int32)
  for p, t in ((lambda: Tensor([1.0]) << 2, lambda: torch.tensor([1.0]) << 2), (lambda: Tensor([4.0]) >> 1, lambda: torch.tensor([4.0]) >> 1),
               (lambda: ten << Tensor([1.0]), lambda: tor << torch.tensor([1.0])), (lambda: ten << 1.0, lambda: tor << 1.0),
               (lambda: Tensor([True]) << Tensor([True]), lambda: torch.tensor([True]) << torch.tensor([True]))):
    raises_like_torch(RuntimeError, p, t)
  with pytest.raises(TypeError, match="integer"): Tensor([1.0]) << 2


# ***** nonzero / masked_select with size *****
@pytest.mark.parametrize("data", [[1, 0, 2, 0, 3], [[1, 0], [0, 2]], [[0, 0, 0]], [], 5, 0, [[[1, 0], [2, 3]], [[0, 0], [4, 0]]]])
def test_nonzero_with_size_matches_nonzero_static(data):
  t, tt = Tensor(data, dtype=dtypes.int32), torch.tensor(data, dtype=torch.int32)
  same(t.nonzero(), torch.nonzero(tt).int())
  for size in (0, 1, 2, 5):
    for fill in (0, -1):
      same(t.nonzero(size=size, fill_value=fill), torch.nonzero_static(tt, size=size, fill_value=fill).int())


def test_nonzero_size_keeps_int_dtype_and_runs_lazily():
  t = Tensor([1.5, 0.0, -2.0])
  got = t.nonzero(size=3, fill_value=-1.5)
  assert got.dtype == dtypes.int32 and got.tolist() == [[0], [2], [-1]]  # the fill is cast (tinygrad)
  assert got.uop.op.name != "BUFFER"  # computed by a kernel, not read back to the host (jittable)
  with pytest.raises(ValueError, match="size"): t.nonzero(size=-1)


def test_masked_select_with_size():
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  m = (x % 3 == 1)
  want = torch.masked_select(torch.tensor(x), torch.tensor(m)).numpy()
  for size in (0, 2, len(want), len(want) + 3):
    got = Tensor(x).masked_select(Tensor(m), size=size, fill_value=-1)
    pad = np.concatenate([want, np.full(max(0, size - len(want)), -1, np.float32)])[:size]
    np.testing.assert_array_equal(got.numpy(), pad)
    assert got.dtype == dtypes.float32
  bm = np.array([True, False])  # broadcast over rows, as torch
  np.testing.assert_array_equal(Tensor(x[:, :2]).masked_select(Tensor(bm), size=4).numpy(),
                                np.append(torch.masked_select(torch.tensor(x[:, :2]), torch.tensor(bm)).numpy(), 0))
  assert Tensor([], dtype=dtypes.int32).masked_select(Tensor([], dtype=dtypes.bool), size=2, fill_value=-1).tolist() == [-1, -1]
  with pytest.raises(RuntimeError, match="bool mask"): Tensor(x).masked_select(Tensor(x), size=2)


# ***** circular pads *****
@pytest.mark.parametrize("pads", [(0, 2, 3, 2), (1, -2, 2, -1), (-2, 1), (3, -1), (-3, 2, 0, 0), (2, 2, 1, 1), (5, 0), (1, 2, 3, 5, 1, 2)])
def test_circular_pad_and_gradient_match_torch(pads):
  x = np.random.default_rng(len(pads)).standard_normal((1, 2) + (5,) * (len(pads) // 2)).astype(np.float32)  # torch's ranks
  tx = torch.tensor(x, requires_grad=True)
  want = F.pad(tx, pads, mode="circular")
  w = np.random.default_rng(1).standard_normal(tuple(want.shape)).astype(np.float32)
  (want * torch.tensor(w)).sum().backward()
  px = Tensor(x)
  got = px.pad(pads, mode="circular")
  (g,) = (got * Tensor(w)).sum().gradient(px)  # (gradients first: a realized tensor is a buffer, docs/tensor_api.md)
  same(got, want)
  same(g, tx.grad)


def test_circular_pad_wrapping_twice_is_refused():
  x = np.zeros((1, 1, 5, 5), np.float32)
  raises_like_torch(NotImplementedError, lambda: Tensor(x).pad((3, 0), mode="typo"), lambda: F.pad(torch.tensor(x), (3, 0), mode="typo"))
  raises_like_torch(RuntimeError, lambda: Tensor(x).pad((3, 6, 0, 0), mode="circular"), lambda: F.pad(torch.tensor(x), (3, 6, 0, 0), mode="circular"))
  with pytest.raises(ValueError, match="more than once"): Tensor(x).pad((-3, 3), mode="circular")  # 2 left after cropping 3


# ***** scatter validation *****
def test_scatter_refuses_what_torch_and_tinygrad_refuse():
  x, src = np.zeros((3, 4), np.float32), np.ones((3, 4), np.float32)
  idx = np.array([[0, 1, 2, 0], [1, 2, 0, 1]])
  X, I = Tensor(x), Tensor(idx.astype(np.int32))
  tX, tI, tS = torch.tensor(x), torch.tensor(idx), torch.tensor(src)
  raises_like_torch(RuntimeError, lambda: X.half().scatter(0, I, Tensor(src)), lambda: tX.half().scatter(0, tI, tS))
  raises_like_torch(RuntimeError, lambda: X.half().scatter_reduce(0, I, Tensor(src), "sum"), lambda: tX.half().scatter_reduce(0, tI, tS, "sum"))
  raises_like_torch(RuntimeError, lambda: X.scatter(0, I, 1.0, reduce="max"), lambda: tX.scatter(0, tI, 1.0, reduce="max"))
  raises_like_torch(RuntimeError, lambda: X.scatter_reduce(0, I, Tensor(src), "INVALID"), lambda: tX.scatter_reduce(0, tI, tS, "INVALID"))
  with pytest.raises(TypeError, match="scatter_reduce"): X.scatter(0, I, Tensor(src), reduce="add")  # tinygrad: TypeError
  with pytest.raises(TypeError):  # checked before the dims (tinygrad's test_scatter_no_reduce_tensor_src)
    Tensor.ones(4).scatter(dim=1, index=Tensor([0]), src=Tensor.ones(4), reduce="add")
  same(X.scatter(0, I, 2.5, reduce="add"), torch.tensor(x).scatter(0, torch.tensor(idx), 2.5, reduce="add"))
  same(X.scatter(0, I, Tensor(src)), torch.tensor(x).scatter(0, torch.tensor(idx), torch.tensor(src)))


# ***** exception classes *****
def test_one_hot_stack_cat_arange_errors_are_tinygrads_and_torchs_classes():
  with pytest.raises(ValueError): Tensor([1, 2, 4]).one_hot(-1)  # tinygrad: num_classes is never inferred
  raises_like_torch(RuntimeError, lambda: Tensor([1.0, 2.0]).one_hot(3), lambda: F.one_hot(torch.tensor([1.0, 2.0]), 3))
  same(Tensor([1, 2, 4]).one_hot(6), F.one_hot(torch.tensor([1, 2, 4]), 6).int())
  with pytest.raises(IndexError): Tensor(3.14).cat(Tensor(3.14))  # tinygrad: IndexError; torch: RuntimeError
  with pytest.raises(RuntimeError): Tensor(3.14).cat(Tensor(3.14))
  raises_like_torch(IndexError, lambda: Tensor.stack(Tensor.ones(4, 5, 3), dim=77), lambda: torch.stack([torch.ones(4, 5, 3)], dim=77))
  with pytest.raises(ValueError): Tensor.stack((Tensor([1, 2]), Tensor([3, 4])), Tensor([5, 6]))  # tinygrad: ValueError
  raises_like_torch(TypeError, lambda: Tensor.stack((Tensor([1, 2]), Tensor([3, 4])), Tensor([5, 6])),
                    lambda: torch.stack((torch.tensor([1, 2]), torch.tensor([3, 4])), torch.tensor([5, 6])))
  np.testing.assert_allclose(Tensor.stack(Tensor(3.14), Tensor(3.14)).numpy(), [3.14, 3.14])
  for args in ((2 ** 33,), (129,), (-129, 128), (128, 0, -1), (127, -130, -1)):
    dt = dtypes.int32 if args == (2 ** 33,) else dtypes.int8
    with pytest.raises(OverflowError): Tensor.arange(*args, dtype=dt)
  same(Tensor.arange(-128, 128, dtype=dtypes.int8), torch.arange(-128, 128, dtype=torch.int8))
  assert Tensor.arange(2 ** 31, 2 ** 31 + 3).dtype == dtypes.int64
  raises_like_torch(RuntimeError, lambda: Tensor.arange(0, float("nan")), lambda: torch.arange(0, float("nan")))
  raises_like_torch(RuntimeError, lambda: Tensor.arange(0, float("inf")), lambda: torch.arange(0, float("inf")))


# ***** normalize, sigmoid, copysign *****
@pytest.mark.parametrize("p", [2, 1, 3, 0, -1, 0.5, math.inf, -math.inf])
@pytest.mark.parametrize("dim", [0, 1])
def test_normalize_with_zero_norms_matches_torch(p, dim):
  x = np.random.default_rng(3).uniform(-2, 2, (4, 6)).astype(np.float32)
  x[1], x[2, :3], x[:, 5] = 0, 0, 0  # a zero row, a half-zero row, a zero column
  w = np.arange(24, dtype=np.float32).reshape(4, 6)
  tx = torch.tensor(x, requires_grad=True)
  want = F.normalize(tx, p=p, dim=dim)
  (want * torch.tensor(w)).sum().backward()
  px = Tensor(x)
  got = px.normalize(p=p, dim=dim)
  (g,) = (got * Tensor(w)).sum().gradient(px)
  same(got, want)
  assert np.isfinite(g.numpy()).all()
  same(g, tx.grad, atol=1e-5)


def test_sigmoid_at_extreme_inputs():
  """Values against torch; slopes against the exact e^-|x| / (1 + e^-|x|)^2 in float64 (torch's s * (1 - s) loses the
  slope above x = 17 where 1 - s rounds to 0; plugrad keeps it, symmetric with the negative side): exact 0/1 and 0
  slopes far out, never nan."""
  x = np.array([-1e4, -400, -300, -88, -20, 0, 20, 88, 300, 400, 1e4], np.float32)
  px = Tensor(x)
  got = px.sigmoid()
  (g,) = got.sum().gradient(px)
  same(got, torch.sigmoid(torch.tensor(x)))
  e = np.exp(-np.abs(x.astype(np.float64)))
  np.testing.assert_allclose(g.numpy(), (e / (1 + e) ** 2).astype(np.float32), atol=1e-44, rtol=1e-3)  # 6e-39 at 88: subnormal
  for v in (300.0, -300.0):  # tinygrad's test_sigmoid_extreme: the gradient of one element
    t = Tensor([v])
    assert t.sigmoid()[0].gradient(t)[0].item() == 0.0


def test_copysign_signed_zeros_and_gradients_match_torch():
  vals = [-1.0, -0.0, 0.0, 1.0, math.inf, -math.inf, math.nan]
  a = np.array([i for i in vals for _ in vals], np.float32)
  b = np.array([j for _ in vals for j in vals], np.float32)
  ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  want = torch.copysign(ta, tb)
  want.sum().backward()
  pa, pb = Tensor(a), Tensor(b)
  got = pa.copysign(pb)
  ga, gb = got.sum().gradient(pa, pb)
  np.testing.assert_array_equal(np.signbit(got.numpy()), np.signbit(want.detach().numpy()))  # -0.0 where torch has it
  same(got, want)
  finite = np.isfinite(a)  # at +-inf torch's gradient is nan, plugrad's +-1 (tinygrad and jax): only compared at finite self
  np.testing.assert_array_equal(ga.numpy()[finite], ta.grad.numpy()[finite])
  np.testing.assert_array_equal(np.abs(ga.numpy()[np.isinf(a)]), 1)
  np.testing.assert_array_equal(gb.numpy(), tb.grad.numpy())


# ***** indexing: ints next to tensor indices *****
def test_ints_collapse_before_tensor_indices_as_torch():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 5, 6, 5, 3, 4)).astype(np.float32)
  b, d = rng.integers(0, 5, (1, 3, 1, 1, 1, 1)), rng.integers(0, 4, (2, 1, 1, 5, 1, 1))
  tx = torch.tensor(x)
  B, D = Tensor(b.astype(np.int32)), Tensor(d.astype(np.int32))
  tb, td = torch.tensor(b), torch.tensor(d)
  same(Tensor(x)[1, :, 3:11:2, D, 0:2], tx[1, :, 3:11:2, td, 0:2])  # numpy would put D's dims first
  same(Tensor(x)[1, B, 2, D, 2], tx[1, tb, 2, td, 2])
  same(Tensor(x)[:, 1, :, D], tx[:, 1, :, td])
  same(Tensor(x)[0, ..., D, :, :], tx[0, ..., td, :, :])
  same(Tensor(x)[:, B, 2, D], tx[:, tb, 2, td])  # adjacent once the int is gone: in place
  t = Tensor(np.zeros((2, 5, 6), np.float32))
  t[1, :, Tensor([0, 3])] = Tensor(np.ones((5, 2), np.float32))  # setitem places the value the same way
  want = torch.zeros(2, 5, 6)
  want[1, :, torch.tensor([0, 3])] = torch.ones(5, 2)
  same(t, want)


# ***** uint8 bilinear *****
@pytest.mark.parametrize("shape,size,align", [((1, 3, 40, 40), (10, 10), False), ((1, 2, 12, 18), (30, 24), False), ((1, 5, 17, 9), (32, 5), True),
                                              ((1, 1, 5, 5), (5, 9), False), ((1, 4, 7, 3), (2, 11), True)])
def test_uint8_bilinear_is_torchs_bytes(shape, size, align):
  x = torch.tensor(np.random.default_rng(sum(shape)).uniform(0, 255, shape)).type(torch.uint8)
  got = Tensor(x.numpy()).interpolate(size, mode="linear", align_corners=align)
  assert got.dtype == dtypes.uint8
  same(got, F.interpolate(x, size=size, mode="bilinear", align_corners=align))


# ***** setitem *****
def test_setitem_through_detach_writes_the_source():
  t = Tensor.zeros((3, 3)).contiguous().realize()
  t.detach()[1, 2] = 5
  assert t[1, 2].item() == 5.0
  d = t.detach()
  d[0] = Tensor([1.0, 2.0, 3.0])
  d[2, ::2] = 7.0
  tt = torch.zeros(3, 3)
  td = tt.detach()
  td[1, 2], td[0], td[2, ::2] = 5, torch.tensor([1.0, 2.0, 3.0]), 7.0
  same(t, tt)
  same(d, tt)
  w = Tensor([1.0, 2.0], requires_grad=True).realize()
  w.detach()[0] = 9.0  # a parameter's storage, written outside autograd (torch's no_grad-style update)
  assert w.tolist() == [9.0, 2.0] and w.requires_grad


def test_setitem_through_detach_keeps_copy_on_write_and_refuses_unrealized_sources():
  x = Tensor([1.0, 2.0, 3.0])
  a, b = (x * 2).realize(), (x * 2).realize()  # equal computations share one buffer
  a.detach()[0] = 0.0
  assert a.tolist() == [0.0, 4.0, 6.0] and b.tolist() == [2.0, 4.0, 6.0]
  lazy = x * 3
  with pytest.raises(RuntimeError, match="not realized"): lazy.detach()[0] = 1.0


def test_setitem_refuses_unsafe_dtypes():
  t = Tensor.zeros(6, dtype=dtypes.float32).contiguous().realize()
  with pytest.raises(RuntimeError, match="without loss"): t[2:4] = Tensor([1, 2], dtype=dtypes.int32)  # int32 -> float32 rounds
  with pytest.raises(TypeError): t[2:4] = Tensor([1, 2], dtype=dtypes.float64)
  h = Tensor.zeros(2, dtype=dtypes.float16).contiguous().realize()
  with pytest.raises(RuntimeError): h[0] = Tensor(1.5)  # float32 into float16
  i8 = Tensor.zeros(2, dtype=dtypes.int8).contiguous().realize()
  with pytest.raises(RuntimeError): i8[0] = Tensor(300)
  t[0:2] = Tensor([1, 2], dtype=dtypes.int16)  # exact in float32: fine
  t[2:4] = Tensor([0.5, 1.5], dtype=dtypes.float16)
  t[4] = Tensor(True)
  t[5] = 2  # Python scalars, lists and arrays are cast (numpy, torch)
  assert t.tolist() == [1.0, 2.0, 0.5, 1.5, 1.0, 2.0]
  i8[:] = [1.7, -2.2]
  assert i8.tolist() == [1, -2]


def test_set_iadd_backward_reaches_gradient_eligible_tensors():
  """tinygrad's test_set_iadd_backward: requires_grad None is eligible, so backward must reach x through the write."""
  z, x = Tensor([1.0, 2.0, 3.0, 4.0]), Tensor([10.0, 20.0])
  z[:2] += x
  z.sum().backward()
  tz, tx = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True), torch.tensor([10.0, 20.0], requires_grad=True)
  tzz = tz.clone()
  tzz[:2] += tx
  tzz.sum().backward()
  same(z.grad, tz.grad)
  same(x.grad, tx.grad)
  same(z, tzz)
  z, x = Tensor([1.0, 2.0, 3.0, 4.0]), Tensor([10.0, 20.0])
  view = z[1:3]
  z[:2] = x * 3
  (g,) = (z * Tensor([1.0, 2.0, 3.0, 4.0])).sum().gradient(x)  # (gradients first: realizing z makes it a buffer)
  assert g.tolist() == [3.0, 6.0]
  assert view.tolist() == [60.0, 3.0]  # still an in-place write: views see it


def test_setitem_without_eligible_tensors_writes_now():
  z = Tensor.zeros(4).contiguous().realize()
  with Tensor.train(False):
    pass
  z[1] = 3.0  # a scalar: no graph to keep, the buffer is written at once
  assert z.uop.op.name in ("BUFFER", "RESHAPE") or z.uop.op.name == "BUFFER_VIEW"
  assert z.tolist() == [0.0, 3.0, 0.0, 0.0]


def test_setitem_refuses_stale_readers_and_views():
  """A lazy tensor built from a realized one before an in-place write would see the write (torch computed it before):
  refused, as tinygrad does; so is a view of an unrealized target that the functional rebuild would leave behind."""
  z = Tensor([1.0, 2.0, 3.0, 4.0])
  s = z.sum()
  with pytest.raises(RuntimeError, match="realize that tensor first"): z[:2] = Tensor([0.0, 0.0])
  assert s.item() == 10.0 and z.tolist() == [1.0, 2.0, 3.0, 4.0]
  s.realize()
  z[:2] = Tensor([0.0, 0.0])  # once the reader is realized the write is fine
  assert s.item() == 10.0 and z.tolist() == [0.0, 0.0, 3.0, 4.0]
  x = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
  y = x * 2.0
  tmp = y[:1]
  with pytest.raises(RuntimeError, match="view or alias"): y[0] = 99.0
  alias = Tensor(y.uop)
  del tmp
  with pytest.raises(RuntimeError, match="view or alias"): y[0] = 99.0
  del alias
  y[0] = 99.0
  assert y.tolist() == [99.0, 4.0, 6.0, 8.0]
  x[mask := x > 2] = 0.0  # the index reads x: it is computed first, so it is no stale reader
  assert x.tolist() == [1.0, 2.0, 0.0, 0.0] and mask.tolist() == [False, False, True, True]
