"""DISK device: memory-mapped file tensors, range copies to CPU, writes into slices (also through bitcast views)."""
import pathlib
import numpy as np
import pytest
from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

@pytest.fixture
def path(tmp_path): return tmp_path / "data.bin"

def test_path_tensor_reads_file(path):
  data = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
  path.write_bytes(data.tobytes())
  t = Tensor(pathlib.Path(path))
  assert t.shape == (4096,) and t.dtype == dtypes.uint8 and t.device.startswith("DISK:")
  np.testing.assert_array_equal(t.to("CPU").numpy(), data)
  np.testing.assert_array_equal(t[100:300].to("CPU").numpy(), data[100:300])

def test_slice_copy_is_one_range_copy(path):
  data = np.arange(64, dtype=np.uint8)
  path.write_bytes(data.tobytes())
  t = Tensor(pathlib.Path(path)).reshape(8, 8)
  sched = t[2:4].to("CPU").schedule()
  assert [s.ast.op.name for s in sched] == ["COPY"]  # no kernel: a copy of bytes 16..32 only
  np.testing.assert_array_equal(t[2:4].to("CPU").numpy(), data.reshape(8, 8)[2:4])
  np.testing.assert_array_equal(t[:, 1:3].to("CPU").numpy(), data.reshape(8, 8)[:, 1:3])  # strided: range copy + CPU view
  np.testing.assert_array_equal(t.permute(1, 0).to("CPU").numpy(), data.reshape(8, 8).T)

def test_empty_assign_and_flush(path):
  t = Tensor.empty(16, dtype=dtypes.uint8, device=f"disk:{path}")
  t.assign(Tensor(np.arange(16, dtype=np.uint8)).to(t.device)).realize()
  assert path.read_bytes() == bytes(range(16))  # the write reached the file
  t[0:8].assign(Tensor(np.full(8, 7, np.uint8)).to(t.device)).realize()
  assert path.read_bytes() == bytes([7] * 8) + bytes(range(8, 16))
  t[8:16] = Tensor(np.ones(8, np.uint8))
  assert path.read_bytes()[8:] == bytes([1] * 8)

def test_bitcast_view_assign(path):
  t = Tensor.empty(16, dtype=dtypes.uint8, device=f"disk:{path}")
  t.assign(Tensor(np.zeros(16, np.uint8)).to(t.device)).realize()
  t[0:8].bitcast(dtypes.int64).assign(Tensor([12345], dtype=dtypes.int64).to(t.device)).realize()
  assert path.read_bytes()[:8] == (12345).to_bytes(8, "little")
  t[8:12].bitcast(dtypes.int8).assign(Tensor([-1, 2, -3, 4], dtype=dtypes.int8).to(t.device)).realize()  # same itemsize
  assert path.read_bytes()[8:12] == bytes([255, 2, 253, 4])
  f = t[0:16].bitcast(dtypes.float32)
  np.testing.assert_array_equal(f.to("CPU").numpy(), np.frombuffer(path.read_bytes(), np.float32))

def test_typed_disk_tensor_roundtrip(path):
  x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
  d = Tensor(x).to(f"disk:{path}").realize()
  np.testing.assert_array_equal(np.frombuffer(path.read_bytes(), np.float32).reshape(4, 5), x)
  np.testing.assert_array_equal(d.to("CPU").numpy(), x)

def test_compute_on_disk_is_an_error(path):
  path.write_bytes(bytes(16))
  t = Tensor(pathlib.Path(path))
  with pytest.raises(RuntimeError, match="DISK.*storage device.*to\\('CPU'\\)"): (t + 1).realize()
  with pytest.raises(RuntimeError, match="DISK"): t[::2].assign(Tensor(np.ones(8, np.uint8)).to(t.device)).realize()
  np.testing.assert_array_equal((t.to("CPU") + 1).numpy(), np.ones(16, np.uint8))  # the documented fix works

def test_missing_file():
  with pytest.raises(FileNotFoundError): Tensor(pathlib.Path("/nonexistent/plugrad/file.bin"))
