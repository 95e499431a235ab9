"""The import layering of core/plugrad, checked statically with `ast` (no module is imported).

The module-level import graph (imports at the top of a module, including those inside try/if at module level, but not
`if TYPE_CHECKING:` blocks) must be acyclic and every import must point to the same or a lower layer of `LAYERS`, the
order docs/architecture.md documents. Imports of plugrad modules inside functions or classes are forbidden, except
the lazy plugin loading listed in `LAZY_ALLOWED` (each documented in docs/architecture.md).
"""
from __future__ import annotations

import ast
import fnmatch
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "core" / "plugrad"

# lowest first; a module may import modules of its own layer or of a lower one. Patterns are fnmatch-style module names.
LAYERS: list[tuple[str, list[str]]] = [
  ("base", ["plugrad.dtype", "plugrad.helpers", "plugrad.errors", "plugrad.download", "plugrad.live", "plugrad.plugins.spec", "plugrad.viz.capture",
            "plugrad.viz.graph", "plugrad.mixin", "plugrad.engine", "plugrad.runtime"]),
  ("ir vocabulary", ["plugrad.uop.enums", "plugrad.uop.alu", "plugrad.uop.bounds", "plugrad.uop.render", "plugrad.uop.shape"]),
  ("op mixins", ["plugrad.mixin.*"]),
  ("ir", ["plugrad.uop", "plugrad.uop.ops", "plugrad.uop.upat", "plugrad.uop.rewrite", "plugrad.uop.symbolic", "plugrad.uop.buffers"]),
  ("viz", ["plugrad.viz", "plugrad.viz.*"]),
  ("runtime", ["plugrad.runtime.*", "plugrad.device", "plugrad.codegen.tc", "plugrad.codegen.targets"]),
  ("codegen", ["plugrad.codegen", "plugrad.codegen.*"]),
  ("plugins", ["plugrad.plugins", "plugrad.plugins.*"]),
  ("schedule", ["plugrad.schedule", "plugrad.schedule.*"]),
  ("engine", ["plugrad.engine.realize", "plugrad.engine.inline", "plugrad.engine.plan",
              "plugrad.engine.memory"]),
  ("autograd", ["plugrad.gradient"]),
  ("tensor", ["plugrad.tensor_ops", "plugrad.tensor_ops.*", "plugrad.tensor"]),
  ("frontend", ["plugrad.engine.function", "plugrad.engine.jit", "plugrad.nn", "plugrad.nn.*", "plugrad.devices", "plugrad.distributed"]),
  ("facade and apps", ["plugrad", "plugrad.apps", "plugrad.apps.*", "plugrad.testing", "plugrad.testing.*"]),
]

# (importing module, imported module): the only plugrad imports allowed inside functions. All are lazy plugin loading,
# so that `import plugrad` neither imports pluggy nor reads entry points (see docs/architecture.md, "Lazy plugin loading").
LAZY_ALLOWED: dict[tuple[str, str], str] = {
  ("plugrad.device", "plugrad.plugins.loader"): "the plugin registry loads on the first use of Device",
  ("plugrad.tensor", "plugrad.plugins.loader"): "Tensor methods that plugins add resolve on first use (Tensor.__getattr__)",
  ("plugrad.plugins", "plugrad.plugins.hookspecs"): "plugrad.plugins.hookimpl resolves lazily: hookspecs imports pluggy",
  ("plugrad.apps.llm.__main__", "plugrad.apps.llm.server"): "only --serve needs the server and its optional [serve] extra",
}


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = path.relative_to(root.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
  return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, me: str, is_pkg: bool, mods: dict[str, pathlib.Path]) -> list[str]:
  """The plugrad modules an import statement loads (`from a import b` is module a.b when that is a module)."""
  def resolve(name: str) -> str:
    while name and name not in mods: name = name.rpartition(".")[0]
    return name
  if isinstance(node, ast.Import): return [resolve(a.name) for a in node.names if a.name.split(".")[0] == "plugrad"]
  if node.level:  # relative: from the package of `me`
    base = me if is_pkg else me.rpartition(".")[0]
    for _ in range(node.level - 1): base = base.rpartition(".")[0]
    module = f"{base}.{node.module}" if node.module else base
  else: module = node.module or ""
  if module.split(".")[0] != "plugrad": return []
  return [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else resolve(module) for a in node.names]


