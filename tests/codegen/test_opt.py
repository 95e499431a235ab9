"""Codegen optimizations (codegen/opt.py): each one checked against numpy on sizes that do and don't divide the
upcast amounts, with gated (padded) loads, symbolic sizes, the FMA/merged-accumulator linearizer, and gcc."""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from codegen_helpers import with_caps

from plugrad.codegen import get_program
from plugrad.codegen.expand import expand
from plugrad.codegen.heuristic import choose_opts, optimize
from plugrad.codegen.optops import Opt, apply_opt
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.engine.realize import buffer_for
from plugrad.runtime.renderer import Capabilities
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray: return RNG.uniform(-1, 1, shape).astype(np.float32)


def kinds(t: Tensor) -> list[str]:
  """The optimizations chosen for the (last) kernel computing `t`."""
  return [o.kind for o in choose_opts(t.schedule(optimize=False)[-1].ast, 64)]


def mm(a: np.ndarray, b: np.ndarray) -> Tensor:
  m, k = a.shape
  return (Tensor(a).reshape(m, k, 1) * Tensor(b).reshape(1, k, b.shape[1])).sum(1)


@pytest.mark.parametrize("m,k,n", [(64, 48, 32), (37, 29, 41), (8, 100, 16), (1, 64, 64), (12, 3, 20)])
def test_matmul_register_blocked(m: int, k: int, n: int):
  a, b = rand(m, k), rand(k, n)
  t = mm(a, b)
  if n % 16 == 0 and m % 4 == 0 and m > 4: assert kinds(t)[:2] == ["UPCAST", "UPCAST"]
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def run_with(t: Tensor, **renderer_attrs) -> np.ndarray:
  """Realize `t`'s single kernel with a copy of the CPU renderer whose capabilities are overridden (bypasses the runner cache)."""
  dev = Device["CPU"]
  ren = with_caps(dev.renderer, **renderer_attrs)
  (it,) = t.schedule(optimize=False)
  spec = get_program(it.ast, ren)
  bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
  dev.load(spec.name, dev.compiler.compile_cached(spec.src))(*bufs, vals=tuple(it.var_vals.values()))
  return bufs[0].view(np.float32).copy()


