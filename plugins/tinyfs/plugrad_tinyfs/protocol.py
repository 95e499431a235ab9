"""The tinyfs wire protocol (docs/tinyfs.md), shared by the server and the client.

Every request is one command byte and a fixed header; every reply starts with one status byte.
  STORE b"S" + u32 n + n bytes   n must be CHUNK_SIZE (a data chunk) or PIECE_SIZE (a tree node)
                                 -> OK + the 16-byte hash the server computed (chunk hash or node hash)
  LOAD  b"L" + 16-byte hash      -> OK + u32 n + n bytes, or NOT_FOUND / CORRUPT + message
A request the server can't carry out for a reason of its own (disk full, I/O error) gets SERVER_ERROR + message
("server out of space"); nothing is kept of a STORE that failed. Messages never name the server's files or directories.
  INFO  b"I"                     -> OK + u64 chunks + u64 nodes + u64 bytes stored
Errors: status + u32 n + n bytes of UTF-8 message. Integers are little-endian. A connection carries any number of requests;
after a BAD_REQUEST reply the server closes it (it cannot know where the next request starts).
"""
from __future__ import annotations
import socket
import struct
import time
from plugrad_tinyfs.hashing import CHUNK_SIZE, PIECE_SIZE

STORE, LOAD, INFO = b"S", b"L", b"I"
OK, NOT_FOUND, BAD_REQUEST, CORRUPT, SERVER_ERROR = 0, 1, 2, 3, 4
STATUS_NAMES = {OK: "OK", NOT_FOUND: "NOT_FOUND", BAD_REQUEST: "BAD_REQUEST", CORRUPT: "CORRUPT", SERVER_ERROR: "SERVER_ERROR"}
BLOB_SIZES = (CHUNK_SIZE, PIECE_SIZE)  # the only payload lengths either side accepts
MAX_MSG = 4096  # longest error message accepted

U32, U64 = struct.Struct("<I"), struct.Struct("<Q")

def recv_exact(sock: socket.socket, n: int, what: str, deadline: float | None = None) -> bytes:
  """Exactly n bytes from `sock`; EOFError naming `what` if the peer closes first; with a `deadline` (time.monotonic())
  TimeoutError when they have not all arrived by then, however they trickle in (a per-recv timeout alone can't)."""
  buf, got = bytearray(n), 0
  view = memoryview(buf)
  while got < n:
    if deadline is not None:
      if (left := deadline - time.monotonic()) <= 0: raise TimeoutError(f"{what}: {got} of {n} bytes arrived before the deadline")
      sock.settimeout(left)
    k = sock.recv_into(view[got:], n - got)
    if k == 0: raise EOFError(f"connection closed after {got} of {n} bytes of {what}")
    got += k
  return bytes(buf)

def send_error(sock: socket.socket, status: int, msg: str) -> None:
  m = msg.encode()[:MAX_MSG]
  sock.sendall(bytes([status]) + U32.pack(len(m)) + m)
