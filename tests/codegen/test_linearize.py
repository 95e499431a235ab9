"""IR-level tests of the linearizer: loop structure of reduces, hoisting, nested reduces, index dtype lowering.

Kernel ASTs are built by hand; programs are also run on the PYTHON interpreter (no scheduler, no compiler) and
compared with numpy.
"""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.codegen.linearize import linearize
from plugrad.dtype import dtypes
from plugrad.plugins.python import decode, interpret
from plugrad.uop.ops import Ops, UOp


def gl(slot: int, size: int, dt=dtypes.float32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), arg=slot)
def rng(n: int, rid: int, kind: str) -> UOp: return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), arg=(rid, kind))
def load(buf: UOp, idx: UOp) -> UOp: return UOp(Ops.LOAD, buf.dtype.base, (UOp(Ops.INDEX, buf.dtype, (buf, idx)),))
def store(buf: UOp, idx: UOp, val: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, idx)), val))
def red(x: UOp, *ranges: UOp, op=Ops.ADD) -> UOp: return UOp(Ops.REDUCE, x.dtype, (x, *ranges), arg=op)
def ops(uops: list[UOp]) -> list[Ops]: return [u.op for u in uops]


def check_structure(uops: list[UOp]) -> None:
  """Every source is computed earlier; ENDs close RANGEs innermost first; parameters come first, globals in slot order."""
  seen, open_ = set(), []
  for i, u in enumerate(uops):
    for s in u.src: assert s in seen, f"uop {i} {u.op} uses {s.op} before it is computed"
    if u.op is Ops.RANGE: open_.append(u)
    if u.op is Ops.END: assert open_ and u.src[0] is open_.pop(), f"END at {i} does not close the innermost RANGE"
    seen.add(u)
  assert not open_
  params = [u for u in uops if u.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR)]
  assert uops[:len(params)] == params and [u.arg for u in params if u.op is Ops.DEFINE_GLOBAL] == list(range(len(params)))


def run(uops: list[UOp], *arrays: np.ndarray, out_size: int) -> np.ndarray:
  bufs = [memoryview(bytearray(out_size * 4))] + [memoryview(bytearray(a.astype(np.float32).tobytes())) for a in arrays]
  interpret(decode(uops), bufs, ())
  return np.frombuffer(bufs[0], np.float32)


X = np.arange(12, dtype=np.float32).reshape(3, 4) - 5


def test_reduce_structure():
  out, x = gl(0, 3), gl(1, 12)
  r0, r1 = rng(3, 0, "global"), rng(4, 1, "reduce")
  uops = linearize(store(out, r0, red(load(x, r0 * 4 + r1), r1, op=Ops.MAX)).sink())
  check_structure(uops)
  seq = [o for o in ops(uops) if o in (Ops.RANGE, Ops.END, Ops.DEFINE_REG, Ops.AFTER, Ops.MAX, Ops.STORE)]
  assert seq == [Ops.RANGE, Ops.DEFINE_REG, Ops.STORE, Ops.RANGE, Ops.MAX, Ops.STORE, Ops.END, Ops.AFTER, Ops.STORE, Ops.END]
  init = next(u for u in uops if u.op is Ops.STORE)
  assert init.src[1].op is Ops.CONST and init.src[1].arg == -float("inf")  # the identity of MAX
  assert [u.arg for u in uops if u.op is Ops.RANGE] == [(0, "global"), (1, "reduce")]
  np.testing.assert_array_equal(run(uops, X, out_size=3), X.max(axis=1))


def test_loop_invariants_hoisted_out_of_reduce():
  out, x, y = gl(0, 3), gl(1, 12), gl(2, 3)
  r0, r1 = rng(3, 0, "global"), rng(4, 1, "reduce")
  scale = load(y, r0).alu(Ops.EXP2)  # depends on the global range only
  uops = linearize(store(out, r0, red(load(x, r0 * 4 + r1) + scale, r1)).sink())
  check_structure(uops)
  pos = {u: i for i, u in enumerate(uops)}
  reduce_range = next(i for i, u in enumerate(uops) if u.op is Ops.RANGE and u.arg[1] == "reduce")
  exp2 = next(u for u in uops if u.op is Ops.EXP2)
  y_load = next(u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].arg == 2)
  assert pos[y_load] < pos[exp2] < reduce_range, "loads and math that don't depend on the reduce range belong before its loop"
  x_load = next(u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].arg == 1)
  assert pos[x_load] > reduce_range
  yv = np.array([0.5, -1, 2], np.float32)
  np.testing.assert_allclose(run(uops, X, yv, out_size=3), (X + np.exp2(yv)[:, None]).sum(axis=1), rtol=1e-6)


