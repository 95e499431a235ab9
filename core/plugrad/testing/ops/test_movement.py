"""Conformance: movement, joining/splitting, gather/scatter and indexing (get and set) against numpy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
from plugrad.testing.helpers import assert_close, check_op, rand_np


def _np(shape, dtype=np.float32):
  return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) - 7


# ***** shape views *****
def test_view_transpose_T():
  check_op([(2, 3, 4)], lambda x: x.view(4, 6), lambda x: x.reshape(4, 6))
  check_op([(2, 3, 4)], lambda x: x.view((3, -1)), lambda x: x.reshape(3, -1))
  check_op([(2, 3, 4)], lambda x: x.transpose(), lambda x: x.swapaxes(1, 0))
  check_op([(2, 3, 4)], lambda x: x.transpose(-1, 0), lambda x: x.swapaxes(-1, 0))
  check_op([(3, 5)], lambda x: x.T)
  check_op([(3,)], lambda x: x.T)
  with pytest.raises(IndexError, match="axis 3"): Tensor.ones(2, 3).transpose(3, 0)


def test_flatten_unflatten():
  check_op([(2, 3, 4)], lambda x: x.flatten(), lambda x: x.reshape(-1))
  check_op([(2, 3, 4, 5)], lambda x: x.flatten(1, 2), lambda x: x.reshape(2, 12, 5))
  check_op([(2, 3, 4)], lambda x: x.flatten(-2), lambda x: x.reshape(2, 12))
  assert Tensor(3.0).flatten().shape == (1,)
  check_op([(2, 12)], lambda x: x.unflatten(1, (3, 4)), lambda x: x.reshape(2, 3, 4))
  check_op([(2, 12)], lambda x: x.unflatten(-1, (2, -1, 3)), lambda x: x.reshape(2, 2, 2, 3))
  with pytest.raises(ValueError, match="sizes"): Tensor.ones(2, 12).unflatten(1, (5, 2))
  with pytest.raises(ValueError, match="start_dim"): Tensor.ones(2, 3).flatten(1, 0)


def test_squeeze_unsqueeze():
  check_op([(1, 3, 1, 2)], lambda x: x.squeeze(), lambda x: x.squeeze())
  check_op([(1, 3, 1, 2)], lambda x: x.squeeze(2), lambda x: x.squeeze(2))
  check_op([(1, 3, 1, 2)], lambda x: x.squeeze(1), lambda x: x)  # torch: squeezing a dim that isn't 1 is a no-op
  check_op([(1, 3, 1, 2)], lambda x: x.squeeze((0, 2)), lambda x: x.squeeze((0, 2)))
  check_op([(3, 2)], lambda x: x.unsqueeze(0), lambda x: np.expand_dims(x, 0))
  check_op([(3, 2)], lambda x: x.unsqueeze(-1), lambda x: np.expand_dims(x, -1))
  check_op([(3, 2)], lambda x: x.unsqueeze(1), lambda x: np.expand_dims(x, 1))
  assert Tensor(1.0).squeeze().shape == () and Tensor(1.0).unsqueeze(0).shape == (1,)
  with pytest.raises(IndexError): Tensor.ones(3, 2).unsqueeze(4)
  with pytest.raises(IndexError): Tensor.ones(3, 2).squeeze(2)


# ***** pad *****
NP_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@pytest.mark.parametrize("mode", list(NP_MODE))
def test_pad_modes(mode):
  x = rand_np((3, 4, 5))
  for flat in [(1, 2), (2, 1, 0, 3), (1, 1, 2, 2, 1, 0)]:
    pairs = [(0, 0)] * (3 - len(flat) // 2) + [(flat[i], flat[i + 1]) for i in range(len(flat) - 2, -1, -2)]
    got = Tensor(x).pad(flat, mode=mode)
    assert_close(got.numpy(), np.pad(x, pairs, mode=NP_MODE[mode]))
    assert_close(Tensor(x).pad(tuple(pairs), mode=mode).numpy(), np.pad(x, pairs, mode=NP_MODE[mode]))


def test_pad_value_none_negative():
  x = rand_np((3, 4))
  assert_close(Tensor(x).pad((1, 2, 0, 1), value=-5.5).numpy(), np.pad(x, ((0, 1), (1, 2)), constant_values=-5.5))
  assert_close(Tensor(x).pad((None, (2, 0))).numpy(), np.pad(x, ((0, 0), (2, 0))))
  assert_close(Tensor(x).pad((-1, 2, 1, -2)).numpy(), np.pad(x[:1, 1:], ((1, 0), (0, 2))))
  assert_close(Tensor(x).pad((-1, 1), mode="reflect").numpy(), np.pad(x[:, 1:], ((0, 0), (0, 1)), mode="reflect"))
  xi = rand_np((2, 3), dtypes.int32, -5, 5)
  assert_close(Tensor(xi).pad(((1, 1), (1, 1)), value=9).numpy(), np.pad(xi, 1, constant_values=9))


def test_pad_errors():
  x = Tensor.ones(3, 4)
  with pytest.raises(ValueError, match="mode"): x.pad((1, 1), mode="bogus")
  with pytest.raises(ValueError, match="reflect"): x.pad((4, 0), mode="reflect")
  with pytest.raises(ValueError, match="circular"): x.pad((5, 0), mode="circular")
  with pytest.raises(ValueError): x.pad((1, 1, 1))
  with pytest.raises(ValueError): x.pad(((1, 1),))
  with pytest.raises(ValueError): x.pad((-3, -2))


# ***** joining, splitting, repeating *****
def test_cat_stack():
  a, b, c = rand_np((2, 3), seed=0), rand_np((4, 3), seed=1), rand_np((1, 3), seed=2)
  assert_close(Tensor(a).cat(Tensor(b), Tensor(c)).numpy(), np.concatenate([a, b, c]))
  assert_close(Tensor.cat(Tensor(a), Tensor(b), dim=-2).numpy(), np.concatenate([a, b]))
  assert_close(Tensor(a).cat(Tensor(a), dim=1).numpy(), np.concatenate([a, a], 1))
  assert_close(Tensor.stack(Tensor(a), Tensor(a + 1)).numpy(), np.stack([a, a + 1]))
  assert_close(Tensor(a).stack(Tensor(a + 1), Tensor(a), dim=2).numpy(), np.stack([a, a + 1, a], 2))
  assert_close(Tensor(a).stack(dim=-1).numpy(), np.stack([a], -1))
  bi = rand_np((2, 3), dtypes.bool, seed=3)
  assert_close(Tensor(bi).cat(Tensor(~bi)).numpy(), np.concatenate([bi, ~bi]))
  ai = rand_np((2, 3), dtypes.int32, seed=4)
  assert_close(Tensor(ai).cat(Tensor(a)).numpy(), np.concatenate([ai.astype(np.float32), a]))  # promotes like torch: float32
  assert len(Tensor(a).cat(Tensor(b)).schedule()) == 1
  with pytest.raises(ValueError, match="cat"): Tensor(a).cat(Tensor(b), dim=1)
  with pytest.raises(ValueError, match="stack"): Tensor(a).stack(Tensor(b))
  with pytest.raises(ValueError, match="zero-dim"): Tensor(1.0).cat(Tensor(2.0))
  assert_close(Tensor(1.0).stack(Tensor(2.0)).numpy(), np.array([1, 2], np.float32))


def test_split_chunk():
  x = rand_np((7, 4))
  for got, want in zip(Tensor(x).split(3), np.split(x, [3, 6])): assert_close(got.numpy(), want)
  for got, want in zip(Tensor(x).split([2, 5]), np.split(x, [2])): assert_close(got.numpy(), want)
  for got, want in zip(Tensor(x).split(2, dim=1), np.split(x, 2, 1)): assert_close(got.numpy(), want)
  ch = Tensor(x).chunk(3)
  assert [c.shape for c in ch] == [(3, 4), (3, 4), (1, 4)]
  assert_close(ch[2].numpy(), x[6:])
  assert [c.shape for c in Tensor(x).chunk(4, 1)] == [(7, 1)] * 4
  with pytest.raises(ValueError, match="sum"): Tensor(x).split([2, 2])
  with pytest.raises(ValueError): Tensor(x).chunk(0)


def test_repeat_repeat_interleave():
  check_op([(2, 3)], lambda x: x.repeat(2, 3), lambda x: np.tile(x, (2, 3)))
  check_op([(2, 3)], lambda x: x.repeat((3, 1, 2)), lambda x: np.tile(x, (3, 1, 2)))
  check_op([(3,)], lambda x: x.repeat(0), lambda x: np.tile(x, 0))
  check_op([(2, 3)], lambda x: x.repeat_interleave(2), lambda x: np.repeat(x, 2))
  check_op([(2, 3)], lambda x: x.repeat_interleave(3, dim=1), lambda x: np.repeat(x, 3, 1))
  check_op([(2, 3)], lambda x: x.repeat_interleave(2, dim=0), lambda x: np.repeat(x, 2, 0))
  with pytest.raises(ValueError): Tensor.ones(2, 3).repeat(2)


def test_roll():
  check_op([(4, 5)], lambda x: x.roll(2, 1), lambda x: np.roll(x, 2, 1))
  check_op([(4, 5)], lambda x: x.roll(-7, 0), lambda x: np.roll(x, -7, 0))
  check_op([(4, 5)], lambda x: x.roll((1, -2), (0, 1)), lambda x: np.roll(x, (1, -2), (0, 1)))
  check_op([(4, 5)], lambda x: x.roll(3), lambda x: np.roll(x, 3))
  check_op([(4, 5)], lambda x: x.roll(5, 1), lambda x: np.roll(x, 5, 1))
  with pytest.raises(ValueError): Tensor.ones(2, 2).roll((1, 2), 0)


# ***** gather / scatter *****
def test_gather():
  x = rand_np((4, 5))
  idx = np.array([[0, 3, 1], [2, -1, 0]], np.int32)
  assert_close(Tensor(x).gather(0, Tensor(idx)).numpy(), np.take_along_axis(x[:, :3], idx % 4, 0))
  idx1 = np.array([[4, 0], [1, 1], [0, 3]], np.int32)
  assert_close(Tensor(x).gather(1, Tensor(idx1)).numpy(), np.take_along_axis(x[:3], idx1, 1))
  assert_close(Tensor(x).gather(-1, Tensor(idx1)).numpy(), np.take_along_axis(x[:3], idx1, 1))
  xi = rand_np((3, 5), dtypes.int32, -9, 9)
  assert_close(Tensor(xi).gather(1, Tensor(idx1[:, :1])).numpy(), np.take_along_axis(xi, idx1[:, :1], 1))
  assert len(Tensor(x).gather(0, Tensor(idx)).schedule()) == 1
  with pytest.raises(ValueError, match="dims"): Tensor(x).gather(0, Tensor([1, 2]))
  with pytest.raises(ValueError, match="larger"): Tensor(x).gather(0, Tensor(np.zeros((2, 6), np.int32)))
  with pytest.raises(TypeError): Tensor(x).gather(0, Tensor(np.zeros((2, 2), np.float32)))


def _np_scatter_reduce(x, dim, idx, src, reduce, include_self):
  out = x.copy().astype(np.float64)
  groups: dict = {}
  for pos in itertools.product(*[range(s) for s in idx.shape]):
    tgt = list(pos)
    tgt[dim] = idx[pos]
    groups.setdefault(tuple(tgt), []).append(src[pos])
  for tgt, vals in groups.items():
    vals = ([x[tgt]] if include_self else []) + vals
    out[tgt] = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "amax": np.max, "amin": np.min}[reduce](vals)
  return out.astype(x.dtype)


def test_scatter():
  x, src = rand_np((4, 5), seed=0), rand_np((3, 5), seed=1)
  idx = np.array([[0, 1, 2, 3, 0], [2, 0, 0, 1, 3]], np.int32)  # no duplicate targets in a column
  want = x.copy()
  np.put_along_axis(want, idx, src[:2], 0)
  assert_close(Tensor(x).scatter(0, Tensor(idx), Tensor(src)).numpy(), want)
  dup = np.array([[1, 1, 1], [1, 0, 1], [1, 2, 3]], np.int32)  # duplicates: the last one wins, as in numpy
  want = x.copy()
  for i, j in itertools.product(range(3), range(3)): want[i, dup[i, j]] = src[i, j]
  assert_close(Tensor(x).scatter(1, Tensor(dup), Tensor(src)).numpy(), want)
  want = x.copy()
  np.put_along_axis(want, idx, 7.0, 0)
  assert_close(Tensor(x).scatter(0, Tensor(idx), 7.0).numpy(), want)
  assert_close(Tensor(x).scatter(1, Tensor(dup), 2.5, reduce="add").numpy(),
               _np_scatter_reduce(x, 1, dup, np.full(dup.shape, 2.5, np.float32), "sum", True))
  assert_close(Tensor(x).scatter(1, Tensor(dup), 3.0, reduce="multiply").numpy(),
               _np_scatter_reduce(x, 1, dup, np.full(dup.shape, 3.0, np.float32), "prod", True))
  with pytest.raises(ValueError): Tensor(x).scatter(0, Tensor(idx), Tensor(src), reduce="max")
  with pytest.raises(ValueError, match="src"): Tensor(x).scatter(0, Tensor(idx), Tensor(src[:1]))
  # as tinygrad: a tensor src with reduce is scatter_reduce's job (TypeError), src of another dtype is refused (RuntimeError)
  with pytest.raises(TypeError, match="scatter_reduce"): Tensor(x).scatter(1, Tensor(dup), Tensor(src), reduce="add")
  with pytest.raises(RuntimeError, match="dtype"): Tensor(x).scatter(0, Tensor(idx), Tensor(src.astype(np.float16)))
  with pytest.raises(RuntimeError, match="dtype"): Tensor(x).scatter_reduce(0, Tensor(idx), Tensor(src.astype(np.float16)), "sum")


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
  x, src = rand_np((4, 3), seed=2), rand_np((5, 3), seed=3)
  idx = np.array([[0, 1, 1], [0, 2, 1], [3, 1, 1], [0, 0, 0]], np.int32)
  got = Tensor(x).scatter_reduce(0, Tensor(idx), Tensor(src), reduce, include_self=include_self)
  assert_close(got.numpy(), _np_scatter_reduce(x, 0, idx, src, reduce, include_self))


@pytest.mark.parametrize("reduce", ["sum", "amax", "amin"])
def test_scatter_reduce_int(reduce):
  x, src = rand_np((3, 4), dtypes.int32, -50, 50, seed=4), rand_np((3, 4), dtypes.int32, -50, 50, seed=5)
  idx = np.array([[0, 3, 3], [1, 1, 2]], np.int32)
  got = Tensor(x).scatter_reduce(1, Tensor(idx), Tensor(src), reduce, include_self=False)
  assert_close(got.numpy(), _np_scatter_reduce(x, 1, idx, src, reduce, False))
  xu = x.astype(np.uint8)
  got = Tensor(xu).scatter_reduce(1, Tensor(idx), Tensor(src.astype(np.uint8)), reduce)
  assert_close(got.numpy(), _np_scatter_reduce(xu, 1, idx, src.astype(np.uint8), reduce, True).astype(np.uint8) if reduce != "sum" else
               (_np_scatter_reduce(xu.astype(np.int64), 1, idx, src.astype(np.uint8).astype(np.int64), reduce, True) % 256).astype(np.uint8))


def test_masked_fill():
  x = rand_np((3, 4))
  m = x > 0
  assert_close(Tensor(x).masked_fill(Tensor(m), -1.0).numpy(), np.where(m, np.float32(-1), x))
  assert_close(Tensor(x).masked_fill(Tensor(m[0]), Tensor(5.0)).numpy(), np.where(m[0], np.float32(5), x))
  xi = rand_np((3, 4), dtypes.int32)
  assert_close(Tensor(xi).masked_fill(Tensor(m), 9).numpy(), np.where(m, 9, xi).astype(np.int32))
  with pytest.raises(ValueError, match="mask"): Tensor(x[:1]).masked_fill(Tensor(m), 0.0)


# ***** __getitem__ *****
A = _np((3, 4, 5))
GET = [1, -1, (1, 2), (2, -1, 3), slice(None, None, 2), (slice(None), slice(None, None, -2)), (Ellipsis, 1), (None, 1, None),
       (slice(1, None, 3), slice(4, 0, -3)), (slice(-100, 100),), (slice(3, 1),), (slice(None), slice(None), slice(None, None, -1)),
       (Ellipsis, None), (1, Ellipsis, slice(1, 4, 2)), (), [0, 2], [[0, 1], [2, 2]], ([0, 2], [1, 3]), (slice(None), [0, 2], [1, 3]),
       ([0, 2], slice(None), [1, 3]), ([0, -1], 1), (slice(None), [[0], [3]], [1, 2, 4]), ([2, 0], None, [1, 1]),
       (Ellipsis, [4, 0, 4]), (slice(None, None, -1), [0, 1]), (None, [0, 2], slice(None, None, 2), [1, 3]), (np.int64(1),), [-3, 2],
       ([True, False, True],), (slice(None), [False, True, True, False]), A[..., 0] > 20, (1, A[1] > 20), ([1, 2], slice(1, 3), 0)]


@pytest.mark.parametrize("idx", GET, ids=[str(i) for i in range(len(GET))])
def test_getitem(idx):
  assert_close(Tensor(A)[idx].numpy(), A[idx])


def test_getitem_ints_select_first():
  """An int next to tensor indices selects first, as in torch and tinygrad (numpy would count it as an advanced index
  and, with a slice between them, put the indexed dims first)."""
  assert_close(Tensor(A)[0, :, [1, 3]].numpy(), A[0][:, [1, 3]])  # (4, 2); numpy's A[0, :, [1, 3]] is (2, 4)
  assert_close(Tensor(A)[1, :, Tensor([[4], [0]])].numpy(), A[1][:, np.array([[4], [0]])])
  assert_close(Tensor(A)[[2, 0], 1:3, 4].numpy(), A[[2, 0], 1:3, 4])  # no slice between the tensor and the int's dims: same
  assert_close(Tensor(A)[[2, 0], 1, [1, 3]].numpy(), A[[2, 0], 1, [1, 3]])  # adjacent once the int is gone: same


def test_getitem_tensor_indices():
  x = Tensor(A)
  assert_close(x[Tensor([[0], [2]]), Tensor([1, -1])].numpy(), A[np.array([[0], [2]]), np.array([1, -1])])
  assert_close(x[:, Tensor(2)].numpy(), A[:, 2])
  assert_close(x[Tensor(A[:, :, 0] > 20)].numpy(), A[A[:, :, 0] > 20])
  assert_close(x[Tensor([1, 0], dtype=dtypes.uint8), ::2].numpy(), A[[1, 0], ::2])
  assert_close(x[Tensor(np.zeros((0,), np.int32))].numpy(), A[np.zeros((0,), np.int32)])
  b = rand_np((3, 4), dtypes.bool)
  assert_close(Tensor(b)[Tensor([2, 0])].numpy(), b[[2, 0]])
  assert len(x[Tensor([2, 0]), 1:].schedule()) == 1
  assert len(Tensor(A)[1:, ::-2, None].schedule()) == 0  # basic indexing of a realized tensor is a view: no kernel


def test_getitem_errors():
  x = Tensor(A)
  with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"): x[3]
  with pytest.raises(IndexError, match="index -6 is out of bounds for dimension 2 with size 5"): x[0, 0, -6]
  with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 1 with size 4"): x[:, [0, 4]]
  with pytest.raises(IndexError, match="too many indices"): x[0, 0, 0, 0]
  with pytest.raises(IndexError, match="single ellipsis"): x[..., 0, ...]
  with pytest.raises(IndexError): x[1.5]
  with pytest.raises(IndexError): x["a"]
  with pytest.raises(IndexError): x[Tensor([0.5])]
  with pytest.raises(IndexError, match="boolean index"): x[Tensor([True, False])]
  with pytest.raises(ValueError): x[::0]
  with pytest.raises(ValueError, match="broadcast"): x[[0, 1], [0, 1, 2]]


# ***** __setitem__ *****
SET = [(1, 7.0), ((slice(None), slice(None, None, 2)), 3.0), ((0, slice(1, 3)), np.array([9, 8])), (([0, 2], [1, 3]), np.array([5, 6])),
       ((slice(None), [0, 0, 2]), np.array([1, 2, 3])), ((slice(None, None, -3),), -1.0), ((Ellipsis, 1), np.arange(4)),
       ((slice(1, None), slice(None, None, -2)), np.array([[1, 2, 3]])), ((None, 2), 4.0), ([1, -1], np.array([[1], [2]])),
       ((slice(None), [True, False, True, False, True]), 0.5), (np.arange(20).reshape(4, 5) % 3 == 0, -2.0),
       ((slice(None, None, 3), [1, 4]), np.array([[10, 20], [30, 40]])), ((), 1.0)]


@pytest.mark.parametrize("realized", [True, False])
@pytest.mark.parametrize("case", SET, ids=[str(i) for i in range(len(SET))])
def test_setitem(case, realized):
  idx, val = case
  want = np.arange(20, dtype=np.float32).reshape(4, 5)
  t = Tensor(want.copy()) if realized else Tensor(want.copy()) * 1
  t[idx] = Tensor(np.asarray(val, np.float32)) if isinstance(val, np.ndarray) else val
  want[idx] = val
  assert_close(t.numpy(), want)


def test_setitem_in_place_visible_through_views():
  base = Tensor(np.zeros((4, 4), np.float32))
  view = base[1:3]
  base[1, 2:] = 5.0
  base[Tensor([3]), Tensor([0])] = 7.0
  want = np.zeros((4, 4), np.float32)
  want[1, 2:] = 5
  want[3, 0] = 7
  assert_close(base.numpy(), want)
  assert_close(view.numpy(), want[1:3])
  x = Tensor(np.arange(6, dtype=np.int32))
  x[1:] = x[:-1]  # the value reads the buffer it overwrites
  assert_close(x.numpy(), np.array([0, 0, 1, 2, 3, 4], np.int32))
  y = Tensor(np.arange(6, dtype=np.int32))
  y[::2] = 1.7  # cast to the tensor's dtype
  assert_close(y.numpy(), np.array([1, 1, 1, 3, 1, 5], np.int32))


def test_setitem_errors():
  t = Tensor(np.zeros((3, 4), np.float32))
  with pytest.raises(IndexError, match="index 3 is out of bounds"): t[3] = 1.0
  with pytest.raises(IndexError, match="too many"): t[0, 0, 0] = 1.0
  with pytest.raises(ValueError, match="shape"): t[0] = Tensor(np.ones(3, np.float32))
  with pytest.raises(ValueError, match="shape"): t[[0, 1]] = Tensor(np.ones((3, 4), np.float32))
  assert_close(t.numpy(), np.zeros((3, 4), np.float32))


def test_setitem_bool_mask_and_lists():
  for realized in (True, False):
    want = rand_np((3, 4))
    t = Tensor(want.copy()) if realized else Tensor(want.copy()) + 0
    t[t > 0] = 0.0  # fast path: a where, no count
    t[Tensor(want < -1)] = Tensor(-9.0)
    t[0] = [1, 2, 3, 4]
    t[1:, 2] = np.array([7.5, 8.5])
    want[want > 0] = 0
    want[want < -1] = -9
    want[0] = [1, 2, 3, 4]
    want[1:, 2] = [7.5, 8.5]
    assert_close(t.numpy(), want)


def test_setitem_into_view_of_realized():
  base = Tensor(np.zeros((4, 3), np.float32))
  view = base[1:3]
  view[0] = 9.0
  view[1, ::2] = Tensor(np.array([1, 2], np.float32))
  want = np.zeros((4, 3), np.float32)
  want[1] = 9
  want[2, ::2] = [1, 2]
  assert_close(base.numpy(), want)
  assert_close(view.numpy(), want[1:3])


def test_getitem_slice_sweep():
  rng = np.random.default_rng(0)
  x = _np((5, 6))
  t = Tensor(x)
  for _ in range(25):
    sl = tuple(slice(*[None if rng.random() < 0.3 else int(v) for v in (rng.integers(-7, 7), rng.integers(-7, 7), rng.choice([-3, -2, -1, 1, 2, 4]))])
               for _ in range(2))
    assert_close(t[sl].numpy(), x[sl], msg=str(sl))
