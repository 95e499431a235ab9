"""Fuzzing the compile cache's entry reader: whatever sits at an entry's path (another kernel's entry, a damaged or
re-headed one, an old format, random bytes, a FIFO, a directory, a link to /dev/zero or to a valid entry), compile_cached
returns exactly what the compiler makes for the source. Only a byte-exact entry of the same key may be used; anything
else is rejected with a CompileCacheWarning (silently for the older format) and rebuilt, so the next call hits a valid entry."""
from __future__ import annotations
import hashlib
import os
import shutil
import struct
import tempfile
import warnings
from pathlib import Path
from fuzz_helpers import bounded
from hypothesis import event, given
from hypothesis import strategies as st
from plugrad.runtime.compiler import _ENTRY_HEAD, Compiler, CompileCacheWarning, pack_entry

_DIR = Path(tempfile.mkdtemp(prefix="plugrad-fuzz-cc-"))

class Echo(Compiler):
  """A deterministic 'compiler': the binary of a source is a function of it alone, of a length that varies with it."""
  def compile(self, src: str) -> bytes:
    d = hashlib.sha256(src.encode()).digest()
    return d * (1 + d[0] % 5)

SRCS = ["a", "b", "kernel x*3", "kernel x+100", ""]

@st.composite
def entry_bytes(draw, good: bytes, key: bytes) -> bytes:
  """Bytes at the entry's path: the right entry with one hostile edit, or an entry of another kind."""
  kind = draw(st.sampled_from(["exact", "other_key", "flip", "truncate", "append", "field", "v1", "random"]))
  event(kind)
  c = Echo("fuzz")
  if kind == "exact": return good
  if kind == "other_key":  # another source's valid entry, or this binary re-filed under another key with a fresh hash
    other = draw(st.sampled_from(SRCS))
    okey = draw(st.one_of(st.just(c.cache_key(other)), st.binary(min_size=32, max_size=32)))
    lib = draw(st.one_of(st.just(c.compile(other)), st.just(c.compile(SRCS[0]))))
    return pack_entry(lib, okey) if okey != key else pack_entry(lib, okey) + b"!"
  if kind == "flip":
    i = draw(st.integers(0, len(good) - 1))
    return good[:i] + bytes([good[i] ^ draw(st.integers(1, 255))]) + good[i + 1:]
  if kind == "truncate": return good[:draw(st.integers(0, len(good) - 1))]
  if kind == "append": return good + draw(st.binary(min_size=1, max_size=64))
  if kind == "field":  # overwrite one header field with arbitrary bytes of its size (magic, key, length, digest)
    start, size = draw(st.sampled_from([(0, 8), (8, 32), (40, 8), (48, 32)]))
    new = draw(st.binary(min_size=size, max_size=size).filter(lambda b: b != good[start:start + size]))
    return good[:start] + new + good[start + size:]
  if kind == "v1":  # the previous format: magic, length, sha256 of the payload (no key)
    lib = c.compile(draw(st.sampled_from(SRCS)))
    return struct.pack("<8sQ32s", b"PGCC\x01\x00\x00\x00", len(lib), hashlib.sha256(lib).digest()) + lib
  return draw(st.binary(max_size=_ENTRY_HEAD.size + 300))

@st.composite
def case(draw) -> tuple[str, str, bytes]:
  src = draw(st.sampled_from(SRCS))
  c = Echo("fuzz")
  good = pack_entry(c.compile(src), c.cache_key(src))
  form = draw(st.sampled_from(["file"] * 6 + ["fifo", "dir", "zero", "link_to_good", "dangling"]))
  return src, form, draw(entry_bytes(good, c.cache_key(src))) if form == "file" else b""

def _plant(path: Path, form: str, data: bytes, good: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  if form == "file": path.write_bytes(data)
  elif form == "fifo": os.mkfifo(path)
  elif form == "dir": path.mkdir()
  elif form == "zero": os.symlink("/dev/zero", path)
  elif form == "dangling": os.symlink(path.parent / "nowhere", path)
  elif form == "link_to_good":
    (path.parent / "target").write_bytes(good)
    os.symlink(path.parent / "target", path)

@given(case())
def test_fuzz_compile_cache_entries(c_):
  src, form, data = c_
  shutil.rmtree(_DIR, ignore_errors=True)
  saved = os.environ.get("PLUGRAD_CACHE_DIR")
  os.environ["PLUGRAD_CACHE_DIR"] = str(_DIR)
  try: _check(src, form, data)
  finally:
    if saved is None: os.environ.pop("PLUGRAD_CACHE_DIR")
    else: os.environ["PLUGRAD_CACHE_DIR"] = saved

def _check(src: str, form: str, data: bytes) -> None:
  c = Echo("fuzz")
  want, path = c.compile(src), c.cache_path(src)
  good = pack_entry(want, c.cache_key(src))
  _plant(path, form, data, good)
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    got, err = bounded(lambda: c.compile_cached(src), (), len(data) + 4096)
  assert err is None and got == want
  used = form == "file" and data == good
  assert (c.hits, c.misses) == ((1, 0) if used else (0, 1)), (form, data[:16])
  older = len(data) >= 8 and data[:4] == b"PGCC" and data[4:8] < b"\x02\0\0\0"  # an older version's magic: silent
  if not used and not older: assert any(issubclass(x.category, CompileCacheWarning) for x in w)
  assert path.is_file() and not path.is_symlink() and path.read_bytes() == good  # rebuilt in place
  assert c.compile_cached(src) == want and c.hits == (2 if used else 1)
