"""safetensors: bit-exact interop with the `safetensors` library both ways, copy-only atomic saves, malformed files."""
import json
import os
import struct
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from plugrad.dtype import dtypes
from plugrad.engine.realize import GlobalCounters
from plugrad.nn.serialize import safe_load, safe_load_metadata, safe_save
from plugrad.tensor import Tensor

NP_TYPES = [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64, np.float16, np.float32, np.float64]

def _rand(dt, shape, rng):
  if dt == np.bool_: return rng.integers(0, 2, shape).astype(np.bool_)
  if np.issubdtype(dt, np.integer): return rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, shape, dtype=dt, endpoint=True)
  return rng.standard_normal(shape).astype(dt)

def test_load_library_file_bit_exact(tmp_path):
  rng = np.random.default_rng(0)
  arrs = {f"t{i}": _rand(dt, (3, 5) if i % 2 else (7,), rng) for i, dt in enumerate(NP_TYPES)}
  arrs["scalar"], arrs["empty"] = np.array(2.5, np.float32), np.zeros((0, 3), np.int32)
  save_file(arrs, str(tmp_path / "a.safetensors"), metadata={"who": "lib"})
  out = safe_load(tmp_path / "a.safetensors")
  assert set(out) == set(arrs)
  for k, a in arrs.items():
    got = out[k].to("CPU").numpy()
    assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes(), k
  header, start, meta = safe_load_metadata(tmp_path / "a.safetensors")
  assert meta == {"who": "lib"} and start % 8 == 0 and header["t1"]["dtype"] == "U8"

def test_bf16_bit_patterns(tmp_path):
  bits = np.random.default_rng(1).integers(0, 1 << 16, 64, dtype=np.uint16)
  bits[(bits & 0x7F80) == 0x7F80] = 0x3F80  # avoid nan patterns so values compare as bits after the float32 trip
  header = json.dumps({"w": {"dtype": "BF16", "shape": [8, 8], "data_offsets": [0, 128]}}).encode()
  (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bits.tobytes())
  t = safe_load(tmp_path / "b.safetensors")["w"]
  assert t.dtype == dtypes.bfloat16
  assert t.to("CPU").realize().bitcast(dtypes.uint8).numpy().tobytes() == bits.tobytes()  # a byte view: no bf16 kernel
  safe_save({"w": t.to("CPU").realize()}, tmp_path / "c.safetensors")
  assert (tmp_path / "c.safetensors").read_bytes()[-128:] == bits.tobytes()

def test_save_loads_in_library_with_no_kernels(tmp_path):
  rng = np.random.default_rng(2)
  arrs = {f"x{i}": _rand(dt, (4, 3), rng) for i, dt in enumerate(NP_TYPES)}
  ts = {k: Tensor(a).realize() for k, a in arrs.items()}
  before = GlobalCounters["kernels"]
  safe_save(ts, tmp_path / "o.safetensors", metadata={"format": "pt"})
  assert GlobalCounters["kernels"] == before  # only copies
  back = load_file(str(tmp_path / "o.safetensors"))
  for k, a in arrs.items(): assert back[k].dtype == a.dtype and back[k].tobytes() == a.tobytes(), k
  assert safe_load_metadata(tmp_path / "o.safetensors")[2] == {"format": "pt"}
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]

def test_save_overwrites_atomically_and_roundtrips(tmp_path):
  p = tmp_path / "m.safetensors"
  safe_save({"a": Tensor(np.arange(10, dtype=np.float32))}, p)
  first = safe_load(p)["a"]
  safe_save({"a": Tensor(np.arange(10, 20, dtype=np.float32)), "b": Tensor([1, 2], dtype=dtypes.int64)}, p)
  np.testing.assert_array_equal(first.to("CPU").numpy(), np.arange(10))  # old views keep the old file
  new = safe_load(p)
  np.testing.assert_array_equal(new["a"].to("CPU").numpy(), np.arange(10, 20))
  np.testing.assert_array_equal(new["b"].to("CPU").numpy(), [1, 2])
  with pytest.raises(TypeError): safe_save({"a": np.zeros(3)}, p)
  np.testing.assert_array_equal(safe_load(p)["a"].to("CPU").numpy(), np.arange(10, 20))  # a failed save leaves the file alone

def _file(tmp_path, header, data=b"", raw=None):
  h = raw if raw is not None else json.dumps(header).encode()
  p = tmp_path / "bad.safetensors"
  p.write_bytes(struct.pack("<Q", len(h)) + h + data)
  return p

@pytest.mark.parametrize("header,data,match", [
  ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "out of range"),
  ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
   b"\0" * 12, "overlap"),
  ({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "unknown dtype"),
  ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "needs 12 bytes"),
  ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, "invalid shape"),
  ({"a": {"dtype": "F32"}}, b"", "needs dtype"),
])
def test_bad_headers(tmp_path, header, data, match):
  with pytest.raises(ValueError, match=match): safe_load(_file(tmp_path, header, data))

def test_bad_files(tmp_path):
  p = tmp_path / "short"
  p.write_bytes(b"\1\2\3")
  with pytest.raises(ValueError, match="shorter than"): safe_load(p)
  p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
  with pytest.raises(ValueError, match="header length"): safe_load(p)
  with pytest.raises(ValueError, match="malformed"): safe_load(_file(tmp_path, None, raw=b"{not json"))
  with pytest.raises(ValueError, match="JSON object"): safe_load(_file(tmp_path, [1, 2]))
