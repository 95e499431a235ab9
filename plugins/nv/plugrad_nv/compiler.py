"""NVRTC compiler: CUDA C -> cubin for one sm_XX (or PTX assembled by ptxas / nvJitLink), with core's disk cache.

A compiled library is `pack(meta, binary)`: the binary kind ("cubin" or "ptx") and arch in front of the cubin/PTX.
Launch sizes are not part of it: they travel in `ProgramSpec.global_size/local_size` and come with every launch.
NVRTC and the half/bfloat16 headers come from the PyPI wheels
(`nvidia-cuda-nvrtc`, `nvidia-cuda-runtime`) or a CUDA toolkit; see docs/nv.md.
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from typing import Any

from plugrad.runtime.compiler import CompileError, Compiler
from plugrad_nv.autogen import nvjitlink as jl
from plugrad_nv.autogen import nvrtc

MAGIC = b"PGNV"


def pack(meta: dict[str, Any], binary: bytes) -> bytes:
  j = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
  return MAGIC + struct.pack("<I", len(j)) + j + binary


def unpack(lib: bytes) -> tuple[dict[str, Any], bytes]:
  """(meta, binary) of a packed library; ValueError when `lib` isn't one."""
  if lib[:4] != MAGIC or len(lib) < 8: raise ValueError("not a plugrad-nv kernel library (bad magic): compile it with NVRTCCompiler")
  n = struct.unpack("<I", lib[4:8])[0]
  return json.loads(lib[8:8 + n]), lib[8 + n:]


def _cstr(s: bytes) -> Any: return ctypes.cast(ctypes.create_string_buffer(s), ctypes.POINTER(ctypes.c_char))


def _cstrs(items: list[bytes]) -> tuple[Any, list]:
  bufs = [ctypes.create_string_buffer(s) for s in items]
  arr = (ctypes.POINTER(ctypes.c_char) * max(len(bufs), 1))(*[ctypes.cast(b, ctypes.POINTER(ctypes.c_char)) for b in bufs])
  return arr, bufs


def cuda_include_dirs(nvrtc_path: str | None = None) -> list[str]:
  """Folders with cuda_fp16.h: the wheel folder next to the loaded NVRTC first, then other wheels, $CUDA_HOME, /usr/local/cuda."""
  cands: list[str] = []
  if nvrtc_path and os.path.isabs(nvrtc_path):
    pkg = os.path.dirname(os.path.dirname(nvrtc_path))
    cands += [os.path.join(pkg, "include"), os.path.join(os.path.dirname(pkg), "cuda_runtime", "include")]
  for p in sys.path: cands += sorted(glob.glob(os.path.join(p or ".", "nvidia", "*", "include")))
  if os.environ.get("CUDA_HOME"): cands.append(os.path.join(os.environ["CUDA_HOME"], "include"))
  cands.append("/usr/local/cuda/include")
  out = []
  for d in cands:
    if os.path.exists(os.path.join(d, "cuda_fp16.h")) and d not in out: out.append(d)
  return out[:1]


def nvrtc_version() -> tuple[int, int]:
  a, b = ctypes.c_int32(), ctypes.c_int32()
  if nvrtc.nvrtcVersion(ctypes.byref(a), ctypes.byref(b)) != 0: raise RuntimeError("nvrtcVersion failed")
  return a.value, b.value


