"""Plugin loading: isolation, strict mode, disabling, autoload, API versions, duplicates, hook validation."""
from __future__ import annotations
import pytest
from plugin_helpers import fake_ep, plugin
from plugrad import PLUGIN_API_VERSION
from plugrad.device import Device, DeviceUnavailableError
from plugrad.plugins import Availability, DeviceSpec
from plugrad.plugins.loader import PluginError, PluginRegistry, PluginWarning

def spec(name: str, prio: int = 5, api: tuple[int, int] = PLUGIN_API_VERSION, ok: bool = True) -> DeviceSpec:
  return DeviceSpec(name, prio, api, lambda: Availability(ok, "" if ok else f"{name} hardware missing"), "plugrad.plugins.null:NullDevice")

def boom():
  raise ImportError("libfoo.so: cannot open shared object file")

def test_builtin_null_always_registered(monkeypatch):
  monkeypatch.setenv("PLUGRAD_PLUGINS_AUTOLOAD", "0")
  reg = PluginRegistry.load()
  assert list(reg.devices) == ["NULL", "PYTHON"] and reg.devices["NULL"].dist.name == "plugrad"
  assert reg.devices["NULL"].availability().ok

def test_real_entry_points_register_cpu_and_disk():
  reg = PluginRegistry.load()
  assert {"CPU", "DISK", "NULL"} <= set(reg.devices)
  assert reg.devices["CPU"].dist.name == "plugrad-cpu" and reg.devices["CPU"].spec.distribution == "plugrad-cpu"

def test_import_error_is_isolated_with_one_warning(use_registry):
  with pytest.warns(PluginWarning) as rec:
    reg = use_registry(fake_ep("bad", "plugrad-bad", "0.1", boom), fake_ep("ok", "plugrad-ok", "1.0", lambda: plugin(spec("OKDEV"))))
  assert len(rec) == 1
  msg = str(rec[0].message)
  assert "plugrad-bad" in msg and "libfoo.so" in msg and "ImportError" in msg
  assert "OKDEV" in reg.devices and reg.dists["plugrad-bad"].status == "failed"

def test_strict_mode_raises(monkeypatch):
  monkeypatch.setenv("PLUGRAD_STRICT_PLUGINS", "1")
  with pytest.raises(PluginError, match="plugrad-bad.*libfoo"):
    PluginRegistry.load([fake_ep("bad", "plugrad-bad", "0.1", boom)])

def test_raising_hook_is_isolated(use_registry):
  from plugrad.plugins import hookimpl
  def hook(): raise RuntimeError("driver probe exploded")
  from types import SimpleNamespace
  with pytest.warns(PluginWarning, match="plugrad-hooky.*driver probe exploded"):
    reg = use_registry(fake_ep("hooky", "plugrad-hooky", "2.0", lambda: SimpleNamespace(plugrad_devices=hookimpl(hook))))
  assert reg.dists["plugrad-hooky"].status == "failed" and "NULL" in reg.devices

def test_hook_returning_garbage_is_isolated(use_registry):
  from plugrad.plugins import hookimpl
  from types import SimpleNamespace
  with pytest.warns(PluginWarning, match="list of DeviceSpec"):
    use_registry(fake_ep("g", "plugrad-garbage", "1", lambda: SimpleNamespace(plugrad_devices=hookimpl(lambda: ["CPU"]))))

@pytest.mark.parametrize("disable", ["nv", "plugrad-nv", "PLUGRAD_NV", "amd, nv"])
def test_disabled_plugin_is_not_imported(monkeypatch, use_registry, disable):
  monkeypatch.setenv("PLUGRAD_DISABLE_PLUGINS", disable)
  loaded = []
  reg = use_registry(fake_ep("nv", "plugrad-nv", "0.1", lambda: loaded.append(1) or plugin(spec("NV"))))
  assert not loaded and "NV" not in reg.devices and reg.dists["plugrad-nv"].status == "disabled"
  with pytest.raises(RuntimeError, match="plugrad-nv 0.1 disabled"): Device["NV"]

def test_autoload_off_loads_only_builtins(monkeypatch, use_registry):
  monkeypatch.setenv("PLUGRAD_PLUGINS_AUTOLOAD", "0")
  reg = use_registry(fake_ep("x", "plugrad-x", "1", lambda: plugin(spec("XDEV"))))
  assert list(reg.devices) == ["NULL", "PYTHON"]

