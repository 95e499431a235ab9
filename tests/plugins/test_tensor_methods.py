"""Tensor methods added by plugins (hook plugrad_tensor_methods): lookup, lazy import, errors naming the plugin."""
from __future__ import annotations
from types import SimpleNamespace
import numpy as np
import pytest
from plugin_helpers import fake_ep
from plugrad.plugins import hookimpl
from plugrad.plugins.loader import PluginError, PluginRegistry, PluginWarning, set_registry
from plugrad.tensor import Tensor

def methods(**offered) -> SimpleNamespace: return SimpleNamespace(plugrad_tensor_methods=hookimpl(lambda: dict(offered)))

@pytest.fixture
def t() -> Tensor: return Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))  # made with the real registry, before any swap

def test_plugin_methods_bind_to_the_tensor(t, use_registry):
  use_registry(fake_ep("m", "plugrad-m", "1", lambda: methods(shape_plus=lambda self, k: (self.shape, k), describe="builtins:repr")))
  assert t.shape_plus(7) == ((2, 3), 7)
  assert t.describe() == repr(t) and t.describe.__self__ is t  # "module:attr" imported on first use, bound like a method
  assert hasattr(t, "shape_plus") and not hasattr(t, "shape_pluz")

def test_missing_method_names_the_plugin(t, use_registry, monkeypatch):
  use_registry()  # only core's built-ins: no tinyfs
  with pytest.raises(AttributeError, match=r"'Tensor' object has no attribute 'fs_store'; .*plugrad-tinyfs, which is not installed"):
    t.fs_store()
  with pytest.raises(AttributeError, match="no attribute 'nonexistent_method' .and no loaded plugin") as e: t.nonexistent_method
  assert e.value.name == "nonexistent_method" and e.value.obj is t
  monkeypatch.setenv("PLUGRAD_DISABLE_PLUGINS", "tinyfs")
  set_registry(PluginRegistry.load())  # the installed entry points, tinyfs disabled
  with pytest.raises(AttributeError, match="plugrad-tinyfs, which is disabled by PLUGRAD_DISABLE_PLUGINS"): t.fs_load(10)
  monkeypatch.setenv("PLUGRAD_PLUGINS_AUTOLOAD", "0")
  set_registry(PluginRegistry.load())
  with pytest.raises(AttributeError, match=r"plugrad-tinyfs, but plugin autoloading is off \(PLUGRAD_PLUGINS_AUTOLOAD=0\)"): t.fs_load

def test_private_names_never_load_plugins(t, use_registry):
  reg = use_registry(fake_ep("m", "plugrad-m", "1", lambda: methods(_hidden=len)))
  with pytest.raises(AttributeError, match="'_hidden'"): t._hidden
  assert reg._methods is None  # underscore names (pickle, numpy probes) don't even collect plugin methods

def test_two_plugins_same_method(t, use_registry):
  use_registry(fake_ep("a", "plugrad-alpha", "1.0", lambda: methods(frob=len)), fake_ep("b", "plugrad-beta", "2.0", lambda: methods(frob=len)))
  with pytest.raises(PluginError, match=r"frob is offered by plugrad-alpha 1\.0 and plugrad-beta 2\.0.*PLUGRAD_DISABLE_PLUGINS=beta"):
    t.frob()

@pytest.mark.parametrize("offered, msg", [({"sum": len}, "shadow Tensor.sum"), ({"_x": len}, "public identifier"),
                                          ({"ok": 3}, "function or a 'module:attr'")])
def test_bad_offers_skip_the_plugin(t, use_registry, offered, msg):
  reg = use_registry(fake_ep("bad", "plugrad-bad", "1", lambda: SimpleNamespace(plugrad_tensor_methods=hookimpl(lambda: offered))))
  with pytest.warns(PluginWarning, match=f"plugrad-bad.*{msg}"): assert reg.tensor_methods(Tensor) == {}
  assert t.sum.__func__ is Tensor.sum  # Tensor's own method is untouched

def test_unimportable_target_is_a_clear_error(t, use_registry):
  use_registry(fake_ep("m", "plugrad-m", "1", lambda: methods(gone="no_such_module_xyz:f")))
  with pytest.raises(PluginError, match="Tensor.gone from plugrad-m 1: can't load 'no_such_module_xyz:f'.*ModuleNotFoundError"): t.gone
