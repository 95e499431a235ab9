"""Renderer base: turns a linearized list of UOps into kernel source, and describes the target's capabilities.

Concrete renderers (C, PTX, AMDGPU, ...) live in plugins or in codegen; the capability attributes let codegen decide
what optimizations apply without knowing the device.
"""
from __future__ import annotations
from typing import Any, ClassVar, Sequence

class Renderer:
  """Base renderer. Subclasses set `name` and the capability attributes and implement `render`."""
  name: ClassVar[str] = "NONE"
  device: str = ""
  suffix: str = ""                       # kernel-name suffix used in DEBUG output and cache keys ("CLANG", "PTX")
  supports_float4: bool = False          # vector loads/stores of 4 floats
  has_local: bool = False                # workgroup (local) dimensions exist
  has_shared: bool = False               # workgroup shared memory exists
  global_max: tuple[int, ...] | None = None   # max workgroups per grid dimension (None: unlimited / loops)
  local_max: tuple[int, ...] | None = None    # max threads per workgroup dimension
  local_max_threads: int = 0             # max threads per workgroup; > 0 (with has_local) makes codegen emit SPECIAL ids
  shared_max: int = 0                    # bytes of shared memory per workgroup
  warp_size: int = 1                     # lanes that execute in lockstep (32 on CUDA and RDNA, 64 on CDNA)
  tensor_cores: list[Any] = []           # codegen.tc.TensorCore shapes the target has (WMMA)
  dot2: bool = False                     # WMMA "DOT2" on vectors: lane i = a[2i]*b[2i] + a[2i+1]*b[2i+1] + c[i], int16
                                         # a, b into int32 (codegen/vectorize.py; x86's pmaddwd)
  dot4: int = 0                          # WMMA "DOT4" on vectors: lane i = c[i] + the sum over j < 4 of a[4i+j]*b[4i+j],
                                         # uint8 a (codes at most this value; 0: no DOT4), int8 b (x86's vpdpbusd)
  pad_windows: bool = False              # the scheduler writes a reduction's padded, broadcast window input (a
                                         # convolution's padded x) into a buffer first: no bounds test per tap
  cache_bytes: tuple[int, int, int] = (0, 0, 0)  # data cache sizes (L1d and L2 per core, L3 shared); 0: unknown, and
                                         # codegen/opt.py then does no cache blocking

  def __init__(self, arch: str | None = None) -> None:
    self.arch = arch
    self.tensor_cores = list(type(self).tensor_cores)

  @classmethod
  def accepts_arch(cls, arch: str) -> bool:
    """Whether `arch` (lower-cased) names a target of this renderer; lets DEV=AMD::gfx1100 pick an arch for the default renderer."""
    return False

  def render(self, name: str, uops: list[Any]) -> str:
    """Source code of kernel `name` for the linearized `uops`."""
    raise NotImplementedError(f"renderer {type(self).__name__} cannot render kernels")

  def __repr__(self) -> str: return f"<{type(self).__name__} {self.name}{':' + self.arch if self.arch else ''}>"

def choose_renderer(device: str, options: Sequence[type[Renderer]], token: str | None, arch: str | None) -> Renderer:
  """Pick a renderer for `device` from the DEV fields: by name (case-insensitive), else the default renderer with `token` as arch."""
  if not options: return Renderer(arch)
  if not token: return options[0](arch)
  for r in options:
    if r.name.upper() == token.upper(): return r(arch)
  if arch is None and options[0].accepts_arch(token.lower()): return options[0](token.lower())
  names = ", ".join(r.name for r in options)
  raise ValueError(f"device {device}: unknown renderer {token!r}; its renderers are {names} (first is the default). "
                   f"Choose one with DEVICE::RENDERER[:ARCH], e.g. {device.split(':')[0]}::{options[0].name}")
