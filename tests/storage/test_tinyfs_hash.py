"""tinyfs hashing: Keccak-f[1600] written in Tensor ops matches hashlib's SHAKE-128, and the tree scheme is stable."""
import hashlib
import numpy as np
from plugrad_tinyfs.hashing import CHUNK_SIZE, chunk_hash_ref, h, node_bytes, root_hash_ref, shake128_4096, tree_levels

def test_device_shake128_matches_hashlib():
  m = np.random.default_rng(0).integers(0, 256, (3, 4096), dtype=np.uint8)
  m[2] = 0
  out = shake128_4096(m)
  for i in range(3): assert bytes(out[i]) == hashlib.shake_128(m[i].tobytes()).digest(16)

def test_reference_scheme():
  data = bytes(range(256)) * 4100  # CHUNK_SIZE + 1024 bytes: two chunks, the last zero-padded
  assert len(data) == CHUNK_SIZE + 1024
  c0, c1 = chunk_hash_ref(data[:CHUNK_SIZE]), chunk_hash_ref(data[CHUNK_SIZE:])
  assert c1 == chunk_hash_ref(data[CHUNK_SIZE:] + bytes(CHUNK_SIZE - 1024))
  assert root_hash_ref(data) == h((c0 + c1).ljust(4096, b"\0")) == root_hash_ref(bytes(data))
  assert root_hash_ref(data) != root_hash_ref(data[:-1] + b"\1")
  levels = tree_levels([i.to_bytes(2, "little") * 8 for i in range(300)])  # more than one node per level: two levels above the chunks
  assert [len(lv) for lv in levels] == [300, 2, 1] and levels[2][0] == h(node_bytes(levels[1]))
