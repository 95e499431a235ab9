"""Reliability of device selection and plugin isolation (docs/reliability.md): no fake or storage device as the default,
PYTHON with a warning when nothing else computes, probes under a timeout, SystemExit from plugins contained, failing
factories skipped, the doctor never touching a user's file and failing when a smoke test fails."""
from __future__ import annotations
import os
import threading
import time
import pytest
from plugin_helpers import fake_ep, plugin, run_py, write_dist
from plugrad import PLUGIN_API_VERSION, Device
from plugrad.device import DeviceError, DeviceWarning
from plugrad.plugins import Availability, DeviceSpec
from plugrad.plugins.loader import PluginError, PluginWarning, probe_timeout

PYDEV = "plugrad.plugins.python:PythonDevice"

def test_core_alone_computes_on_python_and_warns_once():
  code = ("from plugrad import Tensor, Device\nprint((Tensor([1., 2.]) * 2).tolist(), (Tensor([3.]) + 1).tolist(), Device.DEFAULT)")
  p = run_py(["-c", code], PLUGRAD_PLUGINS_AUTOLOAD="0")
  assert p.returncode == 0, p.stderr
  assert p.stdout.strip() == "[2.0, 4.0] [4.0] PYTHON"  # was [0.0, 0.0] on NULL, silently
  assert p.stderr.count("DeviceWarning") == 1 and "pip install plugrad-cpu" in p.stderr and "slow reference" in p.stderr

def test_null_only_when_asked():
  p = run_py(["-c", "from plugrad import Device; print(Device.DEFAULT)"], PLUGRAD_PLUGINS_AUTOLOAD="0", DEV="NULL")
  assert p.stdout.strip() == "NULL" and "DeviceWarning" not in p.stderr

def test_no_c_compiler_says_why(tmp_path):
  # no clang or gcc on PATH, CC unset: the default must not become DISK ("DISK needs a file path"), and the warning says why
  code = "from plugrad import Tensor, Device\nprint((Tensor([1, 2, 3]) * 2).tolist(), Device.DEFAULT)"
  p = run_py(["-c", code], PATH=str(tmp_path))
  assert p.returncode == 0, p.stderr
  assert p.stdout.strip() == "[2, 4, 6] PYTHON"
  assert "CPU (from plugrad-cpu 0.1.0) is unavailable: no C compiler found: install clang or gcc, or set CC" in p.stderr

def test_dev_disk_is_refused_and_file_untouched(tmp_path):
  user = tmp_path / "precious.bin"
  user.write_bytes(b"my data " * 4)
  code = "from plugrad import Tensor\nTensor([1, 2, 3]).realize()"
  p = run_py(["-c", code], DEV=f"DISK:{user}")
  assert p.returncode != 0 and "DISK is a storage-only device and can't be the default device" in p.stderr
  assert user.read_bytes() == b"my data " * 4
  with pytest.raises(DeviceError, match="storage-only"): Device.DEFAULT = f"DISK:{user}"

def test_doctor_smoke_tests_disk_on_a_temp_file(tmp_path):
  user = tmp_path / "precious.bin"
  user.write_bytes(b"my data " * 4)
  before = user.stat()
  p = run_py(["-m", "plugrad.devices"], DEV=f"DISK:{user}")
  assert "requested device DISK:" in p.stdout and "smoke: PASS (alloc round-trip" in p.stdout, p.stdout + p.stderr
  assert str(user) not in p.stdout.split("requested device")[1]  # the smoke test ran on a temporary file
  assert user.read_bytes() == b"my data " * 4 and user.stat().st_mtime_ns == before.st_mtime_ns

def test_disk_never_resizes_an_existing_file(tmp_path):
  from plugrad import Buffer, dtypes
  f = tmp_path / "data.bin"
  f.write_bytes(bytes(range(16)))
  small = Buffer(f"DISK:{f}", 8, dtypes.uint8)
  assert bytes(small.copyout()) == bytes(range(8)) and f.stat().st_size == 16  # mapping a prefix neither shrinks nor writes
  with pytest.raises(ValueError, match="never grows or shrinks an existing file"): Buffer(f"DISK:{f}", 20, dtypes.uint8).ensure_allocated()
  assert f.read_bytes() == bytes(range(16))
  new = tmp_path / "new.bin"
  Buffer(f"DISK:{new}", 5, dtypes.uint8).ensure_allocated()  # a file DISK creates gets the buffer's size
  assert new.read_bytes() == bytes(5)

