"""Tensor.from_url and plugrad.download.fetch against a real HTTP server on loopback (started here) and file:// URLs:
content, gunzip, the cache under PLUGRAD_CACHE_DIR, and clear errors for 404, timeouts, short bodies, size and sha256
mismatches; a hypothesis fuzzer over served bodies and over URL strings. Also: nothing in core downloads by itself."""
from __future__ import annotations

import ast
import gzip
import hashlib
import http.server
import pathlib
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plugrad
from plugrad.download import DownloadError, downloads_dir, fetch
from plugrad.tensor import Tensor

BODIES: dict[str, bytes] = {}
HITS: dict[str, int] = {}


class _Handler(http.server.BaseHTTPRequestHandler):
  def log_message(self, *args): pass

  def do_GET(self):
    path = self.path.split("?")[0]
    HITS[path] = HITS.get(path, 0) + 1
    if path == "/slow":
      time.sleep(1.5)
    if path == "/short":  # promises more than it sends, then closes
      self.send_response(200); self.send_header("Content-Length", "100"); self.end_headers()
      self.wfile.write(b"x" * 10); self.wfile.flush()
      self.close_connection = True
      return
    if path == "/stall":  # headers, then nothing for longer than the client's timeout
      self.send_response(200); self.send_header("Content-Length", "10"); self.end_headers(); self.wfile.flush()
      time.sleep(1.5)
      return
    body = BODIES.get(path)
    if body is None:
      self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers()
      return
    self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
    self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  srv.daemon_threads = True
  th = threading.Thread(target=srv.serve_forever, daemon=True)
  th.start()
  yield f"http://127.0.0.1:{srv.server_address[1]}"
  srv.shutdown()
  srv.server_close()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path / "cache"))
  return tmp_path / "cache"


def test_http_download_is_cached_under_plugrad_cache_dir(server, cache):
  BODIES["/w.bin"] = bytes(range(256)) * 3
  t = Tensor.from_url(f"{server}/w.bin")
  assert t.dtype == plugrad.dtypes.uint8 and t.shape == (768,) and t.device.startswith("DISK:")
  assert bytes(t.to("CPU").numpy()) == BODIES["/w.bin"]
  assert downloads_dir() == cache / "downloads" and len(list(downloads_dir().iterdir())) == 1
  hits = HITS["/w.bin"]
  Tensor.from_url(f"{server}/w.bin")  # from the cache: no second request
  assert HITS["/w.bin"] == hits
  fetch(f"{server}/w.bin", use_cache=False)
  assert HITS["/w.bin"] == hits + 1
  np.testing.assert_array_equal(Tensor.from_url(f"{server}/w.bin", device="CPU").numpy(), np.frombuffer(BODIES["/w.bin"], np.uint8))


def test_gunzip_name_size_and_sha256(server):
  raw = b"plugrad " * 1000
  BODIES["/a.gz"] = gzip.compress(raw)
  p = fetch(f"{server}/a.gz", gunzip=True, name="a.bin", size=len(raw), sha256=hashlib.sha256(raw).hexdigest())
  assert p.name == "a.bin.gunzip" and p.read_bytes() == raw
  with pytest.raises(DownloadError, match="size mismatch"): fetch(f"{server}/a.gz", gunzip=True, name="b.bin", size=len(raw) + 1)
  with pytest.raises(DownloadError, match="sha256 mismatch"): fetch(f"{server}/a.gz", gunzip=True, name="c.bin", sha256="0" * 64)
  assert not any(downloads_dir().glob("b.bin*")) and not any(downloads_dir().glob("*.part"))  # failed downloads leave nothing
  BODIES["/bad.gz"] = b"not gzip at all"
  with pytest.raises(DownloadError, match="gzip"): fetch(f"{server}/bad.gz", gunzip=True)
  BODIES["/trunc.gz"] = gzip.compress(raw)[:-20]
  with pytest.raises(DownloadError, match="gzip"): fetch(f"{server}/trunc.gz", gunzip=True)


def test_http_errors_are_clear(server):
  with pytest.raises(DownloadError, match=r"HTTP 404"): Tensor.from_url(f"{server}/missing")
  with pytest.raises(DownloadError, match="timed out"): fetch(f"{server}/slow", timeout=0.3)
  with pytest.raises(DownloadError, match="timed out|connection"): fetch(f"{server}/stall", timeout=0.3)
  with pytest.raises(DownloadError, match="size mismatch|connection failed"): fetch(f"{server}/short")
  with pytest.raises(DownloadError): fetch("http://127.0.0.1:1/nothing-listens-here", timeout=2)
  assert not any(downloads_dir().glob("*")) if downloads_dir().exists() else True


def test_file_urls(tmp_path):
  f = tmp_path / "x.bin"
  f.write_bytes(b"\x01\x02\x03")
  assert fetch(f.as_uri()) == f  # the file itself, no copy
  assert Tensor.from_url(f.as_uri(), device="CPU").tolist() == [1, 2, 3]
  g = tmp_path / "x.gz"
  g.write_bytes(gzip.compress(b"abc"))
  assert fetch(g.as_uri(), gunzip=True).read_bytes() == b"abc"
  with pytest.raises(DownloadError, match="no such file"): fetch((tmp_path / "nope").as_uri())
  with pytest.raises(DownloadError, match="size mismatch"): fetch(f.as_uri(), size=4)


@pytest.mark.parametrize("bad", ["ftp://x/y", "/etc/passwd", "relative/path", "", "javascript:alert(1)"])
def test_other_schemes_are_refused(bad):
  with pytest.raises(ValueError, match="http"): fetch(bad)


def test_bad_arguments():
  with pytest.raises(TypeError): fetch(b"http://x")  # type: ignore[arg-type]
  with pytest.raises(ValueError, match="size"): fetch("http://127.0.0.1/x", size=-1)
  with pytest.raises(ValueError, match="name"): fetch("http://127.0.0.1/x", name="../evil")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=5000), gz=st.booleans())
def test_fuzz_served_bodies_round_trip(server, body, gz):
  key = "/f" + hashlib.sha256(body).hexdigest()[:16] + ("z" if gz else "")
  BODIES[key] = gzip.compress(body) if gz else body
  p = fetch(f"{server}{key}", gunzip=gz, use_cache=False)
  assert p.read_bytes() == body


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(url=st.text(max_size=60))
def test_fuzz_url_strings_fail_cleanly(url):
  """Any string either fetches or raises ValueError/DownloadError (never another exception, never a hang)."""
  if url.lower().startswith(("http:", "https:")): url = "http://127.0.0.1:1/" + url  # nothing listens on port 1
  try: fetch(url, timeout=2)
  except (ValueError, DownloadError): pass


def test_nothing_in_core_downloads_by_itself():
  """Only plugrad.download touches urllib, and only Tensor.from_url calls it: no implicit network access."""
  root = pathlib.Path(plugrad.__file__).parent
  for path in root.rglob("*.py"):
    tree = ast.parse(path.read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
           {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    rel = path.relative_to(root).as_posix()
    if any(m.startswith(("urllib", "http.client", "requests")) for m in mods): assert rel == "download.py", rel  # HTTP clients
    if "plugrad.download" in mods: assert rel == "tensor.py", rel
    if rel == "tensor.py":
      calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "fetch"]
      fns = [f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and any(c in ast.walk(f) for c in calls)]
      assert fns == ["from_url"], fns
