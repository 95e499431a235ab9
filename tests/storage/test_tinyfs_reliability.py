"""tinyfs reliability regressions (docs/reliability.md): loading more bytes than were stored is an error, a server that
can't write answers "server out of space" and keeps nothing, error messages never reveal the server's root, and a store
killed mid-way (client or server, kill -9) leaves only whole, correctly named blobs."""
from __future__ import annotations
import os
import resource
import signal
import subprocess
import sys
import time
import numpy as np
import pytest
from plugrad_tinyfs.client import Connection, TinyFSError, load_bytes, store_bytes
from plugrad_tinyfs.hashing import CHUNK_SIZE, chunk_hash_ref, h
from storage_helpers import start_tinyfs, stop_tinyfs

@pytest.fixture
def server(tmp_path, monkeypatch):
  p, ep = start_tinyfs(tmp_path / "blobs")
  monkeypatch.setenv("TINYFS_ENDPOINT", ep)
  yield tmp_path / "blobs"
  stop_tinyfs(p)

def test_load_more_than_stored_is_an_error(server):
  d = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes()
  root = store_bytes(d)
  assert load_bytes(root, 3000) == d
  for size in (3001, 4096, CHUNK_SIZE):  # same tree shape: the hashes alone can't tell, the size record does
    with pytest.raises(TinyFSError, match=f"was not stored with size {size} .*wrong size"): load_bytes(root, size)
  z = store_bytes(b"")
  assert load_bytes(z, 0) == b""
  with pytest.raises(TinyFSError, match="was not stored with size 5"): load_bytes(z, 5)

def test_messages_do_not_reveal_the_root(server):
  with pytest.raises(TinyFSError) as ei: load_bytes(bytes(16), 10)
  assert "NOT_FOUND" in str(ei.value) and str(server) not in str(ei.value) and "blobs" not in str(ei.value)

def _tiny_files():
  resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))  # every file the server writes fails past 64 KiB
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # ... with EFBIG instead of a signal

def test_server_out_of_space(tmp_path, monkeypatch):
  root = tmp_path / "full"
  p, ep = start_tinyfs(root, preexec_fn=_tiny_files)
  monkeypatch.setenv("TINYFS_ENDPOINT", ep)
  try:
    with pytest.raises(TinyFSError, match=r"STORE failed on .*: SERVER_ERROR: server out of space \(File too large\); nothing was stored"):
      store_bytes(b"\1" * 5000)
    assert os.listdir(root) == []  # no partial blob, no temp file
    with Connection() as c:  # the server is still up, and a blob that fits is stored on the same connection after a failure
      with pytest.raises(TinyFSError, match="out of space"): c.store(b"\2" * CHUNK_SIZE)
      assert c.store(b"\3" * 4096) == h(b"\3" * 4096) and c.info()["nodes"] == 1
  finally: stop_tinyfs(p)

CLIENT = """
import os, sys
from plugrad_tinyfs.client import store_bytes
store_bytes(os.urandom(int(sys.argv[1])))
"""

def _verify_blobs(root) -> None:
  """Every file under a hash name holds exactly the blob with that hash; no temporaries."""
  for f in os.listdir(root):
    assert not f.startswith("."), f
    data = (root / f).read_bytes()
    assert data and (chunk_hash_ref(data) if len(data) == CHUNK_SIZE else h(data)).hex() == f

@pytest.mark.parametrize("victim", ["client", "server"])
def test_kill_9_during_store(tmp_path, monkeypatch, victim):
  root = tmp_path / "blobs"
  p, ep = start_tinyfs(root)
  monkeypatch.setenv("TINYFS_ENDPOINT", ep)
  old = np.random.default_rng(1).integers(0, 256, CHUNK_SIZE + 100, dtype=np.uint8).tobytes()
  old_root = store_bytes(old)
  env = {**os.environ, "TINYFS_ENDPOINT": ep}
  c = subprocess.Popen([sys.executable, "-c", CLIENT, str(24 * CHUNK_SIZE)], env=env, stderr=subprocess.PIPE)
  try:
    deadline = time.time() + 60
    while sum(len(n) == 32 for n in os.listdir(root)) < 6 and time.time() < deadline and c.poll() is None: time.sleep(0.005)
    os.kill((c if victim == "client" else p).pid, signal.SIGKILL)  # mid-store: some chunks are on the server, not all
    c.wait(30)
  finally:
    if c.poll() is None: c.kill()
    c.stderr.close()
    stop_tinyfs(p)
  p, ep = start_tinyfs(root)  # a restart clears temporaries a killed server left
  monkeypatch.setenv("TINYFS_ENDPOINT", ep)
  try:
    _verify_blobs(root)
    assert load_bytes(old_root, len(old)) == old  # the old data is whole
  finally: stop_tinyfs(p)
