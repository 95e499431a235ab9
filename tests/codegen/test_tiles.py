"""Register tiles of the CPU heuristic: the matmul and convolution tiles on 16 and 32 vector registers (each row's
broadcast used by all its vectors at once: no spills), and tiles that don't divide their axis: UPCAST_OVERLAP and
BLOCK with an overlapping last block (codegen/opt.py; codegen/heuristic.py: `_tile_rows`, `row_block_opt`).

The last block of k copies starts at N-k, so a few outputs are computed twice, each exactly as its owner computes it,
and stored again with the same value: values are compared with numpy over sizes that k doesn't divide, and the kernels
where a second store could differ (one that reads the buffer it writes) are refused."""
from __future__ import annotations

import itertools
import math
import re
import shutil
import subprocess

import numpy as np
import pytest
from codegen_helpers import host_record, with_caps
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrad.codegen import get_program
from plugrad.codegen.facts import row_blocks
from plugrad.codegen.heuristic import conv_opts, heuristic_opts
from plugrad.codegen.optops import Opt, apply_opt
from plugrad.codegen.pack import split_packs
from plugrad.device import Device
from plugrad.engine.realize import buffer_for
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp

RNG = np.random.default_rng(0)
AVX2, AVX512 = host_record(lanes=8, regs=16), host_record(lanes=16, regs=32)


def rand(*shape: int) -> np.ndarray: return RNG.uniform(-1, 1, shape).astype(np.float32)


def run_opts(t: Tensor, opts: list[Opt]) -> np.ndarray:
  """`t`'s single kernel compiled with exactly `opts` on the CPU device, run, its output returned."""
  dev = Device["CPU"]
  (it,) = t.schedule(optimize=False)
  spec = get_program(it.ast, dev.renderer, opts)
  bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
  dev.load(spec.name, dev.compiler.compile_cached(spec.src))(*bufs, vals=tuple(it.var_vals.values()))
  return bufs[0].view(np.float32)[:int(np.prod(t.shape))].reshape(t.shape).copy()


def rows_of(ast: UOp) -> int:
  """The id of the row range of a matmul kernel (the global range the first operand moves with)."""
  return min(n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "global")


