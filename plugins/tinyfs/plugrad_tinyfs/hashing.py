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
import threading
import numpy as np
from plugrad.device import Device, canonicalize
from plugrad.engine.jit import TinyJit
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops

CHUNK_SIZE = 1 << 20
PIECE_SIZE = 4096
HASH_SIZE = 16
FANOUT = PIECE_SIZE // HASH_SIZE  # 256 child hashes fill one 4096-byte node
RATE = 168  # SHAKE-128 absorbs 168 bytes per permutation
NBLK = -(-(PIECE_SIZE + 1) // RATE)  # 25 blocks of 168 bytes hold a padded 4096-byte message

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
# A batch of NB*W message states is one (NB, 5, 5, W) uint64 tensor [row, y, x, message]: lane x + 5y of message r*W + w
# at [r, y, x, w]. The W states of a row sit side by side for every lane, so each kernel's inner loop runs over W
# independent messages (the C compiler vectorizes it) and all lane index math (mod 5, the pi permutation) is invariant
# in that loop. A round is two elementwise kernels: theta's column parities D (NB, 1, 5, W), then everything else.
# One permutation (absorb + 24 rounds = 48 kernels) is captured once per (device, NB) with TinyJit and replayed.
W = 64  # messages per row
NB_MAX = 256  # rows per batch: 16384 messages (64 MiB of pieces); larger inputs run in batches of this size

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

# lane ops call the ALU primitive directly: shapes and dtypes already match (uint64) and shift amounts are in range
def _xor(a, b): return a._alu(Ops.XOR, b)
def _rotl(a, left, right): return a._alu(Ops.SHL, left)._alu(Ops.OR, a._alu(Ops.SHR, right))  # right = (64 - left) % 64

def _tile(t, axis: int, k: int):
  """`t` repeated k times along `axis` (t[..., i % n, ...] for i < k*n): cyclic shifts become shrinks of it."""
  sh = t.shape
  return t.reshape(*sh[:axis], 1, *sh[axis:]).expand(*sh[:axis], k, *sh[axis:]).reshape(*sh[:axis], k * sh[axis], *sh[axis + 1:])

def _theta_d(a):
  """D[x] = C[x-1] ^ rotl(C[x+1], 1) with C[x] the xor of column x: shape (NB, 1, 5, W)."""
  c = a[:, 0:1]
  for y in range(1, 5): c = _xor(c, a[:, y:y + 1])
  c2 = _tile(c, 2, 2)
  return _xor(c2[:, :, 4:9], _rotl(c2[:, :, 1:6], c._const_like(1), c._const_like(63)))

def _rho_pi_chi_iota(a, d, rot, back, rc):
  """The rest of a round, given theta's D; `rot`/`back` hold the rho rotations, `rc` the round constant at lane 0."""
  nb, w = a.shape[0], a.shape[3]
  s = _xor(a, d.expand(a.shape))
  s = _rotl(s, rot.expand(a.shape), back.expand(a.shape))  # s[y, x]
  # pi: out[Y, X] = s[X, (X + 3Y) % 5] = s[X, 3 * ((Y + 2X) % 5) % 5]: first v[X, j] = s[X, 3j % 5] (stride 3 in a 3x tile),
  # then q[X, Y] = v[X, Y + 2X] (rows of a 3x tile read with a skew of 2: rows of 17 over rows of 15), transposed
  v = _tile(s, 2, 3).reshape(nb, 5, 5, 3, w)[:, :, :, 0]
  q = _tile(v, 2, 3).reshape(nb, 75, w).pad(((0, 0), (0, 10), (0, 0))).reshape(nb, 5, 17, w)[:, :, 0:5]
  b = q.permute(0, 2, 1, 3)
  b2 = _tile(b, 2, 2)  # chi: out[Y, X] = b[Y, X] ^ (~b[Y, X+1] & b[Y, X+2])
  out = _xor(b, _xor(b2[:, :, 1:6], b._const_like(0xFFFFFFFFFFFFFFFF))._alu(Ops.AND, b2[:, :, 2:7]))
  return _xor(out, rc.expand(a.shape))

class _Keccak:
  """Keccak-f[1600] on (NB, 5, 5, W) states on one device: constants uploaded once, one permutation captured by TinyJit."""
  def __init__(self, device: str, nb: int):
    r = np.array(_ROT, np.uint64).reshape(1, 5, 5, 1)
    self.rot, self.back = Tensor(r, device=device).realize(), Tensor((64 - r) % 64, device=device).realize()
    rcs = np.zeros((24, 1, 5, 5, 1), np.uint64)
    rcs[:, 0, 0, 0, 0] = _RC
    self.rcs = [Tensor(rcs[i], device=device).realize() for i in range(24)]
    self.device, self.nb, self.permute = device, nb, TinyJit(self._absorb_permute)

  def _absorb_permute(self, state, block):
    a = _xor(state, block)
    for rc in self.rcs:  # .contiguous(): every round is its own two kernels, and the scheduler reuses their buffers
      a = _rho_pi_chi_iota(a, _theta_d(a).contiguous(), self.rot, self.back, rc).contiguous()
    return a

_keccaks: dict[tuple[str, int], _Keccak] = {}
_lock = threading.Lock()  # a TinyJit replays into the same output buffers: one batch at a time

def _blocks(msgs: np.ndarray, nb: int) -> np.ndarray:
  """The padded SHAKE-128 blocks of (n <= nb*W, 4096) uint8 messages as (NBLK, nb, 5, 5, W) uint64 in the state layout."""
  if msgs.shape[0] < nb * W: msgs = np.concatenate([msgs, np.zeros((nb * W - msgs.shape[0], PIECE_SIZE), np.uint8)])
  m = np.ascontiguousarray(msgs).view("<u8")  # (nb*W, 512) lanes; block k holds lanes 21k .. 21k+20
  out = np.zeros((NBLK, nb, 25, W), np.uint64)
  out[:NBLK - 1, :, :RATE // 8] = m[:, :(NBLK - 1) * (RATE // 8)].reshape(nb, W, NBLK - 1, RATE // 8).transpose(2, 0, 3, 1)
  tail = PIECE_SIZE // 8 - (NBLK - 1) * (RATE // 8)  # 8 message lanes in the last block, then the SHAKE padding
  out[-1, :, :tail] = m[:, (NBLK - 1) * (RATE // 8):].reshape(nb, W, tail).transpose(0, 2, 1)
  out[-1, :, tail] = 0x1F
  out[-1, :, RATE // 8 - 1] = 0x80 << 56
  return out.reshape(NBLK, nb, 5, 5, W)

def _shake_batch(msgs: np.ndarray, device: str | None) -> np.ndarray:
  device = canonicalize(device if device is not None else Device.DEFAULT)
  n = msgs.shape[0]
  nb = 1 << max(-(-n // W) - 1, 0).bit_length()  # rows rounded up to a power of two: few distinct kernel shapes
  blocks = _blocks(msgs, nb)
  with _lock:
    k = _keccaks.get((device, nb)) or _keccaks.setdefault((device, nb), _Keccak(device, nb))
    state = Tensor(np.zeros((nb, 5, 5, W), np.uint64), device=device)
    for blk in blocks: state = k.permute(state, Tensor(blk, device=device)).realize()  # (JIT=0 returns it lazy)
    st = state.numpy()
  return np.ascontiguousarray(st[:, 0, 0:2, :].transpose(0, 2, 1)).reshape(nb * W, 2)[:n].view(np.uint8)

def shake128_4096(msgs: np.ndarray, device: str | None = None) -> np.ndarray:
  """16-byte SHAKE-128 digests of B messages of 4096 bytes (uint8 (B, 4096)), computed on `device` with Tensor ops,
  in batches of up to NB_MAX*W messages."""
  if msgs.ndim != 2 or msgs.shape[1] != PIECE_SIZE or msgs.dtype != np.uint8:
    raise ValueError(f"shake128_4096 needs uint8 messages of shape (B, {PIECE_SIZE}), got {msgs.dtype} {msgs.shape}")
  out = np.empty((msgs.shape[0], HASH_SIZE), np.uint8)
  for i in range(0, msgs.shape[0], NB_MAX * W): out[i:i + NB_MAX * W] = _shake_batch(msgs[i:i + NB_MAX * W], device)
  return out

def root_hash_device(data: bytes | np.ndarray, device: str | None = None) -> tuple[bytes, list[list[bytes]]]:
  """(root, levels) like `tree_levels`, every SHAKE-128 computed on `device`: one batched pass over all pieces (in
  batches of 64 MiB), one over all chunk hashes, one per tree level."""
  raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
  n_chunks = max(-(-raw.size // CHUNK_SIZE), 1)
  buf = np.zeros(n_chunks * CHUNK_SIZE, np.uint8)
  buf[:raw.size] = raw
  piece_h = shake128_4096(buf.reshape(-1, PIECE_SIZE), device).reshape(n_chunks, PIECE_SIZE)  # 256 hashes per chunk
  levels = [[bytes(x) for x in shake128_4096(piece_h, device)]]
  while len(levels) == 1 or len(levels[-1]) > 1:
    cur = levels[-1]
    nodes = np.stack([np.frombuffer(node_bytes(cur[i:i + FANOUT]), np.uint8) for i in range(0, len(cur), FANOUT)])
    levels.append([bytes(x) for x in shake128_4096(nodes, device)])
  return levels[-1][0], levels
