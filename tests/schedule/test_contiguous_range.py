"""`uop.buffers.contiguous_range`: which movement views of a buffer are a row-major range of it (read or copied as raw
memory, no kernel), against numpy's own strides for the same view."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrad import Tensor
from plugrad.uop.buffers import contiguous_range


@st.composite
def permuted_views(draw):
  shape = tuple(draw(st.lists(st.sampled_from([1, 1, 2, 3]), min_size=1, max_size=5)))
  perm = tuple(draw(st.permutations(range(len(shape)))))
  return shape, perm


@settings(max_examples=60, deadline=None)
@given(permuted_views())
def test_permute_is_a_range_exactly_when_numpy_keeps_it_contiguous(case):
  """A permute is a row-major range when it only moves axes of size 1 (attention's output of one position, transposed
  from (B, H, 1, D) to (B, 1, H, D)): exactly when numpy's permuted view of a C-contiguous array is C-contiguous too.
  Such a view exports without a copy kernel and with the right values."""
  shape, perm = case
  a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
  t = Tensor(a).realize().permute(perm)
  view = np.transpose(a, perm)
  base, off, top = contiguous_range(t.uop)
  assert (top is t.uop) is view.flags.c_contiguous, (shape, perm)
  np.testing.assert_array_equal(t.numpy(), view)


def test_reshape_of_a_unit_permute_stays_a_range():
  t = Tensor(np.arange(24, dtype=np.float32).reshape(1, 4, 1, 6)).realize()
  v = t.transpose(1, 2).reshape(1, 1, 24)
  assert contiguous_range(v.uop)[2] is v.uop
  w = Tensor(np.arange(24, dtype=np.float32).reshape(1, 4, 2, 3)).realize().transpose(1, 2).reshape(1, 2, 12)
  assert contiguous_range(w.uop)[2] is not w.uop
  np.testing.assert_array_equal(w.numpy(), np.arange(24, dtype=np.float32).reshape(1, 4, 2, 3).transpose(0, 2, 1, 3).reshape(1, 2, 12))
