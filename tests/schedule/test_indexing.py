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
  # symbolic sizes are matched as const * symbols: a product of dims can match a symbolic size
  assert _reshape_groups((T * 2,), (T, 2)) == [(range(0, 1), range(0, 2))]
  assert _reshape_groups((3, T * 8, 5), (T * 24, 5)) == [(range(0, 2), range(0, 1)), (range(2, 3), range(1, 2))]
  assert _reshape_groups((T, 3), (3, T)) == [(range(0, 2), range(0, 2))]
  S = Variable("S", 1, 64)
  assert _reshape_groups((T, S), (S, T)) is None  # T and S can't be ordered: the general path


def test_symbolic_multiple_reshape_values():
  T = Variable("T", 1, 8)
  a = np.arange(2 * 3 * 8 * 8 * 4, dtype=np.float32).reshape(2, 3, 64, 4)
  t = Tensor(a)[:, :, :T.bind(3) * 8].reshape(2, T.bind(3) * 24, 4) + 1
  np.testing.assert_array_equal(t.numpy(), a[:, :, :24].reshape(2, 72, 4) + 1)
  u = Tensor(a)[:, :, :T.bind(2) * 8].reshape(6, T.bind(2) * 8, 2, 2).permute(0, 2, 1, 3).reshape(6, 2, T.bind(2) * 16)
  np.testing.assert_array_equal(u.numpy(), a[:, :, :16].reshape(6, 16, 2, 2).transpose(0, 2, 1, 3).reshape(6, 2, 32))


def test_symbolic_attention_scores_index_math_is_local():
  from plugrad.codegen import get_program
  from plugrad.device import Device
  T, S = Variable("T", 1, 16), Variable("S", 1, 16)
  rng = np.random.default_rng(0)
  an, bn = rng.standard_normal((1, 3, 16, 8)).astype(np.float32), rng.standard_normal((1, 3, 16, 8)).astype(np.float32)
  x = Tensor(an)[:, :, :T.bind(5)] @ Tensor(bn)[:, :, :S.bind(7)].transpose(-1, -2)
  src = get_program(x.schedule(optimize=False)[-1].ast, Device["CPU"].renderer).src
  assert src.count("%") <= 2 and src.count("/") <= 4  # was 7 modulos and 6 divisions per load before runs were split
  np.testing.assert_allclose(x.numpy(), an[:, :, :5] @ bn[:, :, :7].transpose(0, 1, 3, 2), rtol=1e-5, atol=1e-5)


def test_buffers_simplified_away_are_not_kernel_parameters():
  a, b = Tensor(np.arange(4, dtype=np.float32)).realize(), Tensor(np.ones(4, np.float32)).realize()
  items = a.where(b, b).schedule()
  assert len(items) == 1 and len(items[0].bufs) == 2   # the output and b: a's loads folded away
  slots = sorted(n.arg for n in items[0].ast.toposort() if n.op.name == "DEFINE_GLOBAL")
  assert slots == [0, 1]
  np.testing.assert_array_equal(a.where(b, b).numpy(), np.ones(4, np.float32))
