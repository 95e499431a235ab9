"""The LLM's weight repacking (block scales decoded once at load, quants in their own arrays, Q5's high bits spread)
against the `gguf` package's own dequantize, bit for bit, for every GGUF quantization type, over random blocks
(hypothesis); and the matrix-vector / matrix-matrix products that fuse the repacked dequantization against float64."""
import math
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_helpers import tiny_config, tiny_weights

from plugrad import TinyJit
from plugrad.apps.llm.generate import Generator
from plugrad.device import Device, canonicalize
from plugrad.apps.llm.model import Transformer, linear
from plugrad.apps.llm.quant import (_REPACKABLE, _repack_blocks, activation_bits, blockwise_linear, blockwise_of, dot2_linear, dot4_bound,
                                    dot4_linear, fits_dot4, has_dot2, prefers_dot4, repack, row_lanes, row_width, rows_linear, vector_lanes,
                                    _round_small, quantize16)
from plugrad.codegen import get_program
from plugrad.engine.realize import buffer_for, runner_of
from plugrad.nn.serialize import dequantize
from plugrad.uop.buffers import buffer_of, is_buffer_view
from plugrad.tensor import Tensor
from plugrad.uop.ops import GroupOp, Ops
from plugrad.dtype import dtypes
from plugrad.uop.symbolic import sym_infer

GEOMETRY = {q: g for g, q in _REPACKABLE.items()}   # type -> (elements, bytes) per block
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,),
              "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
QTYPES = list(GEOMETRY)
# Q4/Q5 codes pair blocks and Q5 high bits share 8 blocks across rows: odd block counts (rows x blocks) too
SHAPES = [(q, 4) for q in QTYPES] + [("Q5_0", 3), ("Q5_1", 5), ("Q4_0", 3), ("Q4_1", 5)]


@pytest.fixture(autouse=True)
def default_products(monkeypatch):
  """These tests are of the default layout and products: a shell's ACT_BITS=8, DOT2=0 or ROW_LANES=0 (which change
  both) doesn't apply to them; a test of another setting sets it itself."""
  for key in ("ACT_BITS", "DOT2", "ROW_LANES"): monkeypatch.delenv(key, raising=False)


def bits(a: np.ndarray) -> np.ndarray:
  """float32 bit patterns, every NaN as one pattern (payloads aren't part of the contract)."""
  return np.where(np.isnan(a), np.float32(np.nan), a).astype(np.float32).view(np.uint32)


def packed(blocks: np.ndarray, qtype: str, rows: int) -> Tensor:
  u = dequantize(Tensor(blocks).realize(), qtype).reshape(rows, -1).uop
  p = repack(u)
  assert p is not u, f"{qtype} was not repacked"
  return Tensor(p)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # gguf multiplies nan/inf scales of random blocks
@pytest.mark.parametrize("qtype,row_blocks", SHAPES)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_repack_is_bit_exact(qtype, row_blocks, data):
  elems, tsize = GEOMETRY[qtype]
  rows = 2
  raw = data.draw(st.binary(min_size=rows * row_blocks * tsize, max_size=rows * row_blocks * tsize))
  blocks = np.frombuffer(raw, np.uint8).reshape(rows * row_blocks, tsize).copy()
  ref = gguf.quants.dequantize(blocks.reshape(rows, -1), getattr(gguf.GGMLQuantizationType, qtype))
  np.testing.assert_array_equal(bits(packed(blocks, qtype, rows).numpy()), bits(ref), err_msg=f"repacked {qtype}")
  base = dequantize(Tensor(blocks).realize(), qtype).reshape(rows, -1).numpy()   # the loader's own dequantization too
  np.testing.assert_array_equal(bits(base), bits(ref), err_msg=f"dequantize {qtype}")


@pytest.mark.parametrize("qtype,nblocks", [("Q4_0", 3), ("Q4_1", 1), ("Q5_0", 5), ("Q5_1", 9)])
def test_repack_odd_block_counts(qtype, nblocks):
  """Block counts that don't fill the last 32-byte pair of nibbles or group of 8 fifth bits (one row): the padding
  never shows, values bit-identical to the `gguf` package's."""
  elems, tsize = GEOMETRY[qtype]
  blocks = finite_blocks(qtype, nblocks, np.random.default_rng(nblocks))
  ref = gguf.quants.dequantize(blocks.reshape(1, -1), getattr(gguf.GGMLQuantizationType, qtype))
  np.testing.assert_array_equal(bits(packed(blocks, qtype, 1).numpy()), bits(ref))


# the repacked layout's bits a weight: the file's (scales kept as float16, the sub-block scales of Q3_K-Q5_K as bytes:
# 1/8 bit more than the file's 6-bit packing), Q6_K's codes a byte each (its decode product is compute-bound on 6 bits)
REPACKED_BITS = {q: GEOMETRY[q][1] * 8 / GEOMETRY[q][0] + (0.125 if q in ("Q3_K", "Q4_K", "Q5_K") else 0) for q in QTYPES} | {"Q6_K": 8.5625}
# output rows in vector lanes (Q4_0-Q8_0 and Q4_K-Q6_K on a dot2 host, rows a multiple of the lanes) keep Q4_0-Q8_0's
# float16 scales and mins (converted 8 or 16 at a time where read) and store the K types' super-block ones as float32:
# 16 bits more a super-block for each
ROW_LANE_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
ROW_LANES_BITS = {q: REPACKED_BITS[q] + (16 * len(F16_FIELDS[q]) / GEOMETRY[q][0] if q.endswith("_K") else 0) for q in ROW_LANE_TYPES}


