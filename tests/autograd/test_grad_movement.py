"""Gradients of movement, indexing, joining and gather/scatter ops against float64 finite differences."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from gradcheck import assert_directional, batch_gradcheck, gradcheck, rand

from plugrad.tensor import Tensor

S = (3, 4)
IDX = np.array([[2, 0, 1, 2], [0, 0, 2, 1]])  # gather/scatter index along dim 0 of a (3, 4)
MASK = rand(*S, seed=7) > 0

MOVE = {
  "reshape": (lambda x: x.reshape(2, 6), rand(*S)),
  "reshape_infer": (lambda x: x.reshape(-1, 3) * Tensor(rand(4, 3, seed=3)), rand(*S)),
  "flatten_unflatten": (lambda x: x.flatten().unflatten(0, (6, 2)), rand(*S)),
  "squeeze_unsqueeze": (lambda x: x.unsqueeze(1).squeeze(1), rand(*S)),
  "permute_3d": (lambda x: x.permute(2, 0, 1), rand(2, 3, 4)),
  "transpose": (lambda x: x.transpose(), rand(*S)),
  "transpose_T": (lambda x: x.T * Tensor(rand(4, 3, seed=3)), rand(*S)),
  "expand": (lambda x: x.expand(3, 4), rand(1, 4)),
  "expand_new_dims": (lambda x: x.reshape(1, 3, 1).expand(2, 3, 4), rand(3)),
  "pad_constant": (lambda x: x.pad((1, 2, 0, 1)), rand(*S)),
  "pad_constant_value": (lambda x: x.pad(((1, 0), (2, 1)), value=1.5), rand(*S)),
  "pad_negative": (lambda x: x.pad((-1, 1, 1, -1)), rand(*S)),
  "pad_reflect": (lambda x: x.pad((2, 1, 1, 2), mode="reflect"), rand(*S)),
  "pad_replicate": (lambda x: x.pad((2, 1, 1, 2), mode="replicate"), rand(*S)),
  "pad_circular": (lambda x: x.pad((2, 1, 1, 2), mode="circular"), rand(*S)),
  "shrink": (lambda x: x.shrink(((1, 3), (0, 2))), rand(*S)),
  "shrink_none": (lambda x: x.shrink((None, (1, 4))), rand(*S)),
  "flip": (lambda x: x.flip(1), rand(*S)),
  "flip_both": (lambda x: x.flip((0, 1)), rand(*S)),
  "getitem_int": (lambda x: x[1], rand(*S)),
  "getitem_neg_int": (lambda x: x[-1, 2], rand(*S)),
  "getitem_slice": (lambda x: x[1:, :3], rand(*S)),
  "getitem_step": (lambda x: x[::2, 1::2], rand(*S)),
  "getitem_neg_step": (lambda x: x[::-1, ::-2], rand(*S)),
  "getitem_none_ellipsis": (lambda x: x[None, ..., 1:3, None], rand(*S)),
  "getitem_tensor_index": (lambda x: x[Tensor([2, 0, 2, -1])], rand(*S)),
  "getitem_two_tensor_indices": (lambda x: x[Tensor([0, 2, 2]), Tensor([1, 3, 1])], rand(*S)),
  "getitem_tensor_and_slice": (lambda x: x[1:, Tensor([[3, 0], [0, 0]])], rand(*S)),
  "getitem_list_index": (lambda x: x[:, [1, 1, 3]], rand(*S)),
  "getitem_bool_mask": (lambda x: x[Tensor(MASK)], rand(*S)),
  "getitem_bool_rows": (lambda x: x[Tensor(np.array([True, False, True]))], rand(*S)),
  "gather_dim0": (lambda x: x.gather(0, Tensor(IDX)), rand(*S)),
  "gather_dim1": (lambda x: x.gather(1, Tensor(IDX.T[:3, :2] % 4)), rand(*S)),
  "cat": (lambda x: x.cat(x * 2, dim=0), rand(*S)),
  "stack": (lambda x: x.stack(x.exp(), dim=1), rand(*S)),
  "repeat": (lambda x: x.repeat(2, 1, 2), rand(*S)),
  "repeat_interleave": (lambda x: x.repeat_interleave(2, dim=1), rand(*S)),
  "repeat_interleave_flat": (lambda x: x.repeat_interleave(3), rand(*S)),
  "roll": (lambda x: x.roll(1, 1), rand(*S)),
  "roll_multi": (lambda x: x.roll((2, -1), (0, 1)), rand(*S)),
  "roll_flat": (lambda x: x.roll(5), rand(*S)),
  "split": (lambda x: (lambda a, b: a * 2 + b.sum(0, keepdim=True))(*x.split([1, 2], 0)), rand(*S)),
  "split_int": (lambda x: x.split(3, dim=1)[1] * 3, rand(*S)),
  "chunk": (lambda x: (lambda a, b: a * b)(*x.chunk(2, dim=1)), rand(*S)),
  "masked_fill": (lambda x: x.masked_fill(Tensor(MASK), 0.5), rand(*S)),
  "setitem_copy": (lambda x: _setitem(x), rand(*S)),
}


def _setitem(x: Tensor) -> Tensor:
  y = x * 1
  y[1] = Tensor(np.array([1.0, 2.0, 3.0, 4.0]))
  return y * x


@functools.lru_cache(maxsize=None)
def _results() -> dict:
  """All MOVE cases checked together: one stacked graph per input shape (see batch_gradcheck)."""
  return batch_gradcheck(MOVE)


@pytest.mark.parametrize("name", list(MOVE))
def test_movement(name):
  assert_directional(name, _results()[name])


@pytest.mark.parametrize("name", ["pad_reflect", "getitem_tensor_index"])
def test_movement_alone(name):
  # a few cases on their own graph too, through the general check
  fn, x = MOVE[name]
  gradcheck(fn, x)


def test_gather_grad_accumulates_duplicates():
  # IDX picks row 0 of column 1 twice (and row 2 of column 0 once): the gradient is a scatter-add
  x = Tensor(rand(*S))
  (g,) = x.gather(0, Tensor(IDX)).sum().gradient(x)
  want = np.zeros(S)
  for i in range(IDX.shape[0]):
    for j in range(IDX.shape[1]): want[IDX[i, j], j] += 1
  np.testing.assert_array_equal(g.numpy(), want)


def test_cat_two_inputs():
  gradcheck(lambda a, b: a.cat(b, dim=1), rand(*S), rand(3, 2, seed=1))


def test_stack_three_inputs():
  gradcheck(lambda a, b, c: a.stack(b, c, dim=0), rand(*S), rand(*S, seed=1), rand(*S, seed=2))


def test_masked_fill_tensor_value():
  gradcheck(lambda x, v: x.masked_fill(Tensor(MASK), v), rand(*S), rand(seed=1))


def test_scatter_grad_wrt_src_and_self():
  # no duplicate targets within a column: src elements each land once, self keeps the untouched places
  idx = Tensor(np.array([[2, 0, 1, 0], [0, 1, 2, 2]]))
  gradcheck(lambda x, s: x.scatter(0, idx, s), rand(*S), rand(2, 4, seed=1))


def test_scatter_add_grad():
  idx = Tensor(IDX)
  gradcheck(lambda x: x.scatter(0, idx, 2.5, reduce="add"), rand(*S))  # scatter(reduce=) takes a scalar src (tinygrad)


def test_scatter_reduce_sum_grad():
  idx = Tensor(IDX)
  gradcheck(lambda x, s: x.scatter_reduce(0, idx, s, reduce="sum"), rand(*S), rand(2, 4, seed=1))


def test_where_indexing_chain():
  gradcheck(lambda x: x[1:, ::-1].pad((1, 0, 0, 1)).flip(0)[:, 1:].reshape(-1), rand(*S))


def test_batch_gradcheck_pinpoints_a_wrong_case():
  # the stacked check must flag exactly the case whose gradient is wrong (detach hides x's second use)
  res = batch_gradcheck({"ok": (lambda x: x.flip(0) * x, rand(*S)), "bad": (lambda x: x * x.detach(), rand(*S, seed=1))})
  assert_directional("ok", res["ok"])
  with pytest.raises(AssertionError, match="bad direction"):
    assert_directional("bad", res["bad"])
