"""The mock KFD's kernel-executor hook (docs/amd.md, GPU contract): what a dispatch is and who runs it.

The mock decodes each dispatch the runtime wrote into a `Dispatch` and hands it, with the mock GPU's memory, to the
executor registered with `set_executor` (the RDNA3 emulator in plugrad_amd.mock.rdna3 registers itself). With none
registered a dispatch is an error. Memory accesses outside any allocation raise `PageFault`, like the GPU's MMU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol


@dataclass(frozen=True)
class TraceTarget:
  """The thread-trace (SQTT) programming of one shader engine when a dispatch starts, as the command processor saw
  SQ_THREAD_TRACE_MASK / TOKEN_MASK: which shader array, WGP and SIMD get instruction tokens, the token kinds excluded
  (bit n of `token_exclude` drops kind n: soc21_enum's SQ_TT_TOKEN_EXCLUDE_*_SHIFT), and `write`, which appends
  bytes to this shader engine's trace buffer (the command processor keeps its write pointer and drops what overflows)."""
  se: int
  sa_sel: int
  wgp_sel: int
  simd_sel: int
  token_exclude: int
  write: Callable[[bytes], None]


@dataclass(frozen=True)
class Dispatch:
  """One kernel launch as the hardware sees it."""
  kernel_object: int                        # GPU virtual address of the 64-byte amdhsa kernel descriptor
  kernarg_address: int
  grid_size: tuple[int, int, int]           # in work-items, as in the AQL packet
  workgroup_size: tuple[int, int, int]
  group_segment_size: int                   # LDS bytes
  private_segment_size: int                 # scratch bytes per work-item
  arch: str                                 # "gfx1100"
  sqtt: tuple[TraceTarget, ...] = ()        # the shader engines tracing this dispatch (empty: thread trace off)
  shader_engines: int = 6                   # how many shader engines the GPU spreads workgroups over


class PageFault(RuntimeError):
  """A GPU access outside every allocation."""
  def __init__(self, addr: int, size: int) -> None:
    super().__init__(f"GPU page fault: access of {size} byte(s) at {addr:#x} is outside every allocation")
    self.addr, self.size = addr, size


class GPUMemory(Protocol):
  def read(self, addr: int, size: int) -> bytes: ...
  def write(self, addr: int, data: bytes) -> None: ...
  def view(self, addr: int, size: int) -> memoryview: ...


Executor = Callable[[GPUMemory, Dispatch], None]
_executor: Optional[Executor] = None


def set_executor(fn: Optional[Executor]) -> Optional[Executor]:
  """Register the kernel executor (None removes it); returns the previous one."""
  global _executor
  prev, _executor = _executor, fn
  return prev


def get_executor() -> Optional[Executor]: return _executor


def execute(mem: GPUMemory, d: Dispatch) -> None:
  """Run a dispatch on the registered executor; RuntimeError when there is none."""
  if _executor is None: raise RuntimeError(f"no kernel executor for {d.arch}")
  _executor(mem, d)