def bw_sub_block(qtype: str) -> int:
  """The elements a sub-block of `qtype` has (one scale each): 16 for Q2_K, Q3_K and Q6_K, else 32."""
  return 16 if qtype in ("Q2_K", "Q3_K", "Q6_K") else 32


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # gguf multiplies nan/inf scales of random blocks
@pytest.mark.parametrize("qtype", ROW_LANE_TYPES)
@pytest.mark.parametrize("width", [2, 4])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example, HealthCheck.data_too_large])
@given(data=st.data())
def test_row_lanes_repack_is_bit_exact(qtype, width, data):
  """Arbitrary blocks (non-finite scales included) of a weight stored output rows in lanes, as pairs of codes (int16
  activations) and as quads of unsigned codes (int8 activations): bit-identical to the `gguf` package's dequantize,
  the K types' sub-block scales included."""
  elems, tsize = GEOMETRY[qtype]
  rows, row_blocks = row_lanes("CPU"), 2
  raw = data.draw(st.binary(min_size=rows * row_blocks * tsize, max_size=rows * row_blocks * tsize))
  blocks = np.frombuffer(raw, np.uint8).reshape(rows * row_blocks, tsize).copy()
  ref = gguf.quants.dequantize(blocks.reshape(rows, -1), getattr(gguf.GGMLQuantizationType, qtype))
  bw = _repack_blocks(blocks, qtype, rows, rows, width)
  assert bw.rows is not None and bw.rows.width == width
  np.testing.assert_array_equal(bits(bw.dense().reshape(rows, -1).numpy()), bits(ref), err_msg=f"rows-in-lanes {qtype}")


@pytest.mark.parametrize("rows", [8, 16])
@pytest.mark.parametrize("qtype", QTYPES)
def test_repacked_weight_bytes(qtype, rows, cpu_host):
  """The buffers a repacked weight reads hold its file's bytes, give or take the K types' sub-block scale bytes
  (float32 scales had cost Q4_K 6 bits a weight against the file's 4.5, and qwen2's decode ~40 MB a token) and the
  rows-in-lanes layout's float32 super-block scales of the K types, which a host takes where its lanes divide the rows:
  8 and 16 rows on AVX2 (8 lanes), 16 on AVX-512 (16 lanes)."""
  elems, tsize = GEOMETRY[qtype]
  row_blocks = 4
  blocks = np.random.default_rng(0).integers(0, 256, (rows * row_blocks, tsize), dtype=np.uint8)
  w = packed(blocks, qtype, rows)
  lanes = {"avx2": 8, "avx512": 16}[cpu_host]
  assert row_lanes("CPU") == lanes and (blockwise_of(w.uop).rows is not None) is (qtype in ROW_LANES_BITS and rows % lanes == 0)
  bases = {buffer_of(n) for n in w.uop.toposort() if is_buffer_view(n)}
  want = ROW_LANES_BITS[qtype] if blockwise_of(w.uop).rows is not None else REPACKED_BITS[qtype]
  assert sum(math.prod(b.shape) * b.dtype.itemsize for b in bases) * 8 / (rows * row_blocks * elems) == want


