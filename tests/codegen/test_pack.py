"""PACK (codegen/pack.py): the matmul's column-panel operand repacked by a kernel that runs first, a schedule item of
its own (schedule/optimize.py). Values against numpy through the Tensor API on the CPU device (the heuristic packs),
TinyJit capture and replay of the pair, the scratch placed like any intermediate, the plan's parameter renumbering,
and the same plan run on the PYTHON device (pack kernel and main kernel as plain loops)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from plugrad import Tensor, TinyJit
from plugrad.codegen import get_program
from plugrad.codegen.heuristic import heuristic_opts
from plugrad.codegen.opt import Opt, apply_opt, ranges_of
from plugrad.codegen.pack import split_packs
from plugrad.device import Buffer, Device
from plugrad.codegen import search
from plugrad.engine.realize import buffer_for, lower_item, runner_of
from plugrad.schedule import kernelize
from plugrad.uop.buffers import buffer_of
from plugrad.schedule.item import ScheduleItem
from plugrad.uop.ops import Ops, UOp

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray: return RNG.uniform(-1, 1, shape).astype(np.float32)


def packs_and_main(t: Tensor) -> tuple[list[ScheduleItem], ScheduleItem]:
  """The packing kernels of `t`'s last kernel (the items before it without a reduction writing a buffer it reads)
  and that kernel."""
  *pre, main = (it for it in t.schedule() if it.ast.op is Ops.SINK)
  return [it for it in pre if it.bufs[0] in main.bufs[1:] and not any(x.op is Ops.REDUCE for x in it.ast.toposort())], main


def packed(t: Tensor) -> bool: return bool(packs_and_main(t)[0])


def packed_sizes(t: Tensor) -> set[int]:
  """The element counts of the buffers the packing kernels of `t`'s last kernel read (which operands are packed: the
  heuristic may pack a small row operand instead, e.g. 8 rows in the vector lanes of an 8-lane host)."""
  return {b.numel() for p in packs_and_main(t)[0] for b in p.bufs[1:]}


def unoptimized_kernel(t: Tensor) -> UOp:
  """`t`'s last kernel as the scheduler builds it, before its optimizations (no packing kernels split off)."""
  return t.schedule(optimize=False)[-1].ast


def shares_memory(a: Buffer, b: Buffer) -> bool:
  return a.base is b.base and a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


@pytest.mark.parametrize("m,k,n", [(64, 48, 256), (128, 37, 512), (256, 256, 256), (96, 100, 1024)])
def test_packed_matmul_matches_numpy(m: int, k: int, n: int):
  a, b = rand(m, k), rand(k, n)
  t = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize()
  assert packed(t)
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-5, atol=1e-4)


def test_packed_batched_matmul_and_same_operand_twice():
  a, b = rand(3, 64, 40), rand(3, 40, 256)
  t = Tensor(a, device="CPU") @ Tensor(b, device="CPU")
  assert packed(t)  # the batch range is a layout axis of the packed buffer
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-5, atol=1e-4)
  x = rand(256, 256)
  tx = Tensor(x, device="CPU").realize()
  t = tx @ tx  # one buffer read as both operands: only the panel load is redirected
  assert packed(t)
  np.testing.assert_allclose(t.numpy(), x @ x, rtol=1e-5, atol=1e-4)


def test_b_read_only_through_the_pack_is_not_a_parameter():
  a, b = rand(64, 32), rand(32, 256)
  ta, tb = Tensor(a, device="CPU").realize(), Tensor(b, device="CPU").realize()
  pks, main = packs_and_main(ta @ tb)
  # (seen in two of ten runs of tests/llm + tests/codegen under xdist: no pack; the message says what was chosen)
  assert len(pks) == 1, (heuristic_opts(unoptimized_kernel(ta @ tb), Device["CPU"].renderer.caps), Device["CPU"].renderer.caps,
                         [(it.ast.op, len(it.bufs), runner_of(it).spec.name) for it in (ta @ tb).schedule() if it.ast.op is Ops.SINK])
  (pk,) = pks
  assert len(runner_of(main).spec.globals) == 3 and len(main.bufs) == 3  # output, A, packed B (B itself only feeds the pack)
  assert main.bufs[1] is buffer_of(ta.uop) and main.bufs[2] is pk.bufs[0] and pk.bufs[1:] == [buffer_of(tb.uop)]


