"""RDNA3 emulator coverage and speed (docs/amd.md, BENCHMARKS.md): which instructions the conformance suite's kernels
execute under DEV=MOCK+AMD, whether the emulator's unit tests (tests/amd/emu) exercise each of them, and the
emulator's speed in wave-instructions per second.

  .venv/bin/python bench/amd_emu_coverage.py [--json OUT] [--skip-units] [-k EXPR]

Runs in one process, without xdist, so the counters (plugrad_amd.mock.rdna3.STATS) see every kernel: first
tests/amd/emu (the mnemonics the unit tests decode), then tests/ops with the Makefile's PYTHON_SUBSET under
DEV=MOCK+AMD. A mnemonic counts as executed once its code was decoded (the emulator decodes lazily, on first
execution). Takes a few minutes on one core.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

os.environ["DEV"] = "MOCK+AMD"
ROOT = Path(__file__).resolve().parents[1]


def subset() -> str:
  m = re.search(r"^PYTHON_SUBSET := (.*)$", (ROOT / "Makefile").read_text(), re.M)
  if m is None: raise SystemExit("Makefile has no PYTHON_SUBSET")
  return m.group(1)


class Outcomes:
  def __init__(self) -> None: self.counts: Counter = Counter()
  def pytest_runtest_logreport(self, report) -> None:
    if report.when == "call" or report.outcome != "passed": self.counts[report.outcome] += 1


def run(args: list[str]) -> tuple[int, Counter, float]:
  import pytest
  out = Outcomes()
  t0 = time.perf_counter()
  rc = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist", *args], plugins=[out])
  return int(rc), out.counts, time.perf_counter() - t0


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--json", help="write the figures here")
  ap.add_argument("--skip-units", action="store_true", help="don't run tests/amd/emu first")
  ap.add_argument("-k", default=subset(), help="pytest -k expression for tests/ops (default: the Makefile's PYTHON_SUBSET)")
  a = ap.parse_args()
  from plugrad_amd.mock import rdna3
  units: set[tuple[str, str]] = set()
  if not a.skip_units:
    run([str(ROOT / "tests" / "amd" / "emu")])
    units = set(rdna3.STATS.decoded)
    rdna3.STATS.reset()
  rc, counts, wall = run([str(ROOT / "tests" / "ops"), "-m", "not slow", "-k", a.k])
  st = rdna3.STATS
  conf = set(st.decoded)
  by_enc: dict[str, list[str]] = {}
  for enc, name in sorted(conf): by_enc.setdefault(enc, []).append(name)
  res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg()[0], "pytest_rc": rc, "tests": dict(counts),
         "wall_s": round(wall, 1), "dispatches": st.dispatches, "kernels": len(st.kernels), "wave_instructions": st.instructions,
         "emulator_s": round(st.seconds, 1), "wave_instructions_per_s": round(st.per_second),
         "mnemonics": len(conf), "by_encoding": {e: len(v) for e, v in by_enc.items()}, "executed": {e: v for e, v in by_enc.items()},
         "not_in_unit_tests": sorted(f"{e} {n}" for e, n in conf - units) if units else None, "unit_test_mnemonics": len(units) or None}
  print(f"\nconformance under DEV=MOCK+AMD: {dict(counts)} in {wall:.0f} s (load {res['load']:.1f})")
  print(f"{st.dispatches} dispatches of {len(st.kernels)} kernels, {st.instructions} wave-instructions in {st.seconds:.1f} s of emulation "
        f"= {st.per_second / 1e3:.0f} k wave-instructions/s ({st.per_second * 32 / 1e6:.1f} M lane-instructions/s)")
  print(f"{len(conf)} distinct mnemonics executed:")
  for e, v in by_enc.items(): print(f"  {e:8s} {len(v):3d}  {' '.join(v)}")
  if units: print(f"unit tests (tests/amd/emu) decode {len(units)} mnemonics; executed by the conformance kernels but not by a unit test: "
                  f"{res['not_in_unit_tests'] or 'none'}")
  if a.json: Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
  return 0 if rc == 0 else 1


if __name__ == "__main__": sys.exit(main())
