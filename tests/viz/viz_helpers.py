"""Helpers shared by the VIZ tests: free loopback ports and reading a child process's output."""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).parent
# instructions in the big waves trace the browser test scrolls (tests import it from here: `from conftest import` finds
# whichever conftest module was imported first, tests/amd/emu's when both directories run in one worker)
BIG_WAVES_INSTS = 50_000


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def wait_for_line(proc: subprocess.Popen, prefix: str, timeout: float = 120) -> str:
  """The first stdout line of `proc` starting with `prefix` (fails with the process's output if it exits first)."""
  deadline = time.time() + timeout
  seen = []
  while time.time() < deadline:
    line = proc.stdout.readline()
    if not line:
      if proc.poll() is not None: break
      continue
    seen.append(line)
    if line.startswith(prefix): return line
  proc.kill()
  raise AssertionError(f"no line starting with {prefix!r}; output:\n{''.join(seen)}")


# a hand-built device instruction trace (what SQTT gives on AMD): waves on two SIMDs of one CU, the ones on SIMD1 without
# instructions, slot 0 of SIMD0 used twice; durations chosen so the hot-instruction sums are easy to check by hand
PROGRAM = {0: ("s_load_b64 s[0:1], s[0:1], 0x0", "SMEM"), 8: ("s_waitcnt lgkmcnt(0)", "WAIT"), 12: ("v_add_f32_e32 v1, v2, v3", "VALU"),
           16: ("s_endpgm", "OTHER")}
WAVES = [  # (se, cu, simd, slot, start, end, [(pc, cycle, duration)])
  (0, 0, 0, 0, 10, 60, [(0, 10, 4), (8, 14, 20), (12, 34, 1), (16, 35, 1)]),
  (0, 0, 0, 1, 12, 70, [(0, 12, 5), (8, 17, 30), (12, 47, 2), (16, 49, 1)]),
  (0, 0, 1, 0, 15, 50, []),
  (0, 0, 1, 1, 20, 55, []),
  (0, 0, 0, 0, 65, 90, [(0, 65, 3), (8, 68, 10), (12, 78, 1), (16, 79, 1)]),
]
HOT = [  # per PC: (pc, text, count, total cycles), by total: worked out by hand from WAVES
  (8, "s_waitcnt lgkmcnt(0)", 3, 60), (0, "s_load_b64 s[0:1], s[0:1], 0x0", 3, 12), (12, "v_add_f32_e32 v1, v2, v3", 3, 4), (16, "s_endpgm", 3, 3)]


def synthetic_kernel_trace(kernel: str = "r_test", device: str = "AMD", st: int = 0, clock_hz: float = 2e9):
  """The hand-built trace above as a capture.KernelTrace."""
  from plugrad.viz.capture import KernelTrace, WaveInst, WaveTrace
  waves = [WaveTrace(se, cu, simd, slot, a, b, [WaveInst(pc, PROGRAM[pc][0], c, d, PROGRAM[pc][1]) for pc, c, d in insts])
           for se, cu, simd, slot, a, b, insts in WAVES]
  return KernelTrace(device, kernel, st, clock_hz, waves)


def big_kernel_trace(n_insts: int, kernel: str = "r_big", device: str = "AMD", st: int = 0, per_wave: int = 500):
  """A launch with about `n_insts` instructions over n_insts/per_wave waves spread over 2 SEs x 4 CUs x 4 SIMDs x 8
  slots (for checking the viewer stays responsive)."""
  from plugrad.viz.capture import KernelTrace, WaveInst, WaveTrace
  kinds = ["VALU", "SALU", "SMEM", "VMEM", "LDS", "BRANCH", "WAIT", "BARRIER", "OTHER"]
  waves = []
  for w in range(max(n_insts // per_wave, 1)):
    slot, simd, cu, se = w % 8, (w // 8) % 4, (w // 32) % 4, (w // 128) % 2
    start = (w // 256) * (per_wave * 6 + 50) + slot * 7
    insts, c = [], start
    for j in range(per_wave):
      d = 1 + (j * 7 + w) % 11
      insts.append(WaveInst(4 * (j % 64), f"v_op_{j % 64} v{j % 16}", c, d, kinds[(j + w) % len(kinds)]))
      c += d
    waves.append(WaveTrace(se, cu, simd, slot, start, c, insts))
  return KernelTrace(device, kernel, st, 2.5e9, waves)
