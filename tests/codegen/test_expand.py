"""The expand pass (codegen/expand.py): UPCAST, UPCAST_OVERLAP, SPLIT, UNROLL and FOLD only split and retype a range (a
new range marked "upcast", "unroll" or "fold"); the pass makes the copies, in the order the optimizations marked them, also for a
kind registered from this file alone."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from plugrad.codegen import get_program
from plugrad.codegen.expand import copy_range, expand, is_copy_range, simplify
from plugrad.codegen.facts import eval_index
from plugrad.codegen.group import is_grouped
from plugrad.codegen.optops import GLOBAL, OPT_KINDS, Opt, OptKind, apply_opt, register
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.engine.realize import buffer_for
from plugrad.plugins.python import PythonDevice, PythonProgram
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp

RNG = np.random.default_rng(0)


def _kernel(t: Tensor):
  (it,) = [it for it in t.schedule(optimize=False) if it.ast.op is Ops.SINK]
  return it


def _ranges(ast: UOp, kind: str) -> list[UOp]: return [n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == kind]
def _count(ast: UOp, op: Ops) -> int: return sum(n.op is op for n in ast.toposort())


def _run_cpu(it, opts: list[Opt]) -> np.ndarray:
  dev = Device["CPU"]
  spec = get_program(it.ast, dev.renderer, opts)
  bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
  dev.load(spec.name, dev.compiler.compile_cached(spec.src))(*bufs)
  return bufs[0].view(np.float32)


def test_upcast_marks_a_range_and_expand_copies_the_stores():
  a, b = RNG.standard_normal((8, 16)).astype(np.float32), RNG.standard_normal((16, 12)).astype(np.float32)
  it = _kernel(Tensor(a).realize() @ Tensor(b).realize())
  g = _ranges(it.ast, "global")[0]
  marked = apply_opt(it.ast, Opt("UPCAST", g.arg[0], 4))
  (copy,) = [r for r in marked.toposort() if is_copy_range(r)]
  assert copy.arg[1:] == ("global", "upcast") and copy.src[0].arg == 4 and _count(marked, Ops.STORE) == 1
  done = expand(marked)
  assert _count(done, Ops.STORE) == 4 and not any(is_copy_range(r) for r in done.toposort())
  np.testing.assert_allclose(_run_cpu(it, [Opt("UPCAST", g.arg[0], 4)]).reshape(8, 12), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,amount,reduces", [("SPLIT", 4, 4), ("UNROLL", 16, 0)])
def test_split_and_unroll_mark_a_reduce_range(kind, amount, reduces):
  a = RNG.standard_normal((8, 16)).astype(np.float32)
  it = _kernel(Tensor(a).realize().sum(axis=1))
  (r,) = _ranges(it.ast, "reduce")
  marked = apply_opt(it.ast, Opt(kind, r.arg[0], amount))
  (red,) = [n for n in marked.toposort() if n.op is Ops.REDUCE]
  assert [x.arg[2:] for x in red.src[1:]] == ([(), ("unroll",)] if kind == "SPLIT" else [("unroll",)])
  done = expand(marked)
  assert _count(done, Ops.REDUCE) == reduces and not any(is_copy_range(n) for n in done.toposort())
  np.testing.assert_allclose(_run_cpu(it, [Opt(kind, r.arg[0], amount)]), a.sum(axis=1), rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("kind,reduces,accumulators", [("UNROLL", 3, 3), ("FOLD", 1, 1)])
def test_fold_keeps_one_accumulator_where_unroll_makes_one_a_copy(kind, reduces, accumulators):
  """A short reduce range next to a longer one (a convolution's tap axis inside its channel loop): UNROLL makes one
  REDUCE, and so one accumulator, per copy; FOLD sums the copies inside one REDUCE over the other range, so a register
  tile's accumulators each take the k copies a trip instead of the tile growing k-fold (an AVX-512 conv tile of 14
  accumulators became 126 and spilled: 62 ms against 22 unrolled by clang). Same values either way."""
  a = RNG.standard_normal((8, 16, 3)).astype(np.float32)
  it = _kernel(Tensor(a).realize().sum(axis=(1, 2)))
  short = next(r for r in _ranges(it.ast, "reduce") if r.src[0].arg == 3)
  marked = apply_opt(it.ast, Opt(kind, short.arg[0], 3))
  assert [x.arg[2:] for x in marked.toposort() if is_copy_range(x)] == [("unroll",) if kind == "UNROLL" else ("fold",)]
  done = expand(marked)
  assert _count(done, Ops.REDUCE) == reduces and not any(is_copy_range(n) for n in done.toposort())
  spec = get_program(it.ast, Device["CPU"].renderer, [Opt(kind, short.arg[0], 3)])
  assert _count(UOp(Ops.SINK, dtypes.void, tuple(spec.uops)), Ops.DEFINE_REG) == accumulators
  np.testing.assert_allclose(_run_cpu(it, [Opt(kind, short.arg[0], 3)]), a.sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="FOLD must cover"): apply_opt(it.ast, Opt("FOLD", short.arg[0], 1))

def _store_offsets(ast: UOp) -> list[int]:
  """Each store's flat output index with every loop at 0."""
  zero = {n: UOp.const(dtypes.index, 0) for n in ast.toposort() if n.op is Ops.RANGE}
  return [simplify(st.src[0].src[1].substitute(zero, walk=True)).arg for st in ast.src]


