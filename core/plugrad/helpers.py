"""Small shared helpers: typed environment lookups, well-known paths and giving the C heap back (trim_heap)."""
from __future__ import annotations
import ctypes
import functools
import os
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T", int, float, str, bool)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")

# os.environ.get encodes the key and decodes the value on every call (~0.7 us); the hot paths (every realize reads DEBUG)
# look the encoded key up in the mapping os.environ keeps in sync with the process environment, where CPython has one
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
_ENV_KEYS: dict[str, bytes] = {}

def getenv(key: str, default: T) -> T:
  """Read environment variable `key`, converted to the type of `default`; a bad value raises ValueError naming the variable."""
  if _ENV_DATA is not None:
    if (bk := _ENV_KEYS.get(key)) is None: bk = _ENV_KEYS[key] = os.environ.encodekey(key)  # type: ignore[attr-defined]
    if (rb := _ENV_DATA.get(bk)) is None: return default
    raw = os.environ.decodevalue(rb)  # type: ignore[attr-defined]
  else: raw = os.environ.get(key)
  if raw is None: return default
  try:
    if isinstance(default, bool):
      if raw.strip().lower() in _TRUE: return True
      if raw.strip().lower() in _FALSE: return False
      raise ValueError
    return type(default)(raw.strip()) if not isinstance(default, str) else raw
  except ValueError:
    want = "a boolean (1/0, true/false)" if isinstance(default, bool) else f"of type {type(default).__name__}"
    raise ValueError(f"environment variable {key}={raw!r} is not {want}") from None

def getenv_list(key: str) -> list[str]:
  """A comma-separated environment variable as a list of stripped, non-empty, lower-cased items."""
  return [x.strip().lower() for x in os.environ.get(key, "").split(",") if x.strip()]

def cache_dir() -> Path:
  """Root of plugrad's on-disk caches: $PLUGRAD_CACHE_DIR, else ~/.cache/plugrad (XDG_CACHE_HOME respected)."""
  if (d := os.environ.get("PLUGRAD_CACHE_DIR")): return Path(d).expanduser()
  return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "plugrad"

DEBUG: int = getenv("DEBUG", 0)


@functools.cache
def _malloc_trim() -> Any:
  try: return getattr(ctypes.CDLL(None), "malloc_trim", None)
  except OSError: return None


def trim_heap() -> None:
  """Give the C heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere): after a burst of
  short-lived Python objects (compiling, capturing) the freed memory would otherwise stay resident."""
  if (trim := _malloc_trim()) is not None: trim(0)


@functools.cache
def _mincore() -> Any:
  try: f = getattr(ctypes.CDLL(None, use_errno=True), "mincore", None)
  except OSError: return None
  if f is not None: f.restype, f.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
  return f


def resident_bytes(addr: int, nbytes: int) -> int:
  """How many bytes of the pages covering [addr, addr + nbytes) are in memory (mincore, page granular): what of a
  buffer's reservation something touched. An OSError where the system has no mincore or refuses the range."""
  if (mincore := _mincore()) is None: raise OSError("resident_bytes needs mincore, which this system's C library lacks")
  page = os.sysconf("SC_PAGE_SIZE")
  lo, hi = addr // page * page, -(-(addr + nbytes) // page) * page
  vec = (ctypes.c_ubyte * ((hi - lo) // page))()
  if mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) != 0:
    raise OSError(ctypes.get_errno(), f"mincore: {os.strerror(ctypes.get_errno())}")
  return sum(v & 1 for v in vec) * page
