"""Explicit SIMD (Opt VECTOR, codegen/vectorize.py) and symbolic range splits: values against numpy on the CPU device
(vector types in C) and the PYTHON device (a lane range is a plain loop there), that the optimizations were chosen,
and that vector lanes give the scalar kernel's results where no reduction is reordered."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from codegen_helpers import with_caps

from plugrad import Variable
from plugrad.codegen import get_program
from plugrad.codegen.facts import Dots, div_end, ranges_of
from plugrad.codegen.heuristic import choose_opts
from plugrad.codegen.optops import Opt, apply_opt, is_vector_range
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.engine.realize import buffer_for, lower_item
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray: return RNG.uniform(-1, 1, shape).astype(np.float32)


def renderer(**attrs):
  """The CPU renderer with 16-lane vectors; streaming reductions vectorized by us too, not left to clang's loop vectorizer."""
  return with_caps(Device["CPU"].renderer, **{"vector_lanes": 16, "vector_regs": 32, "vectorizes_reductions": False, **attrs})


def run(t: Tensor, opts: list[Opt] | None = None, dev: str = "CPU", **attrs) -> tuple[np.ndarray, str]:
  """Realize the last kernel of `t` (earlier ones normally) on `dev` with `opts` applied by hand (None: the renderer's
  own choice, CPU only). Returns the output and the kernel source."""
  *pre, it = t.schedule(optimize=False)
  for p in pre: lower_item(p).run()
  ast = it.ast
  d = Device[dev]
  if opts is not None:
    for o in opts: ast = apply_opt(ast, o)
  ren = renderer(**{"upcast_max": 64 if opts is None else 0, **attrs}) if dev == "CPU" else d.renderer
  spec = get_program(ast, ren)
  bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
  d.load(spec.name, d.compiler.compile_cached(spec.src))(*bufs, vals=tuple(it.var_vals.values()))
  out = buffer_for(it.bufs[0])
  got = np.frombuffer(bytes(out.copyout()), dtype=out.dtype.np)
  return (got.reshape(t.shape) if all(isinstance(s, int) for s in t.shape) else got), spec.src


def chosen(t: Tensor, lanes: int = 16, regs: int = 32) -> list[Opt]:
  return choose_opts(t.schedule(optimize=False)[-1].ast, 64, True, lanes, regs)


def mm(a: np.ndarray, b: np.ndarray) -> Tensor: return Tensor(a).realize() @ Tensor(b).realize()


@pytest.mark.parametrize("m,k,n", [(64, 48, 64), (24, 40, 96), (37, 29, 32), (8, 100, 16), (1, 64, 64)])
def test_matmul_vector_columns(m: int, k: int, n: int):
  a, b = rand(m, k), rand(k, n)
  opts = chosen(mm(a, b))
  vr = ranges_of(mm(a, b).schedule(optimize=False)[-1].ast)[opts[0].rid]
  assert opts[0].kind == "VECTOR" and opts[0].amount == 16 and vr.arg[1] == "global" and vr.src[0].arg == n  # lanes along n
  got, src = run(mm(a, b))
  assert "pg_float16" in src and "pg_fma_pg_float16(" in src
  np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_tile_and_outer_loop_order():
  a, b = rand(64, 32), rand(32, 512)
  opts = chosen(mm(a, b))
  # column panels outermost, repacked (codegen/pack.py: 8 row blocks reuse each panel)
  assert [o.kind for o in opts] == ["PACK", "VECTOR", "UPCAST", "UPCAST", "OUTER"] and opts[-1].rid == 1 and opts[0] == Opt("PACK", 1, 32)
  opts = chosen(mm(rand(16, 32), b))  # two row blocks: not worth a copy
  assert [o.kind for o in opts] == ["VECTOR", "UPCAST", "UPCAST", "OUTER"]
  got, _ = run(mm(a, b))
  np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
  ast = apply_opt(mm(a, b).schedule(optimize=False)[-1].ast, Opt("OUTER", 1, 0))
  assert sorted((r.arg[0], r.src[0].arg) for r in ranges_of(ast).values() if r.arg[1] == "global") == [(0, 512), (1, 64)]