def finite_blocks(qtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
  b = rng.integers(0, 256, (n, GEOMETRY[qtype][1]), dtype=np.uint8)
  for off in F16_FIELDS[qtype]: b[:, off:off + 2] = rng.uniform(-2, 2, n).astype(np.float16).view(np.uint8).reshape(-1, 2)
  return b


def quantized_weight(qtype: str, rows: int, cols: int, seed: int) -> tuple[Tensor, np.ndarray, np.random.Generator]:
  """A repacked (rows, cols) weight of random finite blocks, the `gguf` package's float64 dequantization of it, and
  the generator it was drawn from (for the test's inputs)."""
  rng = np.random.default_rng(seed)
  blocks = finite_blocks(qtype, rows * cols // GEOMETRY[qtype][0], rng)
  ref = gguf.quants.dequantize(blocks.reshape(rows, -1), getattr(gguf.GGMLQuantizationType, qtype)).astype(np.float64)
  return packed(blocks, qtype, rows), ref, rng


@pytest.mark.parametrize("qtype", QTYPES)
def test_fused_products_match_float64(qtype):
  """One token (the decode matvec, dequantization fused), 5 tokens fused (short prefill) and 5 tokens through the
  dequantized (in, out) buffer (long prefill), against float64."""
  rows, cols = 12, 4 * 256
  w, ref, rng = quantized_weight(qtype, rows, cols, sum(map(ord, qtype)))
  x = rng.standard_normal((1, 5, cols)).astype(np.float32)
  want = x.astype(np.float64) @ ref.T
  tol = dict(rtol=1e-4, atol=1e-4 * np.abs(ref).max() * np.sqrt(cols))
  np.testing.assert_allclose(Tensor(x[:, :1]).linear(w.transpose()).numpy(), want[:, :1], **tol, err_msg="matvec")
  np.testing.assert_allclose(Tensor(x).linear(w.transpose()).numpy(), want, **tol, err_msg="fused matmul")
  np.testing.assert_allclose(linear(Tensor(x), w).numpy(), want, **tol, err_msg="matmul through the dequantized buffer")


@pytest.mark.parametrize("qtype", QTYPES)
def test_blockwise_products_match_float64(qtype):
  """The per-sub-block product (`quant.blockwise_linear`: codes summed against x, scales once per sub-block and lane)
  of one token and of a batch of 3 rows of one token (the batched decode step), with a bias, for the lane counts of
  SSE/NEON, AVX2 and AVX-512, against float64; `linear` takes it for one token on a device with lanes."""
  rows, cols = 12, 2 * 256
  w, ref, rng = quantized_weight(qtype, rows, cols, sum(map(ord, qtype)) + 2)
  bw = blockwise_of(w.uop)
  assert bw is not None
  x, b = rng.standard_normal((3, 1, cols)).astype(np.float32), rng.standard_normal(rows).astype(np.float32)
  want = x.astype(np.float64) @ ref.T + b
  tol = dict(rtol=1e-4, atol=1e-4 * np.abs(ref).max() * np.sqrt(cols))
  for lanes in (4, 8, 16):
    for xs in (x[:1], x):
      got = blockwise_linear(Tensor(xs), bw, rows, lanes, Tensor(b)).numpy()
      np.testing.assert_allclose(got, want[:len(xs)], **tol, err_msg=f"{lanes} lanes, {len(xs)} rows")
      got = dot2_linear(Tensor(xs), bw, rows, lanes, Tensor(b)).numpy()   # x quantized to int16: 2^-16 of a sub-block's max
      np.testing.assert_allclose(got, want[:len(xs)], **tol, err_msg=f"dot2, {lanes} lanes, {len(xs)} rows")
  np.testing.assert_allclose(linear(Tensor(x[:1]), w, Tensor(b)).numpy(), want[:1], **tol, err_msg="linear")
  with pytest.raises(ValueError, match="don't fit"): blockwise_linear(Tensor(x[:1, :, :-32]), bw, rows, 8)
  with pytest.raises(ValueError, match="don't fit"): blockwise_linear(Tensor(x[:1]), bw, rows + 1, 8)


def int8_activations(x: np.ndarray, S: int) -> np.ndarray:
  """x (..., K) quantized to int8 per sub-block of S and dequantized, in float64 (llama.cpp's Q8 activations: scale
  max |x| / 127, codes rounded half to even)."""
  xr = x.astype(np.float64).reshape(*x.shape[:-1], -1, S)
  dx = np.abs(xr).max(-1, keepdims=True).astype(np.float32) * np.float32(1 / 127)
  inv = np.where(dx > 0, np.float32(127) / (dx * np.float32(127)), 0).astype(np.float32)
  return (np.round(xr.astype(np.float32) * inv) * dx.astype(np.float64)).reshape(x.shape)


DOT4_TYPES = [q for q in QTYPES if GEOMETRY[q][0] == 32 or q in ("Q4_K", "Q5_K")]   # sub-blocks of 32


@pytest.mark.parametrize("qtype", DOT4_TYPES)
def test_dot4_products_are_w_times_int8_x(qtype):
  """`dot4_linear` (ACT_BITS=8, llama.cpp's numerics) is exactly w times x quantized to int8 per sub-block (float64
  oracle of that quantization: agreement to float32 rounding, while the int8 error itself is ~1e-2 of the outputs),
  for 1 and 3 rows, with a bias, for the lane counts of SSE/NEON, AVX2 and AVX-512; on a host with byte dot products
  the kernel multiplies with WMMA "DOT4" (pg_dot4)."""
  rows, cols = 12, 2 * 256
  w, ref, rng = quantized_weight(qtype, rows, cols, sum(map(ord, qtype)) + 4)
  bw = blockwise_of(w.uop)
  x, b = rng.standard_normal((3, 1, cols)).astype(np.float32), rng.standard_normal(rows).astype(np.float32)
  want = int8_activations(x, 32) @ ref.T + b
  scale = np.abs(ref).max() * np.abs(x).max() * np.sqrt(cols)
  for lanes in (4, 8, 16):
    for xs in (x[:1], x):
      got = dot4_linear(Tensor(xs), bw, rows, lanes, Tensor(b)).numpy()
      np.testing.assert_allclose(got, want[:len(xs)], rtol=1e-5, atol=1e-6 * scale, err_msg=f"{lanes} lanes, {len(xs)} rows")
  exact = x.astype(np.float64) @ ref.T + b
  assert np.abs(want - exact).max() > 1e-4 * np.abs(exact).max()   # (the oracle differs from the exact product)


@pytest.mark.parametrize("qtype", DOT4_TYPES)
def test_dot4_kernel_multiplies_bytes(qtype, cpu_host):
  """`dot4_linear`'s kernel multiplies with WMMA "DOT4" (pg_dot4) where the host's byte dot product holds the
  weight's unsigned codes: every sub-block-32 type on AVX-512 VNNI (codes up to 255), all but Q8_0 (its codes, offset
  by 128, reach 255) on AVX2, whose pmaddubsw saturates past 127."""
  w, _, rng = quantized_weight(qtype, 12, 256, 4)   # 12 rows: the sub-block layout on both (the one ACT_BITS=8 loads)
  bw = blockwise_of(w.uop)
  fits = fits_dot4(bw, dot4_bound("CPU"))
  assert fits is (qtype != "Q8_0" or cpu_host == "avx512")
  x = Tensor(rng.standard_normal((1, 1, 256)).astype(np.float32))
  srcs = [runner_of(it).spec.src for it in dot4_linear(x, bw, 12, vector_lanes("CPU")).schedule() if it.ast.op is Ops.SINK]
  assert any("pg_dot4_" in s for s in srcs) is fits


def test_act_bits_chooses_the_product(monkeypatch, cpu_host):
  """ACT_BITS=8 routes a one-token product of a sub-block-32 weight through int8 products (the byte dot products both
  host kinds have: VNNI's vpdpbusd on AVX-512, pmaddubsw on AVX2: `rows_linear` over quads where the weight is stored
  rows in lanes, `dot4_linear` elsewhere), the default 16 through the int16 products (DOT2:
  `rows_linear` where the weight is stored rows in lanes, which an AVX2 host's 8 lanes do for 8 rows, `dot2_linear`
  elsewhere); another value is refused with its name when a weight is loaded. ACT_BITS is read at load (the layout), so
  each setting gets its own weight, as the app loads it."""
  rows, cols = 8, 256
  dev = "CPU"
  def kernels(w: Tensor) -> str:
    return " ".join(runner_of(it).spec.src for it in linear(x, w).schedule() if it.ast.op is Ops.SINK)
  w, ref, rng = quantized_weight("Q4_0", rows, cols, 3)
  x = Tensor(rng.standard_normal((1, 1, cols)).astype(np.float32))
  assert activation_bits() == 16 and dot4_bound(dev) == {"avx2": 127, "avx512": 255}[cpu_host]
  assert (blockwise_of(w.uop).rows is not None) is (cpu_host == "avx2")
  assert "pg_dot2_" in kernels(w) and "pg_dot4_" not in kernels(w)
  monkeypatch.setenv("ACT_BITS", "8")
  w, ref, _ = quantized_weight("Q4_0", rows, cols, 3)
  bw = blockwise_of(w.uop)   # (8 rows: quads of rows in lanes on AVX2, the sub-block layout on AVX-512)
  assert (bw.rows is not None and bw.rows.width == 4) if cpu_host == "avx2" else (bw.rows is None and prefers_dot4(bw, dot4_bound(dev)))
  assert "pg_dot4_" in kernels(w)
  np.testing.assert_allclose(linear(x, w).numpy()[0, 0], int8_activations(x.numpy(), 32)[0, 0] @ ref.T, rtol=1e-5, atol=1e-5 * np.abs(ref).max() * 16)
  monkeypatch.setenv("ACT_BITS", "4")
  with pytest.raises(ValueError, match="ACT_BITS must be 8 or 16"): quantized_weight("Q4_0", rows, cols, 3)   # at load


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-(2.0 ** 22) + 1, 2.0 ** 22 - 1, width=32), min_size=1, max_size=64), st.integers(-2 ** 21, 2 ** 21))
def test_activation_codes_round_half_to_even(vals, half):
  """The activations' codes round as `Tensor.round` does (half to even, numpy's rint), through the two adds of
  `_round_small`, for every float32 the quantizers can scale to (|v| < 2^22), exact halves included; a C compiler
  or a rewrite that folded (v + c) - c into v would fail this."""
  v = np.array(vals + [half + 0.5, -half - 0.5, 0.5, -0.5, 1.5, 2.5], np.float32)
  np.testing.assert_array_equal(_round_small(Tensor(v)).numpy(), np.rint(v))
  x = np.random.default_rng(len(vals)).standard_normal((2, 64)).astype(np.float32)
  xq, dx = quantize16(Tensor(x), 32)
  amax = np.abs(x.reshape(2, 2, 32)).max(-1, keepdims=True)
  want = np.rint(x.reshape(2, 2, 32) * np.where(amax > 0, np.float32(32767) / amax, np.float32(0)))
  np.testing.assert_array_equal(xq.numpy().reshape(2, 2, 32), want.astype(np.int16))


