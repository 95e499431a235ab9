"""Launch dimensions: map a kernel's global and local ranges onto hardware ids (`Ops.SPECIAL`) under a renderer's limits.

GPU renderers (`has_local` and `local_max_threads` > 0) run every "global" RANGE of an optimized kernel AST as a
workgroup id (`SPECIAL gidx0..2`) and every "local" RANGE (made by the LOCAL / GROUP optimizations) as a thread id
inside the workgroup (`SPECIAL lidx0..2`). The innermost range (highest id: the contiguous output axis) goes on dim 0,
the fastest-varying hardware dim. When a kernel has more ranges than the hardware has dims, the outermost ones share
the last dim (`r_inner = s % n_inner`, `r_outer = s // n_inner`); a range larger than its dim's limit is split over a
free dim (`r = s_hi * a + s_lo`, exact when `a` divides its size, else rounded up with every memory access of the
kernel gated by `r < size`). Each id expression is checked with the symbolic engine's bounds (it covers exactly
`[0, size)`) before it replaces the range. Sizes may be symbolic: `ProgramSpec.global_size` then holds index
expressions over the kernel's variables, evaluated at launch (`ProgramSpec.launch_dims`).

CPU-style renderers keep their loops: the pass returns the AST unchanged with `global_size = [1, 1, 1]` and
`local_size = None`, and the renderer runs its outermost global loop across cores (the OUTER optimization picks it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from plugrad.dtype import dtypes
from plugrad.runtime.renderer import Capabilities
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import pm_symbolic, sint


@dataclass
class LaunchDims:
  ast: UOp
  global_size: list[sint]
  local_size: list[int] | None


def uses_gpudims(caps: Capabilities) -> bool:
  """Whether a target with capabilities `caps` runs kernels on hardware ids (a GPU) rather than loops."""
  return caps.threads


def _c(x: int) -> UOp: return UOp.const(dtypes.index, x)


def _size(u: UOp) -> sint: return u.arg if u.op is Ops.CONST else u


def _split_factor(n: int, lim: int, lim_hi: int) -> int | None:
  """The largest divisor a of n with a <= lim and n // a <= lim_hi (None when none fits)."""
  best = None
  for a in range(1, math.isqrt(n) + 1):
    if n % a: continue
    for d in (a, n // a):
      if d <= lim and n // d <= lim_hi and (best is None or d > best): best = d
  return best


def _plan(ranges: list[UOp], limits: tuple[int, ...]) -> list[list[UOp]]:
  """Ranges (innermost first) grouped into at most len(limits) hardware dims: the outermost ones merge into the last dim."""
  groups = [[r] for r in ranges]
  while len(groups) > len(limits): groups[-2:] = [groups[-2] + groups[-1]]
  return groups


def _dim_size(group: list[UOp]) -> UOp:
  s = _c(1)
  for r in group: s = s * r.src[0]
  return graph_rewrite(s, pm_symbolic, name="dim size")


def _assign(ranges: list[UOp], limits: tuple[int, ...], prefix: str) -> tuple[dict[UOp, UOp], list[UOp], UOp | None]:
  """(range -> id expression, the SPECIAL per hardware dim, validity condition or None) for `ranges` (innermost first)."""
  groups = _plan(ranges, limits)
  sizes = [_dim_size(g) for g in groups]
  # a dim over its limit is split over a free dim: (lo, hi) sizes, hi on the next free dim
  split: dict[int, tuple[UOp, UOp, bool]] = {}
  n_dims = len(groups)
  for d, sz in enumerate(sizes):
    if sz.vmax <= limits[d]: continue
    if n_dims >= len(limits): raise ValueError(f"{prefix} dim {d} of size {sz.render()} exceeds the limit {limits[d]} and no dim is free to split it")
    lim_hi = limits[n_dims]
    a = _split_factor(sz.arg, limits[d], lim_hi) if sz.op is Ops.CONST else None
    if a is not None: split[d] = (_c(a), _c(sz.arg // a), True)
    else:
      a = limits[d]
      hi = graph_rewrite((sz + (a - 1)) // a, pm_symbolic, name="split size")
      if hi.vmax > lim_hi: raise ValueError(f"{prefix} dim {d} of size {sz.render()} doesn't fit in the launch limits {limits}")
      split[d] = (_c(a), hi, False)
    n_dims += 1
  specials: list[UOp] = []
  hw_index: list[UOp] = []
  extra = len(groups)
  for d in range(len(groups)):
    if d in split:
      lo_sz, hi_sz, _ = split[d]
      lo = UOp(Ops.SPECIAL, dtypes.index, (lo_sz,), f"{prefix}{d}")
      hi = UOp(Ops.SPECIAL, dtypes.index, (hi_sz,), f"{prefix}{extra}")
      extra += 1
      hw_index.append(hi * lo_sz + lo)
      specials += [lo, hi]
    else:
      specials.append(s := UOp(Ops.SPECIAL, dtypes.index, (sizes[d],), f"{prefix}{d}"))
      hw_index.append(s)
  valid = None
  for d, (_, _, exact) in split.items():
    if not exact: valid = (hw_index[d] < sizes[d]) if valid is None else valid & (hw_index[d] < sizes[d])
  mapping: dict[UOp, UOp] = {}
  for d, g in enumerate(groups):
    stride: UOp = _c(1)
    for i, r in enumerate(g):
      e = hw_index[d] if stride.op is Ops.CONST and stride.arg == 1 else hw_index[d] // stride
      if i < len(g) - 1: e = e % r.src[0]
      e = graph_rewrite(e, pm_symbolic, name="gpu index")
      _check_cover(e, r, exact=valid is None)
      mapping[r] = e
      stride = stride * r.src[0]
  return mapping, sorted(specials, key=lambda s: s.arg), valid


def _check_cover(e: UOp, r: UOp, exact: bool) -> None:
  """The symbolic engine's bounds of id expression `e` must lie inside range `r` (exact launches: [0, size))."""
  if e.vmin < 0 or (exact and r.src[0].op is Ops.CONST and e.vmax > r.src[0].arg - 1):
    raise AssertionError(f"gpudims: id expression {e.render()} for range {r.arg} of size {r.src[0].render()} has bounds [{e.vmin}, {e.vmax}]")


def _gate_all(ast: UOp, valid: UOp) -> UOp:
  """Every global memory access gated by `valid` (threads of a rounded-up launch past the end do nothing)."""
  subs = {}
  for n in ast.toposort():
    if n.op is Ops.INDEX and n.src[0].op is Ops.DEFINE_GLOBAL:
      subs[n] = n.replace(src=(n.src[0], n.src[1], valid if len(n.src) < 3 else n.src[2] & valid))
  return ast.substitute(subs)


def gpudims(ast: UOp, caps: Capabilities) -> LaunchDims:
  """Replace the global/local ranges of `ast` with SPECIAL ids for a GPU target (see the module docstring)."""
  if not caps.threads: return LaunchDims(ast, [1, 1, 1], None)
  rngs = [n for n in ast.toposort() if n.op is Ops.RANGE]
  glbl = sorted((r for r in rngs if r.arg[1] == "global"), key=lambda r: -r.arg[0])
  lcl = sorted((r for r in rngs if r.arg[1] == "local"), key=lambda r: -r.arg[0])
  gmax = tuple(caps.global_max or (2**31 - 1,) * 3)
  lmax = tuple(caps.local_max or (caps.local_max_threads,) * 3)
  gmap, gspec, gvalid = _assign(glbl, gmax, "gidx")
  lmap, lspec, lvalid = _assign(lcl, lmax, "lidx")
  if lvalid is not None: raise ValueError(f"local dims {[r.src[0].render() for r in lcl]} don't fit the local limits {lmax}")
  local_size = [1, 1, 1]
  for s in lspec: local_size[int(s.arg[4:])] = s.src[0].arg
  if math.prod(local_size) > caps.local_max_threads:
    raise ValueError(f"workgroup of {local_size} threads exceeds the renderer's {caps.local_max_threads} threads per group")
  global_size: list[sint] = [1, 1, 1]
  for s in gspec: global_size[int(s.arg[4:])] = _size(s.src[0])
  ast = ast.substitute({**gmap, **lmap})
  if gvalid is not None: ast = _gate_all(ast, gvalid)
  return LaunchDims(ast, global_size, local_size)
