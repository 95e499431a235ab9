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
  assert unpack_entry(pack_entry(lib)) == lib
  with pytest.raises(ValueError, match="truncated"): unpack_entry(pack_entry(lib)[:-1])
  with pytest.raises(ValueError, match="bad magic"): unpack_entry(b"\x7fELF" + pack_entry(lib)[4:])
  with pytest.raises(ValueError, match="shorter than"): unpack_entry(b"")

def test_unloadable_library_names_the_kernel_not_a_temp_file(tmp_path, monkeypatch):
  import tempfile
  from plugrad_cpu.device import load_library
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
  with pytest.raises(RuntimeError, match=r"can't load the compiled library of kernel 'k' \(64 bytes\): <library>: invalid ELF header") as ei:
    load_library(b"\0" * 64, "kernel 'k'")
  assert "plugrad-" not in str(ei.value) and not list(tmp_path.iterdir())
