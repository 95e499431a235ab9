"""tinyfs hashing: Keccak-f[1600] written in Tensor ops matches hashlib's SHAKE-128, and the tree scheme is stable."""
import hashlib
import numpy as np
import pytest
from plugrad_tinyfs import hashing
from plugrad_tinyfs.hashing import CHUNK_SIZE, chunk_hash_ref, h, node_bytes, root_hash_device, root_hash_ref, shake128_4096, tree_levels

def shake_ref(m: np.ndarray) -> list[bytes]: return [hashlib.shake_128(x.tobytes()).digest(16) for x in m]

def test_device_shake128_matches_hashlib(monkeypatch):
  m = np.random.default_rng(0).integers(0, 256, (70, 4096), dtype=np.uint8)  # 2 rows of 64 states, the second partly padding
  m[2], m[3], m[69] = 0, 255, np.arange(4096) % 251
  assert [bytes(x) for x in shake128_4096(m)] == shake_ref(m)
  assert [bytes(x) for x in shake128_4096(m[:3])] == shake_ref(m[:3])
  monkeypatch.setattr(hashing, "NB_MAX", 1)  # batches of 64 messages: the batching loop and the replayed capture
  assert [bytes(x) for x in shake128_4096(m)] == shake_ref(m)

def test_device_root_hash_matches_reference(monkeypatch):
  monkeypatch.setattr(hashing, "NB_MAX", 2)  # the pieces in 4 batches of 128 (and the kernel shapes the test above compiled)
  data = np.random.default_rng(1).integers(0, 256, CHUNK_SIZE + 1024, dtype=np.uint8).tobytes()  # 2 chunks, 512 pieces
  root, levels = root_hash_device(data)
  assert root == root_hash_ref(data) and levels == tree_levels([chunk_hash_ref(data[:CHUNK_SIZE]), chunk_hash_ref(data[CHUNK_SIZE:])])
  assert root_hash_device(b"")[0] == root_hash_ref(b"")

def test_device_shake128_bad_input():
  with pytest.raises(ValueError, match=r"shape \(B, 4096\)"): shake128_4096(np.zeros((2, 100), np.uint8))
  with pytest.raises(ValueError, match="uint8"): shake128_4096(np.zeros((2, 4096), np.int32))

def test_reference_scheme():
  data = bytes(range(256)) * 4100  # CHUNK_SIZE + 1024 bytes: two chunks, the last zero-padded
  assert len(data) == CHUNK_SIZE + 1024
  c0, c1 = chunk_hash_ref(data[:CHUNK_SIZE]), chunk_hash_ref(data[CHUNK_SIZE:])
  assert c1 == chunk_hash_ref(data[CHUNK_SIZE:] + bytes(CHUNK_SIZE - 1024))
  assert root_hash_ref(data) == h((c0 + c1).ljust(4096, b"\0")) == root_hash_ref(bytes(data))
  assert root_hash_ref(data) != root_hash_ref(data[:-1] + b"\1")
  levels = tree_levels([i.to_bytes(2, "little") * 8 for i in range(300)])  # more than one node per level: two levels above the chunks
  assert [len(lv) for lv in levels] == [300, 2, 1] and levels[2][0] == h(node_bytes(levels[1]))
