"""tinyfs server + client against a real server process on a free loopback port; the hashlib reference is the oracle."""
from __future__ import annotations
import os
import socket
import subprocess
import threading
import numpy as np
import pytest
from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
from plugrad_tinyfs.client import Connection, TinyFSError, fs_load, fs_store, load_bytes, store_bytes
from plugrad_tinyfs.hashing import CHUNK_SIZE, chunk_hash_ref, root_hash_ref
from plugrad_tinyfs.protocol import BAD_REQUEST, INFO, STORE, U32
from storage_helpers import start_tinyfs as start_server

def stop_server(p: subprocess.Popen) -> None:
  p.terminate()
  p.wait(10)

@pytest.fixture
def server(tmp_path, monkeypatch):
  p, ep = start_server(tmp_path / "blobs")
  monkeypatch.setenv("TINYFS_ENDPOINT", ep)
  yield tmp_path / "blobs"
  stop_server(p)

def rand_bytes(n: int, seed: int) -> np.ndarray: return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)

def test_round_trip_one_chunk(server):
  x = np.random.default_rng(0).standard_normal((30, 10)).astype(np.float32)
  h = fs_store(Tensor(x))
  assert h.shape == (16,) and h.dtype == dtypes.uint8
  assert h.numpy().tobytes() == root_hash_ref(x.tobytes())
  back = fs_load(h, x.nbytes)
  assert back.shape == (x.nbytes,) and back.numpy().tobytes() == x.tobytes()
  assert fs_load(fs_store(Tensor(np.zeros(0, np.float32))), 0).shape == (0,)

def test_tensor_methods_round_trip(server):
  x = np.random.default_rng(5).standard_normal(CHUNK_SIZE // 4 + 300).astype(np.float32)  # two chunks, the last one short
  h = Tensor(x).fs_store()  # added to Tensor by this plugin's plugrad_tensor_methods hook
  assert h.shape == (16,) and h.dtype == dtypes.uint8 and h.numpy().tobytes() == root_hash_ref(x.tobytes())
  back = h.fs_load(x.nbytes)
  assert back.shape == (x.nbytes,) and np.array_equal(back.numpy().view(np.float32), x)
  assert Tensor(x[::-1].copy()).fs_store().numpy().tobytes() != h.numpy().tobytes()

def test_round_trip_two_chunks_same_hash(server):
  d = rand_bytes(CHUNK_SIZE + 1024, 1)
  h1 = fs_store(Tensor(d)).numpy().tobytes()
  assert h1 == root_hash_ref(d.tobytes()) == fs_store(Tensor(d.copy())).numpy().tobytes()
  d2 = d.copy()
  d2[-1] ^= 1
  assert fs_store(Tensor(d2)).numpy().tobytes() != h1
  assert np.array_equal(fs_load(Tensor(np.frombuffer(h1, np.uint8).copy()), d.size).numpy(), d)
  with Connection() as c: assert c.info()["chunks"] == 3  # two chunks of d, one changed last chunk of d2

def test_persistence_across_restart(tmp_path, monkeypatch):
  d = rand_bytes(5000, 2).tobytes()
  p, ep = start_server(tmp_path / "b")
  monkeypatch.setenv("TINYFS_ENDPOINT", ep)
  root = store_bytes(d)
  stop_server(p)
  p, ep = start_server(tmp_path / "b")
  monkeypatch.setenv("TINYFS_ENDPOINT", ep)
  try: assert load_bytes(root, len(d)) == d
  finally: stop_server(p)

def test_corrupted_and_missing_chunk(server):
  d = rand_bytes(CHUNK_SIZE + 1024, 3).tobytes()
  root = store_bytes(d)
  f = server / chunk_hash_ref(d[CHUNK_SIZE:]).hex()
  good = f.read_bytes()
  f.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
  with pytest.raises(TinyFSError, match="hash mismatch"): load_bytes(root, len(d))
  f.write_bytes(good[:-1])
  with pytest.raises(TinyFSError, match="CORRUPT"): load_bytes(root, len(d))
  f.unlink()
  with pytest.raises(TinyFSError, match=f"NOT_FOUND.*{f.name}"): load_bytes(root, len(d))
  with pytest.raises(TinyFSError, match="NOT_FOUND"): load_bytes(bytes(16), 10)
  store_bytes(d)  # storing again heals it
  assert load_bytes(root, len(d)) == d

def test_wrong_size_and_bad_arguments(server):
  d = rand_bytes(3000, 4).tobytes()
  root = store_bytes(d)
  with pytest.raises(TinyFSError, match="padding"): load_bytes(root, 2000)
  with pytest.raises(TinyFSError, match="children"): load_bytes(root, 3 * CHUNK_SIZE)
  with pytest.raises(ValueError, match="size"): fs_load(Tensor(np.frombuffer(root, np.uint8).copy()), -1)
  with pytest.raises(ValueError, match=r"shape \(16,\)"): fs_load(Tensor(np.zeros(8, np.uint8)), 10)

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]

def test_server_not_running(monkeypatch):
  ep = f"127.0.0.1:{free_port()}"
  monkeypatch.setenv("TINYFS_ENDPOINT", ep)
  with pytest.raises(ConnectionError, match=ep): fs_store(Tensor(np.zeros(4, np.uint8)))
  monkeypatch.setenv("TINYFS_ENDPOINT", "nonsense")
  with pytest.raises(ValueError, match="HOST:PORT"): fs_store(Tensor(np.zeros(4, np.uint8)))

def test_dropped_connection(monkeypatch):
  lsock = socket.create_server(("127.0.0.1", 0))
  def drop():  # a server that reads part of the first request, then hangs up
    c, _ = lsock.accept()
    c.recv(1000)
    c.close()
  t = threading.Thread(target=drop, daemon=True)
  t.start()
  ep = f"127.0.0.1:{lsock.getsockname()[1]}"
  monkeypatch.setenv("TINYFS_ENDPOINT", ep)
  try:
    with pytest.raises(ConnectionError, match=f"{ep}.*mid-transfer"): store_bytes(b"abc")
  finally:
    t.join(5)
    lsock.close()

def test_bad_requests_rejected(server):
  ep = os.environ["TINYFS_ENDPOINT"].rsplit(":", 1)
  for req in (STORE + U32.pack(0xFFFFFFFF), STORE + U32.pack(12345), b"Z"):
    with socket.create_connection((ep[0], int(ep[1])), timeout=10) as s:
      s.sendall(req)
      assert s.recv(1) == bytes([BAD_REQUEST])
      (n,) = U32.unpack(s.recv(4))
      assert 0 < n < 200 and s.recv(n)
      assert s.recv(1) == b""  # the server closed the connection without reading a payload
  with socket.create_connection((ep[0], int(ep[1])), timeout=10) as s:
    s.sendall(INFO)
    assert s.recv(1) == b"\0"

def test_concurrent_clients(server):
  datas = [rand_bytes(CHUNK_SIZE + 1024 * (i + 1), 10 + i).tobytes() for i in range(2)]
  roots, errs = [None, None], []
  def work(i):
    try:
      roots[i] = store_bytes(datas[i])
      assert load_bytes(roots[i], len(datas[i])) == datas[i]
    except Exception as e: errs.append(e)
  ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
  for t in ts: t.start()
  for t in ts: t.join(60)
  assert not errs, errs
  assert roots == [root_hash_ref(d) for d in datas]
