"""Helpers for the plugin-runtime tests (a module of its own: test modules import it; conftest modules can't be imported
reliably when several test folders each have a conftest.py)."""
from __future__ import annotations
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PLUGIN_ENV = ("DEV", "PLUGRAD_STRICT_PLUGINS", "PLUGRAD_DISABLE_PLUGINS", "PLUGRAD_PLUGINS_AUTOLOAD", "CC", "LRU", "DISABLE_COMPILER_CACHE")

def fake_ep(name: str, dist: str, version: str, load: Callable[[], Any], value: str | None = None) -> SimpleNamespace:
  """An object shaped like importlib.metadata.EntryPoint (name, value, dist, load)."""
  return SimpleNamespace(name=name, value=value or f"{dist.replace('-', '_')}", dist=SimpleNamespace(name=dist, version=version), load=load)

def plugin(*specs: Any) -> SimpleNamespace:
  """A plugin module object whose plugrad_devices hook returns `specs`."""
  from plugrad.plugins import hookimpl
  return SimpleNamespace(plugrad_devices=hookimpl(lambda: list(specs)))

def write_dist(root: Path, dist: str, version: str, module: str, code: str, ep_name: str | None = None) -> Path:
  """Install a minimal distribution into `root` by hand: a package plus the .dist-info importlib.metadata reads."""
  pkg = root / module
  pkg.mkdir(parents=True)
  (pkg / "__init__.py").write_text(textwrap.dedent(code))
  info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
  info.mkdir()
  (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
  (info / "entry_points.txt").write_text(f"[plugrad.plugins]\n{ep_name or module.removeprefix('plugrad_')} = {module}\n")
  return root

# Site directories every run_py subprocess sees as installed (PLUGRAD_TEST_SITES, os.pathsep-separated): how
# test_entrypoints.py reruns itself with a third-party backend installed, to check its expectations don't assume
# which backends the environment has.
EXTRA_SITES = [Path(p) for p in os.environ.get("PLUGRAD_TEST_SITES", "").split(os.pathsep) if p]

def run_py(args: list[str], pythonpath: list[Path] = (), timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
  """Run the venv's python with extra PYTHONPATH entries and env vars; returns the completed process (text)."""
  e = {k: v for k, v in os.environ.items() if k not in PLUGIN_ENV and k != "PYTHONPATH"}
  e.update(env)
  if pythonpath or EXTRA_SITES: e["PYTHONPATH"] = os.pathsep.join(map(str, [*pythonpath, *EXTRA_SITES]))
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=e, timeout=timeout)

