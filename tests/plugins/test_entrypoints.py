"""Real installed distributions in subprocesses: the example third-party backend, broken/old/duplicate plugins, the CLI."""
from __future__ import annotations
import pytest
from plugin_helpers import run_py, write_dist

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
  assert p.stdout.strip() == "CPU"

def test_example_backend_in_devices_cli(example_site):
  p = run_py(["-m", "plugrad.devices"], [example_site], DEV="example")
  assert p.returncode == 0, p.stdout + p.stderr
  assert "plugrad-example 0.3.0 (entry points: example)" in p.stdout
  assert "EXAMPLE  priority   10  api 1.0  renderers: PYEXAMPLE  available (pure Python)" in p.stdout
  assert "requested device EXAMPLE: PASS (Tensor([1,2,3])*2 -> [2, 4, 6])" in p.stdout  # through its renderer, not the smoke kernel
  assert p.stdout.count("smoke: PASS") == 5 and "FAIL" not in p.stdout  # CPU, DISK, NULL, PYTHON, EXAMPLE

def test_example_backend_disabled(example_site):
  p = run_py(["-m", "plugrad.devices", "--no-smoke"], [example_site], DEV="EXAMPLE", PLUGRAD_DISABLE_PLUGINS="example")
  assert p.returncode == 1
  assert "plugrad-example 0.3.0 (entry points: example): DISABLED by PLUGRAD_DISABLE_PLUGINS" in p.stdout
  assert "requested device EXAMPLE: FAIL" in p.stderr and "no installed plugin provides EXAMPLE" in p.stderr

BROKEN = "raise ImportError('libbroken.so: cannot open shared object file')\n"

def test_plugin_raising_at_import_is_isolated(tmp_path):
  site = write_dist(tmp_path, "plugrad-broken", "0.0.1", "plugrad_broken", BROKEN)
  p = run_py(["-c", "from plugrad import Device; print(Device.available())"], [site])
  assert p.returncode == 0 and p.stdout.strip() == "['CPU', 'DISK', 'NULL', 'PYTHON']", p.stderr
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
  assert p.stdout.strip() == "CPU"

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
  assert p.stdout.strip() == "CPU", p.stderr

@pytest.mark.parametrize("dev,rc,needle", [
  ("", 0, "default device: CPU"), ("NULL", 0, "requested device NULL: PASS (fake device"), ("CPU:1", 0, "requested device CPU:1: PASS"),
  ("DISK", 0, "requested device DISK:"), ("CPUU", 1, "did you mean CPU?"), ("CPU:", 1, "malformed device string 'CPU:'")])
def test_devices_cli_exit_codes(dev, rc, needle):
  p = run_py(["-m", "plugrad.devices"], DEV=dev)
  assert p.returncode == rc, p.stdout + p.stderr
  assert needle in p.stdout + p.stderr
  assert "smoke: PASS (Tensor([1,2,3])*2 -> [2, 4, 6])" in p.stdout and "smoke: PASS (alloc round-trip -> [1, 2, 3]; no compute)" in p.stdout

def test_devices_cli_reports_unavailable_without_failing(tmp_path):
  p = run_py(["-m", "plugrad.devices"], CC="no-such-cc-xyz")
  assert p.returncode == 0 and "CPU      priority  100  api 1.0  renderers: CLANG  UNAVAILABLE: CC='no-such-cc-xyz'" in p.stdout
  assert "default device: PYTHON" in p.stdout  # not DISK (storage only) nor NULL (fake); the warning says why
  assert "CPU (from plugrad-cpu 0.1.0) is unavailable: CC='no-such-cc-xyz' is not an executable on PATH" in p.stderr
  p = run_py(["-m", "plugrad.devices", "--no-smoke"], CC="no-such-cc-xyz", DEV="CPU")
  assert p.returncode == 1 and "device 'CPU' is unavailable: CC='no-such-cc-xyz' is not an executable on PATH" in p.stderr

def test_console_script_installed():
  import shutil
  import sys
  from pathlib import Path
  exe = Path(sys.executable).parent / "plugrad-devices"
  assert exe.exists() or shutil.which("plugrad-devices"), "console script plugrad-devices missing"
