"""The "accumulators" pass (codegen/accumulate.py): every REDUCE becomes a register accumulator in the graph, and the
linearizer only orders what it made. Kernel ASTs are built by hand; programs run on the PYTHON interpreter against
numpy."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.codegen.accumulate import identity_value, lower_reduces
from plugrad.codegen.linearize import linearize
from plugrad.dtype import AddrSpace, dtypes
from plugrad.plugins.python import decode, interpret
from plugrad.uop.ops import Ops, UOp


def gl(slot: int, size: int, dt=dtypes.float32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), arg=slot)
def rng(n: int, rid: int, kind: str) -> UOp: return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), arg=(rid, kind))
def load(buf: UOp, idx: UOp) -> UOp: return UOp(Ops.LOAD, buf.dtype.base, (UOp(Ops.INDEX, buf.dtype, (buf, idx)),))
def store(buf: UOp, idx: UOp, val: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, idx)), val))
def red(x: UOp, *ranges: UOp, op=Ops.ADD) -> UOp: return UOp(Ops.REDUCE, x.dtype, (x, *ranges), arg=op)


def run(uops: list[UOp], *arrays: np.ndarray, out_size: int) -> np.ndarray:
  bufs = [memoryview(bytearray(out_size * 4))] + [memoryview(bytearray(a.astype(np.float32).tobytes())) for a in arrays]
  interpret(decode(uops), bufs, ())
  return np.frombuffer(bufs[0], np.float32)


def updates(ast: UOp) -> list[UOp]:
  """The value each accumulator's update STORE writes, one per END of the lowered graph."""
  return [n.src[0].src[1] for n in ast.toposort() if n.op is Ops.END]


def chain(update: UOp) -> list[Ops]:
  """The ops of an update from the outermost to the running value (following the source that reads it)."""
  ops = []
  while not (update.op is Ops.LOAD and update.src[0].src[0].op is Ops.DEFINE_REG):
    ops.append(update.op)
    update = next(s for s in update.src if any(x.op is Ops.LOAD and x.src[0].src[0].op is Ops.DEFINE_REG for x in s.toposort()))
  return ops


def test_every_reduce_becomes_its_own_accumulator():
  out, x = gl(0, 3), gl(1, 12)
  i, k, j = rng(3, 0, "global"), rng(4, 1, "reduce"), rng(3, 2, "reduce")
  v = load(x, i * 4 + k)
  inner = red(load(x, j * 4 + k), j)
  ast = store(out, i, red(v, k) + red(v, k, op=Ops.MAX) + red(v * inner, k)).sink()
  low = lower_reduces(ast)
  topo = low.toposort()
  assert not any(n.op is Ops.REDUCE for n in topo)
  regs = [n for n in topo if n.op is Ops.DEFINE_REG]
  assert len(regs) == 4 and len({r.arg for r in regs}) == 4 and all(r.dtype.addrspace is AddrSpace.REG for r in regs)
  assert sorted(tuple(r.arg for r in n.src[1:]) for n in topo if n.op is Ops.END) == [((1, "reduce"),)] * 3 + [((2, "reduce"),)]
  assert lower_reduces(low) is low   # nothing left to lower
  want = X.sum(1) + X.max(1) + (X * X.sum(0)).sum(1)
  np.testing.assert_allclose(run(linearize(ast), X, out_size=3), want, rtol=1e-6)


X = np.arange(12, dtype=np.float32).reshape(3, 4) - 5


def test_float_sum_updates_with_a_mulacc_per_product_and_keeps_an_invariant_sum_whole():
  out, a, b, s = gl(0, 3), gl(1, 12), gl(2, 12), gl(3, 3)
  i, k = rng(3, 0, "global"), rng(4, 1, "reduce")
  la, lb = load(a, i * 4 + k), load(b, i * 4 + k)
  inv = load(s, i) + load(s, i).alu(Ops.EXP2)   # an ADD that doesn't vary with k: one term, computed before the loop
  ast = store(out, i, red(la * lb + (lb * la + inv), k)).sink()
  (upd,) = updates(lower_reduces(ast))
  assert chain(upd) == [Ops.ADD, Ops.MULACC, Ops.MULACC] and upd.src[1] is inv
  sv = np.array([0.5, -1, 2], np.float32)
  want = (2 * X * (X + 1)).sum(1) + 4 * (sv + np.exp2(sv))
  np.testing.assert_allclose(run(linearize(ast), X, X + 1, sv, out_size=3), want, rtol=1e-6)


