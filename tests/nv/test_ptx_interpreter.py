"""The PTX interpreter on kernels NVRTC compiles from CUDA C (and hand-written PTX), against Python oracles: divergence
and reconvergence in loops and branches, barriers in divergent code, shuffles/votes/ballots/redux with widths and
member masks, atomics (global and shared, contended), local memory with dynamic indices, device-function calls and
generic addresses, the f64 sin slow path (a call with .param buffers and a local depot), intrinsics (brev, popc, prmt,
funnel shifts, dp4a, ffs), mma.sync fragments in the PTX ISA's layouts (m16n8k16 f16/bf16, m16n8k8, f16
accumulators), 3-D ids across chunk boundaries, the watchdog; parse/compile errors naming the line, and a fuzzer:
mutated PTX gives a clean PTXSyntaxError/PTXError/Unimplemented, never another exception."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from ptx_harness import load, nvrtc_ptx, run

import plugrad_nv.mock.ptx.machine as machine
from plugrad_nv.mock.ptx import KernelFault, PTXError, PTXSyntaxError, Unimplemented, compile_ptx

RNG = np.random.default_rng(7)
FUZZ = int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200"))


def cuda(src: str, arch: str = "sm_90"):
  try: ptx = nvrtc_ptx(src, arch)
  except OSError as e: pytest.skip(f"NVRTC not installed: {e}")
  return load(ptx, (int(arch[3]), int(arch[4])))


def test_divergent_loops_and_branches():
  src = r'''extern "C" __global__ void diverge(int* out, const int* in) {
    int t = threadIdx.x + blockIdx.x * blockDim.x;
    int v = in[t], acc = 0;
    for (int i = 0; i < (v & 15); i++) {
      if ((i ^ t) & 1) acc += i * v;
      else { acc -= t; if (acc < -100) break; }
    }
    if (t % 3 == 0) acc *= 2; else if (t % 3 == 1) acc += 7;
    out[t] = acc;
  }'''
  inp = RNG.integers(-50, 50, 150).astype(np.int32)
  (got, _) = run(cuda(src), "diverge", (3, 1, 1), (50, 1, 1), np.zeros(150, np.int32), inp)
  want = []
  for t, v in enumerate(inp.tolist()):
    acc = 0
    for i in range(v & 15):
      if (i ^ t) & 1: acc += i * v
      else:
        acc -= t
        if acc < -100: break
    acc = acc * 2 if t % 3 == 0 else acc + 7 if t % 3 == 1 else acc
    want.append(acc)
  np.testing.assert_array_equal(got, want)


def test_barriers_in_divergent_branches_that_all_threads_reach():
  src = r'''extern "C" __global__ void halves(int* out, const int* in) {
    __shared__ int s[128];
    int t = threadIdx.x;
    if (t < 64) { s[t] = in[t]; __syncthreads(); out[t] = s[127 - t]; }
    else { s[t] = in[t] * 2; __syncthreads(); out[t] = s[127 - t] + 1; }
  }'''
  inp = np.arange(128, dtype=np.int32)
  got = run(cuda(src), "halves", (1, 1, 1), (128, 1, 1), np.zeros(128, np.int32), inp)[0]
  s = np.where(inp < 64, inp, inp * 2)
  np.testing.assert_array_equal(got, np.where(inp < 64, s[127 - inp], s[127 - inp] + 1))


def test_shuffles_votes_and_redux():
  src = r'''extern "C" __global__ void warp(int* out, const int* in) {
    int t = threadIdx.x, v = in[t], n = blockDim.x;
    unsigned full = 0xffffffffu;
    out[0 * n + t] = __shfl_down_sync(full, v, 3);
    out[1 * n + t] = __shfl_up_sync(full, v, 5);
    out[2 * n + t] = __shfl_xor_sync(full, v, 6);
    out[3 * n + t] = __shfl_sync(full, v, (t * 7) & 31);
    out[4 * n + t] = __shfl_down_sync(full, v, 2, 8);
    out[5 * n + t] = __shfl_sync(full, v, 3, 16);
    out[6 * n + t] = __ballot_sync(full, v & 1);
    out[7 * n + t] = __all_sync(full, v > -90) + 2 * __any_sync(full, v > 40);
    out[8 * n + t] = __reduce_add_sync(full, v) + __reduce_max_sync(full, (unsigned)(v + 100));
    if ((t & 31) < 16) out[9 * n + t] = __shfl_xor_sync(0xffffu, v, 1); else out[9 * n + t] = __activemask();
  }'''
  n = 64
  inp = RNG.integers(-100, 100, n).astype(np.int32)
  got = run(cuda(src, "sm_80"), "warp", (1, 1, 1), (n, 1, 1), np.zeros(10 * n, np.int32), inp)[0].reshape(10, n)
  lane, base = np.arange(n) % 32, np.arange(n) // 32 * 32
  def src_of(idx): return inp[base + idx]
  np.testing.assert_array_equal(got[0], np.where(lane + 3 < 32, src_of(np.minimum(lane + 3, 31)), inp))
  np.testing.assert_array_equal(got[1], np.where(lane >= 5, src_of(np.maximum(lane - 5, 0)), inp))
  np.testing.assert_array_equal(got[2], src_of(lane ^ 6))
  np.testing.assert_array_equal(got[3], src_of((lane * 7) & 31))
  np.testing.assert_array_equal(got[4], np.where(lane % 8 + 2 < 8, src_of(np.minimum(lane + 2, 31)), inp))
  np.testing.assert_array_equal(got[5], src_of(lane // 16 * 16 + 3))
  ballot = [int(sum(1 << k for k in range(32) if inp[w * 32 + k] & 1)) for w in range(2)]
  np.testing.assert_array_equal(got[6].view(np.uint32), np.repeat(ballot, 32))
  votes = [int((inp[w * 32:(w + 1) * 32] > -90).all()) + 2 * int((inp[w * 32:(w + 1) * 32] > 40).any()) for w in range(2)]
  np.testing.assert_array_equal(got[7], np.repeat(votes, 32))
  red = [int(inp[w * 32:(w + 1) * 32].sum()) + int((inp[w * 32:(w + 1) * 32] + 100).max()) for w in range(2)]
  np.testing.assert_array_equal(got[8], np.repeat(red, 32))
  np.testing.assert_array_equal(got[9], np.where(lane < 16, src_of(lane ^ 1), np.int32(-65536)))  # activemask: lanes 16-31


def test_shfl_with_a_member_that_diverged_is_an_error():
  src = r'''extern "C" __global__ void bad_shfl(int* out) {
    int t = threadIdx.x;
    if (t < 8) out[t] = __shfl_xor_sync(0xffffffffu, t, 1);
  }'''
  want = r"kernel bad_shfl: barrier in thread \(0, 0, 0\) of block \(0, 0, 0\) at PTX line \d+ \(shfl\.sync.*member mask names lane 8"
  with pytest.raises(KernelFault, match=want):
    run(cuda(src), "bad_shfl", (1, 1, 1), (32, 1, 1), np.zeros(32, np.int32))


def test_atomics_global_and_shared():
  src = r'''extern "C" __global__ void atomics(float* fsum, int* hist, unsigned* misc, int* olds, const int* in) {
    __shared__ int sh[8];
    int t = threadIdx.x + blockIdx.x * blockDim.x, v = in[t];
    if (threadIdx.x < 8) sh[threadIdx.x] = 0;
    __syncthreads();
    atomicAdd(fsum, (float)v * 0.5f);
    atomicAdd(&hist[v & 7], 1);
    atomicAdd(&sh[v & 7], v);
    atomicMax((int*)&misc[0], v);
    atomicMin((int*)&misc[1], v);
    atomicOr(&misc[2], 1u << (t & 31));
    atomicXor(&misc[3], (unsigned)v);
    atomicInc(&misc[4], 10u);
    olds[t] = atomicCAS((int*)&misc[5], 0, t + 1);
    __syncthreads();
    if (threadIdx.x < 8) atomicAdd(&hist[8 + threadIdx.x], sh[threadIdx.x]);
  }'''
  n = 96
  inp = RNG.integers(-1000, 1000, n).astype(np.int32)
  misc = np.array([np.iinfo(np.int32).min & 0xFFFFFFFF, 0x7FFFFFFF, 0, 0, 0, 0], np.uint32)
  fs, hist, misc_o, olds, _ = run(cuda(src), "atomics", (3, 1, 1), (32, 1, 1), np.zeros(1, np.float32), np.zeros(16, np.int32), misc,
                                  np.zeros(n, np.int32), inp)
  np.testing.assert_allclose(fs[0], (inp * 0.5).sum(), rtol=1e-6)
  np.testing.assert_array_equal(hist[:8], np.bincount(inp & 7, minlength=8))
  np.testing.assert_array_equal(hist[8:], [sum(int(v) for v in inp if v & 7 == k) for k in range(8)])
  assert misc_o[0].view(np.int32) == inp.max() and misc_o[1].view(np.int32) == inp.min() and misc_o[2] == 0xFFFFFFFF
  assert misc_o[3] == np.bitwise_xor.reduce(inp.view(np.uint32)) and misc_o[4] == n % 11
  assert misc_o[5] == 1 and olds[0] == 0 and (olds[1:] == 1).all()  # lane order: thread 0 wins the CAS


def test_local_memory_and_generic_pointers_through_a_call():
  src = r'''__device__ __noinline__ void put(float* p, int i, float v) { p[i] = v; }
  __device__ __noinline__ float get(const float* p, int i) { return p[i]; }
  extern "C" __global__ void local_and_generic(float* out, const float* in, const int* idx) {
    __shared__ float sh[64];
    float arr[16];
    int t = threadIdx.x;
    for (int i = 0; i < 16; i++) arr[i] = in[t * 16 + i];
    put(sh, t, arr[idx[t] & 15]);
    __syncthreads();
    put(out, t, get(sh, 63 - t) + get(in, t));
  }'''
  mod = cuda(src)
  assert "ld.local" in mod.prog.source or "st.local" in mod.prog.source
  assert "call.uni" in mod.prog.source
  inp = RNG.standard_normal(64 * 16).astype(np.float32)
  idx = RNG.integers(0, 64, 64).astype(np.int32)
  got = run(mod, "local_and_generic", (1, 1, 1), (64, 1, 1), np.zeros(64, np.float32), inp, idx)[0]
  picked = inp.reshape(64, 16)[np.arange(64), idx & 15]
  np.testing.assert_array_equal(got, picked[63 - np.arange(64)] + inp[:64])


def test_f64_sin_slow_path_call():
  src = r'''extern "C" __global__ void sin64(double* out, const double* in) { out[threadIdx.x] = sin(in[threadIdx.x]); }'''
  x = np.array([1e22, -3e200, 1e300, 2.5, 1e9, 7.0e15, -0.0, 123456789.123] * 4)
  mod = cuda(src)
  assert "__internal_trig_reduction_slowpathd" in mod.prog.source
  got = run(mod, "sin64", (1, 1, 1), (32, 1, 1), np.zeros(32), x)[0]
  np.testing.assert_allclose(got, np.sin(x), rtol=0, atol=2e-16)
  assert np.signbit(got[6])


def test_intrinsics():
  src = r'''extern "C" __global__ void intr(unsigned* out, const unsigned* a, const unsigned* b) {
    int t = threadIdx.x, n = blockDim.x;
    unsigned x = a[t], y = b[t];
    out[0 * n + t] = __brev(x);
    out[1 * n + t] = __popc(x) + 100 * __popcll(((unsigned long long)x << 32) | y);
    out[2 * n + t] = __byte_perm(x, y, y & 0x7777);
    out[3 * n + t] = __funnelshift_r(x, y, t) ^ __funnelshift_lc(x, y, t + 20);
    out[4 * n + t] = (unsigned)__dp4a((int)x, (int)y, 5) ^ __dp4a(x, y, 7u);
    out[5 * n + t] = __ffs((int)x) + 64 * __clz((int)y);
  }'''
  n = 32
  a = RNG.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
  b = RNG.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
  a[0], b[0] = 0, 0
  got = run(cuda(src), "intr", (1, 1, 1), (n, 1, 1), np.zeros(6 * n, np.uint32), a, b)[0].reshape(6, n)
  def brev(x): return int(f"{x:032b}"[::-1], 2)
  def byte_perm(x, y, s):
    src = x | (y << 32)
    return sum(((src >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k) for k in range(4))
  def fsr(lo, hi, s): return (((hi << 32) | lo) >> (s & 31)) & 0xFFFFFFFF
  def fslc(lo, hi, s): return ((((hi << 32) | lo) << min(s, 32)) >> 32) & 0xFFFFFFFF
  def dp4a(x, y, c, signed):
    bx, by = [(x >> (8 * k)) & 0xFF for k in range(4)], [(y >> (8 * k)) & 0xFF for k in range(4)]
    if signed: bx, by = [v - 256 if v > 127 else v for v in bx], [v - 256 if v > 127 else v for v in by]
    return (c + sum(p * q for p, q in zip(bx, by))) & 0xFFFFFFFF
  for t in range(n):
    x, y = int(a[t]), int(b[t])
    assert got[0, t] == brev(x)
    assert got[1, t] == (bin(x).count("1") + 100 * (bin(x).count("1") + bin(y).count("1"))) & 0xFFFFFFFF
    assert got[2, t] == byte_perm(x, y, y & 0x7777)
    assert got[3, t] == fsr(x, y, t) ^ fslc(x, y, t + 20)
    assert got[4, t] == dp4a(x, y, 5, True) ^ dp4a(x, y, 7, False)
    assert got[5, t] == ((x & -x).bit_length() + 64 * (32 - y.bit_length())) & 0xFFFFFFFF


MMA_SRC = r'''#include <cuda_fp16.h>
extern "C" __global__ void mma(float* d, const unsigned* a, const unsigned* b, const float* c) {
  int l = threadIdx.x;
  float r0, r1, r2, r3;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.TY.TY.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
    : "=f"(r0), "=f"(r1), "=f"(r2), "=f"(r3) : "r"(a[l*4]), "r"(a[l*4+1]), "r"(a[l*4+2]), "r"(a[l*4+3]), "r"(b[l*2]), "r"(b[l*2+1]),
      "f"(c[l*4]), "f"(c[l*4+1]), "f"(c[l*4+2]), "f"(c[l*4+3]));
  d[l*4] = r0; d[l*4+1] = r1; d[l*4+2] = r2; d[l*4+3] = r3;
}
extern "C" __global__ void mma8(unsigned* d, const unsigned* a, const unsigned* b, const unsigned* c) {
  int l = threadIdx.x;
  unsigned r0, r1;
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3}, {%4}, {%5,%6};"
    : "=r"(r0), "=r"(r1) : "r"(a[l*2]), "r"(a[l*2+1]), "r"(b[l]), "r"(c[l*2]), "r"(c[l*2+1]));
  d[l*2] = r0; d[l*2+1] = r1;
}'''


def pack(halves: np.ndarray) -> np.ndarray:
  """(lanes, 2n) 16-bit patterns -> (lanes, n) 32-bit registers, element 2i in the low half."""
  h = halves.astype(np.uint32)
  return (h[:, 0::2] | (h[:, 1::2] << 16)).astype(np.uint32)


@pytest.mark.parametrize("ty", ["f16", "bf16"])
def test_mma_m16n8k16_fragments_follow_the_ptx_isa(ty):
  """Fragments per the PTX ISA's 'Matrix fragments for mma.m16n8k16' (groupID = lane >> 2, threadID_in_group = lane % 4):
  a_i at row g + 8*((i>>1)&1), col 2t + (i&1) + 8*(i>>2); b_i at row 2t + (i&1) + 8*(i>>1), col g; c_i/d_i at row
  g + 8*(i>>1), col 2t + (i&1)."""
  npdt = np.float16 if ty == "f16" else ml_dtypes.bfloat16
  A, B = RNG.standard_normal((16, 16)).astype(npdt), RNG.standard_normal((16, 8)).astype(npdt)
  C = RNG.standard_normal((16, 8)).astype(np.float32)
  g, t = np.arange(32)[:, None] >> 2, np.arange(32)[:, None] & 3
  i8, i4 = np.arange(8)[None, :], np.arange(4)[None, :]
  a = pack(A[g + 8 * ((i8 >> 1) & 1), 2 * t + (i8 & 1) + 8 * (i8 >> 2)].view(np.uint16))
  b = pack(B[2 * t + (i4 & 1) + 8 * (i4 >> 1), g].view(np.uint16))
  c = C[g + 8 * (i4 >> 1), 2 * t + (i4 & 1)]
  d = run(cuda(MMA_SRC.replace("TY", ty)), "mma", (1, 1, 1), (32, 1, 1), np.zeros(128, np.float32), a.ravel(), b.ravel(), c.ravel())[0]
  D = np.zeros((16, 8), np.float32)
  D[g + 8 * (i4 >> 1), 2 * t + (i4 & 1)] = d.reshape(32, 4)
  np.testing.assert_allclose(D, A.astype(np.float64) @ B.astype(np.float64) + C, rtol=1e-6, atol=1e-6)


def test_mma_m16n8k8_f16_accumulator():
  A, B, C = (RNG.standard_normal(s).astype(np.float16) for s in ((16, 8), (8, 8), (16, 8)))
  g, t = np.arange(32)[:, None] >> 2, np.arange(32)[:, None] & 3
  i4, i2 = np.arange(4)[None, :], np.arange(2)[None, :]
  a = pack(A[g + 8 * (i4 >> 1), 2 * t + (i4 & 1)].view(np.uint16))
  b = pack(B[2 * t + (i2 & 1), g].view(np.uint16))
  c = pack(C[g + 8 * (i4 >> 1), 2 * t + (i4 & 1)].view(np.uint16))
  d = run(cuda(MMA_SRC.replace("TY", "f16")), "mma8", (1, 1, 1), (32, 1, 1), np.zeros(64, np.uint32), a.ravel(), b.ravel(), c.ravel())[0]
  h = np.stack([d & 0xFFFF, d >> 16], axis=1).reshape(32, 4).astype(np.uint16).view(np.float16)
  D = np.zeros((16, 8), np.float16)
  D[g + 8 * (i4 >> 1), 2 * t + (i4 & 1)] = h
  want = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(np.float16).astype(np.float32)
  np.testing.assert_allclose(D.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def test_3d_ids_across_chunks(monkeypatch):
  monkeypatch.setattr(machine, "CHUNK_LANES", 256)  # force many chunks
  src = r'''extern "C" __global__ void ids(int* out) {
    int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int nt = blockDim.x * blockDim.y * blockDim.z;
    out[b * nt + t] = (blockIdx.z << 24) | (blockIdx.y << 18) | (blockIdx.x << 12) | (threadIdx.z << 8) | (threadIdx.y << 4) | threadIdx.x;
  }'''
  grid, block = (5, 3, 2), (6, 3, 2)
  nt, nb = 36, 30
  got = run(cuda(src), "ids", grid, block, np.zeros(nt * nb, np.int32))[0]
  want = [(bz << 24) | (by << 18) | (bx << 12) | (tz << 8) | (ty << 4) | tx for bz in range(2) for by in range(3) for bx in range(5)
          for tz in range(2) for ty in range(3) for tx in range(6)]
  np.testing.assert_array_equal(got, want)


def test_endless_loop_hits_the_watchdog(monkeypatch):
  monkeypatch.setattr(machine, "MAX_BLOCK_STEPS", 2000)
  src = r'''extern "C" __global__ void spin(volatile int* flag) { while (flag[0] == 0) {} }'''
  with pytest.raises(KernelFault, match=r"kernel spin: still running after 2000 basic blocks \(an endless loop\? a GPU would hang\)"):
    run(cuda(src), "spin", (1, 1, 1), (1, 1, 1), np.zeros(1, np.int32))


PTX_OK = """.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 k_param_0)
{
  .reg .b32 %r<4>;
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [k_param_0];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd2, %r1, 4;
  add.s64 %rd1, %rd1, %rd2;
  st.global.u32 [%rd1], %r1;
  ret;
}
"""


def test_errors_name_the_line():
  with pytest.raises(PTXSyntaxError, match=r"PTX line 9: .*'mov.u32 %r1 %tid.x;'"): compile_ptx(PTX_OK.replace("%r1, %tid.x", "%r1 %tid.x"))
  with pytest.raises(PTXError, match=r"PTX line 11: %r9 is not declared"):
    compile_ptx(PTX_OK.replace("add.s64 %rd1, %rd1, %rd2", "add.s64 %rd1, %r9, %rd2"))
  with pytest.raises(Unimplemented, match=r"PTX line 10: unimplemented PTX instruction sad.u32: sad.u32 %r1, %r1, %r2, %r3;"):
    compile_ptx(PTX_OK.replace("mul.wide.u32 %rd2, %r1, 4;", "sad.u32 %r1, %r1, %r2, %r3;"))
  with pytest.raises(PTXSyntaxError, match=r"PTX line 10: expected '\]'"):  # texture operands: not even parsed
    compile_ptx(PTX_OK.replace("mul.wide.u32 %rd2, %r1, 4;", "tex.1d.v4.f32.s32 {%r1, %r2, %r3, %r1}, [%rd1, {%r1}];"))
  with pytest.raises(PTXError, match=r"PTX line 4: function f is declared but never defined"):
    compile_ptx(PTX_OK.replace(".visible .entry k", ".func f();\n.visible .entry k").replace("ret;", "call.uni f;\n  ret;"))
  got = run(load(PTX_OK), "k", (1, 1, 1), (40, 1, 1), np.zeros(40, np.int32))[0]
  np.testing.assert_array_equal(got, np.arange(40))


@settings(max_examples=FUZZ, deadline=None, derandomize=FUZZ <= 200, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(0, len(PTX_OK) - 1), st.sampled_from(["", "%", ";", ",", "{", "}", "[", "]", ".", "0", "0f",
                                                                            "-", "@", "!", "x", ".reg", " ", "\n", "<", "|", "(", ")"]),
                          st.integers(0, 3)), min_size=1, max_size=4))
def test_fuzz_mutated_ptx_fails_cleanly(edits):
  """Delete / insert / replace characters of a valid kernel: compiling either works or raises one of the three
  documented errors (and a compiled mutant launches or faults cleanly)."""
  text = PTX_OK
  for pos, ins, dele in edits:
    pos = min(pos, len(text))
    text = text[:pos] + ins + text[pos + dele:]
  try: prog = compile_ptx(text)
  except (PTXSyntaxError, PTXError, Unimplemented): return
  if "k" in prog.functions and prog.functions["k"].kind == "entry" and prog.functions["k"].param_size == 8:
    try: run(load(text), "k", (1, 1, 1), (4, 1, 1), np.zeros(4, np.int32))
    except (KernelFault, Unimplemented): pass
