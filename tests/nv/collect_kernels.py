"""Collect the CUDA source of every kernel the conformance suite produces, without a GPU.

  python tests/nv/collect_kernels.py OUT.json [pytest args...]   (default: --pyargs plugrad.testing)

Runs the suite on the NULL device (schedules and codegen run, nothing executes, so value checks fail: that is
expected and ignored) with `get_program` wrapped to also render each kernel AST with the CUDA renderer. Writes
{"kernels": [[name, source], ...] (deduplicated), "errors": [[name, renderer error], ...]}. The NVRTC compile test
(tests/nv/test_compile.py) runs this in a subprocess and compiles everything it collects.
"""
from __future__ import annotations

import json
import os
import sys


class Collector:
  def __init__(self, arch: str = "sm_90") -> None:
    from plugrad_nv.renderer import CUDARenderer
    self.renderer = CUDARenderer(arch)
    self.kernels: dict[str, str] = {}
    self.errors: dict[str, str] = {}

  def pytest_configure(self, config) -> None:
    import plugrad.engine.realize as realize
    from plugrad.codegen import get_program
    def wrapped(ast, renderer, opts=None):
      spec = get_program(ast, renderer, opts)   # (the NULL device's choice; the CUDA renderer makes its own below)
      try:
        src = get_program(ast, self.renderer).src
        self.kernels.setdefault(src, spec.name)
      except Exception as e:  # a kernel the CUDA renderer can't render is a finding, not a crash of the suite
        self.errors.setdefault(f"{type(e).__name__}: {e}", spec.name)
      return spec
    realize.get_program = wrapped


def main(argv: list[str]) -> int:
  import pytest
  out, args = argv[0], argv[1:] or ["--pyargs", "plugrad.testing"]
  os.environ["DEV"] = "NULL"
  col = Collector()
  pytest.main(["-q", "--tb=no", "-p", "no:cacheprovider", "-p", "no:randomly", *args], plugins=[col])
  with open(out, "w") as f:
    json.dump({"kernels": [[n, s] for s, n in col.kernels.items()], "errors": [[n, e] for e, n in col.errors.items()]}, f)
  print(f"collected {len(col.kernels)} kernels, {len(col.errors)} render errors -> {out}")
  return 0


if __name__ == "__main__": sys.exit(main(sys.argv[1:]))