class NVRTCCompiler(Compiler):
  """CUDA C -> cubin for `arch` (sm_90 ...). `ptx=True`: NVRTC emits PTX for compute_XX, then ptxas ($PTXAS or on PATH)
  or nvJitLink assembles it; with neither, the PTX itself is kept for the driver to JIT at load. `keep_ptx=True`: the
  PTX is the output, never assembled (for a driver that loads PTX only: the mock CUDA driver of DEV=MOCK+NV)."""
  def __init__(self, arch: str = "sm_90", ptx: bool = False, keep_ptx: bool = False) -> None:
    self.nvrtc, self.arch, self.ptx, self.keep_ptx = nvrtc, arch, ptx or keep_ptx, keep_ptx
    self.version = nvrtc_version()  # loads libnvrtc: LibraryNotFound (an OSError) names what was tried
    self.includes = cuda_include_dirs(nvrtc._libraries["libnvrtc"].path)
    self.options = [f"--gpu-architecture={arch.replace('sm_', 'compute_') if self.ptx else arch}", "-DNDEBUG"] + [f"-I{d}" for d in self.includes]
    mode = "ptx-only" if keep_ptx else "ptx" if ptx else "cubin"
    super().__init__(f"nvrtc={self.version[0]}.{self.version[1]} arch={arch} mode={mode} "
                     f"opts={' '.join(o for o in self.options if not o.startswith('-I'))} headers={bool(self.includes)}")

  def _check(self, rc: int, what: str) -> None:
    if rc != 0: raise RuntimeError(f"NVRTC {what} failed: {ctypes.string_at(self.nvrtc.nvrtcGetErrorString(rc)).decode()}")

  def nvrtc_compile(self, src: str, ptx: bool) -> bytes:
    """Run NVRTC; CompileError with its log and the source when the kernel doesn't compile."""
    n = self.nvrtc
    prog = n.nvrtcProgram()
    self._check(n.nvrtcCreateProgram(ctypes.byref(prog), _cstr(src.encode()), _cstr(b"kernel.cu"), 0, None, None), "nvrtcCreateProgram")
    try:
      opts, _keep = _cstrs([o.encode() for o in self.options])
      rc = n.nvrtcCompileProgram(prog, len(self.options), opts)
      size = ctypes.c_size_t()
      self._check(n.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
      logbuf = ctypes.create_string_buffer(size.value)
      self._check(n.nvrtcGetProgramLog(prog, logbuf), "nvrtcGetProgramLog")
      if rc != 0:
        hint = "" if self.includes else " (no folder with cuda_fp16.h found: pip install nvidia-cuda-runtime, or set CUDA_HOME)"
        raise CompileError(f"NVRTC {self.version[0]}.{self.version[1]} failed to compile for {self.arch}: "
                           f"{ctypes.string_at(n.nvrtcGetErrorString(rc)).decode()}{hint}", logbuf.value.decode(errors="replace"), src)
      get_size, get = (n.nvrtcGetPTXSize, n.nvrtcGetPTX) if ptx else (n.nvrtcGetCUBINSize, n.nvrtcGetCUBIN)
      self._check(get_size(prog, ctypes.byref(size)), "get output size")
      out = ctypes.create_string_buffer(size.value)
      self._check(get(prog, out), "get output")
      return out.raw[:size.value].rstrip(b"\0") if ptx else out.raw[:size.value]
    finally: n.nvrtcDestroyProgram(ctypes.byref(prog))

  def assemble(self, ptx: bytes, src: str) -> tuple[str, bytes]:
    """PTX -> ("cubin", binary) with ptxas or nvJitLink; ("ptx", ptx) when neither is available."""
    if (ptxas := os.environ.get("PTXAS") or shutil.which("ptxas")):
      with tempfile.TemporaryDirectory(prefix="plugrad-ptxas-") as d:
        pin, pout = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(pin, "wb") as f: f.write(ptx)
        p = subprocess.run([ptxas, f"-arch={self.arch}", "-o", pout, pin], capture_output=True, text=True)
        if p.returncode != 0: raise CompileError(f"ptxas failed with exit code {p.returncode}", p.stderr + "\n--- PTX ---\n" + ptx.decode(), src)
        with open(pout, "rb") as f: return "cubin", f.read()
    try: return "cubin", jitlink_ptx(ptx, self.arch)
    except OSError: return "ptx", ptx + b"\0"

  def compile(self, src: str) -> bytes:
    if not self.ptx: return pack({"kind": "cubin", "arch": self.arch}, self.nvrtc_compile(src, ptx=False))
    if self.keep_ptx: return pack({"kind": "ptx", "arch": self.arch}, self.nvrtc_compile(src, ptx=True) + b"\0")
    kind, binary = self.assemble(self.nvrtc_compile(src, ptx=True), src)
    return pack({"kind": kind, "arch": self.arch}, binary)

  def disassemble(self, lib: bytes) -> str:
    meta, binary = unpack(lib)
    if meta["kind"] == "ptx": return binary.decode(errors="replace")
    if not (tool := shutil.which("cuobjdump")): raise RuntimeError("disassembling a cubin needs cuobjdump (CUDA toolkit) on PATH")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
      f.write(binary); f.flush()
      return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout


def jitlink_ptx(ptx: bytes, arch: str) -> bytes:
  """Assemble PTX to a cubin with nvJitLink (the `nvidia-nvjitlink` wheel); OSError when it isn't installed."""
  h = jl.nvJitLinkHandle()
  opts, _keep = _cstrs([f"-arch={arch}".encode()])
  def check(rc: int, what: str) -> None:
    if rc == 0: return
    size = ctypes.c_size_t()
    log = ""
    if h and jl.nvJitLinkGetErrorLogSize(h, ctypes.byref(size)) == 0 and size.value:
      buf = ctypes.create_string_buffer(size.value)
      jl.nvJitLinkGetErrorLog(h, buf)
      log = buf.value.decode(errors="replace")
    raise CompileError(f"nvJitLink {what} failed with {rc}", log, ptx.decode(errors="replace"))
  check(jl.nvJitLinkCreate(ctypes.byref(h), 1, opts), "create")
  try:
    check(jl.nvJitLinkAddData(h, jl.NVJITLINK_INPUT_PTX, ctypes.create_string_buffer(ptx), len(ptx), _cstr(b"kernel.ptx")), "add PTX")
    check(jl.nvJitLinkComplete(h), "link")
    size = ctypes.c_size_t()
    check(jl.nvJitLinkGetLinkedCubinSize(h, ctypes.byref(size)), "cubin size")
    out = ctypes.create_string_buffer(size.value)
    check(jl.nvJitLinkGetLinkedCubin(h, out), "get cubin")
    return out.raw
  finally: jl.nvJitLinkDestroy(ctypes.byref(h))
