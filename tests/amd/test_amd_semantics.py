"""The values the AMDGPU renderer's LLVM IR computes, checked without a GPU: the IR of each sweep kernel (every op,
cast and bitcast over every dtype, gated loads, reductions) is retargeted to x86-64 (address spaces and amdgcn kernel
attributes dropped; everything else, including our float64 exp2/log2/sin and the bf16 bit conversions, unchanged),
compiled by clang-19 into a shared library and run on random inputs. The oracle is the PYTHON device's GPU interpreter
running the same linear program on the same launch (SPECIAL ids: the x86 build runs the kernel once per work-item
with the ids in globals). This checks the renderer's semantics (predicates, signedness, casts, division by
zero, pow, NaN-propagating max); the machine code for the GPU is checked by the compile tests and, under MOCK+AMD,
by the RDNA3 emulator. fp8 kernels included: their conversions are bit
operations in the IR, compared code for code."""
from __future__ import annotations

import ctypes
import itertools
import math
import re
import shutil
import subprocess

import numpy as np
import pytest

from plugrad.codegen import get_program
from plugrad.dtype import dtypes, f32_to_fp8, fp8_to_f32
from plugrad.codegen.targets import get_target
from plugrad.plugins.python import decode, interpret_gpu
from plugrad.uop.ops import Ops
from plugrad_amd.renderer import AMDGPURenderer
from amd_helpers import merge
from test_amd_compile import FP8, sweep_asts

pytestmark = pytest.mark.skipif(shutil.which("clang-19") is None, reason="clang-19 not installed")


_ID = re.compile(r"call i32 @llvm\.amdgcn\.(workgroup|workitem)\.id\.([xyz])\(\)")
ID_GLOBALS = [f"pg_{k}_{a}" for k in ("workgroup", "workitem") for a in "xyz"]


def to_x86(src: str) -> str:
  """The module for x86-64: hardware ids become loads of exported globals (pg_workgroup_x, ...) that the test sets
  before calling the kernel once per work-item; barriers are refused (work-items run one after another)."""
  if "llvm.amdgcn.s.barrier" in src: raise ValueError("a kernel with s_barrier can't run work-item by work-item on the CPU")
  src = src.replace('target triple = "amdgcn-amd-amdhsa"', "").replace("define amdgpu_kernel void", "define void")
  src = re.sub(r"^declare i32 @llvm\.amdgcn\.work(group|item)\.id\.[xyz]\(\)$", "", src, flags=re.M)
  src = _ID.sub(lambda m: f"load i32, ptr @pg_{m.group(1)}_{m.group(2)}", src)
  src = "\n".join(f"@{g} = global i32 0" for g in ID_GLOBALS) + "\n" + src
  src = re.sub(r" addrspace\(\d\)", "", src.replace(", addrspace(5)", ""))
  src = re.sub(r'syncscope\("workgroup"\) ', "", src)
  return re.sub(r"^attributes (#\d+) = .*$", r"attributes \1 = { nounwind }", src, flags=re.M)


def inputs(dt, n: int, rng: np.random.Generator, op_name: str) -> bytes:
  if dt == dtypes.bool: return rng.integers(0, 2, n, dtype=np.uint8).tobytes()
  if dt in FP8:  # random codes; NaNs and (e5m2) infinities only where the float inputs get them too (casts to int are UB there)
    codes = np.arange(256, dtype=np.uint8)
    if op_name not in ("MAX", "CMPNE", "CMPLT", "CMPEQ", "ADD"): codes = codes[np.isfinite(fp8_to_f32(codes, dt))]
    return rng.choice(codes, n).astype(np.uint8).tobytes()
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


