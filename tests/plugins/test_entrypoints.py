"""Real installed distributions in subprocesses: the example third-party backend, broken/old/duplicate plugins, the CLI.

Expectations about the devices the environment already has (which are available, which is the default, how many pass
the CLI's smoke test) come from a baseline subprocess run without the plugin under test, never from a hard-coded list:
a machine with another backend installed (plugrad-nv with a GPU, or any third-party one) must pass too.
`test_passes_with_a_higher_priority_backend_installed` reruns this file with such a backend installed.
"""
from __future__ import annotations
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
import pytest
from plugin_helpers import run_py, write_dist

_BASELINE = ("import json; from plugrad import Device; print(json.dumps({'available': Device.available(), 'default': Device.DEFAULT, "
             "'priority': {e.name: e.spec.priority for e in Device.registry.by_priority()}}))")

@functools.lru_cache(maxsize=None)
def _baseline(env: tuple[tuple[str, str], ...]) -> dict:
  p = run_py(["-c", _BASELINE], **dict(env))
  assert p.returncode == 0, p.stderr
  return json.loads(p.stdout.strip().splitlines()[-1])

def baseline(**env: str) -> dict:
  """Available devices, the default and every device's priority in this environment (with `env`), no extra plugin."""
  return _baseline(tuple(sorted(env.items())))

@functools.lru_cache(maxsize=None)
def baseline_cli() -> str:
  return run_py(["-m", "plugrad.devices"]).stdout

USE_EXAMPLE = """
import numpy as np
from plugrad import Buffer, Device, dtypes
dev = Device.default()
b = Buffer(Device.DEFAULT, 3, dtypes.int32).copyin(np.array([1, 2, 3], np.int32))
dev.load("smoke", dev.compiler.compile_cached(dev.smoke_kernel))(b._buf)
print(Device.DEFAULT, type(dev).__name__, b.numpy().tolist())
from plugrad.tensor import Tensor
t = Tensor([[1.5, -2.0], [3.0, 4.25]])
print((Tensor([1, 2, 3]) * 2).tolist(), ((t * 2).sum(axis=1) + 1).tolist(), t._pad(((1, 0), (0, 1))).max().item(), (t < 0).where(t, 0.5).tolist())
"""

def test_example_backend_installed_out_of_tree(example_site):
  assert (example_site / "plugrad_example" / "device.py").exists() and list(example_site.glob("plugrad_example-0.3.0.dist-info"))
  p = run_py(["-c", USE_EXAMPLE], [example_site], DEV="EXAMPLE")
  assert p.returncode == 0, p.stderr
  assert p.stdout.splitlines() == ["EXAMPLE ExampleDevice [2, 4, 6]", "[2, 4, 6] [0.0, 15.5] 4.25 [[0.5, -2.0], [0.5, 0.5]]"]
  p = run_py(["-c", "from plugrad import Device; print(Device.DEFAULT)"], [example_site])  # EXAMPLE (10) < CPU (100)
  base = baseline()
  assert p.stdout.strip() == (base["default"] if base["priority"][base["default"]] > 10 else "EXAMPLE")

def test_example_backend_in_devices_cli(example_site):
  p = run_py(["-m", "plugrad.devices"], [example_site], DEV="example")
  assert p.returncode == 0, p.stdout + p.stderr
  assert "plugrad-example 0.3.0 (entry points: example)" in p.stdout
  assert "EXAMPLE  priority   10  api 1.0  renderers: PYEXAMPLE  available (pure Python)" in p.stdout
  assert "requested device EXAMPLE: PASS (Tensor([1,2,3])*2 -> [2, 4, 6])" in p.stdout  # through its renderer, not the smoke kernel
  # EXAMPLE's smoke test is one more PASS than the environment's own devices give, and it adds no FAIL
  assert p.stdout.count("smoke: PASS") == baseline_cli().count("smoke: PASS") + 1 and p.stdout.count("FAIL") == baseline_cli().count("FAIL")

def test_example_backend_disabled(example_site):
  p = run_py(["-m", "plugrad.devices", "--no-smoke"], [example_site], DEV="EXAMPLE", PLUGRAD_DISABLE_PLUGINS="example")
  assert p.returncode == 1
  assert "plugrad-example 0.3.0 (entry points: example): DISABLED by PLUGRAD_DISABLE_PLUGINS" in p.stdout
  assert "requested device EXAMPLE: FAIL" in p.stderr and "no installed plugin provides EXAMPLE" in p.stderr

BROKEN = "raise ImportError('libbroken.so: cannot open shared object file')\n"

def test_plugin_raising_at_import_is_isolated(tmp_path):
  site = write_dist(tmp_path, "plugrad-broken", "0.0.1", "plugrad_broken", BROKEN)
  p = run_py(["-c", "from plugrad import Device; print(Device.available())"], [site])
  assert p.returncode == 0 and p.stdout.strip() == str(baseline()["available"]), p.stderr
  warnings = [ln for ln in p.stderr.splitlines() if "PluginWarning" in ln]
  assert len(warnings) == 1 and "plugrad-broken 0.0.1" in warnings[0] and "libbroken.so" in warnings[0]
  p = run_py(["-c", "from plugrad import Device; Device['CPU']"], [site], PLUGRAD_STRICT_PLUGINS="1")
  assert p.returncode != 0 and "PluginError" in p.stderr and "plugrad-broken" in p.stderr
  p = run_py(["-m", "plugrad.devices", "--no-smoke"], [site])
  assert p.returncode == 0 and "plugrad-broken 0.0.1 (entry points: broken): FAILED (ImportError: libbroken.so" in p.stdout
  p = run_py(["-W", "error", "-c", "from plugrad import Device; print(Device.available())"], [site], PLUGRAD_DISABLE_PLUGINS="broken")
  assert p.returncode == 0, p.stderr

