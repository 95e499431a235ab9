"""The NV probe never raises: it reports why the device is unavailable. Exercised with a fake libcuda built by gcc
(driver version, cuInit result and device count taken from environment variables)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import plugrad_nv
from plugrad_nv import probe_driver

FAKE_LIBCUDA = r"""
#include <stdlib.h>
static int env(const char *k, int d) { const char *v = getenv(k); return v ? atoi(v) : d; }
int cuDriverGetVersion(int *v) { *v = env("FAKE_CUDA_VERSION", 12040); return 0; }
int cuInit(unsigned flags) { return env("FAKE_CUINIT", 0); }
int cuDeviceGetCount(int *n) { *n = env("FAKE_DEVICES", 1); return 0; }
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory) -> str:
  if shutil.which("gcc") is None: pytest.skip("gcc not found")
  d = tmp_path_factory.mktemp("fakecuda")
  (d / "fake.c").write_text(FAKE_LIBCUDA)
  subprocess.run(["gcc", "-shared", "-fPIC", str(d / "fake.c"), "-o", str(d / "libcuda.so.1")], check=True)
  return str(d / "libcuda.so.1")


def test_missing_libcuda():
  a = probe_driver(("libcuda_missing_for_test.so.1",))
  assert not a.ok and a.reason.startswith("libcuda not found")


@pytest.mark.parametrize("env,ok,reason", [
  ({}, True, "1 device(s), CUDA driver 12.4"),
  ({"FAKE_CUINIT": "100"}, False, "no CUDA device"),
  ({"FAKE_DEVICES": "0"}, False, "no CUDA device"),
  ({"FAKE_CUDA_VERSION": "11040"}, False, "driver too old: CUDA 11.4 < 12.0"),
  ({"FAKE_CUINIT": "3"}, False, "cuInit failed with CUresult 3 (driver/library mismatch?)"),
])
def test_probe_reasons(fake_libcuda: str, monkeypatch: pytest.MonkeyPatch, env: dict, ok: bool, reason: str):
  for k, v in env.items(): monkeypatch.setenv(k, v)
  a = probe_driver((fake_libcuda,))
  assert (a.ok, a.reason) == (ok, reason)


def test_cuda_visible_devices_empty(monkeypatch: pytest.MonkeyPatch):
  plugrad_nv.probe.cache_clear()
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
  try: assert plugrad_nv.probe().reason.startswith("no CUDA device")
  finally: plugrad_nv.probe.cache_clear()


def test_plugrad_devices_lists_nv_cleanly(fake_libcuda: str):
  env = {**os.environ, "LD_LIBRARY_PATH": os.path.dirname(fake_libcuda), "FAKE_CUINIT": "100"}
  env.pop("DEV", None)
  p = subprocess.run([sys.executable, "-m", "plugrad.devices"], capture_output=True, text=True, env=env, timeout=120)
  assert p.returncode == 0, p.stderr
  line = next(ln for ln in p.stdout.splitlines() if ln.strip().startswith("NV "))
  assert "UNAVAILABLE: no CUDA device" in line and "Traceback" not in p.stdout + p.stderr


def test_requesting_unavailable_nv_is_a_clear_error():
  if plugrad_nv.probe().ok: pytest.skip("a CUDA device is available here")
  from plugrad.device import Device, DeviceUnavailableError
  with pytest.raises(DeviceUnavailableError, match="device 'NV' is unavailable: "): Device.entry("NV")


def test_modules_import_without_libcuda():
  import plugrad_nv.compiler
  import plugrad_nv.device
  import plugrad_nv.renderer
  if plugrad_nv.probe().ok: return
  from plugrad_nv.libload import LibraryNotFound
  with pytest.raises((LibraryNotFound, RuntimeError)): plugrad_nv.device.NVDevice("NV")
