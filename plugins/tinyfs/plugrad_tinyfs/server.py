"""The tinyfs server: `python -m plugrad_tinyfs.server --host 127.0.0.1 --port 6767 --root DIR`.

Blobs (1 MiB data chunks and 4 KiB tree nodes) live in DIR as files named by their lowercase hex hash, which the server
computes itself with the hashlib reference. Files are written to a temporary name and renamed, so a crash never leaves a
partial file under a hash name. `--port 0` binds a free port; the first line on stdout is `tinyfs listening on HOST:PORT`.
"""
from __future__ import annotations
import argparse
import errno
import os
import socketserver
import sys
import tempfile
from pathlib import Path
from plugrad_tinyfs.hashing import CHUNK_SIZE, HASH_SIZE, chunk_hash_ref, h
from plugrad_tinyfs.protocol import (BAD_REQUEST, BLOB_SIZES, CORRUPT, INFO, LOAD, NOT_FOUND, OK, SERVER_ERROR, STORE, U32, U64,
                                     recv_exact, send_error)

NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # disk full, quota, file size limit: all "out of space" to a client

IDLE_TIMEOUT = 300.0

def blob_hash(data: bytes) -> bytes:
  """The hash a blob is stored under: chunk hash for 1 MiB chunks, H(node) for 4 KiB tree nodes."""
  return chunk_hash_ref(data) if len(data) == CHUNK_SIZE else h(data)

def write_atomic(root: Path, name: str, data: bytes) -> None:
  """Write via a temporary file and rename; rewriting an existing name is harmless (same bytes) and heals a damaged file."""
  fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-")
  try:
    with os.fdopen(fd, "wb") as f: f.write(data)
    os.replace(tmp, root / name)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise

class Handler(socketserver.BaseRequestHandler):
  def handle(self) -> None:
    sock, root = self.request, self.server.root  # type: ignore[attr-defined]
    sock.settimeout(IDLE_TIMEOUT)  # a stalled client cannot hold a thread forever
    try:
      while (cmd := sock.recv(1)):
        if not self.one(sock, root, cmd): return
    except (EOFError, ConnectionError, TimeoutError):
      return  # the client went away mid-request: nothing was stored under a hash name
    except OSError as e:  # the server's own storage failed outside a STORE (reading a blob, listing the root)
      try: send_error(sock, SERVER_ERROR, f"server storage error: {os.strerror(e.errno) if e.errno else type(e).__name__}")
      except OSError: pass

  def one(self, sock, root: Path, cmd: bytes) -> bool:
    """Serve one request; False closes the connection."""
    if cmd == STORE:
      (n,) = U32.unpack(recv_exact(sock, 4, "STORE length"))
      if n not in BLOB_SIZES:  # refuse before reading or allocating anything
        send_error(sock, BAD_REQUEST, f"STORE length {n} is not a chunk ({BLOB_SIZES[0]}) or a node ({BLOB_SIZES[1]})")
        return False
      data = recv_exact(sock, n, "STORE payload")
      digest = blob_hash(data)
      try: write_atomic(root, digest.hex(), data)
      except OSError as e:  # the request was read whole, so the connection stays usable
        why = "server out of space" if e.errno in NO_SPACE else "server could not write the blob"
        send_error(sock, SERVER_ERROR, f"{why} ({os.strerror(e.errno) if e.errno else type(e).__name__}); nothing was stored")
        return True
      sock.sendall(bytes([OK]) + digest)
    elif cmd == LOAD:
      digest = recv_exact(sock, HASH_SIZE, "LOAD hash")
      path = root / digest.hex()
      try: data = path.read_bytes()
      except FileNotFoundError:
        send_error(sock, NOT_FOUND, f"no blob {digest.hex()}")
        return True
      if len(data) not in BLOB_SIZES:
        send_error(sock, CORRUPT, f"blob {digest.hex()} has {len(data)} bytes on disk")
        return True
      sock.sendall(bytes([OK]) + U32.pack(len(data)) + data)
    elif cmd == INFO:
      sizes = [e.stat().st_size for e in os.scandir(root) if not e.name.startswith(".")]
      sock.sendall(bytes([OK]) + U64.pack(sum(s == CHUNK_SIZE for s in sizes)) + U64.pack(sum(s != CHUNK_SIZE for s in sizes))
                   + U64.pack(sum(sizes)))
    else:
      send_error(sock, BAD_REQUEST, f"unknown command {cmd!r}")
      return False
    return True

class Server(socketserver.ThreadingTCPServer):
  daemon_threads, allow_reuse_address = True, True
  def __init__(self, addr: tuple[str, int], root: str | os.PathLike):
    self.root = Path(root)
    self.root.mkdir(parents=True, exist_ok=True)
    for stale in self.root.glob(".tmp-*"): stale.unlink(missing_ok=True)  # left by a crash mid-write
    super().__init__(addr, Handler)

def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(prog="python -m plugrad_tinyfs.server", description="tinyfs content-addressed blob server")
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--port", type=int, default=6767)
  p.add_argument("--root", required=True, help="directory holding the blobs (created if missing)")
  a = p.parse_args(argv)
  with Server((a.host, a.port), a.root) as srv:
    host, port = srv.server_address[:2]
    print(f"tinyfs listening on {host}:{port}", flush=True)
    try: srv.serve_forever()
    except KeyboardInterrupt: pass
  sys.exit(0)

if __name__ == "__main__": main()
