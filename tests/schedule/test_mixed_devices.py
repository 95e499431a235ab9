"""A kernel runs on one device: an op whose inputs live on different devices is a clear error at schedule time (as
tinygrad's "all buffers must be on the same device"), not a foreign buffer handed to a kernel. `.to(device)` first works."""
import numpy as np
import pytest

from plugrad import Tensor


@pytest.mark.parametrize("devs", [("CPU", "PYTHON"), ("PYTHON", "CPU"), ("CPU", "CPU:1")])
def test_elementwise_on_two_devices_is_a_clear_error(devs):
  a, b = Tensor([1.0, 2.0, 3.0], device=devs[0]).realize(), Tensor([4.0, 5.0, 6.0], device=devs[1]).realize()
  with pytest.raises(RuntimeError, match=rf"different devices.*{devs[0]}.*{devs[1]}|different devices.*{devs[1]}.*{devs[0]}") as ei:
    (a + b).realize()
  assert ".to(" in str(ei.value)
  np.testing.assert_equal((a + b.to(devs[0])).numpy(), [5.0, 7.0, 9.0])  # moved first: fine


def test_lazy_inputs_and_reductions_on_two_devices():
  a, b = Tensor.arange(6, device="CPU").reshape(2, 3), Tensor.ones(3, device="PYTHON").contiguous()
  with pytest.raises(RuntimeError, match="different devices"): (a * b).sum(1).numpy()


def test_assign_from_another_device():
  a, b = Tensor.zeros(3, device="CPU").contiguous().realize(), Tensor([1.0, 2.0, 3.0], device="PYTHON").realize()
  with pytest.raises(RuntimeError, match="value on PYTHON but the target is on CPU"): a.assign(b + 1).realize()
  a.assign(b.to("CPU") + 1).realize()
  np.testing.assert_equal(a.numpy(), [2.0, 3.0, 4.0])