def run_grid(lib: ctypes.CDLL, sym: str, spec, args: list, vals: tuple[int, ...] = ()) -> None:
  """Call kernel `sym` once per work-item of the launch codegen planned (ProgramSpec.launch_dims), with the id globals
  set as the hardware would."""
  grid, block = spec.launch_dims({v.arg[0]: x for v, x in zip(spec.vars, vals)})
  ids = {g: ctypes.c_int32.in_dll(lib, g) for g in ID_GLOBALS}
  fn = getattr(lib, sym)
  for gz, gy, gx in itertools.product(*(range(n) for n in reversed(grid))):
    for lz, ly, lx in itertools.product(*(range(n) for n in reversed(block))):
      for k, v in zip(ID_GLOBALS, (gx, gy, gz, lx, ly, lz)): ids[k].value = v
      fn(*args, *vals)


def decode_out(b: bytes, dt) -> np.ndarray:
  if dt == dtypes.bfloat16: return (np.frombuffer(b, np.uint16).astype(np.uint32) << 16).view(np.float32)
  if dt == dtypes.bool: return np.frombuffer(b, np.uint8) != 0
  if dt in FP8: return fp8_to_f32(np.frombuffer(b, np.uint8), dt)  # values: the interpreter keeps fp8 as floats (NaN codes canonical)
  return np.frombuffer(b, np.dtype(dt.fmt))


CASES = sweep_asts()


@pytest.mark.parametrize("desc,ast", CASES, ids=[d.replace(" ", "_") for d, _ in CASES])
def test_ir_values_match_the_reference(desc: str, ast, x86_lib):
  rng = np.random.default_rng(0)
  spec = get_program(ast, AMDGPURenderer("gfx1100"))
  globs = sorted(spec.globals, key=lambda g: g.arg)
  op_name = next((u.op.name for u in spec.uops if u.op in (Ops.SHL, Ops.SHR, Ops.MAX, Ops.CMPNE, Ops.CMPLT, Ops.CMPEQ, Ops.ADD)), "")
  bufs = [bytearray(g.dtype.size * g.dtype.base.itemsize) if g.arg == 0 else
          bytearray(inputs(g.dtype.base, g.dtype.size, rng, op_name)) for g in globs]
  ref = [bytearray(b) for b in bufs]
  grid, block = spec.launch_dims()
  interpret_gpu(decode(spec.uops, gpu=True), [memoryview(b) for b in ref], (), grid, block, get_target("AMD"))
  lib, index = x86_lib
  arrs = [(ctypes.c_uint8 * len(b)).from_buffer(b) for b in bufs]
  run_grid(lib, f"k{index[desc]}_{spec.name}", spec, [ctypes.cast(a, ctypes.c_void_p) for a in arrs])
  out_dt = globs[0].dtype.base
  got, want = decode_out(bytes(bufs[0]), out_dt), decode_out(bytes(ref[0]), out_dt)
  if dtypes.is_float(out_dt) and out_dt not in FP8:
    approx = any(u.op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW) for u in spec.uops)
    fused = any(u.op is Ops.MULACC for u in spec.uops)  # rendered as a fused multiply-add: one rounding, the reference rounds twice
    tol = {dtypes.float64: 1e-13 if approx else 5e-16 if fused else 0, dtypes.float32: 2e-6 if approx else 2e-7 if fused else 0}.get(
      out_dt, 1e-2 if approx or fused else 0)
    with np.errstate(invalid="ignore"):  # bitcasts to bf16 make NaNs
      np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, equal_nan=True)
  elif out_dt in FP8:
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not bad.any(), (np.flatnonzero(bad)[:8], got[bad][:8], want[bad][:8])
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
  spec = get_program(dict(CASES)[name], AMDGPURenderer("gfx1100"))
  run_grid(lib, f"k{index[name]}_{spec.name}", spec, [out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p)])
  with np.errstate(all="ignore"): want = fn(x)
  np.testing.assert_allclose(out, want, rtol=rtol, atol=1e-300 if op != "SIN" else 1e-15, equal_nan=True)


