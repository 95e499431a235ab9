"""Fixtures every test area shares: `cpu_host`, the CPU device as a named kind of host.

The CPU renderer's capability record (vector lanes and registers, byte dot products) comes from the host's feature
flags, and the heuristics, the LLM's weight layouts and the kernels they pick follow it. A test of such a choice states
the host it describes: it takes `cpu_host` (both kinds, one after the other) or parametrizes it indirectly, and
asserts per kind, so it passes on every machine the suite runs on. The kernels stay correct whatever the record says
(the vector types compile to narrower instructions, the intrinsics are guarded), so values are checked too.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def host_kind(kind: str) -> Iterator[str]:
  """The CPU device's renderer with the capability record the cpu plugin derives from `kind`'s flags; the schedules
  (whose kernels' optimizations follow the record) and the compiled programs are forgotten on entry and on exit."""
  from plugrad.device import Device
  from plugrad.engine import realize
  from plugrad.schedule import kernelize
  from plugrad_cpu.device import HOST_KINDS, simd_caps
  ren = Device["CPU"].renderer
  saved = ren.caps
  def forget() -> None:
    realize._RUNNERS.clear()
    kernelize._SCHEDULE_CACHE.clear()
  forget()
  try:
    ren.caps = dataclasses.replace(saved, **simd_caps(HOST_KINDS[kind]))
    yield kind
  finally:
    ren.caps = saved
    forget()


@pytest.fixture(params=["avx2", "avx512"])
def cpu_host(request) -> Iterator[str]:
  """The CPU device as an AVX2 host, then as an AVX-512 VNNI one (see `host_kind`); the value is the kind's name."""
  with host_kind(request.param) as kind: yield kind
