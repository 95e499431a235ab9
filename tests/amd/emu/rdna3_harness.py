"""Test harness for the RDNA3 emulator: compiles OpenCL C / LLVM IR with clang-19 + ld.lld-19 for gfx1100, loads the
code object's segments into a small GPUMemory implementation (allocations in a sparse address space, PageFault
outside them), builds kernargs and dispatches through plugrad_amd.mock.dispatch."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plugrad_amd.mock.dispatch import Dispatch, PageFault, execute
from plugrad_amd.mock.rdna3 import decode, disasm

CLANG, LLD, OBJDUMP = "clang-19", "ld.lld-19", "llvm-objdump-19"
HAVE_TOOLS = all(shutil.which(t) for t in (CLANG, LLD, OBJDUMP))
_CACHE = Path(tempfile.gettempdir()) / "plugrad-rdna3-emu-tests"
PRELUDE = """
#define LID_X __builtin_amdgcn_workitem_id_x()
#define LID_Y __builtin_amdgcn_workitem_id_y()
#define GID_X __builtin_amdgcn_workgroup_id_x()
#define GID_Y __builtin_amdgcn_workgroup_id_y()
#define BARRIER() do { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); \\
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); } while (0)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
"""


class TestMemory:
  """GPU memory for tests: each allocation is a bytearray at a 64 KiB-aligned address; a gap between them faults."""
  __test__ = False

  def __init__(self, base: int = 0x7F00_0000_0000):
    self.allocs: dict[int, bytearray] = {}
    self.next = base

  def alloc(self, size: int, data: bytes | None = None) -> int:
    addr = self.next
    self.allocs[addr] = bytearray(data if data is not None else bytes(size))
    self.next += (max(size, 1) + 0xFFFF) // 0x10000 * 0x10000 + 0x10000  # leave an unmapped gap after each allocation
    return addr

  def _find(self, addr: int, size: int) -> tuple[bytearray, int]:
    for base, buf in self.allocs.items():
      if base <= addr and addr + size <= base + len(buf): return buf, addr - base
    raise PageFault(addr, size)

  def read(self, addr: int, size: int) -> bytes:
    buf, off = self._find(addr, size)
    return bytes(buf[off:off + size])

  def write(self, addr: int, data: bytes) -> None:
    buf, off = self._find(addr, len(data))
    buf[off:off + len(data)] = data

  def view(self, addr: int, size: int) -> memoryview:
    buf, off = self._find(addr, size)
    return memoryview(buf)[off:off + size]

  def put(self, arr: np.ndarray) -> int:
    return self.alloc(arr.nbytes, np.ascontiguousarray(arr).tobytes())

  def get(self, addr: int, dtype: type, count: int) -> np.ndarray:
    return np.frombuffer(self.read(addr, np.dtype(dtype).itemsize * count), dtype).copy()


def reduce_source(block: int, groups: int) -> str:
  """An LDS tree reduction: `groups` workgroups of `block` threads each sum a strided share of `in` into out[group]."""
  return f"""
