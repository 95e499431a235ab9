"""Hand-built linear programs (docs/kernel_ir.md form 3) using the GPU ops — SPECIAL, DEFINE_LOCAL, BARRIER, IF/ENDIF,
WMMA — as codegen's gpudims/GPU optimizer would produce them, for render golden tests, NVRTC compiles and the CUDA
emulator (cuda_emu.py). Each builder returns (uops, global_size, local_size)."""
from __future__ import annotations

from plugrad.dtype import AddrSpace, dtypes
from plugrad.uop.ops import Ops, UOp

i32, f32, f16 = dtypes.int32, dtypes.float32, dtypes.float16


def c(v, dt=i32) -> UOp: return UOp.const(dt, v)
def gl(slot: int, size: int, dt=f32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), arg=slot)
def special(name: str, size: int | UOp) -> UOp: return UOp(Ops.SPECIAL, i32, (size if isinstance(size, UOp) else c(size),), arg=name)
def index(buf: UOp, i: UOp, gate: UOp | None = None) -> UOp: return UOp(Ops.INDEX, buf.dtype, (buf, i) if gate is None else (buf, i, gate))
def load(idx: UOp, dt=None, *deps: UOp) -> UOp: return UOp(Ops.LOAD, dt or idx.dtype.base, (idx, *deps))
def store(idx: UOp, val: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (idx, val))


def linear(*roots: UOp) -> list[UOp]:
  """The uops reachable from `roots`, sources first, in the order the roots (statements) are given."""
  out: list[UOp] = []
  seen: set[UOp] = set()
  def visit(u: UOp) -> None:
    if u in seen: return
    for s in u.src: visit(s)
    seen.add(u)
    out.append(u)
  for r in roots: visit(r)
  return out


def scale_program(n: int | UOp, local: int = 64) -> tuple[list[UOp], tuple, tuple]:
  """out[i] = in[i] * 2 for i = gidx0*local + lidx0 < n, guarded with IF/ENDIF (n may be a DEFINE_VAR)."""
  out, inp = gl(0, 4096), gl(1, 4096)
  nn = n if isinstance(n, UOp) else c(n)
  blocks = (nn + c(local - 1)) // c(local) if isinstance(n, UOp) else c(-(-n // local))
  g, lid = special("gidx0", blocks), special("lidx0", local)
  i = g * c(local) + lid
  iff = UOp(Ops.IF, dtypes.void, (i < nn,))
  st = store(index(out, i), load(index(inp, i)) * c(2.0, f32))
  end = UOp(Ops.ENDIF, dtypes.void, (iff,))
  pre = [u for u in (out, inp, nn) if u.op is not Ops.CONST]
  return linear(*pre, g, lid, iff, st, end), (blocks, 1, 1), (local, 1, 1)


def group_sum_program(rows: int, cols: int = 64) -> tuple[list[UOp], tuple, tuple]:
  """out[r] = sum(x[r, :]) for a (rows, cols) matrix: block r, thread t stores x[r, t] to shared memory, barrier, thread 0
  sums the row from shared memory (a GROUP reduction as the GPU optimizer makes it)."""
  out, x = gl(0, rows), gl(1, rows * cols)
  g, t = special("gidx0", rows), special("lidx0", cols)
  smem = UOp(Ops.DEFINE_LOCAL, f32.ptr(cols, AddrSpace.LOCAL), arg=("temp0", cols))
  st_local = store(index(smem, t), load(index(x, g * c(cols) + t)))
  bar = UOp(Ops.BARRIER, dtypes.void, (st_local,))
  iff = UOp(Ops.IF, dtypes.void, (t.eq(c(0)),))
  acc = UOp(Ops.DEFINE_REG, f32.ptr(1, AddrSpace.REG), arg=0)
  init = store(index(acc, c(0)), c(0.0, f32))
  r = UOp(Ops.RANGE, i32, (c(cols),), arg=(1, "reduce"))
  acc_after = UOp(Ops.AFTER, acc.dtype, (acc, init))
  upd = store(index(acc_after, c(0)), load(index(acc_after, c(0))) + load(index(smem, r), None, bar))
  end_r = UOp(Ops.END, dtypes.void, (upd, r))
  fin = store(index(out, g), load(index(UOp(Ops.AFTER, acc.dtype, (acc, end_r)), c(0))))
  endif = UOp(Ops.ENDIF, dtypes.void, (iff,))
  return linear(out, x, g, t, smem, st_local, bar, iff, acc, init, r, upd, end_r, fin, endif), (rows, 1, 1), (cols, 1, 1)


def mma_coords(operand: str, lane: int, j: int) -> tuple[int, int]:
  """(row, col) of element j of `lane`'s fragment for mma.m16n8k16 with 16-bit inputs, from the PTX ISA's "Matrix
  fragments for mma.m16n8k16" (groupID = lane >> 2, threadID_in_group = lane % 4); written independently of the
  bit tables of codegen/tc.py so the two check each other."""
  g, t = lane >> 2, lane % 4
  if operand == "a": return g + 8 * ((j >> 1) & 1), 2 * t + (j & 1) + 8 * (j >> 2)     # A: 16x16, 8 per lane
  if operand == "b": return 2 * t + (j & 1) + 8 * (j >> 1), g                           # B: 16x8, 4 per lane
  return g + 8 * (j >> 1), 2 * t + (j & 1)                                               # C/D: 16x8, 4 per lane


def _frag_index(operand: str, lane: UOp, j: int, ncols: int) -> UOp:
  """The flat row-major index of mma_coords(operand, lane, j) as index math over the lane id."""
  g, t = lane // c(4), lane % c(4)
  if operand == "a": row, col = g + c(8 * ((j >> 1) & 1)), t * c(2) + c((j & 1) + 8 * (j >> 2))
  elif operand == "b": row, col = t * c(2) + c((j & 1) + 8 * (j >> 1)), g
  else: row, col = g + c(8 * (j >> 1)), t * c(2) + c(j & 1)
  return row * c(ncols) + col


def wmma_program(din=f16, tc: str | None = None) -> tuple[list[UOp], tuple, tuple]:
  """D = A @ B + C for one 16x16 A, 16x8 B, 16x8 C (row-major, float32 C/D) on one warp through one WMMA."""
  tc = tc or f"WMMA_16_8_16_{'half' if din == f16 else 'bfloat16'}_float"
  d, a, b, cc = gl(0, 128), gl(1, 256, din), gl(2, 128, din), gl(3, 128)
  lane = special("lidx0", 32)
  fa = UOp(Ops.VECTORIZE, din.vec(8), tuple(load(index(a, _frag_index("a", lane, j, 16))) for j in range(8)))
  fb = UOp(Ops.VECTORIZE, din.vec(4), tuple(load(index(b, _frag_index("b", lane, j, 8))) for j in range(4)))
  fc = UOp(Ops.VECTORIZE, f32.vec(4), tuple(load(index(cc, _frag_index("c", lane, j, 8))) for j in range(4)))
  w = UOp(Ops.WMMA, f32.vec(4), (fa, fb, fc), arg=tc)
  sts = [store(index(d, _frag_index("c", lane, j, 8)), UOp(Ops.GEP, f32, (w,), (j,))) for j in range(4)]
  return linear(d, a, b, cc, lane, *sts), (1, 1, 1), (32, 1, 1)