@pytest.mark.parametrize("op,dt", [(Ops.MAX, dtypes.float32), (Ops.ADD, dtypes.int32), (Ops.MUL, dtypes.float32)])
def test_other_reduces_update_with_their_op(op, dt):
  out, x = gl(0, 3, dt), gl(1, 12, dt)
  i, k = rng(3, 0, "global"), rng(4, 1, "reduce")
  body = load(x, i * 4 + k) * load(x, i * 4 + k)
  (upd,) = updates(lower_reduces(store(out, i, red(body, k, op=op)).sink()))
  assert upd.op is op and upd.src[1] is body   # op(cur, body): no MULACC outside a float sum
  init = next(n for n in lower_reduces(store(out, i, red(body, k, op=op)).sink()).toposort()
              if n.op is Ops.STORE and n.src[0].src[0].op is Ops.DEFINE_REG and n.src[1].op is Ops.CONST)
  assert init.src[1].arg == {Ops.MAX: -float("inf"), Ops.ADD: 0, Ops.MUL: 1}[op]


def test_a_wmma_body_accumulates_in_its_third_operand():
  out, a, b = gl(0, 16), gl(1, 64), gl(2, 64)
  i, k = rng(8, 0, "global"), rng(4, 1, "reduce")
  va = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (load(a, i * 8 + k * 2), load(a, i * 8 + k * 2 + 1)))
  vb = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (load(b, i * 8 + k * 2), load(b, i * 8 + k * 2 + 1)))
  zero = identity_value(Ops.ADD, dtypes.float32.vec(2))
  w = UOp(Ops.WMMA, dtypes.float32.vec(2), (va, vb, zero), "DOT2")
  acc = red(w, k)
  (upd,) = updates(lower_reduces(store(out, i * 2, UOp(Ops.GEP, dtypes.float32, (acc,), (0,))).sink()))
  assert upd.op is Ops.WMMA and upd.src[:2] == (va, vb) and upd.src[2].op is Ops.LOAD and upd.arg == "DOT2"
  assert zero.op is Ops.VECTORIZE and all(s.arg == 0 for s in zero.src)


def test_an_invariant_product_is_not_computed_apart_from_its_mulacc():
  """REDUCE(a*b, k) with a and b fixed in k: the loop adds MULACC(a, b, acc). The linearizer used to emit the product
  a*b before the loop too, a statement nothing read (kernels with a reduce range of size 1 left after upcasting)."""
  out, s, t = gl(0, 3), gl(1, 3), gl(2, 3)
  i, k = rng(3, 0, "global"), rng(4, 1, "reduce")
  uops = linearize(store(out, i, red(load(s, i) * load(t, i), k)).sink())
  assert [u.op for u in uops].count(Ops.MUL) == 0 and [u.op for u in uops].count(Ops.MULACC) == 1
  sv, tv = np.array([1, 2, 3], np.float32), np.array([-1, 0.5, 4], np.float32)
  np.testing.assert_allclose(run(uops, sv, tv, out_size=3), 4 * sv * tv)


@pytest.mark.parametrize("inner_varies", [True, False])
def test_a_nested_accumulator_resets_where_its_loops_are_entered(inner_varies):
  """out[i] = sum_j x[i, j] * sum_k y[.., k]: the inner accumulator is reset for every j when it reads j (its reset is
  plumbing the hoisting never moves), and computed once before the j loop when it doesn't."""
  out, x, y = gl(0, 3), gl(1, 12), gl(2, 12)
  i, j, k = rng(3, 0, "global"), rng(4, 1, "reduce"), rng(3, 2, "reduce")
  inner = red(load(y, k * 4 + j) if inner_varies else load(y, i * 4 + k), k)
  uops = linearize(store(out, i, red(load(x, i * 4 + j) * inner, j)).sink())
  opened = [u.arg[0] for u in uops if u.op is Ops.RANGE]
  assert opened == ([0, 1, 2] if inner_varies else [0, 2, 1])
  Y = X * 0.5 + 1
  want = (X * Y.sum(0)).sum(1) if inner_varies else X.sum(1) * Y[:, :3].sum(1)
  np.testing.assert_allclose(run(uops, X, Y, out_size=3), want, rtol=1e-6)


def test_an_index_sum_accumulates_in_the_lowered_index_type():
  """A REDUCE of index values (position arithmetic) accumulates in the type the kernel's index math is lowered to
  (int64 here: a sum's bounds aren't tracked, so it might not fit int32), not in `dtypes.index`, which no renderer has."""
  out = gl(0, 3, dtypes.int32)
  i, k = rng(3, 0, "global"), rng(4, 1, "reduce")
  uops = linearize(store(out, i, UOp(Ops.CAST, dtypes.int32, (red(i * 4 + k, k),))).sink())
  assert all(u.dtype != dtypes.index and getattr(u.dtype, "base", None) != dtypes.index for u in uops)
  assert [u.dtype.base for u in uops if u.op is Ops.DEFINE_REG] == [next(u.dtype for u in uops if u.op is Ops.RANGE)] == [dtypes.int64]
  bufs = [memoryview(bytearray(12))]
  interpret(decode(uops), bufs, ())
  np.testing.assert_array_equal(np.frombuffer(bufs[0], np.int32), [(4 * r) * 4 + 6 for r in range(3)])
