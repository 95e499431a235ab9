"""Indexing through reshapes: runs of dims with equal products are mapped on their own, so symbolic sizes keep their
index math free of divisions by symbolic strides."""
import numpy as np

from plugrad import Tensor, Variable
from plugrad.schedule.indexing import _reshape_groups


def test_reshape_groups():
  T = Variable("T", 1, 64)
  assert _reshape_groups((T, 576), (T, 9, 64)) == [(range(0, 1), range(0, 1)), (range(1, 2), range(1, 3))]
  assert _reshape_groups((6, 4), (2, 3, 4)) == [(range(0, 1), range(0, 2)), (range(1, 2), range(2, 3))]
  assert _reshape_groups((4, 6), (6, 4)) == [(range(0, 2), range(0, 2))]  # no common boundary: one run
  assert _reshape_groups((T * 2,), (T, 2)) is None  # a symbolic size that only matches a product: the general path


def test_symbolic_attention_scores_index_math_is_local():
  from plugrad.codegen import get_program
  from plugrad.device import Device
  T, S = Variable("T", 1, 16), Variable("S", 1, 16)
  rng = np.random.default_rng(0)
  an, bn = rng.standard_normal((1, 3, 16, 8)).astype(np.float32), rng.standard_normal((1, 3, 16, 8)).astype(np.float32)
  x = Tensor(an)[:, :, :T.bind(5)] @ Tensor(bn)[:, :, :S.bind(7)].transpose(-1, -2)
  src = get_program(x.schedule()[-1].ast, Device["CPU"].renderer).src
  assert src.count("%") <= 2 and src.count("/") <= 4  # was 7 modulos and 6 divisions per load before runs were split
  np.testing.assert_allclose(x.numpy(), an[:, :, :5] @ bn[:, :, :7].transpose(0, 1, 3, 2), rtol=1e-5, atol=1e-5)
