"""The plugin contract's data types: the API version, `Availability` and `DeviceSpec`.

This module is imported by `import plugrad`, so it must stay tiny: stdlib only, no pluggy.
"""
from __future__ import annotations
import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Union

PLUGIN_API_VERSION: tuple[int, int] = (1, 0)
"""(major, minor) of the backend interface. Plugins state the version they target; a different major is refused."""

DEVICE_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")

@dataclass(frozen=True)
class Availability:
  """Answer of a device probe: `ok`, and when not ok a human `reason` (e.g. "no C compiler on PATH")."""
  ok: bool
  reason: str = ""
  def __bool__(self) -> bool: return self.ok
  @classmethod
  def yes(cls, note: str = "") -> Availability: return cls(True, note)
  @classmethod
  def no(cls, reason: str) -> Availability: return cls(False, reason)

Factory = Union[str, Callable[[str], Any]]

@dataclass(frozen=True)
class DeviceSpec:
  """One device a plugin offers.

  name: upper-case device name ("CPU"). priority: the highest-priority available device is the default.
  api_version: the PLUGIN_API_VERSION the plugin was written against. probe: cheap, import-free availability check.
  factory: "module:Class" (imported on first open) or a callable; called with the canonical device name ("CPU:1").
  renderers: names of the renderers the device offers, first is the default (informational, shown by plugrad-devices).
  storage: True for storage-only devices (DISK, TINYFS): never the default device, and DEV may not name them.
  fake: True for devices that keep no data and compute nothing (NULL): never chosen as the default, only by DEV=NAME.
  interfaces: probes of the `IFACE+` interfaces the device offers besides its default one (`MOCK+AMD`), by upper-case name;
  a device string with an interface is checked with that probe (an interface not listed is unavailable, naming the ones
  there are). Devices that list none ignore the interface part, as before.
  distribution: filled in by the loader with the name of the distribution that registered the spec.
  """
  name: str
  priority: int
  api_version: tuple[int, int]
  probe: Callable[[], Availability]
  factory: Factory
  renderers: tuple[str, ...] = ()
  description: str = ""
  storage: bool = False
  fake: bool = False
  distribution: str = field(default="", compare=False)
  interfaces: dict[str, Callable[[], Availability]] = field(default_factory=dict, compare=False)

  def __post_init__(self) -> None:
    if not isinstance(self.name, str) or not DEVICE_NAME_RE.match(self.name):
      raise ValueError(f"DeviceSpec.name must be an upper-case identifier like 'CPU', got {self.name!r}")
    if not isinstance(self.priority, int): raise TypeError(f"DeviceSpec({self.name}).priority must be an int, got {self.priority!r}")
    v = self.api_version
    if not (isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, int) for x in v)):
      raise TypeError(f"DeviceSpec({self.name}).api_version must be a (major, minor) tuple of ints, got {v!r}")
    if not callable(self.probe): raise TypeError(f"DeviceSpec({self.name}).probe must be callable, got {self.probe!r}")
    if isinstance(self.factory, str):
      if not re.match(r"^[\w.]+:[\w.]+$", self.factory):
        raise ValueError(f"DeviceSpec({self.name}).factory must look like 'package.module:Class', got {self.factory!r}")
    elif not callable(self.factory): raise TypeError(f"DeviceSpec({self.name}).factory must be 'module:attr' or callable, got {self.factory!r}")
    object.__setattr__(self, "renderers", tuple(self.renderers))

  def load_factory(self) -> Callable[[str], Any]:
    """Import (on first use) and return the device constructor."""
    if callable(self.factory): return self.factory
    mod_name, attr = self.factory.split(":")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."): obj = getattr(obj, part)
    return obj
