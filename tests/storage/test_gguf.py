"""GGUF: metadata of every type (v2 and v3), plain and quantized tensors dequantized exactly like the `gguf` package,
fusion of the dequantization into a GEMV, and malformed files."""
import struct
import time
import numpy as np
import pytest
import gguf
from plugrad.dtype import dtypes
from plugrad.engine.realize import GlobalCounters, runner_of
from plugrad.nn.serialize import dequantize, gguf_load
from plugrad.tensor import Tensor
from storage_helpers import QTYPES, random_blocks

def _write(path, tensors=(), kv=(), version=3):
  w = gguf.GGUFWriter(str(path), "test")
  for k, v, vt in kv: w.add_key_value(k, v, vt)
  for name, arr, qtype, shape in tensors:
    w.add_tensor(name, arr, raw_shape=shape, raw_dtype=qtype)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  if version != 3:
    b = bytearray(path.read_bytes()); b[4:8] = struct.pack("<I", version); path.write_bytes(bytes(b))
  return path

def _exact(a, b): return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.astype(np.float32).view(np.uint32))

@pytest.mark.parametrize("version", [2, 3])
def test_metadata_all_types(tmp_path, version):
  T = gguf.GGUFValueType
  kv = [("u8", 200, T.UINT8), ("i8", -100, T.INT8), ("u16", 60000, T.UINT16), ("i16", -30000, T.INT16), ("u32", 4_000_000_000, T.UINT32),
        ("i32", -2_000_000_000, T.INT32), ("f32", 1.5, T.FLOAT32), ("b", True, T.BOOL), ("s", "héllo", T.STRING),
        ("u64", 1 << 60, T.UINT64), ("i64", -(1 << 60), T.INT64), ("f64", 0.1, T.FLOAT64),
        ("ai", [1, 2, 3], T.ARRAY), ("as", ["a", "bc", ""], T.ARRAY), ("af", [0.5, -2.0], T.ARRAY)]
  p = _write(tmp_path / "m.gguf", [("w", np.arange(6, dtype=np.float32).reshape(2, 3), None, None)], kv, version)
  meta, ts = gguf_load(p)
  for k, v, _ in kv: assert meta[k] == v, k
  assert meta["general.architecture"] == "test"
  np.testing.assert_array_equal(ts["w"].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))

def test_plain_types(tmp_path):
  rng = np.random.default_rng(0)
  f32, f16, i32 = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((3, 16)).astype(np.float16), np.arange(10, dtype=np.int32)
  bf = rng.integers(0, 1 << 16, (2, 8), dtype=np.uint16) & 0xBFFF  # bf16 bit patterns without nan/inf
  p = _write(tmp_path / "p.gguf", [("f32", f32, None, None), ("f16", f16, None, None), ("i32", i32, None, None),
                                   ("bf16", bf.view(np.uint8), gguf.GGMLQuantizationType.BF16, None)])
  _, ts = gguf_load(p)
  assert ts["f32"].numpy().tobytes() == f32.tobytes() and ts["i32"].numpy().tobytes() == i32.tobytes()
  assert ts["f16"].dtype == dtypes.float16 and ts["f16"].shape == (3, 16)
  assert ts["f16"].realize().bitcast(dtypes.uint8).numpy().tobytes() == f16.tobytes()
  assert ts["bf16"].dtype == dtypes.bfloat16 and ts["bf16"].realize().bitcast(dtypes.uint8).numpy().tobytes() == bf.tobytes()

def test_every_quant_type_exact(tmp_path):
  tensors, refs = [], {}
  for i, (name, (tid, be, ts, _)) in enumerate(QTYPES.items()):
    rows = 3
    blocks = random_blocks(name, rows * 2, seed=i)
    tensors.append((name, blocks.reshape(rows, -1), gguf.GGMLQuantizationType(tid), None))
    refs[name] = gguf.quants.dequantize(blocks.reshape(rows, -1), gguf.GGMLQuantizationType(tid))
  _, out = gguf_load(_write(tmp_path / "q.gguf", tensors))
  for name, ref in refs.items():
    got = out[name].numpy()
    assert _exact(got, ref), f"{name}: max abs diff {np.abs(got - ref).max()}"

