"""A PTX interpreter: runs the PTX that NVRTC emits for plugrad's CUDA kernels on numpy, as the kernel executor of the
mock CUDA driver (`DEV=MOCK+NV`, plugrad_nv.mock.libcuda). Testing support only: the real runtime never imports it.

  prog = compile_ptx(text)                                # parse + build closures, cached per text
  mod = LoadedModule(prog, arena, device=0, arch=(9, 0))  # module globals allocated in the mock GPU's memory
  mod.launch("E_4", grid, block, params)                  # params: the kernel's parameter buffer (bytes)

See README.md in this folder for what is modelled and how.
"""
from plugrad_nv.mock.ptx.machine import KernelFault, LoadedModule, compile_ptx
from plugrad_nv.mock.ptx.parser import PTXSyntaxError, parse
from plugrad_nv.mock.ptx.program import PTXError, Unimplemented

__all__ = ["KernelFault", "LoadedModule", "PTXError", "PTXSyntaxError", "Unimplemented", "compile_ptx", "parse"]
