"""The CPU renderer's integer dots (plugrad_cpu.device: pg_dot2_T, WMMA "DOT2"; pg_dot4_T, "DOT4") compiled with the
device's own compiler and called through ctypes, for every vector width: the x86 instruction where the host has it
and the portable shuffles (the host's SIMD macros undefined), both against int64 numpy."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

plugrad_cpu = pytest.importorskip("plugrad_cpu.device")


def _lib(lanes: int, g: int, elems: tuple[str, str], helper: str, undef: list[str]) -> ctypes.CDLL:
  """`dot(a, b, c, out, n)` over n vectors: out = pg_dot<g>_T(a, b, c) with int32 T of `lanes`, a and b of g*lanes
  elements of C types `elems`, the helper's source `helper`, after the macros `undef` are undefined."""
  v, (ea, eb) = f"pg_int{lanes}", elems
  ta, tb = (f"pg_{e.replace(' ', '_')}{g * lanes}" for e in elems)
  src = "\n".join([*undef, f"typedef int {v} __attribute__((vector_size({4 * lanes})));",
    *dict.fromkeys(f"typedef {e} {t} __attribute__((vector_size({4 * lanes})));" for e, t in ((ea, ta), (eb, tb))),   # g elements a lane
    helper, f"void dot(const {ea} *a, const {eb} *b, const int *c, int *out, int n) {{",
    f"  for (int i = 0; i < n; i++) {{ {ta} x; {tb} y; {v} z; __builtin_memcpy(&x, a + i * {g * lanes}, sizeof(x));",
    f"    __builtin_memcpy(&y, b + i * {g * lanes}, sizeof(y)); __builtin_memcpy(&z, c + i * {lanes}, sizeof(z));",
    f"    z = pg_dot{g}_{v}(x, y, z); __builtin_memcpy(out + i * {lanes}, &z, sizeof(z)); }}", "}"])
  return plugrad_cpu.load_library(plugrad_cpu.ClangCompiler().compile(src), f"the dot{g} test")


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
  undef = ["#undef __SSE2__", "#undef __AVX2__", "#undef __AVX512BW__"] if portable else []
  lib = _lib(lanes, 2, ("short", "short"), plugrad_cpu._dot2_src(f"pg_int{lanes}", lanes), undef)
  lib.dot(ptr(a, ctypes.c_short), ptr(b, ctypes.c_short), ptr(c, ctypes.c_int), ptr(out, ctypes.c_int), n)
  p = a.astype(np.int64) * b.astype(np.int64)
  want = (c + p[:, 0::2] + p[:, 1::2] + (1 << 31)) % (1 << 32) - (1 << 31)   # int32 wrap-around, as pmaddwd
  np.testing.assert_array_equal(out, want.astype(np.int32))


_NO_VNNI = ["#undef __AVX512VNNI__", "#undef __AVXVNNI__"]
_NO_SIMD = [*_NO_VNNI, "#undef __SSSE3__", "#undef __AVX2__", "#undef __AVX512BW__"]


@pytest.mark.parametrize("lanes", [2, 4, 8, 16])
@pytest.mark.parametrize("form", ["native", "no-vnni", "portable"])
def test_dot4_against_numpy(lanes: int, form: str):
  """pg_dot4_T (WMMA "DOT4"): uint8 a times int8 b, 4 products a lane, exact against int64 numpy: the host's VNNI
  instruction, pmaddubsw (VNNI undefined: emitted for codes up to 127, so a's codes are drawn up to 127 there) and
  the portable shuffles, with the extremes of both types."""
  dot4 = 127 if form == "no-vnni" else 255
  rng, n = np.random.default_rng(lanes), 64
  a = rng.integers(0, dot4 + 1, (n, 4 * lanes)).astype(np.uint8)
  b = rng.integers(-128, 128, (n, 4 * lanes)).astype(np.int8)
  a[0, :8], b[0, :8] = dot4, [-128, -128, -128, -128, 127, 127, 127, 127]   # the largest sums of either sign
  c = rng.integers(-(1 << 20), 1 << 20, (n, lanes)).astype(np.int32)
  out = np.empty_like(c)
  ptr = lambda x, t: x.ctypes.data_as(ctypes.POINTER(t))
  undef = {"native": [], "no-vnni": _NO_VNNI, "portable": _NO_SIMD}[form]
  lib = _lib(lanes, 4, ("unsigned char", "signed char"), plugrad_cpu._dot4_src(f"pg_int{lanes}", lanes, dot4), undef)
  lib.dot(ptr(a, ctypes.c_ubyte), ptr(b, ctypes.c_byte), ptr(c, ctypes.c_int), ptr(out, ctypes.c_int), n)
  p = (a.astype(np.int64) * b.astype(np.int64)).reshape(n, lanes, 4).sum(2)
  np.testing.assert_array_equal(out, (c + p).astype(np.int32))
