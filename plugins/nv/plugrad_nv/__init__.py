"""plugrad-nv: NVIDIA GPUs through the CUDA driver API (libcuda), kernels in CUDA C compiled by NVRTC.

Registration imports nothing heavy. The probe loads libcuda by name with ctypes and asks it for devices; it never
raises: without a usable GPU it reports why ("libcuda not found", "no CUDA device", "driver too old", ...).
`DEV=MOCK+NV` selects the in-process mock CUDA driver whose PTX interpreter runs the kernels (plugrad_nv.mock),
available wherever NVRTC is installed. The device (plugrad_nv.device) is imported on first open.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys

from plugrad.plugins import PLUGIN_API_VERSION, Availability, DeviceSpec, hookimpl
from plugrad_nv.libload import LazyLibrary

MIN_DRIVER_VERSION = 12000  # CUDA 12.0 (cuDriverGetVersion format: 1000*major + 10*minor)
LIBCUDA_NAMES = ("libcuda.so.1", "libcuda.so")


def _fmt(v: int) -> str: return f"{v // 1000}.{v % 1000 // 10}"


def probe_driver(names: tuple[str, ...] = LIBCUDA_NAMES, min_version: int = MIN_DRIVER_VERSION) -> Availability:
  """Availability of the CUDA driver: libcuda loads, cuInit succeeds, the driver is new enough and has a device."""
  lib = None
  for n in names:
    try:
      lib = ctypes.CDLL(n)
      break
    except OSError: continue
  if lib is None: return Availability.no(f"libcuda not found (tried {', '.join(names)}): install the NVIDIA driver")
  try:
    ver = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(ver)) != 0: return Availability.no("libcuda: cuDriverGetVersion failed")
    if ver.value < min_version: return Availability.no(f"driver too old: CUDA {_fmt(ver.value)} < {_fmt(min_version)}")
    if (rc := lib.cuInit(0)) != 0:
      if rc == 100: return Availability.no("no CUDA device")
      return Availability.no(f"cuInit failed with CUresult {rc}" + (" (driver/library mismatch?)" if rc == 3 else ""))
    n = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1: return Availability.no("no CUDA device")
    return Availability.yes(f"{n.value} device(s), CUDA driver {_fmt(ver.value)}")
  except (AttributeError, OSError) as e: return Availability.no(f"libcuda unusable: {e}")


def probe_mock() -> Availability:
  """The mock CUDA driver needs NVRTC (kernels are compiled to PTX) and cuda_fp16.h for half types."""
  try:
    if not LazyLibrary("libnvrtc", ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"), ("libnvrtc-builtins.so.*",)).available:
      return Availability.no("NVRTC not found: pip install -e 'plugins/nv[test]' (or plugrad-nv[cu13])")
  except Exception as e: return Availability.no(f"NVRTC probe failed: {type(e).__name__}: {e}")
  heads = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")] + \
    [os.path.join(p or ".", "nvidia", w, "include") for p in sys.path for w in ("cu13", "cu12", "cuda_runtime")]
  if not any(os.path.exists(os.path.join(h, "cuda_fp16.h")) for h in heads):
    return Availability.no("cuda_fp16.h not found: pip install nvidia-cuda-runtime (plugins/nv[test]) or set CUDA_HOME")
  n, cc = os.environ.get("MOCK_NV_GPUS", "2"), os.environ.get("MOCK_NV_CC", "9.0")
  return Availability.yes(f"in-process mock CUDA driver: {n} GPU(s), compute capability {cc}, kernels run by the PTX interpreter")


@functools.lru_cache(None)
def probe() -> Availability:
  if (vis := os.environ.get("CUDA_VISIBLE_DEVICES", None)) in ("", "-1"): return Availability.no(f"no CUDA device (CUDA_VISIBLE_DEVICES={vis!r})")
  try: return probe_driver()
  except Exception as e: return Availability.no(f"CUDA probe failed: {type(e).__name__}: {e}")


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  return [DeviceSpec("NV", 200, PLUGIN_API_VERSION, probe, "plugrad_nv.device:NVDevice", renderers=("CUDA",),
                     description="NVIDIA GPU: CUDA C compiled by NVRTC, run through the CUDA driver API",
                     interfaces={"CUDA": probe, "MOCK": probe_mock})]
