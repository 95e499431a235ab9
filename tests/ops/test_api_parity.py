"""Regressions of the tinygrad/torch parity issue: API forms (stack of a tuple, reshape None, nested indices,
DType.min/max), tinygrad-style errors, results that were wrong (arange past int32, advanced-index placement, uint8
interpolate, 0-d softmax, mixed reflect/replicate pads, iteration of a 0-d tensor, huge ints) and sizes past 2**31."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
from plugrad.tensor_ops import TensorError

torch = pytest.importorskip("torch")  # a test extra (core/pyproject.toml)
F = torch.nn.functional


# ***** API forms *****
def test_stack_cat_of_a_sequence_and_reshape_none():
  a, b = Tensor([1, 2]), Tensor([3, 4])
  assert Tensor.stack((a, b)).tolist() == [[1, 2], [3, 4]] and Tensor.stack([a, b], dim=1).tolist() == [[1, 3], [2, 4]]
  assert Tensor.cat((a, b)).tolist() == [1, 2, 3, 4]
  x = Tensor.ones(2, 3, 4)
  assert x.reshape(None, 12).shape == (2, 12) and x.reshape(None, -1, None).shape == (2, 3, 4) and x.reshape((None, 4, 3)).shape == (2, 4, 3)
  assert x.reshape(None, 12, 1).shape == (2, 12, 1)
  with pytest.raises(ValueError, match="None"): x.reshape(24, 1, 1, None)


def test_nested_and_mixed_list_indices_match_numpy():
  a = np.arange(24).reshape(2, 3, 4)
  t = Tensor(a)
  for idx in ([[0]], [[[1]]], ([0, 1], [[2], [0]]), [[0, 1], [1, 0]], (slice(None), [[0, 2]])):
    np.testing.assert_array_equal(t[idx].numpy(), a[idx])
  np.testing.assert_array_equal(t[[0, Tensor(1)]].numpy(), a[[0, 1]])
  np.testing.assert_array_equal(t[:, [Tensor(2), 0], 1].numpy(), a[:, [2, 0], 1])
  np.testing.assert_array_equal(t[[[Tensor(1)], [0]]].numpy(), a[[[1], [0]]])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["s", "i", "l", "n", "L", "r"]), min_size=1, max_size=4))
def test_advanced_index_dim_placement_matches_torch(kinds):
  """torch's (and tinygrad's) placement: ints select first, then adjacent index arrays keep their place (numpy counts
  ints as advanced indices, so `a[1, :, [0, 1]]` differs: issue 45)."""
  a = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
  pick = {"s": slice(None), "i": 1, "l": [0, 1], "n": None, "L": [[1], [0]], "r": slice(1, None)}
  idx = tuple(pick[k] for k in kinds)
  if sum(k != "n" for k in kinds) > 4: return
  np.testing.assert_array_equal(Tensor(a)[idx].numpy(), torch.tensor(a)[idx].numpy())


def test_backward_with_requires_grad_none():
  x = Tensor([1.0, 2.0])
  (x * x).sum().backward()
  assert x.grad.tolist() == [2.0, 4.0]


# ***** errors *****
@pytest.mark.parametrize("fn", [lambda: Tensor.ones(2, 3).reshape(4, 2), lambda: Tensor.ones(2, 3) + Tensor.ones(4),
                                lambda: Tensor.ones(2, 3).expand(4, 3, 2), lambda: Tensor.ones(2).cat(Tensor.ones(2, 2)),
                                lambda: Tensor.ones(2, 3).pad((1,)), lambda: Tensor([1, 2]).flip((0, 0)),
                                lambda: Tensor.linspace(0, 1, 3, dtype=dtypes.bool), lambda: Tensor.kaiming_uniform(-2, 3),
                                lambda: Tensor.kaiming_normal(3, -2), lambda: Tensor([1, -1]).one_hot(-1)])
def test_shape_and_argument_errors_are_runtime_and_value_errors(fn):
  with pytest.raises(RuntimeError) as e: fn()
  assert isinstance(e.value, ValueError) and isinstance(e.value, TensorError)


def test_other_errors():
  with pytest.raises(IndexError): Tensor(1.0).squeeze(10)
  assert Tensor(1.0).squeeze(0).shape == () and Tensor(1.0).squeeze(-1).shape == ()
  with pytest.raises(AttributeError): Tensor([1], dtype="not_a_dtype")
  with pytest.raises(TypeError): Tensor([1], dtype="not_a_dtype")
  with pytest.raises(TypeError, match="0-d"): list(Tensor(1.0))
  assert [v.item() for v in Tensor([1.0, 2.0])] == [1.0, 2.0]
  with pytest.raises(ValueError, match=str(2 ** 70)): Tensor([2 ** 70])
  with pytest.raises(ValueError, match=str(-(2 ** 64))): Tensor(-(2 ** 64))
  assert Tensor([2 ** 40]).dtype == dtypes.int64 and Tensor([2 ** 40]).item() == 2 ** 40
  assert Tensor([2 ** 63]).dtype == dtypes.uint64 and Tensor(2 ** 35).item() == 2 ** 35


# ***** results that were wrong *****
def test_arange_past_int32():
  t = Tensor.arange(2 ** 31, 2 ** 31 + 3)
  assert t.dtype == dtypes.int64 and t.tolist() == [2 ** 31, 2 ** 31 + 1, 2 ** 31 + 2]
  assert Tensor.arange(-2 ** 31 - 2, -2 ** 31).tolist() == [-2 ** 31 - 2, -2 ** 31 - 1]
  assert Tensor.arange(5).dtype == dtypes.int32


def test_interpolate_uint8_keeps_dtype():
  x = np.random.default_rng(0).integers(0, 256, (1, 2, 4, 5)).astype(np.uint8)
  got = Tensor(x).interpolate((7, 3))
  want = F.interpolate(torch.tensor(x), (7, 3), mode="bilinear").numpy()
  assert got.dtype == dtypes.uint8
  np.testing.assert_array_equal(got.numpy(), want)  # torch's uint8 kernel's fixed point, byte for byte (issue 45)


def test_softmax_on_0d():
  for fn in ("softmax", "log_softmax"):
    np.testing.assert_allclose(getattr(Tensor(2.5), fn)().numpy(), getattr(torch.tensor(2.5), fn)(0).numpy())


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("pads", [(-1, 2), (2, -1), (3, -3), (-3, 3), (-2, -1), (1, 2, -1, 2), (-1, 1, 2, -2)])
def test_pad_mixed_signs_matches_torch(mode, pads):
  x = np.arange(20, dtype=np.float32).reshape(1, 4, 5)
  if mode == "circular" and pads in ((3, -3), (-3, 3)):  # wraps the 2 columns left more than once: torch reads garbage
    with pytest.raises(ValueError, match="more than once"): Tensor(x).pad(pads, mode=mode)
    return
  want = F.pad(torch.tensor(x), pads, mode=mode).numpy()
  np.testing.assert_array_equal(Tensor(x).pad(pads, mode=mode).numpy(), want)


# ***** sizes past 2**31 *****
def test_sizes_past_int32():
  assert Tensor.ones(2 ** 38 - 1).sum().item() == np.float32(2 ** 38 - 1)  # was 2**30: float accumulators saturate
  assert Tensor.ones(2 ** 38 - 1).sum(dtype=dtypes.float64).item() == 2 ** 38 - 1
  assert Tensor.full((3, 2 ** 33), 2, dtype=dtypes.int64).sum(1).tolist() == [2 ** 34] * 3
  assert Tensor.arange(3, dtype=dtypes.int64).reshape(3, 1).expand(3, 2 ** 32).sum(1).tolist() == [0, 2 ** 32, 2 ** 33]
  assert Tensor.ones(2 ** 20, 2 ** 20).max().item() == 1.0
  assert Tensor.arange(2 ** 33)[2 ** 33 - 3:].tolist() == [2 ** 33 - 3, 2 ** 33 - 2, 2 ** 33 - 1]  # index math in int64
  assert Tensor.arange(0, 2 ** 34, 2 ** 31)[-2:].tolist() == [6 * 2 ** 31, 7 * 2 ** 31]
  big = Tensor.ones(2 ** 33, 3, device="NULL")
  assert big.numel() == 3 * 2 ** 33 and (big + 1).realize().shape == (2 ** 33, 3)  # NULL: no memory, no compute


def test_constant_reduce_fold_is_exact_and_keeps_other_reduces():
  for p in itertools.product((1, 3), (1, 4)):
    x = Tensor.full(p, 2.5)
    np.testing.assert_array_equal(x.sum(0).numpy(), np.full(p, 2.5, np.float32).sum(0))
    np.testing.assert_array_equal(x.max(1).numpy(), np.full(p[0], 2.5, np.float32))
  y = np.arange(12, dtype=np.float32).reshape(3, 4)
  np.testing.assert_array_equal(Tensor(y).reshape(3, 1, 4).expand(3, 5, 4).sum((1, 2)).numpy(), (y * 5).sum(1))


def test_more_of_tinygrads_surface():
  x = Tensor.ones(2, 3)
  assert x.size() == (2, 3) and x.size(-1) == 3 and x.is_floating_point() and not Tensor([1]).is_floating_point()
  assert Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-7])) is True and Tensor([1.0]).allclose(Tensor([1.1])) is False
  assert Tensor([1.5]).bfloat16().dtype == dtypes.bfloat16 and Tensor([1, 2]).eq(1).tolist() == [True, False]
  assert Tensor([1, 2]).ne(1).tolist() == [False, True]
  t = Tensor([1, 2])
  assert t.replace(Tensor([3, 4])) is t and t.tolist() == [3, 4]
  with pytest.raises(ValueError): t.replace(Tensor([1.0, 2.0]))
  assert Tensor.ones(2).sequential([lambda v: v * 2, lambda v: v + 1]).tolist() == [3.0, 3.0]
  assert t.to_("PYTHON") is t and t.device == "PYTHON" and t.tolist() == [3, 4]
  Tensor.manual_seed(3)
  assert sorted(Tensor.randperm(20).tolist()) == list(range(20))
  s = Tensor([0.1, 0.0, 0.9]).multinomial(4000, replacement=True).numpy()
  counts = np.bincount(s, minlength=3)
  assert counts[1] == 0 and 0.87 < counts[2] / 4000 < 0.93
  assert Tensor([[0.0, 1.0], [1.0, 0.0]]).multinomial().tolist() == [[1], [0]]
  with pytest.raises(ValueError): Tensor([0.5, 0.5]).multinomial(2)