def test_transposed_operands_are_packed(host_caps):
  """x @ W.T (nn.Linear): W read along k becomes panel-major, so the column-panel tile applies (an AVX-512-shaped host;
  an AVX2 one puts its 8 lanes along x's rows and packs x instead); A.T (a weight gradient's dY.T @ X) is packed along
  the tile's rows too."""
  a, w = rand(64, 48), rand(256, 48)
  t = Tensor(a, device="CPU") @ Tensor(w, device="CPU").T
  opts = heuristic_opts(unoptimized_kernel(t), host_caps())
  assert [o.amount for o in opts if o.kind == "PACK"] == [32], opts  # W packed in panels of 2 vectors of columns
  pks, main = packs_and_main(t)
  assert len(pks) == 1 and f"pg_float{Device['CPU'].renderer.caps.vector_lanes}" in runner_of(main).spec.src
  np.testing.assert_allclose(t.numpy(), a @ w.T, rtol=1e-5, atol=1e-4)
  at = rand(48, 64)
  t = Tensor(at, device="CPU").T @ Tensor(rand(48, 256), device="CPU")
  assert len(packs_and_main(t)[0]) == 2
  b = rand(48, 256)
  t = Tensor(at, device="CPU").T @ Tensor(b, device="CPU")
  np.testing.assert_allclose(t.numpy(), at.T @ b, rtol=1e-5, atol=1e-4)


def test_no_pack_for_few_row_blocks(host_caps):
  for t in (Tensor(rand(8, 48), device="CPU") @ Tensor(rand(48, 256), device="CPU"),   # one row block
            Tensor(rand(8, 48), device="CPU") @ Tensor(rand(256, 48), device="CPU").T):
    assert not any(o.kind == "PACK" for o in heuristic_opts(unoptimized_kernel(t), host_caps()))
    # on this host: the 256-column operand is not packed (an 8-lane host may pack the 8 rows: its lanes run along them)
    assert 48 * 256 not in packed_sizes(t)
  assert not packed(Tensor(rand(64, 10), device="CPU") @ Tensor(rand(10, 512), device="CPU"))  # a 10-long panel stays in L1


def test_pack_env_off(monkeypatch):
  monkeypatch.setenv("PACK", "0")
  a, b = rand(64, 40), rand(40, 256)
  t = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize()
  assert all(o.kind != "PACK" for o in heuristic_opts(unoptimized_kernel(t), Device["CPU"].renderer.caps))


def test_jit_replays_the_pack_with_new_inputs():
  w = Tensor(rand(48, 256), device="CPU").realize()
  @TinyJit
  def f(x: Tensor, y: Tensor) -> Tensor: return (x @ y + w[:1]).realize()
  for _ in range(4):
    a, b = rand(64, 48), rand(48, 256)
    np.testing.assert_allclose(f(Tensor(a, device="CPU"), Tensor(b, device="CPU")).numpy(), a @ b + w.numpy()[:1], rtol=1e-5, atol=1e-4)
  assert any(ei.runner is not None and ei.runner.spec.name.startswith("E_") for ei in f.captured)  # the pack kernel


def pack_scratches(f: TinyJit) -> list[Buffer]:
  """The buffers the packing kernels of a capture write (its elementwise kernels writing into the capture's arena)."""
  return [ei.bufs[0] for ei in f.captured if ei.runner is not None and ei.runner.spec.name.startswith("E_") and ei.bufs[0].base is not ei.bufs[0]]


