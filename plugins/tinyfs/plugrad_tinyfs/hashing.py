"""The tinyfs hash scheme (docs/tinyfs.md), twice: a pure-Python reference on hashlib, and the same computed on a device
with Keccak-f[1600] written as Tensor ops.

H(m) = the 16-byte SHAKE-128 digest of m. Every hashed message is exactly 4096 bytes:
  piece hash  = H(4 KiB piece)
  chunk hash  = H(the 256 piece hashes of a 1 MiB chunk, concatenated); the last chunk is zero-padded to 1 MiB
  tree node   = H(up to FANOUT=256 child hashes concatenated, zero-padded to 4096 bytes)
Levels of nodes are built over the chunk hashes until one node remains: the root (at least one level, even for 1 chunk).
"""
from __future__ import annotations
import hashlib
import numpy as np
from plugrad.uop.ops import Ops

CHUNK_SIZE = 1 << 20
PIECE_SIZE = 4096
HASH_SIZE = 16
FANOUT = PIECE_SIZE // HASH_SIZE  # 256 child hashes fill one 4096-byte node
RATE = 168  # SHAKE-128 absorbs 168 bytes per permutation

def h(m: bytes) -> bytes: return hashlib.shake_128(m).digest(HASH_SIZE)

def chunk_hash_ref(chunk: bytes) -> bytes:
  chunk = chunk.ljust(CHUNK_SIZE, b"\0")
  return h(b"".join(h(chunk[i:i + PIECE_SIZE]) for i in range(0, CHUNK_SIZE, PIECE_SIZE)))

def node_bytes(children: list[bytes]) -> bytes: return b"".join(children).ljust(PIECE_SIZE, b"\0")

def tree_levels(chunk_hashes: list[bytes]) -> list[list[bytes]]:
  """[chunk hashes, level 1 node hashes, ..., [root]] for a list of chunk hashes (hashing with the reference H)."""
  levels = [list(chunk_hashes)]
  while len(levels) == 1 or len(levels[-1]) > 1:
    cur = levels[-1]
    levels.append([h(node_bytes(cur[i:i + FANOUT])) for i in range(0, len(cur), FANOUT)])
  return levels

def root_hash_ref(data: bytes) -> bytes:
  """The tinyfs root hash of `data`, with hashlib only."""
  chunks = [data[i:i + CHUNK_SIZE] for i in range(0, max(len(data), 1), CHUNK_SIZE)]
  return tree_levels([chunk_hash_ref(c) for c in chunks])[-1][0]

# ---------------------------------------------------------------------------- Keccak-f[1600] as Tensor ops

_RC = [0x0000000000000001, 0x0000000000008082, 0x800000000000808A, 0x8000000080008000, 0x000000000000808B, 0x0000000080000001,
       0x8000000080008081, 0x8000000000008009, 0x000000000000008A, 0x0000000000000088, 0x0000000080008009, 0x000000008000000A,
       0x000000008000808B, 0x800000000000008B, 0x8000000000008089, 0x8000000000008003, 0x8000000000008002, 0x8000000000000080,
       0x000000000000800A, 0x800000008000000A, 0x8000000080008081, 0x8000000000008080, 0x0000000080000001, 0x8000000080008008]