__kernel void reduce(__global float* out, __global const float* in, int n) {{
  __local float sh[{block}];
  int l = LID_X;
  float acc = 0.0f;
  for (int i = GID_X * {block} + l; i < n; i += {block} * {groups}) acc += in[i];
  sh[l] = acc;
  BARRIER();
  for (int s = {block // 2}; s > 0; s >>= 1) {{ if (l < s) sh[l] += sh[l + s]; BARRIER(); }}
  if (l == 0) out[GID_X] = sh[0];
}}
"""


def build(source: str, lang: str = "cl", opt: str = "-O2", extra: tuple[str, ...] = ()) -> Path:
  """Compile + link a gfx1100 code object (cached by source hash); returns the .so path."""
  _CACHE.mkdir(parents=True, exist_ok=True)
  text = PRELUDE + source if lang == "cl" else source
  key = hashlib.sha256((lang + opt + " ".join(extra) + text).encode()).hexdigest()[:24]
  so = _CACHE / f"{key}.so"
  if so.exists(): return so
  src, obj = _CACHE / f"{key}.{os.getpid()}.{lang}", _CACHE / f"{key}.{os.getpid()}.o"  # per process: xdist workers may race
  src.write_text(text)
  lang_flags = ["-x", "cl", "-cl-std=CL2.0"] if lang == "cl" else ["-x", "ir"]
  subprocess.run([CLANG, "-target", "amdgcn-amd-amdhsa", "-mcpu=gfx1100", "-nogpulib", opt, *lang_flags, *extra, "-c", str(src),
                  "-o", str(obj)], check=True, capture_output=True, text=True)
  tmp = so.with_suffix(f".{os.getpid()}.tmp.so")
  subprocess.run([LLD, "-shared", str(obj), "-o", str(tmp)], check=True, capture_output=True, text=True)
  tmp.replace(so)
  src.unlink()
  obj.unlink()
  return so


@dataclass
class CodeObject:
  path: Path
  base: int
  symbols: dict[str, int]

  def kernel(self, name: str) -> int:
    return self.base + self.symbols[name + ".kd"]


def _elf_symbols(data: bytes) -> dict[str, int]:
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum, _ = struct.unpack_from("<HHH", data, 0x3A)
  sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
  out: dict[str, int] = {}
  for sh in sections:
    if sh[1] != 2: continue  # SHT_SYMTAB
    strtab = sections[sh[6]]
    for j in range(sh[5] // 24):
      name_off, _, _, _, value, _ = struct.unpack_from("<IBBHQQ", data, sh[4] + j * 24)
      end = data.index(b"\0", strtab[4] + name_off)
      out[data[strtab[4] + name_off:end].decode()] = value
  return out


def load(mem: TestMemory, so: Path) -> CodeObject:
  """Map the code object's PT_LOAD segments into one allocation, as a loader does."""
  data = so.read_bytes()
  phoff, = struct.unpack_from("<Q", data, 0x20)
  phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
  segs = [struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize) for i in range(phnum)]
  loads = [s for s in segs if s[0] == 1]
  size = max(s[3] + s[6] for s in loads)
  image = bytearray(size)
  for s in loads: image[s[3]:s[3] + s[5]] = data[s[2]:s[2] + s[5]]
  base = mem.alloc(size, bytes(image))
  return CodeObject(so, base, _elf_symbols(data))


def kernargs(mem: TestMemory, *args: int | float | np.integer, fmt: str | None = None) -> int:
  """Pack kernel arguments (pointers as 8-byte ints unless `fmt` says otherwise) into a kernarg allocation."""
  if fmt is None: fmt = "".join("Q" if isinstance(a, int) and a > 0xFFFFFFFF else "f" if isinstance(a, float) else "i" for a in args)
  raw = b""
  for f, a in zip(fmt, args):
    size = struct.calcsize(f)
    raw += b"\0" * (-len(raw) % size) + struct.pack("<" + f, a)
  return mem.alloc(max(len(raw), 256) + 256, raw + bytes(256))


def run(mem: TestMemory, co: CodeObject, name: str, grid: tuple[int, ...], block: tuple[int, ...], karg: int,
             lds: int = 0, scratch: int = 0) -> None:
  g = tuple(grid) + (1,) * (3 - len(grid))
  b = tuple(block) + (1,) * (3 - len(block))
  execute(mem, Dispatch(co.kernel(name), karg, g, b, lds, scratch, "gfx1100"))


def objdump(so: Path) -> str:
  return subprocess.run([OBJDUMP, "-d", "--mcpu=gfx1100", str(so)], check=True, capture_output=True, text=True).stdout


def crosscheck(so: Path) -> list[tuple[str, str]]:
  """Decode every kernel of `so` with the emulator's decoder and compare with llvm-objdump; returns mismatches."""
  mismatches = []
  cur = None
  for line in objdump(so).splitlines():
    m = re.match(r"^([0-9a-f]+) <(.*)>:$", line)
    if m: cur = m.group(2); continue
    m = re.match(r"^\s+(.*?)\s*// ([0-9A-F]+): ((?:[0-9A-F]{8} ?)+)", line)
    if not m or cur is None: continue
    words = [int(x, 16) for x in m.group(3).split()]
    raw = b"".join(struct.pack("<I", x) for x in words)
    inst = decode.decode_one(raw + bytes(8), 0)
    mine, theirs = disasm.text(inst), disasm.normalize(m.group(1))
    if inst.enc == "SOPP" and "branch" not in (inst.name or ""): theirs = theirs.split(" ")[0]
    if inst.size != len(raw) or mine != theirs: mismatches.append((theirs, mine))
  return mismatches
