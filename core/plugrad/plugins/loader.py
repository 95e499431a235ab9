"""Discover and load device plugins from the "plugrad.plugins" entry-point group, with isolation.

Environment: PLUGRAD_PLUGINS_AUTOLOAD=0 loads no external plugins (core built-ins still load);
PLUGRAD_DISABLE_PLUGINS=nv,amd skips plugins by entry-point or distribution name;
PLUGRAD_STRICT_PLUGINS=1 turns a broken plugin from a warning into a PluginError; PLUGRAD_PROBE_TIMEOUT (seconds, default 5)
bounds each device probe: one that takes longer reports the device unavailable ("probe timed out after 5 s").
PLUGRAD_PLUGIN_TIMEOUT (seconds, default 30) bounds a plugin's import and each of its hook calls the same way: a plugin
that takes longer is skipped like one that raised ("timed out after 30 s"). Slow code runs on in its daemon thread
(threads can't be killed), unwaited for. A plugin that raises anything at import, in a hook or in a probe (SystemExit
and any other BaseException included) is isolated the same way; only KeyboardInterrupt propagates.
Loading happens once per process, on first use of `Device` (not at `import plugrad`).
Plugins may also add Tensor methods (hook plugrad_tensor_methods): `tensor_method` resolves them for `Tensor.__getattr__`.
"""
from __future__ import annotations
import importlib
import os
import threading
import types
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Iterable, Protocol
import pluggy
from plugrad.helpers import getenv, getenv_list
from plugrad.plugins import builtin, hookspecs
from plugrad.plugins.spec import PLUGIN_API_VERSION, Availability, DeviceSpec

DEFAULT_PROBE_TIMEOUT = 5.0
DEFAULT_PLUGIN_TIMEOUT = 30.0  # imports can be slow (large autogen modules on a busy machine): more room than a probe

class PluginTimeout(Exception):
  """A plugin's import, hook or probe did not finish within its time limit."""

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
  _iface_avail: dict[str, Availability] = field(default_factory=dict)

  @property
  def name(self) -> str: return self.spec.name

  def availability(self, iface: str | None = None) -> Availability:
    """Run the probe once, isolated: one that raises (SystemExit too) or runs past PLUGRAD_PROBE_TIMEOUT means unavailable;
    refused devices are never available. With `iface` (the `IFACE+` part of a device string) the probe of that
    interface answers, when the spec lists any."""
    if self.refused: return Availability.no(self.refused)
    if iface is not None and self.spec.interfaces:
      if (probe := self.spec.interfaces.get(iface.upper())) is None:
        return Availability.no(f"{self.name} has no interface {iface.upper()} (it has {', '.join(sorted(self.spec.interfaces))} "
                               "and the default one)")
      if iface.upper() not in self._iface_avail: self._iface_avail[iface.upper()] = run_probe(probe)
      return self._iface_avail[iface.upper()]
    if self._avail is None: self._avail = run_probe(self.spec.probe)
    return self._avail

def _seconds(name: str, default: float) -> float:
  """Env var `name` as a positive number of seconds (default when unset); ValueError naming it otherwise."""
  raw = os.environ.get(name, "").strip()
  try: t = float(raw) if raw else default
  except ValueError: raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
  if not t > 0: raise ValueError(f"{name} must be > 0 seconds, got {raw!r}")
  return t

def probe_timeout() -> float:
  """PLUGRAD_PROBE_TIMEOUT in seconds (default 5)."""
  return _seconds("PLUGRAD_PROBE_TIMEOUT", DEFAULT_PROBE_TIMEOUT)

def plugin_timeout() -> float:
  """PLUGRAD_PLUGIN_TIMEOUT in seconds (default 30)."""
  return _seconds("PLUGRAD_PLUGIN_TIMEOUT", DEFAULT_PLUGIN_TIMEOUT)

def call_isolated(fn: Callable[[], Any], limit: float, env: str) -> Any:
  """fn() in a daemon thread, waited for at most `limit` seconds: its result, or what it raised (any BaseException,
  re-raised here), or PluginTimeout naming `env`, the variable that sets the limit. A call still running is abandoned:
  it can't be killed, but nothing waits for it and it does not keep the process alive."""
  box: list[tuple[bool, Any]] = []
  def run() -> None:
    try: box.append((True, fn()))
    except BaseException as e: box.append((False, e))  # handed to the caller, who decides
  t = threading.Thread(target=run, name="plugrad-plugin", daemon=True)
  t.start()
  t.join(limit)
  if not box: raise PluginTimeout(f"timed out after {limit:g} s ({env})")
  ok, v = box[0]
  if ok: return v
  raise v