def test_probe_timeout(use_registry, monkeypatch):
  release = threading.Event()
  def stuck() -> Availability:
    release.wait(60)
    return Availability.yes()
  monkeypatch.setenv("PLUGRAD_PROBE_TIMEOUT", "0.3")
  reg = use_registry(fake_ep("slow", "plugrad-slow", "1", lambda: plugin(DeviceSpec("SLOW", 1000, PLUGIN_API_VERSION, stuck, PYDEV))))
  try:
    t0 = time.perf_counter()
    a = reg.devices["SLOW"].availability()
    assert not a.ok and a.reason == "probe timed out after 0.3 s (PLUGRAD_PROBE_TIMEOUT)"
    assert time.perf_counter() - t0 < 3 and Device.DEFAULT != "SLOW"
  finally: release.set()
  monkeypatch.delenv("PLUGRAD_PROBE_TIMEOUT")
  assert probe_timeout() == 5.0
  monkeypatch.setenv("PLUGRAD_PROBE_TIMEOUT", "-1")
  with pytest.raises(ValueError, match="PLUGRAD_PROBE_TIMEOUT must be > 0"): probe_timeout()

def test_probe_raising_system_exit_is_unavailable(use_registry):
  def bye() -> Availability: raise SystemExit(3)
  reg = use_registry(fake_ep("x", "plugrad-x", "1", lambda: plugin(DeviceSpec("BYE", 1000, PLUGIN_API_VERSION, bye, PYDEV))))
  assert reg.devices["BYE"].availability().reason == "probe raised SystemExit: 3"

def exits():
  raise SystemExit(0)

def test_system_exit_at_import_is_contained(use_registry):
  with pytest.warns(PluginWarning, match="plugrad-quitter 1 failed to import .*SystemExit"):
    reg = use_registry(fake_ep("quitter", "plugrad-quitter", "1", exits))
  assert reg.dists["plugrad-quitter"].status == "failed" and "PYTHON" in reg.devices

BLOCKING = """
import sys, time
from plugrad.plugins import PLUGIN_API_VERSION, Availability, DeviceSpec, hookimpl
def _probe():
  time.sleep(3600)
  return Availability.yes()
@hookimpl
def plugrad_devices():
  return [DeviceSpec("HANG", 900, PLUGIN_API_VERSION, _probe, "plugrad.plugins.python:PythonDevice")]
"""
QUITTER = "import sys\nsys.exit(0)\n"

def test_blocking_probe_and_exiting_plugin_through_entry_points(tmp_path):
  site = write_dist(tmp_path / "a", "plugrad-hang", "1.0", "plugrad_hang", BLOCKING)
  write_dist(tmp_path / "b", "plugrad-quit", "1.0", "plugrad_quit", QUITTER)
  t0 = time.perf_counter()
  p = run_py(["-m", "plugrad.devices", "--no-smoke"], [site, tmp_path / "b"], PLUGRAD_PROBE_TIMEOUT="1", timeout=60)
  assert time.perf_counter() - t0 < 30
  assert "HANG     priority  900" in p.stdout and "UNAVAILABLE: probe timed out after 1 s" in p.stdout, p.stdout + p.stderr
  assert "plugrad-quit 1.0 (entry points: quit): FAILED (SystemExit: 0)" in p.stdout
  assert "default device: CPU" in p.stdout and p.returncode == 0

def _broken(name: str):
  raise OSError("cannot open /dev/broken0: permission denied")

def test_failing_factory_falls_back_with_warning(use_registry):
  use_registry(fake_ep("b", "plugrad-broken", "1", lambda: plugin(DeviceSpec("BROKEN", 1000, PLUGIN_API_VERSION, Availability.yes, _broken),
                                                                  DeviceSpec("GOOD", 10, PLUGIN_API_VERSION, Availability.yes, PYDEV))))
  with pytest.warns(DeviceWarning, match=r"opening device BROKEN .* failed: OSError: cannot open /dev/broken0.*falling back"):
    assert Device.DEFAULT == "GOOD"

def test_strict_mode_message(monkeypatch):
  from plugrad.plugins.loader import PluginRegistry
  monkeypatch.setenv("PLUGRAD_STRICT_PLUGINS", "1")
  with pytest.raises(PluginError) as ei: PluginRegistry.load([fake_ep("quitter", "plugrad-quitter", "1", exits)])
  msg = str(ei.value)
  assert "skipped" not in msg and "PLUGRAD_STRICT_PLUGINS=1 makes this an error" in msg and "PLUGRAD_DISABLE_PLUGINS=quitter" in msg

FAILING_SMOKE = """
from plugrad.plugins import PLUGIN_API_VERSION, Availability, DeviceSpec, hookimpl
def _open(name):
  raise RuntimeError("firmware upload failed")
@hookimpl
def plugrad_devices():
  return [DeviceSpec("FLAKY", -10, PLUGIN_API_VERSION, lambda: Availability.yes(), _open)]
"""

