"""Run rendered CUDA kernels on the CPU: compile the source as C++ with g++ against a prelude that stands in for the
CUDA built-ins, then run every block of the launch with one OS thread per CUDA thread, so the block's threads run
concurrently: `__shared__` arrays are shared by them, `__syncthreads()` is a real barrier of the block, and the
`mma.sync.m16n8k16` helper (the renderer's only inline PTX, replaced here) exchanges the 32 lanes' fragment
registers through the block and computes each lane's D fragment as the PTX ISA defines the register layout
("Matrix fragments for mma.m16n8k16": groupID = lane >> 2, threadID_in_group = lane % 4), independently of
codegen's tensor-core tables. float16 is g++'s `_Float16`; bfloat16/fp8 kernels are not emulated (NVRTC compiles them).
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

PRELUDE = r"""
#include <math.h>
#include <string.h>
#include <pthread.h>
#include <thread>
#include <vector>
struct pg_dim3 { unsigned x, y, z; };
static thread_local pg_dim3 blockIdx, threadIdx;
static pg_dim3 gridDim, blockDim;
static pthread_barrier_t pg_block_barrier;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
typedef _Float16 half;
static inline void __syncthreads() { pthread_barrier_wait(&pg_block_barrier); }
template <class T> static inline T max(T a, T b) { return a > b ? a : b; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
struct pg_mma_slot { unsigned a[4], b[2]; float c[4]; };
static pg_mma_slot pg_mma_slots[1024];
static inline float pg_half_of(const unsigned *regs, int i) {
  unsigned short bits = (unsigned short)(regs[i >> 1] >> (16 * (i & 1))); half h; memcpy(&h, &bits, 2); return (float)h;
}
/* mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 for the calling lane: every lane of the warp must call it */
static void pg_mma_m16n8k16_f16(float *d, const unsigned *a, const unsigned *b, const float *c) {
  unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z), lane = tid % 32, warp = tid - lane;
  pg_mma_slot &mine = pg_mma_slots[tid];
  memcpy(mine.a, a, 16); memcpy(mine.b, b, 8); memcpy(mine.c, c, 16);
  __syncthreads();
  for (int j = 0; j < 4; j++) {
    int row = (lane >> 2) + 8 * (j >> 1), col = 2 * (lane % 4) + (j & 1);  /* D/C element j of this lane */
    const pg_mma_slot &cs = pg_mma_slots[warp + (row % 8) * 4 + col / 2];
    float acc = cs.c[(col & 1) | ((row >= 8) << 1)];
    for (int k = 0; k < 16; k++) {
      const pg_mma_slot &as = pg_mma_slots[warp + (row % 8) * 4 + (k % 8) / 2];
      const pg_mma_slot &bs = pg_mma_slots[warp + col * 4 + (k % 8) / 2];
      acc += pg_half_of(as.a, (k & 1) | ((row >= 8) << 1) | ((k >= 8) << 2)) * pg_half_of(bs.b, (k & 1) | ((k >= 8) << 1));
    }
    d[j] = acc;
  }
  __syncthreads();
}
"""

CTYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long long", "bool": "bool", "uint8": "unsigned char",
          "uint32": "unsigned int", "float16": "half"}


def gxx() -> str | None: return shutil.which("g++") or shutil.which("clang++")


def strip_cuda(src: str) -> str:
  """The kernel source without what only NVRTC understands: CUDA headers and the inline-PTX mma helpers."""
  src = re.sub(r"^#include <cuda_\w+\.h>\n", "", src, flags=re.M)
  return re.sub(r"__device__ __forceinline__ void pg_mma_m16n8k16_f16\(.*?\n}\n", "", src, flags=re.S)  # the PTX-only helper


class EmulatedKernel:
  def __init__(self, name: str, src: str, buf_types: list[str], n_vars: int) -> None:
    if "pg_mma_m16n8k16_bf16" in src: raise NotImplementedError("the CUDA emulator runs float16 mma only")
    self.name = name
    casts = ", ".join([f"({t}*)bufs[{i}]" for i, t in enumerate(buf_types)] + [f"vals[{i}]" for i in range(n_vars)])
    harness = (f'extern "C" void pg_run(void **bufs, const int *vals, const int *g, const int *b) {{\n'
               f"  gridDim = {{(unsigned)g[0], (unsigned)g[1], (unsigned)g[2]}}; blockDim = {{(unsigned)b[0], (unsigned)b[1], (unsigned)b[2]}};\n"
               "  unsigned n = b[0] * b[1] * b[2];\n"
               "  for (unsigned bz = 0; bz < (unsigned)g[2]; bz++) for (unsigned by = 0; by < (unsigned)g[1]; by++)\n"
               "  for (unsigned bx = 0; bx < (unsigned)g[0]; bx++) {\n"
               "    pthread_barrier_init(&pg_block_barrier, NULL, n);\n"
               "    std::vector<std::thread> ts;\n"
               "    for (unsigned t = 0; t < n; t++) ts.emplace_back([=] {\n"
               f"      blockIdx = {{bx, by, bz}}; threadIdx = {{t % b[0], (t / b[0]) % b[1], t / (b[0] * b[1])}}; {name}({casts});\n"
               "    });\n"
               "    for (auto &th : ts) th.join();\n"
               "    pthread_barrier_destroy(&pg_block_barrier);\n  }\n}\n")
    self._dir = tempfile.mkdtemp(prefix="plugrad-cudaemu-")
    cpp, so = os.path.join(self._dir, "k.cpp"), os.path.join(self._dir, "k.so")
    with open(cpp, "w") as f: f.write(PRELUDE + strip_cuda(src) + harness)
    p = subprocess.run([gxx(), "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread", "-w", cpp, "-o", so], capture_output=True, text=True)
    if p.returncode != 0: raise RuntimeError(f"g++ could not compile the emulated kernel:\n{p.stderr}\n{src}")
    self.lib = ctypes.CDLL(so)

  def __call__(self, arrays: list[np.ndarray], vals: tuple[int, ...] = (), global_size=(1, 1, 1), local_size=(1, 1, 1)) -> None:
    """Launch on a grid of `global_size` blocks of `local_size` threads (as ProgramSpec gives them)."""
    if any(int(x) < 1 for x in (*global_size, *local_size)): raise ValueError(f"bad launch {global_size} x {local_size}")
    if int(np.prod(local_size)) > 1024: raise ValueError(f"{local_size}: more than 1024 threads per block")
    bufs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    cv = (ctypes.c_int * max(len(vals), 1))(*vals)
    self.lib.pg_run(bufs, cv, (ctypes.c_int * 3)(*map(int, global_size)), (ctypes.c_int * 3)(*map(int, local_size)))

  def __del__(self) -> None: shutil.rmtree(self._dir, ignore_errors=True)
