"""The tinyfs server: `python -m plugrad_tinyfs.server --host 127.0.0.1 --port 6767 --root DIR`.

Blobs (1 MiB data chunks and 4 KiB tree nodes) live in DIR as files named by their lowercase hex hash, which the server
computes itself with the hashlib reference. Files are written to a temporary name and renamed, so a crash never leaves a
partial file under a hash name. `--port 0` binds a free port; the first line on stdout is `tinyfs listening on HOST:PORT`.

Limits: at most `--max-connections` (64) connections are served at once, each by one thread holding at most one blob;
a connection past the limit gets SERVER_ERROR "server busy" and is closed. A request must arrive whole within
`--request-timeout` seconds (60) of its first byte, and a connection idle for IDLE_TIMEOUT (300 s) between requests is
dropped, so slow clients can't hold threads or memory without bound. Bad arguments (a --root that is a file, a port
outside 0-65535 or in use) are one line on stderr and exit status 2 (usage) or 1 (can't serve).
"""
from __future__ import annotations
import argparse
import errno
import os
import socketserver
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, NoReturn
from plugrad_tinyfs.hashing import CHUNK_SIZE, HASH_SIZE, chunk_hash_ref, h
from plugrad_tinyfs.protocol import (BAD_REQUEST, BLOB_SIZES, CORRUPT, INFO, LOAD, NOT_FOUND, OK, SERVER_ERROR, STORE, U32, U64,
                                     recv_exact, send_error)

NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # disk full, quota, file size limit: all "out of space" to a client

IDLE_TIMEOUT = 300.0  # seconds a connection may wait between requests
REQUEST_TIMEOUT = 60.0  # seconds a whole request may take from its first byte (1 MiB at 17 KB/s)
MAX_CONNECTIONS = 64  # connections served at once; each holds a thread and at most one 1 MiB blob

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
  deadline: float | None = None  # when the request being read must be complete (time.monotonic())

  def handle(self) -> None:
    sock, root = self.request, self.server.root  # type: ignore[attr-defined]
    try:
      while True:
        sock.settimeout(IDLE_TIMEOUT)  # a stalled client cannot hold a thread forever
        if not (cmd := sock.recv(1)): return
        self.deadline = time.monotonic() + self.server.request_timeout  # type: ignore[attr-defined]
        if not self.one(sock, root, cmd): return
        self.deadline = None
    except TimeoutError:
      if self.deadline is not None and time.monotonic() >= self.deadline:  # not an idle timeout: tell the client why
        try: send_error(sock, SERVER_ERROR, f"request not complete within {self.server.request_timeout:g} s; closing")  # type: ignore[attr-defined]
        except OSError: pass
    except (EOFError, ConnectionError):
      return  # the client went away mid-request: nothing was stored under a hash name
    except OSError as e:  # the server's own storage failed outside a STORE (reading a blob, listing the root)
      try: send_error(sock, SERVER_ERROR, f"server storage error: {os.strerror(e.errno) if e.errno else type(e).__name__}")
      except OSError: pass

  def one(self, sock, root: Path, cmd: bytes) -> bool:
    """Serve one request; False closes the connection."""
    if cmd == STORE:
      (n,) = U32.unpack(recv_exact(sock, 4, "STORE length", self.deadline))
      if n not in BLOB_SIZES:  # refuse before reading or allocating anything
        send_error(sock, BAD_REQUEST, f"STORE length {n} is not a chunk ({BLOB_SIZES[0]}) or a node ({BLOB_SIZES[1]})")
        return False
      data = recv_exact(sock, n, "STORE payload", self.deadline)
      digest = blob_hash(data)
      try: write_atomic(root, digest.hex(), data)
      except OSError as e:  # the request was read whole, so the connection stays usable
        why = "server out of space" if e.errno in NO_SPACE else "server could not write the blob"
        send_error(sock, SERVER_ERROR, f"{why} ({os.strerror(e.errno) if e.errno else type(e).__name__}); nothing was stored")
        return True
      sock.sendall(bytes([OK]) + digest)
    elif cmd == LOAD:
      digest = recv_exact(sock, HASH_SIZE, "LOAD hash", self.deadline)
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
  request_queue_size = 128

  def __init__(self, addr: tuple[str, int], root: str | os.PathLike, max_connections: int = MAX_CONNECTIONS,
               request_timeout: float = REQUEST_TIMEOUT):
    self.root, self.request_timeout, self.max_connections = Path(root), request_timeout, max_connections
    self.root.mkdir(parents=True, exist_ok=True)
    for stale in self.root.glob(".tmp-*"): stale.unlink(missing_ok=True)  # left by a crash mid-write
    self.slots = threading.BoundedSemaphore(max_connections)
    super().__init__(addr, Handler)

  def process_request(self, request, client_address) -> None:
    """A thread for the connection if a slot is free; else SERVER_ERROR "server busy" and close, from this thread."""
    if not self.slots.acquire(blocking=False):
      try:
        request.setblocking(False)  # a short message into an empty send buffer: never waits on the client
        send_error(request, SERVER_ERROR, f"server busy: {self.max_connections} connections open (its limit); try again later")
      except OSError: pass
      self.shutdown_request(request)
      return
    try: super().process_request(request, client_address)
    except BaseException:
      self.slots.release()
      raise

  def process_request_thread(self, request, client_address) -> None:
    try: super().process_request_thread(request, client_address)
    finally: self.slots.release()

def _port(s: str) -> int:
  try: v = int(s)
  except ValueError: raise argparse.ArgumentTypeError(f"port must be an integer, got {s!r}") from None
  if not 0 <= v <= 65535: raise argparse.ArgumentTypeError(f"port must be 0-65535 (0: any free port), got {v}")
  return v

def _positive(kind: type) -> Callable[[str], Any]:
  def parse(s: str) -> Any:
    try: v = kind(s)
    except ValueError: raise argparse.ArgumentTypeError(f"must be a {kind.__name__}, got {s!r}") from None
    if not v > 0: raise argparse.ArgumentTypeError(f"must be positive, got {s}")
    return v
  return parse

def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(prog="python -m plugrad_tinyfs.server", description="tinyfs content-addressed blob server")
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--port", type=_port, default=6767, help="0-65535; 0 binds a free port")
  p.add_argument("--root", required=True, help="directory holding the blobs (created if missing)")
  p.add_argument("--max-connections", type=_positive(int), default=MAX_CONNECTIONS, help="connections served at once")
  p.add_argument("--request-timeout", type=_positive(float), default=REQUEST_TIMEOUT, help="seconds a request may take")
  a = p.parse_args(argv)
  if os.path.exists(a.root) and not os.path.isdir(a.root): _fail(f"--root {a.root} is not a directory")
  try: srv = Server((a.host, a.port), a.root, a.max_connections, a.request_timeout)
  except OSError as e: _fail(f"can't serve {a.root} on {a.host}:{a.port}: {e.strerror or e}")
  with srv:
    host, port = srv.server_address[:2]
    print(f"tinyfs listening on {host}:{port}", flush=True)
    try: srv.serve_forever()
    except KeyboardInterrupt: pass
  sys.exit(0)

def _fail(msg: str) -> NoReturn:
  print(f"tinyfs: {msg}", file=sys.stderr)
  sys.exit(1)

if __name__ == "__main__": main()
