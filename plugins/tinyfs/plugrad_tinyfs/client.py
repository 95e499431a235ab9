"""The tinyfs client: `fs_store(t)` puts a tensor's bytes on the server named by TINYFS_ENDPOINT (default localhost:6767)
and returns the 16-byte root hash as a uint8 tensor; `fs_load(root, size)` fetches them back, checking every hash.

Hashes are computed on the host with the hashlib reference (plugrad_tinyfs.hashing). The server recomputes the hash of
every blob it stores and the client checks it, and on load the client checks every node and chunk against the hash it was
asked for, so a corrupted or substituted blob raises TinyFSError instead of returning wrong bytes. Chunk requests are
pipelined one deep: the client hashes chunk i while the server hashes (store) or reads and sends (load) its neighbour.

The hash tree does not encode the data's length (the last chunk is zero-padded), so `store_bytes` also stores a size
record, a 4096-byte node holding (magic, root, size); `load_bytes(root, size)` fetches the record for that (root, size)
last, so asking for more bytes than were stored is an error, not zero padding.
"""
from __future__ import annotations
import os
import socket
from typing import Any
import numpy as np
from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
from plugrad_tinyfs.hashing import CHUNK_SIZE, FANOUT, HASH_SIZE, chunk_hash_ref, h, node_bytes, tree_levels
from plugrad_tinyfs.protocol import (BLOB_SIZES, INFO, LOAD, MAX_MSG, OK, STATUS_NAMES, STORE, U32, U64, recv_exact)

DEFAULT_ENDPOINT = "localhost:6767"

class TinyFSError(RuntimeError):
  """A tinyfs request failed: missing blob, hash mismatch, or an error reply from the server."""

def endpoint() -> tuple[str, int]:
  ep = os.environ.get("TINYFS_ENDPOINT", DEFAULT_ENDPOINT)
  host, sep, port = ep.rpartition(":")
  if not sep or not host or not port.isdigit(): raise ValueError(f"TINYFS_ENDPOINT must be HOST:PORT, got {ep!r}")
  return host, int(port)

class Connection:
  """One TCP connection to a tinyfs server; every socket failure becomes a ConnectionError naming the endpoint."""
  def __init__(self, addr: tuple[str, int] | None = None, timeout: float = 60.0):
    self.addr = addr or endpoint()
    self.name = f"{self.addr[0]}:{self.addr[1]}"
    try: self.sock = socket.create_connection(self.addr, timeout=timeout)
    except OSError as e: raise ConnectionError(f"tinyfs: cannot connect to server at {self.name} (TINYFS_ENDPOINT): {e}") from e
  def __enter__(self) -> Connection: return self
  def __exit__(self, *exc: Any) -> None: self.sock.close()

  def _io(self, fn, *args):
    try: return fn(*args)
    except (EOFError, OSError) as e: raise ConnectionError(f"tinyfs: connection to {self.name} failed mid-transfer: {e}") from e
  def _send(self, data: bytes) -> None: self._io(self.sock.sendall, data)
  def _recv(self, n: int, what: str) -> bytes: return self._io(recv_exact, self.sock, n, what)
  def _status(self, what: str) -> None:
    st = self._recv(1, f"{what} status")[0]
    if st == OK: return
    (n,) = U32.unpack(self._recv(4, "error length"))
    if n > MAX_MSG: raise TinyFSError(f"tinyfs: {self.name} sent an error message of {n} bytes (max {MAX_MSG})")
    msg = self._recv(n, "error message").decode(errors="replace")
    raise TinyFSError(f"tinyfs: {what} failed on {self.name}: {STATUS_NAMES.get(st, st)}: {msg}")

  def store(self, blob: bytes) -> bytes:
    """Store a chunk or node; returns the hash the server computed."""
    self.send_store(blob)
    return self.recv_store()

  def send_store(self, blob: bytes) -> None:
    """The STORE request alone (its reply is read by `recv_store`, in request order)."""
    if len(blob) not in BLOB_SIZES: raise ValueError(f"tinyfs blobs are {BLOB_SIZES} bytes, got {len(blob)}")
    self._send(STORE + U32.pack(len(blob)))
    self._send(blob)

  def recv_store(self) -> bytes:
    self._status("STORE")
    return self._recv(HASH_SIZE, "STORE hash")

  def load(self, digest: bytes, size: int) -> bytes:
    """The blob stored under `digest`, which must be `size` bytes and hash to `digest`."""
    self.send_load(digest)
    return self.recv_load(digest, size)

  def send_load(self, digest: bytes) -> None: self._send(LOAD + digest)

  def recv_load(self, digest: bytes, size: int) -> bytes:
    """The reply to a LOAD of `digest` sent earlier, checked: `size` bytes that hash to `digest`."""
    self._status(f"LOAD {digest.hex()}")
    (n,) = U32.unpack(self._recv(4, "LOAD length"))
    if n != size: raise TinyFSError(f"tinyfs: blob {digest.hex()} on {self.name} has {n} bytes, expected {size}")
    data = self._recv(n, f"blob {digest.hex()}")
    got = chunk_hash_ref(data) if size == CHUNK_SIZE else h(data)
    if got != digest: raise TinyFSError(f"tinyfs: hash mismatch for blob {digest.hex()} from {self.name} (got {got.hex()}): corrupted")
    return data

  def info(self) -> dict[str, int]:
    self._send(INFO)
    self._status("INFO")
    c, n, b = (U64.unpack(self._recv(8, "INFO"))[0] for _ in range(3))
    return {"chunks": c, "nodes": n, "bytes": b}