@pytest.mark.parametrize("n", [1, 7, 1000, 1023, 4096, 16 * 37])
def test_sum_split_accumulators(n: int):
  x = rand(n)
  t = Tensor(x).realize().sum()
  if n % 16 == 0: assert kinds(t) == ["SPLIT"] and choose_opts(t.schedule(optimize=False)[-1].ast, 64, split_reduce=False) == []
  for vec in (False, True):  # split into accumulators / left to clang's loop vectorizer (pragma)
    np.testing.assert_allclose(run_with(t, vectorizes_reductions=vec), x.sum(dtype=np.float64), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(t.numpy(), x.sum(dtype=np.float64), rtol=1e-5, atol=1e-5)


def test_reduce_pragma_only_on_single_accumulator_loops():
  # the scalar path (explicit SIMD is tested in test_vectorize.py)
  ren = with_caps(Device["CPU"].renderer, vectorizes_reductions=True, vector_lanes=0)
  x = Tensor(rand(64, 64)).realize()
  assert "#pragma clang loop vectorize" in get_program(x.sum(1).schedule(optimize=False)[-1].ast, ren).src
  assert "#pragma clang loop vectorize" not in get_program((x @ x).schedule(optimize=False)[-1].ast, ren).src  # register-blocked
  assert choose_opts(x.max(1).schedule(optimize=False)[-1].ast, 64, split_reduce=False)[0].kind == "SPLIT"  # max: always split


@pytest.mark.parametrize("shape", [(48, 64), (5, 7), (33, 16)])
@pytest.mark.parametrize("axis", [0, 1])
def test_sum_axis_and_max(shape: tuple[int, int], axis: int):
  x = rand(*shape)
  np.testing.assert_allclose(Tensor(x).sum(axis).numpy(), x.sum(axis), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(Tensor(x - 5).max(axis).numpy(), (x - 5).max(axis))  # identity -inf, all negative


def test_reduce_axis0_upcasts_contiguous_output():
  x = rand(64, 32)
  t = Tensor(x).sum(0)
  assert kinds(t) == ["UPCAST"]  # reduce walks memory with a stride: vectorize across the outputs instead
  np.testing.assert_allclose(t.numpy(), x.sum(0), rtol=1e-5, atol=1e-5)


def test_int_sum_and_prod_exact():
  x = RNG.integers(-3, 4, (16, 32)).astype(np.int32)
  np.testing.assert_array_equal(Tensor(x).sum(1).numpy(), x.sum(1))
  y = RNG.integers(1, 3, (4, 16)).astype(np.int32)
  np.testing.assert_array_equal(Tensor(y)._reduce(Ops.MUL, (1,), False).numpy(), y.prod(1))


def test_gated_loads_with_unroll_and_upcast():
  x = rand(6, 5)
  xp = np.pad(x, ((1, 1), (2, 1)))  # (8, 8), padded loads are gated
  t = Tensor(x)._pad(((1, 1), (2, 1)))
  got = t.reshape(8, 2, 4).sum(2)
  assert "UNROLL" in kinds(got)
  np.testing.assert_allclose(got.numpy(), xp.reshape(8, 2, 4).sum(2), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(t.sum(0).numpy(), xp.sum(0), rtol=1e-6, atol=1e-6)
  w = rand(8, 16)
  got = (t.reshape(8, 8, 1) * Tensor(w).reshape(1, 8, 16)).sum(1)  # padded matmul operand
  np.testing.assert_allclose(got.numpy(), xp @ w, rtol=1e-5, atol=1e-5)


def test_window_reduce_unrolled():
  x = rand(4, 3, 3, 16)
  t = Tensor(x).sum((1, 2))
  assert kinds(t).count("UNROLL") == 2
  np.testing.assert_allclose(t.numpy(), x.sum((1, 2)), rtol=1e-5, atol=1e-5)


def _symbolic_sum_ast() -> tuple[UOp, UOp]:
  """out[i] = sum_r in[i*n + r] for i < 16, r < n with n a DEFINE_VAR: the reduce range has a symbolic size."""
  n = UOp(Ops.DEFINE_VAR, dtypes.index, arg=("n", 1, 64))
  i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 16),), (0, "global"))
  r = UOp(Ops.RANGE, dtypes.index, (n,), (1, "reduce"))
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(16), arg=0)
  inp = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(16 * 64), arg=1)
  val = UOp(Ops.REDUCE, dtypes.float32, (UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, inp.dtype, (inp, i * n + r)),)), r), Ops.ADD)
  return UOp.sink_of(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, i)), val))), r


def test_symbolic_sizes_untouched_and_correct():
  ast, r = _symbolic_sum_ast()
  assert choose_opts(ast, 64) == []  # nothing to split: the reduce size is symbolic, the output loads aren't reused
  with pytest.raises(ValueError, match="can't split range"): apply_opt(ast, Opt("SPLIT", 1, 4))
  dev = Device["CPU"]
  spec = get_program(ast, dev.renderer)
  prg = dev.load(spec.name, dev.compiler.compile_cached(spec.src))
  x = rand(16 * 64)
  for nv in (1, 5, 64):
    out = np.zeros(16, np.float32)
    prg(out.view(np.uint8), x.view(np.uint8), vals=(nv,))
    np.testing.assert_allclose(out, x[:16 * nv].reshape(16, nv).sum(1), rtol=1e-5, atol=1e-5)


def test_apply_opt_errors():
  t = mm(rand(8, 16), rand(16, 16))
  ast = t.schedule(optimize=False)[-1].ast
  with pytest.raises(ValueError, match="UPCAST needs a global range"): apply_opt(ast, Opt("UPCAST", 2, 4))
  with pytest.raises(ValueError, match="can't split range"): apply_opt(ast, Opt("UPCAST", 0, 3))
  with pytest.raises(ValueError, match="no range 9"): apply_opt(ast, Opt("SPLIT", 9, 2))
  with pytest.raises(ValueError, match="UNROLL must cover"): apply_opt(ast, Opt("UNROLL", 2, 4))


