"""Import rules for the plugin packages, checked statically with `ast` like tests/core/test_layering.py does for core.

Every package under plugins/*/ (whatever plugins exist: a new one, such as amd when it lands, is covered without
editing this file) may import core (`plugrad.*`) and itself, never another plugin, and imports plugrad modules (core's
or its own) at module level only, except the documented lazy imports in `LAZY_ALLOWED`. Core never imports a plugin.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PLUGIN_PKGS = sorted(p for p in (REPO / "plugins").glob("*/plugrad_*") if (p / "__init__.py").is_file())

# (plugin module, imported module) -> why the import must stay inside a function (also listed in docs/architecture.md)
LAZY_ALLOWED: dict[tuple[str, str], str] = {
  ("plugrad_amd.device", "plugrad_amd.mock.kfd"): "the mock KFD and its RDNA3 emulator are testing support, loaded only when "
                                                  "DEV names the MOCK interface; the real runtime never imports them (DESIGN.md)",
  ("plugrad_nv.device", "plugrad_nv.mock.libcuda"): "the mock CUDA driver and its PTX interpreter are testing support, loaded "
                                                   "only when DEV names the MOCK interface (DESIGN.md)",
  ("plugrad_amd.am.runtime", "plugrad_amd.mock.pci"): "the mock PCI GPU is testing support, loaded only when DEV names the "
                                                      "MOCK+PCI interface (DESIGN.md)",
}


def _module_name(path: pathlib.Path, pkg: pathlib.Path) -> str:
  parts = path.relative_to(pkg.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def scan_package(pkg: pathlib.Path) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
  """(module-level imports, function-level imports) of plugrad / plugrad_* modules as (module, imported, line)."""
  top: list[tuple[str, str, int]] = []
  nested: list[tuple[str, str, int]] = []
  for path in sorted(pkg.rglob("*.py")):
    me = _module_name(path, pkg)
    is_pkg = path.name == "__init__.py"
    def visit(node: ast.AST, in_def: bool) -> None:
      for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and ((isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING") or
                                          (isinstance(child.test, ast.Attribute) and child.test.attr == "TYPE_CHECKING")):
          for c in child.orelse: visit(ast.Module(body=[c], type_ignores=[]), in_def)
          continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
          if isinstance(child, ast.Import): names = [a.name for a in child.names]
          elif child.level:
            base = me if is_pkg else me.rpartition(".")[0]
            for _ in range(child.level - 1): base = base.rpartition(".")[0]
            names = [f"{base}.{child.module}" if child.module else base]
          else: names = [child.module or ""]
          for n in names:
            if n.split(".")[0].startswith("plugrad"): (nested if in_def else top).append((me, n, child.lineno))
        elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "import_module" and \
            child.args and isinstance(child.args[0], ast.Constant) and str(child.args[0].value).startswith("plugrad"):
          (nested if in_def else top).append((me, str(child.args[0].value), child.lineno))
        visit(child, in_def or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)))
    visit(ast.parse(path.read_text(), filename=str(path)), False)
  return top, nested


def test_there_are_plugins_to_check():
  assert {p.name for p in PLUGIN_PKGS} >= {"plugrad_cpu", "plugrad_disk", "plugrad_nv", "plugrad_tinyfs"}


@pytest.mark.parametrize("pkg", PLUGIN_PKGS, ids=[p.name for p in PLUGIN_PKGS])
def test_plugins_import_only_core_and_themselves(pkg):
  top, nested = scan_package(pkg)
  bad = [f"{m}:{line} imports {t}" for m, t, line in top + nested if t.split(".")[0] not in ("plugrad", pkg.name)]
  assert not bad, "a plugin may import core (plugrad) and itself only:\n" + "\n".join(bad)


@pytest.mark.parametrize("pkg", PLUGIN_PKGS, ids=[p.name for p in PLUGIN_PKGS])
def test_plugins_have_no_function_level_plugrad_imports(pkg):
  _, nested = scan_package(pkg)
  bad = [f"{m}:{line} imports {t} inside a function or class" for m, t, line in nested if (m, t) not in LAZY_ALLOWED]
  assert not bad, "\n".join(bad) + "\n(import at module level; a documented lazy import goes in LAZY_ALLOWED and docs/architecture.md)"


def test_allow_list_is_used_and_documented():
  used = {(m, t) for pkg in PLUGIN_PKGS for m, t, _ in scan_package(pkg)[1]}
  assert set(LAZY_ALLOWED) <= used, f"stale LAZY_ALLOWED entries: {set(LAZY_ALLOWED) - used}"
  doc = (REPO / "docs" / "architecture.md").read_text()
  for a, b in LAZY_ALLOWED: assert f"`{a}` → `{b}`" in doc, f"docs/architecture.md doesn't document the lazy import {a} -> {b}"


def test_core_never_imports_a_plugin():
  core = REPO / "core" / "plugrad"
  top, nested = scan_package(core)
  bad = [f"{m}:{line} imports {t}" for m, t, line in top + nested if t.split(".")[0] != "plugrad"]
  assert not bad, "core must not import plugins (they register through entry points):\n" + "\n".join(bad)


def test_checker_on_a_synthetic_plugin(tmp_path):
  pkg = tmp_path / "plugrad_fake"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("from plugrad.device import Device\nfrom . import dev\n")
  (pkg / "dev.py").write_text("import plugrad_other\ndef f():\n  from plugrad.tensor import Tensor\n  from .x import y\n")
  top, nested = scan_package(pkg)
  assert ("plugrad_fake", "plugrad_fake", 2) in top and ("plugrad_fake.dev", "plugrad_other", 1) in top
  assert sorted((m, t) for m, t, _ in nested) == [("plugrad_fake.dev", "plugrad.tensor"), ("plugrad_fake.dev", "plugrad_fake.x")]