@pytest.mark.parametrize("qtype", ["Q4_1", "Q6_K"])
def test_dot2_products_of_zero_and_non_finite_activations(qtype):
  """`dot2_linear`'s int16 activations: an all-zero sub-block gives exact zeros (its scale is 0, not 0/0), a NaN or
  an inf in x makes the outputs non-finite as float arithmetic would, never a finite wrong number."""
  rows, cols = 8, 256
  w, ref, rng = quantized_weight(qtype, rows, cols, 7)
  bw = blockwise_of(w.uop)
  x = np.zeros((1, 1, cols), np.float32)
  np.testing.assert_array_equal(dot2_linear(Tensor(x), bw, rows, 8).numpy(), np.zeros((1, 1, rows), np.float32))
  x[0, 0, :32] = rng.standard_normal(32)   # the other sub-blocks stay zero
  np.testing.assert_allclose(dot2_linear(Tensor(x), bw, rows, 8).numpy()[0, 0], ref[:, :32] @ x[0, 0, :32].astype(np.float64),
                             rtol=1e-4, atol=1e-4 * np.abs(ref).max())
  for bad in (np.nan, np.inf):
    x[0, 0, 40] = bad
    assert not np.isfinite(dot2_linear(Tensor(x), bw, rows, 8).numpy()).any(), bad