@settings(max_examples=25, deadline=None)
@given(m=st.integers(4, 70), k=st.sampled_from([3, 5, 6, 7]), n=st.sampled_from([1, 8, 24]), threads=st.sampled_from([1, 2]))
def test_upcast_overlap_matches_numpy(m: int, k: int, n: int, threads: int):
  if m <= k or m % k == 0: m = k * (m // k + 1) + 1
  a, b = rand(m, 20), rand(20, n)
  t = Tensor(a) @ Tensor(b)
  dev = Device["CPU"]
  saved, dev.threads = dev.threads, threads
  try: out = run_opts(t, [Opt("UPCAST_OVERLAP", rows_of(t.schedule(optimize=False)[-1].ast), k)])
  finally: dev.threads = saved
  np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,chunk", [(40, 3), (40, 7), (35, 6), (36, 5)])
def test_block_overlap_matches_numpy(m: int, chunk: int):
  """BLOCK by a chunk that doesn't divide the range (the last chunk overlaps), also on top of an overlapping tile."""
  a, b = rand(m, 16), rand(16, 32)
  t = Tensor(a) @ Tensor(b)
  r = rows_of(t.schedule(optimize=False)[-1].ast)
  np.testing.assert_allclose(run_opts(t, [Opt("BLOCK", r, chunk)]), a @ b, rtol=1e-5, atol=1e-5)
  tiles = (m + 3) // 4
  if tiles > chunk: np.testing.assert_allclose(run_opts(t, [Opt("UPCAST_OVERLAP" if m % 4 else "UPCAST", r, 4), Opt("BLOCK", r, chunk)]),
                                               a @ b, rtol=1e-5, atol=1e-5)


def test_overlap_refusals():
  """Refused where a second store could differ or the kind doesn't fit, with the reason named."""
  x = Tensor(rand(10, 8)).realize()
  y = x.assign(x * 2 + 1)
  inplace = y.schedule(optimize=False)[-1].ast   # reads the buffer it writes: a second copy would double twice
  y.realize()   # (an assign left pending would stay pending for the rest of the process: later tests' realizes see it)
  r = rows_of(inplace)
  with pytest.raises(ValueError, match="reads a buffer it writes"): apply_opt(inplace, Opt("UPCAST_OVERLAP", r, 3))
  with pytest.raises(ValueError, match="reads a buffer it writes"): apply_opt(inplace, Opt("BLOCK", r, 3))
  ast = (Tensor(rand(12, 8)) @ Tensor(rand(8, 8))).schedule(optimize=False)[-1].ast
  r = rows_of(ast)
  with pytest.raises(ValueError, match="else UPCAST"): apply_opt(ast, Opt("UPCAST_OVERLAP", r, 4))   # 4 divides 12
  with pytest.raises(ValueError, match="else UPCAST"): apply_opt(ast, Opt("UPCAST_OVERLAP", r, 12))
  with pytest.raises(ValueError, match="constant size over 12"): apply_opt(ast, Opt("BLOCK", r, 12))


def _matmul_ast(m: int, k: int, n: int) -> UOp:
  return (Tensor(rand(m, k)) @ Tensor(rand(k, n))).schedule(optimize=False)[-1].ast


def _tile(opts: list[Opt], ast: UOp) -> list[tuple[str, int, str]]:
  """The tile's UPCASTs in order: (kind, amount, "rows" or "cols")."""
  r = rows_of(ast)
  return [(o.kind, o.amount, "rows" if o.rid == r else "cols") for o in opts if o.kind.startswith("UPCAST")]


def test_avx2_matmul_tile_is_six_rows_by_two_vectors():
  """16 vector registers: 6 rows x 2 vectors of accumulators (12 + 2 column vectors + 1 broadcast), rows first so each
  row's broadcast is used by both vectors at once and dies; on 1024 rows (6 doesn't divide) the last tile overlaps.
  Before: 4x2 on 1024 rows (99 against 107 GFLOPS, one core) and 6x2 column-major on 1536 rows (six live broadcasts:
  spilled accumulators, 48 GFLOPS). 32 registers: 8 rows, as before."""
  for m in (1024, 1536):
    ast = _matmul_ast(m, 256, 256)
    assert _tile(heuristic_opts(ast, AVX2), ast) == [("UPCAST_OVERLAP" if m % 6 else "UPCAST", 6, "rows"), ("UPCAST", 2, "cols")]
    assert _tile(heuristic_opts(ast, AVX512), ast) == [("UPCAST", 8, "rows"), ("UPCAST", 2, "cols")]
  small = _matmul_ast(16, 256, 256)   # 16 rows: tiles of 6 would compute 2 of 16 rows twice (over 1/16): 4 rows
  assert _tile(heuristic_opts(small, AVX2), small)[0] == ("UPCAST", 4, "rows")


def test_big_avx2_matmul_blocks_rows_with_an_overlapping_chunk():
  """4096^2 with 6-row tiles: 683 row blocks (a prime) get no power-of-two chunk; the chunk from L3/16..L3/8 of A that
  computes the fewest blocks twice is taken instead (before: no L3 blocking at all, 0.87x numpy on 2 threads)."""
  ast = _matmul_ast(4096, 4096, 4096)
  opts = heuristic_opts(ast, AVX2)
  (blk,) = [o for o in opts if o.kind == "BLOCK"]
  rows = [o for o in opts if o.kind == "UPCAST_OVERLAP"]
  blocks = int(row_blocks({n.arg[0]: n for n in ast.toposort() if n.op is Ops.RANGE}, rows, unknown=0))
  assert blocks == 683 and blk.amount * 6 * 4096 * 4 * 8 <= 32 << 20 < 2 * blk.amount * 6 * 4096 * 4 * 8, opts
  assert -blocks % blk.amount * 16 <= blocks


def _inner_loop_asm(src: str, cc: str | None = None, march: str = "x86-64-v3") -> str:
  """The assembly of the reduce loop of a kernel (the innermost loop: the last backward branch's block) built by `cc`
  (default: clang) for `march`."""
  cc = cc or shutil.which("clang")
  if cc is None: pytest.skip("clang not installed")
  asm = subprocess.run([cc, "-O2", f"-march={march}", "-ffp-contract=off", "-fno-math-errno", "-S", "-o", "-", "-x", "c", "-"],
                       input=src, capture_output=True, text=True, check=True).stdout
  lines, loops = asm.splitlines(), []
  for i, ln in enumerate(lines):
    head = [ln] + list(itertools.takewhile(lambda x: x.strip().startswith("#"), lines[i + 1:]))   # the label's comment lines
    if (lab := re.match(r"(\.LBB\d+_\d+):", ln)) and any("Inner Loop Header" in x for x in head):
      end = next(j for j in range(i + 1, len(lines)) if re.match(rf"\s+j\w+\s+{re.escape(lab.group(1))}$", lines[j]))
      loops.append("\n".join(lines[i:end + 1]))
  assert loops, "no inner loop found"
  return max(loops, key=lambda b: b.count("vfmadd"))


@pytest.mark.parametrize("m", [1024, 1536])
def test_avx2_tile_keeps_its_accumulators_in_registers(m: int):
  """The AVX2 tile's reduce loop compiled for x86-64-v3 (16 ymm registers): 12 FMAs, no spill or reload."""
  ast = _matmul_ast(m, 256, 256)
  opts = [o for o in heuristic_opts(ast, AVX2) if o.kind != "PACK"]
  src = get_program(ast, with_caps(Device["CPU"].renderer, vector_lanes=8, vector_regs=16), opts).src
  body = _inner_loop_asm(src)
  assert body.count("vfmadd") == 12 and "Spill" not in body and "Reload" not in body, body


def test_avx2_conv_weight_grad_tile_keeps_its_accumulators_in_registers():
  """The weight gradient's tile on 16 registers (2 channel vectors x 6 rows of taps and input channels): channel vectors
  upcast after the rows, so no spill (rows last kept 6 broadcasts live: 46 against 102 GFLOPS on one core)."""
  x = Tensor(rand(2, 16, 30, 30), requires_grad=True)
  w = Tensor(rand(32, 16, 3, 3), requires_grad=True)
  (x.conv2d(w, padding=1) * Tensor(rand(2, 32, 30, 30))).sum().backward()
  ast = [si.ast for si in w.grad.schedule(optimize=False) if any(n.op is Ops.REDUCE for n in si.ast.toposort())][-1]
  opts = conv_opts(ast, 8, 16)
  ups = [o for o in (opts or []) if o.kind == "UPCAST"]
  assert ups and ups[-1].rid == opts[0].rid and all(o.rid != opts[0].rid for o in ups[:-1]), opts   # the channel vectors last
  acc = math.prod(o.amount for o in opts if o.kind == "UPCAST")
  src = get_program(ast, with_caps(Device["CPU"].renderer, vector_lanes=8, vector_regs=16), [o for o in opts if o.kind != "PACK"]).src
  body = _inner_loop_asm(src)
  assert acc == 12 and body.count("vfmadd") == acc and "Spill" not in body and "Reload" not in body, body


def _weight_grad(n: int = 2, c: int = 16, size: int = 30) -> tuple[Tensor, np.ndarray]:
  """The 3x3 weight gradient of a conv (padding 1) of n x c x size x size inputs, and its float64 value."""
  x, dy = rand(n, c, size, size), rand(n, 2 * c, size, size)
  xt, w = Tensor(x, requires_grad=True), Tensor(rand(2 * c, c, 3, 3), requires_grad=True)
  (xt.conv2d(w, padding=1) * Tensor(dy)).sum().backward()
  win = np.lib.stride_tricks.sliding_window_view(np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1))), (size, size), axis=(2, 3))
  return w.grad, np.einsum("nohw,nikjhw->oikj", dy.astype(np.float64), win)


