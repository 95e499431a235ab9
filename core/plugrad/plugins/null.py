"""The NULL device: fake allocations, no data, no compute.

Semantics (relied on by schedule/codegen tests): alloc returns an opaque handle and never runs out of memory;
copyin discards the data; copyout fills the destination with zeros; offset views work; the compiler returns b""
(nothing is cached on disk); programs accept any launch, do nothing, and report 0.0 s when asked to wait.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any
from plugrad.device import Allocator, BufferOptions, Compiled, Compiler, Program, Renderer

@dataclass(frozen=True)
class NullHandle:
  """An opaque fake allocation: just its size and offset into a fake base."""
  nbytes: int
  offset: int = 0

class NullAllocator(Allocator):
  def _alloc(self, size: int, options: BufferOptions) -> NullHandle: return NullHandle(size)
  def _free(self, opaque: NullHandle, size: int, options: BufferOptions) -> None: pass
  def _copyin(self, dest: NullHandle, src: memoryview) -> None: pass
  def _copyout(self, dest: memoryview, src: NullHandle) -> None: dest[:] = bytes(dest.nbytes)
  def _offset(self, opaque: NullHandle, size: int, offset: int) -> NullHandle: return NullHandle(size, opaque.offset + offset)
  def _transfer(self, dest: Any, src: Any, nbytes: int, src_dev: Compiled, dest_dev: Compiled) -> None: pass

class NullRenderer(Renderer):
  name = "NULL"
  device = "NULL"
  def render(self, name: str, uops: list[Any]) -> str: return f"/* NULL kernel {name}: {len(uops)} uops */"

class NullCompiler(Compiler):
  def __init__(self) -> None: super().__init__(None)
  def compile(self, src: str) -> bytes: return b""

class NullProgram(Program):
  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    self.check_launch(global_size, local_size)
    return 0.0 if wait else None

class NullDevice(Compiled):
  compute = False
  fake = True  # plugrad-devices: data does not round-trip, by design
  def __init__(self, device: str) -> None:
    super().__init__(device, NullAllocator(), [NullRenderer], NullCompiler(), NullProgram)
