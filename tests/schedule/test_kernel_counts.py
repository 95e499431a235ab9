"""Kernel counts of canonical programs (schedule only, on NULL), and the values of the same programs run on CPU."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.tensor import Tensor
from plugrad.testing.helpers import assert_close, rand_np
from plugrad.uop.ops import Ops

A, B, C = rand_np((4, 5), seed=0), rand_np((4, 5), seed=1), rand_np((5,), seed=2)
M1, M2 = rand_np((3, 4), seed=3), rand_np((4, 6), seed=4)


def _softmax(t):
  e = (t - t.max(axis=-1, keepdim=True)).exp()
  return e / e.sum(axis=-1, keepdim=True)


def _np_softmax(x):
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


# (name, program over Tensors, numpy oracle, max kernels, exact?)
PROGRAMS = [
  ("fused elementwise", lambda a, b, c: ((a + b) * c).relu(), lambda a, b, c: np.maximum((a + b) * c, 0), 1),
  ("mul then reduce", lambda a, b, c: (a * b).sum(axis=1), lambda a, b, c: (a * b).sum(axis=1), 1),
  ("broadcast matmul", lambda a, b, c: (Tensor(M1, device=a.device).reshape(3, 4, 1) * Tensor(M2, device=a.device).reshape(1, 4, 6)).sum(axis=1),
   lambda a, b, c: M1 @ M2, 1),
  ("reduce then elementwise", lambda a, b, c: a.sum(axis=1) * 2 + 1, lambda a, b, c: a.sum(axis=1) * 2 + 1, 1),
  ("two full reduces added", lambda a, b, c: a.sum() + b.sum(), lambda a, b, c: a.sum() + b.sum(), 2),
  ("softmax last axis", lambda a, b, c: _softmax(a), lambda a, b, c: _np_softmax(a), 3),
  ("matmul epilogue before contiguous, twice", lambda a, b, c: ((a.T @ b).relu().contiguous() @ (b.T * 2)).relu() + 1,
   lambda a, b, c: np.maximum(np.maximum(a.T @ b, 0) @ (b.T * 2), 0) + 1, 2),
  ("pad flip shrink fused", lambda a, b, c: a._pad(((1, 1), (0, 2))).flip(1).shrink(((0, 5), (1, 6))) * 3,
   lambda a, b, c: np.pad(a, ((1, 1), (0, 2)))[:, ::-1][0:5, 1:6] * 3, 1),
]




@pytest.mark.parametrize("name,fn,np_fn,most", PROGRAMS,
                         ids=[p[0] for p in PROGRAMS])
def test_kernel_count(name, fn, np_fn, most):
  out = fn(*(Tensor(x, device="NULL") for x in (A, B, C)))
  n = len(out.schedule())
  assert 1 <= n <= most, f"{name}: {n} kernels, expected at most {most}"
  if most == 1: assert n == 1


@pytest.mark.parametrize("name,fn,np_fn,most", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_kernel_values_on_cpu(name, fn, np_fn, most):
  assert_close(fn(*(Tensor(x, device="CPU") for x in (A, B, C))).numpy(), np_fn(A, B, C), atol=1e-5, rtol=1e-5)


def test_scheduled_items_are_kernels_writing_slot0():
  out = ((Tensor(A, device="NULL") + 1) * 2).sum(axis=0)
  (item,) = out.schedule()
  assert item.ast.op is Ops.SINK and item.ast.src[0].op is Ops.STORE
  assert len(item.bufs) == 2 and item.bufs[0].arg == 5 and item.bufs[1].arg == 20  # output (5 floats), input (20 floats)


def test_contiguous_splits_kernels():
  a = Tensor(A, device="NULL")
  assert len(((a + 1) * 2).schedule()) == 1
  assert len(((a + 1).contiguous() * 2).schedule()) == 2
  b = (a + 1).realize()  # runs (on NULL, nothing is computed) and leaves a buffer behind: the rest is one kernel
  assert len(b.schedule()) == 0 and len((b * 2).schedule()) == 1


def test_contiguous_values_on_cpu():
  a = Tensor(A, device="CPU")
  x = (a + 1).contiguous()
  assert_close((x * 2 + x.realize()).numpy(), (A + 1) * 3)


def test_reduce_broadcast_is_realized_once():
  a = Tensor(A, device="NULL")
  items = (a - a.sum(axis=1, keepdim=True)).schedule()
  assert len(items) == 2  # the reduction is computed once into a buffer, then broadcast
  assert_close((Tensor(A, device="CPU") - Tensor(A, device="CPU").sum(axis=1, keepdim=True)).numpy(), A - A.sum(axis=1, keepdims=True))


def test_device_copy_is_a_copy_item():
  a = Tensor(A, device="NULL")
  items = (a * 2).to("PYTHON").schedule()
  kinds = [it.ast.op for it in items]
  assert kinds == [Ops.SINK, Ops.COPY], kinds
  copy = items[1]
  assert copy.bufs[0].src[1].arg == "PYTHON" and copy.bufs[1].src[1].arg == "NULL"


def test_device_copy_values():
  t = (Tensor(A, device="CPU") * 2).to("PYTHON") + 1
  assert t.device == "PYTHON"
  assert_close(t.numpy(), A * 2 + 1)
  back = (Tensor(B, device="PYTHON").sum(axis=0)).to("CPU")
  assert back.device == "CPU"
  assert_close(back.numpy(), B.sum(axis=0))


def test_reduce_read_by_two_kernels_is_computed_once():
  """Scores read by the softmax's max and sum kernels and by its normalize kernel: the matmul runs in one kernel,
  not in each of its readers (a contiguous() after the softmax used to hide this from the scheduler)."""
  q, k = rand_np((4, 8), seed=5), rand_np((6, 8), seed=6)
  p = _softmax(Tensor(q, device="NULL") @ Tensor(k, device="NULL").T).contiguous() @ Tensor(k, device="NULL")
  asts = [it.ast for it in p.schedule() if it.ast.op is Ops.SINK]
  # the 8-long dot products of the scores appear in exactly one kernel
  with_dot = [a for a in asts if any(n.op is Ops.REDUCE and n.src[1].src[0].op is Ops.CONST and n.src[1].src[0].arg == 8 for n in a.toposort())]
  assert len(with_dot) == 1, f"scores computed in {len(with_dot)} kernels"
  ref = np.exp(q @ k.T - (q @ k.T).max(-1, keepdims=True))
  assert_close(_softmax(Tensor(q) @ Tensor(k).T).contiguous().__matmul__(Tensor(k)).numpy(), (ref / ref.sum(-1, keepdims=True)) @ k)


def _blockwise(x: Tensor, w: Tensor, scale: Tensor) -> Tensor:
  """A blockwise product, as the LLM's quantized ones: per-block dot products (an inner sum of 8), scaled per block
  and summed over the 4 blocks (the outer sum): x (rows, 32) by w (cols, 32) -> (rows, cols)."""
  R, C = x.shape[0], w.shape[0]
  dots = (x.reshape(R, 1, 4, 8) * w.reshape(1, C, 4, 8)).sum(-1)
  return (dots * scale.reshape(1, C, 4)).sum(-1)


def test_a_sum_of_sums_read_by_several_kernels_is_one_kernel():
  """A product whose rows are each copied by a kernel of their own (a batched decode step's value projection, written
  one cache row per slot) is realized as one kernel: the outer sum, with the inner block sums computed inside it, not
  also the inner sums in a kernel of their own (their partials written and read back: 6.6 against 3.8 us a step on
  the LLM's value projection, the extra kernel once per layer)."""
  x, w, sc = rand_np((4, 32), seed=10), rand_np((6, 32), seed=11), rand_np((6, 4), seed=12)
  def rows(dev):
    y = _blockwise(Tensor(x, device=dev), Tensor(w, device=dev), Tensor(sc, device=dev))
    out = Tensor.zeros(4, 6, device=dev).contiguous().realize()
    return out, [out[b:b + 1].assign(y[b:b + 1]) for b in range(4)]
  out, writes = rows("NULL")
  items = [it for it in Tensor.schedule(*writes) if it.ast.op is Ops.SINK]
  with_sum = [it for it in items if any(n.op is Ops.REDUCE for n in it.ast.toposort())]
  assert len(with_sum) == 1 and len(items) == 5, [len(with_sum), len(items)]
  out, writes = rows(None)
  Tensor.realize_all(*writes)
  ref = ((x.reshape(4, 1, 4, 8) * w.reshape(1, 6, 4, 8)).sum(-1) * sc.reshape(1, 6, 4)).sum(-1)
  assert_close(out.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_activation_between_matmuls_is_computed_once():
  """(x @ w1).silu() @ w2: the silu is realized with the first matmul (one kernel) instead of being recomputed inside
  the second matmul once per output column; a per-row rms scale stays fused (it is cheap and hoisted)."""
  x, w1, w2 = rand_np((4, 8), seed=7), rand_np((8, 16), seed=8), rand_np((16, 8), seed=9)
  def mlp(dev):
    return (Tensor(x, device=dev) @ Tensor(w1, device=dev)).silu() @ Tensor(w2, device=dev)
  asts = [it.ast for it in mlp("NULL").schedule() if it.ast.op is Ops.SINK]
  assert len(asts) == 2
  assert sum(n.op is Ops.EXP2 for a in asts for n in a.toposort()) == 1 and not any(n.op is Ops.EXP2 for n in asts[1].toposort())
  h = x @ w1
  assert_close(mlp(None).numpy(), (h / (1 + np.exp(-h))) @ w2, rtol=1e-4, atol=1e-4)
  rms = Tensor(x, device="NULL") * ((Tensor(x, device="NULL") ** 2).mean(-1, keepdim=True) + 1e-5).rsqrt()
  assert len([it for it in (rms @ Tensor(w1, device="NULL")).schedule() if it.ast.op is Ops.SINK]) == 2   # mean, matmul


def test_wide_elementwise_shared_by_kernels_is_computed_once():
  """A running sum over many buffers (a residual stream's gradient: every later layer adds a term) read by two
  reductions per step: each sum is written once and the next step reads it, instead of every reader recomputing the
  whole chain from all its terms (reads quadratic in the depth; train_llama's backward packing kernels read 47 -> 82 MB
  each). A sum of fewer than SHARED_WIDE_INPUTS buffers stays fused into its readers."""
  n = 8
  terms = [rand_np((4, 16), seed=20 + i) for i in range(n)]
  def build(dev):
    ts = [Tensor(t, device=dev) for t in terms]
    acc, outs = ts[0], []
    for t in ts[1:]:
      acc = acc + t
      outs += [(acc * 2).sum(axis=1), (acc * acc).sum(axis=0)]
    return outs
  outs = build("NULL")
  items = outs[0].schedule(*outs[1:])
  widest = max(len({b for b in it.bufs[1:]}) for it in items if it.ast.op is Ops.SINK)
  assert widest <= 6, f"a kernel reads {widest} buffers: the running sum is recomputed from its terms"
  ref, acc = [], terms[0]
  for t in terms[1:]:
    acc = acc + t
    ref += [(acc * 2).sum(axis=1), (acc * acc).sum(axis=0)]
  got = build("CPU")
  Tensor.realize_all(*got)
  for g, r in zip(got, ref): assert_close(g.numpy(), r, atol=1e-4, rtol=1e-5)


def _full_writes(items, n: int) -> int:
  """Kernels among `items` writing an output of n elements."""
  return sum(1 for it in items if it.ast.op is Ops.SINK and any(st.src[0].src[0].dtype.size == n for st in it.ast.src))


def test_batchnorm_backward_recomputes_cheap_shared_values():
  """BatchNorm + ReLU forward and backward: the normalized value, the ReLU and its mask read the input and per-channel
  vectors (mean, scale, shift), so every kernel that needs them computes them again instead of reading them written.
  Three full-size outputs (the forward's; the gradient through the ReLU, which nn.BatchNorm's closed-form backward
  writes once for its two sums and dx; the input gradient), not seven as before (a ResNet block's training step:
  77 -> 60 kernels). The vectors don't make such a value 'wide' (SHARED_WIDE_INPUTS counts buffers of its own size)."""
  from plugrad import nn
  rng = np.random.default_rng(3)
  x_np, dy_np = rng.standard_normal((4, 8, 6, 6)).astype(np.float32), rng.standard_normal((4, 8, 6, 6)).astype(np.float32)
  def run(dev):
    x = Tensor(x_np, device=dev, requires_grad=True)
    bn = nn.BatchNorm2d(8)
    bn.track_running_stats = False
    bn.weight = Tensor(np.linspace(0.5, 1.5, 8, dtype=np.float32), device=dev, requires_grad=True)
    bn.bias = Tensor(np.linspace(-0.2, 0.2, 8, dtype=np.float32), device=dev, requires_grad=True)
    with Tensor.train():
      y = bn(x).relu()
      y.backward(Tensor(dy_np, device=dev))
    return y, x.grad, bn.weight.grad, bn.bias.grad
  outs = run("NULL")
  items = outs[0].schedule(*outs[1:])
  assert _full_writes(items, x_np.size) == 3
  # reductions over the input's size: the mean and the variance, then the gradient's two sums (nn.BatchNorm's
  # closed-form backward; autograd through the statistics' graphs took four)
  assert sum(1 for it in items if it.ast.op is Ops.SINK and any(n.op is Ops.REDUCE for n in it.ast.toposort())
             and max(b.dtype.size for b in it.ast.toposort() if b.op is Ops.DEFINE_GLOBAL) == x_np.size) == 4
  torch = pytest.importorskip("torch", reason="PyTorch is not installed (the oracle of the values)")
  tx = torch.tensor(x_np, requires_grad=True)
  tw = torch.tensor(np.linspace(0.5, 1.5, 8, dtype=np.float32), requires_grad=True)
  tb = torch.tensor(np.linspace(-0.2, 0.2, 8, dtype=np.float32), requires_grad=True)
  ty = torch.relu(torch.nn.functional.batch_norm(tx, None, None, tw, tb, training=True))
  ty.backward(torch.tensor(dy_np))
  for g, r in zip(run("CPU"), (ty, tx.grad, tw.grad, tb.grad)): assert_close(g.numpy(), r.detach().numpy(), atol=1e-4, rtol=1e-4)


def test_shared_value_read_through_a_broadcast_is_written_once():
  """A rotated query (q * cos + rotate(q) * sin: one full-size input and small tables) read by a scores reduction
  through a broadcast over the keys, and by a second kernel: written once, not recomputed once per key."""
  q_np, k_np = rand_np((4, 8), seed=30), rand_np((16, 8), seed=31)
  cos_np, sin_np = rand_np((8,), seed=32), rand_np((8,), seed=33)
  def build(dev):
    q, k, cos, sin = (Tensor(a, device=dev) for a in (q_np, k_np, cos_np, sin_np))
    sign = Tensor(np.tile(np.array([-1, 1], np.float32), 4), device=dev)
    rot = q * cos + q.reshape(4, 4, 2).flip(2).reshape(4, 8) * sin * sign
    return (rot.reshape(4, 1, 8) * k.reshape(1, 16, 8)).sum(axis=2), rot.sum(axis=1)
  scores, s = build("NULL")
  items = scores.schedule(s)
  assert _full_writes(items, 32) == 1, "the rotated query is recomputed inside its readers"
  rot = q_np * cos_np + q_np.reshape(4, 4, 2)[:, :, ::-1].reshape(4, 8) * sin_np * np.tile(np.array([-1, 1], np.float32), 4)
  got = build("CPU")
  assert_close(got[0].numpy(), rot @ k_np.T, atol=1e-4, rtol=1e-4)
  assert_close(got[1].numpy(), rot.sum(axis=1), atol=1e-4, rtol=1e-4)
