"""Shared fixtures for the VIZ tests: recording switched on in-process with a clean trace and empty compile caches (so
kernels are compiled, and therefore recorded, inside the test), and a program run under VIZ=1 PROFILE=1 serving the page."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from plugrad.engine import realize
from plugrad.schedule import kernelize
from plugrad.viz import capture

from viz_helpers import BIG_WAVES_INSTS, HERE, free_port, wait_for_line


@pytest.fixture
def recording(monkeypatch):
  """VIZ and PROFILE on, a fresh TRACE, and no cached schedules or kernels; everything restored afterwards."""
  monkeypatch.setattr(realize, "_RUNNERS", {})
  monkeypatch.setattr(kernelize, "_SCHEDULE_CACHE", {})
  monkeypatch.setattr(kernelize, "_KERNEL_CACHE", {})
  was = (capture.VIZ, capture.PROFILE)
  capture.TRACE.clear()
  capture.enable(viz=True, profile=True)
  yield capture.TRACE
  capture.enable(*was)
  capture.TRACE.clear()


def serve(tmp_path_factory, script: str, extra_env: dict[str, str]):
  """`script` (in tests/viz) run with VIZ=1 PROFILE=1 and `extra_env` on a free port, serving its trace:
  yields (url, its JSON report, profile path)."""
  tmp = tmp_path_factory.mktemp("viz")
  port = free_port()
  env = {**os.environ, "VIZ": "1", "PROFILE": "1", "VIZ_PORT": str(port), "PROFILE_PATH": str(tmp / "profile.json"), "PYTHONUNBUFFERED": "1",
         **extra_env}
  env.pop("VIZ_SAVE", None)
  proc = subprocess.Popen([sys.executable, str(HERE / script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    report = json.loads(wait_for_line(proc, "{"))
    url = wait_for_line(proc, "VIZ: open ").split()[2]
    yield url, report, tmp / "profile.json"
  finally:
    proc.terminate()
    try: proc.wait(10)
    except subprocess.TimeoutExpired: proc.kill()
    proc.stdout.close()


@pytest.fixture(scope="module")
def served_program(tmp_path_factory):
  """tests/viz/viz_program.py served, recording viz_helpers' hand-built instruction trace and a big one of
  BIG_WAVES_INSTS instructions."""
  yield from serve(tmp_path_factory, "viz_program.py", {"VIZ_TEST_WAVES": "1", "VIZ_TEST_WAVES_BIG": str(BIG_WAVES_INSTS)})


@pytest.fixture(scope="module")
def served_amd_matmul(tmp_path_factory):
  """tests/viz/viz_amd_matmul.py served: a matmul on DEV=MOCK+AMD traced with SQTT=1."""
  yield from serve(tmp_path_factory, "viz_amd_matmul.py", {"DEV": "MOCK+AMD", "SQTT": "1"})
