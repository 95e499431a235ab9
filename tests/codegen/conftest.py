"""Shared helpers of the codegen tests: the capability data of a host shape, for tests of the CPU heuristic's choices
that must not depend on the machine the suite runs on (an AVX-512 and an AVX2 host pick different tiles)."""
from __future__ import annotations

import pytest


class HostCaps:
  """The capability data heuristic_opts reads, for a host of the given caches and vector shape (no device needed):
  AVX-512-shaped by default (16 float lanes, 32 registers), AVX2 with lanes=8, regs=16."""
  upcast_max, vectorizes_reductions = 64, True
  def __init__(self, l3: int = 32 << 20, lanes: int = 16, regs: int = 32) -> None:
    self.cache_bytes, self.vector_lanes, self.vector_regs = (48 << 10, 1 << 20, l3), lanes, regs


@pytest.fixture
def host_caps() -> type[HostCaps]: return HostCaps
