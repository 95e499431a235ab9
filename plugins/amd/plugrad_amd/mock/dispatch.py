"""The mock KFD's dispatch record and GPU memory protocol, shared by the mock and its kernel executor (the RDNA3
emulator in mock/rdna3). Written from the GPU IR contract's "AMD mock executor hook" text."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class PageFault(RuntimeError):
  """A GPU access outside any allocation."""
  def __init__(self, addr: int, size: int):
    super().__init__(f"GPU page fault: access of {size} bytes at {addr:#x} is outside any allocation")
    self.addr, self.size = addr, size


class GPUMemory(Protocol):
  def read(self, addr: int, size: int) -> bytes: ...
  def write(self, addr: int, data: bytes) -> None: ...
  def view(self, addr: int, size: int) -> memoryview: ...


@dataclass(frozen=True)
class Dispatch:
  kernel_object: int
  kernarg_address: int
  grid_size: tuple[int, int, int]
  workgroup_size: tuple[int, int, int]
  group_segment_size: int
  private_segment_size: int
  arch: str


Executor = Callable[[GPUMemory, Dispatch], None]
_executor: Executor | None = None


def set_executor(fn: Executor | None) -> Executor | None:
  """Register the kernel executor (None removes it); returns the previous one."""
  global _executor
  prev, _executor = _executor, fn
  return prev


def get_executor() -> Executor | None:
  return _executor


def execute(mem: GPUMemory, d: Dispatch) -> None:
  """Run a dispatch on the registered executor; RuntimeError when there is none."""
  if _executor is None: raise RuntimeError(f"no kernel executor for {d.arch}")
  _executor(mem, d)
