"""plugrad's plugin system: hook specs (pluggy project "plugrad"), the device-spec contract, loading and built-ins.

Plugins import what they need from here: `hookimpl`, `DeviceSpec`, `Availability`, `PLUGIN_API_VERSION`.
`hookimpl` is resolved lazily so that `import plugrad` does not import pluggy.
"""
from __future__ import annotations
from typing import Any
from plugrad.plugins.spec import PLUGIN_API_VERSION, Availability, DeviceSpec

__all__ = ["PLUGIN_API_VERSION", "Availability", "DeviceSpec", "hookimpl", "hookspec"]

def __getattr__(name: str) -> Any:
  if name in ("hookimpl", "hookspec"):
    from plugrad.plugins import hookspecs  # lazy plugin loading: hookspecs imports pluggy (docs/architecture.md)
    return getattr(hookspecs, name)
  raise AttributeError(f"module 'plugrad.plugins' has no attribute {name!r}")
