"""Shared pieces of the codegen tests (a module of its own: several test folders have a conftest.py, so importing
"conftest" is ambiguous): the capability record of a host shape, for tests of the CPU heuristic's choices that must not
depend on the machine the suite runs on (an AVX-512 and an AVX2 host pick different tiles), and a copy of a renderer
with some capabilities changed."""
from __future__ import annotations

import copy
import dataclasses

from plugrad.runtime.renderer import Capabilities, Renderer


def host_record(l3: int = 32 << 20, lanes: int = 16, regs: int = 32) -> Capabilities:
  """The capability record heuristic_opts reads, for a host of the given caches and vector shape (no device needed):
  AVX-512-shaped by default (16 float lanes, 32 registers), AVX2 with lanes=8, regs=16."""
  return Capabilities(upcast_max=64, vectorizes_reductions=True, cache_bytes=(48 << 10, 1 << 20, l3), vector_lanes=lanes, vector_regs=regs)


def with_caps(ren: Renderer, **fields) -> Renderer:
  """A copy of renderer `ren` whose capability record has `fields` changed (the live renderer is left alone)."""
  out = copy.copy(ren)
  out.caps = dataclasses.replace(ren.caps, **fields)
  return out
