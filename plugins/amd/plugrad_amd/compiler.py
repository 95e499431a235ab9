"""clang-19 + ld.lld-19: LLVM IR -> HSA code object (ELF, e_machine EM_AMDGPU) for one gfx arch, on core's disk cache.

A compiled library is `pack(meta, elf)`: the arch the code object was compiled for (`{"arch": "gfx1100"}`, so a device
refuses code for another arch) in front of the code object. Launch sizes are not part of it: they travel in
`ProgramSpec.global_size/local_size` and come with every launch. `unpack` splits it again; `elf_symbols` reads the
code object's symbol table (the runtime finds `<name>.kd`, the 64-byte kernel descriptor, there).
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
from typing import Any

from plugrad.runtime.compiler import CompileError, Compiler
from plugrad_amd.renderer import ARCHS

MAGIC = b"PGAM"
EM_AMDGPU = 224


def pack(meta: dict[str, Any], elf: bytes) -> bytes:
  j = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
  return MAGIC + struct.pack("<I", len(j)) + j + elf


def unpack(lib: bytes) -> tuple[dict[str, Any], bytes]:
  """(meta, code object) of a packed library; ValueError when `lib` isn't one."""
  if lib[:4] != MAGIC or len(lib) < 8: raise ValueError("not a plugrad-amd kernel library (bad magic): compile it with AMDGPUCompiler")
  n = struct.unpack("<I", lib[4:8])[0]
  return json.loads(lib[8:8 + n]), lib[8 + n:]


def elf_symbols(elf: bytes) -> dict[str, tuple[int, int]]:
  """{name: (value, size)} of an ELF64 little-endian file's .symtab; ValueError for something else."""
  if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1: raise ValueError("not a 64-bit little-endian ELF file")
  shoff, shentsize, shnum = struct.unpack_from("<Q", elf, 0x28)[0], *struct.unpack_from("<HH", elf, 0x3A)
  secs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
  out = {}
  for s in secs:
    if s[1] != 2: continue  # SHT_SYMTAB
    strtab = secs[s[6]]
    for off in range(s[4], s[4] + s[5], 24):
      st_name, _, _, _, st_value, st_size = struct.unpack_from("<IBBHQQ", elf, off)
      nm = elf[strtab[4] + st_name:elf.index(b"\0", strtab[4] + st_name)].decode()
      if nm: out[nm] = (st_value, st_size)
  return out


def elf_machine(elf: bytes) -> int: return struct.unpack_from("<H", elf, 18)[0]


def find_tool(names: tuple[str, ...]) -> str | None:
  return next((p for n in names if (p := shutil.which(n))), None)


class AMDGPUCompiler(Compiler):
  """Compiles the renderer's LLVM IR for `arch` with clang (-O3, no device libraries) and links it with ld.lld."""
  def __init__(self, arch: str = "gfx1100") -> None:
    if arch not in ARCHS: raise ValueError(f"unknown AMDGPU arch {arch!r}; known: {', '.join(ARCHS)}")
    self.arch = arch
    self.clang = find_tool(("clang-19",))
    self.lld = find_tool(("ld.lld-19", "ld.lld"))
    ver = "missing"
    if self.clang is not None:
      ver = subprocess.run([self.clang, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    super().__init__(f"amdgpu-{arch}-{ver}-O3-v2")

  def compile(self, src: str) -> bytes:
    if self.clang is None: raise CompileError("clang-19 not found: apt-get install clang-19 lld-19 (make sysdeps)", "", src)
    if self.lld is None: raise CompileError("ld.lld-19 not found: apt-get install lld-19 (make sysdeps)", "", src)
    with tempfile.TemporaryDirectory(prefix="plugrad-amd-") as d:
      obj, out = os.path.join(d, "k.o"), os.path.join(d, "k.hsaco")
      p = subprocess.run([self.clang, "-x", "ir", "-", "-target", "amdgcn-amd-amdhsa", f"-mcpu={self.arch}", "-O3", "-nogpulib", "-c", "-o", obj,
                          "-Wno-override-module"], input=src, capture_output=True, text=True)
      if p.returncode != 0: raise CompileError(f"clang-19 failed for {self.arch} (exit {p.returncode})", p.stderr, src)
      p = subprocess.run([self.lld, "-shared", "--no-undefined", obj, "-o", out], capture_output=True, text=True)
      if p.returncode != 0: raise CompileError(f"ld.lld failed for {self.arch} (exit {p.returncode})", p.stderr, src)
      with open(out, "rb") as f: elf = f.read()
    if elf_machine(elf) != EM_AMDGPU: raise CompileError(f"linker output is not an AMDGPU code object (e_machine {elf_machine(elf)})", "", src)
    if not any(n.endswith(".kd") for n in elf_symbols(elf)):
      raise CompileError("the source defines no amdgpu_kernel (no kernel descriptor in the code object)", "", src)
    return pack({"arch": self.arch}, elf)

  def disassemble(self, lib: bytes) -> str:
    _, elf = unpack(lib)
    tool = find_tool(("llvm-objdump-19", "llvm-objdump"))
    if tool is None: raise RuntimeError("llvm-objdump-19 not found: apt-get install llvm-19")
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
      f.write(elf)
      f.flush()
      return subprocess.run([tool, "-d", f"--mcpu={self.arch}", f.name], capture_output=True, text=True, check=True).stdout
