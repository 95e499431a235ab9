"""The CPU renderer's exp2 (plugrad_cpu.device: pg_exp2f and its vector form) compiled with the device's own compiler
and called through ctypes: results against numpy, and no floating-point underflow where 2^x rounds to 0 (an
underflowing multiply costs a microcode assist per lane when denormals are not flushed: a masked softmax score is
-inf in every attention step)."""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

plugrad_cpu = pytest.importorskip("plugrad_cpu.device")

FE_UNDERFLOW = 0x10   # x86 <fenv.h>; the test skips elsewhere
LANES = 16


def _lib() -> ctypes.CDLL:
  vec = plugrad_cpu._exp2f_vector_src("pg_float16", LANES)
  src = "\n".join([
    "#include <fenv.h>", "typedef float pg_float16 __attribute__((vector_size(64)));", plugrad_cpu.EXP2F_SRC, vec,
    "int scalar_exp2(const float *x, float *y, int n) {",
    "  feclearexcept(FE_ALL_EXCEPT);",
    "  for (int i = 0; i < n; i++) y[i] = pg_exp2f(x[i]);",
    "  return fetestexcept(FE_UNDERFLOW);", "}",
    "int vector_exp2(const float *x, float *y, int n) {",
    "  feclearexcept(FE_ALL_EXCEPT);",
    f"  for (int i = 0; i < n; i += {LANES}) {{ pg_float16 v; __builtin_memcpy(&v, x + i, 64); v = pg_exp2f_pg_float16(v);",
    "    __builtin_memcpy(y + i, &v, 64); }",
    "  return fetestexcept(FE_UNDERFLOW);", "}"])
  return plugrad_cpu.load_library(plugrad_cpu.ClangCompiler().compile(src), "the exp2 test")


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
  if os.uname().machine not in ("x86_64", "AMD64"): pytest.skip("FE_UNDERFLOW's value is x86's")
  return _lib()


def call(lib: ctypes.CDLL, name: str, x: np.ndarray) -> tuple[np.ndarray, bool]:
  x = np.ascontiguousarray(x, np.float32)
  y = np.empty_like(x)
  fp = ctypes.POINTER(ctypes.c_float)
  flag = getattr(lib, name)(x.ctypes.data_as(fp), y.ctypes.data_as(fp), len(x))
  return y, bool(flag)


@pytest.mark.parametrize("name", ["scalar_exp2", "vector_exp2"])
def test_no_underflow_where_the_result_is_zero(lib, name):
  x = np.array([-np.inf, -1e30, -1000, -200, -152.5, -151, -150.5, -150] + [-np.inf] * 8, np.float32)
  y, underflow = call(lib, name, x)
  np.testing.assert_array_equal(y, np.zeros_like(x))
  assert not underflow


@pytest.mark.parametrize("name", ["scalar_exp2", "vector_exp2"])
def test_values_against_numpy(lib, name):
  x = np.concatenate([np.linspace(-160, 140, 4096 - 16, dtype=np.float32),
                      np.array([np.nan, np.inf, -np.inf, 0, -0.0, -149.9, -149.5, -149, -140, -126.5, -126, -125.9,
                                128, 128.5, 129, 1e30], np.float32)])
  y, underflow = call(lib, name, x)
  with np.errstate(over="ignore"): want = np.exp2(x.astype(np.float64)).astype(np.float32)
  np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
  ok = ~np.isnan(want)
  # subnormal results are exact to one unit of the smallest subnormal, the rest to 2 float32 ulps
  tiny = np.abs(want) < np.finfo(np.float32).tiny
  np.testing.assert_array_less(np.abs(y[ok & tiny] - want[ok & tiny]), 1.5e-45 * 1.01)
  np.testing.assert_array_max_ulp(y[ok & ~tiny], want[ok & ~tiny], maxulp=2)
  assert underflow   # genuinely subnormal results still round (and flag) as IEEE says
