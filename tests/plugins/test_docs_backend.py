"""The backend author's path of docs/backends.md, end to end.

The 60-line gcc backend of section 6 is built from the page's code blocks alone (every fenced block whose first line
names a file under `plugrad-gcc/`), installed out of tree with pip and run through the whole conformance suite
(`DEV=GCC CC=gcc pytest --pyargs plugrad.testing`: ops, low-precision floats, multi-device, TinyJit) on a fresh
compile cache. The suite's rules are checked too: the C base's former defaults (fp8 typed as `unsigned char`, nothing
emulated: silently wrong fp8 arithmetic) fail the kit, and a missing oracle fails the tests that need it instead of
skipping them.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_helpers import PLUGIN_ENV, run_py
from plugrad.codegen.cstyle import CStyleRenderer
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.engine import realize

DOCS = Path(__file__).resolve().parents[2] / "docs" / "backends.md"
BLOCK = re.compile(r"```(?:python|toml)\n# (plugrad-gcc/[\w./-]+)\n(.*?)```", re.S)


def docs_files() -> dict[str, str]:
  """{path under plugrad-gcc/: file text} from the page's code blocks."""
  return {m.group(1).removeprefix("plugrad-gcc/"): f"# {m.group(1)}\n{m.group(2)}" for m in BLOCK.finditer(DOCS.read_text())}


@pytest.fixture(scope="module")
def gcc_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
  """The docs' backend written out as a project and installed with pip into a target directory."""
  root = tmp_path_factory.mktemp("docs_src") / "plugrad-gcc"
  for rel, text in docs_files().items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)
  site = tmp_path_factory.mktemp("docs_site")
  p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                      "--disable-pip-version-check", "--target", str(site), str(root)], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, f"pip install of the docs' gcc backend failed:\n{p.stdout}\n{p.stderr}"
  return site


def test_docs_hold_the_whole_backend():
  files = docs_files()
  assert set(files) == {"pyproject.toml", "plugrad_gcc/__init__.py", "plugrad_gcc/device.py"}
  code = [ln for rel, t in files.items() if rel.endswith(".py") for ln in t.splitlines() if ln.strip() and not ln.startswith("# plugrad-gcc/")]
  assert len(code) <= 60, f"the docs promise a backend in 60 lines, it has {len(code)}"


def test_docs_backend_smoke_test(gcc_site: Path):
  p = run_py(["-m", "plugrad.devices"], [gcc_site], DEV="GCC", CC="gcc")
  assert p.returncode == 0, p.stdout + p.stderr
  assert "requested device GCC: PASS (Tensor([1,2,3])*2 -> [2, 4, 6])" in p.stdout


@pytest.mark.slow
def test_docs_backend_passes_the_conformance_suite(gcc_site: Path, tmp_path: Path):
  env = {k: v for k, v in os.environ.items() if k not in PLUGIN_ENV and k != "PYTHONPATH"}
  env.update(PYTHONPATH=str(gcc_site), DEV="GCC", CC="gcc", PLUGRAD_CACHE_DIR=str(tmp_path / "cache"))  # first time: nothing cached
  p = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "--pyargs", "plugrad.testing"],
                     cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
  tail = "\n".join(p.stdout.splitlines()[-40:])
  assert p.returncode == 0, tail + p.stderr[-3000:]
  assert "conformance suite on device GCC" in p.stdout
  assert re.search(r"\b\d{3,} passed", tail) and "failed" not in tail and "error" not in tail, tail
  skips = re.findall(r"^SKIPPED \[\d+\] (\S+)", p.stdout, re.M)
  assert all("test_linalg_rearrange" in s for s in skips), f"only from_blob (no host memory wrapping) may skip: {skips}"
  assert "test_multi_jit" not in "".join(skips) and "lowp" not in "".join(skips)


# ***** the suite's rules *****

def test_c_base_emulates_what_it_cannot_prove():
  assert {dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2} <= CStyleRenderer.emulated
  r = CStyleRenderer()
  assert r.ctype(dtypes.bfloat16) == "float" and r.ctype(dtypes.bfloat16.ptr()) == "unsigned short*"
  class NoEmulation(CStyleRenderer):
    emulated = frozenset()
  with pytest.raises(NotImplementedError, match="no C type for dtypes.fp8e4m3"): NoEmulation().ctype(dtypes.fp8e4m3)


def test_former_c_defaults_fail_the_kit(monkeypatch: pytest.MonkeyPatch):
  """fp8 as `unsigned char` with nothing emulated (the C base's defaults before issue 45): arithmetic on the codes."""
  from plugrad.testing.ops import test_lowp_dtypes as kit
  cpu = Device["CPU"]
  ren = copy.copy(cpu.renderer)  # the CPU renderer as the device set it up, with the C base's former fp8 handling
  ren.type_map = {**type(ren).type_map, dtypes.fp8e4m3: "unsigned char", dtypes.fp8e5m2: "unsigned char"}
  ren.emulated = frozenset()
  monkeypatch.setattr(Device, "DEFAULT", "CPU", raising=False)
  monkeypatch.setattr(cpu, "renderer", ren)
  monkeypatch.setattr(realize, "_RUNNERS", {})
  with pytest.raises(AssertionError): kit.test_arithmetic_rounds_once(dtypes.fp8e4m3)
  with pytest.raises(AssertionError): kit.test_cast_from_float32_rounds_to_nearest_even(dtypes.fp8e5m2)


def test_missing_oracle_fails_instead_of_skipping(tmp_path: Path):
  """Without ml_dtypes and einops the tests that need them fail, naming the extra; none is skipped."""
  for mod in ("ml_dtypes", "einops"):  # absent, as pip would leave them without the extra
    (tmp_path / f"{mod}.py").write_text(f'raise ModuleNotFoundError("No module named {mod}", name="{mod}")\n')
  p = run_py(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--pyargs", "plugrad.testing.ops.test_lowp_dtypes",
              "plugrad.testing.ops.test_linalg_rearrange", "-k", "lowp or einops or rounds or specials or decode"], [tmp_path],
             timeout=600, DEV="CPU")
  out = p.stdout
  assert p.returncode == 1, out
  assert "pip install 'plugrad[conformance]'" in out and "ml_dtypes is the oracle of bfloat16 and fp8" in out
  assert "einops is the oracle of rearrange" in out
  assert "skipped" not in out.splitlines()[-1] and re.search(r"\d+ failed", out.splitlines()[-1]), out.splitlines()[-1]
  assert "1 passed" in out.splitlines()[-1]  # the OCP specials need no oracle