def call_plugin(fn: Callable[[], Any]) -> Any:
  """A plugin's import or hook call, under PLUGRAD_PLUGIN_TIMEOUT (see call_isolated)."""
  return call_isolated(fn, plugin_timeout(), "PLUGRAD_PLUGIN_TIMEOUT")

def run_probe(probe: Callable[[], Any]) -> Availability:
  """Call `probe` in a daemon thread and wait at most probe_timeout(); a probe still running then is abandoned and its
  device reported unavailable. Anything it raises (SystemExit and KeyboardInterrupt too) makes the device unavailable."""
  limit = probe_timeout()
  try: res = call_isolated(probe, limit, "PLUGRAD_PROBE_TIMEOUT")
  except PluginTimeout: return Availability.no(f"probe timed out after {limit:g} s (PLUGRAD_PROBE_TIMEOUT)")
  except BaseException as e: return Availability.no(f"probe raised {type(e).__name__}: {e}")
  return res if isinstance(res, Availability) else Availability.no(f"probe returned {res!r}, expected Availability")

@dataclass
class TensorMethod:
  """A Tensor method a plugin adds: its function (or "module:attr", imported on first use) and where it came from."""
  name: str
  target: Any
  dist: DistInfo
  clash: list[DistInfo] = field(default_factory=list)  # other distributions offering the same name

  def function(self) -> Callable[..., Any]:
    if self.clash:
      ds = [self.dist, *self.clash]
      raise PluginError(f"Tensor.{self.name} is offered by " + " and ".join(f"{d.name} {d.version}" for d in ds) + ": disable one with "
                        + " or ".join(f"PLUGRAD_DISABLE_PLUGINS={_norm(d.name).removeprefix('plugrad-')}" for d in ds))
    if isinstance(self.target, str):
      mod, _, attr = self.target.partition(":")
      try: self.target = call_plugin(lambda: getattr(importlib.import_module(mod), attr))
      except KeyboardInterrupt: raise
      except BaseException as e:
        raise PluginError(f"Tensor.{self.name} from {self.dist.name} {self.dist.version}: can't load {self.target!r}: {type(e).__name__}: {e}") from e
    return self.target