@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K"])
def test_real_size_matrix_exact(qtype):
  tid, be, ts, _ = QTYPES[qtype]
  rows, cols = 8192, 2048
  blocks = random_blocks(qtype, rows * cols // be, seed=7)
  ref = gguf.quants.dequantize(blocks.reshape(rows, -1), gguf.GGMLQuantizationType(tid))
  got = dequantize(Tensor(blocks), qtype).reshape(rows, cols).numpy()
  assert _exact(got, ref)

def test_q4k_gemv_fuses_and_reads_quantized_bytes(tmp_path):
  rows, cols = 512, 1024
  blocks = random_blocks("Q4_K", rows * cols // 256, seed=3)
  p = _write(tmp_path / "g.gguf", [("w", blocks.reshape(rows, -1), gguf.GGMLQuantizationType.Q4_K, None)])
  x = np.random.default_rng(4).standard_normal(cols).astype(np.float32)
  _, ts = gguf_load(p)
  y = ts["w"] @ Tensor(x)
  sched = y.schedule()
  kernels = [s for s in sched if s.ast.op.name != "COPY"]
  assert len(kernels) == 1 and [s.ast.op.name for s in sched].count("COPY") == 1
  ins = [b.dtype for b in kernels[0].bufs[1:]]
  assert dtypes.uint8 in ins and ins.count(dtypes.float32) == 1  # the quantized blocks and x; no float copy of the weights
  spec = runner_of(kernels[0]).spec
  assert spec.mem_bytes < rows * cols * 4 // 2  # far less than a float32 weight matrix
  before = GlobalCounters["kernels"]
  got = y.numpy()
  assert GlobalCounters["kernels"] - before == 1
  ref = gguf.quants.dequantize(blocks.reshape(rows, -1), gguf.GGMLQuantizationType.Q4_K).astype(np.float64) @ x.astype(np.float64)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3 * np.abs(ref).max())

def _header(n_tensors=0, n_kv=0, version=3): return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)

@pytest.mark.parametrize("data,match", [
  (b"GGUX" + bytes(20), "bad magic"),
  (_header(version=1), "unsupported GGUF version 1"),
  (_header(n_tensors=1 << 62), "more than"),
  (_header(n_kv=1 << 40), "more than"),
  (_header(n_kv=1) + struct.pack("<Q", 1 << 50), "truncated"),  # key length larger than the file
  (_header(n_kv=1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99) + bytes(8), "unknown GGUF metadata value type 99"),
  (_header(n_kv=1) + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 4, 1 << 60), "truncated"),  # huge array
  (_header(n_tensors=1) + struct.pack("<Q", 1) + b"w" + struct.pack("<IQIQ", 1, 32, 0, 1 << 40) + bytes(32), "beyond"),
  (_header(n_tensors=1) + struct.pack("<Q", 1) + b"w" + struct.pack("<IQIQ", 1, 32, 77, 0) + bytes(200), "unsupported ggml type 77"),
  (_header(n_tensors=1) + struct.pack("<Q", 1) + b"w" + struct.pack("<IQIQ", 1, 33, 12, 0) + bytes(200), "multiple of its block"),
  (_header(n_tensors=1) + struct.pack("<Q", 1) + b"w" + struct.pack("<I", 9) + bytes(80), "9 dims"),
])
def test_malformed(tmp_path, data, match):
  p = tmp_path / "bad.gguf"
  p.write_bytes(data)
  t0 = time.perf_counter()
  with pytest.raises(ValueError, match=match): gguf_load(p)
  assert time.perf_counter() - t0 < 2

def test_every_truncation_is_a_clear_error(tmp_path):
  p = _write(tmp_path / "t.gguf", [("w", np.ones((2, 32), np.float32), None, None)], [("s", "abc", gguf.GGUFValueType.STRING)])
  full = p.read_bytes()
  for n in list(range(0, 200, 7)) + [len(full) - 1]:
    p.write_bytes(full[:n])
    with pytest.raises(ValueError): gguf_load(p)