def test_optimize_respects_renderer_and_noopt(monkeypatch: pytest.MonkeyPatch):
  ast = mm(rand(8, 16), rand(16, 16)).schedule(optimize=False)[-1].ast
  assert optimize(ast, Capabilities(upcast_max=0)) is ast
  monkeypatch.setenv("NOOPT", "1")
  assert optimize(ast, Device["CPU"].renderer.caps) is ast


def test_merged_accumulators_and_fma():
  ast = mm(rand(8, 16), rand(16, 32)).schedule(optimize=False)[-1].ast
  ren = with_caps(Device["CPU"].renderer, vector_lanes=0)  # scalar copies (the vector form: test_vectorize.py)
  spec = get_program(ast, ren)
  assert [u.op for u in spec.uops].count(Ops.RANGE) == 3  # 64 accumulators share one reduce loop
  assert spec.src.count("__builtin_fmaf") == 64 and spec.src.count("acc63[0] = 0.0f") == 1


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_gcc_compiles_and_runs_optimized_kernels():
  from plugrad_cpu.device import ClangCompiler, CPUProgram
  a, b, x = rand(8, 32), rand(32, 48), rand(4096)
  ta, tb, tx = (Tensor(v).realize() for v in (a, b, x))
  gcc, dev = ClangCompiler("gcc"), Device["CPU"]
  # (a float32 sum of 4096 terms is within ~1e-6 of the sum of their magnitudes; its value may be near 0, so the sum's
  # tolerance is absolute: rtol alone failed whenever the shared generator's draw summed close to 0)
  cases = (((ta.reshape(8, 32, 1) * tb.reshape(1, 32, 48)).sum(1), a @ b, 1e-5),
           (tx.sum(), x.sum(dtype=np.float64), 1e-6 * np.abs(x).sum()), (ta.max(1), a.max(1), 1e-5))
  for t, want, atol in cases:
    (it,) = t.schedule(optimize=False)
    spec = get_program(it.ast, dev.renderer)
    prg = CPUProgram(dev, spec.name, gcc.compile(spec.src))
    bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
    prg(*bufs)
    np.testing.assert_allclose(bufs[0].view(np.float32).reshape(np.shape(want)), want, rtol=1e-5, atol=atol)


def test_vectorizable_exp2_accuracy_and_specials():
  x = np.concatenate([np.linspace(-155, 130, 200_001, dtype=np.float32),
                      np.array([np.nan, np.inf, -np.inf, 0, -0.0, 128, 127.99, -126, -149, -149.5, -150, 1e-30], np.float32)])
  got = Tensor(x).exp2().numpy()
  ref = np.exp2(x.astype(np.float64))
  with np.errstate(over="ignore"): ref32 = ref.astype(np.float32)
  fin = np.isfinite(ref32) & (ref32 != 0)
  assert (np.abs(got[fin] - ref[fin]) / np.spacing(ref32[fin]).astype(np.float64)).max() <= 2.0  # ulps
  np.testing.assert_array_equal(got[~fin], ref32[~fin])  # inf, 0 and nan exactly where exp2 gives them
  assert "pg_exp2f(" in get_program(Tensor(x).exp2().schedule(optimize=False)[-1].ast, Device["CPU"].renderer).src


@pytest.mark.parametrize("n", [1000, 1024, 7])
def test_arange_kernel_computes_its_index_without_bit_arithmetic(n: int):
  # Tensor.arange is a sum of padded bit patterns; the symbolic rules fold it back into the loop index (it was 3-4
  # integer ops per bit per element, e.g. in every causal mask and softmax of the LLM's attention)
  t = Tensor.arange(n).float() * 3 + 1
  src = get_program(t.schedule(optimize=False)[-1].ast, Device["CPU"].renderer).src
  body = src[src.index("for (int gidx0"):]
  assert "%" not in body and "?" not in body, body
  np.testing.assert_array_equal(t.numpy(), np.arange(n, dtype=np.float32) * 3 + 1)


