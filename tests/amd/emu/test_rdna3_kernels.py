"""End-to-end tests of the RDNA3 emulator: OpenCL C / LLVM IR compiled by clang-19 for gfx1100, linked by ld.lld-19,
loaded into test GPU memory and dispatched through plugrad_amd.mock.dispatch; results compared against numpy (or
plain Python) references, and every kernel's decode cross-checked against llvm-objdump-19."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from rdna3_harness import HAVE_TOOLS, TestMemory, build, crosscheck, kernargs, load, objdump, reduce_source, run

from plugrad_amd.mock import dispatch as mock_dispatch
from plugrad_amd.mock import rdna3
from plugrad_amd.mock.dispatch import PageFault
from plugrad_amd.mock.rdna3 import EmulatorError

pytestmark = pytest.mark.skipif(not HAVE_TOOLS, reason="needs clang-19, ld.lld-19 and llvm-objdump-19 (make sysdeps)")


@pytest.fixture(autouse=True)
def _installed():
  rdna3.install()
  yield
  mock_dispatch.set_executor(None)


@pytest.fixture
def mem() -> TestMemory:
  return TestMemory()


def _check_decode(so) -> None:
  bad = crosscheck(so)
  assert not bad, "\n".join(f"objdump: {t}\n   ours: {m}" for t, m in bad)


def run_kernel(mem: TestMemory, src: str, name: str, grid, block, args, fmt=None, lds=0, lang="cl", opt="-O2", extra=(), check=True):
  so = build(src, lang=lang, opt=opt, extra=extra)
  if check: _check_decode(so)
  co = load(mem, so)
  run(mem, co, name, grid, block, kernargs(mem, *args, fmt=fmt), lds=lds)
  return co


ELEMENTWISE = """
__kernel void ew(__global float* out, __global const float* a, __global const float* b, int n) {
  int i = GID_X * 64 + LID_X;
  if (i >= n) return;
  float x = a[i], y = b[i];
  out[i] = __builtin_fmaf(x, y, 1.5f) + __builtin_sqrtf(y) - __builtin_fabsf(x) * 0.25f + __builtin_floorf(x * 3.0f)
           + __builtin_fminf(x, y) - __builtin_fmaxf(x, -y) + __builtin_truncf(y * 7.5f);
  out[n + i] = __builtin_expf(x) + __builtin_logf(y) + __builtin_exp2f(y) + __builtin_log2f(y + 2.0f);
}
"""


def test_elementwise_f32(mem):
  n = 1000  # not a multiple of 64: the tail group has inactive lanes
  rng = np.random.default_rng(0)
  a = rng.uniform(-3, 3, n).astype(np.float32)
  b = rng.uniform(0.01, 4, n).astype(np.float32)
  pa, pb, po = mem.put(a), mem.put(b), mem.alloc(8 * n)
  run_kernel(mem, ELEMENTWISE, "ew", (1024,), (64,), (po, pa, pb, n), fmt="QQQi")
  out = mem.get(po, np.float32, 2 * n)
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  ref1 = a64 * b64 + 1.5 + np.sqrt(b64) - np.abs(a64) * 0.25 + np.floor(a * np.float32(3)) + np.minimum(a64, b64) - np.maximum(a64, -b64) \
    + np.trunc(b * np.float32(7.5))
  np.testing.assert_allclose(out[:n], ref1, rtol=2e-6, atol=2e-5)
  np.testing.assert_allclose(out[n:], np.exp(a64) + np.log(b64) + np.exp2(b64) + np.log2(b64 + 2), rtol=4e-6, atol=1e-5)


DIVIDE = """
__kernel void div(__global float* out, __global const float* a, __global const float* b) {
  int i = GID_X * 64 + LID_X;
  out[i] = a[i] / b[i];
  out[i + 64 * 4] = __builtin_sqrtf(a[i]);
}
"""


def test_correctly_rounded_divide_and_sqrt(mem):
  """fdiv/sqrt with -cl-fp32-correctly-rounded-divide-sqrt: the div_scale/rcp/fma/div_fmas/div_fixup sequence and
  the sqrt refinement must round exactly like IEEE, including denormal, huge, zero, inf and nan operands."""
  rng = np.random.default_rng(1)
  a = rng.uniform(-10, 10, 256).astype(np.float32)
  b = rng.uniform(-10, 10, 256).astype(np.float32)
  specials = np.array([1e-40, 3e38, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 1.0, 7.0, 1e30, 1e-30, 2.0, 3.0, 5e-39, 1.17e-38], np.float32)
  a[:16], b[16:32] = specials, specials
  a[32:48], b[32:48] = specials, specials[::-1]
  pa, pb, po = mem.put(a), mem.put(b), mem.alloc(4 * 512)
  run_kernel(mem, DIVIDE, "div", (256,), (64,), (po, pa, pb), fmt="QQQ", extra=("-cl-fp32-correctly-rounded-divide-sqrt",))
  out = mem.get(po, np.float32, 512)
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal(out[:256], a / b)
    np.testing.assert_array_equal(out[256:], np.sqrt(a))


REDUCE = reduce_source(256, 8)


def test_group_reduction_lds_barrier(mem):
  n = 5000
  x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
  px, po = mem.put(x), mem.alloc(4 * 8)
  run_kernel(mem, REDUCE, "reduce", (256 * 8,), (256,), (po, px, n), fmt="QQi")
  out = mem.get(po, np.float32, 8)
  ref = np.array([sum(float(x[i]) for i in range(g * 256 + l, n, 2048)) for g in range(8) for l in range(256)]).reshape(8, 256).sum(1)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


INTEGER = """
#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))
__kernel void ints(__global int* out, __global const int* a, __global const int* b, __global const long* c) {
  int i = LID_X + GID_X * 64;
  int x = a[i], y = b[i];
  uint ux = (uint)x, uy = (uint)y;
  out[16 * i + 0] = x / y;
  out[16 * i + 1] = x % y;
  out[16 * i + 2] = (int)(ux / uy);
  out[16 * i + 3] = (int)(ux % uy);
  out[16 * i + 4] = (x << (y & 31)) ^ (x >> (y & 15)) ^ (int)(ux >> (uy & 7));
  out[16 * i + 5] = min(x, y) * 3 - max(x, y) + (int)min(ux, uy) - (int)max(ux, uy);
  out[16 * i + 6] = __builtin_popcount(ux) + __builtin_clz(ux | 1) * 100 + __builtin_ctz(uy | 0x10000) * 10000;
  out[16 * i + 7] = (int)(((long)x * (long)y) >> 32);
  out[16 * i + 8] = (int)(((ulong)ux * (ulong)uy) >> 32);
  long z = c[i];
  long q = z / (long)(y | 1);
  out[16 * i + 9] = (int)q;
  out[16 * i + 10] = (int)(q >> 32);
  long r = z % (long)(y | 1);
  out[16 * i + 11] = (int)r;
  ulong p = (ulong)z * (ulong)(long)x + (ulong)y;
  out[16 * i + 12] = (int)p;
  out[16 * i + 13] = (int)(p >> 32);
  out[16 * i + 14] = (int)((z << (x & 63)) >> 32) + (int)((ulong)z >> (y & 63));
  out[16 * i + 15] = x * y + (x & y) - (x | ~y);
}
"""


def _tdiv(a, b):
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b >= 0) else -q


def test_integer_ops(mem):
  n = 128
  rng = np.random.default_rng(3)
  a = rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int64).astype(np.int32)
  b = rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int64).astype(np.int32)
  b[::5] = rng.integers(-50, 50, len(b[::5]))
  b[b == 0] = 7
  a[:4] = [-(1 << 31), -7, 7, 0]
  b[:4] = [-3, 2, -2, 5]
  c = rng.integers(-(1 << 62), 1 << 62, n, dtype=np.int64)
  pa, pb, pc, po = mem.put(a), mem.put(b), mem.put(c), mem.alloc(4 * 16 * n)
  run_kernel(mem, INTEGER, "ints", (n,), (64,), (po, pa, pb, pc), fmt="QQQQ")
  out = mem.get(po, np.int32, 16 * n).reshape(n, 16)
  m32, m64 = (1 << 32) - 1, (1 << 64) - 1
  s32 = lambda v: ((v & m32) ^ (1 << 31)) - (1 << 31)
  s64 = lambda v: ((v & m64) ^ (1 << 63)) - (1 << 63)
  for i in range(n):
    x, y, z = int(a[i]), int(b[i]), int(c[i])
    ux, uy = x & m32, y & m32
    q = _tdiv(z, y | 1)
    p = ((z & m64) * (x & m64) + (y & m64)) & m64
    exp = [s32(_tdiv(x, y)), s32(x - _tdiv(x, y) * y), s32(ux // uy), s32(ux % uy),
           s32((x << (y & 31)) ^ (x >> (y & 15)) ^ (ux >> (uy & 7))),
           s32(min(x, y) * 3 - max(x, y) + min(ux, uy) - max(ux, uy)),
           bin(ux).count("1") + (32 - (ux | 1).bit_length()) * 100 + ((uy | 0x10000) & -(uy | 0x10000)).bit_length() * 10000 - 10000,
           s32((x * y) >> 32), s32((ux * uy) >> 32), s32(q), s32(q >> 32), s32(z - q * (y | 1)), s32(p), s32(p >> 32),
           s32((s64(z << (x & 63)) >> 32)) + s32((z & m64) >> (y & 63)) if True else 0, s32(x * y + (x & y) - (x | ~y))]
    exp[14] = s32(s32(s64(z << (x & 63)) >> 32) + s32((z & m64) >> (y & 63)))
    assert list(out[i]) == exp, (i, x, y, z, list(out[i]), exp)


HALF = """
__kernel void halfs(__global half* out, __global const half* a, __global const half* b, __global const float* f) {
  int i = LID_X + GID_X * 64;
  half x = a[i], y = b[i];
  out[4 * i + 0] = x * y + (half)1.5f;
  out[4 * i + 1] = (half)(f[i] * 0.5f);
  out[4 * i + 2] = x > y ? x - y : y / (half)4.0f;
  out[4 * i + 3] = __builtin_fmaxf16(x, y) + __builtin_sqrtf16(__builtin_fabsf16(y));
}
__kernel void half2s(__global half2* out, __global const half2* a, __global const half2* b) {
  int i = LID_X + GID_X * 64;
  half2 x = a[i], y = b[i];
  out[i] = x * y + x;
}
"""


def test_float16_and_packed(mem):
  n = 128
  rng = np.random.default_rng(4)
  a = rng.uniform(-4, 4, n).astype(np.float16)
  b = rng.uniform(-4, 4, n).astype(np.float16)
  f = rng.uniform(-1000, 1000, n).astype(np.float32)
  pa, pb, pf, po = mem.put(a), mem.put(b), mem.put(f), mem.alloc(2 * 4 * n)
  run_kernel(mem, HALF, "halfs", (n,), (64,), (po, pa, pb, pf), fmt="QQQQ")
  out = mem.get(po, np.float16, 4 * n).reshape(n, 4).astype(np.float64)
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  np.testing.assert_allclose(out[:, 0], (a64 * b64 + 1.5).astype(np.float16), rtol=1e-3, atol=2e-3)
  np.testing.assert_array_equal(out[:, 1], (f * np.float32(0.5)).astype(np.float16))
  np.testing.assert_allclose(out[:, 2], np.where(a > b, (a - b), (b / np.float16(4))).astype(np.float64), rtol=1e-3)
  np.testing.assert_allclose(out[:, 3], np.maximum(a64, b64) + np.sqrt(np.abs(b64)), rtol=2e-3, atol=2e-3)
  # packed half2: v_pk_* instructions
  a2 = rng.uniform(-4, 4, 2 * n).astype(np.float16)
  b2 = rng.uniform(-4, 4, 2 * n).astype(np.float16)
  pa, pb, po = mem.put(a2), mem.put(b2), mem.alloc(4 * n)
  so = run_kernel(mem, HALF, "half2s", (n,), (64,), (po, pa, pb), fmt="QQQ")
  assert "v_pk_" in objdump(so.path)
  out2 = mem.get(po, np.float16, 2 * n).astype(np.float64)
  np.testing.assert_allclose(out2, a2.astype(np.float64) * b2 + a2, rtol=2e-3, atol=4e-3)


WMMA = """
typedef half half16 __attribute__((ext_vector_type(16)));
typedef float float8 __attribute__((ext_vector_type(8)));
typedef short short16 __attribute__((ext_vector_type(16)));
__kernel void wmma(__global float* d, __global const half* a, __global const half* b, __global const float* c) {
  int l = LID_X;
  half16 fa, fb;
  float8 fc;
  for (int k = 0; k < 16; k++) { fa[k] = a[(l % 16) * 16 + k]; fb[k] = b[k * 16 + (l % 16)]; }
  for (int j = 0; j < 8; j++) fc[j] = c[(2 * j + l / 16) * 16 + (l % 16)];
  float8 r = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(fa, fb, fc);
  for (int j = 0; j < 8; j++) d[(2 * j + l / 16) * 16 + (l % 16)] = r[j];
}
__kernel void wmma_f16_out(__global half* d, __global const half* a, __global const half* b, __global const half* c, int hi) {
  int l = LID_X;
  half16 fa, fb, fc;
  for (int k = 0; k < 16; k++) { fa[k] = a[(l % 16) * 16 + k]; fb[k] = b[k * 16 + (l % 16)]; fc[k] = (half)-7.0f; }
  for (int j = 0; j < 8; j++) fc[2 * j + hi] = c[(2 * j + l / 16) * 16 + (l % 16)];
  half16 r = hi ? __builtin_amdgcn_wmma_f16_16x16x16_f16_w32(fa, fb, fc, true) : __builtin_amdgcn_wmma_f16_16x16x16_f16_w32(fa, fb, fc, false);
  for (int j = 0; j < 8; j++) d[(2 * j + l / 16) * 16 + (l % 16)] = r[2 * j + hi];
}
__kernel void wmma_bf16(__global float* d, __global const short* a, __global const short* b, __global const float* c) {
  int l = LID_X;
  short16 fa, fb;
  float8 fc;
  for (int k = 0; k < 16; k++) { fa[k] = a[(l % 16) * 16 + k]; fb[k] = b[k * 16 + (l % 16)]; }
  for (int j = 0; j < 8; j++) fc[j] = c[(2 * j + l / 16) * 16 + (l % 16)];
  float8 r = __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(fa, fb, fc);
  for (int j = 0; j < 8; j++) d[(2 * j + l / 16) * 16 + (l % 16)] = r[j];
}
"""


def test_wmma_f16_and_bf16(mem):
  rng = np.random.default_rng(5)
  a = rng.uniform(-1, 1, (16, 16)).astype(np.float16)
  b = rng.uniform(-1, 1, (16, 16)).astype(np.float16)
  c = rng.uniform(-1, 1, (16, 16)).astype(np.float32)
  pa, pb, pc, pd = mem.put(a), mem.put(b), mem.put(c), mem.alloc(4 * 256)
  run_kernel(mem, WMMA, "wmma", (32,), (32,), (pd, pa, pb, pc), fmt="QQQQ")
  np.testing.assert_allclose(mem.get(pd, np.float32, 256).reshape(16, 16), a.astype(np.float64) @ b.astype(np.float64) + c, rtol=1e-5, atol=1e-5)
  for hi in (0, 1):  # f16 accumulator in the low or the high halves (op_sel)
    ch = rng.uniform(-1, 1, (16, 16)).astype(np.float16)
    pch, pdh = mem.put(ch), mem.alloc(2 * 256)
    run_kernel(mem, WMMA, "wmma_f16_out", (32,), (32,), (pdh, pa, pb, pch, hi), fmt="QQQQi")
    np.testing.assert_allclose(mem.get(pdh, np.float16, 256).reshape(16, 16).astype(np.float64),
                               (a.astype(np.float64) @ b.astype(np.float64) + ch).astype(np.float16), rtol=2e-3, atol=2e-3)
  abf = (rng.uniform(-1, 1, (16, 16)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
  bbf = (rng.uniform(-1, 1, (16, 16)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
  as_f = lambda x: (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
  pa, pb, pd = mem.put(abf), mem.put(bbf), mem.alloc(4 * 256)
  run_kernel(mem, WMMA, "wmma_bf16", (32,), (32,), (pd, pa, pb, pc), fmt="QQQQ")
  np.testing.assert_allclose(mem.get(pd, np.float32, 256).reshape(16, 16), as_f(abf) @ as_f(bbf) + c, rtol=1e-5, atol=1e-5)


DIVERGE = """
__kernel void collatz(__global int* out, __global const int* in, int n) {
  int i = LID_X + GID_X * 64;
  if (i >= n) return;
  uint x = (uint)in[i];
  int steps = 0;
  while (x != 1u && steps < 1000) { x = (x & 1u) ? 3u * x + 1u : x >> 1; steps++; }
  if (steps & 1) out[i] = steps; else out[i] = -steps;
}
"""


def _collatz(x: int) -> int:
  s = 0
  while x != 1 and s < 1000:
    x = 3 * x + 1 if x & 1 else x >> 1
    s += 1
  return s if s & 1 else -s


def test_branches_and_divergent_loops(mem):
  n = 200
  x = np.random.default_rng(6).integers(1, 5000, n).astype(np.int32)
  px, po = mem.put(x), mem.alloc(4 * n)
  run_kernel(mem, DIVERGE, "collatz", (256,), (64,), (po, px, n), fmt="QQi")
  assert list(mem.get(po, np.int32, n)) == [_collatz(int(v)) for v in x]


SCRATCH = """
__kernel void priv(__global int* out, __global const int* in, __global const int* idx) {
  int i = LID_X + GID_X * 32;
  int arr[96];
  for (int k = 0; k < 96; k++) arr[k] = in[(k * 7 + i) % 200] + k;
  out[i] = arr[idx[i] % 96] * 2 + arr[(idx[i] * 5) % 96];
}
"""


def test_scratch_private_array(mem):
  rng = np.random.default_rng(7)
  src = rng.integers(-1000, 1000, 200).astype(np.int32)
  idx = rng.integers(0, 10000, 64).astype(np.int32)
  pin, pidx, po = mem.put(src), mem.put(idx), mem.alloc(4 * 64)
  so = run_kernel(mem, SCRATCH, "priv", (64,), (32,), (po, pin, pidx), fmt="QQQ")
  assert "scratch_" in objdump(so.path)
  arr = lambda i, k: int(src[(k * 7 + i) % 200]) + k
  assert list(mem.get(po, np.int32, 64)) == [arr(i, int(idx[i]) % 96) * 2 + arr(i, int(idx[i]) * 5 % 96) for i in range(64)]


GRID2D = """
__kernel void grid(__global int* out, int width) {
  int x = GID_X * 8 + LID_X, y = GID_Y * 4 + LID_Y;
  out[y * width + x] = x * 1000 + y;
}
"""


def test_2d_grid_workitem_ids(mem):
  po = mem.alloc(4 * 32 * 16)
  run_kernel(mem, GRID2D, "grid", (32, 16), (8, 4), (po, 32), fmt="Qi")
  ys, xs = np.mgrid[0:16, 0:32]
  np.testing.assert_array_equal(mem.get(po, np.int32, 512).reshape(16, 32), xs * 1000 + ys)


MATVEC = """
__kernel void matvec(__global float* out, __global const float* m, __global const float* v, int rows, int cols) {
  int r = LID_X + GID_X * 64;
  if (r >= rows) return;
  float acc = 0.0f;
  for (int k = 0; k < cols; k++) acc += m[(long)r * cols + k] * v[k];
  out[r] = acc;
}
"""


@pytest.mark.parametrize("rows,cols", [(5, 3), (70, 17), (130, 1)])
def test_symbolic_sizes_as_kernel_args(mem, rows, cols):
  """One code object serves every size: the shapes only arrive as kernel arguments."""
  rng = np.random.default_rng(rows)
  m = rng.standard_normal((rows, cols)).astype(np.float32)
  v = rng.standard_normal(cols).astype(np.float32)
  pm, pv, po = mem.put(m), mem.put(v), mem.alloc(4 * rows)
  run_kernel(mem, MATVEC, "matvec", (-(-rows // 64) * 64,), (64,), (po, pm, pv, rows, cols), fmt="QQQii")
  np.testing.assert_allclose(mem.get(po, np.float32, rows), m.astype(np.float64) @ v, rtol=1e-5, atol=1e-5)


ATOMIC = """
__kernel void hist(__global int* bins, __global const int* in) {
  int i = LID_X + GID_X * 64;
  __atomic_fetch_add(&bins[in[i] & 15], 1, __ATOMIC_RELAXED);
}
"""


def test_global_atomics(mem):
  x = np.random.default_rng(8).integers(0, 1000, 256).astype(np.int32)
  px, pb = mem.put(x), mem.alloc(4 * 16)
  run_kernel(mem, ATOMIC, "hist", (256,), (64,), (pb, px), fmt="QQ")
  np.testing.assert_array_equal(mem.get(pb, np.int32, 16), np.bincount(x & 15, minlength=16))


SAXPY_LL = """
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @saxpy(ptr addrspace(1) %y, ptr addrspace(1) %x, float %a, i32 %n) {
  %lid = call i32 @llvm.amdgcn.workitem.id.x()
  %gid = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = shl i32 %gid, 6
  %i = add i32 %base, %lid
  %in = icmp slt i32 %i, %n
  br i1 %in, label %body, label %done
body:
  %px = getelementptr float, ptr addrspace(1) %x, i32 %i
  %py = getelementptr float, ptr addrspace(1) %y, i32 %i
  %vx = load float, ptr addrspace(1) %px
  %vy = load float, ptr addrspace(1) %py
  %m = fmul float %vx, %a
  %s = fadd float %m, %vy
  store float %s, ptr addrspace(1) %py
  br label %done
done:
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
"""


def test_llvm_ir_kernel(mem):
  n = 100
  x = np.arange(n, dtype=np.float32)
  y = np.ones(n, np.float32)
  px, py = mem.put(x), mem.put(y)
  run_kernel(mem, SAXPY_LL, "saxpy", (128,), (64,), (py, px, 2.5, n), fmt="QQfi", lang="ll")
  np.testing.assert_array_equal(mem.get(py, np.float32, n), x * np.float32(2.5) + np.float32(1))


FTZ = """
__kernel void mul(__global float* out, __global const float* a, __global const float* b) {
  int i = LID_X;
  out[i] = a[i] * b[i];
}
"""


@pytest.mark.parametrize("flush", [False, True])
def test_denormal_mode_from_descriptor(mem, flush):
  a = np.array([1e-40, -2e-39, 1.0, 3e-38] * 8, np.float32)
  b = np.ones(32, np.float32)
  pa, pb, po = mem.put(a), mem.put(b), mem.alloc(4 * 32)
  run_kernel(mem, FTZ, "mul", (32,), (32,), (po, pa, pb), fmt="QQQ", extra=("-cl-denorms-are-zero",) if flush else ())
  exp = np.where(np.abs(a) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), a), a) if flush else a
  np.testing.assert_array_equal(mem.get(po, np.float32, 32), exp)


# ------------------------------------------------------------------ errors

BAD_BARRIER = """
__kernel void early(__global int* out) {
  if (LID_X >= 32) return;
  BARRIER();
  out[LID_X] = 1;
}
"""


def test_barrier_not_reached_by_all_waves_is_an_error(mem):
  po = mem.alloc(4 * 64)
  with pytest.raises(EmulatorError, match="barrier"):
    run_kernel(mem, BAD_BARRIER, "early", (64,), (64,), (po,), fmt="Q")


def test_out_of_bounds_access_is_a_page_fault_naming_the_address(mem):
  n = 64
  x = np.zeros(n, np.float32)
  px, po = mem.put(x), mem.alloc(4 * n)
  # the kernel reads b[i] for i < 1000 but b has only 64 elements: lanes past them fall into the unmapped gap
  with pytest.raises(PageFault, match=r"0x[0-9a-f]+") as e:
    run_kernel(mem, ELEMENTWISE, "ew", (1024,), (64,), (po, px, px, 1000), fmt="QQQi")
  assert e.value.addr >= px + 4 * n


UNIMPL = """
__kernel void cube(__global float* out) {
  float r;
  __asm__ volatile("v_cubeid_f32 %0, 1.0, 2.0, 4.0" : "=v"(r));
  out[LID_X] = r;
}
"""


def test_unimplemented_instruction_names_opcode_and_kernel(mem):
  """The kernel's name comes from the code object's .dynsym in GPU memory (no name_kernel call here)."""
  po = mem.alloc(4 * 32)
  with pytest.raises(EmulatorError, match=r"kernel cube: unimplemented RDNA3 instruction .*VOP3 opcode 0x20c"):
    run_kernel(mem, UNIMPL, "cube", (32,), (32,), (po,), fmt="Q", check=False)


def test_no_executor_registered():
  mock_dispatch.set_executor(None)
  with pytest.raises(RuntimeError, match="no kernel executor for gfx1100"):
    mock_dispatch.execute(TestMemory(), mock_dispatch.Dispatch(0, 0, (1, 1, 1), (1, 1, 1), 0, 0, "gfx1100"))


def test_descriptor_fields_parsed(mem):
  so = build(REDUCE)
  co = load(mem, so)
  kd = rdna3.KernelDescriptor.parse(mem.read(co.kernel("reduce"), 64))
  assert kd.wave32 and kd.entry_offset == co.symbols["reduce"] - co.symbols["reduce.kd"]
  assert kd.group_segment_fixed_size == 1024 and kd.enabled(3) and kd.vgprs >= 8
  assert struct.unpack_from("<I", mem.read(co.kernel("reduce"), 64), 8)[0] == kd.kernarg_size


def test_emulator_speed_is_measured(mem):
  before = rdna3.STATS.instructions
  x = np.ones(2048, np.float32)
  px, po = mem.put(x), mem.alloc(4 * 8)
  run_kernel(mem, REDUCE, "reduce", (256 * 8,), (256,), (po, px, 2048), fmt="QQi")
  assert rdna3.STATS.instructions > before and rdna3.STATS.per_second > 0
  np.testing.assert_array_equal(mem.get(po, np.float32, 8), np.full(8, 256, np.float32))


DOUBLES = """
__kernel void dbl(__global double* out, __global const double* a, __global const double* b) {
  int i = LID_X;
  double x = a[i], y = b[i];
  out[6 * i + 0] = x / y;
  out[6 * i + 1] = __builtin_fma(x, y, 0.1) + __builtin_sqrt(__builtin_fabs(y));
  out[6 * i + 2] = __builtin_rint(x * 3.3) + __builtin_floor(y) + __builtin_trunc(x);
  out[6 * i + 3] = __builtin_fmin(x, y) * __builtin_ldexp(x, 7);
  out[6 * i + 4] = (double)(int)(x * 1000.0) + (double)(float)y;
  out[6 * i + 5] = x < y ? 1.0 : -1.0;
}
"""


def test_float64(mem):
  rng = np.random.default_rng(9)
  a = rng.uniform(-100, 100, 32)
  b = rng.uniform(-100, 100, 32)
  a[:4] = [1e-310, 1e300, 0.0, -5.5]
  b[:4] = [3.0, 1e-300, 7.0, 2.0]
  pa, pb, po = mem.put(a), mem.put(b), mem.alloc(8 * 6 * 32)
  run_kernel(mem, DOUBLES, "dbl", (32,), (32,), (po, pa, pb), fmt="QQQ")
  out = mem.get(po, np.float64, 6 * 32).reshape(32, 6)
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal(out[:, 0], a / b)
    np.testing.assert_allclose(out[:, 1], a * b + 0.1 + np.sqrt(np.abs(b)), rtol=1e-15)
    np.testing.assert_array_equal(out[:, 2], np.rint(a * 3.3) + np.floor(b) + np.trunc(a))
    np.testing.assert_array_equal(out[:, 3], np.minimum(a, b) * np.ldexp(a, 7))
    # v_cvt_i32_f64 saturates (1e300 * 1000 -> INT_MAX)
    np.testing.assert_array_equal(out[:, 4], np.clip(np.trunc(a * 1000.0), -2 ** 31, 2 ** 31 - 1) + b.astype(np.float32).astype(np.float64))
    np.testing.assert_array_equal(out[:, 5], np.where(a < b, 1.0, -1.0))


SMALLINT = """
__kernel void small(__global uchar* o8, __global short* o16, __global const char* a, __global const ushort* b, __global const float* f) {
  int i = LID_X + GID_X * 64;
  char x = a[i];
  ushort y = b[i];
  o8[2 * i] = (uchar)(x * 3 + (char)y);
  o8[2 * i + 1] = (uchar)(f[i]);
  o16[2 * i] = (short)(y >> 3) - (short)x * (short)7;
  o16[2 * i + 1] = (short)((int)f[i] >> 2) ^ (short)y;
}
"""


def test_small_integer_types(mem):
  rng = np.random.default_rng(10)
  a = rng.integers(-128, 128, 64).astype(np.int8)
  b = rng.integers(0, 65536, 64).astype(np.uint16)
  f = rng.uniform(0, 255, 64).astype(np.float32)
  pa, pb, pf, p8, p16 = mem.put(a), mem.put(b), mem.put(f), mem.alloc(2 * 64), mem.alloc(4 * 64)
  run_kernel(mem, SMALLINT, "small", (64,), (64,), (p8, p16, pa, pb, pf), fmt="QQQQQ")
  o8 = mem.get(p8, np.uint8, 128).reshape(64, 2)
  o16 = mem.get(p16, np.int16, 128).reshape(64, 2)
  ai, bi = a.astype(np.int64), b.astype(np.int64)
  np.testing.assert_array_equal(o8[:, 0], ((ai * 3 + b.astype(np.int8)) & 0xFF).astype(np.uint8))
  np.testing.assert_array_equal(o8[:, 1], f.astype(np.uint8))
  np.testing.assert_array_equal(o16[:, 0], ((bi >> 3) - ai * 7).astype(np.int16))
  np.testing.assert_array_equal(o16[:, 1], ((f.astype(np.int64) >> 2) ^ bi).astype(np.int16))


UNIFORM_ATOMIC = """
__kernel void count(__global int* total, __global float* ftotal, __global const int* in) {
  int i = LID_X + GID_X * 64;
  int old = __atomic_fetch_add(total, in[i], __ATOMIC_RELAXED);   // same address in every lane: LLVM's atomic optimizer
  __atomic_fetch_add(ftotal, (float)(old & 0), __ATOMIC_RELAXED);   // (uses the returned value, so the scan path is taken)
  __atomic_fetch_add(ftotal, 0.5f, __ATOMIC_RELAXED);
}
"""


def test_uniform_address_atomics(mem):
  x = np.random.default_rng(11).integers(-100, 100, 256).astype(np.int32)
  px, pt, pf = mem.put(x), mem.alloc(4), mem.alloc(4)
  run_kernel(mem, UNIFORM_ATOMIC, "count", (256,), (64,), (pt, pf, px), fmt="QQQ")
  assert mem.get(pt, np.int32, 1)[0] == x.sum() and mem.get(pf, np.float32, 1)[0] == 128.0


def test_decoded_code_is_reused_only_while_the_bytes_are_unchanged(mem):
  """The per-kernel decode cache survives new GPUMemory objects but not code rewritten at the same address."""
  from plugrad_amd.mock.rdna3 import emulator
  so = build(GRID2D)
  co = load(mem, so)
  po = mem.alloc(4 * 32 * 16)
  ka = kernargs(mem, po, 32, fmt="Qi")
  run(mem, co, "grid", (32, 16), (8, 4), ka)
  key = next(k for k, p in emulator._PROGRAMS.items() if p.entry == co.kernel("grid") + rdna3.KernelDescriptor.parse(
    mem.read(co.kernel("grid"), 64)).entry_offset)
  prog = emulator._PROGRAMS[key]
  run(mem, co, "grid", (32, 16), (8, 4), ka)
  assert emulator._PROGRAMS[key] is prog
  # overwrite the first instruction with s_endpgm: the next dispatch must decode again and store nothing
  mem.write(prog.entry, struct.pack("<I", 0xBFB00000))
  mem.write(po, bytes(4 * 32 * 16))
  run(mem, co, "grid", (32, 16), (8, 4), ka)
  assert emulator._PROGRAMS[key] is not prog and not mem.get(po, np.int32, 512).any()


WMMA_I8 = """
typedef int int4v __attribute__((ext_vector_type(4)));
typedef int int8v __attribute__((ext_vector_type(8)));
__kernel void wmma_i8(__global int* d, __global const char* a, __global const char* b, __global const int* c) {
  int l = LID_X;
  int4v fa, fb;
  int8v fc;
  for (int k = 0; k < 4; k++) {
    int pa = 0, pb = 0;
    for (int j = 0; j < 4; j++) {
      pa |= ((int)(uchar)a[(l % 16) * 16 + 4 * k + j]) << (8 * j);
      pb |= ((int)(uchar)b[(4 * k + j) * 16 + (l % 16)]) << (8 * j);
    }
    fa[k] = pa; fb[k] = pb;
  }
  for (int j = 0; j < 8; j++) fc[j] = c[(2 * j + l / 16) * 16 + (l % 16)];
  int8v r = __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32(true, fa, false, fb, fc, false);
  for (int j = 0; j < 8; j++) d[(2 * j + l / 16) * 16 + (l % 16)] = r[j];
}
"""


def test_wmma_int8(mem):
  rng = np.random.default_rng(12)
  a = rng.integers(-128, 128, (16, 16)).astype(np.int8)
  b = rng.integers(-128, 128, (16, 16)).astype(np.int8)  # read as unsigned by the kernel (sgn_b = false)
  c = rng.integers(-1000, 1000, (16, 16)).astype(np.int32)
  pa, pb, pc, pd = mem.put(a), mem.put(b), mem.put(c), mem.alloc(4 * 256)
  run_kernel(mem, WMMA_I8, "wmma_i8", (32,), (32,), (pd, pa, pb, pc), fmt="QQQQ")
  np.testing.assert_array_equal(mem.get(pd, np.int32, 256).reshape(16, 16), a.astype(np.int64) @ b.view(np.uint8).astype(np.int64) + c)
