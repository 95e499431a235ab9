"""Lazy loading of NVIDIA libraries by name, for the generated bindings in `plugrad_nv.autogen`.

Nothing is loaded at import: `LazyLibrary.f` returns a `LazyFunction` that records the `restype`/`argtypes` the
bindings assign and binds the real symbol on its first call. Libraries are found by soname through the dynamic
loader first, then in the `nvidia/*/lib` folders of the PyPI wheels (`nvidia-cuda-nvrtc`, `nvidia-nvjitlink`), so no
absolute path is baked into the bindings. A missing library raises `LibraryNotFound` (an OSError) naming what was tried.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from typing import Any, Sequence


class LibraryNotFound(OSError):
  """None of a library's candidate names could be loaded."""


def wheel_lib_dirs() -> list[str]:
  """`nvidia/<pkg>/lib` folders of installed NVIDIA wheels on sys.path (cu13 layout first, then the cu12 one)."""
  out: list[str] = []
  for p in sys.path:
    for d in sorted(glob.glob(os.path.join(p or ".", "nvidia", "*", "lib")), key=lambda d: (os.path.basename(os.path.dirname(d)) != "cu13", d)):
      if os.path.isdir(d) and d not in out: out.append(d)
  return out


def find_in_wheels(name: str) -> str | None:
  """Path of `name` (a soname or a glob like 'libnvrtc.so.*') inside an installed NVIDIA wheel, or None."""
  for d in wheel_lib_dirs():
    if (hits := sorted(glob.glob(os.path.join(d, name)))): return hits[-1]
  return None


class LazyLibrary:
  """A shared library loaded on first use from the first of `names` that loads.

  `preload` are globs of helper libraries that must be loaded (RTLD_GLOBAL) from the same wheel folder first, such as
  NVRTC's `libnvrtc-builtins.so.*`, which NVRTC itself opens by soname.
  """
  def __init__(self, label: str, names: Sequence[str], preload: Sequence[str] = ()) -> None:
    self.label, self.names, self.preload = label, tuple(names), tuple(preload)
    self._dll: ctypes.CDLL | None = None
    self._lock = threading.Lock()
    self.path: str | None = None

  def load(self) -> ctypes.CDLL:
    """The loaded library; raises LibraryNotFound listing every candidate tried."""
    if self._dll is not None: return self._dll
    with self._lock:
      if self._dll is not None: return self._dll
      errors = []
      env = os.environ.get(f"PLUGRAD_{self.label.upper().replace('LIB', '', 1)}_PATH")
      cands = ([env] if env else []) + list(self.names) + [p for n in self.names if (p := find_in_wheels(n))]
      for c in cands:
        try:
          if os.path.isabs(c):
            for pat in self.preload:
              for pre in sorted(glob.glob(os.path.join(os.path.dirname(c), pat))): ctypes.CDLL(pre, mode=ctypes.RTLD_GLOBAL)
          dll = ctypes.CDLL(c, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
          errors.append(f"{c}: {e}")
          continue
        self._dll, self.path = dll, c
        return dll
      raise LibraryNotFound(f"{self.label} not found (tried {', '.join(cands)})" + (f": {errors[-1]}" if errors else ""))

  @property
  def available(self) -> bool:
    try: self.load()
    except OSError: return False
    return True

  def __getattr__(self, name: str) -> LazyFunction:
    if name.startswith("__") and name.endswith("__"): raise AttributeError(name)
    f = LazyFunction(self, name)
    self.__dict__[name] = f
    return f


class LazyFunction:
  """A C function bound on its first call; `restype`/`argtypes` set before that are applied when it binds."""
  def __init__(self, lib: LazyLibrary, name: str) -> None:
    self._lib, self.__name__ = lib, name
    self.restype: Any = ctypes.c_int
    self.argtypes: Any = None
    self._fn: Any = None

  def bind(self) -> Any:
    if self._fn is None:
      try: fn = getattr(self._lib.load(), self.__name__)
      except AttributeError:
        raise AttributeError(f"{self._lib.label} ({self._lib.path}) has no function {self.__name__}: driver or library too old") from None
      fn.restype = self.restype
      if self.argtypes is not None: fn.argtypes = self.argtypes
      self._fn = fn
    return self._fn

  def __call__(self, *args: Any) -> Any: return (self._fn or self.bind())(*args)

  def __repr__(self) -> str: return f"<LazyFunction {self._lib.label}.{self.__name__}>"
