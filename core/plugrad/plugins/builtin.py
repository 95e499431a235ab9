"""Core's own plugin: registers the built-in devices through the same hook third parties use.

NULL (always available, `fake`: never the default, only chosen with DEV=NULL) accepts allocations and launches but stores
and computes nothing: schedule and codegen tests use it when no real backend matters. PYTHON (priority -200, always
available, the default only when no other compute device is, with a one-time warning naming plugrad-cpu) interprets the
linearized kernels in pure Python: the reference backend every other one is checked against (plugrad/plugins/python.py).
"""
from __future__ import annotations
from plugrad.plugins.hookspecs import hookimpl
from plugrad.plugins.spec import PLUGIN_API_VERSION, Availability, DeviceSpec

@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  return [DeviceSpec("NULL", -100, PLUGIN_API_VERSION, lambda: Availability.yes("built in"), "plugrad.plugins.null:NullDevice",
                     renderers=("NULL",), fake=True, description="fake device: allocates handles, compiles and runs nothing"),
          DeviceSpec("PYTHON", -200, PLUGIN_API_VERSION, lambda: Availability.yes("built in"), "plugrad.plugins.python:PythonDevice",
                     renderers=("PYTHON",), description="reference interpreter of the kernel IR in pure Python (slow)")]
