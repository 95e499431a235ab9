"""Fuzzing the safetensors parser: structured headers (valid and hostile dtypes, shapes, offsets, metadata, nesting),
lying length fields and byte flips. Every case is a ValueError or a load whose tensors match the header and read the
file's own bytes (numpy slicing of the file is the oracle)."""
from __future__ import annotations
import json
import os
import struct
import tempfile
import numpy as np
from fuzz_helpers import bounded
from hypothesis import event, given
from hypothesis import strategies as st
from plugrad.nn.serialize import SAFE_DTYPES, safe_load

_DIR = tempfile.mkdtemp(prefix="plugrad-fuzz-st-")
_PATH = os.path.join(_DIR, "case.safetensors")

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False), st.text(max_size=8))
json_any = st.recursive(json_leaf, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=4), c, max_size=3)),
                        max_leaves=8)
dtype_st = st.one_of(st.sampled_from(sorted(SAFE_DTYPES)), st.sampled_from(["F33", "", "f32", "Q4_0"]), json_any)
# empty shapes with dims no tensor can have (strides past 2**63 bytes) or that fit; more dims than numpy allows
empty_shape_st = st.lists(st.one_of(st.integers(0, 3), st.integers(2**30, 2**66)), max_size=3).flatmap(
  lambda dims: st.permutations(dims + [0]).map(list))
many_dims_st = st.integers(60, 70).map(lambda n: [1] * (n - 1) + [0])
shape_st = st.one_of(st.lists(st.integers(0, 6), max_size=3), st.lists(st.integers(-3, 2**63), max_size=3), empty_shape_st, many_dims_st, json_any)
offs_st = st.one_of(st.lists(st.integers(0, 300), min_size=2, max_size=2).map(sorted), st.lists(st.integers(-5, 2**64), max_size=3), json_any)

@st.composite
def hostile_entry(draw) -> object:
  if draw(st.integers(0, 9)) == 0: return draw(json_any)
  e = {"dtype": draw(dtype_st), "shape": draw(shape_st), "data_offsets": draw(offs_st)}
  for k in draw(st.lists(st.sampled_from(["dtype", "shape", "data_offsets"]), max_size=1)): e.pop(k)
  return e

@st.composite
def valid_layout(draw) -> tuple[dict, int]:
  """A consistent header (tensors one after another, with random gaps, empty tensors anywhere) and its data length."""
  header, off = {}, 0
  for name in draw(st.lists(st.text(min_size=1, max_size=6), max_size=5, unique=True)):
    dt = draw(st.sampled_from(sorted(SAFE_DTYPES)))
    shape = draw(st.lists(st.integers(0, 5), max_size=3) if draw(st.integers(0, 5)) else st.one_of(empty_shape_st, many_dims_st))
    off += draw(st.integers(0, 3))
    n = int(np.prod(shape)) * SAFE_DTYPES[dt].itemsize
    header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
    off += n
  return header, off + draw(st.integers(0, 3))

@st.composite
def safetensors_file(draw) -> bytes:
  if draw(st.integers(0, 2)):
    header, n_data = draw(valid_layout())
    if header and draw(st.booleans()):  # one hostile edit: a field, an extra (maybe empty, maybe overlapping) tensor
      name = draw(st.sampled_from(sorted(header)))
      edit = draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra", "whole"]))
      if edit == "extra":
        b = draw(st.integers(0, n_data))
        header[name + "'"] = {"dtype": "U8", "shape": [draw(st.integers(0, 8))], "data_offsets": [b, b]}
        header[name + "'"]["data_offsets"][1] += header[name + "'"]["shape"][0]
      elif edit == "whole": header[name] = draw(hostile_entry())
      else: header[name][edit] = draw({"dtype": dtype_st, "shape": shape_st, "data_offsets": offs_st}[edit])
    data = draw(st.binary(min_size=n_data, max_size=n_data))
  else:
    header = draw(st.dictionaries(st.text(min_size=1, max_size=6), hostile_entry(), max_size=5))
    data = draw(st.binary(max_size=320))
  if draw(st.integers(0, 3)) == 0:
    header["__metadata__"] = draw(st.one_of(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2), json_any))
  h = json.dumps(header).encode()
  if draw(st.integers(0, 15)) == 0: h = draw(st.sampled_from([b"[" * 5000, b'{"a":' * 3000, b"\xff\xfe", b"{", b"null"]))
  n = len(h) if draw(st.integers(0, 15)) else draw(st.integers(0, 2**64 - 1))
  raw = bytearray(struct.pack("<Q", n) + h + data)
  if draw(st.integers(0, 4)) == 0:
    for pos, val in draw(st.lists(st.tuples(st.integers(0, max(len(raw) - 1, 0)), st.integers(0, 255)), min_size=1, max_size=2)):
      if raw: raw[pos] = val
  cut = draw(st.integers(0, len(raw))) if draw(st.integers(0, 7)) == 0 else None
  return bytes(raw[:cut] if cut is not None else raw)

def _write(data: bytes) -> None:
  tmp = _PATH + ".new"
  with open(tmp, "wb") as f: f.write(data)
  os.replace(tmp, _PATH)  # a new inode each case: the DISK device re-maps it

@given(safetensors_file())
def test_fuzz_safetensors(data: bytes):
  _write(data)
  res, err = bounded(lambda: safe_load(_PATH), (ValueError,), len(data), pure=True)
  if err is not None:
    assert _PATH in str(err)  # every error names the file
    event("ValueError: " + next((w for w in ("nested", "unknown dtype", "needs dtype", "invalid shape", "strides", "dims,", "out of range", "overlap",
                                                "needs", "header length", "malformed", "JSON object", "metadata", "shorter")
                                      if w in str(err)), "other"))
    return
  event(f"loaded {len(res)} tensors")
  (n,) = struct.unpack("<Q", data[:8])
  header = json.loads(data[8:8 + n])
  assert set(res) == {k for k in header if k != "__metadata__"}
  for k, t in res.items():
    info = header[k]
    assert t.shape == tuple(info["shape"]) and t.dtype == SAFE_DTYPES[info["dtype"]]
    b, e = info["data_offsets"]
    assert 8 + n + e <= len(data)
    arr = t.to("CPU").numpy()  # every tensor that loads is usable (empty ones of any shape included)
    assert arr.shape == t.shape
    if e > b and arr.dtype.itemsize == t.dtype.itemsize:  # bf16/fp8 come back as float32: no byte view
      assert arr.tobytes() == data[8 + n + b:8 + n + e]
