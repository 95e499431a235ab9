"""RDNA3 (gfx1100, wave32) instruction emulator: the mock KFD's kernel executor. It decodes the real machine code
clang emits (decode.py), compiles each instruction to a numpy closure over 32 lanes (compile.py, alu.py) and runs
dispatches wave by wave with per-workgroup LDS and barriers (emulator.py). Testing support only: the real runtime
never imports it. `install()` registers `execute` with plugrad_amd.mock.dispatch.set_executor."""
from __future__ import annotations

from plugrad_amd.mock import dispatch
from plugrad_amd.mock.rdna3.emulator import STATS, KernelDescriptor, execute, name_kernel
from plugrad_amd.mock.rdna3.wave import EmulatorError

__all__ = ["STATS", "EmulatorError", "KernelDescriptor", "execute", "install", "name_kernel"]


def install() -> None:
  """Make the RDNA3 emulator the mock's kernel executor."""
  dispatch.set_executor(execute)
