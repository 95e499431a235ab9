"""Regressions from probing the weight-file parsers as a hostile user would (docs/reliability.md): every bad file is a
ValueError naming the file and the tensor, and safe_save cleans up the temporary files of saves that were killed."""
from __future__ import annotations
import json
import os
import struct
import subprocess
import sys
import numpy as np
import pytest
from plugrad.nn.serialize import gguf_load, safe_load, safe_save
from plugrad.tensor import Tensor

def _safetensors(path, header: dict | None = None, data: bytes = b"", raw: bytes | None = None):
  h = raw if raw is not None else json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(h)) + h + data)
  return path

def test_zero_size_tensor_does_not_hide_an_overlap(tmp_path):
  hdr = {"a": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]}, "z": {"dtype": "U8", "shape": [0], "data_offsets": [50, 50]},
         "b": {"dtype": "U8", "shape": [100], "data_offsets": [50, 150]}}
  p = _safetensors(tmp_path / "o.safetensors", hdr, bytes(150))
  with pytest.raises(ValueError, match=rf"{p}: tensors 'a' and 'b' overlap"): safe_load(p)

def test_empty_tensors_anywhere_are_fine(tmp_path):
  hdr = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "z": {"dtype": "F32", "shape": [0, 3], "data_offsets": [2, 2]}}
  ts = safe_load(_safetensors(tmp_path / "e.safetensors", hdr, bytes(range(4))))
  assert ts["z"].shape == (0, 3) and ts["a"].to("CPU").tolist() == [0, 1, 2, 3]

def test_deeply_nested_header(tmp_path):
  p = _safetensors(tmp_path / "deep.safetensors", raw=b"[" * 100000 + b"]" * 100000)
  with pytest.raises(ValueError, match=rf"{p}: safetensors JSON header is nested too deeply"): safe_load(p)

@pytest.mark.parametrize("dtype", [["F32"], {"x": 1}, 7, None])
def test_non_string_dtype(tmp_path, dtype):
  p = _safetensors(tmp_path / "d.safetensors", {"w": {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]}}, bytes(4))
  with pytest.raises(ValueError, match=rf"{p}: tensor 'w' has unknown dtype"): safe_load(p)

def test_gguf_huge_dim_with_a_zero_dim(tmp_path):
  p = tmp_path / "z.gguf"
  p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"w" + struct.pack("<IQQIQ", 2, 0, 1 << 63, 0, 0) + bytes(64))
  with pytest.raises(ValueError, match=rf"{p}: tensor 'w' \(F32\) has dim {1 << 63}, more elements than the"): gguf_load(p)

KILLED_SAVE = """
import os, sys, numpy as np
from plugrad.nn.serialize import safe_save
from plugrad.tensor import Tensor
import plugrad.nn.serialize as s
real = s._release_disk
def die(path):  # the first moment the temp file holds all its data: kill ourselves the hard way
  os.kill(os.getpid(), 9)
s._release_disk = die
safe_save({"w": Tensor(np.arange(1 << 16, dtype=np.float32))}, sys.argv[1])
"""

def test_stale_temp_of_a_killed_save_is_removed(tmp_path):
  p = tmp_path / "m.safetensors"
  safe_save({"w": Tensor(np.zeros(4, np.float32))}, p)
  r = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(p)], capture_output=True, text=True, timeout=120)
  assert r.returncode == -9, r.stderr
  stale = [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
  assert len(stale) == 1 and os.path.getsize(tmp_path / stale[0]) > 1 << 18  # the killed save's temp, full size
  np.testing.assert_array_equal(safe_load(p)["w"].to("CPU").numpy(), np.zeros(4))  # the old file is intact
  safe_save({"w": Tensor(np.ones(3, np.float32))}, p)
  assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]
  np.testing.assert_array_equal(safe_load(p)["w"].to("CPU").numpy(), np.ones(3))

def test_live_temps_are_left_alone(tmp_path):
  p = tmp_path / "m.safetensors"
  live = tmp_path / f"m.safetensors.{os.getppid()}.abcdefabcdef.tmp"  # a concurrent save by a running process
  live.write_bytes(b"x")
  safe_save({"w": Tensor(np.ones(3, np.float32))}, p)
  assert live.exists()
