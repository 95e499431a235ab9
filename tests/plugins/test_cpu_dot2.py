"""The CPU renderer's pairwise int16 multiply-add (plugrad_cpu.device: pg_dot2_T, WMMA "DOT2") compiled with the
device's own compiler and called through ctypes, for every vector width: the x86 instruction where the host has it
and the portable shuffles (the host's SIMD macros undefined), both against int64 numpy."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

plugrad_cpu = pytest.importorskip("plugrad_cpu.device")


def _lib(lanes: int, portable: bool) -> ctypes.CDLL:
  v, s = f"pg_int{lanes}", f"pg_short{2 * lanes}"
  src = "\n".join([*(["#undef __SSE2__", "#undef __AVX2__", "#undef __AVX512BW__"] if portable else []),
    f"typedef int {v} __attribute__((vector_size({4 * lanes})));", f"typedef short {s} __attribute__((vector_size({4 * lanes})));",
    plugrad_cpu._dot2_src(v, lanes),
    "void dot(const short *a, const short *b, const int *c, int *out, int n) {",
    f"  for (int i = 0; i < n; i++) {{ {s} x, y; {v} z; __builtin_memcpy(&x, a + i * {2 * lanes}, sizeof(x));",
    f"    __builtin_memcpy(&y, b + i * {2 * lanes}, sizeof(y)); __builtin_memcpy(&z, c + i * {lanes}, sizeof(z));",
    f"    z = pg_dot2_{v}(x, y, z); __builtin_memcpy(out + i * {lanes}, &z, sizeof(z)); }}", "}"])
  return plugrad_cpu.load_library(plugrad_cpu.ClangCompiler().compile(src), "the dot2 test")


@pytest.mark.parametrize("lanes", [2, 4, 8, 16])
@pytest.mark.parametrize("portable", [False, True])
def test_dot2_against_numpy(lanes: int, portable: bool):
  rng, n = np.random.default_rng(lanes), 64
  a = rng.integers(-32768, 32768, (n, 2 * lanes), dtype=np.int64).astype(np.int16)
  b = rng.integers(-32768, 32768, (n, 2 * lanes), dtype=np.int64).astype(np.int16)
  a[0, :4], b[0, :4] = [-32768, -32768, 32767, -32768], [-32768, -32768, 32767, 32767]   # the one pair whose sum wraps
  c = rng.integers(-(1 << 20), 1 << 20, (n, lanes)).astype(np.int32)
  out = np.empty_like(c)
  ptr = lambda x, t: x.ctypes.data_as(ctypes.POINTER(t))
  _lib(lanes, portable).dot(ptr(a, ctypes.c_short), ptr(b, ctypes.c_short), ptr(c, ctypes.c_int), ptr(out, ctypes.c_int), n)
  p = a.astype(np.int64) * b.astype(np.int64)
  want = (c + p[:, 0::2] + p[:, 1::2] + (1 << 31)) % (1 << 32) - (1 << 31)   # int32 wrap-around, as pmaddwd
  np.testing.assert_array_equal(out, want.astype(np.int32))
