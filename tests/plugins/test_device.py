"""Device selection: the DEV grammar, canonical names, defaults, cached instances and the errors for bad requests."""
from __future__ import annotations
import pytest
from plugin_helpers import fake_ep, plugin
from plugrad import PLUGIN_API_VERSION, Device
from plugrad.device import Compiled, DeviceName, DeviceNotFoundError, DeviceWarning, DeviceUnavailableError, parse_device
from plugrad.plugins import Availability, DeviceSpec
from plugrad.plugins.null import NullAllocator, NullDevice
from plugrad.runtime.renderer import Renderer, choose_renderer

@pytest.mark.parametrize("s,parsed,canon", [
  ("CPU", DeviceName("CPU"), "CPU"),
  ("cpu:0", DeviceName("CPU"), "CPU"),
  ("CPU:1", DeviceName("CPU", 1), "CPU:1"),
  (" nv:1 ", DeviceName("NV", 1), "NV:1"),
  ("AMD::gfx1100", DeviceName("AMD", renderer="GFX1100"), "AMD::GFX1100"),
  ("AMD:0::gfx1100", DeviceName("AMD", arch="gfx1100"), "AMD:::gfx1100"),
  ("PCI+AMD", DeviceName("AMD", iface="PCI"), "PCI+AMD"),
  ("pci+amd:2:llvm:gfx942", DeviceName("AMD", 2, "PCI", "LLVM", "gfx942"), "PCI+AMD:2:LLVM:gfx942"),
  ("CPU::LLVM", DeviceName("CPU", renderer="LLVM"), "CPU::LLVM"),
  ("disk:/tmp/a:b.bin", DeviceName("DISK", path="/tmp/a:b.bin"), "DISK:/tmp/a:b.bin"),
  ("DISK", DeviceName("DISK"), "DISK"),
])
def test_parse_and_canonicalize(s, parsed, canon):
  assert parse_device(s) == parsed
  assert Device.canonicalize(s) == canon and Device.canonicalize(canon) == canon

@pytest.mark.parametrize("bad", ["", "CPU:", "CPU::", "1CPU", "CPU:x", "C PU", "CPU:1:2:3:4", "+CPU", "NV:-1", "DISK:", "CPU:1:ll vm"])
def test_malformed_names_are_clear(bad):
  with pytest.raises(ValueError, match=r"malformed device string .*\[IFACE\+\]DEVICE\[:index\]\[:RENDERER\[:ARCH\]\]"): parse_device(bad)

def test_non_string_device():
  with pytest.raises(TypeError, match="device must be a string"): parse_device(3)  # type: ignore[arg-type]

def test_unknown_device_lists_installed_and_suggests():
  with pytest.raises(DeviceNotFoundError) as ei: Device["CUP"]
  msg = str(ei.value)
  assert "no installed plugin provides CUP" in msg and "did you mean CPU?" in msg
  for line in ("CPU      from plugrad-cpu", "DISK     from plugrad-disk", "NULL     from plugrad"): assert line in msg

def test_unavailable_device_says_why(use_registry):
  s = DeviceSpec("NV", 200, PLUGIN_API_VERSION, lambda: Availability.no("no /dev/nvidiactl (driver not loaded)"), "a.b:C")
  use_registry(fake_ep("nv", "plugrad-nv", "0.2", lambda: plugin(s)))
  with pytest.raises(DeviceUnavailableError) as ei: Device["NV:1"]
  msg = str(ei.value)
  assert "'NV:1' is unavailable: no /dev/nvidiactl" in msg and "NV       from plugrad-nv 0.2: unavailable: no /dev/nvidiactl" in msg
  assert "did you mean PYTHON (the best available device)?" in msg  # never the fake NULL
  with pytest.warns(DeviceWarning, match=r"default device is PYTHON.*NV \(from plugrad-nv 0.2\) is unavailable: no /dev/nvidiactl"):
    assert Device.DEFAULT == "PYTHON"  # unavailable high-priority device is skipped; NULL (fake) never becomes the default

def test_interface_probes(use_registry):
  """`DeviceSpec.interfaces`: an IFACE+ device string is checked with that interface's probe (a mock can be available
  where the hardware is not), an unlisted interface is unavailable naming the listed ones; probes run once."""
  calls = []
  def mock_probe() -> Availability:
    calls.append(1)
    return Availability.yes("in-process mock")
  s = DeviceSpec("GPUX", 150, PLUGIN_API_VERSION, lambda: Availability.no("no /dev/gpux"), "plugrad.plugins.null:NullDevice",
                 interfaces={"MOCK": mock_probe})
  reg = use_registry(fake_ep("gpux", "plugrad-gpux", "1", lambda: plugin(s)))
  with pytest.raises(DeviceUnavailableError, match="'GPUX' is unavailable: no /dev/gpux"): Device.entry("GPUX")
  assert Device.entry("mock+gpux:1").name == "GPUX" and Device.entry("MOCK+GPUX").availability("mock").ok
  with pytest.raises(DeviceUnavailableError, match=r"GPUX has no interface PCI \(it has MOCK and the default one\)"): Device.entry("PCI+GPUX")
  assert len(calls) == 1 and not reg.devices["GPUX"].availability().ok
  plain = DeviceSpec("PLAIN", 1, PLUGIN_API_VERSION, Availability.yes, "x:Y")  # no interfaces: the IFACE+ part is ignored as before
  use_registry(fake_ep("plain", "plugrad-plain", "1", lambda: plugin(plain)))
  assert Device.entry("PCI+PLAIN").name == "PLAIN"

