"""Collect the AMDGPU LLVM IR of every kernel the conformance suite produces, for several archs, without a GPU.

  python tests/amd/collect_kernels.py OUT.json ARCH[,ARCH...] [pytest args...]   (default: --pyargs plugrad.testing)

Runs the suite on the NULL device (schedules and codegen run, nothing executes, so value checks fail: that is
expected and ignored) with `get_program` wrapped to also render each kernel AST with the AMDGPU renderer of each
arch. Writes {"kernels": {arch: [[name, source], ...]}, "errors": {arch: [[name, renderer error], ...]}}.
tests/amd/test_amd_compile.py runs this in a subprocess and compiles everything it collects with clang-19.
"""
from __future__ import annotations

import json
import os
import sys


class Collector:
  def __init__(self, archs: list[str]) -> None:
    from plugrad_amd.renderer import AMDGPURenderer
    self.renderers = {a: AMDGPURenderer(a) for a in archs}
    self.kernels: dict[str, dict[str, str]] = {a: {} for a in archs}
    self.errors: dict[str, dict[str, str]] = {a: {} for a in archs}

  def pytest_configure(self, config) -> None:
    import plugrad.engine.realize as realize
    from plugrad.codegen import get_program
    def wrapped(ast, renderer, opts=None):
      spec = get_program(ast, renderer, opts)   # (the NULL device's choice; each AMDGPU renderer makes its own below)
      for arch, ren in self.renderers.items():
        try: self.kernels[arch].setdefault(get_program(ast, ren).src, spec.name)
        except Exception as e: self.errors[arch].setdefault(f"{type(e).__name__}: {e}", spec.name)  # a finding, not a crash
      return spec
    realize.get_program = wrapped


def main(argv: list[str]) -> int:
  import pytest
  out, archs, args = argv[0], argv[1].split(","), argv[2:] or ["--pyargs", "plugrad.testing"]
  os.environ["DEV"] = "NULL"
  col = Collector(archs)
  pytest.main(["-q", "--tb=no", "-p", "no:cacheprovider", "-p", "no:randomly", *args], plugins=[col])
  with open(out, "w") as f:
    json.dump({"kernels": {a: [[n, s] for s, n in k.items()] for a, k in col.kernels.items()},
               "errors": {a: [[n, e] for e, n in k.items()] for a, k in col.errors.items()}}, f)
  print(f"collected {sum(len(k) for k in col.kernels.values())} kernels, {sum(len(e) for e in col.errors.values())} render errors -> {out}")
  return 0


if __name__ == "__main__": sys.exit(main(sys.argv[1:]))