def test_interleaved_phases_are_unrolled_to_one_load_each():
  """A stride-2 conv's input gradient interleaves its 4 phase convolutions with an elementwise kernel that reads
  position (y, x) from phase (y % 2, x % 2): both output axes are unrolled by 2, so every copy loads the one phase its
  constants select (rolled, each element tested and loaded all 4: 7.0 ms vs 3.5 ms at 32x128x28x28)."""
  x, w = rand(2, 8, 12, 12), rand(16, 8, 3, 3)
  xx = Tensor(x, requires_grad=True)
  y = xx.conv2d(Tensor(w), stride=2, padding=1)
  dy = rand(*y.shape)
  (y * Tensor(dy)).sum().backward()
  interleave = [it.ast for it in xx.grad.schedule(optimize=False) if not any(n.op is Ops.REDUCE for n in it.ast.toposort())
                and sum(1 for n in it.ast.toposort() if n.op is Ops.DEFINE_GLOBAL) == 5]
  assert len(interleave) == 1
  ast = expand(optimize(interleave[0], Device["CPU"].renderer.caps))
  topo = ast.toposort()
  assert not any(n.op is Ops.MOD for n in topo)
  assert sum(1 for n in topo if n.op is Ops.LOAD) == sum(1 for n in topo if n.op is Ops.STORE) == 4
  # the gradient itself, against the transposed convolution written out in float64
  ref = np.zeros((2, 8, 14, 14))
  for oy in range(y.shape[2]):
    for ox in range(y.shape[3]):
      ref[:, :, 2 * oy:2 * oy + 3, 2 * ox:2 * ox + 3] += np.einsum("no,oikl->nikl", dy[:, :, oy, ox].astype(np.float64), w.astype(np.float64))
  np.testing.assert_allclose(xx.grad.numpy(), ref[:, :, 1:13, 1:13], rtol=1e-4, atol=1e-4)


def test_phase_opts_only_for_small_moduli_of_global_ranges():
  a = rand(6, 10)
  keep = (np.arange(10) % 5 == 0).astype(np.float32)
  t = Tensor(a) * (Tensor.arange(10) % 5 == 0).reshape(1, 10)   # modulus 5: left rolled
  assert any(n.op is Ops.MOD for n in t.schedule(optimize=False)[-1].ast.toposort()) and choose_opts(t.schedule(optimize=False)[-1].ast, 64) == []
  t2 = Tensor(a) * (Tensor.arange(10) % 2 == 0).reshape(1, 10)  # modulus 2: unrolled by 2
  assert [o.kind for o in choose_opts(t2.schedule(optimize=False)[-1].ast, 64)] == ["UPCAST"]
  np.testing.assert_array_equal(t.numpy(), a * keep)
  np.testing.assert_array_equal(t2.numpy(), a * (np.arange(10) % 2 == 0))