def _call_chunks(lib, index, desc: str, x: np.ndarray, out_np) -> np.ndarray:
  """Run sweep kernel `desc` (64 elements: out = f(in)) over `x` in chunks of 64."""
  spec = get_program(dict(CASES)[desc], AMDGPURenderer("gfx1100"))
  sym = f"k{index[desc]}_{spec.name}"
  x = np.concatenate([x, np.zeros(-len(x) % 64, x.dtype)])
  out = np.zeros(len(x), out_np)
  for i in range(0, len(x), 64):
    o, a = out[i:i + 64], np.ascontiguousarray(x[i:i + 64])
    run_grid(lib, sym, spec, [o.ctypes.data_as(ctypes.c_void_p), a.ctypes.data_as(ctypes.c_void_p)])
  return out


@pytest.mark.parametrize("dt", FP8, ids=str)
def test_fp8_software_conversions_are_exact(dt, x86_lib):
  """float32 -> fp8 on every rounding boundary (each midpoint between neighbouring codes and its float32 neighbours,
  so ties-to-even and both sides of it), saturation/overflow thresholds, subnormals, +-0, inf, nan and random bit
  patterns over all exponents, code for code against core's f32_to_fp8; fp8 -> float32 for all 256 codes, bit for bit (NaN as NaN)."""
  lib, index = x86_lib
  vals = fp8_to_f32(np.arange(128, dtype=np.uint8), dt).astype(np.float64)
  vals = np.sort(vals[np.isfinite(vals)])
  mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
  edges = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0)), vals.astype(np.float32),
                          np.array([448, 464, 465, 480, 57344, 61440, 61439.996, 1e30, np.inf, np.nan, 1e-40, 2.0**-149], np.float32)])
  rnd = np.random.default_rng(2).integers(0, 2**32, 2048, dtype=np.uint64).astype(np.uint32).view(np.float32)
  x = np.concatenate([edges, -edges, rnd]).astype(np.float32)
  got = _call_chunks(lib, index, f"CAST dtypes.float32 -> {dt}", x, np.uint8)[:len(x)]
  want = f32_to_fp8(x, dt)
  bad = np.flatnonzero(got != want)
  assert not len(bad), [(float(x[i]), hex(got[i]), hex(want[i])) for i in bad[:8]]
  codes = np.arange(256, dtype=np.uint8)
  back = _call_chunks(lib, index, f"CAST {dt} -> dtypes.float32", codes, np.float32)[:256]
  ref = fp8_to_f32(codes, dt)
  # a NaN keeps its sign bit here (as in the C renderer); the sign of a NaN has no meaning
  same = (back.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(back) & np.isnan(ref))
  assert same.all(), [(hex(c), back[c], ref[c]) for c in np.flatnonzero(~same)[:8]]


def test_float32_sin_full_range(x86_lib):
  """pg_sin_f32's range reduction (Cody-Waite below 2**16, exact float64 mod 4 above) on x86: every binade up to
  3.4e38, multiples of pi/2 (where the reduced argument cancels), inf and nan, against float64 numpy."""
  lib, index = x86_lib
  rng = np.random.default_rng(3)
  k = np.array([1, 2, 3, 1000, 51471, 2**20, 2**40, 2**80, 2**120], np.float64)
  x = np.concatenate([[0, -0.0, 65535.996, 65536, 1e5, 3e18, -3e18, 1e30, 3.4028235e38, -3.4028235e38, 1e-45, np.inf, -np.inf, np.nan],
                      k * np.pi / 2, -(k * np.pi / 2), 2.0 ** rng.uniform(-20, 127.9, 400) * rng.choice([-1, 1], 400)]).astype(np.float32)
  got = _call_chunks(lib, index, "SIN dtypes.float32", x, np.float32)[:len(x)]
  with np.errstate(invalid="ignore"): want = np.sin(x.astype(np.float64))
  np.testing.assert_allclose(got, want, atol=2e-7, rtol=0, equal_nan=True)