def test_default_is_highest_priority_available():
  assert Device.DEFAULT == "CPU"  # CPU (100); DISK (storage) and NULL (fake) are never defaults

def test_default_by_priority_with_plugins(use_registry):
  fac = "plugrad.plugins.python:PythonDevice"
  use_registry(fake_ep("a", "plugrad-a", "1", lambda: plugin(DeviceSpec("AAA", 7, PLUGIN_API_VERSION, Availability.yes, fac),
                                                             DeviceSpec("BBB", 9, PLUGIN_API_VERSION, Availability.yes, fac))))
  assert Device.DEFAULT == "BBB" and Device.available() == ["BBB", "AAA", "NULL", "PYTHON"]

@pytest.mark.parametrize("dev,expect", [("NULL", "NULL"), ("null:0", "NULL"), ("CPU:1", "CPU:1")])
def test_dev_env_selects_default(monkeypatch, dev, expect):
  monkeypatch.setenv("DEV", dev)
  assert Device.DEFAULT == expect

def test_dev_env_unknown_or_malformed(monkeypatch):
  monkeypatch.setenv("DEV", "NUL")
  with pytest.raises(DeviceNotFoundError, match="did you mean NULL"): Device.DEFAULT
  monkeypatch.setenv("DEV", "NULL:")
  with pytest.raises(ValueError, match="malformed device string 'NULL:'"): Device.DEFAULT

def test_default_setter_is_strict():
  Device.DEFAULT = "null"
  assert Device.DEFAULT == "NULL" and isinstance(Device.default(), NullDevice)
  with pytest.raises(DeviceNotFoundError): Device.DEFAULT = "NOPE"

def test_one_cached_instance_per_canonical_name():
  a, b, c = Device["NULL"], Device["null:0"], Device["NULL:1"]
  assert a is b and a is not c and c.device == "NULL:1" and a.device == "NULL"
  assert set(Device.opened()) == {"NULL", "NULL:1"}

def test_factory_failure_names_distribution(use_registry):
  use_registry(fake_ep("f", "plugrad-f", "1.2", lambda: plugin(DeviceSpec("FFF", 1, PLUGIN_API_VERSION, Availability.yes, "no_such_mod_x:Dev"))))
  with pytest.raises(RuntimeError, match=r"opening device FFF \(from plugrad-f 1.2, factory 'no_such_mod_x:Dev'\) failed: ModuleNotFoundError"):
    Device["FFF"]

def test_factory_must_return_compiled(use_registry):
  use_registry(fake_ep("f", "plugrad-f", "1", lambda: plugin(DeviceSpec("FFF", 1, PLUGIN_API_VERSION, Availability.yes, lambda name: object()))))
  with pytest.raises(RuntimeError, match="not a Compiled device"): Device["FFF"]

def test_callable_factory_gets_canonical_name(use_registry):
  use_registry(fake_ep("f", "plugrad-f", "1", lambda: plugin(DeviceSpec("FFF", 1, PLUGIN_API_VERSION, Availability.yes, NullDevice))))
  assert Device["fff:3"].device == "FFF:3"

class R1(Renderer): name = "ONE"
class R2(Renderer):
  name = "TWO"
  @classmethod
  def accepts_arch(cls, arch): return arch.startswith("gfx")

def test_renderer_choice():
  assert type(choose_renderer("X", [R1, R2], None, None)) is R1
  r = choose_renderer("X", [R1, R2], "TWO", "sm_90")
  assert type(r) is R2 and r.arch == "sm_90"
  r = choose_renderer("X", [R2, R1], "GFX1100", None)  # DEV=X::gfx1100: arch for the default renderer
  assert type(r) is R2 and r.arch == "gfx1100"
  with pytest.raises(ValueError, match="unknown renderer 'PTX'; its renderers are ONE, TWO"): choose_renderer("X", [R1, R2], "PTX", None)

def test_device_renderer_from_name():
  dev = Compiled("X::TWO:gfx90a", NullAllocator(), [R1, R2])
  assert type(dev.renderer) is R2 and dev.renderer.arch == "gfx90a"
  with pytest.raises(RuntimeError, match="cannot compile kernels"): dev.compiler.compile("x")
  with pytest.raises(RuntimeError, match="cannot run kernels"): dev.load("k", b"")

def test_lazy_registration_and_import(tmp_path):
  from plugin_helpers import run_py
  code = ("import sys, plugrad\nassert 'plugrad.plugins.loader' not in sys.modules and 'pluggy' not in sys.modules\n"
          "from plugrad import Device\nprint(Device.installed())\n"
          "bad = [m for m in sys.modules if m.startswith(('plugrad_cpu.', 'plugrad_disk.', 'plugrad.plugins.null', 'plugrad.runtime.hcq'))]\n"
          "assert not bad, bad\nDevice['NULL']\nassert 'plugrad.plugins.null' in sys.modules\nprint('OK')")
  p = run_py(["-c", code])
  assert p.returncode == 0 and "OK" in p.stdout, p.stderr