def test_weight_gradient_puts_the_window_operand_range_outermost(host_caps):
  """A conv's weight gradient dW[cout, cin, taps] has the channel panels (cout) as its first global range: the conv tile
  makes the input-channel range outermost instead (OUTER), so each channel's input windows stay in cache across the
  panels (128->256 stride 2: 54 -> 31 ms on an AVX-512 host; the decision is checked for that host shape, wherever
  the suite runs). A forward conv (batch outermost already) gets no OUTER. Values vs float64 on this host (an AVX2
  host makes 2 input channels tile rows and keeps the panels outermost: OUTER of their outer loop measured 0-10%
  slower there)."""
  from plugrad.codegen.heuristic import heuristic_opts
  x, w = rand(2, 16, 10, 10), rand(32, 16, 3, 3)
  ww = Tensor(w, requires_grad=True)
  y = Tensor(x).conv2d(ww, stride=2, padding=1)
  dy = rand(*y.shape)
  (y * Tensor(dy)).sum().backward()
  ren = host_caps()
  items = ww.grad.schedule(optimize=False)
  main = max((it.ast for it in items), key=lambda a: sum(1 for n in a.toposort() if n.op is Ops.REDUCE and len(n.src) > 2))
  assert any(o.kind == "OUTER" for o in heuristic_opts(main, ren)), heuristic_opts(main, ren)
  fwd = Tensor(x).conv2d(Tensor(w), padding=1).schedule(optimize=False)[-1].ast
  assert not any(o.kind == "OUTER" for o in heuristic_opts(fwd, ren))
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  ref = np.zeros(w.shape)
  for i in range(3):
    for j in range(3):
      win = xp[:, :, i:i + 2 * y.shape[2]:2, j:j + 2 * y.shape[3]:2]
      ref[:, :, i, j] = np.einsum("nchw,nohw->oc", win, dy.astype(np.float64))
  np.testing.assert_allclose(ww.grad.numpy(), ref, rtol=1e-4, atol=1e-4)


def _matmul_ast(m: int, k: int, n: int) -> UOp:
  return (Tensor(rand(m, k)) @ Tensor(rand(k, n))).schedule(optimize=False)[-1].ast


def test_big_matmul_rows_are_blocked_for_l3(host_caps):
  """A column-panel matmul whose row operand A (M x K) is over a quarter of L3 gets its rows BLOCKed into chunks of at
  most L3/8 bytes of A (4096^2 on a 32 MiB L3: 256-row chunks, 135 -> 170 GFLOPS on one core); the same kernel on a
  host with a big enough L3, or with unknown caches, is not blocked, nor is 1024^2 (A an eighth of L3). 2048^2, A at
  half of L3, is blocked (a Zen 4 VM, 2 threads: 96-115 ms unblocked against 78-83), and a few chunks come in a count
  that 4 divides (1536^2: 3 chunks of 64 blocks left one of 2 cores a chunk idle, 45 ms against 34 unblocked)."""
  from plugrad.codegen.heuristic import heuristic_opts
  big = _matmul_ast(4096, 4096, 4096)
  blk = [o for o in heuristic_opts(big, host_caps(32 << 20)) if o.kind == "BLOCK"]
  assert len(blk) == 1 and blk[0].amount == 32, blk   # 512 row blocks of 8 -> chunks of 32 blocks: 256 rows x 16 KiB = 4 MiB
  assert not any(o.kind == "BLOCK" for o in heuristic_opts(big, host_caps(256 << 20)))
  assert not any(o.kind == "BLOCK" for o in heuristic_opts(big, host_caps(0)))
  assert not any(o.kind == "BLOCK" for o in heuristic_opts(_matmul_ast(1024, 1024, 1024), host_caps(32 << 20)))
  assert [o.amount for o in heuristic_opts(_matmul_ast(2048, 2048, 2048), host_caps(32 << 20)) if o.kind == "BLOCK"] == [64]  # 4 chunks
  assert [o.amount for o in heuristic_opts(_matmul_ast(1536, 1536, 1536), host_caps(32 << 20)) if o.kind == "BLOCK"] == [16]  # 12 chunks


def test_row_blocked_matmul_values(monkeypatch: pytest.MonkeyPatch):
  """The blocked kernel through the whole engine (packing kernel, then the matmul with its chunk loop outermost) on a
  host that reports a 256 KiB L3: A is 200 KiB, chunks of at most 32 KiB of it; values vs float64, on 1 and 2 threads."""
  from plugrad.codegen.heuristic import heuristic_opts
  ren = Device["CPU"].renderer
  monkeypatch.setattr(ren, "caps", dataclasses.replace(ren.caps, cache_bytes=(48 << 10, 1 << 20, 256 << 10)))
  a, b = rand(256, 200), rand(200, 256)
  ast = (Tensor(a) @ Tensor(b)).schedule(optimize=False)[-1].ast
  opts = heuristic_opts(ast, Device["CPU"].renderer.caps)
  (blk,) = [o for o in opts if o.kind == "BLOCK"]
  rows = next(o.amount for o in opts if o.kind.startswith("UPCAST") and o.rid != blk.rid and o.amount > 2)   # the tile's rows
  assert blk.amount * rows * 200 * 4 * 8 <= 256 << 10 < 2 * blk.amount * rows * 200 * 4 * 8, opts  # the largest chunk within L3/8
  ref = a.astype(np.float64) @ b.astype(np.float64)
  for threads in (1, 2):
    monkeypatch.setattr(Device["CPU"], "threads", threads)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lanes,regs", [(8, 16), (16, 32)])
