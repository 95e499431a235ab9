"""Compiler base: source -> binary, with an on-disk cache keyed by compiler identity and source.

The cache lives under $PLUGRAD_CACHE_DIR/compile (default ~/.cache/plugrad/compile); entries are written atomically
(temp file + rename) so concurrent processes never see a torn binary. Each entry is a header (magic, the entry's key,
payload length, sha256 of key and payload) and the binary. An entry is verified before it is returned: it must be a
regular file of the size its header says, hold the key it is filed under (an entry copied over another kernel's is
rejected, not run), and match its hash. One that fails (truncated, overwritten, another kernel's, not ours, a
FIFO or a link to a device) is deleted and rebuilt with a CompileCacheWarning, so a damaged cache never reaches a loader
(a truncated shared object would SIGBUS at dlopen). An entry of an older format is replaced silently.
DISABLE_COMPILER_CACHE=1 bypasses the cache.
"""
from __future__ import annotations
import errno
import hashlib
import os
import stat
import struct
import warnings
from pathlib import Path
from plugrad.helpers import cache_dir, getenv

ENTRY_MAGIC = b"PGCC\x02\x00\x00\x00"
_ENTRY_HEAD = struct.Struct("<8s32sQ32s")  # magic, key, payload length, sha256(key + payload)

class CompileCacheWarning(UserWarning):
  """A compile cache entry failed verification; it was deleted and the kernel compiled again."""

class OlderEntryFormat(ValueError):
  """A cache entry written by an older plugrad (its own magic, another version): replaced without a warning."""

def pack_entry(lib: bytes, key: bytes) -> bytes:
  """A cache entry bound to `key` (32 bytes, the digest it is filed under): header (magic, key, length, sha256) + binary."""
  if len(key) != 32: raise ValueError(f"a compile cache key is 32 bytes, got {len(key)}")
  return _ENTRY_HEAD.pack(ENTRY_MAGIC, key, len(lib), hashlib.sha256(key + lib).digest()) + lib

def unpack_entry(raw: bytes, key: bytes) -> bytes:
  """The binary of a cache entry filed under `key`; ValueError saying what is wrong when it does not verify."""
  if len(raw) >= 8 and raw[:4] == ENTRY_MAGIC[:4] and raw[4:8] < ENTRY_MAGIC[4:8]:
    raise OlderEntryFormat(f"entry format {raw[4:8]!r}, this is {ENTRY_MAGIC[4:8]!r}")
  if len(raw) < _ENTRY_HEAD.size: raise ValueError(f"{len(raw)} bytes, shorter than the {_ENTRY_HEAD.size}-byte entry header")
  magic, have_key, n, digest = _ENTRY_HEAD.unpack_from(raw)
  if magic != ENTRY_MAGIC: raise ValueError(f"bad magic {magic!r} (not a plugrad compile cache entry of this version)")
  if (have := len(raw) - _ENTRY_HEAD.size) != n: raise ValueError(f"payload is {have} bytes, the header says {n} (truncated?)")
  lib = raw[_ENTRY_HEAD.size:]
  if hashlib.sha256(have_key + lib).digest() != digest: raise ValueError("payload does not match its sha256 (corrupted)")
  if have_key != key: raise ValueError(f"it belongs to another kernel (key {have_key.hex()[:16]}..., filed under {key.hex()[:16]}...)")
  return lib

class CompileError(RuntimeError):
  """A compiler rejected a kernel; str() shows the compiler's log and the numbered source."""
  def __init__(self, msg: str, log: str = "", src: str = "") -> None:
    super().__init__(msg)
    self.msg, self.log, self.src = msg, log, src
    self.src_path: str | None = None  # where the failing source was saved, set by Compiler.compile_cached

  def __str__(self) -> str:
    lines = self.src.splitlines()
    shown = "\n".join(f"{i+1:4d} | {ln}" for i, ln in enumerate(lines[:400])) + ("\n     | ..." if len(lines) > 400 else "")
    where = f"\n--- source written to {self.src_path} ---" if self.src_path else ""
    return f"{self.msg}\n--- compiler log ---\n{self.log.strip() or '(empty)'}\n--- source ---\n{shown}{where}"

