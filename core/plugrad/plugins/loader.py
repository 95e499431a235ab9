"""Discover and load device plugins from the "plugrad.plugins" entry-point group, with isolation.

Environment: PLUGRAD_PLUGINS_AUTOLOAD=0 loads no external plugins (core built-ins still load);
PLUGRAD_DISABLE_PLUGINS=nv,amd skips plugins by entry-point or distribution name;
PLUGRAD_STRICT_PLUGINS=1 turns a broken plugin from a warning into a PluginError.
Loading happens once per process, on first use of `Device` (not at `import plugrad`).
"""
from __future__ import annotations
import threading
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Iterable, Protocol
import pluggy
from plugrad.helpers import getenv, getenv_list
from plugrad.plugins import builtin, hookspecs
from plugrad.plugins.spec import PLUGIN_API_VERSION, Availability, DeviceSpec

class PluginError(RuntimeError):
  """A plugin could not be loaded (in strict mode), or plugins conflict."""

class PluginWarning(UserWarning):
  """A plugin was skipped because importing it or calling its hook raised."""

class EntryPointLike(Protocol):
  name: str
  value: str
  dist: Any
  def load(self) -> Any: ...

@dataclass
class DistInfo:
  """An installed distribution that provides plugins, and how loading it went."""
  name: str
  version: str
  entry_points: list[str] = field(default_factory=list)
  status: str = "loaded"  # loaded | disabled | failed
  error: str = ""

@dataclass
class DeviceEntry:
  """A registered device: its spec, where it came from, and (lazily) whether it is usable."""
  spec: DeviceSpec
  dist: DistInfo
  refused: str = ""
  _avail: Availability | None = None

  @property
  def name(self) -> str: return self.spec.name

  def availability(self) -> Availability:
    """Run the probe once (isolated: a raising probe means unavailable); refused devices are never available."""
    if self.refused: return Availability.no(self.refused)
    if self._avail is None:
      try:
        res = self.spec.probe()
        self._avail = res if isinstance(res, Availability) else Availability.no(f"probe returned {res!r}, expected Availability")
      except Exception as e:
        self._avail = Availability.no(f"probe raised {type(e).__name__}: {e}")
    return self._avail

def _norm(name: str) -> str: return name.lower().replace("_", "-")

def _core_version() -> str:
  try: return metadata.version("plugrad")
  except metadata.PackageNotFoundError: return "0+unknown"

def api_refusal(spec: DeviceSpec, dist: DistInfo) -> str:
  """Why a spec targeting another plugin-API major version is refused ("" when compatible)."""
  (maj, mnr), (cmaj, cmnr) = spec.api_version, PLUGIN_API_VERSION
  if maj == cmaj: return ""
  upgrade = dist.name if maj < cmaj else "plugrad"
  return (f"{spec.name} from {dist.name} {dist.version} targets plugin API {maj}.{mnr}, but plugrad {_core_version()} implements "
          f"{cmaj}.{cmnr}: upgrade {upgrade} (pip install -U {upgrade})")

