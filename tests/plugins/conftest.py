"""Shared fixtures for plugin-runtime tests: clean environment, fake entry points, fixture distributions, subprocess runner."""
from __future__ import annotations
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable
import pytest
from plugrad.plugins.loader import PluginRegistry, set_registry

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PLUGIN_ENV = ("DEV", "PLUGRAD_STRICT_PLUGINS", "PLUGRAD_DISABLE_PLUGINS", "PLUGRAD_PLUGINS_AUTOLOAD", "CC", "LRU", "DISABLE_COMPILER_CACHE")

@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
  """No plugin env leaks in; compiler cache in a private dir; registry and device cache reset around each test."""
  for k in PLUGIN_ENV: monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
  set_registry(None)
  yield
  set_registry(None)

def fake_ep(name: str, dist: str, version: str, load: Callable[[], Any], value: str | None = None) -> SimpleNamespace:
  """An object shaped like importlib.metadata.EntryPoint (name, value, dist, load)."""
  return SimpleNamespace(name=name, value=value or f"{dist.replace('-', '_')}", dist=SimpleNamespace(name=dist, version=version), load=load)

def plugin(*specs: Any) -> SimpleNamespace:
  """A plugin module object whose plugrad_devices hook returns `specs`."""
  from plugrad.plugins import hookimpl
  return SimpleNamespace(plugrad_devices=hookimpl(lambda: list(specs)))

@pytest.fixture
def use_registry():
  """Load a registry from the given fake entry points and install it process-wide."""
  def load(*eps: Any) -> PluginRegistry:
    reg = PluginRegistry.load(list(eps))
    set_registry(reg)
    return reg
  return load

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

def run_py(args: list[str], pythonpath: list[Path] = (), timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
  """Run the venv's python with extra PYTHONPATH entries and env vars; returns the completed process (text)."""
  e = {k: v for k, v in os.environ.items() if k not in PLUGIN_ENV and k != "PYTHONPATH"}
  e.update(env)
  if pythonpath: e["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=e, timeout=timeout)

@pytest.fixture(scope="session")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
  """tests/fixtures/example_backend installed out of tree with pip into a temporary target directory."""
  src = tmp_path_factory.mktemp("example_src") / "example_backend"
  shutil.copytree(FIXTURES / "example_backend", src)
  target = tmp_path_factory.mktemp("example_site")
  p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                      "--disable-pip-version-check", "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, f"pip install of the example backend failed:\n{p.stdout}\n{p.stderr}"
  return target
