"""pluggy hook specifications for project "plugrad", and the `hookimpl` marker plugins decorate with.

A plugin is a module named by an entry point in group "plugrad.plugins" that defines, e.g.:

    from plugrad.plugins import hookimpl, DeviceSpec, Availability, PLUGIN_API_VERSION
    @hookimpl
    def plugrad_devices():
      return [DeviceSpec("EXAMPLE", 10, PLUGIN_API_VERSION, lambda: Availability.yes(), "my_pkg.device:MyDevice")]
"""
from __future__ import annotations
from typing import Any, Callable
import pluggy
from plugrad.plugins.spec import DeviceSpec

PROJECT = "plugrad"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

class PlugradSpecs:
  """The hooks plugrad calls. Every hook is optional for a plugin."""

  @hookspec
  def plugrad_devices(self) -> list[DeviceSpec]:  # type: ignore[empty-body]
    """Return the devices this plugin offers. Must be cheap: no compiler, ctypes library or driver imports."""

  @hookspec
  def plugrad_tensor_methods(self) -> dict[str, Callable[..., Any] | str]:  # type: ignore[empty-body]
    """Return methods this plugin adds to Tensor: {name: function or "module:attr"}, called as function(tensor, *args).
    Names are public identifiers Tensor doesn't define; a "module:attr" string is imported on the first call of that name,
    so the hook stays cheap. `Tensor.__getattr__` asks the registry only when normal attribute lookup fails."""

# Tensor methods plugins of this project provide, by distribution: only used to say what to install when one is missing.
KNOWN_TENSOR_METHODS = {"fs_store": "plugrad-tinyfs", "fs_load": "plugrad-tinyfs"}