def test_copies_are_made_in_the_order_they_were_marked():
  it = _kernel(Tensor(RNG.standard_normal((4, 8)).astype(np.float32)).realize() * 2)
  i, j = sorted(_ranges(it.ast, "global"), key=lambda r: r.arg[0])
  ij = expand(apply_opt(apply_opt(it.ast, Opt("UPCAST", i.arg[0], 2)), Opt("UPCAST", j.arg[0], 2)))
  ji = expand(apply_opt(apply_opt(it.ast, Opt("UPCAST", j.arg[0], 2)), Opt("UPCAST", i.arg[0], 2)))
  assert _store_offsets(ij) == [0, 1, 8, 9] and _store_offsets(ji) == [0, 8, 1, 9]


def test_an_optimization_of_a_copy_range_is_refused():
  it = _kernel(Tensor(RNG.standard_normal((8, 16)).astype(np.float32)).realize().sum(axis=1))
  (r,) = _ranges(it.ast, "reduce")
  marked = apply_opt(it.ast, Opt("SPLIT", r.arg[0], 4))
  copy = next(n for n in marked.toposort() if is_copy_range(n))
  with pytest.raises(ValueError, match=f"range {copy.arg[0]} is an unroll copy range"): apply_opt(marked, Opt("SPLIT", copy.arg[0], 2))


def test_thread_kinds_leave_the_pending_copies_to_the_expand_pass(monkeypatch):
  """GROUP and LOCAL only split: an UPCAST marked before them stays pending (both made its copies first before). The
  expand pass makes the copies, then lowers the grouped reduces into shared memory and barriers (codegen/group.py),
  so each copy's reduce is grouped with its own local buffer. Right on the emulator."""
  monkeypatch.setenv("EMULATE", "CUDA")
  dev = PythonDevice("PYTHON")
  monkeypatch.delenv("EMULATE")
  a, b = RNG.standard_normal((16, 64)).astype(np.float32), RNG.standard_normal((64, 32)).astype(np.float32)
  it = _kernel(Tensor(a, device="PYTHON").realize() @ Tensor(b, device="PYTHON").realize())
  gi, gj = sorted(_ranges(it.ast, "global"), key=lambda r: r.arg[0])
  (r,) = _ranges(it.ast, "reduce")
  caps = dev.renderer.caps
  up = apply_opt(it.ast, Opt("UPCAST", gi.arg[0], 2), caps)
  grouped = apply_opt(up, Opt("GROUP", r.arg[0], 16), caps)
  assert any(is_copy_range(n) for n in grouped.toposort()) and sum(map(is_grouped, grouped.toposort())) == 1
  assert _count(expand(grouped), Ops.DEFINE_LOCAL) == 2
  assert any(is_copy_range(n) for n in apply_opt(up, Opt("LOCAL", gj.arg[0], 8), caps).toposort())
  for opts in ([Opt("UPCAST", gi.arg[0], 2), Opt("LOCAL", gj.arg[0], 8)], [Opt("UPCAST", gi.arg[0], 2), Opt("GROUP", r.arg[0], 16)]):
    spec = get_program(it.ast, dev.renderer, opts)
    bufs = [buffer_for(u).ensure_allocated() for u in it.bufs]
    glb, lcl = spec.launch_dims()
    PythonProgram(dev, spec.name, dev.compiler.compile(spec.src))(*[x._buf for x in bufs], global_size=glb, local_size=lcl, vals=())
    np.testing.assert_allclose(bufs[0].numpy().reshape(16, 32), a @ b, rtol=1e-5, atol=1e-5, err_msg=str(opts))


def _interleave(ast: UOp, rng: UOp | None, opt: Opt, caps) -> UOp:
  """A kind written only here: k outputs a loop iteration N/k apart (r -> copy*(N/k) + r'), its copies made by the
  shared expand pass (it only splits and marks the range)."""
  assert rng is not None
  if rng.src[0].op is not Ops.CONST or rng.src[0].arg % opt.amount: raise ValueError(f"{opt}: needs a constant size {opt.amount} divides")
  step = rng.src[0].arg // opt.amount
  outer = UOp(Ops.RANGE, rng.dtype, (UOp.const(dtypes.index, step),), rng.arg)
  return simplify(ast.substitute({rng: copy_range(ast, rng, opt.amount, "upcast") * step + outer}, walk=True))


