"""GPU targets as data: the launch limits, memory sizes and tensor cores codegen reads for each GPU architecture.

Core never imports a plugin: GPU renderers (plugins/nv, plugins/amd) import these records and take their capability
record from them (`GPUTarget.caps()`), and `EMULATE=<name> DEV=PYTHON` makes the PYTHON device's renderer take the
same, so the emulated GPU is optimized exactly like the real one; nothing else states a GPU's limits. Limits are the
hardware's (CUDA programming guide, compute capability tables; AMD ISA guides / HSA agent info): `global_max` is the
number of workgroups per grid dim, `local_max` the threads per workgroup dim, `local_max_threads` the threads per workgroup, `shared_max` the bytes of
shared memory (LDS) one workgroup may use.
"""
from __future__ import annotations

from dataclasses import dataclass

from plugrad.runtime.renderer import Capabilities
from plugrad.codegen.tc import TC_AMD_CDNA3, TC_AMD_RDNA3, TC_AMD_RDNA4, TC_CUDA_SM80, TC_CUDA_SM90, TensorCore


@dataclass(frozen=True)
class GPUTarget:
  """One GPU architecture, as codegen sees it."""
  name: str                        # EMULATE name ("CUDA", "AMD", ...)
  arch: str                        # compiler target ("sm_90", "gfx1100")
  warp_size: int                   # lanes of a warp / wave that execute in lockstep
  global_max: tuple[int, int, int]  # workgroups per grid dim (dim 0 = x)
  local_max: tuple[int, int, int]  # threads per workgroup dim
  local_max_threads: int           # threads per workgroup
  shared_max: int                  # bytes of shared memory / LDS per workgroup
  tensor_cores: tuple[TensorCore, ...] = ()
  # roofline figures for BENCHMARKS.md (the emulator's counters divided by these)
  mem_bw: float = 0.0              # bytes/s of global memory
  peak_flops: dict[str, float] | None = None  # FLOP/s by dtype name ("float32", "float16" on tensor cores)

  def caps(self) -> Capabilities:
    """The capability record of a renderer for this target (docs/backends.md lists what codegen reads)."""
    return Capabilities(has_local=True, has_shared=True, global_max=self.global_max, local_max=self.local_max,
                        local_max_threads=self.local_max_threads, shared_max=self.shared_max, warp_size=self.warp_size,
                        tensor_cores=tuple(self.tensor_cores))


_CUDA_GRID = (2**31 - 1, 65535, 65535)
_AMD_GRID = (2**31 - 1, 65535, 65535)  # the AQL packet holds grid sizes in work-items (u32); HIP caps y/z like CUDA
CUDA = GPUTarget("CUDA", "sm_90", 32, _CUDA_GRID, (1024, 1024, 64), 1024, 48 * 1024, TC_CUDA_SM90,
                 mem_bw=4.8e12, peak_flops={"float32": 67e12, "float16": 989e12})  # H200 SXM
CUDA_SM80 = GPUTarget("CUDA_SM80", "sm_80", 32, _CUDA_GRID, (1024, 1024, 64), 1024, 48 * 1024, TC_CUDA_SM80,
                      mem_bw=2.0e12, peak_flops={"float32": 19.5e12, "float16": 312e12})  # A100 80GB
AMD = GPUTarget("AMD", "gfx1100", 32, _AMD_GRID, (1024, 1024, 1024), 1024, 64 * 1024, TC_AMD_RDNA3,
                mem_bw=0.96e12, peak_flops={"float32": 61e12, "float16": 123e12})  # RX 7900 XTX
AMD_RDNA4 = GPUTarget("AMD_RDNA4", "gfx1201", 32, _AMD_GRID, (1024, 1024, 1024), 1024, 64 * 1024, TC_AMD_RDNA4,
                      mem_bw=0.64e12, peak_flops={"float32": 48e12, "float16": 195e12})  # RX 9070 XT
AMD_CDNA3 = GPUTarget("AMD_CDNA3", "gfx942", 64, _AMD_GRID, (1024, 1024, 1024), 1024, 64 * 1024, TC_AMD_CDNA3,
                      mem_bw=5.3e12, peak_flops={"float32": 163e12, "float16": 1307e12})  # MI300X
AMD_CDNA2 = GPUTarget("AMD_CDNA2", "gfx90a", 64, _AMD_GRID, (1024, 1024, 1024), 1024, 64 * 1024, (),
                      mem_bw=1.6e12, peak_flops={"float32": 47.9e12, "float16": 383e12})  # MI250X (one GCD pair)

TARGETS: dict[str, GPUTarget] = {t.name: t for t in (CUDA, CUDA_SM80, AMD, AMD_RDNA4, AMD_CDNA3, AMD_CDNA2)}


def get_target(name: str) -> GPUTarget:
  """The target called `name` (case-insensitive); a ValueError lists the known ones."""
  if (t := TARGETS.get(name.upper())) is None: raise ValueError(f"unknown GPU target {name!r}; known: {', '.join(TARGETS)}")
  return t
