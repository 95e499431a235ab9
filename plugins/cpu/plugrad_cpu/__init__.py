"""plugrad-cpu: the CPU device. Registration is import-free: the probe only looks for a C compiler on PATH.

The device itself (allocator, clang/gcc compiler, ctypes loader) is in `plugrad_cpu.device`, imported on first open.
"""
from __future__ import annotations
import os
import shutil
from plugrad.plugins import PLUGIN_API_VERSION, Availability, DeviceSpec, hookimpl

def find_cc() -> str | None:
  """The C compiler to use: $CC if set (must resolve), else clang, else gcc."""
  if (cc := os.environ.get("CC", "").strip()): return shutil.which(cc.split()[0]) and cc
  return next((c for c in ("clang", "gcc") if shutil.which(c)), None)

def probe() -> Availability:
  if (cc := os.environ.get("CC", "").strip()) and find_cc() is None: return Availability.no(f"CC={cc!r} is not an executable on PATH")
  if (cc := find_cc()) is None: return Availability.no("no C compiler found: install clang or gcc, or set CC")
  return Availability.yes(f"compiler {cc}")

@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  return [DeviceSpec("CPU", 100, PLUGIN_API_VERSION, probe, "plugrad_cpu.device:CPUDevice", renderers=("CLANG",),
                     description="host CPU: C kernels compiled with clang or gcc, loaded with ctypes")]
