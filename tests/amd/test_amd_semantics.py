"""The values the AMDGPU renderer's LLVM IR computes, checked without a GPU: the IR of each sweep kernel (every op,
cast and bitcast over every dtype, gated loads, reductions) is retargeted to x86-64 (address spaces and amdgcn kernel
attributes dropped; everything else, including our float64 exp2/log2/sin and the bf16 bit conversions, unchanged),
compiled by clang-19 into a shared library and run on random inputs. The oracle is the PYTHON device's interpreter
running the same linear program. This checks the renderer's semantics (predicates, signedness, casts, division by
zero, pow, NaN-propagating max); the machine code for the GPU is checked by the compile tests and, under MOCK+AMD,
by the RDNA3 emulator. fp8 kernels use amdgcn conversion instructions and are left out here."""
from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess

import numpy as np
import pytest

from plugrad.codegen import get_program
from plugrad.dtype import dtypes
from plugrad.plugins.python import decode, interpret
from plugrad.uop.ops import Ops
from plugrad_amd.renderer import AMDGPURenderer
from amd_helpers import merge
from test_amd_compile import FP8, sweep_asts

pytestmark = pytest.mark.skipif(shutil.which("clang-19") is None, reason="clang-19 not installed")


def to_x86(src: str) -> str:
  src = src.replace('target triple = "amdgcn-amd-amdhsa"', "").replace("define amdgpu_kernel void", "define void")
  src = re.sub(r" addrspace\(\d\)", "", src.replace(", addrspace(5)", ""))
  src = re.sub(r'syncscope\("workgroup"\) ', "", src)
  return re.sub(r"^attributes (#\d+) = .*$", r"attributes \1 = { nounwind }", src, flags=re.M)


def inputs(dt, n: int, rng: np.random.Generator, op_name: str) -> bytes:
  if dt == dtypes.bool: return rng.integers(0, 2, n, dtype=np.uint8).tobytes()
  if dtypes.is_float(dt):
    v = rng.standard_normal(n) * 4
    v[:4] = [0.0, -0.0, 1.5, -2.5]
    if op_name in ("MAX", "CMPNE", "CMPLT", "CMPEQ", "ADD"): v[4:7] = [math.nan, math.inf, -math.inf]
    if dt == dtypes.bfloat16:
      f = v.astype(np.float32).view(np.uint32)
      return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
    return v.astype({dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64}[dt]).tobytes()
  npdt = np.dtype(dt.fmt)
  if op_name in ("SHL", "SHR"): return rng.integers(0, dt.itemsize * 8, n).astype(npdt).tobytes()
  info = np.iinfo(npdt)
  v = rng.integers(info.min, info.max, n, dtype=npdt, endpoint=True)
  v[:3] = [0, 1, info.max]
  return v.tobytes()


@pytest.fixture(scope="module")
def x86_lib(tmp_path_factory) -> tuple[ctypes.CDLL, dict[str, int]]:
  """Every case's kernel in one x86-64 shared library (one clang call); kernel k is the symbol k<k>_<name>."""
  ren, srcs, index = AMDGPURenderer("gfx1100"), [], {}
  for desc, ast in CASES:
    index[desc] = len(srcs)
    srcs.append(get_program(ast, ren).src)
  d = tmp_path_factory.mktemp("x86")
  (d / "all.ll").write_text(to_x86(merge(srcs)))
  p = subprocess.run(["clang-19", "-x", "ir", str(d / "all.ll"), "-O1", "-shared", "-fPIC", "-o", str(d / "all.so"), "-lm", "-Wno-override-module"],
                     capture_output=True, text=True)
  assert p.returncode == 0, p.stderr[-3000:]
  return ctypes.CDLL(str(d / "all.so")), index


def decode_out(b: bytes, dt) -> np.ndarray:
  if dt == dtypes.bfloat16: return (np.frombuffer(b, np.uint16).astype(np.uint32) << 16).view(np.float32)
  if dt == dtypes.bool: return np.frombuffer(b, np.uint8) != 0
  return np.frombuffer(b, np.dtype(dt.fmt))