def test_decode_matvec_scales_once_per_sub_block(cpu_host):
  """Regression (decode on an AVX2 host at 0.78x llama.cpp): the one-token product of a Q4_1 weight multiplied every
  code by its scale and added its min before the FMA, 4 float operations per weight; per sub-block it is one FMA per
  weight plus the scale once per lane and sub-block (ProgramSpec.flops over the weight count, at most 2 + 1/chunks
  + 0.1: 2.35 with AVX2's 8 lanes, 2.6 with AVX-512's 16) on a device with SIMD lanes. With pairwise int16
  multiply-adds (`dot2`), `linear` multiplies the codes in int16 lanes: a WMMA "DOT2" per 2 * lanes weights and at most 4
  float vector ops per sub-block (the scales, once per sub-block and lane)."""
  dev = "CPU"
  rows, cols = 64, 4 * 256
  w = packed(finite_blocks("Q4_1", rows * cols // 32, np.random.default_rng(5)), "Q4_1", rows)
  x = Tensor(np.ones((1, 1, cols), np.float32))
  y = blockwise_linear(x, blockwise_of(w.uop), rows, vector_lanes(dev))
  flops = [runner_of(it).spec.flops for it in y.schedule() if it.ast.op is Ops.SINK]
  chunks = 32 // math.gcd(32, max(vector_lanes(dev), 8))   # a sub-block's chunks of lanes (2 on AVX-512, 4 on AVX2)
  assert max(flops) <= (2 + 1 / chunks + 0.1) * rows * cols, (flops, rows * cols)   # the scale once a lane and sub-block
  assert has_dot2(dev)
  # the linear uops of the kernels the engine runs: rendered again (runners keep only the source), the same program
  its = [it for it in linear(x, w).schedule() if it.ast.op is Ops.SINK]
  it = max(its, key=lambda i: runner_of(i).spec.flops)
  main = get_program(it.ast, Device[dev].renderer, None if it.opts is None else list(it.opts))
  assert main.src == runner_of(it).spec.src
  dots = sum(u.op is Ops.WMMA and u.arg == "DOT2" for u in main.uops)
  fops = sum(u.op in GroupOp.ALU and dtypes.is_float(u.dtype) and u.dtype.count > 1 for u in main.uops)
  per_sub_block = 32 // (2 * min(vector_lanes(dev), 16))   # DOT2s a sub-block of 32 takes: 2 on AVX2, 1 on AVX-512
  assert dots > 0 and fops <= 4 * dots / per_sub_block, (main.name, dots, fops)


@pytest.mark.parametrize("qtype", ["Q5_0", "Q6_K", "Q8_0"])   # the qwen2 Q4_K_M mix's block weights
def test_long_fused_matmul_packs_the_dequantized_weight(qtype):
  """A long prefill's fused matmul (64 tokens: enough row blocks for PACK) against float64; on a CPU renderer with SIMD
  lanes the dequantized weight is packed by a kernel of its own that runs first (what `fused_long_prefill` relies on)."""
  rows, cols = 64, 2 * 256
  w, ref, rng = quantized_weight(qtype, rows, cols, sum(map(ord, qtype)) + 1)
  x = Tensor(rng.standard_normal((1, 64, cols)).astype(np.float32)).realize()
  jit = TinyJit(lambda x: x.linear(w.transpose()).realize())
  for _ in range(3): out = jit(x).numpy()
  np.testing.assert_allclose(out, x.numpy().astype(np.float64) @ ref.T, rtol=1e-4, atol=1e-4 * np.abs(ref).max() * np.sqrt(cols))
  if Device[canonicalize(Device.DEFAULT)].renderer.caps.vector_lanes >= 2:
    assert len(jit.captured) == 2, [ei.runner.spec.name for ei in jit.captured]   # the packing kernel, then the matmul


def test_long_prefill_takes_the_fused_graph_unless_dense_copies_are_kept(monkeypatch):
  """`fused_long_prefill`: the fused graph for long prefills when the model keeps no dense copies and the device packs
  operands; the dense copies (or PACK=0) keep the (in, out) path, and the Generator's long prefill JIT follows it."""
  cfg = tiny_config("llama")
  w = {k: Tensor(v) for k, v in tiny_weights(cfg, 1, True).items()}
  simd = Device[canonicalize(Device.DEFAULT)].renderer.caps.vector_lanes >= 2
  m = Transformer(cfg, w, max_context=16)
  assert m.fused_long_prefill() is simd
  assert Generator(m).prefill_jit.fn.keywords == {"fused": simd}
  monkeypatch.setenv("PACK", "0")
  assert m.fused_long_prefill() is False
  monkeypatch.delenv("PACK")
  for layer in m.layers: layer.dense[layer.wq] = layer.wq   # as keep_dense_weights leaves it
  assert m.fused_long_prefill() is False


def test_repacked_bytes_stay_close_to_the_file():
  """The repacked arrays of a (4864, 896)-shaped Q5_0 weight (the qwen2-0.5B FFN) take at most 1.1x its blocks."""
  blocks = finite_blocks("Q5_0", 64 * 896 // 32, np.random.default_rng(0))
  w = packed(blocks, "Q5_0", 64)
  nbytes = sum(buffer_for(n).nbytes for n in set(w.uop.toposort()) if n.op is Ops.BUFFER)
  assert nbytes <= 1.1 * blocks.nbytes, (nbytes, blocks.nbytes)


def test_unquantized_weights_are_not_repacked():
  u = Tensor(np.ones((4, 32), np.float32)).realize().uop
  assert repack(u) is u


def test_dense_prefill_weights_give_the_same_logits():
  """Quantized block weights kept as dense float32 copies for prefill (`dense_prefill_bytes`) give the same prefill
  logits as the default (dequantized inside every prefill), and decode still reads the quantized weights."""
  cfg = tiny_config("llama")
  w = tiny_weights(cfg, 5, True)
  def quantized(k: str, v: np.ndarray) -> Tensor:
    if not k.startswith("blk.") or v.ndim != 2 or v.shape[1] % 32: return Tensor(v)
    blocks = gguf.quants.quantize(v.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    return dequantize(Tensor(blocks.reshape(-1, 34)).realize(), "Q8_0").reshape(v.shape)
  models = [Transformer(cfg, {k: quantized(k, v) for k, v in w.items()}, max_context=96, dense_prefill_bytes=b) for b in (0, 1 << 30)]
  assert not any(layer.dense for layer in models[0].layers) and all(layer.dense for layer in models[1].layers)
  toks = [3, 9, 4, 1, 7, 2, 8, 5, 6, 10, 11]
  long = [(7 * i) % 60 + 1 for i in range(70)]   # past SHORT_PREFILL: the (in, out) buffer path
  outs = []
  for m in models:
    g = Generator(m)
    outs.append((g.forward(toks, 0), g.forward([12], len(toks)), g.forward(long, 0)))
  for a, b in zip(*outs): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_embedding_rows_from_the_quantized_table():
  """Token embeddings are gathered from the quantized table by a kernel (EMBED_ROWS rows per call), bit-identical to
  the `gguf` package's dequantized rows, for any count of ids."""
  cfg = tiny_config("llama")
  w = tiny_weights(cfg, 2, True)
  blocks = gguf.quants.quantize(w["token_embd.weight"], gguf.GGMLQuantizationType.Q8_0)
  table = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
  tensors = {k: Tensor(v) for k, v in w.items()}
  tensors["token_embd.weight"] = dequantize(Tensor(blocks.reshape(-1, 34)).realize(), "Q8_0").reshape(table.shape)
  m = Transformer(cfg, tensors, max_context=16)
  for ids in ([5], [63, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9], list(range(16))):
    np.testing.assert_array_equal(m.embed(ids), table[ids])
  with pytest.raises(IndexError, match="token id out of range"): m.embed([64])


def test_embedding_gather_reads_each_row_once():
  """Each gathered row costs one row's work: the rows are written by a kernel each, not by one kernel whose every
  element evaluates all EMBED_ROWS gated pieces of a cat (EMBED_ROWS times the work, 360 us a call on SmolLM2)."""
  cfg = tiny_config("llama")
  w = tiny_weights(cfg, 2, True)
  m = Transformer(cfg, {k: Tensor(v) for k, v in w.items()}, max_context=16)
  for _ in range(3): np.testing.assert_array_equal(m.embed([3, 9]), w["token_embd.weight"][[3, 9]])
  kernels = [ei.runner.spec for ei in m._rows_jit.captured if ei.runner is not None]
  assert kernels and all(sym_infer(k.flops, {}) <= 4 * cfg.dim for k in kernels), [(k.name, k.flops) for k in kernels]


def test_loading_releases_the_file_mapping(tiny_gguf):
  """After loading, the GGUF file is no longer mapped (its pages would count as resident memory): the tensors are copies."""
  m, _ = Transformer.from_gguf(tiny_gguf, max_context=16)
  assert Device[canonicalize(f"DISK:{os.path.abspath(tiny_gguf)}")]._mm is None
  assert m.embed([1]).shape == (1, m.cfg.dim)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("lanes", [0, 8, 16])
def test_repack_in_chunks_is_bit_exact(qtype, lanes, monkeypatch):
  """Loading repacks a weight a chunk of blocks at a time into arrays allocated once (quant.repack_blocks): with chunks
  of one unit (8 blocks, or `lanes` rows), block counts that leave a partial unit, and both layouts, the weight is the
  `gguf` package's bit for bit, and its blocks are read once each, in order."""
  import plugrad.apps.llm.quant as quant
  monkeypatch.setattr(quant, "REPACK_CHUNK_BYTES", 1)
  elems, tsize = GEOMETRY[qtype]
  rows = 48 if lanes else 5
  per_row = 2 if elems == 256 else 3
  blocks = finite_blocks(qtype, rows * per_row, np.random.default_rng(rows + lanes))
  ref = gguf.quants.dequantize(blocks.reshape(rows, -1), getattr(gguf.GGMLQuantizationType, qtype))
  reads = []
  def read(start, count):
    reads.append((start, count))
    return blocks[start:start + count]
  bw = quant.repack_blocks(read, len(blocks), tsize, qtype, rows, lanes)
  assert (bw.rows is not None) == (lanes > 0 and qtype in ROW_LANE_TYPES)
  np.testing.assert_array_equal(bits(Tensor(quant.repacked(bw, (rows, per_row * elems))).numpy()), bits(ref))
  assert len(reads) > 1 and sum(c for _, c in reads) == len(blocks) and [s for s, _ in reads] == sorted(s for s, _ in reads)


def test_loading_peaks_near_the_loaded_size(embedded_path):
  """Weights are read and repacked one at a time, a few MB at a time, with nothing of the file mapped: the process's
  peak resident memory while loading stays within 1.2x what it holds once loaded (it was 1.6x for this model and
  2.3x for a qwen2-0.5B-shaped one when every tensor's raw blocks were read before any was repacked)."""
  code = ("from plugrad.apps.llm.model import Transformer\n"
          f"m, _ = Transformer.from_gguf({embedded_path!r}, max_context=64)\n"
          "st = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
          "print(int(st['VmHWM'].split()[0]), int(st['VmRSS'].split()[0]))")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  hwm, rss = map(int, r.stdout.split())
  assert hwm <= 1.2 * rss, f"peak {hwm / 1024:.0f} MB, loaded {rss / 1024:.0f} MB"


@pytest.mark.parametrize("qtype,rows,cols,split", [("Q4_K", 64, 512, True), ("Q5_K", 64, 512, True), ("Q5_0", 64, 512, True)])
@pytest.mark.parametrize("batch", [1, 4])
def test_dot2_kernel_tiles(qtype, rows, cols, split, batch, monkeypatch, cpu_host):
  """The integer decode product's kernel on either host kind: DOT2 in the source, the weight stream prefetched (a
  Q4_K sub-block pair reads the same bytes: the address moves every other trip, and the stream was missed), the
  enclosing reduce SPLIT by 2 where both copies read the same code bytes (one load, constant shifts: Q4_K/Q5_K, and
  Q5_0 since its blocks pair up in 32 bytes), and a batched step's 4 rows upcast whole so that the cores split the outputs
  and each reads the weights once. Values against float64."""
  from plugrad.codegen import get_program
  from plugrad.codegen.facts import ranges_of
  from plugrad.codegen.heuristic import heuristic_opts
  monkeypatch.setenv("ROW_LANES", "0")   # Q5_0 in the sub-block layout (on a dot2 host it is stored rows in lanes)
  w, ref, rng = quantized_weight(qtype, rows, cols, 11)
  x = rng.standard_normal((batch, 1, cols)).astype(np.float32)
  lanes, ren = vector_lanes("CPU"), Device["CPU"].renderer
  y = dot2_linear(Tensor(x), blockwise_of(w.uop), rows, lanes)
  ast = y.schedule(optimize=False)[-1].ast
  opts, rngs = heuristic_opts(ast, ren.caps), ranges_of(ast)
  src = get_program(ast, ren).src
  assert f"pg_dot2_pg_int{lanes}(" in src and "__builtin_prefetch" in src
  assert any(o.kind == "SPLIT" and o.amount == 2 and rngs[o.rid].src[0].arg == cols // 32 for o in opts) is split, opts
  if batch == 4: assert any(o.kind == "UPCAST" and o.amount == 4 and rngs[o.rid].src[0].arg == 4 for o in opts), opts
  want = x[:, 0].astype(np.float64) @ ref.T
  np.testing.assert_allclose(y.numpy()[:, 0], want, rtol=1e-4, atol=1e-4 * np.abs(ref).max() * np.sqrt(cols))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("qtype", ROW_LANE_TYPES)
@pytest.mark.parametrize("batch", [1, 4])
def test_rows_linear_matches_float64(qtype, batch, cpu_host):
  """Weights stored output rows in lanes (`RowLanes`) on a dot2 host: still bit-identical to gguf's dequantize (the
  sub-block views), and the decode product over the layout (`rows_linear`, what `linear` takes for one token a row)
  agrees with float64 as closely as `dot2_linear` over the sub-block layout does."""
  w, ref, rng = quantized_weight(qtype, 64, 512, 23)
  bw, S = blockwise_of(w.uop), bw_sub_block(qtype)
  assert bw.rows is not None and bw.rows.q.shape == (64 // row_lanes("CPU"), 512 // S, S // 2, row_lanes("CPU"), 2)
  x = rng.standard_normal((batch, 1, 512)).astype(np.float32)
  want = x[:, 0].astype(np.float64) @ ref.T
  got = linear(Tensor(x), w).numpy()[:, 0]
  np.testing.assert_array_equal(got, rows_linear(Tensor(x), bw, 64).numpy()[:, 0])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(ref).max() * np.sqrt(512))
  np.testing.assert_array_equal(w.numpy(), ref.astype(np.float32))   # (last: realizing w drops its parts)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("qtype", ROW_LANE_TYPES)
@pytest.mark.parametrize("batch", [1, 4])
def test_rows_of_quads_are_w_times_int8_x(qtype, batch, cpu_host, monkeypatch):
  """With ACT_BITS=8 a weight whose rows fill the lanes is stored as quads of unsigned codes (`RowLanes.width` 4) where
  the host's byte dot products take its codes: every type on AVX-512 VNNI, all but Q8_0 (codes + 128 reach 255) on
  AVX2 (pmaddubsw: 127), whose Q8_0 keeps pairs and int16 activations. Still bit-identical to gguf's dequantize; the
  decode product (`linear` -> `rows_linear`) is exactly w times x quantized to int8 per sub-block (float64 oracle),
  its kernel multiplying bytes (pg_dot4) for 1 and 4 rows of x."""
  monkeypatch.setenv("ACT_BITS", "8")
  w, ref, rng = quantized_weight(qtype, 64, 512, 29)
  bw, S, L = blockwise_of(w.uop), bw_sub_block(qtype), row_lanes("CPU")
  W = 4 if qtype != "Q8_0" or cpu_host == "avx512" else 2
  assert bw.rows is not None and bw.rows.q.shape == (64 // L, 512 // S, S // W, L, W) and row_width("CPU", qtype) == W
  x = rng.standard_normal((batch, 1, 512)).astype(np.float32)
  got = linear(Tensor(x), w).numpy()[:, 0]
  srcs = " ".join(runner_of(it).spec.src for it in linear(Tensor(x), w).schedule() if it.ast.op is Ops.SINK)
  assert ("pg_dot4_" in srcs) is (W == 4) and ("pg_dot2_" in srcs) is (W == 2)
  if W == 4:
    want = int8_activations(x[:, 0], S) @ ref.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(ref).max() * np.abs(x).max() * np.sqrt(512))
  else: np.testing.assert_allclose(got, x[:, 0].astype(np.float64) @ ref.T, rtol=1e-4, atol=1e-4 * np.abs(ref).max() * np.sqrt(512))
  np.testing.assert_array_equal(w.numpy(), ref.astype(np.float32))   # (last: realizing w drops its parts)


@pytest.mark.parametrize("rows", [48, 40, 20])
def test_rows_not_a_multiple_of_the_lanes_keep_the_sub_block_layout(rows, cpu_host):
  """A weight whose row count the lanes don't divide keeps the sub-block layout (20 rows on AVX2's 8 lanes, 40 and 20
  on AVX-512's 16), and its product is still right either way."""
  w, ref, rng = quantized_weight("Q4_1", rows, 256, 5)
  assert row_lanes("CPU") == {"avx2": 8, "avx512": 16}[cpu_host]
  assert (blockwise_of(w.uop).rows is None) is (rows % row_lanes("CPU") != 0)
  x = rng.standard_normal((2, 1, 256)).astype(np.float32)
  np.testing.assert_allclose(linear(Tensor(x), w).numpy()[:, 0], x[:, 0].astype(np.float64) @ ref.T, rtol=1e-4,
                             atol=1e-4 * np.abs(ref).max() * np.sqrt(256))


@pytest.mark.parametrize("env", [{"ROW_LANES": "0"}, {"DOT2": "0"}, {"ROW_LANES": "0", "ACT_BITS": "8"}])
def test_row_lanes_off(env, monkeypatch):
  """ROW_LANES=0 and DOT2=0 keep the sub-block layout (with ACT_BITS=8 too)."""
  for k, v in env.items(): monkeypatch.setenv(k, v)
  w, _, _ = quantized_weight("Q4_0", 64, 256, 3)
  assert blockwise_of(w.uop).rows is None and row_lanes("CPU") == 0


@pytest.mark.parametrize("batch", [1, 4])
def test_rows_kernel(batch, cpu_host):
  """The rows-in-lanes decode product's kernel on this host: WMMA DOT2 against x's pair loaded once and broadcast
  (codegen's "tile2" load, no lane-by-lane gather), the vector along the outputs, a batched step's 4 rows of x upcast
  whole (each unpacked code vector multiplied with all of them), the code stream prefetched."""
  from plugrad.codegen import get_program
  from plugrad.codegen.facts import ranges_of
  from plugrad.codegen.heuristic import heuristic_opts
  w, _, rng = quantized_weight("Q4_1", 64, 512, 9)
  x = Tensor(rng.standard_normal((batch, 1, 512)).astype(np.float32))
  *pre, it = rows_linear(x, blockwise_of(w.uop), 64).schedule()
  ren = Device["CPU"].renderer
  opts, rngs = heuristic_opts(it.ast, ren.caps), ranges_of(it.ast)
  lanes = row_lanes("CPU")
  assert any(o.kind == "VECTOR" and o.amount == lanes and rngs[o.rid].arg[1] == "global" for o in opts), opts
  assert any(o.kind == "UPCAST" and o.amount == 4 and rngs[o.rid].src[0].arg == 4 for o in opts) is (batch == 4), opts
  src = get_program(it.ast, ren).src
  assert f"pg_dot2_pg_int{lanes}(" in src and "pg_short2 val" in src and "__builtin_prefetch(((const char*)&data" in src
  assert "unsigned char val" not in src   # codes are vector loads, never lane by lane


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1", "Q5_K", "Q4_0"])
def test_rows_kernel_shifts_by_constants(qtype, cpu_host):
  """The rows-in-lanes decode product shifts its codes by constants on both host kinds: the loop over a half's 8 code
  pairs, whose index picks a Q5 code's fifth bit (bit j of a byte for pairs 2j and 2j + 1), is unrolled like the
  halves' loop (it was left rolled: the amount computed and splatted each trip; Q5_0 4864x896 on a Zen 3 AVX2 box
  0.82-0.92x the time unrolled, Q5_K 896x4864 0.79x); Q4_0 has no such loop. Values against float64."""
  from plugrad.codegen.facts import ranges_of
  from plugrad.codegen.heuristic import heuristic_opts
  w, ref, rng = quantized_weight(qtype, 16, 512, 11)
  bw = blockwise_of(w.uop)
  x = rng.standard_normal((1, 1, 512)).astype(np.float32)
  *pre, it = rows_linear(Tensor(x), bw, 16).schedule()
  opts, rngs = heuristic_opts(it.ast, Device["CPU"].renderer.caps), ranges_of(it.ast)
  unrolled = sorted(rngs[o.rid].src[0].arg for o in opts if o.kind == "UNROLL")
  assert unrolled == ([2] if qtype == "Q4_0" else [2, 8]), opts
  np.testing.assert_allclose(rows_linear(Tensor(x), bw, 16).numpy()[:, 0], x[:, 0].astype(np.float64) @ ref.T, rtol=1e-4,
                             atol=1e-4 * np.abs(ref).max() * np.sqrt(512))


def test_q5_0_rows_codes_include_their_offset():
  """Q5_0 stored output rows in lanes keeps its fifth bits inverted, so a code with its -16 offset is the low nibble
  minus 16 times the stored bit: one subtraction a code vector where an OR (the fifth bit) and an add (the offset)
  were. The decode product's kernel then has neither (1-row products 0.78-0.81x the time on a Zen 3 AVX2 box, same
  values); the parts report the offset as included (off 0, codes -16..15). Values against float64."""
  w, ref, rng = quantized_weight("Q5_0", 16, 512, 12)
  bw = blockwise_of(w.uop)
  assert bw.rows is not None and bw.off == 0.0 and bw.codes == (-16, 15)
  x = rng.standard_normal((1, 1, 512)).astype(np.float32)
  *pre, it = rows_linear(Tensor(x), bw, 16).schedule()
  src = get_program(it.ast, Device["CPU"].renderer).src
  assert "|" not in src and "-16" not in src, "the fifth bit ORed in or the offset added"
  np.testing.assert_allclose(rows_linear(Tensor(x), bw, 16).numpy()[:, 0], x[:, 0].astype(np.float64) @ ref.T, rtol=1e-4,
                             atol=1e-4 * np.abs(ref).max() * np.sqrt(512))


def _is_copy(ast) -> bool:
  """A kernel that only moves data: no reduction and no float arithmetic."""
  return not any(u.op is Ops.REDUCE or (u.op in GroupOp.ALU and dtypes.is_float(u.dtype)) for u in ast.toposort())


def test_rows_linear_reads_one_position_of_attention_in_place():
  """Regression (gemma3's decode after its Q4_K attention output went rows in lanes: the attention output kernel 22 ->
  34 us a layer, plus a copy): the one-position attention output feeds `rows_linear` without a copy kernel, and the
  kernel computing it keeps the heads as a range of their own (so the value rows of a KV head are read once for all its
  heads, not once a head in one range of heads x dims). Values against float64."""
  from plugrad.apps.llm.model import attend
  from plugrad.codegen.facts import ranges_of
  H, D, S, rows = 4, 64, 24, 16
  rng = np.random.default_rng(0)
  qn, kn, vn = rng.standard_normal((1, H, 1, D)), rng.standard_normal((1, 1, S, D)), rng.standard_normal((1, 1, S, D))
  q, k, v = (Tensor(a.astype(np.float32)).realize() for a in (qn, kn, vn))
  w, ref, _ = quantized_weight("Q4_K", rows, H * D, 3)
  y = rows_linear(attend(q * 2, k, v, None).transpose(1, 2).reshape(1, 1, H * D), blockwise_of(w.uop), rows)
  kernels = [it.ast for it in y.schedule() if it.ast.op is Ops.SINK]
  assert not any(_is_copy(a) for a in kernels)
  glob = [a for a in kernels if any(u.op is Ops.REDUCE for u in a.toposort())]
  assert any(sorted(int(r.src[0].arg) for r in ranges_of(a).values() if r.arg[1] == "global") == [H, D] for a in glob), \
    [[int(r.src[0].arg) for r in ranges_of(a).values() if r.arg[1] == "global"] for a in glob]
  sc = np.einsum("bhd,bsd->bhs", 2 * qn[:, :, 0], kn[:, 0]) / math.sqrt(D)
  p = np.exp(sc - sc.max(-1, keepdims=True))
  o = np.einsum("bhs,bsd->bhd", p / p.sum(-1, keepdims=True), vn[:, 0]).reshape(1, H * D)
  np.testing.assert_allclose(y.numpy()[:, 0], o @ ref.T, rtol=1e-4, atol=1e-4 * np.abs(ref).max() * np.sqrt(H * D))


def test_token_matmul_packs_the_dequantized_weight_once(cpu_host):
  """Regression (x @ dequantized W.T over 456 concrete tokens on AVX2 code: 131 ms, against 20 ms with the weight
  packed): the convolution tile took the token axis as its channel axis (x is read across tokens, and the weight
  operand, an expression, counted as a gated window) and evaluated the dequantized weight again for every panel of
  tokens. With that many panels the weight is packed once instead (PACK of its rows), on both host kinds. Values
  against float64."""
  from plugrad.codegen.facts import ranges_of
  from plugrad.codegen.heuristic import heuristic_opts
  w, ref, rng = quantized_weight("Q5_0", 64, 256, 4)
  x = rng.standard_normal((1, 256, 256)).astype(np.float32)
  y = Tensor(x).realize().linear(w.transpose())
  ast = y.schedule(optimize=False)[-1].ast
  opts, rngs = heuristic_opts(ast, Device["CPU"].renderer.caps), ranges_of(ast)
  assert [rngs[o.rid].src[0].arg for o in opts if o.kind == "PACK"] == [64], opts   # the weight's rows, not the tokens
  np.testing.assert_allclose(y.numpy(), x.astype(np.float64) @ ref.T, rtol=1e-4, atol=1e-4 * np.abs(ref).max() * 16)