def _sliding_loops(src: str) -> list[str]:
  """The loops of C source `src` rendered with clang's no-unroll pragma."""
  return re.findall(r"#pragma clang loop unroll\(disable\)\n\s*for \(int (\w+)", src)


def test_sliding_window_loop_of_a_weight_gradient_stays_rolled(cpu_host: str):
  """A weight gradient's tile reads the window x[ow + kw] for the taps kw = 0, 1, 2 (the tile's rows): what one row
  reads at ow, the next reads at ow - 1. clang 19 tuned for Zen 3 unrolled that ow loop by 2 and kept the shared
  values in registers across the two trips: 24 FMAs with 3 spills and 17 register moves, 3.5 ms a core against 2.3
  rolled (128 channels at 28x28). The renderer keeps such a loop rolled (`ClangRenderer.sliding_loops`); loops without
  a sliding load (the matmul's, the forward conv's), or short ones clang unrolls whole (the 3 taps), are left to the
  compiler. Per capability record; values against float64."""
  dev = Device["CPU"]
  g, want = _weight_grad()
  sis = [si for si in g.schedule() if any(n.op is Ops.REDUCE for n in si.ast.toposort())]
  src = get_program(sis[-1].ast, dev.renderer, list(sis[-1].opts)).src
  assert _sliding_loops(src) == ["ridx6"], src   # the ow loop, innermost
  np.testing.assert_allclose(g.numpy(), want, rtol=1e-4, atol=1e-4)
  fwd = Tensor(rand(2, 16, 30, 30)).conv2d(Tensor(rand(32, 16, 3, 3)), padding=1)
  for t in (fwd, Tensor(rand(64, 256)) @ Tensor(rand(256, 64))):
    for si in t.schedule():
      if si.ast.op is Ops.SINK: assert not _sliding_loops(get_program(si.ast, dev.renderer, list(si.opts or [])).src)


