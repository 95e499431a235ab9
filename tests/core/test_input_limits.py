"""Front-end input limits: sizes no device can hold are refused when the tensor is made (naming size and device), an
allocation that fails names what it wanted, and nested lists too deep for a tensor are a clear error, not a
RecursionError."""
from __future__ import annotations
import numpy as np
import pytest
from plugrad import Device, Tensor, dtypes
from plugrad.errors import TensorError

@pytest.mark.parametrize("make", [lambda: Tensor.empty(2**62), lambda: Tensor.zeros(2**61, 4), lambda: Tensor.full((2**40, 2**40), 1.5),
                                  lambda: Tensor.ones(2**63, dtype=dtypes.uint8), lambda: Tensor.empty(2**31, 2**31, 2, dtype=dtypes.float64)])
def test_impossible_sizes_are_refused_at_once(make):
  """Tensor.empty(2**62) made a tensor whose realize failed with numpy's 'Maximum allowed dimension exceeded'."""
  with pytest.raises(TensorError, match=rf"bytes.* on {Device.DEFAULT}.*more than any device can address"): make()

def test_failed_allocation_names_size_and_device():
  t = Tensor.empty(2**60, dtype=dtypes.uint8)  # 1 EiB: below 2**63, but past any 48-bit address space
  with pytest.raises(MemoryError, match=rf"{Device.DEFAULT}: can't allocate 1.0 EiB \(1152921504606846976 bytes\)"): (t + 1).realize()

def test_large_but_possible_shapes_still_work():
  assert Tensor.empty(2**40, 0).shape == (2**40, 0)
  assert Tensor.zeros(3, 4).numpy().sum() == 0

def _nest(depth: int, leaf=1.0):
  x = leaf
  for _ in range(depth): x = [x]
  return x

@pytest.mark.parametrize("depth", [100_000, 2_000])
def test_deeply_nested_list_is_a_clear_error(depth):
  """A 100,000-deep nested list raised RecursionError."""
  with pytest.raises(TensorError, match="nested.*deep.*at most 64 dims"): Tensor(_nest(depth))

def test_nested_list_deeper_than_64_dims_is_a_clear_error():
  with pytest.raises(TensorError, match="64"): Tensor(_nest(65))
  assert Tensor(_nest(64)).shape == (1,) * 64
  np.testing.assert_array_equal(Tensor([[1, 2], [3, 4]]).numpy(), [[1, 2], [3, 4]])