def test_nested_reduces():
  # out[i] = sum_j (x[i, j] * sum_k x[k, j])  -- the inner reduce runs inside the outer one's loop
  out, x = gl(0, 3), gl(1, 12)
  r0, r1, r2 = rng(3, 0, "global"), rng(4, 1, "reduce"), rng(3, 2, "reduce")
  inner = red(load(x, r2 * 4 + r1), r2)
  uops = linearize(store(out, r0, red(load(x, r0 * 4 + r1) * inner, r1)).sink())
  check_structure(uops)
  ranges = [u.arg[0] for u in uops if u.op is Ops.RANGE]
  assert ranges == [0, 1, 2] and len([u for u in uops if u.op is Ops.DEFINE_REG]) == 2
  ends = [u.src[0].arg[0] for u in uops if u.op is Ops.END]
  assert ends == [2, 1, 0]
  np.testing.assert_allclose(run(uops, X, out_size=3), (X * X.sum(axis=0)).sum(axis=1), rtol=1e-6)


def test_sibling_reduces_and_reduce_of_constant_size_one_loop():
  out, x = gl(0, 3), gl(1, 12)
  r0, r1 = rng(3, 0, "global"), rng(4, 1, "reduce")
  v = load(x, r0 * 4 + r1)
  uops = linearize(store(out, r0, red(v, r1) + red(v, r1, op=Ops.MAX)).sink())
  check_structure(uops)
  np.testing.assert_allclose(run(uops, X, out_size=3), X.sum(axis=1) + X.max(axis=1))


@pytest.mark.parametrize("n,want", [(1 << 20, dtypes.int32), (1 << 31, dtypes.int64)])
def test_index_dtype_lowering(n, want):
  out, x = gl(0, n), gl(1, 2 * n)
  r0 = rng(n, 0, "global")
  uops = linearize(store(out, r0, load(x, r0 * 2 + 1)).sink())
  check_structure(uops)
  assert all(u.dtype != dtypes.index for u in uops), "no dtypes.index may survive linearization"
  idx = [u.dtype for u in uops if u.op in (Ops.RANGE, Ops.MUL, Ops.ADD)]
  assert idx and all(d == want for d in idx), idx


def test_linearize_needs_sink():
  with pytest.raises(ValueError, match="SINK"): linearize(UOp.const(dtypes.int32, 1))


def test_sum_of_products_accumulates_with_one_mulacc_per_product():
  """acc + (a*b + c*d + e) (a gradient flowing back through two matmuls, merged into one reduce) is two MULACCs and
  an add on the accumulator: before, the products were multiplied and added apart (4 ops where 2 FMAs do)."""
  out, a, b, c = gl(0, 3), gl(1, 12), gl(2, 12), gl(3, 12)
  r0, r1 = rng(3, 0, "global"), rng(4, 1, "reduce")
  la, lb, lc = (load(g, r0 * 4 + r1) for g in (a, b, c))
  uops = linearize(store(out, r0, red(la * lb + (lc * la + lb), r1)).sink())
  check_structure(uops)
  inner = [u.op for u in uops if u.op in (Ops.MULACC, Ops.MUL, Ops.ADD) and u.dtype == dtypes.float32]
  assert inner.count(Ops.MULACC) == 2 and Ops.MUL not in inner and inner.count(Ops.ADD) == 1
  A, B, C = X + 0.5, X * 2 - 1, X * X
  np.testing.assert_allclose(run(uops, A, B, C, out_size=3), (A * B + C * A + B).sum(axis=1), rtol=1e-6)


@pytest.mark.parametrize("scale_first", [True, False])
@pytest.mark.parametrize("outer", [False, True])
def test_value_beside_a_reduce_is_read_after_its_loop(scale_first, outer):
  """out[i] = s[i] * sum_k a[i, k], and (outer) sum_j 0.5 * s[i, j] * sum_k a[i, j, k] through the float accumulator's
  MULACC: the scale is loaded after the k loop ends, whichever source it is, so it isn't live across that loop
  (register pressure: a Q5_0 product on AVX2 used 30 stack slots instead of 14 with the scale loaded first, and ran 10%
  slower); the values match numpy."""
  out, s, a = gl(0, 4), gl(1, 8), gl(2, 64)
  i, k, j = rng(4, 0, "global"), rng(8, 1, "reduce"), rng(2, 2, "reduce")
  inner = red(load(a, i * 16 + j * 8 + k) if outer else load(a, i * 16 + k), k)
  sc = load(s, i * 2 + j) if outer else load(s, i * 2)
  prod = (sc * inner) if scale_first else (inner * sc)
  uops = linearize(UOp.sink(store(out, i, red(prod * UOp.const(dtypes.float32, 0.5), j) if outer else prod)))
  check_structure(uops)
  end_k = next(n for n, u in enumerate(uops) if u.op is Ops.END and u.src[0].arg[0] == 1)
  assert next(n for n, u in enumerate(uops) if u.op is Ops.LOAD and u.src[0].src[0] is s) > end_k, [u.op for u in uops]
  sv, av = np.arange(1, 9, dtype=np.float32).reshape(4, 2), np.arange(64, dtype=np.float32).reshape(4, 2, 8)
  want = 0.5 * (sv * av.sum(2)).sum(1) if outer else sv[:, 0] * av[:, 0].sum(1)
  np.testing.assert_allclose(run(uops, sv, av, out_size=4), want, rtol=1e-6)
