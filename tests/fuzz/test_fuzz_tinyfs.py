"""Fuzzing tinyfs frames in both directions.

Server: a real server (in this process, on loopback) gets random request streams (valid and hostile commands, lengths,
payloads, cut anywhere); a model of the protocol (docs/tinyfs.md) predicts the exact reply bytes, the server must stay up,
and every blob on disk must hash to its name. Client: random reply bytes from a peer socket must give a checked result
or TinyFSError / ConnectionError, never another exception or a hang."""
from __future__ import annotations
import os
import socket
import tempfile
import threading
from pathlib import Path
from fuzz_helpers import bounded
from hypothesis import event, given
from hypothesis import strategies as st
from plugrad_tinyfs.client import Connection, TinyFSError
from plugrad_tinyfs.hashing import CHUNK_SIZE, PIECE_SIZE, chunk_hash_ref, h
from plugrad_tinyfs.protocol import BAD_REQUEST, BLOB_SIZES, NOT_FOUND, OK, U32, U64
from plugrad_tinyfs.server import Server, blob_hash

NODES = [bytes([i]) * PIECE_SIZE for i in range(4)]  # a small pool, so LOADs often hit stored blobs
CHUNK = bytes(range(256)) * (CHUNK_SIZE // 256)

class _Model:
  """What the server must answer: the protocol applied to a byte stream, with the set of blobs it holds."""
  def __init__(self) -> None: self.blobs: dict[bytes, bytes] = {}

  def replies(self, stream: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(stream):
      cmd, i = stream[i:i + 1], i + 1
      if cmd == b"S":
        if i + 4 > len(stream): break
        (n,) = U32.unpack(stream[i:i + 4]); i += 4
        if n not in BLOB_SIZES: out += self._err(BAD_REQUEST); break
        if i + n > len(stream): break
        blob, i = stream[i:i + n], i + n
        d = blob_hash(blob)
        self.blobs[d] = blob
        out += bytes([OK]) + d
      elif cmd == b"L":
        if i + 16 > len(stream): break
        d, i = stream[i:i + 16], i + 16
        out += bytes([OK]) + U32.pack(len(self.blobs[d])) + self.blobs[d] if d in self.blobs else self._err(NOT_FOUND)
      elif cmd == b"I":
        sizes = [len(b) for b in self.blobs.values()]
        out += bytes([OK]) + U64.pack(sizes.count(CHUNK_SIZE)) + U64.pack(len(sizes) - sizes.count(CHUNK_SIZE)) + U64.pack(sum(sizes))
      else: out += self._err(BAD_REQUEST); break
    return bytes(out)

  @staticmethod
  def _err(status: int) -> bytes: return b"\0ERR" + bytes([status])  # placeholder: error messages are compared by status only

_root = Path(tempfile.mkdtemp(prefix="plugrad-fuzz-tinyfs-"))
_srv = Server(("127.0.0.1", 0), _root)
threading.Thread(target=_srv.serve_forever, daemon=True).start()
_model = _Model()

def _request(draw) -> bytes:
  kind = draw(st.sampled_from(["store_node", "store_chunk", "store_badlen", "load_known", "load_random", "info", "junk"]))
  if kind == "store_node": return b"S" + U32.pack(PIECE_SIZE) + draw(st.sampled_from(NODES))
  if kind == "store_chunk": return b"S" + U32.pack(CHUNK_SIZE) + CHUNK
  if kind == "store_badlen": return b"S" + U32.pack(draw(st.one_of(st.integers(0, 70000), st.just(2**32 - 1)))) + draw(st.binary(max_size=16))
  if kind == "load_known": return b"L" + draw(st.sampled_from([h(n) for n in NODES] + [chunk_hash_ref(CHUNK)]))
  if kind == "load_random": return b"L" + draw(st.binary(min_size=16, max_size=16))
  if kind == "info": return b"I"
  return draw(st.binary(min_size=1, max_size=8))

@st.composite
def request_stream(draw) -> bytes:
  s = b"".join(_request(draw) for _ in range(draw(st.integers(1, 4))))
  return s[:draw(st.integers(0, len(s)))] if draw(st.integers(0, 3)) == 0 else s

def _split_errors(got: bytes, want: bytes) -> bool:
  """Compare a reply stream with the model's, where the model marks error replies as b"\\0ERR" + status."""
  i = j = 0
  while j < len(want):
    if want[j:j + 4] == b"\0ERR":
      if got[i:i + 1] != want[j + 4:j + 5]: return False
      (n,) = U32.unpack(got[i + 1:i + 5])
      if not 0 < n <= 4096 or len(got) < i + 5 + n: return False
      got[i + 5:i + 5 + n].decode()
      i, j = i + 5 + n, j + 5
    else:
      k = want.find(b"\0ERR", j)
      k = len(want) if k < 0 else k
      if got[i:i + k - j] != want[j:k]: return False
      i, j = i + k - j, k
  return i == len(got)

def _exchange(stream: bytes) -> tuple[bytes, bool]:
  """(reply bytes, whether the connection was cut: after a BAD_REQUEST the server closes, and the kernel may reset the
  connection when request bytes it never read were still in flight)."""
  out, cut = bytearray(), False
  with socket.create_connection(_srv.server_address[:2], timeout=20) as s:
    try:
      s.sendall(stream)
      s.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError, OSError): cut = True
    try:
      while (b := s.recv(1 << 20)): out += b
    except ConnectionResetError: cut = True
  return bytes(out), cut

@given(request_stream())
def test_fuzz_tinyfs_server(stream: bytes):
  want = _model.replies(stream)
  (got, cut), _ = bounded(lambda: _exchange(stream), (), len(stream) + 2 * CHUNK_SIZE)
  if cut: assert want[-5:-1] == b"\0ERR" and want[-1] == BAD_REQUEST, (stream[:64], want[:64])  # closed on purpose
  else: assert _split_errors(got, want), (stream[:64], got[:64], want[:64])
  event(f"{len(want)} reply bytes")
  for f in os.listdir(_root):
    assert not f.startswith(".tmp-"), f
    assert blob_hash((_root / f).read_bytes()).hex() == f

def _client_with_reply(reply: bytes) -> Connection:
  a, b = socket.socketpair()
  a.settimeout(10)
  b.sendall(reply)
  b.close()
  c = Connection.__new__(Connection)
  c.addr, c.name, c.sock = ("peer", 0), "peer:0", a
  return c

@st.composite
def reply_bytes(draw) -> bytes:
  status = draw(st.sampled_from([0, 0, 1, 2, 3, 4, 200]))
  body = draw(st.one_of(st.binary(max_size=64), st.just(U32.pack(PIECE_SIZE) + NODES[0]), st.just(h(NODES[0])),
                        st.builds(lambda n, m: U32.pack(n) + m, st.one_of(st.integers(0, 5000), st.just(2**32 - 1)), st.binary(max_size=40))))
  r = bytes([status]) + body
  return r[:draw(st.integers(0, len(r)))] if draw(st.booleans()) else r

@given(reply_bytes(), st.sampled_from(["store", "load", "info"]))
def test_fuzz_tinyfs_client(reply: bytes, op: str):
  c = _client_with_reply(reply)
  try:
    fn = {"store": c.recv_store, "load": lambda: c.recv_load(h(NODES[0]), PIECE_SIZE), "info": c.info}[op]
    res, err = bounded(fn, (TinyFSError, ConnectionError), len(reply))
  finally: c.sock.close()
  event(f"{op}: {type(err).__name__ if err else 'ok'}")
  if err is None:
    if op == "store": assert isinstance(res, bytes) and len(res) == 16
    elif op == "load": assert res == NODES[0]  # only the right bytes are ever returned
    else: assert set(res) == {"chunks", "nodes", "bytes"}
