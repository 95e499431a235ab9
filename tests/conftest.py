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
def cpu_record(**fields) -> Iterator[None]:
  """The CPU device's renderer with `fields` of its capability record replaced; the schedules (whose kernels'
  optimizations follow the record) and the compiled programs are forgotten on entry and on exit."""
  from plugrad.device import Device
  from plugrad.engine import realize
  from plugrad.schedule import kernelize
  ren = Device["CPU"].renderer
  saved = ren.caps
  def forget() -> None:
    realize._RUNNERS.clear()
    kernelize._SCHEDULE_CACHE.clear()
  forget()
  try:
    ren.caps = dataclasses.replace(saved, **fields)
    yield
  finally:
    ren.caps = saved
    forget()


@contextmanager
def host_kind(kind: str) -> Iterator[str]:
  """The CPU device's renderer with the capability record the cpu plugin derives from `kind`'s flags (`cpu_record`)."""
  from plugrad_cpu.device import HOST_KINDS, simd_caps
  with cpu_record(**simd_caps(HOST_KINDS[kind])): yield kind


@pytest.fixture
def cpu_caps():
  """`cpu_record`, for a test to run part of its body with some fields of the CPU's capability record replaced."""
  return cpu_record


@pytest.fixture
def unknown_l2() -> Iterator[None]:
  """The CPU device with its L2 size unknown: a matmul's column operand is packed however small it is (the heuristic
  reads an operand that fits in L2 in place), for tests of the packing itself on small matrices."""
  from plugrad.device import Device
  l1, _, l3 = Device["CPU"].renderer.caps.cache_bytes
  with cpu_record(cache_bytes=(l1, 0, l3)): yield


@pytest.fixture(params=["avx2", "avx512"])
def cpu_host(request) -> Iterator[str]:
  """The CPU device as an AVX2 host, then as an AVX-512 VNNI one (see `host_kind`); the value is the kind's name."""
  with host_kind(request.param) as kind: yield kind
