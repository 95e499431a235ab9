"""Renderer base: turns a linearized list of UOps into kernel source, and declares the target's capabilities.

Concrete renderers (C, CUDA, AMDGPU, ...) live in plugins or in codegen. Everything codegen and the scheduler may know
about a target is one record, `Renderer.caps` (a `Capabilities`): the optimizer, the vectorizer, the launch-dimension
pass and the scheduler read it and nothing else, so a backend states what its hardware has in one place (GPU records
are built from codegen/targets.py's `GPUTarget`s, docs/backends.md lists the fields).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from plugrad.uop.enums import Ops

if TYPE_CHECKING: from plugrad.uop.upat import PatternMatcher

# ops that C vector extensions (and most SIMD targets) compute lane by lane with the scalar semantics
DEFAULT_VECTOR_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.RECIPROCAL, Ops.MULACC, Ops.CAST,
                                Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR})


@dataclass(frozen=True)
class Capabilities:
  """What a target offers codegen (the defaults: nothing, a scalar target that runs plain loops).

  Loops and registers (CPU-style targets):
  - `upcast_max`: outputs/accumulators one loop iteration may compute (register blocking; 0: no optimizations at all)
  - `vector_lanes`, `vector_regs`: explicit SIMD: float32 lanes of one vector register (0: none), and how many there are
  - `vector_ops`: the ops rendered on vector types (others are split into lanes)
  - `vectorizes_reductions`: the compiler vectorizes a plain single-accumulator reduce loop itself
  - `dot2`: WMMA "DOT2" on vectors: lane i = a[2i]*b[2i] + a[2i+1]*b[2i+1] + c[i], int16 a, b into int32 (pmaddwd)
  - `dot4`: WMMA "DOT4" on vectors: lane i = c[i] + sum over j < 4 of a[4i+j]*b[4i+j], uint8 a at most this value
    (0: none), int8 b (vpdpbusd)
  - `f16_vectors`: contiguous float16 loads become vectors converted to float32 lanes in hardware (x86 F16C's
    vcvtph2ps); without it each lane converts on its own
  - `cache_bytes`: (L1d, L2 per core, L3 shared) data cache bytes; 0: unknown (no cache blocking)
  - `pad_windows`: the scheduler writes a reduction's padded, broadcast window input (a convolution's padded x) into a
    buffer first, so its taps load without bounds tests
  Hardware threads (GPU targets; `GPUTarget.caps()` builds these):
  - `has_local`, `has_shared`: workgroups exist; workgroup shared memory exists
  - `global_max`, `local_max`: workgroups per grid dim, threads per workgroup dim (None: unlimited / the thread limit)
  - `local_max_threads`: threads per workgroup; > 0 with `has_local` makes codegen emit SPECIAL ids (`threads`)
  - `shared_max`: bytes of shared memory one workgroup may use
  - `warp_size`: lanes that execute in lockstep (32 on CUDA and RDNA, 64 on CDNA)
  - `tensor_cores`: the codegen.tc.TensorCore shapes the target has (WMMA)
  """
  upcast_max: int = 0
  vector_lanes: int = 0
  vector_regs: int = 16
  vector_ops: frozenset[Ops] = DEFAULT_VECTOR_OPS
  vectorizes_reductions: bool = False
  dot2: bool = False
  dot4: int = 0
  f16_vectors: bool = False
  cache_bytes: tuple[int, int, int] = (0, 0, 0)
  pad_windows: bool = False
  has_local: bool = False
  has_shared: bool = False
  global_max: tuple[int, ...] | None = None
  local_max: tuple[int, ...] | None = None
  local_max_threads: int = 0
  shared_max: int = 0
  warp_size: int = 1
  tensor_cores: tuple[Any, ...] = field(default=())

  @property
  def threads(self) -> bool:
    """Whether kernels run on hardware ids (a GPU: ranges become SPECIALs) rather than loops."""
    return self.has_local and self.local_max_threads > 0


class Renderer:
  """Base renderer. Subclasses set `name` and `caps` and implement `render`."""
  name: ClassVar[str] = "NONE"
  device: str = ""
  suffix: str = ""                       # kernel-name suffix used in DEBUG output and cache keys ("CLANG", "PTX")
  caps: Capabilities = Capabilities()    # the one record codegen reads (an instance may replace it: dataclasses.replace)
  # codegen's "decompositions" pass (codegen/__init__.py PIPELINE): a uop.upat.PatternMatcher rewriting the optimized
  # kernel AST's ops the target lacks into ones it has, before linearizing (None: nothing to rewrite)
  extra_matcher: PatternMatcher | None = None

  def __init__(self, arch: str | None = None) -> None:
    self.arch = arch

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
