"""Device-selection errors at core's command lines are one clear line, never a traceback (issue 45): `plugrad-devices`
/ `python -m plugrad.devices` and the conformance suite run from an installed plugrad. Library callers keep the
exception (DeviceError, or ValueError for a malformed device string)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugrad.device import Device, DeviceError
from plugrad.devices import one_line

CASES = [  # (env, the reason the one line must give)
  ({"DEV": "CPUU"}, "device 'CPUU': no installed plugin provides CPUU; did you mean CPU?"),
  ({"DEV": "CPU:"}, "malformed device string 'CPU:' (trailing ':' without an index)"),
  ({"DEV": "CPU", "CC": "no-such-cc-xyz"}, "device 'CPU' is unavailable: CC='no-such-cc-xyz' is not an executable on PATH"),
]


def run(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
  e = {k: v for k, v in os.environ.items() if k not in ("DEV", "CC", "PYTHONPATH")}
  return subprocess.run([sys.executable, *args], env={**e, **env}, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("env,reason", CASES, ids=["misspelt", "malformed", "unavailable"])
def test_devices_cli_prints_one_line(env, reason):
  p = run(["-m", "plugrad.devices", "--no-smoke"], env)
  assert p.returncode == 1 and "Traceback" not in p.stderr + p.stdout
  fail = [ln for ln in p.stderr.splitlines() if ln.startswith(f"requested device {env['DEV']}: FAIL")]
  assert len(fail) == 1 and reason in fail[0], p.stderr
  assert "installed devices:" not in p.stderr  # the multi-line report is the exception's, for library callers
  assert f"default device: none ({reason}" in p.stdout or env["DEV"] == "CPU"


@pytest.mark.parametrize("env,reason", CASES, ids=["misspelt", "malformed", "unavailable"])
def test_conformance_suite_stops_with_one_line(env, reason, tmp_path: Path):
  p = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "plugrad.testing.ops.test_multi_jit"], env, cwd=tmp_path)
  assert p.returncode == 4 and "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
  assert f"ERROR: plugrad conformance suite: no device to test: {reason}" in p.stderr, p.stderr


def test_library_callers_keep_the_exception(monkeypatch):
  monkeypatch.setenv("DEV", "CPUU")
  with pytest.raises(DeviceError) as e: Device["CPUU"]
  assert "installed devices:" in str(e.value)  # the full report stays in the exception
  assert one_line(e.value) == "device 'CPUU': no installed plugin provides CPUU; did you mean CPU?"
  assert one_line(ValueError("")) == "ValueError"
