"""codegen/facts.py: the kernel facts the rewrites and the heuristic share, each checked against hand-computed values and
(stride) against evaluating the index at r and r + 1."""
from __future__ import annotations

import ast
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrad.codegen import facts
from plugrad.codegen.facts import (UNROLL_BUDGET, UNROLL_MAX, const_end, contiguous, eval_index, global_ranges, range_size, ranges_of, row_blocks,
                                   stride, unrollable)
from plugrad.codegen.optops import Opt
from plugrad.dtype import dtypes
from plugrad.uop.ops import Ops, UOp

EXAMPLES = int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=EXAMPLES <= 200)


def c(x: int) -> UOp: return UOp.const(dtypes.index, x)
def rng(i: int, size: int | UOp, kind: str = "global") -> UOp:
  return UOp(Ops.RANGE, dtypes.index, (c(size) if isinstance(size, int) else size,), (i, kind))


T = UOp.variable("T", 1, 16)
R0, R1, R2 = rng(0, 64), rng(1, 32), rng(2, 8, "reduce")
RS = rng(3, T * 8)   # a symbolic size: 8..128


def test_const_end_and_range_size():
  assert const_end(R0) == 64 and range_size(R0) == 64
  assert const_end(RS) is None and range_size(RS) == 128   # symbolic: no constant size, its bound as the size


def test_global_ranges_in_id_order():
  lane = UOp(Ops.RANGE, dtypes.index, (c(8),), (5, "global", "vector"))
  sink = UOp.sink(R1 * 64 + R0 + R2 + lane)
  assert global_ranges(sink) == [R0, R1, lane] and global_ranges(sink, lanes=False) == [R0, R1]


def test_stride_by_hand():
  idx = R0 * 32 + R1
  assert stride(idx, R0) == 32 and stride(idx, R1) == 1 and stride(idx, R2) == 0
  assert contiguous(idx, R1) and not contiguous(idx, R0) and not contiguous(idx, R2)
  assert stride(R1 // 2, R1) is None             # 0 or 1 depending on the parity of r: no constant step
  assert stride((R0 * 4 + R2 % 4) // 4, R0) == 1  # the low terms fall out of the division
  assert stride(R0 * T, R0) is None              # a step that depends on a variable isn't constant
  assert stride(R2 * 3 + R0 * 5 - R2, R2) == 2


def test_unroll_limits():
  assert (UNROLL_MAX, UNROLL_BUDGET) == (4, 16)
  assert unrollable(rng(5, 3, "reduce")) and unrollable(rng(5, 4, "reduce")) and not unrollable(rng(5, 5, "reduce"))
  assert unrollable(rng(5, 16, "reduce"), UNROLL_BUDGET) and not unrollable(rng(5, 17, "reduce"), UNROLL_BUDGET)
  assert not unrollable(rng(5, T, "reduce"), UNROLL_BUDGET)   # a symbolic loop is never unrolled


def test_row_blocks_by_hand():
  rngs = ranges_of(UOp.sink(R0 + R1 + R2 + RS))
  assert row_blocks(rngs, [Opt("UPCAST", 0, 4)], unknown=0) == 16
  assert row_blocks(rngs, [Opt("UPCAST", 0, 4), Opt("UPCAST", 1, 8)], unknown=0) == 16 * 4
  # the axes default to the upcast ones; an axis without an UPCAST counts whole, an UPCAST off the axes is left out
  assert row_blocks(rngs, [Opt("UPCAST", 0, 4)], unknown=0, axes=[R0, R1]) == 16 * 32
  assert row_blocks(rngs, [Opt("UPCAST", 0, 4), Opt("UPCAST", 2, 2)], unknown=0, axes=[R0]) == 16
  assert row_blocks(rngs, [], unknown=0) == 1
  # a symbolic axis: the count is what the caller says an unknown count is
  assert row_blocks(rngs, [Opt("UPCAST", 3, 4)], unknown=0) == 0
  assert row_blocks(rngs, [Opt("UPCAST", 0, 4)], unknown=math.inf, axes=[R0, RS]) == math.inf


def _expr(draw, leaves: list[UOp], depth: int) -> UOp:
  if depth == 0 or draw(st.integers(0, 3)) == 0: return draw(st.sampled_from(leaves)) if draw(st.integers(0, 3)) else c(draw(st.integers(0, 9)))
  op = draw(st.sampled_from(["add", "mul", "div", "mod", "sub"]))
  a = _expr(draw, leaves, depth - 1)
  if op == "add": return a + _expr(draw, leaves, depth - 1)
  if op == "sub": return a - _expr(draw, leaves, depth - 1)
  k = draw(st.integers(1, 8))
  return a * k if op == "mul" else a // k if op == "div" else a % k


@st.composite
def index_and_point(draw):
  """An index expression over two ranges and a variable, and a point of them (r below its last value)."""
  v = UOp.variable("v", 0, 7)
  r, s = rng(0, draw(st.integers(2, 12))), rng(1, draw(st.integers(1, 6)))
  idx = _expr(draw, [r, r, s, v], 4)   # (r twice: most indices move with it)
  env = {r: draw(st.integers(0, r.src[0].arg - 2)), s: draw(st.integers(0, s.src[0].arg - 1)), v: draw(st.integers(0, 7))}
  return idx, r, env


@FUZZ
@given(index_and_point())
def test_stride_matches_evaluation(case):
  """Whenever stride gives a constant step, the index evaluated at r + 1 is the index at r plus that step."""
  idx, r, env = case
  if (k := stride(idx, r)) is None: return
  at = {n: x for n, x in env.items() if n is not r}
  assert eval_index(idx, {**at, r: env[r] + 1}) - eval_index(idx, {**at, r: env[r]}) == k, idx.render()


@FUZZ
@given(st.integers(-6, 6), st.integers(-6, 6), st.integers(0, 20))
def test_stride_of_affine_index_is_its_factor(a: int, b: int, c0: int):
  """An affine index a*r + b*s + c moves by exactly a along r and by b along s (0: it doesn't use the range)."""
  r, s = rng(0, 16), rng(1, 16)
  idx = r * a + s * b + c0
  assert stride(idx, r) == a and stride(idx, s) == b


@pytest.mark.parametrize("size,want", [(3, True), (4, True), (5, False)])
def test_unrollable_default_limit(size: int, want: bool):
  assert unrollable(rng(9, size, "reduce")) is want


def _imports(path: Path) -> set[str]:
  tree = ast.parse(path.read_text())
  return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
         {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


def test_heuristic_reads_caps_and_imports_point_one_way():
  """The heuristic reads the target only through the capability record (no getattr on a renderer) and imports neither
  rewrite module; the facts import no rewrite module nor the heuristic (facts <- rewrites, facts <- heuristic)."""
  codegen = Path(facts.__file__).parent
  names = {n.id for n in ast.walk(ast.parse((codegen / "heuristic.py").read_text())) if isinstance(n, ast.Name)}
  assert "Capabilities" in names and not names & {"getattr", "hasattr", "Renderer"}
  assert not _imports(codegen / "heuristic.py") & {"plugrad.codegen.opt", "plugrad.codegen.gpuopt"}
  assert not _imports(codegen / "facts.py") & {"plugrad.codegen.opt", "plugrad.codegen.gpuopt", "plugrad.codegen.heuristic", "plugrad.codegen.pack"}