def _tensor_bytes(t: Any) -> bytes:
  flat = t.reshape(-1)
  if flat.dtype != dtypes.uint8: flat = flat.bitcast(dtypes.uint8).reshape(-1)
  return flat.numpy().tobytes()

def _check_stored(c: Connection, want: bytes) -> None:
  if (got := c.recv_store()) != want: raise TinyFSError(f"tinyfs: {c.name} hashed a blob to {got.hex()}, expected {want.hex()}")

def store_bytes(data: bytes, conn: Connection | None = None) -> bytes:
  """Store `data` (chunks and every tree node); returns the 16-byte root hash."""
  chunk_hashes: list[bytes] = []
  with (conn or Connection()) as c:
    for i in range(0, max(len(data), 1), CHUNK_SIZE):
      chunk = data[i:i + CHUNK_SIZE].ljust(CHUNK_SIZE, b"\0")
      c.send_store(chunk)  # the server hashes and writes this chunk while we hash it here
      if chunk_hashes: _check_stored(c, chunk_hashes[-1])  # the reply to the previous chunk
      chunk_hashes.append(chunk_hash_ref(chunk))
    _check_stored(c, chunk_hashes[-1])
    levels = tree_levels(chunk_hashes)
    for lo, hi in zip(levels, levels[1:]):
      for i in range(0, len(lo), FANOUT):
        c.send_store(node_bytes(lo[i:i + FANOUT]))
        _check_stored(c, hi[i // FANOUT])
    rec = size_record(levels[-1][0], len(data))  # last: a size record only exists once the whole tree is stored
    c.send_store(rec)
    _check_stored(c, h(rec))
  return levels[-1][0]

SIZE_MAGIC = b"PGTFSIZE"

def size_record(root: bytes, size: int) -> bytes:
  """The 4096-byte node that says `size` bytes were stored under `root`."""
  return (SIZE_MAGIC + root + U64.pack(size)).ljust(BLOB_SIZES[1], b"\0")

def level_sizes(size: int) -> list[int]:
  """Number of hashes on each tree level for `size` bytes: [chunks, level 1 nodes, ..., 1]."""
  sizes = [max(-(-size // CHUNK_SIZE), 1)]
  while len(sizes) == 1 or sizes[-1] > 1: sizes.append(-(-sizes[-1] // FANOUT))
  return sizes

def load_bytes(root: bytes, size: int, conn: Connection | None = None) -> bytes:
  """The `size` bytes stored under `root`, every node and chunk checked against its hash."""
  sizes = level_sizes(size)
  with (conn or Connection()) as c:
    hashes = [root]
    for lv in range(len(sizes) - 1, 0, -1):  # walk down: a node at level lv holds up to FANOUT hashes of level lv-1
      kids, n_below = [], sizes[lv - 1]
      for i, dg in enumerate(hashes):
        node, k = c.load(dg, BLOB_SIZES[1]), min(FANOUT, n_below - i * FANOUT)
        if any(node[k * HASH_SIZE:]) or not any(node[(k - 1) * HASH_SIZE:k * HASH_SIZE]):  # zero slots are padding
          raise TinyFSError(f"tinyfs: node {dg.hex()} does not have the {k} children that {size} bytes need: wrong size?")
        kids += [node[j * HASH_SIZE:(j + 1) * HASH_SIZE] for j in range(k)]
      hashes = kids
    out = bytearray(len(hashes) * CHUNK_SIZE)
    c.send_load(hashes[0])
    for i, dg in enumerate(hashes):
      if i + 1 < len(hashes): c.send_load(hashes[i + 1])  # the server reads and sends it while we check this one
      out[i * CHUNK_SIZE:(i + 1) * CHUNK_SIZE] = c.recv_load(dg, CHUNK_SIZE)
    if any(out[size:]): raise TinyFSError(f"tinyfs: padding after byte {size} of {root.hex()} is not zero: wrong size?")
    rec = size_record(root, size)
    try: c.load(h(rec), len(rec))
    except TinyFSError as e:
      if "NOT_FOUND" not in str(e): raise
      raise TinyFSError(f"tinyfs: {root.hex()} was not stored with size {size} (NOT_FOUND: no size record): wrong size?") from None
  return bytes(out[:size])

def fs_store(t: Any) -> Any:
  """Store tensor `t`'s bytes; returns its 16-byte root hash as a uint8 Tensor of shape (16,)."""
  return Tensor(np.frombuffer(store_bytes(_tensor_bytes(t)), np.uint8).copy())

def fs_load(hash_tensor: Any, size: int) -> Any:
  """The `size` bytes stored under the root hash `hash_tensor` (16 uint8 values), as a uint8 Tensor of shape (size,)."""
  if not isinstance(size, int) or isinstance(size, bool) or size < 0: raise ValueError(f"fs_load size must be an int >= 0, got {size!r}")
  if hash_tensor.dtype != dtypes.uint8 or hash_tensor.shape != (HASH_SIZE,):
    raise ValueError(f"fs_load needs a uint8 hash tensor of shape ({HASH_SIZE},), got {hash_tensor.dtype} {hash_tensor.shape}")
  data = load_bytes(hash_tensor.numpy().tobytes(), size)
  return Tensor(np.frombuffer(data, np.uint8).copy())