CASES = [(desc, ast) for desc, ast in sweep_asts() if not any(str(f) in desc for f in FP8)]


@pytest.mark.parametrize("desc,ast", CASES, ids=[d.replace(" ", "_") for d, _ in CASES])
def test_ir_values_match_the_reference(desc: str, ast, x86_lib):
  rng = np.random.default_rng(0)
  spec = get_program(ast, AMDGPURenderer("gfx1100"))
  globs = sorted(spec.globals, key=lambda g: g.arg)
  op_name = next((u.op.name for u in spec.uops if u.op in (Ops.SHL, Ops.SHR, Ops.MAX, Ops.CMPNE, Ops.CMPLT, Ops.CMPEQ, Ops.ADD)), "")
  bufs = [bytearray(g.dtype.size * g.dtype.base.itemsize) if g.arg == 0 else
          bytearray(inputs(g.dtype.base, g.dtype.size, rng, op_name)) for g in globs]
  ref = [bytearray(b) for b in bufs]
  interpret(decode(spec.uops), [memoryview(b) for b in ref], ())
  lib, index = x86_lib
  arrs = [(ctypes.c_uint8 * len(b)).from_buffer(b) for b in bufs]
  getattr(lib, f"k{index[desc]}_{spec.name}")(*[ctypes.cast(a, ctypes.c_void_p) for a in arrs])
  out_dt = globs[0].dtype.base
  got, want = decode_out(bytes(bufs[0]), out_dt), decode_out(bytes(ref[0]), out_dt)
  if dtypes.is_float(out_dt):
    approx = any(u.op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW) for u in spec.uops)
    fused = any(u.op is Ops.MULACC for u in spec.uops)  # rendered as a fused multiply-add: one rounding, the reference rounds twice
    tol = {dtypes.float64: 1e-13 if approx else 5e-16 if fused else 0, dtypes.float32: 2e-6 if approx else 2e-7 if fused else 0}.get(
      out_dt, 1e-2 if approx or fused else 0)
    with np.errstate(invalid="ignore"):  # bitcasts to bf16 make NaNs
      np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, equal_nan=True)
  else: assert np.array_equal(got, want), (got[:8], want[:8])


@pytest.mark.parametrize("op,fn,rtol", [("EXP2", np.exp2, 4e-16), ("LOG2", np.log2, 4e-16), ("SIN", np.sin, 4e-16)])
def test_float64_math_edge_cases(op: str, fn, rtol: float, x86_lib):
  """Our float64 exp2/log2/sin against numpy over their whole ranges: tiny, huge, subnormal, negative, inf, nan."""
  lib, index = x86_lib
  rng = np.random.default_rng(1)
  if op == "EXP2": x = np.concatenate([[0, -0.0, 1, -1, 1023.5, 1024, -1074, -1075, 1100, -1100, 5000, -5000, np.inf, -np.inf, np.nan],
                                       rng.uniform(-1070, 1020, 49)])
  elif op == "LOG2": x = np.concatenate([[0, -0.0, 1, 2, 0.5, 5e-324, 2.2e-308, 1.7e308, -1, np.inf, -np.inf, np.nan],
                                         10 ** rng.uniform(-300, 300, 52)])
  else: x = np.concatenate([[0, -0.0, np.pi, -np.pi / 2, 1e5, -12345.678, np.inf, -np.inf, np.nan], rng.uniform(-1000, 1000, 55)])
  x = x.astype(np.float64)
  out = np.zeros(64, np.float64)
  name = next(k for k in index if k == f"{op} dtypes.float64")
  spec_name = get_program(dict(CASES)[name], AMDGPURenderer("gfx1100")).name
  getattr(lib, f"k{index[name]}_{spec_name}")(out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p))
  with np.errstate(all="ignore"): want = fn(x)
  np.testing.assert_allclose(out, want, rtol=rtol, atol=1e-300 if op != "SIN" else 1e-15, equal_nan=True)
