"""pluggy hook specifications for project "plugrad", and the `hookimpl` marker plugins decorate with.

A plugin is a module named by an entry point in group "plugrad.plugins" that defines, e.g.:

    from plugrad.plugins import hookimpl, DeviceSpec, Availability, PLUGIN_API_VERSION
    @hookimpl
    def plugrad_devices():
      return [DeviceSpec("EXAMPLE", 10, PLUGIN_API_VERSION, lambda: Availability.yes(), "my_pkg.device:MyDevice")]
"""
from __future__ import annotations
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