def test_doctor_exits_nonzero_when_a_smoke_test_fails(tmp_path):
  site = write_dist(tmp_path, "plugrad-flaky", "1.0", "plugrad_flaky", FAILING_SMOKE)
  p = run_py(["-m", "plugrad.devices"], [site])
  assert "smoke: FAIL (DeviceError: opening device FLAKY" in p.stdout and p.returncode == 1, p.stdout + p.stderr
  assert "a device failed its smoke test" in p.stderr

def test_factory_system_exit_is_a_device_error(use_registry):
  def quit_(name: str): raise SystemExit(1)
  use_registry(fake_ep("q", "plugrad-q", "1", lambda: plugin(DeviceSpec("QUIT", 5, PLUGIN_API_VERSION, Availability.yes, quit_))))
  with pytest.raises(DeviceError, match="opening device QUIT .* failed: SystemExit: 1"): Device["QUIT"]
  assert os.environ.get("DEV") is None

# ---------------------------------------------------------------------------- slow plugins, BaseException subclasses

class Boom(BaseException):
  """Not an Exception, not SystemExit or KeyboardInterrupt: escaped isolation."""

def _boom(*a):
  raise Boom("boom")

def test_base_exception_subclasses_are_contained(use_registry):
  class M:  # a plugin whose hooks raise Boom / GeneratorExit
    from plugrad.plugins import hookimpl
    plugrad_devices = staticmethod(hookimpl(_boom))
  class T:
    from plugrad.plugins import hookimpl
    plugrad_devices = staticmethod(hookimpl(lambda: []))
    plugrad_tensor_methods = staticmethod(hookimpl(lambda: (_ for _ in ()).throw(GeneratorExit("gen"))))
  with pytest.warns(PluginWarning) as w:
    reg = use_registry(fake_ep("imp", "plugrad-imp", "1", _boom), fake_ep("hook", "plugrad-hook", "1", lambda: M),
                       fake_ep("tm", "plugrad-tm", "1", lambda: T),
                       fake_ep("f", "plugrad-f", "1", lambda: plugin(DeviceSpec("BOOMF", 5, PLUGIN_API_VERSION, Availability.yes, _boom))))
    from plugrad import Tensor
    with pytest.raises(AttributeError): Tensor([1.]).no_such_method_anywhere
  msgs = " | ".join(str(x.message) for x in w)
  assert "plugrad-imp 1 failed to import" in msgs and "Boom: boom" in msgs
  assert "plugrad-hook 1 failed to return its devices" in msgs
  assert "plugrad-tm 1 failed to return its Tensor methods" in msgs and "GeneratorExit: gen" in msgs
  assert {reg.dists[d].status for d in ("plugrad-imp", "plugrad-hook", "plugrad-tm")} == {"failed"}
  with pytest.raises(DeviceError, match="opening device BOOMF .* failed: Boom: boom"): Device["BOOMF"]

def test_keyboard_interrupt_from_a_plugin_is_not_swallowed(use_registry):
  def ki(): raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt): use_registry(fake_ep("ki", "plugrad-ki", "1", ki))

SLEEPY = {
  "import": "import time\ntime.sleep(3600)\n",
  "devices": """
import time
from plugrad.plugins import hookimpl
@hookimpl
def plugrad_devices():
  time.sleep(3600)
""",
  "methods": """
import time
from plugrad.plugins import hookimpl
@hookimpl
def plugrad_devices(): return []
@hookimpl
def plugrad_tensor_methods():
  time.sleep(3600)
""",
}
SLEEPY_SCRIPT = """
import time, warnings
t0 = time.perf_counter()
with warnings.catch_warnings(record=True) as w:
  warnings.simplefilter("always")
  from plugrad import Device, Tensor
  print(Device.DEFAULT)
  try: Tensor([1.]).not_a_method
  except AttributeError: pass
print(round(time.perf_counter() - t0), [str(x.message) for x in w if "sleepy" in str(x.message)])
"""

@pytest.mark.parametrize("where", ["import", "devices", "methods"])
def test_a_plugin_that_sleeps_does_not_block(tmp_path, where):
  """A plugin that slept at import or in a hook blocked plugrad (the probe timeout covered probes only)."""
  site = write_dist(tmp_path, "plugrad-sleepy", "1.0", "plugrad_sleepy", SLEEPY[where])
  t0 = time.perf_counter()
  p = run_py(["-c", SLEEPY_SCRIPT], [site], PLUGRAD_PLUGIN_TIMEOUT="1", timeout=60)
  assert time.perf_counter() - t0 < 30 and p.returncode == 0, p.stdout + p.stderr
  dev, rest = p.stdout.strip().splitlines()
  assert dev in ("CPU", "PYTHON")
  what = {"import": "import", "devices": "return its devices", "methods": "return its Tensor methods"}[where]
  assert f"plugrad-sleepy 1.0 failed to {what}" in rest and "timed out after 1 s (PLUGRAD_PLUGIN_TIMEOUT)" in rest, rest
