"""DEBUG output format (docs/debug.md): a tiny program run in a subprocess at several DEBUG levels."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

PROGRAM = "from plugrad.tensor import Tensor\nprint('result', (Tensor([1.0, 2.0, 3.0]) * 2 + 1).tolist())\n"
TIMING = re.compile(r"^  (\S+)\s+(E_3)\s+\d+\.\d us\s+\d+\.\d\d GFLOPS\s+\d+\.\d\d GB/s$")
SUMMARY = re.compile(r"^schedule: 1 items in \d+\.\d\d ms$")


def run(debug: int, dev: str = "CPU") -> list[str]:
  env = {**os.environ, "DEBUG": str(debug), "DEV": dev}
  p = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=120)
  assert p.returncode == 0, p.stderr
  lines = p.stdout.splitlines()
  assert lines[-1] == "result [3.0, 5.0, 7.0]"
  return lines[:-1]


def test_debug_0_prints_nothing():
  assert run(0) == []


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
def test_debug_2_kernel_lines(dev):
  lines = run(2, dev)
  timing = [m for ln in lines if (m := TIMING.match(ln))]
  assert len(timing) == 1 and timing[0].group(1) == dev, lines
  assert sum(bool(SUMMARY.match(ln)) for ln in lines) == 1, lines
  assert not any("void" in ln for ln in lines), "DEBUG=2 must not print source"


def test_debug_4_prints_source_before_the_kernel_runs():
  lines = run(4)
  t = next(i for i, ln in enumerate(lines) if TIMING.match(ln))
  src = "\n".join(lines[:t])
  assert re.search(r"void E_3\w*\(", src) and "2.0f" in src, src
  plines = run(4, "PYTHON")
  assert any(ln.startswith("# PYTHON kernel E_3: ") for ln in plines) and any(re.match(r"^\s+\d+ RANGE\s", ln) for ln in plines)


def test_debug_5_prints_the_kernel_ast():
  lines = run(5)
  assert "kernel E_3 AST:" in lines and any("REDUCE" not in ln and "STORE" in ln for ln in lines)
