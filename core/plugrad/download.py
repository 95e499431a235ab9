"""Downloads for `Tensor.from_url`: http(s) through urllib into a cache directory, file:// from the local disk.

Nothing here runs unless a user calls it (plugrad never downloads on its own). Files land in
`$PLUGRAD_CACHE_DIR/downloads/` (default ~/.cache/plugrad/downloads), named by the sha256 of the URL unless `name` is
given, written to a temporary file and renamed only once complete, so an interrupted download leaves nothing behind.
Every failure is a `DownloadError` naming the URL: HTTP errors (404 ...), timeouts, a body shorter or longer than its
Content-Length or than the `size` the caller expects, a sha256 mismatch, bad gzip data.
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import pathlib
import socket
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib

from plugrad.helpers import cache_dir

CHUNK = 1 << 16


class DownloadError(OSError):
  """A download failed; the message names the URL and what went wrong."""


def downloads_dir() -> pathlib.Path: return cache_dir() / "downloads"


def _local_path(url: str) -> pathlib.Path:
  parsed = urllib.parse.urlparse(url)
  if parsed.netloc not in ("", "localhost"): raise DownloadError(f"{url}: file:// URLs must name a local path (host {parsed.netloc!r})")
  path = pathlib.Path(urllib.request.url2pathname(parsed.path))
  if not path.is_file(): raise DownloadError(f"{url}: no such file {path}")
  return path


def _check(url: str, path: pathlib.Path, size: int | None, sha256: str | None) -> None:
  if size is not None and (got := path.stat().st_size) != size: raise DownloadError(f"{url}: size mismatch, got {got} bytes, expected {size}")
  if sha256 is not None:
    h = hashlib.sha256()
    with open(path, "rb") as f:
      while chunk := f.read(CHUNK): h.update(chunk)
    if h.hexdigest() != sha256.lower(): raise DownloadError(f"{url}: sha256 mismatch, got {h.hexdigest()}, expected {sha256}")


def fetch(url: str, name: str | None = None, gunzip: bool = False, timeout: float = 30.0, size: int | None = None,
          sha256: str | None = None, use_cache: bool = True) -> pathlib.Path:
  """The local path of `url`'s content (gunzipped when `gunzip`): a file:// URL's own file (or its gunzipped copy in
  the cache), an http(s) URL's cached download. `size` and `sha256` check the (gunzipped) result; `use_cache=False`
  downloads again. `timeout` bounds connecting and each read, in seconds."""
  if not isinstance(url, str): raise TypeError(f"fetch needs a URL string, got {type(url).__name__}")
  if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
    raise ValueError(f"size must be an int >= 0, got {size!r}")
  scheme = urllib.parse.urlparse(url).scheme.lower()
  if scheme not in ("http", "https", "file"): raise ValueError(f"fetch supports http://, https:// and file:// URLs, got {url!r}")
  if scheme == "file" and not gunzip:
    path = _local_path(url)
    _check(url, path, size, sha256)
    return path
  if name is not None and (not name or "/" in name or "\\" in name or name in (".", "..")):
    raise ValueError(f"name must be a plain file name, got {name!r}")
  dest = downloads_dir() / ((name or hashlib.sha256(url.encode()).hexdigest()) + (".gunzip" if gunzip else ""))
  if use_cache and dest.is_file():
    try:
      _check(url, dest, size, sha256)
      return dest
    except DownloadError: pass  # a stale or different file under that name: fetch it again
  dest.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
  try:
    with os.fdopen(fd, "wb") as out: _download(url, scheme, out, gunzip, timeout)
    _check(url, pathlib.Path(tmp), size, sha256)
    os.replace(tmp, dest)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise
  return dest


def _download(url: str, scheme: str, out, gunzip: bool, timeout: float) -> None:
  try:
    if scheme == "file": src, length = open(_local_path(url), "rb"), None
    else:
      req = urllib.request.Request(url, headers={"User-Agent": "plugrad", "Accept-Encoding": "identity"})
      src = urllib.request.urlopen(req, timeout=timeout)
      if src.status != 200: raise DownloadError(f"{url}: HTTP {src.status} {src.reason}")
      length = src.headers.get("Content-Length")
      length = int(length) if length is not None and length.strip().isdigit() else None
    with src:
      got, z = 0, zlib.decompressobj(16 + zlib.MAX_WBITS) if gunzip else None
      while True:
        chunk = src.read(CHUNK)
        if not chunk: break
        got += len(chunk)
        out.write(z.decompress(chunk) if z is not None else chunk)
        while z is not None and z.eof and z.unused_data:  # concatenated gzip members, as gunzip reads them
          rest, z = z.unused_data, zlib.decompressobj(16 + zlib.MAX_WBITS)
          out.write(z.decompress(rest))
      if z is not None:
        if not z.eof: raise DownloadError(f"{url}: truncated gzip data")
        out.write(z.flush())
    if length is not None and got != length: raise DownloadError(f"{url}: size mismatch, got {got} bytes of a Content-Length of {length}")
  except urllib.error.HTTPError as e: raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
  except urllib.error.URLError as e:
    if isinstance(e.reason, (TimeoutError, socket.timeout)): raise DownloadError(f"{url}: timed out after {timeout} s") from None
    raise DownloadError(f"{url}: {e.reason}") from None
  except (TimeoutError, socket.timeout): raise DownloadError(f"{url}: timed out after {timeout} s (reading)") from None
  except (zlib.error, gzip.BadGzipFile, EOFError) as e: raise DownloadError(f"{url}: bad gzip data ({e})") from None
  except (ConnectionError, http.client.IncompleteRead) as e: raise DownloadError(f"{url}: connection failed while reading ({e})") from None

