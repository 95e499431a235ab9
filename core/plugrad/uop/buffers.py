"""BUFFER nodes and views of them: the graph predicates the frontend, the scheduler and the apps share.

A buffer view is a BUFFER (or a scheduler placeholder for one: PARAM, BUFFER_VIEW) seen through movement ops only;
reading one needs no kernel. `contiguous_range` says which views are a row-major range of their base.
"""
from __future__ import annotations

import itertools

from plugrad.uop.ops import GroupOp, Ops, UOp

_unique = itertools.count()


def new_buffer(device: str, size: int, dtype) -> UOp:
  """A fresh BUFFER node: (UNIQUE, DEVICE) sources make each one distinct."""
  return UOp(Ops.BUFFER, dtype, (UOp(Ops.UNIQUE, arg=next(_unique)), UOp(Ops.DEVICE, arg=device)), arg=size)


def is_buffer_view(u: UOp) -> bool:
  """True for a BUFFER (or a scheduler placeholder for one) seen through movement ops only: no kernel needed."""
  while u.op in GroupOp.Movement: u = u.src[0]
  return u.op in (Ops.BUFFER, Ops.PARAM, Ops.BUFFER_VIEW)


def buffer_of(u: UOp) -> UOp:
  while u.op in GroupOp.Movement: u = u.src[0]
  return u


def contiguous_range(u: UOp) -> tuple[UOp, int, UOp]:
  """(base, element offset, top) for a buffer view `u`: `top` is the outermost node of u's movement chain whose elements
  are base[offset : offset+top.numel()] in row-major order (reshapes, shrinks that keep a row-major range, and
  permutes that only move axes of size 1); it is `u` itself when all of u is such a range."""
  chain = []
  while u.op in GroupOp.Movement: chain, u = chain + [u], u.src[0]
  base, off, top = u, 0, u
  for m in reversed(chain):
    shape = top.shape
    if m.op is Ops.SHRINK and all(isinstance(x, int) for x in (*shape, *(v for be in m.arg for v in be))):
      outer = [i for i, (b, e) in enumerate(m.arg) if (b, e) != (0, shape[i])]
      if outer and any(e - b != 1 for b, e in m.arg[:outer[-1]]) and m.numel() != 0: break
      stride = 1
      for (b, _), s in zip(reversed(m.arg), reversed(shape)): off, stride = off + b * stride, stride * s
    elif m.op is Ops.PERMUTE:
      moved = [p for p in m.arg if not (isinstance(shape[p], int) and shape[p] == 1)]
      if moved != sorted(moved): break
    elif m.op is not Ops.RESHAPE: break
    top = m
  return base, off, top
