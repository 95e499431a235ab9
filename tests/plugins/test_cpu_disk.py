"""The CPU plugin (real clang/gcc compile + ctypes run) and the DISK plugin (mmap-backed files)."""
from __future__ import annotations
import os
import shutil
import numpy as np
import pytest
from plugrad import Buffer, Device, dtypes
from plugrad.device import CompileError

SAXPY = """
void saxpy(float *restrict out, const float *restrict x, const float *restrict y, int n, int a) {
  for (int i = 0; i < n; i++) out[i] = (float)a * x[i] + y[i];
}
"""

@pytest.mark.parametrize("cc", ["clang", "gcc"])
def test_cpu_compile_and_run_c_kernel(cc):
  if shutil.which(cc) is None: pytest.skip(f"{cc} not installed")
  from plugrad_cpu.device import ClangCompiler
  dev = Device["CPU"]
  comp = ClangCompiler(cc)
  assert comp.cachekey.startswith(f"cc={cc} ")
  lib = comp.compile_cached(SAXPY)
  assert lib[:4] == b"\x7fELF" and comp.misses == 1 and comp.compile_cached(SAXPY) == lib and comp.hits == 1
  x, y = np.arange(5, dtype=np.float32), np.full(5, 0.5, np.float32)
  bx, by, bo = (Buffer("CPU", 5, dtypes.float32).copyin(a) for a in (x, y, np.zeros(5, np.float32)))
  t = dev.load("saxpy", lib)(bo._buf, bx._buf, by._buf, vals=(5, 3), wait=True)
  assert isinstance(t, float) and t >= 0
  np.testing.assert_array_equal(bo.numpy(), 3 * x + y)

def test_cpu_device_default_compiler_and_views():
  dev = Device["CPU"]
  assert dev.renderer.name == "CLANG" and dev.threads >= 1
  b = Buffer("CPU", 6, dtypes.int32).copyin(np.arange(6, dtype=np.int32))
  prg = dev.load("smoke", dev.compiler.compile_cached(dev.smoke_kernel))
  prg(b.view(3, dtypes.int32, offset=12).ensure_allocated()._buf)  # kernel sees the offset view
  assert b.numpy().tolist() == [0, 1, 2, 6, 8, 10]

def test_cpu_compile_error_has_log_and_source():
  with pytest.raises(CompileError) as ei: Device["CPU"].compiler.compile("void k(float *a) { a[0] = undefined_thing; }")
  assert "undefined_thing" in ei.value.log and "   1 | void k" in str(ei.value)

def test_cpu_missing_function():
  dev = Device["CPU"]
  with pytest.raises(RuntimeError, match="no function 'nope'"): dev.load("nope", dev.compiler.compile_cached(dev.smoke_kernel))

def test_cpu_probe_reasons(monkeypatch):
  from plugrad_cpu import probe
  monkeypatch.setenv("CC", "definitely-not-a-compiler-xyz")
  a = probe()
  assert not a.ok and "CC='definitely-not-a-compiler-xyz'" in a.reason
  monkeypatch.delenv("CC")
  monkeypatch.setenv("PATH", "/nonexistent")
  a = probe()
  assert not a.ok and "no C compiler found" in a.reason

def test_cpu_threads_env(monkeypatch):
  monkeypatch.setenv("CPU_THREADS", "3")
  assert Device["CPU:2"].threads == 3
  monkeypatch.setenv("CPU_THREADS", "lots")
  with pytest.raises(RuntimeError, match="CPU_THREADS='lots'"): Device["CPU:3"]

def test_disk_roundtrip_views_and_persistence(tmp_path):
  path = tmp_path / "weights.bin"
  b = Buffer(f"disk:{path}", 16, dtypes.uint8).copyin(bytes(range(16)))
  assert b.device == f"DISK:{path}" and path.stat().st_size == 16
  v = b.view(2, dtypes.int32, offset=4)
  assert v.numpy().tolist() == np.frombuffer(bytes(range(4, 12)), np.int32).tolist()
  v.copyin(np.array([-1, -2], np.int32))
  Device[f"DISK:{path}"].synchronize()
  assert path.read_bytes()[4:12] == np.array([-1, -2], np.int32).tobytes()
  with pytest.raises(ValueError, match="the file has 16 bytes, a buffer of 32 bytes does not fit. DISK never grows"):
    Buffer(f"DISK:{path}", 32, dtypes.uint8).ensure_allocated()
  assert path.stat().st_size == 16 and path.read_bytes()[:4] == bytes(range(4))
  os.truncate(path, 32)  # the caller grows the file explicitly: then it maps, old contents kept
  bigger = Buffer(f"DISK:{path}", 32, dtypes.uint8).ensure_allocated()
  assert bytes(bigger.copyout())[:4] == bytes(range(4)) and path.stat().st_size == 32

def test_disk_cannot_compute_and_needs_path(tmp_path):
  dev = Device[f"DISK:{tmp_path}/x"]
  assert dev.compute is False
  with pytest.raises(RuntimeError, match="DISK:.* cannot compile kernels: DISK is a storage device"): dev.compiler.compile_cached("x")
  with pytest.raises(RuntimeError, match="cannot run kernels"): dev.load("k", b"")
  with pytest.raises(RuntimeError, match="needs a file path: DISK:/path/to/file"): Device["DISK"]
