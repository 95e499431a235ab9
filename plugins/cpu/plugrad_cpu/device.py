"""The CPU device: 64-byte-aligned host memory, C compiled to a shared object by clang/gcc, ctypes launcher.

Kernels are C functions `void name(T0 *buf0, ..., int val0, ...)` that loop over their whole iteration space;
global/local sizes are validated and otherwise ignored until the threaded launcher (CPU_THREADS) lands.
"""
from __future__ import annotations
import ctypes
import os
import subprocess
import tempfile
import time
from typing import Any
import numpy as np
from plugrad.device import BufferOptions, Compiled, Compiler, CompileError, LRUAllocator, Program
from plugrad.helpers import getenv
from plugrad.codegen.cstyle import CStyleRenderer
from plugrad_cpu import find_cc

class CPUAllocator(LRUAllocator):
  """Host memory as numpy uint8 arrays aligned to 64 bytes; the opaque handle is the array (views are slices)."""
  def _alloc(self, size: int, options: BufferOptions) -> np.ndarray:
    if options.external_ptr is not None: return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(options.external_ptr))
    raw = np.empty(size + 64, np.uint8)
    return raw[(-raw.ctypes.data) % 64:][:size]
  def _free(self, opaque: np.ndarray, size: int, options: BufferOptions) -> None: pass
  def _copyin(self, dest: np.ndarray, src: memoryview) -> None: dest[:] = np.frombuffer(src, np.uint8)
  def _copyout(self, dest: memoryview, src: np.ndarray) -> None: np.frombuffer(dest, np.uint8)[:] = src
  def _offset(self, opaque: np.ndarray, size: int, offset: int) -> np.ndarray: return opaque[offset:offset + size]
  def _transfer(self, dest: np.ndarray, src: np.ndarray, nbytes: int, src_dev: Compiled, dest_dev: Compiled) -> None:
    dest[:nbytes] = src[:nbytes]

class ClangRenderer(CStyleRenderer):
  """C for clang/gcc: the shared C-style renderer with host types."""
  name, device, suffix = "CLANG", "CPU", "CLANG"
  supports_float4, global_max = True, None

class ClangCompiler(Compiler):
  """C source -> shared object with clang or gcc (CC overrides): -O2 -march=native -fPIC -shared, no fast-math."""
  FLAGS = ("-O2", "-march=native", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno")

  def __init__(self, cc: str | None = None) -> None:
    self.cc = cc or find_cc()
    if self.cc is None: raise RuntimeError("no C compiler found: install clang or gcc, or set CC")
    ver = subprocess.run([*self.cc.split(), "--version"], capture_output=True, text=True).stdout.splitlines()
    super().__init__(f"cc={self.cc} version={ver[0] if ver else '?'} flags={' '.join(self.FLAGS)}")

  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="plugrad-cc-") as d:
      out = os.path.join(d, "kernel.so")
      p = subprocess.run([*self.cc.split(), *self.FLAGS, "-x", "c", "-", "-o", out], input=src, capture_output=True, text=True)
      if p.returncode != 0: raise CompileError(f"{self.cc} failed with exit code {p.returncode}", p.stderr, src)
      with open(out, "rb") as f: return f.read()

class CPUProgram(Program):
  """Loads a shared object with ctypes and calls `name(*buffer pointers, *int32 vals)`."""
  def __init__(self, dev: Compiled, name: str, lib: bytes) -> None:
    super().__init__(dev, name, lib)
    with tempfile.NamedTemporaryFile(suffix=".so", prefix="plugrad-") as f:
      f.write(lib); f.flush()
      self._dll = ctypes.CDLL(f.name)
    try: self.fn = getattr(self._dll, name)
    except AttributeError: raise RuntimeError(f"compiled CPU library has no function {name!r}") from None
    self.fn.restype = None

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    self.check_launch(global_size, local_size)
    args = [ctypes.c_void_p(b.ctypes.data) for b in bufs] + [ctypes.c_int32(v) for v in vals]
    st = time.perf_counter()
    self.fn(*args)
    return time.perf_counter() - st if wait else None

class CPUDevice(Compiled):
  smoke_kernel = "void smoke(int *a) { for (int i = 0; i < 3; i++) a[i] *= 2; }"

  def __init__(self, device: str) -> None:
    self.threads = getenv("CPU_THREADS", os.cpu_count() or 1)
    if self.threads < 1: raise ValueError(f"CPU_THREADS must be >= 1, got {self.threads}")
    super().__init__(device, CPUAllocator(), [ClangRenderer], ClangCompiler(), CPUProgram)