def test_packs_of_one_shape_share_their_scratch_and_stay_right():
  """Two different kernels packing a 48x256 operand write the same memory (one 48 KiB panel, not two): the scratch is
  an intermediate the capture's memory planner places, alive from its pack to its matmul, so every result is still
  its own, jitted or not."""
  @TinyJit
  def f(x: Tensor, y: Tensor, z: Tensor) -> tuple[Tensor, Tensor]: return (x @ y).realize(), ((x @ z) * 2).realize()
  for _ in range(4):
    a, b, c = rand(64, 48), rand(48, 256), rand(48, 256)
    r1, r2 = f(Tensor(a, device="CPU"), Tensor(b, device="CPU"), Tensor(c, device="CPU"))
    np.testing.assert_allclose(r1.numpy(), a @ b, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(r2.numpy(), 2 * (a @ c), rtol=1e-5, atol=1e-4)
  s1, s2 = pack_scratches(f)
  assert shares_memory(s1, s2)


def test_packs_of_different_shapes_share_one_buffer():
  """Packs of different sizes share memory too (the capture's arena: a 135M-parameter LLM's prefill packs four weight
  shapes), and each result is still its own."""
  @TinyJit
  def f(x: Tensor, y: Tensor, u: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: return (x @ y).realize(), (u @ v).realize()
  for _ in range(4):
    a, b, c, d = rand(64, 48), rand(48, 256), rand(64, 96), rand(96, 512)
    r1, r2 = f(*[Tensor(t, device="CPU") for t in (a, b, c, d)])
    np.testing.assert_allclose(r1.numpy(), a @ b, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(r2.numpy(), c @ d, rtol=1e-5, atol=1e-4)
  s1, s2 = pack_scratches(f)
  assert s1.nbytes < s2.nbytes and shares_memory(s1, s2)


def test_one_kernel_packing_two_operands_of_one_shape_gets_two_scratches(monkeypatch):
  """(x @ y) * (x @ z) with both y and z packed (as a fused gate/up projection's two weights are): sharing scratch by
  shape must still give one kernel's two packs two buffers. Written when sharing first broke the embedded model's
  logits exactly so; the opts are forced through the BEAM hook (the rest of the path is the real one)."""
  a, b, c = rand(64, 48), rand(48, 256), rand(48, 256)
  t = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")) * (Tensor(a, device="CPU") @ Tensor(c, device="CPU"))
  ast = unoptimized_kernel(t)
  monkeypatch.setattr(kernelize, "_SCHEDULE_CACHE", {})
  cols = next(r.arg[0] for r in ranges_of(ast).values() if r.arg[1] == "global" and r.src[0].arg == 256)
  rest = [o for o in heuristic_opts(ast, Device["CPU"].renderer.caps) if o.kind != "PACK"]
  forced = [Opt("PACK", cols, 32), Opt("PACK", cols, 32), *rest]
  monkeypatch.setattr(search, "beam_opts", lambda k, device: forced if k is ast else None)  # the packing kernels: the heuristic
  pks, main = packs_and_main(t)
  assert len(pks) == 2 and pks[0].bufs[0].arg == pks[1].bufs[0].arg and pks[0].bufs[0] is not pks[1].bufs[0]
  assert main.bufs.count(pks[0].bufs[0]) == main.bufs.count(pks[1].bufs[0]) == 1
  np.testing.assert_allclose(t.numpy(), (a @ b) * (a @ c), rtol=1e-4, atol=1e-4)


def test_bad_pack_opt_is_a_clear_error():
  it = (Tensor(rand(64, 48), device="CPU") @ Tensor(rand(256, 48), device="CPU").T).schedule()[-1]
  ew = (Tensor(rand(64, 256), device="CPU") + 1).schedule()[-1]
  with pytest.raises(ValueError, match="no reduce-loop operand"): split_packs(ew.ast, [Opt("PACK", 1, 32)])
  with pytest.raises(ValueError, match="global range"): split_packs(it.ast, [Opt("PACK", 2, 32)])
  with pytest.raises(ValueError, match="split_packs"): apply_opt(it.ast, Opt("PACK", 1, 32))


def test_plan_runs_on_the_python_device():
  """The packed layout is device-independent: the pack kernel and the main kernel (plain loops) give a @ b."""
  a, b = rand(24, 20), rand(20, 64)
  it = (Tensor(a, device="PYTHON").realize() @ Tensor(b, device="PYTHON").realize()).schedule()[-1]
  plan = split_packs(it.ast, [Opt("PACK", 1, 16), Opt("UPCAST", 0, 4), Opt("UPCAST", 1, 2)])
  dev = Device["PYTHON"]
  bufs = [buffer_for(u).ensure_allocated() for u in it.bufs]
  (pk,) = plan.packs
  scratch = Buffer("PYTHON", pk.size, pk.dtype).ensure_allocated()
  ps = get_program(pk.ast, dev.renderer)
  dev.load(ps.name, dev.compiler.compile_cached(ps.src))(scratch._buf, *[bufs[i]._buf for i in pk.srcs])
  packed_b = np.frombuffer(bytes(scratch.copyout()), np.float32).reshape(4, 20, 16)
  np.testing.assert_array_equal(packed_b, b.reshape(20, 4, 16).transpose(1, 0, 2))
  spec = get_program(plan.ast, dev.renderer, plan.opts)
  main = [bufs[s]._buf if s >= 0 else scratch._buf for s in plan.slots]
  dev.load(spec.name, dev.compiler.compile_cached(spec.src))(*main)
  np.testing.assert_allclose(np.frombuffer(bytes(bufs[0].copyout()), np.float32).reshape(24, 64), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_padded_panels_when_the_panel_width_does_not_divide(device: str):
  """PACK by a P that doesn't divide the axis pads the last panel with copies of the axis' last row (never read): A's
  26 rows in panels of 6 (the AVX2 tile's overlapping 6-row tiles read them), B's 60 columns in panels of 16."""
  a, b = rand(26, 20), rand(20, 60)
  it = (Tensor(a, device=device).realize() @ Tensor(b, device=device).realize()).schedule()[-1]
  plan = split_packs(it.ast, [Opt("PACK", 0, 6), Opt("PACK", 1, 16), Opt("UPCAST_OVERLAP", 0, 6)])
  dev = Device[device]
  bufs = [buffer_for(u).ensure_allocated() for u in it.bufs]
  scratch = []
  for pk in plan.packs:
    scratch.append(sb := Buffer(device, pk.size, pk.dtype).ensure_allocated())
    ps = get_program(pk.ast, dev.renderer)
    dev.load(ps.name, dev.compiler.compile_cached(ps.src))(sb._buf, *[bufs[i]._buf for i in pk.srcs])
  pad_a = np.concatenate([a, np.repeat(a[-1:], 4, 0)]).reshape(5, 6, 20).transpose(0, 2, 1)
  pad_b = np.concatenate([b, np.repeat(b[:, -1:], 4, 1)], 1).reshape(20, 4, 16).transpose(1, 0, 2)
  got = [np.frombuffer(bytes(sb.copyout()), np.float32) for sb in scratch]
  np.testing.assert_array_equal(got[0].reshape(5, 20, 6), pad_a)
  np.testing.assert_array_equal(got[1].reshape(4, 20, 16), pad_b)
  spec = get_program(plan.ast, dev.renderer, plan.opts)
  main = [bufs[s]._buf if s >= 0 else scratch[-1 - s]._buf for s in plan.slots]
  dev.load(spec.name, dev.compiler.compile_cached(spec.src))(*main)
  np.testing.assert_allclose(np.frombuffer(bytes(bufs[0].copyout()), np.float32).reshape(26, 60), a @ b, rtol=1e-5, atol=1e-5)


def test_pack_of_the_row_operand_and_block(monkeypatch):
  """PACK_A=1 packs A along the tile's rows too; BLOCK splits the rows into an outermost block loop; values unchanged."""
  monkeypatch.setenv("PACK_A", "1")
  a, b = rand(128, 40), rand(40, 256)
  t = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize()
  pks, main = packs_and_main(t)
  assert len(pks) == 2 and main.bufs[1:] == [pks[0].bufs[0], pks[1].bufs[0]]
  it = t.schedule(optimize=False)[-1]
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-5, atol=1e-4)
  ast = apply_opt(it.ast, Opt("BLOCK", 0, 4))
  glbl = sorted((x.arg[0], x.src[0].arg) for x in ast.toposort() if x.op.name == "RANGE" and x.arg[1] == "global")
  assert glbl == [(0, 32), (1, 4), (3, 256)]  # the block loop outermost, the rows within a block in the rows' place
  dev = Device["CPU"]
  spec = get_program(ast, dev.renderer, [])
  bufs = [buffer_for(u).ensure_allocated() for u in it.bufs]
  dev.load(spec.name, dev.compiler.compile_cached(spec.src))(*[x._buf for x in bufs])
  np.testing.assert_allclose(np.frombuffer(bytes(bufs[0].copyout()), np.float32).reshape(128, 256), a @ b, rtol=1e-5, atol=1e-4)
  with pytest.raises(ValueError, match="BLOCK"): apply_opt(it.ast, Opt("BLOCK", 0, 128))   # (3 is an overlapping BLOCK: test_tiles.py)


def test_expression_operand_is_computed_once_by_the_pack():
  """A matmul whose row operand is a fused expression (an RMSNorm-like prologue over two buffers): the packing
  kernel evaluates it once (reading both buffers) instead of the matmul re-evaluating it per column block."""
  x, g, w = rand(64, 96), rand(96), rand(256, 96)
  tx, tg, tw = (Tensor(v, device="CPU").realize() for v in (x, g, w))
  t = (tx * (tx * tx).mean(-1, keepdim=True).add(1e-5).rsqrt() * tg) @ tw.T
  *pre, it = t.schedule()
  for p in pre: lower_item(p).run()
  pks, _ = packs_and_main(t)
  assert any(len(p.bufs) >= 3 for p in pks)  # the expression's buffers feed the packing kernel
  ref = (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g) @ w.T
  ei = lower_item(it)
  ei.run()
  np.testing.assert_allclose(np.frombuffer(bytes(ei.bufs[0].copyout()), np.float32).reshape(64, 256), ref, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_16bit_inputs_float32_accumulation(dt: str):
  """matmul(dtype=float32) of 16-bit inputs multiplies in float32 (exact products, as torch does): each product
  (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 keeps its 2^-14, which a 16-bit product rounds away, so 256 of them sum to
  260 + 2^-6 exactly (260 with 16-bit products). The packing kernels convert the operands to float32 once."""
  a = np.full((64, 256), 1 + 2.0 ** -7, np.float32)
  t = Tensor(a, device="CPU").cast(dt).matmul(Tensor(a.T.copy(), device="CPU").cast(dt), dtype="float32")
  got = t.numpy()
  assert got.dtype == np.float32 and np.all(got == np.float32(260 + 2.0 ** -6)), got.flat[0]
  r = Tensor(rand(128, 64), device="CPU").cast(dt).realize()
  s = Tensor(rand(64, 512), device="CPU").cast(dt).realize()
  u = r.matmul(s, dtype="float32")
  assert len(packs_and_main(u)[0]) == 2  # both operands converted by packing kernels
  ref = r.cast("float32").numpy().astype(np.float64) @ s.cast("float32").numpy().astype(np.float64)
  np.testing.assert_allclose(u.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_strided_rows_of_a_skinny_matmul_are_prefetched():
  """8 rows x 1024 columns: B is not packed (one row block) and its rows are 4 KiB apart, past what the hardware
  prefetcher follows: the CPU renderer prefetches PREFETCH_TRIPS (16) rows ahead. Values unchanged."""
  a, b = rand(8, 64), rand(64, 1024)
  t = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize()
  assert not packed(t)
  it = t.schedule()[-1]
  assert f"+ {16 * 4096});" in runner_of(it).spec.src
  ast = it.ast
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-5, atol=1e-4)
  ren = Device["CPU"].renderer
  old, ren.prefetch_trips = ren.prefetch_trips, 0
  try: assert f"+ {16 * 4096});" not in get_program(ast, ren).src
  finally: ren.prefetch_trips = old



def _dequant_matmul(m: int) -> tuple[Tensor, np.ndarray]:
  """x (m, 96) @ W.T with W a dequantization expression (int8 codes times a per-row scale), as the LLM's weights are;
  with numpy's result."""
  codes, scale, x = RNG.integers(-8, 8, (256, 96)).astype(np.int8), rand(256, 1), rand(m, 96)
  tc, ts, tx = (Tensor(v, device="CPU").realize() for v in (codes, scale, x))
  return tx @ (tc.cast("float32") * ts).T, x @ (codes.astype(np.float32) * scale).T


def test_expression_column_operand_packed_only_when_rows_reuse_it(host_caps):
  # regression: a batched decode step (4 rows) packed every dequantized weight into a float32 scratch buffer per step,
  # 4 bytes written and read per weight for 4 rows of reuse: 4 concurrent LLM streams ran at 0.66x one stream
  from plugrad.codegen.heuristic import heuristic_opts
  for m, want in ((4, False), (8, False), (64, True)):
    t, ref = _dequant_matmul(m)
    assert any(o.kind == "PACK" for o in heuristic_opts(unoptimized_kernel(t), host_caps())) is want, m
    if not want: assert 256 * 96 not in packed_sizes(t), m   # this host: the (256, 96) codes are not (x's rows may be)
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-5, atol=1e-4)


def _column_lanes(t: Tensor) -> tuple[int, bool]:
  """(packs, whether the lanes run along the output's last axis) of `t`'s last kernel under the heuristic."""
  from plugrad.codegen.facts import ranges_of
  from plugrad.codegen.heuristic import heuristic_opts
  ast = unoptimized_kernel(t)
  opts = heuristic_opts(ast, Device["CPU"].renderer.caps)
  col = max(r.arg[0] for r in ranges_of(ast).values() if r.arg[1] == "global")
  return sum(o.kind == "PACK" for o in opts), any(o.kind == "VECTOR" and o.rid == col for o in opts)


def test_projection_split_into_heads_and_attention_scores_get_the_column_panel_tile():
  """Two matmuls whose column operand also moves with another output axis: an attention projection reshaped to
  (B, T, heads, head_dim) (the heads range belongs to the weight) and the scores q @ k.T of (B, heads, T, D) (batch
  and heads move both operands). Before, neither counted as a column operand: lanes along the reduce axis with
  horizontal sums, half the speed of the packed column-panel tile (llama training: 5.2 -> 2.0 ms and 1.5 -> 0.75 ms)."""
  x, w = rand(2, 64, 96), rand(96, 96)
  t = (Tensor(x, device="CPU") @ Tensor(w, device="CPU").T).reshape(2, 64, 3, 32)
  assert _column_lanes(t) == (1, True)
  np.testing.assert_allclose(t.numpy(), (x @ w.T).reshape(2, 64, 3, 32), rtol=1e-5, atol=1e-4)
  q, k = rand(2, 3, 64, 32), rand(2, 3, 64, 32)
  t = Tensor(q, device="CPU") @ Tensor(k, device="CPU").transpose(-1, -2)
  assert _column_lanes(t) == (1, True)
  np.testing.assert_allclose(t.numpy(), q @ k.transpose(0, 1, 3, 2), rtol=1e-5, atol=1e-4)
  # a column operand that moves with every row axis too is no panel to reuse: not packed
  a, b = rand(64, 48), rand(64, 48, 32)
  t = (Tensor(a, device="CPU").reshape(64, 48, 1) * Tensor(b, device="CPU")).sum(1)
  assert _column_lanes(t)[0] == 0
  np.testing.assert_allclose(t.numpy(), np.einsum("mk,mkn->mn", a, b), rtol=1e-5, atol=1e-4)


def test_packing_a_row_major_operand_reads_its_rows_in_order():
  """B (k, n) row-major is contiguous along the panel axis: its packing kernel is tiled like a transpose (TILE rows
  of k, then each panel's TILE x P block), so it reads whole rows in order instead of P floats per row a row apart
  (a 4 KiB stride at n = 1024: no hardware prefetch; one thread, 1024^2: 0.90 -> 0.69 ms, 64x4096x4096's 64 MB B
  13.4 -> 10.1 ms). The values are the same either way."""
  from plugrad.codegen.facts import ranges_of
  from plugrad.codegen.heuristic import heuristic_opts
  from plugrad.codegen.facts import contiguous
  from plugrad.codegen.pack import TILE
  a, b = rand(64, 128), rand(128, 256)
  t = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize()
  ast = unoptimized_kernel(t)
  pk = split_packs(ast, heuristic_opts(ast, Device["CPU"].renderer.caps)).packs[0].ast
  rngs = [r for _, r in sorted(ranges_of(pk).items())]
  idx = next(x for x in pk.toposort() if x.op is Ops.LOAD).src[0].src[1]
  assert contiguous(idx, rngs[-1]) and rngs[-2].src[0].arg == TILE and rngs[-3].src[0].arg == 256 // rngs[-1].src[0].arg
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("lanes,regs", [(8, 16), (16, 32)])
def test_expression_weight_not_packed_for_few_rows_when_its_columns_are_split(lanes: int, regs: int, host_caps):
  # regression: a batched decode step's q projection (4 rows, its 576 columns split 9 heads x 64) counted the heads as
  # row blocks (4 x 9 / 4 = 9 >= 8) and packed the dequantized weight into float32 every step on an AVX2 host: 196 us
  # per layer, 5.9 of a 25 ms step. Only the rows reuse the weight: one row block, no PACK.
  from plugrad.codegen.heuristic import heuristic_opts
  codes, scale, x = RNG.integers(-8, 8, (576, 96)).astype(np.int8), rand(576, 1), rand(4, 96)
  w = Tensor(codes, device="CPU").realize().cast("float32") * Tensor(scale, device="CPU").realize()
  t = (Tensor(x, device="CPU").realize().reshape(4, 1, 1, 96) * w.reshape(1, 9, 64, 96)).sum(-1)
  assert not any(o.kind == "PACK" for o in heuristic_opts(unoptimized_kernel(t), host_caps(lanes=lanes, regs=regs)))
  np.testing.assert_allclose(t.numpy(), (x @ (codes.astype(np.float32) * scale).T).reshape(4, 9, 64), rtol=1e-5, atol=1e-4)


# ---- a packed operand over half of L3: packed and summed in chunks of the reduce axis (heuristic.pack_chunks) ----

@pytest.fixture
def small_l3(cpu_host):
  """The CPU device as an AVX2, then an AVX-512 host (`cpu_host`) with a 256 KiB L3, so small matmuls take the
  chunked path (the fixture restores the record and forgets the schedules made with it)."""
  ren = Device["CPU"].renderer
  ren.caps = dataclasses.replace(ren.caps, cache_bytes=(32 << 10, 128 << 10, 256 << 10))
  yield


def chunk_arg(m: int, k: int, n: int, caps) -> tuple:
  ast = unoptimized_kernel(Tensor.empty(m, k, device="CPU") @ Tensor.empty(k, n, device="CPU"))
  return next(o.arg for o in heuristic_opts(ast, caps) if o.kind == "PACK")


def test_skinny_matmul_packs_in_chunks_of_the_reduce_axis_on_both_hosts(cpu_host):
  """32 x 4096 x 4096 with a 32 MiB L3: the 64 MiB packed B is packed and summed in 16 chunks of 256 rows (4 MiB, an
  eighth of L3) on AVX2 and AVX-512 records; a square 4096 product isn't chunked (its output's extra round trips
  would cost more), nor is a product whose packed operand fits in half of L3, nor one on a host of unknown L3."""
  caps = dataclasses.replace(Device["CPU"].renderer.caps, cache_bytes=(32 << 10, 512 << 10, 32 << 20))
  assert chunk_arg(32, 4096, 4096, caps) == (16,)
  assert chunk_arg(4096, 4096, 4096, caps) == ()
  assert chunk_arg(32, 1024, 4096, caps) == ()
  assert chunk_arg(32, 4096, 4096, dataclasses.replace(caps, cache_bytes=(32 << 10, 512 << 10, 0))) == ()  # unknown L3


@pytest.mark.parametrize("m,k,n", [(32, 512, 256), (48, 1024, 256), (48, 768, 512)])
def test_chunked_pack_matches_numpy(small_l3, m: int, k: int, n: int):
  a, b = rand(m, k), rand(k, n)
  t = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize()
  arg = chunk_arg(m, k, n, Device["CPU"].renderer.caps)
  assert arg and arg[0] > 1
  kernels = [it for it in t.schedule() if it.ast.op is Ops.SINK]
  assert len(kernels) == 2 * arg[0]   # a pack and a sum per chunk
  assert all(any(b.op is Ops.BUFFER_VIEW for b in it.bufs) for it in kernels[2:])  # later chunks read views of A and B
  np.testing.assert_allclose(t.numpy(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_chunked_pack_of_an_intermediate(small_l3):
  """A chunked product's output is an intermediate (its buffer placed through the chunks' views) read by a second
  product (x @ W.T), right again after a re-run."""
  a, b, w = rand(32, 512), rand(512, 256), rand(64, 256)
  ta, tb, tw = (Tensor(x, device="CPU").realize() for x in (a, b, w))
  for _ in range(2):
    out = ((ta @ tb) @ tw.T).numpy()
    np.testing.assert_allclose(out, (a.astype(np.float64) @ b) @ w.T, rtol=1e-4, atol=1e-3)
  assert chunk_arg(32, 512, 256, Device["CPU"].renderer.caps) == (8,)


def test_chunked_pack_refused_with_an_epilogue(small_l3):
  """An epilogue (relu of the sum) must see the whole sum: such a kernel keeps the whole pack, and stays right."""
  from plugrad.codegen.pack import chunk_reduce
  a, b = rand(32, 512), rand(512, 256)
  ta, tb = Tensor(a, device="CPU").realize(), Tensor(b, device="CPU").realize()
  assert chunk_reduce(unoptimized_kernel((ta @ tb).relu()), 4) is None
  assert chunk_reduce(unoptimized_kernel(ta @ tb), 4) is not None
  np.testing.assert_allclose((ta @ tb).relu().numpy(), np.maximum(a @ b, 0), rtol=1e-5, atol=1e-4)


def test_chunked_pack_with_overlapping_row_tiles(small_l3, cpu_host):
  """64 rows: the AVX2 tile of 6 rows overlaps its last block (UPCAST_OVERLAP computes 2 rows twice). Each later chunk
  reads the sum so far from the buffer the chunk before wrote and stores into the other one, so a row computed twice
  is stored twice with the same value, not added twice."""
  a, b = rand(64, 512), rand(512, 256)
  opts = heuristic_opts(unoptimized_kernel(Tensor.empty(64, 512, device="CPU") @ Tensor.empty(512, 256, device="CPU")), Device["CPU"].renderer.caps)
  assert next(o.arg for o in opts if o.kind == "PACK")[0] > 1
  assert any(o.kind == "UPCAST_OVERLAP" for o in opts) == (cpu_host == "avx2")
  t = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize()
  np.testing.assert_allclose(t.numpy(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_repeated_chunked_product_runs_from_a_plan(small_l3):
  """The chunks read views of the inputs; the realize plan (engine/plan.py) holds those as ranges of its leaves, so
  a repeated product skips scheduling, with new values each time."""
  from plugrad.engine.plan import PLAN_STATS
  b = rand(512, 256)
  tb = Tensor(b, device="CPU").realize()
  hits = PLAN_STATS["hits"]
  for _ in range(4):
    a = rand(32, 512)
    np.testing.assert_allclose((Tensor(a, device="CPU").realize() @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-4)
  assert PLAN_STATS["hits"] - hits >= 2


def test_jit_replays_a_chunked_pack_with_new_inputs(small_l3):
  @TinyJit
  def f(x: Tensor, y: Tensor) -> Tensor: return (x @ y).realize()
  for _ in range(4):
    a, b = rand(32, 512), rand(512, 256)
    np.testing.assert_allclose(f(Tensor(a, device="CPU"), Tensor(b, device="CPU")).numpy(), a @ b, rtol=1e-5, atol=1e-4)
  assert sum(ei.runner is not None and ei.runner.spec.name.startswith("r_") for ei in f.captured) > 1


def test_beam_times_every_chunk(small_l3):
  ast = unoptimized_kernel(Tensor.empty(32, 512, device="CPU") @ Tensor.empty(512, 256, device="CPU"))
  opts = heuristic_opts(ast, Device["CPU"].renderer.caps)
  bufs = search.scratch_buffers(ast, "CPU")
  one = [o if o.kind != "PACK" else Opt("PACK", o.rid, o.amount) for o in opts]
  assert any(o.arg for o in opts) and search._time(ast, opts, "CPU", bufs) < float("inf") > search._time(ast, one, "CPU", bufs)


def pack_ids(m: int, k: int, n: int, caps) -> list[int]:
  """The range ids the heuristic packs along for an m x k @ k x n product (1: the columns, B; 0: the rows, A)."""
  ast = unoptimized_kernel(Tensor.empty(m, k, device="CPU") @ Tensor.empty(k, n, device="CPU"))
  return sorted(o.rid for o in heuristic_opts(ast, caps) if o.kind == "PACK")


def test_row_operand_with_page_aliased_rows_is_packed_too(cpu_host):
  """A's rows 4 KiB apart (K = 1024, 2048 floats) put the tile's rows in the same cache sets: A is packed as well, on
  AVX2 and AVX-512 records. Not for rows 2 KiB apart (K = 512), nor where L3 row blocking streams A (2048 and 4096
  square, A over a quarter of L3), nor for a chunked product (a pack a chunk would cost a launch a chunk); values stay
  right."""
  caps = dataclasses.replace(Device["CPU"].renderer.caps, cache_bytes=(32 << 10, 512 << 10, 32 << 20))
  assert pack_ids(1024, 1024, 1024, caps) == [0, 1] and pack_ids(2048, 2048, 2048, caps) == [1]
  assert pack_ids(512, 512, 512, caps) == [1]
  assert pack_ids(4096, 4096, 4096, caps) == [1]
  assert pack_ids(64, 4096, 4096, caps) == [1]
  a, b = rand(96, 1024), rand(1024, 256)
  t = Tensor(a, device="CPU").realize() @ Tensor(b, device="CPU").realize()
  assert packed_sizes(t) == {96 * 1024, 1024 * 256}
  np.testing.assert_allclose(t.numpy(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def col_vectors(t: Tensor, caps) -> int:
  """The column vectors of a row of `t`'s matmul tile (the UPCAST of the vector range; 1 without one)."""
  opts = heuristic_opts(unoptimized_kernel(t), caps)
  vr = next(o.rid for o in opts if o.kind == "VECTOR")
  return next((o.amount for o in opts if o.kind == "UPCAST" and o.rid == vr), 1)


@pytest.mark.parametrize("shape", ["scores", "x@W"])
def test_three_vector_panels_when_two_do_not_divide_the_columns(cpu_host, shape: str):
  """Columns that are an odd number of vectors but a multiple of 3 (456 = 57 x 8, 72 = 9 x 8, 144 = 9 x 16) get a tile
  row of 3 vectors (4 x 3 on AVX2, 8 x 3 on AVX-512), packed in panels of 3 vectors where the operand needs packing
  (attention scores x @ y.T, y read along the reduce axis), instead of 1 vector or lanes along the reduce axis
  (1024x512x456: 5.7 -> 2.6 ms; scores over 456 keys, 4 heads: 3.0 -> 2.4-2.8 ms); an even number of vectors keeps 2.
  Values against numpy on AVX2 and AVX-512 records (456 keys aren't whole 16-lane vectors: no tile asserted there)."""
  caps = Device["CPU"].renderer.caps
  lanes = caps.vector_lanes
  if shape == "scores": a, b = rand(4, 96, 256), rand(57 * 8, 256)
  else: a, b = rand(96, 128), rand(128, 9 * lanes)
  ta, tb = Tensor(a, device="CPU").realize(), Tensor(b, device="CPU").realize()
  t = ta @ (tb.T if shape == "scores" else tb)
  if shape != "scores" or lanes == 8: assert col_vectors(t, caps) == 3
  np.testing.assert_allclose(t.numpy(), a @ (b.T if shape == "scores" else b), rtol=1e-5, atol=1e-4)
  even = Tensor(rand(96, 128), device="CPU").realize() @ Tensor(rand(128, 8 * lanes), device="CPU").realize()
  assert col_vectors(even, caps) == 2
