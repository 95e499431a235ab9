"""Schedule cache (keyed by graph structure), intermediate buffer reuse, bind checks, ASSIGN into buffers."""
import numpy as np
import pytest

from plugrad.engine.realize import buffer_for
from plugrad.schedule.kernelize import SCHEDULE_STATS, create_schedule
from plugrad.uop.buffers import buffer_of
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp


def softmax(x: Tensor) -> Tensor:
  e = (x - x.max(axis=1, keepdim=True)).exp()
  return e / e.sum(axis=1, keepdim=True)


def test_same_structure_new_data_hits_cache():
  rng = np.random.default_rng(0)
  a = rng.standard_normal((3, 7)).astype(np.float32)
  softmax(Tensor(a)).realize()
  hits, misses = SCHEDULE_STATS["hits"], SCHEDULE_STATS["misses"]
  for _ in range(3):
    b = rng.standard_normal((3, 7)).astype(np.float32)
    out = softmax(Tensor(b)).numpy()
    e = np.exp(b - b.max(1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
  assert SCHEDULE_STATS["hits"] == hits + 3 and SCHEDULE_STATS["misses"] == misses


def test_different_sharing_is_a_different_schedule():
  a, b = Tensor([1.0, 2.0]), Tensor([10.0, 20.0])
  assert (a + b).tolist() == [11.0, 22.0]
  assert (a + a).tolist() == [2.0, 4.0]  # a+a must not reuse a+b's schedule with b bound to a's buffer twice wrongly
  assert (b + b).tolist() == [20.0, 40.0]


def test_constants_are_part_of_the_key():
  a = Tensor([1.0, 2.0])
  assert (a * 2).tolist() == [2.0, 4.0]
  assert (a * 3).tolist() == [3.0, 6.0]


def test_intermediate_buffers_are_reused():
  x = Tensor(np.arange(12, dtype=np.float32))
  y = x
  for _ in range(4): y = (y * 2 + 1).contiguous()  # each step is its own kernel; step i only reads step i-1
  items, _ = create_schedule([y.uop])
  outs = [it.bufs[0] for it in items]
  assert len(items) == 4 and len(set(outs)) == 3  # step 3 writes into step 1's memory
  want = np.arange(12, dtype=np.float32)
  for _ in range(4): want = want * 2 + 1
  np.testing.assert_array_equal(y.numpy(), want)


def test_kept_intermediate_is_not_overwritten():
  x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  m1 = x.max(axis=1, keepdim=True)
  y = x - m1
  z = y - y.max(axis=1, keepdim=True)
  later = m1 * 10  # m1 is realized as an intermediate of z, and still used afterwards
  z.realize()
  np.testing.assert_allclose(later.numpy(), [[20.0], [50.0]])


def test_bind_mismatch():
  from plugrad.schedule.kernelize import _Normalize
  v = UOp.variable("n", 1, 10)
  n = _Normalize()
  n.bind(v.bind(3))
  n.bind(v.bind(3))
  with pytest.raises(RuntimeError, match="bind mismatch on n"): n.bind(v.bind(4))


def test_assign_into_realized_slice():
  t = Tensor(np.zeros((4, 4), np.float32)).realize()
  buf = buffer_of(t.uop)
  target = t.shrink(((1, 3), (0, 4)))
  out = Tensor(UOp(Ops.ASSIGN, t.dtype, (target.uop, Tensor(np.ones((2, 4), np.float32)).uop)))
  out.realize()
  assert buffer_of(out.uop) is buf  # written in place
  want = np.zeros((4, 4), np.float32); want[1:3] = 1
  np.testing.assert_array_equal(buffer_for(buf).numpy().reshape(4, 4), want)
  np.testing.assert_array_equal(t.numpy(), want)


def test_bitcast_to_smaller_itemsize_reads_a_buffer_view():
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  t = Tensor(x).bitcast("uint16")
  np.testing.assert_array_equal(t.numpy(), x.view(np.uint16))
  np.testing.assert_array_equal((t + 1).numpy(), x.view(np.uint16) + 1)
  np.testing.assert_array_equal(Tensor(x.view(np.int32)).bitcast("int8").numpy(), x.view(np.int32).view(np.int8))


def test_assign_is_lazy_and_in_place():
  t = Tensor(np.arange(4, dtype=np.float32)).realize()
  buf = buffer_of(t.uop)
  t.assign(t * 2 + 1)
  assert not np.any(buffer_for(buf).numpy() == [1, 3, 5, 7])  # nothing written yet: assign is lazy
  np.testing.assert_array_equal(t.numpy(), [1, 3, 5, 7])
  assert buffer_of(t.uop) is buf
  t.assign(t * 2).assign(t + 1)  # chained assigns before realizing
  np.testing.assert_array_equal(t.numpy(), [3, 7, 11, 15])


def test_assign_reading_other_elements_uses_a_temporary():
  t = Tensor(np.arange(5, dtype=np.float32)).realize()
  t.assign(t.flip(0) + t)  # every element reads another one: an in-place kernel would read overwritten values
  np.testing.assert_array_equal(t.numpy(), [4, 4, 4, 4, 4])
  s = Tensor(np.arange(4, dtype=np.float32)).realize()
  s.assign(s - s.sum())
  np.testing.assert_array_equal(s.numpy(), np.arange(4) - 6)


def test_assign_errors():
  t = Tensor(np.zeros(3, np.float32)).realize()
  with pytest.raises(ValueError, match=r"shape \(2,\) doesn't match the target shape \(3,\)"): t.assign(Tensor([1.0, 2.0]))
  with pytest.raises(TypeError, match="dtype"): t.assign(Tensor([1, 2, 3]))
  t.assign(5.0)
  np.testing.assert_array_equal(t.numpy(), [5, 5, 5])


def test_repeated_layers_build_each_kernel_once():
  """A chain of identical blocks on different weights: one schedule, but each distinct kernel is indexed once (the
  kernel cache renames buffers and user constants), and every block still reads its own weights."""
  from plugrad.schedule import kernelize
  rng = np.random.default_rng(1)
  ws = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(6)]
  x0 = rng.standard_normal((2, 8)).astype(np.float32)
  x, ref = Tensor(x0), x0
  for w in ws:
    x = ((x @ Tensor(w)).relu() + Tensor.full((2, 8), 0.5)).contiguous()
    ref = np.maximum(ref @ w, 0) + 0.5
  before = len(kernelize._KERNEL_CACHE)
  kernels = [it for it in x.schedule() if it.ast.op is Ops.SINK]
  assert len(kernels) == 6 and len(kernelize._KERNEL_CACHE) - before <= 2   # the first block and the rest
  np.testing.assert_allclose(x.numpy(), ref, rtol=1e-4, atol=1e-4)