def q4_weight(n: int = 64, k: int = 256) -> tuple[Tensor, np.ndarray]:
  """A Q4-style dequantized (n, k) weight (nibbles times a block scale plus a block min) and numpy's values of it."""
  qs = RNG.integers(0, 256, (n * k // 32, 16), dtype=np.uint8)
  sc, mn = rand(n * k // 32, 1), rand(n * k // 32, 1)
  q, sh = Tensor(qs).reshape(-1, 1, 16)._broadcasted(Tensor(np.array([0, 4], np.uint8)).reshape(1, 2, 1))
  w = (Tensor(sc) * (q._alu(Ops.SHR, sh) & 15).reshape(-1, 32).cast(dtypes.float32) + Tensor(mn)).reshape(n, k)
  return w, (sc * np.concatenate([qs & 15, qs >> 4], 1) + mn).reshape(n, k)


def test_matvec_vector_reduce_with_bit_unpacking():
  """A Q4-style dequantizing matvec: lanes along the contiguous reduce axis, two copies per 32-element block, and no
  UPCAST of the weight rows: their copies would share only x (in L1) while each adds a weight stream from memory
  (qwen2's Q8_0 output layer: 6.5-7.8 ms with 4 rows a step, 3.9-4.1 ms with one)."""
  w, wn = q4_weight()
  k = wn.shape[1]
  x = rand(1, k)
  t = Tensor(x) @ w.T
  ref = x @ wn.T
  assert [o.kind for o in chosen(t)] == ["VECTOR", "SPLIT"] and chosen(t)[0].rid == 1
  got, src = run(t)
  assert "__builtin_convertvector" in src and "pg_int16" in src  # nibbles unpacked in int32 lanes
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_few_rows_of_a_dequantizing_matvec_are_upcast_whole():
  """4 rows over a Q4-style weight (a batched decode step): all 4 rows are one register tile, so each weight is
  dequantized once for all of them (regression: 2 row blocks of 2 dequantized every weight twice; the batched LLM
  step's gate+up kernel took 7.9 ms against 2.8 ms for one row)."""
  w, wn = q4_weight()
  k = wn.shape[1]
  x = rand(4, k)
  t = Tensor(x) @ w.T
  rows = next(r for r in ranges_of(t.schedule(optimize=False)[-1].ast).values() if r.arg[1] == "global" and r.src[0].arg == 4)
  assert Opt("UPCAST", rows.arg[0], 4) in chosen(t)
  got, _ = run(t)
  np.testing.assert_allclose(got, x @ wn.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group", [3, 7])
def test_decode_attention_reads_each_key_once_and_splits_positions_across_cores(group: int):
  """q.k of one decode step with grouped-query attention (3 KV heads, `group` query heads each, keys of a symbolic
  number of positions): the query heads of a KV head are one register tile (each key read once, not `group` times)
  and the positions loop is outermost, the one split across cores (3 KV heads on 2 cores split 2 + 1). Regression:
  SmolLM2's q.k kernel took 24.7 us alone, 9.7 us after."""
  q, kc = rand(3, group, 64), rand(3, 64, 1040)
  v = Variable("S", 1, 130)
  def prog(n: int) -> Tensor: return Tensor(q).realize() @ Tensor(kc).realize()[:, :, :v.bind(n) * 8]
  ast = prog(57).schedule(optimize=False)[-1].ast
  kv_heads, heads, pos = sorted((r for r in ranges_of(ast).values() if r.arg[1] == "global"), key=lambda r: r.arg[0])
  assert heads.src[0].arg == group and pos.src[0].op is not Ops.CONST
  opts = chosen(prog(57))
  assert Opt("UPCAST", heads.arg[0], group) in opts and Opt("OUTER", pos.arg[0], 0) in opts, opts
  for n in (1, 57, 130):
    got, _ = run(prog(n))
    got = got.reshape(-1)[:3 * group * n * 8].reshape(3, group, n * 8)   # (the output is laid out for this call's size)
    np.testing.assert_allclose(got, q @ kc[:, :, :n * 8], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,axis", [((48, 64), 1), ((48, 64), 0), ((5, 128), 1), ((16, 3, 32), (0, 2))])
def test_vector_reductions(shape: tuple[int, ...], axis):
  x = rand(*shape)
  x.flat[7] = np.nan if shape[0] == 5 else x.flat[7]
  for op, ref in ((lambda t: t.sum(axis), x.sum(axis)), (lambda t: t.max(axis), x.max(axis)), (lambda t: t.exp().sum(axis), np.exp(x).sum(axis))):
    got, src = run(op(Tensor(x).realize()))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
  xi = RNG.integers(-50, 50, shape).astype(np.int32)
  for op, ref in ((lambda t: t.sum(axis), xi.sum(axis)), (lambda t: t.max(axis), xi.max(axis))):
    np.testing.assert_array_equal(run(op(Tensor(xi).realize()))[0], ref)


def test_streaming_reduce_left_to_loop_vectorizer():
  x = rand(16, 256)
  t = Tensor(x).realize().exp().sum(1)
  ast = t.schedule(optimize=False)[-1].ast
  assert choose_opts(ast, 64, False, 16, 32) == [] and choose_opts(ast, 64, True, 16, 32)[0].kind == "VECTOR"
  got, src = run(t, vectorizes_reductions=True)
  assert "#pragma clang loop vectorize" in src and "pg_float16" not in src
  np.testing.assert_allclose(got, np.exp(x).sum(1), rtol=1e-5, atol=1e-5)


def test_vector_lanes_equal_scalar_lanes():
  """Elementwise ops on vectors (exp2, max with NaN, casts, shifts) give the scalar kernel's results bit for bit."""
  x = np.concatenate([np.linspace(-160, 140, 4096 - 16, dtype=np.float32),
                      np.array([np.nan, np.inf, -np.inf, 0, -0.0, 1e-40, -1e-40, 128, -126, -149.5, 3.3, -2.7, 0.5, -0.5, 7, 1e30], np.float32)])
  u = RNG.integers(0, 256, 4096, dtype=np.uint8)
  def prog() -> Tensor:
    tx, tu = Tensor(x).realize(), Tensor(u).realize()
    return tx.exp2() + tx.maximum(1.0) * ((tu >> 3) & 7).cast(dtypes.float32) - tx.cast(dtypes.int32).cast(dtypes.float32)
  want, _ = run(prog(), [], upcast_max=0)
  got, src = run(prog(), [Opt("VECTOR", 0, 16)])
  assert "pg_exp2f_pg_float16(" in src and "pg_max_pg_float16(" in src
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  py, _ = run(prog(), [Opt("VECTOR", 0, 16)], dev="PYTHON")  # the same AST on the interpreter: a lane range is a loop
  np.testing.assert_array_equal(py.view(np.uint32)[:64], want.view(np.uint32)[:64])


def test_gated_loads_keep_lane_by_lane():
  x = rand(6, 40)
  t = Tensor(x)._pad(((1, 1), (0, 8)))  # (8, 48), padded loads are gated along the vector axis
  w = rand(48, 32)
  got, _ = run(t.realize() @ Tensor(w).realize())
  np.testing.assert_allclose(got, np.pad(x, ((1, 1), (0, 8))) @ w, rtol=1e-5, atol=1e-5)
  got, _ = run((t * 2).sum(1))
  np.testing.assert_allclose(got, np.pad(x, ((1, 1), (0, 8))).sum(1) * 2, rtol=1e-5, atol=1e-5)


def test_two_reduces_two_lanes():
  """Separate reduces (e.g. a projection and its rotated partner) each get their own vector lanes."""
  x, w1, w2 = rand(1, 64), rand(32, 64), rand(32, 64)
  t = (Tensor(x) @ Tensor(w1).realize().T) * 2 + (Tensor(x) @ Tensor(w2).realize().T)
  opts = chosen(t)
  if sum(o.kind == "VECTOR" for o in opts) == 2:
    got, src = run(t)
    np.testing.assert_allclose(got, (x @ w1.T) * 2 + x @ w2.T, rtol=1e-5, atol=1e-5)
  ast = t.schedule(optimize=False)[-1].ast
  reds = sorted({n.src[-1] for n in ast.toposort() if n.op is Ops.REDUCE}, key=lambda r: r.arg[0])
  if len(reds) == 2:  # both lanes in one kernel: allowed because no reduce uses both ranges
    a = apply_opt(apply_opt(ast, Opt("VECTOR", reds[0].arg[0], 8)), Opt("VECTOR", reds[1].arg[0], 8))
    assert sum(is_vector_range(r) for r in ranges_of(a).values()) == 2


def test_vector_opt_errors():
  ast = mm(rand(8, 32), rand(32, 32)).schedule(optimize=False)[-1].ast
  with pytest.raises(ValueError, match="power of two"): apply_opt(ast, Opt("VECTOR", 1, 6))
  with pytest.raises(ValueError, match="can't split range"): apply_opt(ast, Opt("VECTOR", 0, 16))
  a = apply_opt(ast, Opt("VECTOR", 1, 8))
  with pytest.raises(ValueError, match="vector lane range"): apply_opt(a, Opt("VECTOR", 2, 8))
  with pytest.raises(ValueError, match="vector lane range"): apply_opt(a, Opt("UPCAST", 3, 2))
  with pytest.raises(ValueError, match="OUTER needs a global range"): apply_opt(ast, Opt("OUTER", 2, 0))


def test_div_end():
  v = UOp.variable("v", 1, 64)
  eight_v = v * 8
  assert div_end(eight_v, 8) is v and div_end(eight_v, 4).render() == "v*2" and div_end(eight_v, 16) is None
  assert div_end(eight_v + 16, 8).render().strip("()") == "v+2" and div_end(eight_v + 4, 8) is None and div_end(v, 2) is None
  assert div_end(UOp.const(dtypes.index, 48), 16).arg == 3 and div_end(UOp.const(dtypes.index, 48), 32) is None
  assert div_end((v * 3) * (v * 8), 4) is not None and div_end((v * 3) * (v * 5), 4) is None


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
def test_symbolic_multiple_of_eight(dev: str):
  """A (8*v, K) operand: the symbolic row range is split (by 8 for UPCAST, lanes along the constant axis) and the
  values match numpy for every bound value with one compiled kernel."""
  x, w = rand(64, 24), rand(24, 32)
  v = Variable("v", 1, 8)
  def prog(n: int) -> Tensor: return Tensor(x)[:v.bind(n) * 8] @ Tensor(w)
  opts = chosen(prog(2))
  assert Opt("UPCAST", 0, 8) in opts and opts[0].kind == "VECTOR"
  sym = [o for o in opts if o.kind != "OUTER"]
  for n in (1, 3, 8):
    got, _ = run(prog(n), None if dev == "CPU" else sym, dev=dev)
    np.testing.assert_allclose(got.reshape(-1)[:n * 8 * 32].reshape(n * 8, 32), x[:n * 8] @ w, rtol=1e-5, atol=1e-5)
  ast = prog(2).schedule(optimize=False)[-1].ast
  assert apply_opt(ast, Opt("UPCAST", 0, 4)) is not None and apply_opt(ast, Opt("UPCAST", 0, 2)) is not None
  with pytest.raises(ValueError, match="can't split range"): apply_opt(ast, Opt("UPCAST", 0, 16))


def test_symbolic_reduce_split():
  """A reduce over 8*v elements (attention over a padded length) split into vector lanes and accumulators."""
  x = rand(4, 128)
  v = Variable("v", 1, 16)
  def prog(n: int) -> Tensor: return Tensor(x)[:, :v.bind(n) * 8].sum(1)
  ast = prog(2).schedule(optimize=False)[-1].ast
  assert [r.src[0].render() for r in ranges_of(apply_opt(ast, Opt("VECTOR", 1, 8))).values() if r.arg[1] == "reduce"] == ["v", "8"]
  for n in (1, 5, 16):
    for opts, dev in (([Opt("VECTOR", 1, 8)], "CPU"), ([Opt("VECTOR", 1, 4), Opt("SPLIT", 1, 2)], "CPU"), ([Opt("VECTOR", 1, 8)], "PYTHON")):
      got, _ = run(prog(n), opts, dev=dev)
      np.testing.assert_allclose(got[:4], x[:, :n * 8].sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_gcc_compiles_vector_kernels():
  from plugrad_cpu.device import ClangCompiler, CPUProgram
  a, b, x = rand(16, 32), rand(32, 64), rand(8, 256)
  gcc, dev = ClangCompiler("gcc"), Device["CPU"]
  for t, want in ((mm(a, b), a @ b), (Tensor(x).realize().exp().sum(1), np.exp(x).sum(1)), (Tensor(x).realize().max(1), x.max(1))):
    (it,) = t.schedule(optimize=False)
    spec = get_program(it.ast, renderer())
    assert "pg_float16" in spec.src
    prg = CPUProgram(dev, spec.name, gcc.compile(spec.src))
    bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
    prg(*bufs)
    np.testing.assert_allclose(bufs[0].view(np.float32).reshape(np.shape(want)), want, rtol=1e-5, atol=1e-5)


def test_q4k_gemv_block_scales_broadcast():
  """Q4_K blocks dequantized inside a matvec (6-bit scales through gated loads of a cat): every lane of a 16-wide vector
  reads the same scale bytes, which must be proven (so they load once per block, not lane by lane)."""
  from plugrad.nn.serialize import dequantize
  n, k = 8, 512
  blocks = RNG.integers(0, 256, (n * k // 256, 144), dtype=np.uint8)
  blocks[:, :4] = np.frombuffer(np.array([0.01, 0.002] * (n * k // 256), np.float16).tobytes(), np.uint8).reshape(-1, 4)
  tb, x = Tensor(blocks).realize(), rand(1, k)
  w = dequantize(tb, "Q4_K").reshape(n, k).numpy()
  t = Tensor(x) @ dequantize(tb, "Q4_K").reshape(n, k).T
  assert [o.kind for o in chosen(t)][:2] == ["VECTOR", "SPLIT"]
  got, src = run(t)
  assert "pg_unsigned_char16" in src and src.count("(pg_unsigned_char16){") == 0  # no lane-by-lane byte gathers
  np.testing.assert_allclose(got, x @ w.T, rtol=1e-4, atol=1e-4)


def test_low_terms_fold_out_of_block_indices():
  from plugrad.codegen.opt import pm_opt_symbolic
  from plugrad.uop.rewrite import graph_rewrite
  r = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 64),), (0, "reduce"))
  lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 16),), (1, "reduce", "vector"))
  def simp(x: UOp) -> UOp: return graph_rewrite(x, pm_opt_symbolic)
  assert simp((r * 32 + 17) // 256).render() == "r0_reduce//8" and simp((r * 16 + lane) // 32).render() == "r0_reduce//2"
  assert simp((r * 32 + 17) % 256).render().replace("(", "").replace(")", "") == "r0_reduce%8*32+17"
  assert simp((r * 16 + 17) // 32).render() != "r0_reduce//2"  # 17 >= 16: the low part carries into the block
  for rv in range(64):
    for lv in (0, 5, 15):
      for e in ((r * 16 + lane) // 32, (r * 16 + lane) % 32, (r * 32 + 17) // 256, (r * 16 + 17) // 32):
        want = e.substitute({r: UOp.const(dtypes.index, rv), lane: UOp.const(dtypes.index, lv)})
        got = simp(e).substitute({r: UOp.const(dtypes.index, rv), lane: UOp.const(dtypes.index, lv)})
        assert graph_rewrite(want, pm_opt_symbolic).arg == graph_rewrite(got, pm_opt_symbolic).arg


def test_prefetch_only_streamed_weight_loads():
  x, w = rand(1, 256), rand(64, 256)
  _, src = run(Tensor(x) @ Tensor(w).realize().T)  # matvec: each row's weights are read once
  assert "__builtin_prefetch" in src
  _, src = run(mm(rand(64, 64), rand(64, 64)))  # matmul: the column panel is reused, no prefetch
  assert "__builtin_prefetch" not in src


def test_data_dependent_indices():
  """Indices loaded from memory (an embedding gather feeding a reduce) can't be judged statically: lane by lane."""
  emb, idx = rand(50, 64), RNG.integers(0, 50, 16).astype(np.int32)
  t = Tensor(emb).realize()[Tensor(idx).realize()]
  got, _ = run((t * 3).sum(1))
  np.testing.assert_allclose(got, (emb[idx] * 3).sum(1), rtol=1e-5, atol=1e-5)
  got, _ = run(t.T.realize() @ Tensor(emb).realize()[:16])
  np.testing.assert_allclose(got, emb[idx].T @ emb[:16], rtol=1e-5, atol=1e-5)


def test_no_whole_axis_tile_when_short_reduce_loops_are_unrolled():
  """A reuse axis of 3 next to a reduce loop of 4 (which gets unrolled): the 3 is not made one whole register tile.
  Regression: a conv weight gradient's two 3-wide window axes upcast whole times its unrolled 4x4 window made 288
  copies of a fused expression (54k uops, 20+ minutes in clang; the data-parallel digits training test hung)."""
  a, b = rand(3, 4, 32), rand(4, 32, 64)
  t = (Tensor(a).realize().reshape(3, 4, 32, 1) * Tensor(b).realize().reshape(1, 4, 32, 64)).sum((1, 2))
  ast = t.schedule(optimize=False)[-1].ast
  rows = next(r for r in ranges_of(ast).values() if r.arg[1] == "global" and r.src[0].arg == 3)
  opts = chosen(t)
  assert any(o.kind == "UNROLL" for o in opts) and Opt("UPCAST", rows.arg[0], 3) not in opts, opts
  got, _ = run(t)
  np.testing.assert_allclose(got, np.einsum("akj,kjn->an", a, b), rtol=1e-4, atol=1e-4)


def test_blockwise_matvec_lanes_along_the_outer_reduce_and_its_weights_prefetched():
  """A blockwise-quantized matvec's shape (the LLM's decode product, apps/llm/quant.py): out[n] = sum over (block,
  lane) of s[n, block] * sum over 4 chunks of x * w. The short chunk reduce is unrolled and the lanes run along the
  enclosing reduce's lane axis (all 8 of it: its outer loop has one trip); the weights, read once per output row,
  are still prefetched (that one-trip loop hid the loop that streams them). Values vs float64."""
  N, B, C, L = 64, 16, 4, 8
  x, w, s = rand(1, 1, B, C, L), rand(1, N, B, C, L), rand(1, N, B, 1)
  t = (Tensor(s) * (Tensor(x) * Tensor(w).realize()).sum(3)).sum((2, 3))
  opts = chosen(t, lanes=8, regs=16)
  assert ("VECTOR", 8) in [(o.kind, o.amount) for o in opts] and ("UNROLL", 4) in [(o.kind, o.amount) for o in opts], opts
  got, src = run(t, vector_lanes=8, vector_regs=16)
  assert "__builtin_prefetch" in src
  want = (s.astype(np.float64) * (x.astype(np.float64) * w).sum(3)).sum((2, 3))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def pair_dot(codes: np.ndarray, x16: np.ndarray, P: int, shift: bool = False) -> Tensor:
  """sum over (blocks, P lanes) of float(sum over a pair of int32 code * x): codes (N, K) uint8 unpacked to nibbles
  (shift: the high nibble of the odd 16-byte groups, a shift that varies with the block), x16 (K,) int16."""
  N, K = codes.shape
  c = Tensor(codes).realize().cast(dtypes.int32)
  if shift: c = c.reshape(N, K // 16, 16)._alu(Ops.SHR, (Tensor.arange(K // 16, dtype=dtypes.int32) % 2 * 4).reshape(1, K // 16, 1)).reshape(N, K)
  q = (c & 15).reshape(N, K // (2 * P), P, 2)
  t = (q * Tensor(x16).realize().cast(dtypes.int32).reshape(1, K // (2 * P), P, 2)).sum(3)
  return t.cast(dtypes.float32).sum((1, 2))


@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("shift", [False, True])
def test_pair_dot_is_one_dot2_per_2k_products(lanes: int, shift: bool):
  """An int32 sum over a pair axis of 2 of products of int16-sized factors (the LLM's integer decode product,
  apps/llm/quant.py: dot2_linear), lanes along the enclosing reduce: the pair stays a range, both factors are read as
  2k int16 lanes (one contiguous load each, the unpacking done in 16-bit lanes) and multiplied by WMMA "DOT2"
  (pg_dot2, pmaddwd on x86). Exact against int64 numpy, with int16's extremes in x."""
  N, K = 32, 256
  codes = RNG.integers(0, 256, (N, K), dtype=np.uint8)
  x16 = RNG.integers(-32768, 32768, K, dtype=np.int64).astype(np.int16)
  x16[:4] = [-32768, -32768, 32767, 32767]
  c = codes.astype(np.int64)
  if shift: c = c >> (np.arange(K) // 16 % 2 * 4)
  want = ((c & 15) @ x16.astype(np.int64)).astype(np.float64)
  t = pair_dot(codes, x16, lanes, shift)
  opts = choose_opts(t.schedule(optimize=False)[-1].ast, 64, True, lanes, 16, Dots(pair=True))
  assert ("VECTOR", lanes) in [(o.kind, o.amount) for o in opts] and not any(o.kind == "UNROLL" and o.amount == 2 for o in opts), opts
  got, src = run(pair_dot(codes, x16, lanes, shift), vector_lanes=lanes, vector_regs=16)
  assert f"pg_dot2_pg_int{lanes}(" in src and f"pg_short{2 * lanes}" in src and "pg_int8 acc" not in src
  np.testing.assert_allclose(got, want, rtol=1e-6)   # int32 sums, one float sum of 128 ints per output
  got, src = run(pair_dot(codes, x16, lanes, shift), vector_lanes=lanes, vector_regs=16, dot2=False)
  assert "pg_dot2" not in src
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_pair_dot_only_for_int16_factors():
  """A factor beyond int16 (an int32 times 3 of int16 range) keeps the int32 products lane by lane: no DOT2, exact.
  (Every partial sum stays below 2^24, so the float32 sum is exact in any order: with b up to 100 it wasn't, and the
  module's shared generator made the test fail or pass by which tests ran before it in the worker.)"""
  N, K = 16, 64
  rng = np.random.default_rng(7)
  a = rng.integers(-20000, 20000, (N, K)).astype(np.int32)
  b = rng.integers(-4, 5, K).astype(np.int32)
  t = ((Tensor(a).realize() * 3).reshape(N, K // 16, 8, 2) * Tensor(b).realize().reshape(1, K // 16, 8, 2)).sum(3).cast(dtypes.float32).sum((1, 2))
  got, src = run(t, vector_lanes=8, vector_regs=16)
  assert "pg_dot2" not in src
  np.testing.assert_array_equal(got, (a.astype(np.int64) * 3) @ b.astype(np.int64))


def quad_dot(codes: np.ndarray, x8: np.ndarray, P: int, form: str) -> Tensor:
  """sum over (blocks, P lanes) of float(sum over a group of 4 of int32 code * x): codes (N, K) uint8 as nibbles
  ("nibble": the high nibble of the odd 32-byte groups, a shift that varies with the block), as signed bytes moved
  up by 128 ("signed": Q8_0's codes, an int8 plus 128 computed modulo 256 in the byte lanes) or whole ("byte");
  x8 (K,) int8."""
  N, K = codes.shape
  c = Tensor(codes).realize()
  if form == "signed": c = c.bitcast(dtypes.int8).cast(dtypes.int32) + 128
  else: c = c.cast(dtypes.int32)
  if form == "nibble":
    sh = (Tensor.arange(K // 32, dtype=dtypes.int32) % 2 * 4).reshape(1, K // 32, 1)
    c = (c.reshape(N, K // 32, 32)._alu(Ops.SHR, sh) & 15).reshape(N, K)
  t = (c.reshape(N, K // (4 * P), P, 4) * Tensor(x8).realize().cast(dtypes.int32).reshape(1, K // (4 * P), P, 4)).sum(3)
  return t.cast(dtypes.float32).sum((1, 2))


@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("form", ["nibble", "signed", "byte"])
def test_quad_dot_is_one_dot4_per_4k_products(lanes: int, form: str):
  """An int32 sum over a group axis of 4 of products of an unsigned byte-sized code and an int8 (the LLM's byte decode
  product, apps/llm/quant.py: dot4_linear), lanes along the enclosing reduce, on a renderer with DOT4 (`dot4` 255):
  the group stays a range, both factors are read as 4k byte lanes (one contiguous load each, the unpacking done in
  byte lanes) and multiplied by WMMA "DOT4" (pg_dot4, vpdpbusd on VNNI). Exact against int64 numpy, with the bytes'
  extremes; without DOT4 (or with codes beyond its bound) the same values the long way."""
  N, K = 32, 512
  codes = RNG.integers(0, 256, (N, K), dtype=np.uint8)
  x8 = RNG.integers(-128, 128, K).astype(np.int8)
  codes[:, :4], x8[:4] = 255, [-128, -128, 127, 127]
  c = codes.astype(np.int64)
  if form == "signed": c = codes.view(np.int8).astype(np.int64) + 128
  if form == "nibble": c = (c >> (np.arange(K) // 32 % 2 * 4)) & 15
  want = (c @ x8.astype(np.int64)).astype(np.float64)
  t = quad_dot(codes, x8, lanes, form)
  opts = choose_opts(t.schedule(optimize=False)[-1].ast, 64, True, lanes, 16, Dots(quad=255))
  assert ("VECTOR", lanes) in [(o.kind, o.amount) for o in opts] and not any(o.kind == "UNROLL" and o.amount == 4 for o in opts), opts
  got, src = run(quad_dot(codes, x8, lanes, form), vector_lanes=lanes, vector_regs=16, dot4=255)
  assert f"pg_dot4_pg_int{lanes}(" in src and f"pg_unsigned_char{4 * lanes}" in src and f"pg_signed_char{4 * lanes}" in src
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for attrs in (dict(dot4=0), dict(dot4=127)):   # no DOT4; a bound the codes exceed (the nibbles fit it)
    got, src = run(quad_dot(codes, x8, lanes, form), vector_lanes=lanes, vector_regs=16, **attrs)
    assert ("pg_dot4" in src) == (form == "nibble" and attrs["dot4"] == 127)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("rows", [1, 4])
def test_pair_dot_with_output_rows_in_lanes(lanes: int, rows: int):
  """Output rows in the lanes (apps/llm/quant.py: rows_linear): codes stored so that a pair of `lanes` rows' codes is
  one contiguous run, x's pair the same for every lane (lane i reads base + i % 2: a "tile2" load, one 2-element load
  repeated) -> WMMA "DOT2" accumulating the pairs in int32 lanes, the vector along the outputs, the rows of x upcast
  whole. Exact against int64 numpy."""
  G, P = 4, 32
  codes = RNG.integers(0, 16, (G, P, lanes, 2)).astype(np.uint8)
  x16 = RNG.integers(-2048, 2048, (rows, P, 2)).astype(np.int16)   # int32 sums < 2^24: exact as float32
  def t() -> Tensor:
    c = Tensor(codes).realize().cast(dtypes.int32).reshape(1, G, P, lanes, 2)
    return (c * Tensor(x16).realize().cast(dtypes.int32).reshape(rows, 1, P, 1, 2)).sum((2, 4)).cast(dtypes.float32)
  want = np.einsum("gpls,rps->rgl", codes.astype(np.int64), x16.astype(np.int64))
  opts = choose_opts(t().schedule(optimize=False)[-1].ast, 64, True, lanes, 32, Dots(pair=True))
  kinds = [(o.kind, o.amount) for o in opts]
  assert ("VECTOR", lanes) in kinds and (("UPCAST", 4) in kinds) is (rows == 4), opts
  got, src = run(t(), vector_lanes=lanes, vector_regs=32)
  assert f"pg_dot2_pg_int{lanes}(" in src and "pg_short2 val" in src, src
  np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("fields", [8, 32])
def test_a_loop_over_bit_fields_unrolls_within_the_budget(fields: int):
  """A reduce loop whose index is a shift's amount (the fifth bits of Q5 codes, bit j of a byte for pair j) is
  unrolled when it fits the unroll budget (16 copies), so every copy shifts by a constant: 8 fields are, 32 are not
  (a loop of 8 was left rolled before: a runtime amount splatted and shifted each trip). Exact against numpy."""
  bits8 = RNG.integers(0, 256, (64, fields // 8, 16), dtype=np.uint8)
  x16 = RNG.integers(-1000, 1000, (fields // 8, 8, 16), dtype=np.int64).astype(np.int32)
  def t() -> Tensor:
    sh = Tensor.arange(8, dtype=dtypes.uint8).reshape(1, 1, 8, 1)
    b = Tensor(bits8).realize().reshape(64, fields // 8, 1, 16)
    return ((b >> sh) & 1).cast(dtypes.int32).mul(Tensor(x16).realize().reshape(1, fields // 8, 8, 16)).sum((1, 2))
  bitv = (bits8.reshape(64, fields // 8, 1, 16) >> np.arange(8).reshape(1, 1, 8, 1)) & 1
  want = (bitv.astype(np.int64) * x16.reshape(1, fields // 8, 8, 16)).sum((1, 2))
  opts = choose_opts(t().schedule(optimize=False)[-1].ast, 64, True, 8, 16)
  assert (("UNROLL", 8) in [(o.kind, o.amount) for o in opts]) is (fields == 8), opts
  got, _ = run(t(), vector_lanes=8, vector_regs=16)
  np.testing.assert_array_equal(got, want)


def test_lane_pattern_tiles():
  """lane_pattern tells a group of g repeated across the lanes (base + lane % g) from a gather."""
  from plugrad.codegen.facts import lane_pattern
  lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 16),), (1, "global", "vector"))
  base = UOp.const(dtypes.index, 40)
  assert lane_pattern(base + lane % 2, lane) == "tile2" and lane_pattern(base + lane % 4, lane) == "tile4"
  assert lane_pattern(base + lane % 3, lane) == "gather" and lane_pattern(base + lane, lane) == "contiguous"


@pytest.mark.parametrize("f16", [True, False])
def test_float16_loads_convert_as_vectors(f16):
  """With `f16_vectors` a contiguous float16 load is one vector converted at once (F16C's vcvtph2ps, through clang's
  __fp16 vectors where _Float16 is emulated), without it each lane converts on its own; both give numpy's float32 of
  every kind of float16 (subnormals, +-0, +-inf, NaN, the largest), bit for bit."""
  from plugrad_cpu.device import cpu_flags
  if f16 and "f16c" not in cpu_flags(): pytest.skip("the host has no F16C")
  special = np.array([0, -0.0, np.inf, -np.inf, np.nan, 65504, -65504, 6e-8, -6e-8, 6.1e-5, 1e-7, 1, -1, 0.1], np.float16)
  h = np.concatenate([special, RNG.uniform(-2, 2, 4096 - len(special)).astype(np.float16)])
  got, src = run(Tensor(h).realize().cast(dtypes.float32), [Opt("VECTOR", 0, 16)], f16_vectors=f16)
  if dtypes.float16 in Device["CPU"].renderer.emulated: assert ("pg_h2f(" not in src and "pg_fp16_16" in src) is f16
  want = h.astype(np.float32)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])


def test_a_max_reduction_keeps_explicit_lanes(cpu_host):
  # clang's loop vectorizer leaves the NaN-propagating max loop scalar, so a max isn't handed to it as a streaming sum
  # is: a batched decode step's per-block activation maxima (4 x 48 blocks of 32) ran as 16 scalar accumulators,
  # 3.2 -> 1.9 us a kernel in lanes
  x = rand(4, 1536)
  x[1, 40], x[2, 64:96], x[3, 0:32], x[0, 100] = np.nan, -np.inf, -0.0, np.inf
  t = Tensor(x).realize().reshape(4, 48, 32).max(-1)
  it = [i for i in t.schedule() if i.ast.op is Ops.SINK][-1]
  assert any(o.kind == "VECTOR" and ranges_of(it.ast)[o.rid].arg[1] == "reduce" for o in it.opts), it.opts
  np.testing.assert_array_equal(t.numpy(), x.reshape(4, 48, 32).max(-1))


def specials(*shape: int) -> np.ndarray:
  """Random floats with NaN, infinities and signed zeros sprinkled in."""
  x = rand(*shape).reshape(-1)
  for i, v in enumerate((np.nan, np.inf, -np.inf, 0.0, -0.0, np.nan)): x[(i * 37) % x.size] = v
  return x.reshape(shape)


@pytest.mark.parametrize("lanes,regs", [(8, 16), (16, 32)])   # AVX2- and AVX-512-shaped records
def test_comparisons_and_selects_in_vector_lanes(lanes: int, regs: int):
  # comparisons of 32-bit lanes are masks and WHERE selects by bits (the CPU renderer's CMPLT/CMPNE/CMPEQ/WHERE
  # vector ops): abs (two compares, two selects) in a block max ran lane by lane before
  x, y = specials(4, 64), specials(4, 64)[::-1].copy()
  got, src = run(Tensor(x).realize().reshape(4, 2, 32).abs().max(-1), vector_lanes=lanes, vector_regs=regs)
  assert f"pg_mask{lanes}" in src and f"pg_float{lanes}" in src
  np.testing.assert_array_equal(got, np.abs(x).reshape(4, 2, 32).max(-1))
  tx, ty = Tensor(x).realize(), Tensor(y).realize()
  with np.errstate(invalid="ignore"):
    want = (np.where(x < y, x, y) + (x > 0) + np.where(((x > 0) & (y < 0)) | (x == y), 1.0, 2.0) + (x != 0)).sum(1)
  got, src = run(((tx < ty).where(tx, ty) + (tx > 0).cast(dtypes.float32) + (((tx > 0) & (ty < 0)) | (tx == ty)).where(1.0, 2.0)
                  + tx.cast(dtypes.bool).cast(dtypes.float32)).sum(1), vector_lanes=lanes, vector_regs=regs)
  assert f"pg_mask{lanes}" in src
  np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("lanes,regs", [(8, 16), (16, 32)])
@pytest.mark.parametrize("dt", [np.int32, np.uint32])
def test_integer_comparisons_select_in_vector_lanes(dt, lanes: int, regs: int):
  rng = np.random.default_rng(1)
  a, b = (rng.integers(0, 2**31 - 1, (8, 64)).astype(dt) for _ in range(2))
  a[0, :8] = np.iinfo(dt).max
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  got, src = run(((ta < tb).where(ta, tb) // 4).sum(1), vector_lanes=lanes, vector_regs=regs)
  assert f"pg_mask{lanes}" in src
  np.testing.assert_array_equal(got, (np.where(a < b, a, b) // 4).sum(1, dtype=dt))


@pytest.mark.parametrize("red", ["max", "sum"])
def test_upcast_outputs_share_one_horizontal_step(red: str):
  # a reduce in vector lanes with an upcast output axis: the copies' accumulators are folded together, two at a time
  # (_joint_horizontal), and lane i of the result is copy i's; NaN, infinities and signed zeros go through every level
  x = specials(4, 1536)
  t = Tensor(x).realize().reshape(4, 48, 32).abs()
  t = t.max(-1) if red == "max" else t.sum(-1)
  rngs = ranges_of(t.schedule(optimize=False)[-1].ast)
  red_id = next(k for k, r in rngs.items() if r.arg[1] == "reduce")
  out_id = max(k for k, r in rngs.items() if r.arg[1] == "global")
  with np.errstate(invalid="ignore"):
    want = np.abs(x).reshape(4, 48, 32).max(-1) if red == "max" else np.abs(x).reshape(4, 48, 32).sum(-1)
  for up in (2, 8, 16):
    got, src = run(t, [Opt("VECTOR", red_id, 16), Opt("UPCAST", out_id, up)])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    body = [ln.strip() for ln in src.splitlines() if ln.strip().startswith(("pg_float", "float "))]
    ops = sum(("pg_max_pg_float" in ln) if red == "max" else ("+" in ln.split("=", 1)[-1]) for ln in body)
    # up accumulations, then up - 1 pairings and the folds left: not a 4-level tree per copy (up + 4*up ops)
    assert ops <= 2 * up + 4, (up, ops)
