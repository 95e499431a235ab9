"""Compiler base: source -> binary, with an on-disk cache keyed by compiler identity and source.

The cache lives under $PLUGRAD_CACHE_DIR/compile (default ~/.cache/plugrad/compile); entries are written atomically
(temp file + rename) so concurrent processes never see a torn binary. DISABLE_COMPILER_CACHE=1 bypasses it.
"""
from __future__ import annotations
import os
from pathlib import Path
from plugrad.helpers import cache_dir, getenv

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

  def cache_path(self, src: str) -> Path:
    """Where the binary for `src` is cached: sha256 over identity and source."""
    import hashlib
    assert self.cachekey is not None, "compiler has no cachekey"
    key = hashlib.sha256(self.cachekey.encode() + b"\0" + src.encode()).hexdigest()
    return cache_dir() / "compile" / key[:2] / key

  def compile_cached(self, src: str) -> bytes:
    """compile(src), reusing a previous result from the disk cache when identity and source match."""
    if not isinstance(src, str): raise TypeError(f"kernel source must be str, got {type(src).__name__}")
    if self.cachekey is None or getenv("DISABLE_COMPILER_CACHE", False): return self._compile_reporting(src)
    path = self.cache_path(src)
    try:
      lib = path.read_bytes()
      self.hits += 1
      return lib
    except OSError: pass
    self.misses += 1
    lib = self._compile_reporting(src)
    _atomic_write(path, lib)
    return lib

  def _compile_reporting(self, src: str) -> bytes:
    """compile(src); on failure the source is saved to a file whose path the CompileError names."""
    try: return self.compile(src)
    except CompileError as e:
      import hashlib
      import tempfile
      d = Path(tempfile.gettempdir()) / "plugrad-failed-kernels"
      try:
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"{hashlib.sha256(src.encode()).hexdigest()[:16]}.src"
        p.write_text(src)
        e.src_path = str(p)
      except OSError: pass
      raise

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
