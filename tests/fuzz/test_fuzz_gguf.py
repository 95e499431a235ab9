"""Fuzzing the GGUF parser: generated files (every metadata type, nested arrays, tensor tables of every ggml type) with
hostile edits: lying counts, unknown types, huge dims and lengths, bad alignment, misaligned or out-of-range offsets,
byte flips and truncation. Every case is a ValueError naming the file, or a load whose metadata equals what was written
(the generator's own model is the oracle) and whose plain tensors read the file's own bytes."""
from __future__ import annotations
import os
import struct
import tempfile
import numpy as np
from fuzz_helpers import bounded
from hypothesis import event, given
from hypothesis import strategies as st
from plugrad.nn.serialize import GGML_TYPES, gguf_load

_DIR = tempfile.mkdtemp(prefix="plugrad-fuzz-gguf-")
_PATH = os.path.join(_DIR, "case.gguf")
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_HUGE = st.sampled_from([2**31, 2**32 - 1, 2**62, 2**63, 2**64 - 1])

def _gstr(s: bytes) -> bytes: return struct.pack("<Q", len(s)) + s

def scalar_value(vt: int):
  fmt = _SCALARS[vt]
  if fmt == "<?": return st.booleans()
  if fmt in ("<f", "<d"): return st.floats(allow_nan=False, width=32 if fmt == "<f" else 64)
  bits = struct.calcsize(fmt) * 8
  return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if fmt.islower() or fmt == "<b" else st.integers(0, 2**bits - 1)

@st.composite
def value(draw, depth: int = 0) -> tuple[int, bytes, object]:
  """(type id, encoding, the value the parser must return)."""
  vt = draw(st.sampled_from([*_SCALARS, 8, 8, 9] if depth < 3 else [*_SCALARS, 8]))
  if vt in _SCALARS:
    v = draw(scalar_value(vt))
    enc = struct.pack(_SCALARS[vt], v)
    return vt, enc, struct.unpack(_SCALARS[vt], enc)[0]
  if vt == 8:
    s = draw(st.text(max_size=6)).encode()
    return vt, _gstr(s), s.decode()
  et = draw(st.sampled_from([*_SCALARS, 8, 9]))
  items = [draw(value(depth + 1)) for _ in range(draw(st.integers(0, 3)))]
  items = [it for it in items if it[0] == et] if et != 9 else [it for it in items if it[0] == 9]
  if et in _SCALARS:
    vals = draw(st.lists(scalar_value(et), max_size=4))
    encs = [struct.pack(_SCALARS[et], v) for v in vals]
    return 9, struct.pack("<IQ", et, len(vals)) + b"".join(encs), [struct.unpack(_SCALARS[et], e)[0] for e in encs]
  return 9, struct.pack("<IQ", et, len(items)) + b"".join(enc for _, enc, _ in items), [m for _, _, m in items]

@st.composite
def gguf_file(draw) -> tuple[bytes, dict | None, list]:
  """(file bytes, expected metadata or None when edits make it unpredictable, tensor table [(name, dims, type, offset)])."""
  faithful = True
  kvs = {}
  for key in draw(st.lists(st.text(min_size=1, max_size=5), max_size=4, unique=True)): kvs[key] = draw(value())
  align = 32
  if draw(st.integers(0, 3)) == 0:
    align_v = draw(st.sampled_from([1, 8, 16, 64, 0, 3, 48]))
    kvs["general.alignment"] = (4, struct.pack("<I", align_v), align_v)
    align = align_v
  tensors, off = [], 0
  for name in draw(st.lists(st.text(min_size=1, max_size=4), max_size=3, unique=True)):
    tid = draw(st.sampled_from(sorted(GGML_TYPES)))
    _, bsize, tsize, _ = GGML_TYPES[tid]
    dims = [bsize * draw(st.integers(0, 2))] + draw(st.lists(st.integers(0, 3), max_size=2))
    nbytes = int(np.prod(dims)) // bsize * tsize
    tensors.append([name, dims, tid, off])
    off += nbytes + (-nbytes % max(align, 1))
  edit = draw(st.sampled_from(["none"] * 6 + ["dims", "type", "offset", "ndims", "kvtype", "count", "magic", "version"]))
  if edit != "none": faithful = False
  if tensors and edit in ("dims", "type", "offset"):
    t = draw(st.sampled_from(tensors))
    if edit == "dims": t[1][draw(st.integers(0, len(t[1]) - 1))] = draw(st.one_of(_HUGE, st.integers(0, 100)))
    elif edit == "type": t[2] = draw(st.sampled_from([4, 5, 9, 15, 23, 99, 2**32 - 1]))
    else: t[3] = draw(st.one_of(_HUGE, st.integers(0, 200)))
  meta = b"".join(_gstr(k.encode()) + struct.pack("<I", vt) + enc for k, (vt, enc, _) in kvs.items())
  if edit == "kvtype": meta += _gstr(b"bad") + struct.pack("<I", draw(st.sampled_from([13, 99, 2**32 - 1]))) + bytes(8)
  table = b""
  for i, (name, dims, tid, toff) in enumerate(tensors):
    nd = len(dims) if not (edit == "ndims" and i == 0) else draw(st.sampled_from([0, 5, 9, 2**32 - 1]))
    table += _gstr(name.encode()) + struct.pack("<I", nd) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", tid, toff)
  n_t, n_kv = len(tensors), len(kvs) + (edit == "kvtype")
  if edit == "count": n_t, n_kv = draw(st.one_of(_HUGE, st.integers(0, 8))), draw(st.one_of(_HUGE, st.integers(0, 8)))
  magic = b"GGUF" if edit != "magic" else draw(st.binary(min_size=4, max_size=4))
  version = draw(st.sampled_from([2, 3])) if edit != "version" else draw(st.sampled_from([0, 1, 4, 2**32 - 1]))
  head = magic + struct.pack("<IQQ", version, n_t, n_kv) + meta + table
  body = head + bytes(-len(head) % max(align, 1)) + draw(st.binary(min_size=off, max_size=off + 8))
  raw = bytearray(body)
  if draw(st.integers(0, 5)) == 0:
    faithful = False
    for pos, v in draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), min_size=1, max_size=3)): raw[pos] = v
  if draw(st.integers(0, 7)) == 0:
    faithful = False
    raw = raw[:draw(st.integers(0, len(raw)))]
  return bytes(raw), ({k: m for k, (_, _, m) in kvs.items()} if faithful else None), tensors

def _write(data: bytes) -> None:
  with open(_PATH + ".new", "wb") as f: f.write(data)
  os.replace(_PATH + ".new", _PATH)

def _same(a, b) -> bool:
  if isinstance(a, float) and isinstance(b, float): return a == b or (a != a and b != b)
  if isinstance(a, list) and isinstance(b, list): return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  return a == b and type(a) is type(b)

@given(gguf_file())
def test_fuzz_gguf(case):
  data, want_meta, tensors = case
  _write(data)
  res, err = bounded(lambda: gguf_load(_PATH, device="CPU"), (ValueError,), len(data), pure=True)
  if err is not None:
    assert _PATH in str(err), str(err)
    event("ValueError")
    return
  meta, ts = res
  event(f"loaded {len(ts)} tensors" + (" (faithful)" if want_meta is not None else ""))
  if want_meta is None: return
  assert meta.keys() == want_meta.keys() and all(_same(meta[k], want_meta[k]) for k in meta), (meta, want_meta)
  assert set(ts) == {t[0] for t in tensors}
  for name, dims, tid, _ in tensors:
    assert ts[name].shape == tuple(reversed(dims))
