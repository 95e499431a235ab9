"""plugrad-cpu: the CPU device. Registration is import-free: the probe only looks for a C compiler on PATH.

The device itself (allocator, clang/gcc compiler, ctypes loader) is in `plugrad_cpu.device`, imported on first open.
"""
from __future__ import annotations
import functools
import os
import re
import shutil
from plugrad.plugins import PLUGIN_API_VERSION, Availability, DeviceSpec, hookimpl

def newest_versioned_clang() -> str | None:
  """The clang-NN on PATH with the highest NN (Debian and Ubuntu install each LLVM release so), or None."""
  return _newest_clang_on(os.environ.get("PATH", ""))

@functools.lru_cache(maxsize=4)
def _newest_clang_on(path: str) -> str | None:   # (a listing of /usr/bin: ~4 ms, asked at each device open)
  best: tuple[int, str] | None = None
  for d in path.split(os.pathsep):
    try: names = os.listdir(d or ".")
    except OSError: continue
    for n in names:
      if (m := re.fullmatch(r"clang-(\d+)", n)) and os.access(os.path.join(d or ".", n), os.X_OK) and (best is None or int(m[1]) > best[0]):
        best = (int(m[1]), n)
  return best[1] if best else None

def find_cc() -> str | None:
  """The C compiler to use: $CC if set (must resolve), else the newest clang-NN on PATH, else clang, else gcc. The
  newest first: Debian 12's `clang` is clang 14, which unrolls a register-blocked loop the heuristic sized to the
  vector registers and spills its accumulators (the LLM's 4-row decode product on a Zen 3 AVX2 box: 131-171 us with
  clang 14, 69-70 with clang 19)."""
  if (cc := os.environ.get("CC", "").strip()): return shutil.which(cc.split()[0]) and cc
  return newest_versioned_clang() or next((c for c in ("clang", "gcc") if shutil.which(c)), None)

def probe() -> Availability:
  if (cc := os.environ.get("CC", "").strip()) and find_cc() is None: return Availability.no(f"CC={cc!r} is not an executable on PATH")
  if (cc := find_cc()) is None: return Availability.no("no C compiler found: install clang or gcc, or set CC")
  return Availability.yes(f"compiler {cc}")

@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  return [DeviceSpec("CPU", 100, PLUGIN_API_VERSION, probe, "plugrad_cpu.device:CPUDevice", renderers=("CLANG",),
                     description="host CPU: C kernels compiled with clang or gcc, loaded with ctypes")]