class PluginRegistry:
  """The loaded plugin set: a pluggy PluginManager, the distributions seen, and the devices they offer."""

  def __init__(self) -> None:
    self.pm = pluggy.PluginManager(hookspecs.PROJECT)
    self.pm.add_hookspecs(hookspecs.PlugradSpecs)
    self.dists: dict[str, DistInfo] = {}
    self.devices: dict[str, DeviceEntry] = {}
    self._plugin_dist: dict[str, DistInfo] = {}
    self.strict = getenv("PLUGRAD_STRICT_PLUGINS", False)

  @classmethod
  def load(cls, entry_points: Iterable[EntryPointLike] | None = None) -> PluginRegistry:
    """Register core built-ins, then every enabled entry point (unless autoload is off), then collect device specs."""
    self = cls()
    core = self._dist("plugrad", _core_version())
    self._register(builtin, "plugrad:builtin", core, "builtin")
    if getenv("PLUGRAD_PLUGINS_AUTOLOAD", True):
      eps = metadata.entry_points(group="plugrad.plugins") if entry_points is None else entry_points
      self._load_entry_points(eps)
    self._collect_devices()
    return self

  def _dist(self, name: str, version: str) -> DistInfo:
    return self.dists.setdefault(_norm(name), DistInfo(name, version))

  def _load_entry_points(self, eps: Iterable[EntryPointLike]) -> None:
    disabled = {_norm(x) for x in getenv_list("PLUGRAD_DISABLE_PLUGINS")}
    for ep in eps:
      if ep.value.split(":")[0] == builtin.__name__: continue  # core's own entry point: registered above
      dname = getattr(ep.dist, "name", None) or f"<unknown distribution of {ep.value}>"
      dist = self._dist(dname, getattr(ep.dist, "version", "?"))
      if ep.name in dist.entry_points: continue  # same distribution seen twice on sys.path: first wins
      dist.entry_points.append(ep.name)
      if disabled & {_norm(ep.name), _norm(dname), _norm(dname).removeprefix("plugrad-")}:
        dist.status = "disabled"
        continue
      try: mod = ep.load()
      except Exception as e:
        self._fail(dist, f"import (entry point {ep.name} = {ep.value})", e)
        continue
      self._register(mod, f"{dname}:{ep.name}", dist, ep.name)

  def _register(self, mod: Any, plugin_name: str, dist: DistInfo, ep_name: str) -> None:
    if ep_name not in dist.entry_points: dist.entry_points.append(ep_name)
    try: self.pm.register(mod, name=plugin_name)
    except Exception as e: return self._fail(dist, f"register (entry point {ep_name})", e)
    self._plugin_dist[plugin_name] = dist

  def _fail(self, dist: DistInfo, what: str, e: BaseException) -> None:
    msg = (f"plugrad plugin from distribution {dist.name} {dist.version} failed to {what}: {type(e).__name__}: {e}. "
           f"It was skipped; disable it with PLUGRAD_DISABLE_PLUGINS={_norm(dist.name).removeprefix('plugrad-')}, "
           "or set PLUGRAD_STRICT_PLUGINS=1 to make this an error")
    dist.status, dist.error = "failed", f"{type(e).__name__}: {e}"
    if self.strict: raise PluginError(msg) from e
    warnings.warn(msg, PluginWarning, stacklevel=4)

  def _collect_devices(self) -> None:
    claims: dict[str, list[DeviceEntry]] = {}
    for impl in self.pm.hook.plugrad_devices.get_hookimpls():
      dist = self._plugin_dist[impl.plugin_name]
      try: specs = self._call_hook(impl)
      except Exception as e:
        self._fail(dist, "return its devices (hook plugrad_devices)", e)
        continue
      for spec in specs:
        entry = DeviceEntry(spec, dist)
        object.__setattr__(spec, "distribution", dist.name)
        entry.refused = api_refusal(spec, dist)
        claims.setdefault(spec.name, []).append(entry)
    dupes = {n: es for n, es in claims.items() if len(es) > 1}
    if dupes:
      lines, names = [], set()
      for n, es in sorted(dupes.items()):
        es = sorted(es, key=lambda e: _norm(e.dist.name))
        lines.append(f"device {n} is claimed by " + " and ".join(f"{e.dist.name} {e.dist.version}" for e in es))
        names |= {_norm(e.dist.name).removeprefix("plugrad-") for e in es if e.dist.name != "plugrad"}
      raise PluginError("conflicting plugins: " + "; ".join(lines) + ". Uninstall one, or disable one with "
                        + " or ".join(f"PLUGRAD_DISABLE_PLUGINS={x}" for x in sorted(names)))
    self.devices = {n: es[0] for n, es in sorted(claims.items())}

  @staticmethod
  def _call_hook(impl: Any) -> list[DeviceSpec]:
    specs = impl.function()
    if not isinstance(specs, (list, tuple)) or not all(isinstance(s, DeviceSpec) for s in specs):
      raise TypeError(f"plugrad_devices() must return a list of DeviceSpec, got {specs!r}")
    return list(specs)

  def by_priority(self) -> list[DeviceEntry]:
    """Devices, highest priority first (ties by name)."""
    return sorted(self.devices.values(), key=lambda e: (-e.spec.priority, e.name))

  def plugin_dists(self) -> list[DistInfo]:
    """Distributions that registered or tried to register plugins, core first."""
    return sorted(self.dists.values(), key=lambda d: (d.name != "plugrad", _norm(d.name)))

_lock = threading.RLock()  # re-entrant: a Buffer freed by gc while the registry loads may look it up
_registry: PluginRegistry | None = None

def get_registry() -> PluginRegistry:
  """The process-wide registry, loaded on first call."""
  global _registry
  with _lock:
    if _registry is None: _registry = PluginRegistry.load()
    return _registry

def set_registry(reg: PluginRegistry | None) -> None:
  """Replace (or with None, forget) the process-wide registry; used by tests and tools. Also drops cached devices."""
  global _registry
  with _lock: _registry = reg
  from plugrad.device import Device
  Device._reset()
