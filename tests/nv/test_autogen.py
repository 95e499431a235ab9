"""Generated CUDA/NVRTC/nvJitLink bindings: import without the libraries, lazy loading by name, aliases, struct layouts
against a gcc-compiled probe of cuda.h, and regeneration (`make autogen` / `autogen/generate.py nv --check`)."""
from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugrad_nv.libload import LazyLibrary, LibraryNotFound

ROOT = Path(__file__).resolve().parents[2]
AUTOGEN = ROOT / "plugins" / "nv" / "plugrad_nv" / "autogen"
MANIFEST = json.loads((ROOT / "autogen" / "manifests" / "nv.json").read_text())


def test_bindings_import_and_export_expected_symbols():
  from plugrad_nv.autogen import cuda, nvjitlink, nvrtc
  for mod, name in ((cuda, "cuda"), (nvrtc, "nvrtc"), (nvjitlink, "nvjitlink")):
    missing = [s for s in MANIFEST["targets"][name]["expect"] if not hasattr(mod, s)]
    assert not missing, f"{name} bindings lack {missing}"
  assert cuda.cuMemAlloc is cuda.cuMemAlloc_v2 and cuda.cuMemFree is cuda.cuMemFree_v2  # #define aliases
  assert nvjitlink.nvJitLinkCreate is nvjitlink.__nvJitLinkCreate_13_0  # versioned export
  assert cuda.CUDA_SUCCESS == 0 and cuda.CUDA_ERROR_NO_DEVICE == 100 and cuda.CU_STREAM_WAIT_VALUE_GEQ == 0
  assert isinstance(cuda._libraries["libcuda"], LazyLibrary) and cuda._libraries["libcuda"].names == ("libcuda.so.1", "libcuda.so")


def test_no_absolute_paths_baked_in():
  for f in AUTOGEN.glob("*.py"):
    text = f.read_text()
    assert not re.search(r"CDLL\(|/usr/|/home/|/work/|site-packages", text), f"{f.name} bakes in a path or loads eagerly"


def test_lazy_library_errors():
  lib = LazyLibrary("libnotthere", ("libnotthere.so.7", "libnotthere.so"))
  fn = lib.someFunction
  fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
  with pytest.raises(LibraryNotFound, match=r"libnotthere not found \(tried libnotthere.so.7, libnotthere.so"): fn(1)
  assert not lib.available
  libc = LazyLibrary("libc", ("libc.so.6",))
  strlen = libc.strlen
  strlen.restype, strlen.argtypes = ctypes.c_size_t, [ctypes.c_char_p]
  assert strlen(b"plugrad") == 7
  with pytest.raises(AttributeError, match="has no function definitely_not_a_libc_function: driver or library too old"):
    libc.definitely_not_a_libc_function()


def cuda_h() -> str | None:
  dirs = [os.path.join(p, "nvidia", "cu13", "include") for p in sys.path if p]
  dirs += [os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "include"), "/usr/local/cuda/include"]
  return next((d for d in dirs if os.path.exists(os.path.join(d, "cuda.h"))), None)


STRUCTS = {  # C type -> (bindings name, fields whose offsets are compared)
  "CUDA_MEMCPY2D": ("CUDA_MEMCPY2D", ["srcMemoryType", "srcHost", "dstDevice", "WidthInBytes", "Height"]),
  "CUDA_MEMCPY3D": ("CUDA_MEMCPY3D", ["srcZ", "srcLOD", "dstArray", "Depth"]),
  "CUDA_KERNEL_NODE_PARAMS": ("CUDA_KERNEL_NODE_PARAMS", ["func", "gridDimX", "blockDimZ", "sharedMemBytes", "kernelParams", "extra"]),
  "CUlaunchConfig": ("CUlaunchConfig", ["gridDimX", "blockDimZ", "sharedMemBytes", "hStream", "attrs", "numAttrs"]),
  "CUDA_LAUNCH_PARAMS": ("CUDA_LAUNCH_PARAMS", ["function", "gridDimY", "hStream", "kernelParams"]),
  "CUipcMemHandle": ("CUipcMemHandle", ["reserved"]),
  "CUlaunchAttribute": ("CUlaunchAttribute", ["id", "value"]),
  "CUuuid": ("CUuuid", ["bytes"]),
}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")
def test_struct_layouts_match_gcc(tmp_path):
  if (inc := cuda_h()) is None: pytest.skip("cuda.h not found: pip install nvidia-cuda-runtime (plugins/nv[test]) or set CUDA_HOME")
  from plugrad_nv.autogen import cuda
  lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <cuda.h>", "int main(void) {"]
  for c, (_, fields) in STRUCTS.items():
    lines.append(f'  printf("{c} size %zu\\n", sizeof({c}));')
    lines += [f'  printf("{c}.{f} %zu\\n", offsetof({c}, {f}));' for f in fields]
  (tmp_path / "probe.c").write_text("\n".join(lines + ["  return 0;", "}"]) + "\n")
  p = subprocess.run(["gcc", f"-I{inc}", str(tmp_path / "probe.c"), "-o", str(tmp_path / "probe")], capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  want = dict(ln.rsplit(" ", 1) for ln in subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True).stdout.splitlines())
  got = {}
  for c, (py, fields) in STRUCTS.items():
    t = getattr(cuda, py)
    got[f"{c} size"] = str(ctypes.sizeof(t))
    got.update({f"{c}.{f}": str(getattr(t, f).offset) for f in fields})
  assert got == want


def generator_ready() -> str | None:
  try:
    import clang.cindex  # noqa: F401
    import ctypeslib  # noqa: F401
  except ImportError as e: return f"autogen needs ctypeslib2 and clang==19.* ({e}): pip install -e 'plugins/nv[autogen]'"
  sonames = MANIFEST["libclang"]["sonames"]
  if not os.environ.get("CLANG_LIBRARY_PATH") and not any(glob.glob(f"/usr/lib/*/{s}") + glob.glob(f"/usr/lib/llvm-*/lib/{s}") for s in sonames):
    return "libclang-19 not installed (apt-get install libclang1-19); run `make autogen` after installing it"
  if cuda_h() is None: return "CUDA headers not found (pip install -e 'plugins/nv[autogen]')"
  return None


def test_regenerated_bindings_match_committed():
  if (why := generator_ready()): pytest.skip(why)
  p = subprocess.run([sys.executable, str(ROOT / "autogen" / "generate.py"), "nv", "--check"], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
  assert "committed bindings match" in p.stdout