def test_bad_env_value_is_clear(monkeypatch):
  monkeypatch.setenv("PLUGRAD_PLUGINS_AUTOLOAD", "maybe")
  with pytest.raises(ValueError, match="PLUGRAD_PLUGINS_AUTOLOAD='maybe'"): PluginRegistry.load([])

def test_duplicate_device_names_both_distributions(use_registry):
  eps = [fake_ep("a", "plugrad-alpha", "1.0", lambda: plugin(spec("GPU"))), fake_ep("b", "plugrad-beta", "2.0", lambda: plugin(spec("GPU")))]
  with pytest.raises(PluginError, match=r"GPU is claimed by plugrad-alpha 1\.0 and plugrad-beta 2\.0"): use_registry(*eps)

def test_duplicate_with_builtin(use_registry):
  with pytest.raises(PluginError, match="NULL is claimed by plugrad .* and plugrad-evil"):
    use_registry(fake_ep("evil", "plugrad-evil", "1", lambda: plugin(spec("NULL"))))

def test_duplicate_resolved_by_disabling(monkeypatch, use_registry):
  monkeypatch.setenv("PLUGRAD_DISABLE_PLUGINS", "beta")
  eps = [fake_ep("alpha", "plugrad-alpha", "1.0", lambda: plugin(spec("GPU"))), fake_ep("beta", "plugrad-beta", "2.0", lambda: plugin(spec("GPU")))]
  assert use_registry(*eps).devices["GPU"].dist.name == "plugrad-alpha"

def test_same_distribution_seen_twice_loads_once(use_registry):
  ep = fake_ep("a", "plugrad-alpha", "1.0", lambda: plugin(spec("GPU")))
  assert use_registry(ep, ep).devices["GPU"].dist.entry_points == ["a"]

@pytest.mark.parametrize("api,upgrade", [((PLUGIN_API_VERSION[0] - 1, 7), "plugrad-old"), ((PLUGIN_API_VERSION[0] + 1, 0), "plugrad")])
def test_api_major_mismatch_refused(use_registry, api, upgrade):
  reg = use_registry(fake_ep("old", "plugrad-old", "0.0.9", lambda: plugin(spec("OLDDEV", prio=1000, api=api))))
  a = reg.devices["OLDDEV"].availability()
  assert not a.ok and f"upgrade {upgrade} " in a.reason and f"targets plugin API {api[0]}.{api[1]}" in a.reason
  with pytest.raises(DeviceUnavailableError, match=f"upgrade {upgrade}"): Device["OLDDEV"]
  assert Device.DEFAULT != "OLDDEV"  # refused devices never become the default, whatever their priority

def test_api_minor_difference_accepted(use_registry):
  reg = use_registry(fake_ep("new", "plugrad-new", "1", lambda: plugin(spec("NEWDEV", api=(PLUGIN_API_VERSION[0], 99)))))
  assert reg.devices["NEWDEV"].availability().ok

def test_probe_that_raises_means_unavailable(use_registry):
  def probe(): raise OSError("/dev/kfd: permission denied")
  s = DeviceSpec("KFD", 5, PLUGIN_API_VERSION, probe, "x.y:Z")
  reg = use_registry(fake_ep("k", "plugrad-k", "1", lambda: plugin(s)))
  a = reg.devices["KFD"].availability()
  assert not a.ok and "OSError: /dev/kfd: permission denied" in a.reason

@pytest.mark.parametrize("kw,err", [({"name": "cpu"}, "upper-case"), ({"priority": "1"}, "priority"), ({"api_version": (1,)}, "api_version"),
                                    ({"probe": None}, "probe"), ({"factory": "nocolon"}, "factory"), ({"factory": 3}, "factory")])
def test_devicespec_validation(kw, err):
  args = {"name": "X", "priority": 1, "api_version": (1, 0), "probe": lambda: Availability.yes(), "factory": "a.b:C", **kw}
  with pytest.raises((TypeError, ValueError), match=err): DeviceSpec(**args)

def test_device_use_triggers_loading_not_import(use_registry):
  from plugrad.plugins import loader
  loader.set_registry(None)
  assert loader._registry is None
  Device.installed()
  assert loader._registry is not None