OLD_API = """
from plugrad.plugins import Availability, DeviceSpec, hookimpl
@hookimpl
def plugrad_devices():
  return [DeviceSpec("OLDGPU", 500, (0, 3), lambda: Availability.yes(), "plugrad_oldgpu.device:Dev")]
"""

def test_api_mismatch_through_entry_points(tmp_path):
  site = write_dist(tmp_path, "plugrad-oldgpu", "0.1.0", "plugrad_oldgpu", OLD_API)
  p = run_py(["-m", "plugrad.devices", "--no-smoke"], [site], DEV="OLDGPU")
  assert p.returncode == 1
  assert "OLDGPU   priority  500  api 0.3  renderers: -  UNAVAILABLE: OLDGPU from plugrad-oldgpu 0.1.0 targets plugin API 0.3" in p.stdout
  assert "upgrade plugrad-oldgpu (pip install -U plugrad-oldgpu)" in p.stderr
  assert "default device: none" in p.stdout
  p = run_py(["-c", "from plugrad import Device; print(Device.DEFAULT)"], [site])
  assert p.stdout.strip() == baseline()["default"]

DUPE = """
from plugrad.plugins import PLUGIN_API_VERSION, Availability, DeviceSpec, hookimpl
@hookimpl
def plugrad_devices():
  return [DeviceSpec("CPU", 1, PLUGIN_API_VERSION, lambda: Availability.yes(), "plugrad_fastcpu.device:Dev")]
"""

def test_duplicate_device_through_entry_points(tmp_path):
  site = write_dist(tmp_path, "plugrad-fastcpu", "9.9", "plugrad_fastcpu", DUPE)
  p = run_py(["-m", "plugrad.devices", "--no-smoke"], [site])
  assert p.returncode == 1 and "device CPU is claimed by plugrad-cpu 0.1.0 and plugrad-fastcpu 9.9" in p.stderr
  assert "PLUGRAD_DISABLE_PLUGINS=cpu or PLUGRAD_DISABLE_PLUGINS=fastcpu" in p.stderr
  p = run_py(["-c", "from plugrad import Device; print(Device.DEFAULT)"], [site], PLUGRAD_DISABLE_PLUGINS="fastcpu")
  assert p.stdout.strip() == baseline()["default"], p.stderr

@pytest.mark.parametrize("dev,rc,needle", [
  ("", 0, "default device: {default}"), ("NULL", 0, "requested device NULL: PASS (fake device"), ("CPU:1", 0, "requested device CPU:1: PASS"),
  ("DISK", 0, "requested device DISK:"), ("CPUU", 1, "did you mean CPU?"), ("CPU:", 1, "malformed device string 'CPU:'")])
def test_devices_cli_exit_codes(dev, rc, needle):
  p = run_py(["-m", "plugrad.devices"], DEV=dev)
  assert p.returncode == rc, p.stdout + p.stderr
  assert needle.format(default=baseline()["default"]) in p.stdout + p.stderr
  assert "smoke: PASS (Tensor([1,2,3])*2 -> [2, 4, 6])" in p.stdout and "smoke: PASS (alloc round-trip -> [1, 2, 3]; no compute)" in p.stdout

def test_devices_cli_reports_unavailable_without_failing(tmp_path):
  p = run_py(["-m", "plugrad.devices"], CC="no-such-cc-xyz")
  assert p.returncode == 0 and "CPU      priority  100  api 1.0  renderers: CLANG  UNAVAILABLE: CC='no-such-cc-xyz'" in p.stdout
  # PYTHON unless another backend outranks it (never DISK, storage only, nor NULL, fake); the warning says why
  default = baseline(CC="no-such-cc-xyz")["default"]
  assert f"default device: {default}" in p.stdout and "default device: CPU" not in p.stdout
  if default == "PYTHON":  # falling back to the slow reference device warns, naming why CPU isn't used
    assert "CPU (from plugrad-cpu 0.1.0) is unavailable: CC='no-such-cc-xyz' is not an executable on PATH" in p.stderr
  p = run_py(["-m", "plugrad.devices", "--no-smoke"], CC="no-such-cc-xyz", DEV="CPU")
  assert p.returncode == 1 and "device 'CPU' is unavailable: CC='no-such-cc-xyz' is not an executable on PATH" in p.stderr

def test_console_script_installed():
  import shutil
  import sys
  from pathlib import Path
  exe = Path(sys.executable).parent / "plugrad-devices"
  assert exe.exists() or shutil.which("plugrad-devices"), "console script plugrad-devices missing"

ZOOM = """
from plugrad.plugins import PLUGIN_API_VERSION, Availability, DeviceSpec, hookimpl
@hookimpl
def plugrad_devices():
  return [DeviceSpec("ZOOM", 1000, PLUGIN_API_VERSION, lambda: Availability.yes("always"), "plugrad.plugins.python:PythonDevice",
                     renderers=("PYTHON",), description="a third-party backend that outranks every core one")]
"""

@pytest.mark.slow
def test_passes_with_a_higher_priority_backend_installed(tmp_path):
  """Regression: this file used to hard-code the environment's devices (CPU the default; available == CPU, DISK, NULL,
  PYTHON; five smoke PASSes), so it failed wherever another backend is installed. Rerun it with one that outranks CPU."""
  if os.environ.get("PLUGRAD_TEST_SITES"): pytest.skip("already running with an extra installed backend")
  site = write_dist(tmp_path, "plugrad-zoom", "1.0", "plugrad_zoom", ZOOM)
  p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", __file__],
                     env={**os.environ, "PLUGRAD_TEST_SITES": str(site)}, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=900)
  assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
  assert "1 skipped" in p.stdout and " failed" not in p.stdout
