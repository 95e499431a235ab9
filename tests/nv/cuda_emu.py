"""Run rendered CUDA kernels on the CPU: compile the source as C++ with g++ against a tiny prelude that stands in for
the CUDA built-ins (blockIdx, threadIdx, gridDim, blockDim, __int_as_float, ...), then loop over every block and
thread of the launch the renderer planned. Only scalar float/int kernels (no half/bf16 headers, no shared memory or
barriers: each thread runs to completion in turn). It checks the renderer's thread mapping, guards, grid-stride loops
and launch geometry without a GPU.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile

import numpy as np

from plugrad_nv.renderer import launch_dims, parse_launch

PRELUDE = r"""
#include <math.h>
#include <string.h>
struct pg_dim3 { unsigned x, y, z; };
static pg_dim3 blockIdx, threadIdx, gridDim, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__
template <class T> static inline T max(T a, T b) { return a > b ? a : b; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
"""

CTYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long long", "bool": "bool", "uint8": "unsigned char",
          "uint32": "unsigned int"}


def gxx() -> str | None: return shutil.which("g++") or shutil.which("clang++")


class EmulatedKernel:
  def __init__(self, name: str, src: str, buf_types: list[str], n_vars: int) -> None:
    self.name, self.meta = name, parse_launch(src)
    casts = ", ".join([f"({t}*)bufs[{i}]" for i, t in enumerate(buf_types)] + [f"vals[{i}]" for i in range(n_vars)])
    harness = (f'extern "C" void pg_run(void **bufs, const int *vals, const int *g, const int *b) {{\n'
               f"  gridDim = {{(unsigned)g[0], (unsigned)g[1], (unsigned)g[2]}}; blockDim = {{(unsigned)b[0], (unsigned)b[1], (unsigned)b[2]}};\n"
               "  for (unsigned bz = 0; bz < g[2]; bz++) for (unsigned by = 0; by < g[1]; by++) for (unsigned bx = 0; bx < g[0]; bx++)\n"
               "  for (unsigned tz = 0; tz < b[2]; tz++) for (unsigned ty = 0; ty < b[1]; ty++) for (unsigned tx = 0; tx < b[0]; tx++) {\n"
               f"    blockIdx = {{bx, by, bz}}; threadIdx = {{tx, ty, tz}}; {name}({casts});\n  }}\n}}\n")
    self._dir = tempfile.mkdtemp(prefix="plugrad-cudaemu-")
    cpp, so = os.path.join(self._dir, "k.cpp"), os.path.join(self._dir, "k.so")
    with open(cpp, "w") as f: f.write(PRELUDE + src + harness)
    p = subprocess.run([gxx(), "-O1", "-shared", "-fPIC", "-w", cpp, "-o", so], capture_output=True, text=True)
    if p.returncode != 0: raise RuntimeError(f"g++ could not compile the emulated kernel:\n{p.stderr}\n{src}")
    self.lib = ctypes.CDLL(so)

  def __call__(self, arrays: list[np.ndarray], vals: tuple[int, ...] = ()) -> tuple[tuple[int, ...], tuple[int, ...]]:
    grid, block = launch_dims(self.meta, vals)
    bufs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    cv = (ctypes.c_int * max(len(vals), 1))(*vals)
    self.lib.pg_run(bufs, cv, (ctypes.c_int * 3)(*grid), (ctypes.c_int * 3)(*block))
    return grid, block

  def __del__(self) -> None: shutil.rmtree(self._dir, ignore_errors=True)
