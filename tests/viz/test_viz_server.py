"""The viewer's server and `python -m plugrad.viz`: a trace saved with VIZ_SAVE reopens, the API answers on 127.0.0.1
only, bad requests get clear errors, and bad files or a busy port are reported instead of crashing."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from plugrad.viz.graph import NodeGraph, replay
from plugrad.viz.trace import load

from viz_helpers import HERE, free_port, wait_for_line

pytest.importorskip("starlette")
pytest.importorskip("graphviz")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  path = tmp_path_factory.mktemp("saved") / "trace.json.gz"
  env = {**os.environ, "VIZ": "1", "PROFILE": "1", "VIZ_SAVE": str(path), "PROFILE_PATH": str(path.with_name("p.json"))}
  r = subprocess.run([sys.executable, str(HERE / "viz_program.py")], env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  assert "VIZ: trace saved to" in r.stderr and "VIZ: open" not in r.stdout, "VIZ_SAVE saves instead of serving"
  return path, json.loads(r.stdout.splitlines()[-1])


def get(url: str) -> tuple[int, dict | str]:
  try:
    with urllib.request.urlopen(url, timeout=60) as r: body, code, ctype = r.read().decode(), r.status, r.headers["content-type"]
  except urllib.error.HTTPError as e: body, code, ctype = e.read().decode(), e.code, e.headers["content-type"]
  return code, json.loads(body) if ctype.startswith("application/json") else body


def test_saved_trace_holds_the_program(saved):
  path, report = saved
  data = load(path)
  assert sorted(g["kernel"]["name"] for g in data["groups"] if g["kind"] == "kernel") == report["kernels"]
  g = NodeGraph(data["nodes"])
  assert all(replay(g, rw) == rw["output"] for rw in data["rewrites"])


def test_server_serves_the_saved_trace_on_loopback(saved):
  path, report = saved
  port = free_port()
  proc = subprocess.Popen([sys.executable, "-m", "plugrad.viz", str(path), "--port", str(port)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try:
    url = wait_for_line(proc, "VIZ: open ").split()[2]
    assert url == f"http://127.0.0.1:{port}/"
    code, page = get(url)
    assert code == 200 and "plugrad viz" in page and "http" not in page.replace(url, "")  # nothing fetched from elsewhere
    code, tr = get(url + "api/trace")
    assert code == 200 and sorted(g["name"] for g in tr["groups"] if g["kind"] == "kernel") == report["kernels"] and tr["profile"]
    gid = next(g["id"] for g in tr["groups"] if g["kind"] == "schedule")
    code, grp = get(url + f"api/group/{gid}")
    rw = next(r for r in grp["rewrites"] if r["steps"] > 0)
    code, last = get(url + f"api/rewrite/{rw['id']}/{rw['steps']}")
    assert code == 200 and last["svg"].startswith("<svg") and last["rule"]["where"] and last["changed"] >= 1
    code, err = get(url + f"api/rewrite/{rw['id']}/{rw['steps'] + 1}")
    assert code == 404 and "not" in err["error"]
    code, err = get(url + "api/group/9999")
    assert code == 404 and "no group 9999" in err["error"]
    code, prof = get(url + "api/profile")
    assert sum(1 for e in prof["traceEvents"] if e.get("cat") == "kernel") == report["launches"]
    with socket.socket() as s:  # bound to loopback only: another local address of this machine is refused
      addrs = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
      if addrs:
        s.settimeout(2)
        assert s.connect_ex((addrs.pop(), port)) != 0
    # the port is taken now: a second server says so
    r = subprocess.run([sys.executable, "-m", "plugrad.viz", str(path), "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "VIZ_PORT" in r.stderr
  finally:
    proc.terminate()
    proc.wait(10)
    proc.stdout.close()


def test_bad_trace_files_are_reported(tmp_path):
  r = subprocess.run([sys.executable, "-m", "plugrad.viz", str(tmp_path / "missing.json")], capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and "no trace file" in r.stderr
  (tmp_path / "bad.json").write_text('{"hello": 1}')
  r = subprocess.run([sys.executable, "-m", "plugrad.viz", str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and "not a plugrad trace" in r.stderr
  (tmp_path / "p.json").write_text(json.dumps({"traceEvents": []}))
  assert load(tmp_path / "p.json")["profile"] == {"traceEvents": []}