def _rho_offsets() -> list[int]:
  """Rotation of lane x + 5y, from the (t+1)(t+2)/2 walk of the Keccak spec."""
  r, (x, y) = [0] * 25, (1, 0)
  for t in range(24): r[x + 5 * y], (x, y) = ((t + 1) * (t + 2) // 2) % 64, (y, (2 * x + 3 * y) % 5)
  return r
_ROT = _rho_offsets()

# the lane ops call the ALU primitive directly: shapes and dtypes already match and shift amounts are in range
def _xor(a, b): return a._alu(Ops.XOR, b)
def _rotl(a, n: int): return a if n == 0 else a._alu(Ops.SHL, a._const_like(n))._alu(Ops.OR, a._alu(Ops.SHR, a._const_like(64 - n)))

def _round(state, rc):
  """One Keccak-f[1600] round on a (B, 25) uint64 state tensor (lane x + 5y); `rc` is a (1,) uint64 tensor."""
  from plugrad.tensor import Tensor
  B = state.shape[0]
  a = [state.shrink(((0, B), (i, i + 1))) for i in range(25)]
  c = [_xor(_xor(_xor(_xor(a[x], a[x + 5]), a[x + 10]), a[x + 15]), a[x + 20]) for x in range(5)]
  d = [_xor(c[(x - 1) % 5], _rotl(c[(x + 1) % 5], 1)) for x in range(5)]
  a = [_xor(a[i], d[i % 5]) for i in range(25)]
  b: list = [None] * 25
  for x in range(5):
    for y in range(5): b[y + 5 * ((2 * x + 3 * y) % 5)] = _rotl(a[x + 5 * y], _ROT[x + 5 * y])
  ones = a[0]._const_like(0xFFFFFFFFFFFFFFFF)
  out = [_xor(b[x + 5 * y], _xor(b[(x + 1) % 5 + 5 * y], ones)._alu(Ops.AND, b[(x + 2) % 5 + 5 * y])) for y in range(5) for x in range(5)]
  out[0] = _xor(out[0], rc.reshape(1, 1).expand(B, 1))
  return Tensor.cat(*out, dim=1)

def shake128_4096(msgs: np.ndarray, device: str | None = None) -> np.ndarray:
  """16-byte SHAKE-128 digests of B messages of 4096 bytes (uint8 (B, 4096)), computed on `device` with Tensor ops."""
  from plugrad.dtype import dtypes
  from plugrad.tensor import Tensor
  B = msgs.shape[0]
  nblk = -(-(PIECE_SIZE + 1) // RATE)
  padded = np.zeros((B, nblk * RATE), np.uint8)
  padded[:, :PIECE_SIZE] = msgs
  padded[:, PIECE_SIZE] ^= 0x1F
  padded[:, -1] ^= 0x80
  lanes = padded.view("<u8").reshape(B, nblk, RATE // 8)
  state = Tensor(np.zeros((B, 25), np.uint64), device=device)
  rcs = [Tensor(np.array([rc], np.uint64), device=device) for rc in _RC]
  for k in range(nblk):  # every block is its own input buffer, so all absorbs share one compiled kernel (as do the rounds)
    blk = Tensor(np.ascontiguousarray(np.pad(lanes[:, k], ((0, 0), (0, 25 - RATE // 8)))), device=device)
    state = (state ^ blk).realize()
    for r in range(24): state = _round(state, rcs[r]).realize()
  out = state.shrink(((0, B), (0, 2))).contiguous().realize().bitcast(dtypes.uint8)
  return out.numpy().reshape(B, HASH_SIZE)

def root_hash_device(data: bytes, device: str | None = None) -> tuple[bytes, list[list[bytes]]]:
  """(root, levels) like `tree_levels`, every SHAKE-128 computed on `device` (pieces of all chunks in one batch)."""
  n_chunks = max(-(-len(data) // CHUNK_SIZE), 1)
  buf = np.zeros(n_chunks * CHUNK_SIZE, np.uint8)
  buf[:len(data)] = np.frombuffer(data, np.uint8)
  piece_h = shake128_4096(buf.reshape(-1, PIECE_SIZE), device).reshape(n_chunks, PIECE_SIZE)  # 256 hashes per chunk
  level = [bytes(x) for x in shake128_4096(piece_h, device)]
  levels = [level]
  while len(levels) == 1 or len(levels[-1]) > 1:
    cur = levels[-1]
    nodes = np.stack([np.frombuffer(node_bytes(cur[i:i + FANOUT]), np.uint8) for i in range(0, len(cur), FANOUT)])
    levels.append([bytes(x) for x in shake128_4096(nodes, device)])
  return levels[-1][0], levels