@pytest.fixture
def interleave_kind():
  yield register(OptKind("INTERLEAVE", _interleave, GLOBAL))
  del OPT_KINDS["INTERLEAVE"]


def test_a_new_copy_kind_needs_no_expansion_code(interleave_kind):
  a = RNG.standard_normal((8, 12)).astype(np.float32)
  it = _kernel(Tensor(a).realize() * 3)
  i, j = sorted(_ranges(it.ast, "global"), key=lambda r: r.arg[0])
  done = expand(apply_opt(it.ast, Opt("INTERLEAVE", i.arg[0], 4)))
  assert _store_offsets(done) == [0, 24, 48, 72]   # rows 0, 2, 4, 6 of 12 columns
  np.testing.assert_allclose(_run_cpu(it, [Opt("INTERLEAVE", i.arg[0], 4)]).reshape(8, 12), a * 3, rtol=1e-6)


_OPT_CHOICES = st.sampled_from([("UPCAST", 0, 2), ("UPCAST", 0, 4), ("UPCAST", 1, 2), ("UPCAST", 1, 4), ("UPCAST_OVERLAP", 0, 3),
                                ("SPLIT", 2, 2), ("SPLIT", 2, 4), ("UNROLL", 2, 8), ("VECTOR", 1, 4)])


@settings(max_examples=max(25, int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200")) // 8), deadline=None)   # 25 in make test
@given(m=st.sampled_from([4, 8, 12]), n=st.sampled_from([4, 8, 16]), k=st.sampled_from([8, 16]), picks=st.lists(_OPT_CHOICES, min_size=1, max_size=4))
def test_any_sequence_of_copy_marks_computes_the_product(m, n, k, picks):
  """Any order of copy-marking Opts (as BEAM may choose them: an UPCAST after a SPLIT, two SPLITs of one range, a VECTOR
  between them) expands to a kernel that computes x @ y on the CPU; an Opt that doesn't fit the kernel is refused."""
  x, y = RNG.standard_normal((m, k)).astype(np.float32), RNG.standard_normal((k, n)).astype(np.float32)
  it = _kernel(Tensor(x).realize() @ Tensor(y).realize())
  ids = {0: _ranges(it.ast, "global")[0].arg[0], 1: _ranges(it.ast, "global")[1].arg[0], 2: _ranges(it.ast, "reduce")[0].arg[0]}
  opts, ast = [], it.ast
  for kind, which, amount in picks:
    try: ast = apply_opt(ast, o := Opt(kind, ids[which], amount))
    except ValueError: continue
    opts.append(o)
  assume(opts)
  assert not any(is_copy_range(r) for r in expand(ast).toposort())
  np.testing.assert_allclose(_run_cpu(it, opts).reshape(m, n), x @ y, rtol=1e-4, atol=1e-4, err_msg=str(opts))


def test_gates_drop_repeated_terms_and_merge_bounds_of_one_index():
  """A chain of ANDs (a load's gate after its padding gate met a partial workgroup's) loses a repeated term and keeps
  the tightest upper bound of one index: `(a & b) & b` -> `a & b`, `i < 28 & i < 29` -> `i < 28`. Checked by value
  over every point of the ranges too (the 10 GPU conv kernels it shortens in the corpus are the same on the emulator)."""
  i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 32),), (0, "local"))
  j = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 4),), (1, "global"))
  a, b = j.ne(0), i < 28
  assert simplify((a & b) & b) is simplify(a & b)
  assert simplify((a & (i < 28)) & (i < 29)) is simplify(a & (i < 28))
  for g in ((a & (i < 29)) & ((i < 28) & a), ((i < 30) & (j < 3)) & (i < 27)):
    s = simplify(g)
    assert len([n for n in s.toposort() if n.op is Ops.CMPLT and n.src[0] is i]) == 1, s
    for iv in range(32):
      for jv in range(4):
        env = {i: iv, j: jv}
        assert eval_index(s, dict(env)) == eval_index(g, dict(env))


def test_a_store_group_takes_the_place_of_its_store():
  """`store_group` + `pm_flatten_stores`: how a rule replaces one STORE of the kernel by several (the expand pass's
  copies, the vectorize pass's lane-by-lane stores, the tensor-core pass's fragments): the SINK gets them in its
  place, in order, and keeps its other sources and its arg; a GROUP without the tag is left alone."""
  from plugrad.codegen.expand import pm_flatten_stores, store_group
  from plugrad.uop.rewrite import graph_rewrite
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(8), arg=0)
  def st(i: int) -> UOp:
    return UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, UOp.const(dtypes.index, i))), UOp.const(dtypes.float32, i)))
  other = UOp(Ops.GROUP, dtypes.void, (st(7),))
  sink = UOp(Ops.SINK, dtypes.void, (st(0), store_group([st(1), st(2)]), other, store_group([st(3)])), arg="k")
  out = graph_rewrite(sink, pm_flatten_stores)
  assert out.src == (st(0), st(1), st(2), other, st(3)) and out.arg == "k"
