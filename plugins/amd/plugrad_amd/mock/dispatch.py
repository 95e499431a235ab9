"""The mock KFD's dispatch record and GPU memory protocol, shared by the mock and its kernel executor (the RDNA3
emulator in mock/rdna3). Written from the GPU IR contract's "AMD mock executor hook" text."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class PageFault(Exception):
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
  arch: str = "gfx1100"


Executor = Callable[[GPUMemory, Dispatch], None]
_executor: Executor | None = None


def set_executor(fn: Executor | None) -> None:
  global _executor
  _executor = fn


def get_executor() -> Executor | None:
  return _executor


def run_dispatch(mem: GPUMemory, d: Dispatch) -> None:
  if _executor is None: raise RuntimeError(f"no kernel executor for {d.arch}")
  _executor(mem, d)
