"""The `merge ranges` pass (codegen/opt.py `merge_reduce_ranges`): reduce ranges every index reads as one contiguous run
become one range; anything else is left alone. Values against numpy over random shapes, axes and views."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrad.codegen import run_pipeline
from plugrad.codegen.opt import merge_reduce_ranges
from plugrad.device import Device
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp

RNG = np.random.default_rng(0)


def reduce_sizes(ast: UOp) -> list[int]:
  return sorted(r.src[0].arg for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] == "reduce")


def test_contiguous_runs_merge_and_others_stay():
  x = Tensor(RNG.standard_normal((4, 8, 32, 32)).astype(np.float32)).realize()
  cases = [(x.sum(axis=(0, 2, 3)), [4, 1024]),        # a BatchNorm's per-channel sum: the pixels are one run, the batch not
           (x.sum(), [4, 8 * 32 * 32]),                 # one run, but a range of 4 stays (unrollable: structure)
           ((x * x).sum(axis=(2, 3)), [1024]),
           (x.permute(0, 1, 3, 2).sum(axis=(2, 3)), [32, 32]),   # read transposed: not a run
           (x[:, :, :, :30].sum(axis=(2, 3)), [30, 32]),        # rows 32 apart, 30 read: not a run
           (x.max(axis=(2, 3)), [1024])]
  for t, want in cases:
    assert reduce_sizes(merge_reduce_ranges(t.schedule(optimize=False)[-1].ast)) == want


def test_channel_sum_runs_as_one_loop_of_the_pixels():
  """Regression: the per-channel sum of a BatchNorm ran 32 loops of 32 pixels, which clang unrolled into a chain of
  scalar adds (64x64x32x32: 3.47 ms on one core, 4.8 GB/s); one loop of 1024 is vectorized (0.27 ms)."""
  x = Tensor(RNG.standard_normal((8, 16, 32, 32)).astype(np.float32)).realize()
  ast = x.sum(axis=(0, 2, 3)).schedule(optimize=False)[-1].ast
  k = run_pipeline(ast, Device["CPU"].renderer)
  assert "< 1024" in k.src and "< 32;" not in k.src, k.src
  np.testing.assert_allclose(x.sum(axis=(0, 2, 3)).numpy(), x.numpy().sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-3)


def test_explicit_opts_keep_the_ranges():
  """Explicit Opts name the caller's ranges, so the pass leaves the AST alone then."""
  x = Tensor(RNG.standard_normal((4, 32, 32)).astype(np.float32)).realize()
  ast = x.sum(axis=(1, 2)).schedule(optimize=False)[-1].ast
  assert reduce_sizes(run_pipeline(ast, Device["CPU"].renderer, []).ast) == [32, 32]


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=4), data=st.data())
def test_merged_reductions_match_numpy(shape: list[int], data):
  a = RNG.standard_normal(shape).astype(np.float32)
  axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
  perm = data.draw(st.permutations(range(len(shape))))
  t, ref = Tensor(a).permute(*perm), a.transpose(perm)
  op = data.draw(st.sampled_from(["sum", "max"]))
  got = getattr(t, op)(axis=axes).numpy()
  np.testing.assert_allclose(got, getattr(ref, op)(axis=axes), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
def test_mean_and_var_of_a_batch_norm_layout(dev: str):
  a = RNG.standard_normal((3, 5, 7, 8)).astype(np.float32)
  t = Tensor(a, device=dev)
  np.testing.assert_allclose(t.mean(axis=(0, 2, 3)).numpy(), a.mean(axis=(0, 2, 3)), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(t.var(axis=(0, 2, 3)).numpy(), a.var(axis=(0, 2, 3), ddof=1), rtol=1e-3, atol=1e-4)


def test_sum_of_products_is_vectorized_by_the_heuristic():
  """Regression: a streaming sum was left to the compiler's vectorizer, but a sum of products is rendered as an fma
  chain, which it may not reorder (a BatchNorm's sum of x*x over 64x64x32x32: 4.68 ms on one core, 0.58 now): the
  heuristic vectorizes those itself when they are long (LONG_FMA_CHAIN); a plain sum stays the compiler's."""
  from codegen_helpers import host_record
  from plugrad.codegen.heuristic import heuristic_opts
  x = Tensor(RNG.standard_normal((16, 4, 32, 32)).astype(np.float32)).realize()   # 16384 products a channel
  for lanes, regs in ((8, 16), (16, 32)):
    caps = host_record(lanes=lanes, regs=regs)
    sq = merge_reduce_ranges((x * x).sum(axis=(0, 2, 3)).schedule(optimize=False)[-1].ast)
    assert any(o.kind == "VECTOR" for o in heuristic_opts(sq, caps))
    assert heuristic_opts(merge_reduce_ranges(x.sum(axis=(0, 2, 3)).schedule(optimize=False)[-1].ast), caps) == []
  np.testing.assert_allclose((x * x).sum(axis=(0, 2, 3)).numpy(), (x.numpy() ** 2).sum(axis=(0, 2, 3)), rtol=1e-4)
