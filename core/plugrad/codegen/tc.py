"""Tensor cores as data: the shape, dtypes and per-lane register layout of each warp-wide matrix multiply-accumulate.

`Ops.WMMA(a, b, c, arg=name)` computes D = A @ B + C for one M x K tile A, K x N tile B and M x N tile C spread over
the `threads` lanes of a warp/wave. Each lane passes `elements_per_thread` values of A, B and C as vectors; which
matrix element a lane's j-th value is, is the operand's `Layout`: every bit of the lane id and every bit of the element
index adds a fixed (row, col) offset (`lane[b]` for lane bit b, `elem[b]` for element bit b). Lanes whose id differs
only in a bit with offset (0, 0) hold copies of the same elements (RDNA3 asks for A and B in both half-waves).
Sources: PTX ISA "Matrix fragments for mma.m16n8k16" (CUDA), RDNA3/RDNA4 ISA "WMMA" and CDNA3 ISA "MFMA" register
layout tables (AMD).
"""
from __future__ import annotations

from dataclasses import dataclass

from plugrad.dtype import DType, dtypes


@dataclass(frozen=True)
class Layout:
  """Where element `j` of lane `l` sits in its matrix: the sum of the offsets of the set bits of `l` and of `j`."""
  lane: tuple[tuple[int, int], ...]   # (row, col) added by lane-id bit b
  elem: tuple[tuple[int, int], ...]   # (row, col) added by element-index bit b

  def coord(self, lane: int, j: int) -> tuple[int, int]:
    r = c = 0
    for b, (dr, dc) in enumerate(self.lane):
      if lane >> b & 1: r, c = r + dr, c + dc
    for b, (dr, dc) in enumerate(self.elem):
      if j >> b & 1: r, c = r + dr, c + dc
    return r, c


@dataclass(frozen=True)
class TensorCore:
  """One warp-wide MMA shape. `dims` is (N, M, K): A is M x K, B is K x N, C and D are M x N."""
  name: str
  dims: tuple[int, int, int]
  threads: int
  dtype_in: DType
  dtype_out: DType
  elements_per_thread: tuple[int, int, int]  # values of A, B, C each lane holds
  a: Layout
  b: Layout
  c: Layout

  def shape(self, operand: str) -> tuple[int, int]:
    n, m, k = self.dims
    return {"a": (m, k), "b": (k, n), "c": (m, n)}[operand]

  def layout(self, operand: str) -> Layout: return {"a": self.a, "b": self.b, "c": self.c}[operand]


def _short(dt: DType) -> str: return {dtypes.float16: "half", dtypes.bfloat16: "bfloat16", dtypes.float32: "float"}[dt]


def _tc(m: int, n: int, k: int, threads: int, din: DType, dout: DType, ept: tuple[int, int, int], a: Layout, b: Layout, c: Layout) -> TensorCore:
  return TensorCore(f"WMMA_{m}_{n}_{k}_{_short(din)}_{_short(dout)}", (n, m, k), threads, din, dout, ept, a, b, c)


# CUDA mma.sync.m16n8k16 (sm_80+): groupID = lane>>2 picks the row (A, C) or column (B), lane&3 the pair of columns/rows
_CUDA_A = Layout(lane=((0, 2), (0, 4), (1, 0), (2, 0), (4, 0)), elem=((0, 1), (8, 0), (0, 8)))
_CUDA_B = Layout(lane=((2, 0), (4, 0), (0, 1), (0, 2), (0, 4)), elem=((1, 0), (8, 0)))
_CUDA_C = Layout(lane=((0, 2), (0, 4), (1, 0), (2, 0), (4, 0)), elem=((0, 1), (8, 0)))
TC_CUDA_SM80 = tuple(_tc(16, 8, 16, 32, din, dtypes.float32, (8, 4, 4), _CUDA_A, _CUDA_B, _CUDA_C) for din in (dtypes.float16, dtypes.bfloat16))
TC_CUDA_SM90 = TC_CUDA_SM80  # mma.sync runs on sm_90 too (wgmma is a different, warpgroup-wide instruction)

# RDNA3 v_wmma_f32_16x16x16_f16 (wave32): lane l%16 holds row l%16 of A / column l%16 of B (both half-waves the same);
# C: lane l holds column l%16, rows 2j + l//16
TC_AMD_RDNA3 = (_tc(16, 16, 16, 32, dtypes.float16, dtypes.float32, (16, 16, 8),
                    Layout(lane=((1, 0), (2, 0), (4, 0), (8, 0), (0, 0)), elem=((0, 1), (0, 2), (0, 4), (0, 8))),
                    Layout(lane=((0, 1), (0, 2), (0, 4), (0, 8), (0, 0)), elem=((1, 0), (2, 0), (4, 0), (8, 0))),
                    Layout(lane=((0, 1), (0, 2), (0, 4), (0, 8), (1, 0)), elem=((2, 0), (4, 0), (8, 0)))),)
# RDNA4 (gfx12) v_wmma_f32_16x16x16_f16: no duplication, the half-waves hold K 0-7 and 8-15; C rows j + 8*(l//16)
TC_AMD_RDNA4 = (_tc(16, 16, 16, 32, dtypes.float16, dtypes.float32, (8, 8, 8),
                    Layout(lane=((1, 0), (2, 0), (4, 0), (8, 0), (0, 8)), elem=((0, 1), (0, 2), (0, 4))),
                    Layout(lane=((0, 1), (0, 2), (0, 4), (0, 8), (8, 0)), elem=((1, 0), (2, 0), (4, 0))),
                    Layout(lane=((0, 1), (0, 2), (0, 4), (0, 8), (8, 0)), elem=((1, 0), (2, 0), (4, 0)))),)
# CDNA3 v_mfma_f32_16x16x16_f16 (wave64): K (A, B) and rows (C) 4*(l//16) + j
TC_AMD_CDNA3 = (_tc(16, 16, 16, 64, dtypes.float16, dtypes.float32, (4, 4, 4),
                    Layout(lane=((1, 0), (2, 0), (4, 0), (8, 0), (0, 4), (0, 8)), elem=((0, 1), (0, 2))),
                    Layout(lane=((0, 1), (0, 2), (0, 4), (0, 8), (4, 0), (8, 0)), elem=((1, 0), (2, 0))),
                    Layout(lane=((0, 1), (0, 2), (0, 4), (0, 8), (4, 0), (8, 0)), elem=((1, 0), (2, 0)))),)