def test_zen3_weight_gradient_loop_has_no_spills():
  """The weight gradient's inner loop as the CPU device's compiler builds it for Zen 3 (-march=znver3, where clang 19
  unrolled and spilled it: see above): 12 FMAs, nothing spilled or reloaded."""
  from plugrad_cpu import find_cc
  cc = find_cc()
  if cc is None or not re.search(r"clang-?1[5-9]|clang-?[2-9]\d", cc): pytest.skip(f"compiler {cc}: the check is for clang >= 15")
  g, _ = _weight_grad()
  # the AVX2 record's opts (the schedule's own follow the host: an AVX-512 host's 3x3x2 tile of 16 lanes rendered in
  # 8-lane vectors is 36 FMAs, which failed this check on Zen 4 before the opts were chosen here)
  ast = [si for si in g.schedule(optimize=False) if any(n.op is Ops.REDUCE for n in si.ast.toposort())][-1].ast
  plan = split_packs(ast, heuristic_opts(ast, AVX2))
  src = get_program(plan.ast, with_caps(Device["CPU"].renderer, vector_lanes=8, vector_regs=16), plan.opts).src
  body = _inner_loop_asm(src, cc, "znver3")
  assert body.count("vfmadd") == 12 and "Spill" not in body and "Reload" not in body, body


def test_packed_row_operand_panels_hold_the_tile_rows():
  """A row operand that gets packed (A read across rows: A.T @ B; an expression: 16-bit inputs cast to float32) is
  packed in panels of the tile's rows: 6 on 16 registers, 8 on 32, the last panel padded where they don't divide
  (1024 rows). Before: 4-row tiles on AVX2 (f16 inputs 179 against 208 GFLOPS on 2 threads, A.T 191-199 against
  194-214)."""
  at = (Tensor(rand(1024, 256)).T @ Tensor(rand(1024, 256))).schedule(optimize=False)[-1].ast
  f16 = Tensor(rand(1024, 256)).cast("float16").matmul(Tensor(rand(256, 256)).cast("float16"), dtype="float32").schedule(optimize=False)[-1].ast
  for ast in (at, f16):
    r = rows_of(ast)
    for caps, rows in ((AVX2, 6), (AVX512, 8)):
      opts = heuristic_opts(ast, caps)
      assert Opt("PACK", r, rows) in opts and any(o.kind.startswith("UPCAST") and o.rid == r and o.amount == rows for o in opts), opts


def _scores(h: int, t: int, s: int, d: int) -> tuple[Tensor, np.ndarray]:
  """Attention's scores of h query heads sharing one key head, (h, t, d) @ (s, d).T, and their float64 values."""
  q, k = rand(1, h, t, d), rand(1, 1, s, d)
  return Tensor(q) @ Tensor(k).transpose(2, 3), q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)


def test_scores_get_a_two_operand_tile_on_both_register_files():
  """x @ y.T whose operands are both read along the reduce lanes and each reused by many outputs (a query row by every
  key, a key by every query): a tile of query rows x keys (4 x 4 on 32 registers, 4 x 2 on 16) and no SPLIT, instead
  of SPLIT 2 x 4 keys (one query vector against 4 key vectors a step: a load an FMA; gemma3's prefill scores 3.80 ->
  2.06 ms with AVX-512 code, 4.08 -> 2.38 with AVX2's). Values against float64 with each record's tile."""
  y, want = _scores(4, 48, 40, 64)
  (it,) = y.schedule(optimize=False)
  for caps, tile in ((AVX512, (4, 4)), (AVX2, (4, 2))):
    opts = heuristic_opts(it.ast, caps)
    assert not any(o.kind == "SPLIT" for o in opts), opts
    ups = sorted(((o.amount, _range_size(it.ast, o.rid)) for o in opts if o.kind == "UPCAST"), reverse=True)
    assert [a for a, _ in ups] == list(tile) and sorted(n for _, n in ups) == [40, 48], ups
    np.testing.assert_allclose(run_opts(y, opts), want, rtol=1e-5, atol=1e-5)   # (compiled for this host)


def test_batched_matvec_keeps_the_matvec_rules():
  """A batched decode step's x @ W.T (4 rows against float32 weights) reuses each weight only 4 times: its rows are
  upcast whole and the weight rows are not (each would add a weight stream), as before the two-operand tile."""
  x, w = rand(4, 256), rand(64, 256)
  (it,) = (Tensor(x) @ Tensor(w).T).schedule(optimize=False)
  for caps in (AVX512, AVX2):
    ups = [(o.amount, _range_size(it.ast, o.rid)) for o in heuristic_opts(it.ast, caps) if o.kind == "UPCAST"]
    assert ups == [(4, 4)], ups


def _range_size(ast: UOp, rid: int) -> int:
  return next(int(n.src[0].arg) for n in ast.toposort() if n.op is Ops.RANGE and n.arg[0] == rid)