def test_attention_scores_share_each_key_among_three_query_heads(host_caps, lanes, regs):
  """Decode attention's scores with 3 query heads a KV head (4 slots x 3 KV heads x 3 x keys, a dot over 64 float16
  dims): the query-head axis is upcast whole, each key row loaded and converted once for the three (the 4-slot
  SmolLM2 step at 400 keys: 47.9 -> 36.7 us a layer with AVX2 code, 44.7 -> 33.4 with AVX-512; one stream 18.8 ->
  14.5). Before, only a whole axis of 2 or 4 was, and each key was read three times. Values vs float64."""
  from plugrad.codegen.heuristic import heuristic_opts
  q, k = rand(4, 3, 3, 1, 64), rand(4, 3, 1, 40, 64).astype(np.float16)
  sc = Tensor(q) @ Tensor(k).cast(dtypes.float32).transpose(3, 4)
  (item,) = [it for it in sc.schedule(optimize=False) if any(n.op is Ops.REDUCE for n in it.ast.toposort())]
  rngs = {n.arg[0]: n for n in item.ast.toposort() if n.op is Ops.RANGE}
  kloads = [n for n in item.ast.toposort() if n.op is Ops.LOAD and n.dtype == dtypes.float16]
  opts = heuristic_opts(item.ast, host_caps(lanes=lanes, regs=regs))
  up3 = [o for o in opts if o.kind == "UPCAST" and o.amount == 3]
  assert len(up3) == 1 and not any(rngs[up3[0].rid] in ld.toposort() for ld in kloads), opts   # the query heads, not the KV heads
  ref = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 2, 4, 3)
  np.testing.assert_allclose(sc.numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lanes,regs,vectors,rows", [(8, 16, 8, []), (16, 32, 4, [3])])
def test_attention_values_take_a_short_head_in_one_pass(host_caps, lanes, regs, vectors, rows):
  """Decode attention's weighted values (4 slots x 3 KV heads x 3 query heads x 64 dims, summed over the keys): the
  value rows are streamed for only 3 query heads, so the panel takes the whole head, each value row read in one pass
  over the keys: with AVX-512 its 4 vectors beside the 3 heads (the 4-slot SmolLM2 step at 400 keys 39.6 -> 30.6 us a
  layer), with AVX2 its 8 vectors and one head a pass (50.3 -> 45.7), where a panel of 2 vectors made 2 or 4 passes.
  Values vs float64."""
  from plugrad.codegen.heuristic import heuristic_opts
  p, v = rand(4, 3, 3, 1, 40), rand(4, 3, 1, 40, 64).astype(np.float16)
  out = Tensor(p) @ Tensor(v).cast(dtypes.float32)
  (item,) = [it for it in out.schedule(optimize=False) if any(n.op is Ops.REDUCE for n in it.ast.toposort())]
  opts = heuristic_opts(item.ast, host_caps(lanes=lanes, regs=regs))
  vec = next(o for o in opts if o.kind == "VECTOR")
  assert vec.amount == lanes and [o.amount for o in opts if o.kind == "UPCAST" and o.rid == vec.rid] == [vectors], opts
  assert [o.amount for o in opts if o.kind == "UPCAST" and o.rid != vec.rid] == rows, opts
  np.testing.assert_allclose(out.numpy(), p.astype(np.float64) @ v.astype(np.float64), rtol=1e-4, atol=1e-4)