def _check_methods(offered: Any, owner: type) -> dict[str, Any]:
  """Validate a plugrad_tensor_methods() result: public names `owner` (Tensor) doesn't define, functions or "module:attr" strings."""
  if not isinstance(offered, dict): raise TypeError(f"plugrad_tensor_methods() must return a dict of name -> function, got {offered!r}")
  for name, fn in offered.items():
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
      raise ValueError(f"Tensor method name {name!r} must be a public identifier (no leading underscore)")
    if hasattr(owner, name): raise ValueError(f"Tensor method {name!r} would shadow {owner.__name__}.{name}, which {owner.__name__} defines itself")
    if not (callable(fn) or (isinstance(fn, str) and fn.count(":") == 1)):
      raise TypeError(f"Tensor method {name!r} must be a function or a 'module:attr' string, got {fn!r}")
  return offered

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
    self.autoload = True
    self._methods: dict[str, TensorMethod] | None = None

  @classmethod
  def load(cls, entry_points: Iterable[EntryPointLike] | None = None) -> PluginRegistry:
    """Register core built-ins, then every enabled entry point (unless autoload is off), then collect device specs."""
    self = cls()
    core = self._dist("plugrad", _core_version())
    self._register(builtin, "plugrad:builtin", core, "builtin")
    self.autoload = bool(getenv("PLUGRAD_PLUGINS_AUTOLOAD", True))
    if self.autoload:
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
      try: mod = call_plugin(ep.load)
      except KeyboardInterrupt: raise
      except BaseException as e:  # sys.exit() (or any BaseException) at import time must not end the program
        self._fail(dist, f"import (entry point {ep.name} = {ep.value})", e)
        continue
      self._register(mod, f"{dname}:{ep.name}", dist, ep.name)

  def _register(self, mod: Any, plugin_name: str, dist: DistInfo, ep_name: str) -> None:
    if ep_name not in dist.entry_points: dist.entry_points.append(ep_name)
    try: self.pm.register(mod, name=plugin_name)
    except KeyboardInterrupt: raise
    except BaseException as e: return self._fail(dist, f"register (entry point {ep_name})", e)
    self._plugin_dist[plugin_name] = dist

  def _fail(self, dist: DistInfo, what: str, e: BaseException) -> None:
    head = f"plugrad plugin from distribution {dist.name} {dist.version} failed to {what}: {type(e).__name__}: {e}. "
    disable = f"PLUGRAD_DISABLE_PLUGINS={_norm(dist.name).removeprefix('plugrad-')}"
    dist.status, dist.error = "failed", f"{type(e).__name__}: {e}"
    if self.strict:
      raise PluginError(head + f"PLUGRAD_STRICT_PLUGINS=1 makes this an error; fix or uninstall the plugin, or disable it with {disable}") from e
    warnings.warn(head + f"It was skipped; disable it with {disable}, or set PLUGRAD_STRICT_PLUGINS=1 to make this an error",
                  PluginWarning, stacklevel=4)

  def _collect_devices(self) -> None:
    claims: dict[str, list[DeviceEntry]] = {}
    for impl in self.pm.hook.plugrad_devices.get_hookimpls():
      dist = self._plugin_dist[impl.plugin_name]
      try: specs = self._call_hook(impl)
      except KeyboardInterrupt: raise
      except BaseException as e:
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
    specs = call_plugin(impl.function)
    if not isinstance(specs, (list, tuple)) or not all(isinstance(s, DeviceSpec) for s in specs):
      raise TypeError(f"plugrad_devices() must return a list of DeviceSpec, got {specs!r}")
    return list(specs)

  def by_priority(self) -> list[DeviceEntry]:
    """Devices, highest priority first (ties by name)."""
    return sorted(self.devices.values(), key=lambda e: (-e.spec.priority, e.name))

  def tensor_methods(self, owner: type) -> dict[str, TensorMethod]:
    """The Tensor methods plugins add (hook plugrad_tensor_methods), collected on first call; `owner` is the class they
    are added to (Tensor: names it defines are refused; passed in, so this module never imports Tensor). A plugin whose
    hook raises or returns something invalid is skipped like a broken device hook; a name two plugins offer raises when
    it is used."""
    with _lock:
      if self._methods is not None: return self._methods
      methods: dict[str, TensorMethod] = {}
      for impl in self.pm.hook.plugrad_tensor_methods.get_hookimpls():
        dist = self._plugin_dist[impl.plugin_name]
        try: offered = _check_methods(call_plugin(impl.function), owner)
        except KeyboardInterrupt: raise
        except BaseException as e:
          self._fail(dist, "return its Tensor methods (hook plugrad_tensor_methods)", e)
          continue
        for name, target in offered.items():
          if name in methods: methods[name].clash.append(dist)
          else: methods[name] = TensorMethod(name, target, dist)
      self._methods = methods
      return methods

  def missing_method_hint(self, name: str) -> str:
    """Why no plugin offers Tensor method `name`, and which distribution would (for the ones this project knows)."""
    want = hookspecs.KNOWN_TENSOR_METHODS.get(name)
    if want is None: return " (and no loaded plugin adds a Tensor method of that name)"
    d = self.dists.get(_norm(want))
    if d is None and not self.autoload: why = "but plugin autoloading is off (PLUGRAD_PLUGINS_AUTOLOAD=0)"
    elif d is None: why = f"which is not installed (pip install {want})"
    elif d.status == "disabled": why = "which is disabled by PLUGRAD_DISABLE_PLUGINS"
    elif d.status == "failed": why = f"which failed to load: {d.error}"
    else: why = f"but {d.name} {d.version} does not offer it (upgrade it: pip install -U {want})"
    return f"; Tensor.{name} is provided by the plugin {want}, {why}"

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

def tensor_method(obj: Any, name: str) -> Any:
  """`obj.name` for a Tensor method a plugin adds, bound to `obj`; otherwise AttributeError saying which plugin would add it."""
  reg = get_registry()
  m = reg.tensor_methods(type(obj)).get(name)
  if m is not None: return types.MethodType(m.function(), obj)
  raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}{reg.missing_method_hint(name)}", name=name, obj=obj)

def set_registry(reg: PluginRegistry | None) -> None:
  """Replace (or with None, forget) the process-wide registry; used by tests and tools. Also drops cached devices."""
  global _registry
  with _lock:
    _registry = reg
    hooks = list(_on_change)
  for fn in hooks: fn()


_on_change: list[Callable[[], None]] = []


def on_registry_change(fn: Callable[[], None]) -> None:
  """Call `fn` whenever set_registry replaces the registry (Device drops the devices it opened from the old one).
  A callback registered twice runs once."""
  with _lock:
    if fn not in _on_change: _on_change.append(fn)