def scan(root: pathlib.Path = ROOT) -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
  """(module-level import graph, function-level plugrad imports as (module, imported, line))."""
  mods = _modules(root)
  graph: dict[str, set[str]] = {m: set() for m in mods}
  nested: list[tuple[str, str, int]] = []
  for me, path in mods.items():
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))

    def visit(node: ast.AST, in_def: bool) -> None:
      for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
          for c in child.orelse: visit(ast.Module(body=[c], type_ignores=[]), in_def)
          continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
          for t in _targets(child, me, is_pkg, mods):
            if t == me: continue
            if in_def: nested.append((me, t, child.lineno))
            else: graph[me].add(t)
        elif isinstance(child, ast.Call) and in_def and isinstance(child.func, ast.Attribute) and child.func.attr == "import_module" \
            and child.args and isinstance(child.args[0], ast.Constant) and str(child.args[0].value).startswith("plugrad"):
          nested.append((me, str(child.args[0].value), child.lineno))
        visit(child, in_def or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)))
    visit(tree, False)
  return graph, nested


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle as a list of modules (first == last), or None."""
  state: dict[str, int] = {}
  for start in sorted(graph):
    if state.get(start): continue
    stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
    path = [start]
    state[start] = 1
    while stack:
      node, todo = stack[-1]
      if not todo:
        state[node] = 2
        stack.pop(); path.pop()
        continue
      nxt = todo.pop()
      if state.get(nxt) == 1: return path[path.index(nxt):] + [nxt]
      if not state.get(nxt) and nxt in graph:
        state[nxt] = 1
        path.append(nxt)
        stack.append((nxt, sorted(graph[nxt])))
  return None


def layer_of(module: str) -> int:
  hits = [i for i, (_, pats) in enumerate(LAYERS) for p in pats if fnmatch.fnmatchcase(module, p)]
  if not hits: raise LookupError(f"{module} is in no layer of LAYERS: add it (and to docs/architecture.md)")
  return min(hits)  # the most specific placement is listed first (plugrad.viz.capture in base, other plugrad.viz.* in viz)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
  out = []
  for a in sorted(graph):
    for b in sorted(graph[a]):
      if layer_of(b) > layer_of(a):
        out.append(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]}), a higher layer")
  return out


GRAPH, NESTED = scan()


def test_every_module_has_a_layer():
  missing = []
  for m in GRAPH:
    try: layer_of(m)
    except LookupError as e: missing.append(str(e))
  assert not missing, "\n".join(missing)


def test_module_import_graph_is_acyclic():
  assert (cycle := find_cycle(GRAPH)) is None, "import cycle: " + " -> ".join(cycle)


def test_imports_respect_the_layer_order():
  assert not (bad := layer_violations(GRAPH)), "\n".join(bad)


def test_no_function_level_imports_of_plugrad_modules():
  bad = [f"{m}:{line} imports {t} inside a function or class" for m, t, line in NESTED if (m, t) not in LAZY_ALLOWED]
  assert not bad, "\n".join(bad) + "\n(import at module level; lazy plugin loading goes in LAZY_ALLOWED and docs/architecture.md)"


def test_allow_list_is_used_and_documented():
  used = {(m, t) for m, t, _ in NESTED}
  assert set(LAZY_ALLOWED) <= used, f"stale LAZY_ALLOWED entries: {set(LAZY_ALLOWED) - used}"
  doc = (ROOT.parents[1] / "docs" / "architecture.md").read_text()
  for a, b in LAZY_ALLOWED: assert f"`{a}` → `{b}`" in doc, f"docs/architecture.md doesn't document the lazy import {a} -> {b}"


# ----- the checker itself, on small synthetic packages -----
def _pkg(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  root = tmp_path / "plugrad"
  for name, text in files.items():
    p = root / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
  return root


def test_checker_finds_a_cycle_and_nested_imports(tmp_path):
  root = _pkg(tmp_path, {"__init__.py": "", "a.py": "from plugrad.b import x\n", "b.py": "import plugrad.c\n",
                         "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from plugrad.a import y\n"
                                 "def f():\n  from plugrad import a\n  from . import b\n"})
  graph, nested = scan(root)
  assert find_cycle(graph) is None  # the TYPE_CHECKING import is no edge
  assert sorted((m, t) for m, t, _ in nested) == [("plugrad.c", "plugrad.a"), ("plugrad.c", "plugrad.b")]
  (root / "c.py").write_text("try:\n  from plugrad.a import y\nexcept ImportError: pass\n")
  graph, _ = scan(root)
  assert find_cycle(graph) == ["plugrad.a", "plugrad.b", "plugrad.c", "plugrad.a"]


@pytest.mark.parametrize("importer, imported, ok", [("plugrad.tensor", "plugrad.uop.ops", True), ("plugrad.uop.ops", "plugrad.tensor", False),
                                                    ("plugrad.uop.ops", "plugrad.mixin.math", True), ("plugrad.mixin.math", "plugrad.uop.ops", False),
                                                    ("plugrad.device", "plugrad.schedule.kernelize", False)])
def test_layer_order_examples(importer, imported, ok):
  assert (layer_violations({importer: {imported}}) == []) == ok
