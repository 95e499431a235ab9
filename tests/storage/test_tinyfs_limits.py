"""tinyfs server limits and command line: slow clients can't grow it without bound (a connection limit, a whole-request
deadline), and bad command-line arguments are one clear line and a non-zero exit, not a traceback."""
from __future__ import annotations
import os
import socket
import subprocess
import sys
import time
import pytest
from plugrad_tinyfs.client import load_bytes, store_bytes
from plugrad_tinyfs.hashing import CHUNK_SIZE
from plugrad_tinyfs.protocol import SERVER_ERROR, STORE, U32
from storage_helpers import start_tinyfs, stop_tinyfs

def _status(pid: int) -> dict[str, int]:
  out = {}
  for line in open(f"/proc/{pid}/status"):
    k, v = line.split(":", 1)
    if k in ("Threads", "VmRSS"): out[k] = int(v.split()[0])
  return out

def _slow_clients(ep: str, n: int) -> list[socket.socket]:
  """n connections that each start a 1 MiB STORE, send one byte of it, and stall."""
  host, port = ep.rsplit(":", 1)
  socks = []
  for _ in range(n):
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(STORE + U32.pack(CHUNK_SIZE) + b"x")
    socks.append(s)
  return socks

def _reply(s: socket.socket) -> tuple[int | None, bytes]:
  """(status, message) of an error reply, or (None, b"") when the server closed without one."""
  try:
    st = s.recv(1)
    if not st: return None, b""
    (n,) = U32.unpack(s.recv(4))
    return st[0], s.recv(n)
  except (ConnectionResetError, socket.timeout): return None, b""

def test_slow_clients_are_bounded(tmp_path, monkeypatch):
  """300 slow clients grew the server to 300 threads and 350 MB: one thread each, the per-recv timeout never fired. Now
  at most --max-connections (default 64) are served; the others get SERVER_ERROR "server busy" and are closed."""
  p, ep = start_tinyfs(tmp_path / "blobs")
  socks = []
  try:
    base = _status(p.pid)
    socks = _slow_clients(ep, 150)
    time.sleep(1.0)
    now = _status(p.pid)
    assert now["Threads"] <= 64 + 4, now
    assert now["VmRSS"] - base["VmRSS"] < 100 * 1024, (base, now)  # KiB: 64 pending 1 MiB stores at most
    replies = [_reply(s) for s in socks[-20:]]  # the last ones were refused at once
    assert all(st == SERVER_ERROR and b"server busy" in msg for st, msg in replies), replies[:3]
    for s in socks: s.close()
    socks = []
    time.sleep(0.5)
    monkeypatch.setenv("TINYFS_ENDPOINT", ep)
    data = os.urandom(5000)
    assert load_bytes(store_bytes(data), len(data)) == data  # slots came back
  finally:
    for s in socks: s.close()
    stop_tinyfs(p)

def test_whole_request_deadline(tmp_path, monkeypatch):
  """A request must complete within --request-timeout seconds, however its bytes trickle in (the old timeout was per
  recv: one byte every 299 s kept a connection forever)."""
  p, ep = start_tinyfs(tmp_path / "blobs", args=["--request-timeout", "1.5", "--max-connections", "2"])
  try:
    host, port = ep.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(STORE + U32.pack(CHUNK_SIZE))
    t0 = time.monotonic()
    for _ in range(6):  # a byte every 0.4 s: each recv is quick, the request is not
      time.sleep(0.4)
      try: s.sendall(b"x")
      except OSError: break
    st, msg = _reply(s)
    assert time.monotonic() - t0 < 6 and (st is None or (st == SERVER_ERROR and b"not complete within 1.5 s" in msg)), (st, msg)
    s.close()
    monkeypatch.setenv("TINYFS_ENDPOINT", ep)
    assert load_bytes(store_bytes(b"abc"), 3) == b"abc"
  finally: stop_tinyfs(p)

def _cli(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "plugrad_tinyfs.server", *args], capture_output=True, text=True, timeout=60)

@pytest.mark.parametrize("case", ["root_is_a_file", "port_too_big", "port_negative", "port_in_use", "bad_limit"])
def test_command_line_errors_are_one_line(tmp_path, case):
  """--root <a file> and --port 99999 printed tracebacks."""
  f = tmp_path / "a_file"
  f.write_text("x")
  busy = socket.create_server(("127.0.0.1", 0))
  try:
    args, want = {
      "root_is_a_file": (["--port", "0", "--root", str(f)], "not a directory"),
      "port_too_big": (["--port", "99999", "--root", str(tmp_path / "r")], "port"),
      "port_negative": (["--port", "-1", "--root", str(tmp_path / "r")], "port"),
      "port_in_use": (["--port", str(busy.getsockname()[1]), "--root", str(tmp_path / "r")], "Address already in use"),
      "bad_limit": (["--port", "0", "--max-connections", "0", "--root", str(tmp_path / "r")], "max-connections"),
    }[case]
    r = _cli(*args)
  finally: busy.close()
  assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
  lines = r.stderr.strip().splitlines()
  assert want in lines[-1] and (case not in ("root_is_a_file", "port_in_use") or len(lines) == 1), r.stderr
