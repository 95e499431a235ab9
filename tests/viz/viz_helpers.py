"""Helpers shared by the VIZ tests: free loopback ports and reading a child process's output."""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).parent


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
