"""The compile cache never hands a damaged entry to a loader: entries carry their length and sha256, a bad one is deleted
and rebuilt with a warning; the CPU loader's temporary .so files are removed on every path. The damaged-entry cases run
in a subprocess because the failure they guard against is a SIGBUS that kills the interpreter."""
from __future__ import annotations
import os
import pytest
from plugin_helpers import run_py

SCRIPT = """
import os, sys, warnings
from plugrad import Device
dev = Device["CPU"]
src = "void smoke(int *a) { for (int i = 0; i < 3; i++) a[i] *= 2; } /* cache test */"
path = dev.compiler.cache_path(src)
lib = dev.compiler.compile_cached(src)
damage = sys.argv[1]
raw = path.read_bytes()
if damage == "truncate": path.write_bytes(raw[:len(raw) // 2])
elif damage == "garbage": path.write_bytes(os.urandom(len(raw)))
elif damage == "flip": path.write_bytes(raw[:-100] + bytes([raw[-100] ^ 1]) + raw[-99:])
dev.compiler.hits = dev.compiler.misses = 0
with warnings.catch_warnings(record=True) as w:
  warnings.simplefilter("always")
  lib2 = dev.compiler.compile_cached(src)
import numpy as np
from plugrad import Buffer, dtypes
b = Buffer("CPU", 3, dtypes.int32).copyin(np.array([1, 2, 3], np.int32))
dev.load("smoke", lib2)(b._buf, wait=True)
print(b.numpy().tolist(), dev.compiler.misses, [str(x.message) for x in w])
lib3 = dev.compiler.compile_cached(src)
print("hit" if dev.compiler.hits == 1 else "miss", lib3 == lib2)
"""

@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip"])
def test_damaged_entry_is_rebuilt(tmp_path, damage):
  p = run_py(["-c", SCRIPT, damage], PLUGRAD_CACHE_DIR=str(tmp_path / "cache"), TMPDIR=str(tmp_path))
  assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr}"  # was -7 (SIGBUS) for a truncated entry
  first, second = p.stdout.strip().splitlines()
  assert first.startswith("[2, 4, 6] 1 ") and "is damaged" in first and "deleted, compiling again" in first
  assert second == "hit True"
  assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob("plugrad-*"))

def test_entry_format_roundtrip():
  from plugrad.runtime.compiler import pack_entry, unpack_entry
  lib = os.urandom(1000)
  key = bytes(range(32))
  assert unpack_entry(pack_entry(lib, key), key) == lib
  with pytest.raises(ValueError, match="truncated"): unpack_entry(pack_entry(lib, key)[:-1], key)
  with pytest.raises(ValueError, match="bad magic"): unpack_entry(b"\x7fELF" + pack_entry(lib, key)[4:], key)
  with pytest.raises(ValueError, match="shorter than"): unpack_entry(b"", key)
  with pytest.raises(ValueError, match="belongs to another kernel"): unpack_entry(pack_entry(lib, key), bytes(32))

def test_unloadable_library_names_the_kernel_not_a_temp_file(tmp_path, monkeypatch):
  import tempfile
  from plugrad_cpu.device import load_library
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
  with pytest.raises(RuntimeError, match=r"can't load the compiled library of kernel 'k' \(64 bytes\): <library>: invalid ELF header") as ei:
    load_library(b"\0" * 64, "kernel 'k'")
  assert "plugrad-" not in str(ei.value) and not list(tmp_path.iterdir())

SWAP = """
import sys
from pathlib import Path
from plugrad import Tensor
root = Path(sys.argv[2])
def entries(): return set(root.rglob("*.pgc"))
if sys.argv[1] == "fill":
  (Tensor([1., 2., 3., 4.]) + 100).realize(); add = entries()
  (Tensor([1., 2., 3., 4.]) * 3).realize(); mul = entries() - add
  assert len(add) == 1 and len(mul) == 1, (add, mul)
  print(next(iter(add)), next(iter(mul)))
else:
  import warnings
  warnings.simplefilter("always")
  print((Tensor([1., 2., 3., 4.]) * 3).tolist())
"""

def test_entry_of_another_kernel_is_not_used(tmp_path):
  """An entry is bound to its key: x+100's entry copied over x*3's is rejected (it was used: [101, 102, ...])."""
  env = dict(PLUGRAD_CACHE_DIR=str(tmp_path / "cache"), DEV="CPU")
  p = run_py(["-c", SWAP, "fill", str(tmp_path / "cache")], **env)
  assert p.returncode == 0, p.stderr
  add, mul = p.stdout.split()
  os.replace(add, mul)
  p = run_py(["-c", SWAP, "run", str(tmp_path / "cache")], **env)
  assert p.returncode == 0, p.stderr
  assert p.stdout.strip() == "[3.0, 6.0, 9.0, 12.0]"
  assert "belongs to another kernel" in p.stderr and "CompileCacheWarning" in p.stderr

def _hostile_entry(tmp_path, kind):
  from plugrad.runtime.compiler import Compiler
  class Echo(Compiler):
    def compile(self, src: str) -> bytes: return b"echo|" + src.encode()
  c = Echo("echo")
  path = c.cache_path("k")
  path.parent.mkdir(parents=True, exist_ok=True)
  if kind == "fifo": os.mkfifo(path)
  elif kind == "zero": os.symlink("/dev/zero", path)
  elif kind == "dir": path.mkdir()
  elif kind == "dangling": os.symlink(tmp_path / "nowhere", path)
  return c, path

@pytest.mark.parametrize("kind", ["fifo", "zero", "dir", "dangling"])
def test_entry_that_is_not_a_regular_file_is_rebuilt(tmp_path, kind):
  """A FIFO entry hung the program; a link to /dev/zero read until MemoryError. Both are replaced by a real entry."""
  import warnings
  c, path = _hostile_entry(tmp_path, kind)
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    assert c.compile_cached("k") == b"echo|k"
  assert c.misses == 1
  if kind != "dangling": assert any("not a regular file" in str(x.message) for x in w), [str(x.message) for x in w]
  assert path.is_file() and not path.is_symlink()
  assert c.compile_cached("k") == b"echo|k" and c.hits == 1


def test_older_format_is_replaced_without_a_warning(tmp_path):
  import hashlib
  import struct
  import warnings
  c, path = _hostile_entry(tmp_path, "none")
  old_lib = b"stale"
  path.write_bytes(struct.pack("<8sQ32s", b"PGCC\x01\x00\x00\x00", len(old_lib), hashlib.sha256(old_lib).digest()) + old_lib)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert c.compile_cached("k") == b"echo|k" and c.misses == 1
  assert c.compile_cached("k") == b"echo|k" and c.hits == 1