class Compiler:
  """Turns kernel source into a binary the device's Program class can load.

  `cachekey` names the compiler's identity (tool, version, flags, target); binaries compiled by different identities
  never collide in the cache. A cachekey of None disables disk caching for this compiler.
  """
  def __init__(self, cachekey: str | None) -> None:
    self.cachekey = cachekey
    self.hits = self.misses = 0

  def compile(self, src: str) -> bytes:
    """Compile `src`; raise CompileError (with log and source) on failure."""
    raise NotImplementedError(f"{type(self).__name__}.compile is not implemented")

  def disassemble(self, lib: bytes) -> str:
    """Human-readable form of a compiled binary, for DEBUG output; optional."""
    raise NotImplementedError(f"{type(self).__name__} cannot disassemble")

  def cache_key(self, src: str) -> bytes:
    """The 32-byte key of `src`'s entry: sha256 over the compiler's identity and the source."""
    assert self.cachekey is not None, "compiler has no cachekey"
    return hashlib.sha256(self.cachekey.encode() + b"\0" + src.encode()).digest()

  def cache_path(self, src: str) -> Path:
    """Where the binary for `src` is cached: the hex of its key."""
    key = self.cache_key(src).hex()
    return cache_dir() / "compile" / key[:2] / f"{key}.pgc"

  def compile_cached(self, src: str) -> bytes:
    """compile(src), reusing a previous result from the disk cache when identity and source match and the entry verifies."""
    if not isinstance(src, str): raise TypeError(f"kernel source must be str, got {type(src).__name__}")
    if self.cachekey is None or getenv("DISABLE_COMPILER_CACHE", False): return self._compile_reporting(src)
    key, path = self.cache_key(src), self.cache_path(src)
    if (lib := _read_entry(path, key)) is not None:
      self.hits += 1
      return lib
    self.misses += 1
    lib = self._compile_reporting(src)
    _atomic_write(path, pack_entry(lib, key))
    return lib

  def _compile_reporting(self, src: str) -> bytes:
    """compile(src); on failure the source is saved to a file whose path the CompileError names."""
    try: return self.compile(src)
    except CompileError as e:
      import tempfile
      d = Path(tempfile.gettempdir()) / "plugrad-failed-kernels"
      try:
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"{hashlib.sha256(src.encode()).hexdigest()[:16]}.src"
        p.write_text(src)
        e.src_path = str(p)
      except OSError: pass
      raise

MAX_ENTRY_BYTES = 1 << 30  # no compiler output is this large; a bigger "entry" is not ours

def _read_raw(path: Path) -> bytes | None:
  """The bytes of the entry file at `path`; None if missing; ValueError if it is not a regular file of sane size.

  Opened without following a final symlink and without blocking (a FIFO would block open and read forever), then
  checked with fstat before a byte is read (a link to /dev/zero would read until MemoryError)."""
  flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
  try: fd = os.open(path, flags)
  except FileNotFoundError: return None
  except OSError as e:
    if e.errno == errno.ELOOP: raise ValueError("it is a symbolic link, not a regular file") from None
    return None  # unreadable (permissions): compile without the cache
  try:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode): raise ValueError("it is not a regular file")
    if st.st_size > MAX_ENTRY_BYTES: raise ValueError(f"{st.st_size} bytes, larger than any compiled kernel")
    with os.fdopen(fd, "rb", closefd=False) as f: return f.read(st.st_size + 1)  # +1: a file that grew fails the length check
  finally: os.close(fd)

def _read_entry(path: Path, key: bytes) -> bytes | None:
  """The verified binary cached at `path` for `key`, or None (missing; or damaged, then it is deleted with a warning)."""
  try:
    raw = _read_raw(path)
    return None if raw is None else unpack_entry(raw, key)
  except OlderEntryFormat: return None  # rewritten in the current format by the caller
  except ValueError as e:
    warnings.warn(f"plugrad: compile cache entry {path} is damaged ({e}); deleted, compiling again", CompileCacheWarning, stacklevel=4)
    try: path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    except OSError: pass
    return None

def _atomic_write(path: Path, data: bytes) -> None:
  """Write data to path via a temp file in the same directory and rename; a read-only cache is silently skipped."""
  import tempfile
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
      with os.fdopen(fd, "wb") as f: f.write(data)
      os.replace(tmp, path)
    except BaseException:
      os.unlink(tmp)
      raise
  except OSError: pass

class UnsupportedCompiler(Compiler):
  """Stand-in for devices that cannot compile (storage devices): every compile raises a clear error."""
  def __init__(self, device: str, why: str) -> None:
    super().__init__(None)
    self.device, self.why = device, why
  def compile(self, src: str) -> bytes: raise RuntimeError(f"device {self.device} cannot compile kernels: {self.why}")
