"""Shared fixtures for plugin-runtime tests: clean environment, fake entry points, fixture distributions, subprocess runner."""
from __future__ import annotations
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
import pytest
from plugrad.plugins.loader import PluginRegistry, set_registry
from plugin_helpers import FIXTURES, PLUGIN_ENV, fake_ep, plugin, run_py, write_dist  # noqa: F401  (re-exported for fixtures)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
  """No plugin env leaks in; compiler cache in a private dir; registry and device cache reset around each test."""
  for k in PLUGIN_ENV: monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
  set_registry(None)
  yield
  set_registry(None)

@pytest.fixture
def use_registry():
  """Load a registry from the given fake entry points and install it process-wide."""
  def load(*eps: Any) -> PluginRegistry:
    reg = PluginRegistry.load(list(eps))
    set_registry(reg)
    return reg
  return load

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
