"""Multi-device tensors on CPU:0/CPU:1 (and PYTHON for host-staged copies): shard layouts, elementwise, movement,
reductions through allreduce (naive and ring), matmul, cat/stack, uneven splits, autograd, TinyJit, @function,
optimizers, safe_load into shards, and bad input. Every value is checked against numpy (or torch for gradients)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from plugrad import Device, Tensor, TinyJit
from plugrad.engine.function import function
from plugrad.engine.realize import CAPTURING
from plugrad.nn import optim
from plugrad.nn.serialize import gguf_load, safe_load, safe_save
from plugrad.nn.state import load_state_dict
from plugrad.schedule import multi as M
from plugrad.schedule.multi import MultiDeviceError
from plugrad.uop.ops import Ops, UOp

D2 = ("CPU:0", "CPU:1")
D3 = ("CPU:0", "CPU:1", "CPU:2")
RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


def test_devices_are_independent():
  d0, d1 = Device["CPU:0"], Device["CPU:1"]
  assert d0 is not d1 and d0.allocator is not d1.allocator
  t = Tensor([1.0, 2.0], device="CPU:1")
  assert t.device == "CPU:1" and t.to("CPU:0").device == "CPU" and t.to("CPU:0").tolist() == [1.0, 2.0]


@pytest.mark.parametrize("src,dst", [("CPU:0", "CPU:1"), ("CPU:1", "PYTHON"), ("PYTHON", "CPU:1")])
def test_copy_between_devices(src, dst):
  a = rand(3, 5)
  assert np.array_equal(Tensor(a, device=src).to(dst).numpy(), a)


@pytest.mark.parametrize("axis", [None, 0, 1, 2])
@pytest.mark.parametrize("devs", [D2, D3])
def test_shard_layouts(axis, devs):
  a = rand(6, 7, 4)
  t = Tensor(a).shard(devs, axis=axis).realize()
  assert t.device == tuple(Device.canonicalize(d) for d in devs) and t.shape == a.shape and t.shard_axis == axis
  if axis is not None:
    n, k = a.shape[axis], len(devs)
    sizes = [e - b for b, e in t.shard_bounds]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True) and len(sizes) == k
    for s, (b, e) in zip(t.shards, t.shard_bounds): assert np.array_equal(s.numpy(), np.take(a, range(b, e), axis=axis))
  else:
    for s in t.shards: assert np.array_equal(s.numpy(), a)
  assert np.array_equal(t.numpy(), a)


def test_uneven_splits_and_bad_splits():
  a = rand(7, 3)
  t = Tensor(a).shard(D2, axis=0, splits=[5, 2])
  assert t.shard_bounds == ((0, 5), (5, 7)) and np.allclose((t * 3).sum(0).numpy(), (a * 3).sum(0), atol=1e-5)
  with pytest.raises(MultiDeviceError, match="splits"): Tensor(a).shard(D2, axis=0, splits=[4, 4])
  with pytest.raises(MultiDeviceError, match="splits"): Tensor(a).shard(D2, axis=0, splits=[7, 0])
  with pytest.raises(MultiDeviceError, match="no rows"): Tensor(rand(2, 3)).shard(D3, axis=0)  # 3 devices, 2 rows
  with pytest.raises(IndexError): Tensor(a).shard(D2, axis=2)
  with pytest.raises(MultiDeviceError, match="repeat"): Tensor(a).shard(("CPU:0", "CPU"), axis=0)
  with pytest.raises(MultiDeviceError, match="tuple of devices"): Tensor(a).shard("CPU:0", axis=0)


def test_mixing_device_sets_is_an_error():
  a = Tensor(rand(4, 4)).shard(D2, axis=0)
  with pytest.raises(MultiDeviceError, match="mixes tensors on different devices"): (a + Tensor(rand(4, 4), device="CPU:0")).realize()
  with pytest.raises(MultiDeviceError, match="mixes tensors on different devices"): (a + Tensor(rand(4, 4)).shard(D3, axis=0)).realize()


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_elementwise_and_broadcast(axis):
  a, b, c = rand(4, 6), rand(4, 6), rand(6)
  ta, tb = Tensor(a).shard(D2, axis=axis), Tensor(b).shard(D2, axis=0)  # tb sharded differently: resharded to ta's layout
  out = (ta > 0).where((ta * tb).exp() + Tensor(c).to(D2), 1.5) if axis is not None else (ta * tb).exp() + 2
  ref = np.where(a > 0, np.exp(a * b) + c, 1.5) if axis is not None else np.exp(a * b) + 2
  assert np.allclose(out.numpy(), ref, rtol=1e-5)
  assert out.shard_axis == (0 if axis is None else axis)  # a replica meets a shard: the shard layout wins


@pytest.mark.parametrize("shard_axis", [0, 1, 2])
@pytest.mark.parametrize("red_axis", [None, 0, 1, 2, (0, 2)])
def test_reductions_on_every_axis(shard_axis, red_axis):
  a = rand(4, 6, 5)
  t = Tensor(a).shard(D2, axis=shard_axis)
  outs = [getattr(t, op)(axis=red_axis) for op in ("sum", "max", "mean", "min")]
  Tensor.realize_all(*outs)
  for got, op in zip(outs, ("sum", "max", "mean", "min")):
    assert np.allclose(got.numpy(), getattr(np, op)(a, axis=red_axis), rtol=1e-5, atol=1e-5), op
  got = outs[0]
  crosses = red_axis is None or shard_axis == red_axis or (isinstance(red_axis, tuple) and shard_axis in red_axis)
  assert got.shard_axis == (None if crosses else shard_axis - sum(1 for r in ((red_axis,) if isinstance(red_axis, int) else red_axis or ())
                                                                     if r < shard_axis))


@pytest.mark.parametrize("nbytes", [1024, 1 << 20])  # below and above RING_ALLREDUCE_BYTES
@pytest.mark.parametrize("devs", [D2, D3])
def test_allreduce_naive_and_ring(nbytes, devs):
  n = nbytes // 4
  parts = [rand(n) for _ in devs]
  p = [Tensor(x, device=d).uop for x, d in zip(parts, devs)]
  out = M.allreduce(p, Ops.ADD)
  copies = [u for u in dict.fromkeys(x for s in out.src for x in s.toposort()) if u.op is Ops.COPY]
  k = len(devs)
  # naive: every device copies every other device's whole partial; ring: k-1 chunk sends per device in the
  # reduce-scatter and k-1 chunk copies per device in the allgather
  if nbytes < M.RING_ALLREDUCE_BYTES: assert len(copies) == k * (k - 1) and all(c.src[0].numel() == n for c in copies)
  else: assert len(copies) == 2 * k * (k - 1) and all(c.src[0].numel() <= -(-n // k) for c in copies)
  t = Tensor(out)
  for s in t.shards: assert np.allclose(s.numpy(), sum(parts), rtol=1e-5, atol=1e-5)
  mx = Tensor(M.allreduce(p, Ops.MAX))
  for s in mx.shards: assert np.array_equal(s.numpy(), np.maximum.reduce(parts))


def test_ring_moves_less_than_naive():
  """Each device receives 2(k-1)/k of the buffer in the ring vs (k-1) buffers naive."""
  n, devs = 1 << 18, D3
  p = [Tensor(rand(n), device=d).uop for d in devs]
  def received(out) -> int:
    return sum(u.src[0].numel() for u in dict.fromkeys(x for s in out.src for x in s.toposort()) if u.op is Ops.COPY)
  ring = received(M.allreduce(p, Ops.ADD))
  assert ring <= 2 * n * (len(devs) - 1) + len(devs) and ring < n * len(devs) * (len(devs) - 1)


@pytest.mark.parametrize("a_axis,b_axis", [(0, None), (None, 1), (1, 0), (0, 1), (None, 0)])
def test_matmul_either_operand_sharded(a_axis, b_axis):
  a, b = rand(6, 8), rand(8, 4)
  out = Tensor(a).shard(D2, axis=a_axis) @ Tensor(b).shard(D2, axis=b_axis)
  assert np.allclose(out.numpy(), a @ b, atol=1e-4)


def test_movement_across_the_shard_axis():
  a = rand(4, 6)
  t = Tensor(a).shard(D2, axis=1)
  r = t.reshape(4, 2, 3)
  assert r.shard_axis == 1 and np.array_equal(r.numpy(), a.reshape(4, 2, 3))
  f = t.reshape(24)  # the shard axis would be split: allgathered, then reshaped per replica
  assert f.shard_axis is None and np.array_equal(f.numpy(), a.reshape(24))
  t0 = Tensor(a).shard(D2, axis=0)
  assert t0.reshape(24).shard_axis == 0 and np.array_equal(t0.reshape(24).numpy(), a.reshape(24))
  assert np.array_equal(t.permute(1, 0).numpy(), a.T) and t.permute(1, 0).shard_axis == 0
  assert np.array_equal(t.pad(((1, 2), (3, 1))).numpy(), np.pad(a, ((1, 2), (3, 1))))
  assert np.array_equal(t[:, 1:5].numpy(), a[:, 1:5]) and t[:, 1:5].shard_axis == 1
  assert np.array_equal(t[:, 4].numpy(), a[:, 4]) and np.array_equal(t.flip(1).numpy(), a[:, ::-1])
  assert np.array_equal(t.reshape(4, 6, 1).expand(4, 6, 3).numpy(), np.broadcast_to(a[:, :, None], (4, 6, 3)))


def test_cat_and_stack_of_shards():
  a, b = rand(4, 3), rand(2, 3)
  ta, tb = Tensor(a).shard(D2, axis=0), Tensor(b).shard(D2, axis=0)
  assert np.array_equal(Tensor.cat(ta, tb, dim=0).numpy(), np.concatenate([a, b]))
  assert np.array_equal(Tensor.cat(ta, ta, dim=1).numpy(), np.concatenate([a, a], 1))
  assert np.array_equal(Tensor.stack(ta, ta, dim=0).numpy(), np.stack([a, a])) and Tensor.stack(ta, ta).shard_axis == 1
  assert np.array_equal(Tensor.stack(ta, ta, dim=2).numpy(), np.stack([a, a], 2))


def test_reshard_and_to():
  a = rand(6, 4)
  t = Tensor(a).shard(D2, axis=0)
  for axis, splits in ((1, None), (None, None), (0, [1, 5])):
    r = t.shard(D2, axis=axis, splits=splits)
    assert r.shard_axis == axis and np.array_equal(r.numpy(), a)
  rep = Tensor(a).to(D2)
  assert rep.shard_axis is None and all(np.array_equal(s.numpy(), a) for s in rep.shards)
  assert t.to("CPU:1").device == "CPU:1" and np.array_equal(t.to("CPU:1").numpy(), a)
  assert np.array_equal(t.to(("CPU:1", "CPU:2")).numpy(), a) and t.to(("CPU:1", "CPU:2")).device == ("CPU:1", "CPU:2")


@pytest.mark.parametrize("x_axis,w_axis", [(0, None), (None, 1), (1, 0), (0, 0)])
def test_gradients_through_shards(x_axis, w_axis):
  x, w, b = rand(6, 4), rand(4, 3), rand(3)
  tx = Tensor(x).shard(D2, axis=x_axis)
  tw = Tensor(w, requires_grad=True).shard(D2, axis=w_axis).realize()
  tb = Tensor(b, requires_grad=True).to(D2).realize()
  loss = ((tx @ tw + tb).relu() * 2).mean() + tw.max()
  loss.backward()
  rw, rb = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
  rl = ((torch.tensor(x) @ rw + rb).relu() * 2).mean() + rw.max()
  rl.backward()
  assert np.allclose(loss.numpy(), rl.item(), rtol=1e-5)
  assert tw.grad.device == tw.device and tw.grad.shard_axis == w_axis
  assert np.allclose(tw.grad.numpy(), rw.grad.numpy(), atol=1e-5) and np.allclose(tb.grad.numpy(), rb.grad.numpy(), atol=1e-5)


def test_optimizer_step_on_sharded_params():
  x, w1, w2 = rand(8, 5), rand(5, 6), rand(6, 1)
  tx = Tensor(x).shard(D2, axis=0)
  p1, p2 = Tensor(w1).shard(D2, axis=1).realize(), Tensor(w2).to(D2).realize()
  opt = optim.Adam([p1, p2], lr=0.01)
  r1, r2 = torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)
  ropt = torch.optim.Adam([r1, r2], lr=0.01)
  with Tensor.train():
    for _ in range(3):
      opt.zero_grad()
      ((tx @ p1).relu() @ p2).square().mean().backward()
      opt.step()
      ropt.zero_grad()
      ((torch.tensor(x) @ r1).relu() @ r2).square().mean().backward()
      ropt.step()
  assert p1.shard_axis == 1 and opt._zeros_like([p1])[0].shard_axis == 1
  assert np.allclose(p1.numpy(), r1.detach().numpy(), atol=1e-5) and np.allclose(p2.numpy(), r2.detach().numpy(), atol=1e-5)
  for s in p2.shards: assert np.allclose(s.numpy(), r2.detach().numpy(), atol=1e-5)  # replicas stay equal


def test_jit_capture_and_replay_multi():
  w = Tensor(rand(5, 3)).to(D2).realize()
  @TinyJit
  def step(x: Tensor) -> Tensor: return (x @ w).relu().sum(0).realize()
  for i in range(4):
    x = rand(6, 5)
    out = step(Tensor(x).shard(D2, axis=0).realize())
    assert np.allclose(out.numpy(), np.maximum(x @ w.numpy(), 0).sum(0), atol=1e-5), i
  assert step.cnt == 2 and {ei.bufs[0].device for ei in step.captured} == {"CPU", "CPU:1"}
  assert not CAPTURING


def test_function_with_a_multi_device_axis():
  @function
  def layer(x: Tensor, w: Tensor) -> Tensor: return (x @ w).relu()
  x, w = rand(6, 4), rand(4, 3)
  tx, tw = Tensor(x).shard(D2, axis=0), Tensor(w, requires_grad=True).to(D2).realize()
  out = layer(tx, tw)
  assert out.shard_axis == 0 and all(s.uop.op is Ops.CALL for s in out.shards)
  assert np.allclose(out.numpy(), np.maximum(x @ w, 0), atol=1e-5)
  out.sum().backward()
  assert np.allclose(tw.grad.numpy(), x.T @ (x @ w > 0).astype(np.float32), atol=1e-4)


def test_safe_load_into_sharded_weights(tmp_path):
  w, b = rand(8, 3), rand(8)
  path = tmp_path / "m.safetensors"
  safe_save({"w": Tensor(w), "b": Tensor(b)}, str(path))
  class Model:
    def __init__(self):
      self.w = Tensor.zeros(8, 3).shard(D2, axis=0)
      self.b = Tensor.zeros(8).shard(D2, axis=0, splits=[3, 5])
  m = Model()
  sd = safe_load(str(path))
  assert sd["w"].device.startswith("DISK:")
  load_state_dict(m, sd)
  assert m.w.shard_bounds == ((0, 4), (4, 8)) and m.b.shard_bounds == ((0, 3), (3, 8))
  assert np.array_equal(m.w.numpy(), w) and np.array_equal(m.b.numpy(), b)
  assert np.array_equal(m.w.shards[1].numpy(), w[4:]) and np.array_equal(m.b.shards[1].numpy(), b[3:])


def test_disk_to_shard_copies_only_its_rows(tmp_path):
  a = rand(8, 4)
  path = tmp_path / "x.safetensors"
  safe_save({"x": Tensor(a)}, str(path))
  t = safe_load(str(path))["x"].shard(D2, axis=0)
  items = Tensor.schedule(t.shards[0], t.shards[1])
  copies = [it for it in items if it.ast.op is Ops.COPY]
  assert len(copies) == 2 and all(it.bufs[1].dtype.itemsize * (it.bufs[1].arg[0] if it.bufs[1].op is Ops.BUFFER_VIEW else it.bufs[1].arg)
                                  == a.nbytes // 2 for it in copies)
  assert np.array_equal(t.numpy(), a)


def test_jit_replays_views_of_input_buffers():
  """A capture whose copies read views of an input (the ring allreduce sends chunks of its inputs) replays them as the
  same views of the new inputs (it used to refuse such captures)."""
  n = M.RING_ALLREDUCE_BYTES // 4 * 2
  @TinyJit
  def ar(a: Tensor, b: Tensor) -> Tensor: return Tensor(M.allreduce([a.uop, b.uop], Ops.ADD)).realize()
  @TinyJit
  def mid(x: Tensor) -> Tensor: return x.reshape(4, -1)[1:3].to("CPU:1").realize()
  for i in range(4):
    a, b = rand(n), rand(n)
    out = ar(Tensor(a, device="CPU:0").realize(), Tensor(b, device="CPU:1").realize())
    for s in out.shards: assert np.allclose(s.numpy(), a + b, atol=1e-6), i
    assert np.array_equal(mid(Tensor(a).realize()).numpy(), a.reshape(4, -1)[1:3]), i
  assert ar.cnt == 2 and ar._views and mid._views


def test_symbolic_slice_of_a_shard_stays_a_view():
  """Regression: a reshape with symbolic sizes used to allgather the shards, so assigning into a KV-cache slice at a
  symbolic position wrote into a temporary copy instead of the cache."""
  cache = Tensor.zeros(1, 3, 4, 10).contiguous().realize().shard(D2, 1, [2, 1]).realize()
  x = rand(1, 3, 4, 2)
  st = UOp.variable("start", 0, 8).bind(3)
  view = cache[:, :, :, st:st + 2]
  assert all(u.op is not Ops.COPY for s in view.uop.src for u in s.toposort())
  view.assign(Tensor(x).to(D2)).realize()
  ref = np.zeros((1, 3, 4, 10), np.float32)
  ref[..., 3:5] = x
  assert np.array_equal(cache.numpy(), ref)


def test_gguf_into_sharded_weights(tmp_path):
  """Plain and Q8_0 GGUF tensors loaded into sharded weights: each device ends up with its rows (dequantized for Q8_0),
  compared with the gguf package's own dequantization."""
  gguf = pytest.importorskip("gguf")
  from gguf.quants import dequantize as gg_dequantize, quantize as gg_quantize
  w, q = rand(6, 4), rand(4, 64)
  qraw = gg_quantize(q, gguf.GGMLQuantizationType.Q8_0)
  path = tmp_path / "m.gguf"
  wr = gguf.GGUFWriter(str(path), "test")
  wr.add_tensor("w", w)
  wr.add_tensor("q", qraw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
  wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()
  _, ts = gguf_load(str(path))
  class Model:
    def __init__(self):
      self.w = Tensor.zeros(6, 4).shard(D2, axis=0, splits=[4, 2])
      self.q = Tensor.zeros(4, 64).shard(D2, axis=1)
  m = Model()
  load_state_dict(m, ts)
  assert np.array_equal(m.w.numpy(), w) and np.array_equal(m.w.shards[1].numpy(), w[4:])
  ref = gg_dequantize(qraw, gguf.GGMLQuantizationType.Q8_0).reshape(q.shape)
  assert m.q.shard_axis == 1 and np.array_equal(m.q.numpy(), ref) and np.array_equal(m.q.shards[1].numpy(), ref[:, 32:])


def test_gradient_through_a_ring_allreduce():
  """A reduction over the shard axis big enough for the ring (tensor-parallel matmul over the split input features),
  differentiated: the gradient flows through the allgather's writes (AFTER of ASSIGNs) back to both shards."""
  x, w = rand(256, 64), rand(64, 320)   # output 256*320*4 bytes > RING_ALLREDUCE_BYTES
  assert 256 * 320 * 4 >= M.RING_ALLREDUCE_BYTES
  tx, tw = Tensor(x).shard(D2, axis=1), Tensor(w, requires_grad=True).shard(D2, axis=0).realize()
  y = tx @ tw
  assert any(u.op is Ops.AFTER for u in y.uop.src[0].toposort())
  (y * y).sum().backward()
  rw = torch.tensor(w, requires_grad=True)
  ((torch.tensor(x) @ rw) ** 2).sum().backward()
  assert np.allclose(y.numpy(), x @ w, atol=1e-3)
  np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol=1e-2)


def test_shards_on_different_device_kinds():
  """CPU + PYTHON: every copy between the shards is host-staged (no device-to-device path), results are the same."""
  a, w = rand(6, 4), rand(4, 3)
  t = Tensor(a).shard(("CPU", "PYTHON"), axis=0)
  assert t.device == ("CPU", "PYTHON")
  assert np.allclose(t.sum(0).numpy(), a.sum(0), atol=1e-5)
  assert np.allclose((t @ Tensor(w).to(("CPU", "PYTHON"))).numpy(), a @ w, atol=1e-5)
  assert np.array_equal(t.to("PYTHON").numpy(), a)
