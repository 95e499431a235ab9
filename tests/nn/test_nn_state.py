"""plugrad.nn.state: naming by attribute walk, parameter dedup, load_state_dict round trips, in-place writes, errors."""
from collections import OrderedDict, namedtuple

import numpy as np
import pytest

from plugrad import nn
from plugrad.dtype import dtypes
from plugrad.nn.state import get_parameters, get_state_dict, load_state_dict
from plugrad.uop.buffers import buffer_of
from plugrad.tensor import Tensor


class Block:
  def __init__(self):
    self.conv = nn.Conv2d(2, 3, 3)
    self.bn = nn.BatchNorm2d(3)


class Net:
  def __init__(self):
    self.blocks = [Block(), Block()]
    self.head = {"fc": nn.Linear(4, 2), "extra": (Tensor.zeros(2), None, "text", 3)}
    self.name = "net"


def test_state_dict_names():
  sd = get_state_dict(Net())
  assert list(sd) == [
    *[f"blocks.{i}.{k}" for i in range(2) for k in ("conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.num_batches_tracked",
                                                    "bn.running_mean", "bn.running_var")],
    "head.fc.weight", "head.fc.bias", "head.extra.0"]
  assert sd["blocks.1.conv.weight"].shape == (3, 2, 3, 3)
  assert list(get_state_dict(nn.Linear(2, 2), prefix="model.")) == ["model.weight", "model.bias"]
  assert list(get_state_dict(nn.Linear(2, 2, bias=False))) == ["weight"]


def test_state_dict_containers_and_cycles():
  P = namedtuple("P", ["a", "b"])
  t = Tensor([1.0])
  od = OrderedDict([("x", t), ("y", [Tensor([2.0])])])
  assert list(get_state_dict(P(t, od))) == ["a", "b.x", "b.y.0"]
  assert list(get_state_dict(t)) == [""]

  class Cyc:
    def __init__(self): self.me, self.w = self, Tensor([1.0])
  assert list(get_state_dict(Cyc())) == ["w"]


def test_get_parameters_dedups_shared():
  lin = nn.Linear(3, 3)
  model = {"a": lin, "b": lin, "c": [lin.weight]}
  assert len(get_state_dict(model)) == 5
  params = get_parameters(model)
  assert len(params) == 2 and params[0] is lin.weight and params[1] is lin.bias


def test_round_trip_writes_in_place():
  src, dst = Net(), Net()
  sd = {k: Tensor(v.numpy()) for k, v in get_state_dict(src).items()}
  targets = get_state_dict(dst)
  for t in targets.values(): t.realize()
  bufs = {k: buffer_of(t.uop) for k, t in targets.items()}
  res = load_state_dict(dst, sd)
  assert res.missing_keys == [] and res.unexpected_keys == []
  for k, t in get_state_dict(dst).items():
    assert t is targets[k]  # same Tensor objects
    assert buffer_of(t.uop) is bufs[k]  # same buffers: written in place
    np.testing.assert_array_equal(t.numpy(), get_state_dict(src)[k].numpy())
  # the state dict's own tensors are not aliased: changing the model leaves them alone
  w = get_state_dict(dst)["head.fc.weight"]
  before = sd["head.fc.weight"].numpy()
  w.assign(w + 1).realize()
  np.testing.assert_array_equal(sd["head.fc.weight"].numpy(), before)


def test_load_into_lazy_params_and_numpy_values():
  lin = nn.Linear(3, 2)  # params not realized yet
  w, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1.0, -1.0], np.float32)
  src = Tensor(w)
  load_state_dict(lin, {"weight": src, "bias": b})
  np.testing.assert_array_equal(lin.weight.numpy(), w)
  np.testing.assert_array_equal(lin.bias.numpy(), b)
  lin.weight.assign(lin.weight * 2).realize()
  np.testing.assert_array_equal(src.numpy(), w)  # loaded by copy, not by sharing src's buffer


def test_load_keeps_optimizer_valid():
  from plugrad.nn.optim import SGD
  lin = nn.Linear(2, 2)
  opt = SGD(get_parameters(lin), lr=0.5)
  w = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
  load_state_dict(lin, {"weight": Tensor(w), "bias": Tensor(np.zeros(2, np.float32))})
  with Tensor.train():
    for p in opt.params: p.grad = Tensor(np.ones(p.shape, np.float32))
    opt.step()
  np.testing.assert_allclose(lin.weight.numpy(), w - 0.5)
  np.testing.assert_allclose(lin.bias.numpy(), [-0.5, -0.5])


def test_strict_errors_list_keys():
  lin = nn.Linear(2, 2)
  with pytest.raises(RuntimeError, match=r"Missing key\(s\): bias\..*Unexpected key\(s\): bais"):
    load_state_dict(lin, {"weight": Tensor.zeros(2, 2), "bais": Tensor.zeros(2)})
  before = lin.weight.numpy()
  res = load_state_dict(lin, {"weight": Tensor.zeros(2, 2), "bais": Tensor.zeros(2)}, strict=False)
  assert res.missing_keys == ["bias"] and res.unexpected_keys == ["bais"]
  np.testing.assert_array_equal(lin.weight.numpy(), np.zeros((2, 2)))
  assert not np.array_equal(before, np.zeros((2, 2)))


def test_shape_and_dtype_mismatch_errors_write_nothing():
  lin = nn.Linear(3, 2)
  w0 = lin.weight.numpy()
  with pytest.raises(ValueError, match=r"'bias'.*\(2,\).*\(3,\)"):
    load_state_dict(lin, {"weight": Tensor(np.ones((2, 3), np.float32)), "bias": Tensor.zeros(3)})
  np.testing.assert_array_equal(lin.weight.numpy(), w0)  # the weight listed first was not written either
  with pytest.raises(TypeError, match=r"'weight'.*float.*int"):
    load_state_dict(lin, {"weight": Tensor(np.ones((2, 3), np.int32)), "bias": Tensor.zeros(2)})
  bn = nn.BatchNorm(2)
  sd = get_state_dict(bn)
  sd["num_batches_tracked"] = Tensor([3], dtype=dtypes.int32)
  with pytest.raises(TypeError, match="num_batches_tracked"): load_state_dict(bn, sd)


def test_consume():
  lin = nn.Linear(2, 1)
  sd = {"weight": Tensor([[1.0, 2.0]]), "bias": Tensor([0.5]), "other": Tensor([1.0])}
  load_state_dict(lin, sd, strict=False, consume=True)
  assert list(sd) == ["other"]
  np.testing.assert_array_equal(lin.weight.numpy(), [[1.0, 2.0]])
