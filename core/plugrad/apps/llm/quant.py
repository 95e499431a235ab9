"""GGUF block-quantized weights, repacked for fast fused dequantization, and the blockwise matrix-vector product.

A quantized weight (rows, cols) is block-affine: w[r, b*S + i] = d[r, b] * (q[r, b*S + i] + off) + m[r, b], with
integer codes q, one scale d (and for some types a min m) per sub-block of S = 16 or 32 elements and a constant
offset. `repack` re-lays the file's blocks out at load (codes in their own arrays, a block's codes a contiguous run of
lanes with one shift: nibbles of two blocks share 32 bytes, Q5's fifth bits of 8 share 32; scales kept as the file's
float16 and converted where read, the K types' sub-block scales as bytes multiplied by the super-block's scale where
read: the file's bytes a weight, give or take 1/8 bit, Q6_K's codes excepted) and returns the dense expression,
bit-identical to the `gguf` package's dequantize; the parts are kept in that expression's cache (`blockwise_of`).

`blockwise_linear` computes x @ w.T for a token (one row of x) from the parts: each sub-block's codes are summed
against x first and the scale applied once per sub-block and lane, sum_(b,l) d*(sum_c x*q + off*xs) + m*xs with xs the
sum of x over a sub-block's chunks, instead of every element dequantized (a multiply and an add per weight) before
its FMA. The sub-block is split into C chunks of L = the device's vector lanes, so the lanes run along l and the short
chunk loop unrolls (at least 8 wide: at most 4 chunks; SmolLM2 Q4_1 gate/up on AVX2: 72 -> 43 us a call).
`dot2_linear` does the same in int16 integer products; `rows_linear` over weights stored with output rows in the
vector lanes (`RowLanes`: Q4_0-Q8_0 and Q4_K-Q6_K where the renderer has dot2; pairs of codes for int16 activations,
quads of unsigned codes for int8 ones) scales a sub-block once for a vector of rows (Q4_0-Q8_0's float16 scales of L
rows converted in one vector where the renderer has `f16_vectors`: F16C).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from plugrad.device import Device
from plugrad.dtype import DType, dtypes
from plugrad.helpers import getenv
from plugrad.engine.realize import buffer_for
from plugrad.uop.buffers import buffer_of, contiguous_range, is_buffer_view
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp


def _blocks_of(u: UOp) -> tuple[UOp, int, int] | None:
  """(the realized uint8 buffer a dequantized weight is computed from, elements per block, bytes per block), when that
  buffer is its only one; the block geometry is read from the (blocks, bytes) uint8 view the dequantization indexes."""
  topo = u.toposort()   # (views of views of the buffer too)
  bases = {buffer_of(n) for n in topo if is_buffer_view(n)}
  if len(bases) != 1 or (b := bases.pop()).dtype != dtypes.uint8 or u.dtype != dtypes.float32: return None
  total = math.prod(u.shape)
  for n in topo:
    if n.dtype == dtypes.uint8 and len(n.shape) == 2 and all(isinstance(d, int) for d in n.shape) and n.shape[0] * n.shape[1] == math.prod(b.shape):
      if n.shape[0] and total % n.shape[0] == 0: return b, total // n.shape[0], n.shape[1]
  return None


# (elements, bytes) per block -> ggml type: every quantized type GGUF files use is repacked
_REPACKABLE = {(32, 18): "Q4_0", (32, 20): "Q4_1", (32, 22): "Q5_0", (32, 24): "Q5_1", (32, 34): "Q8_0", (256, 84): "Q2_K",
               (256, 110): "Q3_K", (256, 144): "Q4_K", (256, 176): "Q5_K", (256, 210): "Q6_K"}


def _fields(qs: Tensor, groups: int, bits: int, count: int) -> Tensor:
  """uint8 (n, groups*width) -> per group of `width` bytes, the `bits`-wide field k (k < count, from bit k*bits) of
  every byte, field 0 of all the group's bytes first. One shift and one mask per element, shifts constant along a run
  of `width` consecutive elements (so a vector of lanes shares its shift); int32 (n, groups*count*width)."""
  n, width = qs.shape[0], qs.shape[1] // groups
  # shifted as int32 (x86 has per-lane shifts of 32-bit lanes, not of bytes); the shifts are an index expression, not
  # a buffer, so a kernel that unrolls the field axis shifts by constants (by 0: no shift at all)
  sh = Tensor.arange(count, dtype=dtypes.int32, device=qs.device) * bits
  a, s = qs.cast(dtypes.int32).reshape(n, groups, 1, width)._broadcasted(sh.reshape(1, 1, count, 1))
  return (a._alu(Ops.SHR, s) & ((1 << bits) - 1)).reshape(n, groups * count * width)


def _padded(a: np.ndarray, multiple: int) -> np.ndarray:
  """`a` (n, ...) with zero rows appended up to a multiple of `multiple` rows."""
  return np.concatenate([a, np.zeros((-len(a) % multiple, *a.shape[1:]), a.dtype)]) if len(a) % multiple else a


def _pack_bits(bits: np.ndarray) -> np.ndarray:
  """Bits (n, 8, w) (0 or 1) -> bytes (n, w): bit j of byte i is bits[:, j, i]."""
  return (bits << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(1, dtype=np.uint8)


# Q4_0-Q8_0: the byte where a block's codes start, and the constant added to every code
_CODES_AT = {"Q4_0": 2, "Q4_1": 4, "Q5_0": 6, "Q5_1": 8, "Q8_0": 2}
_CODE_OFF = {"Q4_0": -8.0, "Q5_0": -16.0, "Q6_K": -32.0}   # (and Q6_K's)


def _block_codes(raw: np.ndarray, qtype: str) -> np.ndarray:
  """The codes (n, 32) of Q4_0-Q8_0 blocks `raw` (uint8 (n, block bytes)) in element order: element i < 16 in byte
  i's low nibble, 16 + i in its high one, Q5's fifth bit i in bit i of the 4 bytes before (uint8); Q8_0's int8."""
  o = _CODES_AT[qtype]
  if qtype == "Q8_0": return np.ascontiguousarray(raw[:, o:]).view(np.int8)
  codes = np.concatenate([raw[:, o:o + 16] & 15, raw[:, o:o + 16] >> 4], axis=1)
  if qtype in ("Q5_0", "Q5_1"): codes = codes | (np.unpackbits(raw[:, o - 4:o], axis=1, bitorder="little") << 4)
  return codes


def _k_scale_min(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Q4_K/Q5_K's 8 6-bit (scale, min) pairs packed in the 12 bytes at column 4, as uint8 (n, 8)."""
  d_, m_, md = (raw[:, 4 + 4 * i:8 + 4 * i] for i in range(3))
  sc = np.concatenate([d_ & 63, (md & 15) | ((d_ >> 2) & 0x30)], axis=1)
  mn = np.concatenate([m_ & 63, (md >> 4) | ((m_ >> 2) & 0x30)], axis=1)
  return sc, mn


def _sub_scales(d: Tensor, codes: np.ndarray | Tensor) -> Tensor:
  """A K type's sub-block scales d[r] * codes[r, j] as float32 (n*k, 1), computed where they are read from the
  super-block's scale d (n, 1) and the small integer codes (n, k) (uint8/int8 bytes, or an expression of them), not
  stored as float32 a sub-block: 4 bytes a sub-block become 1 (Q4_K: 6 bits a weight become 4.625, the file's 4.5).
  The same float32 product as the `gguf` package's, so the same values."""
  c = codes if isinstance(codes, Tensor) else Tensor(np.ascontiguousarray(codes))
  n, k = c.shape
  return (d.reshape(n, 1).expand(n, k) * c.cast(dtypes.float32)).reshape(n * k, 1)


@dataclass(frozen=True)
class RowLanes:
  """A block-affine weight (out, in) with sub-blocks of S laid out for decode products with L output rows in a vector's
  lanes (`rows_linear`): q (out/L, in/S, S/W, L, W) int32 codes (an expression of the stored bytes: W consecutive codes
  j of sub-block b of rows g*L..g*L+L-1 side by side, W*L codes one contiguous run with one shift), d and m (out/L,
  in/S, L) float32 scales and mins (the file's float16 converted at load: a vector load, not L conversions; the
  constant added to every code is `Blockwise.off`; for Q4_K-Q6_K, expressions: the super-block's float32 scale times
  the sub-block's byte, both stored in that layout). W = 2 (pairs, int16 activations): one pmaddwd / vpdpwssd
  multiplies a pair of codes of L rows with a pair of x broadcast to them. W = 4 (quads of unsigned codes, int8
  activations, `ACT_BITS=8`): one vpdpbusd, or pmaddubsw + pmaddwd, multiplies 4 codes of L rows with 4 bytes of x.
  A sub-block's int32 sums are scaled once for L rows."""
  q: UOp
  d: UOp
  m: UOp | None = None

  @property
  def width(self) -> int:
    """W: the codes of a row a lane holds (2 or 4)."""
    return self.q.shape[-1]


@dataclass(frozen=True)
class Blockwise:
  """The parts of a block-affine weight (see the module docstring), over its sub-blocks in row-major order: q (n, S)
  integer codes (an int32 expression of the repacked bytes, int8 for Q8_0; every code fits in int16), d (n, 1) float32
  scales (expressions over float16 and byte buffers), m (n, 1) mins or None, `off` a constant added to every code,
  `codes` the codes' (least, greatest) values by the type's definition, `rows` the same parts over the output-rows-in-lanes
  layout when the weight is stored that way (then q, d and m are views of it). Kept as UOps (live lazy Tensors would make
  every realize walk their graphs)."""
  q: UOp
  d: UOp
  off: float = 0.0
  m: UOp | None = None
  codes: tuple[int, int] = (-32768, 32767)
  rows: RowLanes | None = None

  @staticmethod
  def of(q: Tensor, d: Tensor, off: float = 0.0, m: Tensor | None = None) -> Blockwise:
    """From integer codes q and float32 scales and mins."""
    return Blockwise(q.uop, d.uop, off, None if m is None else m.uop)

  def dense(self) -> Tensor:
    """d * (q + off) (+ m): float32 (n, S), in the `gguf` package's order (so its values bit for bit)."""
    q, d = Tensor(self.q).cast(dtypes.float32), Tensor(self.d)   # small ints: exact
    y = d * (q + self.off) if self.off else d * q
    return y + Tensor(self.m) if self.m is not None else y


# the codes' range per type (`Blockwise.codes`)
_CODES = {"Q4_0": (0, 15), "Q4_1": (0, 15), "Q5_0": (0, 31), "Q5_1": (0, 31), "Q8_0": (-128, 127), "Q2_K": (0, 3), "Q3_K": (-4, 3),
          "Q4_K": (0, 15), "Q5_K": (0, 31), "Q6_K": (0, 63)}


_ROW_LANE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# the codes the output-rows-in-lanes layout stores with their offset included: Q6_K's q - 32 (int8), Q5_0's q - 16
# (a 5-bit type here has its fifth bits stored inverted: low nibble - 16 * (1 - fifth bit), a subtraction where an OR
# and the offset's add were)
_ROW_LANE_CODES = {"Q6_K": (-32, 31), "Q5_0": (-16, 15)}
REPACK_CHUNK_BYTES = 4 << 20   # raw bytes of a weight repacked at a time (the load's transient memory is a few times this)


def _fields_np(qs: np.ndarray, groups: int, bits: int, count: int) -> np.ndarray:
  """`_fields` computed on the host: uint8 (n, groups*count*width)."""
  n, width = qs.shape[0], qs.shape[1] // groups
  sh = (np.arange(count, dtype=np.uint8) * bits).reshape(1, 1, count, 1)
  return ((qs.reshape(n, groups, 1, width) >> sh) & ((1 << bits) - 1)).reshape(n, groups * count * width)


def _f16(raw: np.ndarray, col: int) -> np.ndarray:
  """The float16 field at byte `col` of each block (n, 1)."""
  return np.ascontiguousarray(raw[:, col:col + 2]).view(np.float16)


def _host_parts(raw: np.ndarray, qtype: str, rows: int = 0, lanes: int = 0, width: int = 2) -> list[np.ndarray]:
  """The arrays a weight's blocks `raw` (uint8 (n, block bytes)) are stored as, computed on the host: the sub-block
  layout's (`_device_parts`), or with `lanes` the output-rows-in-lanes layout of `rows` rows (`RowLanes`). Every array's
  first axis follows the blocks, so the arrays of consecutive chunks of blocks (whole groups of 8 blocks, or of
  `lanes` rows) are consecutive runs of the whole weight's."""
  if lanes: return _host_row_lanes(raw, qtype, rows, lanes, width)
  if qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):   # element i < 16 in byte i's low nibble, 16 + i in its high one
    codes = _block_codes(raw, qtype)
    p = _padded(codes & 15, 2)
    out = [p[0::2] | (p[1::2] << 4)]   # the 4-bit codes of two neighbouring blocks share 32 bytes
    if qtype in ("Q5_0", "Q5_1"): out.append(_pack_bits(_padded(codes >> 4, 8).reshape(-1, 8, 32)))   # 5th bits of 8 blocks
    return out + [_f16(raw, 0)] + ([_f16(raw, 2)] if qtype in ("Q4_1", "Q5_1") else [])
  if qtype == "Q8_0": return [_block_codes(raw, qtype), _f16(raw, 0)]
  if qtype == "Q2_K": return [np.ascontiguousarray(raw[:, :16]), np.ascontiguousarray(raw[:, 16:80]), _f16(raw, 80), _f16(raw, 82)]
  if qtype == "Q3_K":
    n, s = raw.shape[0], raw[:, 96:108]
    lo = (s[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    hi = (s[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    scale = ((lo & 15) | ((hi & 3) << 4)).astype(np.int8) - np.int8(32)
    return [scale, np.ascontiguousarray(raw[:, 32:96]), np.ascontiguousarray(raw[:, :32]), _f16(raw, 108)]
  if qtype in ("Q4_K", "Q5_K"):
    sc, mn = _k_scale_min(raw)
    qs = [np.ascontiguousarray(raw[:, 16:])] if qtype == "Q4_K" else [np.ascontiguousarray(raw[:, 48:]), np.ascontiguousarray(raw[:, 16:48])]
    return [sc, mn, *qs, _f16(raw, 0), _f16(raw, 2)]
  if qtype == "Q6_K":   # unpacked at load into one byte a code (see `_device_parts`)
    codes = _fields_np(raw[:, :128], 2, 4, 2) | (_fields_np(raw[:, 128:192], 2, 2, 4) << 4)
    return [codes.reshape(-1, 16), np.ascontiguousarray(raw[:, 192:208]).view(np.int8), _f16(raw, 208)]
  raise ValueError(f"no repacked layout for {qtype}")


def _device_parts(t: list[Tensor], qtype: str, n: int) -> Blockwise:
  """The block-affine parts over the stored arrays `t` (`_host_parts`' arrays of all n blocks, on the device): the
  float16 scales and mins converted where read, the K types' sub-block scales as bytes (`_sub_scales`), the codes
  as shifts and masks of bytes (`_fields`: a block's 32 codes one contiguous run of lanes with one shift; Q5's 5th bits
  of 8 blocks share 32 bytes, `_bit_planes`' layout). The arithmetic of `Blockwise.dense` is the `gguf` package's, in
  its order, so the values are bit-identical to its dequantize."""
  def f32(x: Tensor) -> Tensor: return x.cast(dtypes.float32)
  if qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
    q = _fields(t[0], 1, 4, 2).reshape(-1, 32)[:n]
    five = qtype in ("Q5_0", "Q5_1")
    if five: q = q | (_fields(t[1], 1, 1, 8).reshape(-1, 32)[:n] << 4)
    d = f32(t[1 + five])
    if qtype in ("Q4_1", "Q5_1"): return Blockwise.of(q, d, m=f32(t[2 + five]))
    return Blockwise.of(q, d, _CODE_OFF[qtype])
  if qtype == "Q8_0": return Blockwise.of(t[0], f32(t[1]))
  if qtype == "Q2_K":   # 16 sub-blocks of 16: w = d*(sc & 15)*q - dmin*(sc >> 4), 2-bit q in 4 planes of 32 bytes x2
    dl, ml = _sub_scales(f32(t[2]), t[0] & 15), _sub_scales(-f32(t[3]), t[0] >> 4)   # -(d*m) is (-d)*m exactly
    return Blockwise.of(_fields(t[1], 2, 2, 4).reshape(n * 16, 16), dl, m=ml)
  if qtype == "Q3_K":   # 16 sub-blocks of 16: w = d*(s - 32)*(q2 - 4*(1 - hbit)), 6-bit s packed in 12 bytes
    ql, qh = _fields(t[1], 2, 2, 4), (_fields(t[2], 1, 1, 8) ^ 1) << 2
    return Blockwise.of((ql - qh).reshape(n * 16, 16), _sub_scales(f32(t[3]), t[0]))   # small ints: exact
  if qtype in ("Q4_K", "Q5_K"):   # 8 sub-blocks of 32: w = d*sc[j]*q - dmin*mn[j]
    q = _fields(t[2], 4, 4, 2)
    if qtype == "Q5_K": q = q | (_fields(t[3], 1, 1, 8) << 4)
    d, dmin = t[-2:]
    return Blockwise.of(q.reshape(n * 8, 32), _sub_scales(f32(d), t[0]), m=_sub_scales(-f32(dmin), t[1]))
  if qtype == "Q6_K":   # 16 sub-blocks of 16: w = d*sc[j]*(q - 32), q = 4 low bits | 2 high bits << 4
    # one byte a code: 8 bits a weight against the file's 6.56, but the decode product is compute-bound on unpacking
    # 6-bit codes (qwen2's down projection: ~15 vector ops per 16 weights)
    return Blockwise.of(t[0], _sub_scales(f32(t[2]), t[1]), _CODE_OFF[qtype])
  raise ValueError(f"no repacked layout for {qtype}")


# K types stored output rows in lanes: sub-blocks a super-block, and the sub-block size
_K_SUBS = {"Q4_K": (8, 32), "Q5_K": (8, 32), "Q6_K": (16, 16)}


def _k_codes(raw: np.ndarray, qtype: str) -> np.ndarray:
  """The codes of Q4_K/Q5_K/Q6_K super-blocks `raw` as (n * sub-blocks, S) in element order: Q4_K/Q5_K's uint8 (each
  64-element chunk's 32 bytes: low nibbles first, then high; Q5's fifth bit of element i of sub-block j is bit j of
  byte i of the 32 before the nibbles); Q6_K's as int8 q - 32 (4 low bits | 2 high bits << 4, 128 elements a half)."""
  if qtype == "Q6_K":
    q = _fields_np(raw[:, :128], 2, 4, 2) | (_fields_np(raw[:, 128:192], 2, 2, 4) << 4)
    return (q.astype(np.int16) - 32).astype(np.int8).reshape(-1, 16)
  q = _fields_np(raw[:, 48:] if qtype == "Q5_K" else raw[:, 16:], 4, 4, 2)
  if qtype == "Q5_K": q = q | (_fields_np(raw[:, 16:48], 1, 1, 8) << 4)
  return q.reshape(-1, 32)


def _host_row_lanes(raw: np.ndarray, qtype: str, out: int, L: int, W: int = 2) -> list[np.ndarray]:
  """The blocks `raw` (uint8 (out*blocks a row, block bytes)) of `out` rows stored output rows in lanes (`RowLanes`),
  on the host: per group of L rows and sub-block, the S/W runs of W codes of L rows (W = 2: pairs; W = 4: quads of
  unsigned codes, `_quad_off`); 4-bit codes: run j in the low nibbles of WL bytes, run j + S/2W in the high ones;
  Q5's fifth bits: bit u of 4L bytes holds those of the u-th 4L codes (pairs: Q5_0's inverted, see _ROW_LANE_CODES);
  Q8_0 and Q6_K: one byte a code (pairs: int8, quads: uint8). Q4_0-Q8_0's float16 scales and mins as the
  file's float16 (out/L, sub-blocks, L): 2 bytes a block less than float32, and as fast where L of them convert at
  once (F16C); the K types' byte sub-block scales (and mins) as bytes (out/L, sub-blocks, L) and their super-block
  scales as float32 (out/L, super-blocks, L): their float16 made Q4_K's product 1.4x slower on AVX2 code (1536x2048:
  59 -> 82 us) for 1/64 bit a weight."""
  k, S = _K_SUBS.get(qtype, (1, 32))
  NB = raw.shape[0] // out
  B, G = NB * k, out // L
  def lay(a: np.ndarray) -> np.ndarray:   # (out*m, ...) row-major -> (G, m, L, ...)
    return np.ascontiguousarray(a.reshape(G, L, a.shape[0] // out, *a.shape[1:]).swapaxes(1, 2))
  def f16(col: int) -> np.ndarray: return lay(_f16(raw, col)[:, 0])
  def f32(col: int) -> np.ndarray: return f16(col).astype(np.float32)
  codes = _k_codes(raw, qtype) if k > 1 else _block_codes(raw, qtype)
  if W == 4 and qtype in ("Q6_K", "Q8_0"): codes = (codes.astype(np.int16) - int(_quad_off(qtype))).astype(np.uint8)   # unsigned
  runs = lay(codes).reshape(G, B, L, S // W, W).transpose(0, 1, 3, 2, 4).reshape(G * B, S // W, W * L)   # (G*B, run, WL)
  if qtype == "Q6_K": return [np.ascontiguousarray(runs), lay(raw[:, 192:208].view(np.int8).reshape(-1)), f32(208)]
  if k > 1: scales = [lay(a.reshape(-1)) for a in _k_scale_min(raw)] + [f32(0), f32(2)]
  else: scales = [f16(0)] + ([f16(2)] if qtype in ("Q4_1", "Q5_1") else [])
  if qtype == "Q8_0": return [np.ascontiguousarray(runs), *scales]
  h = S // (2 * W)
  out_ = [((runs[:, :h] & 15) | ((runs[:, h:] & 15) << 4)).reshape(G * B, -1)]
  if qtype in ("Q5_0", "Q5_1", "Q5_K"):
    out_.append(_pack_bits(((runs >> 4) ^ (W == 2 and qtype in _ROW_LANE_CODES)).reshape(G * B, 8, 4 * L)))
  return out_ + scales


def _device_row_lanes(t: list[Tensor], qtype: str, n: int, out: int, L: int, W: int = 2) -> Blockwise:
  """The output-rows-in-lanes parts over `_host_row_lanes`' arrays (on the device); `Blockwise.q/d/m` are views of
  them in the usual (sub-block, S) order (dense dequantization, the prefill): the same values, bit for bit (a K
  type's sub-block scale is its super-block's float32 scale times the byte, the `gguf` package's product)."""
  k, S = _K_SUBS.get(qtype, (1, 32))
  B, G = n * k // out, out // L
  five = qtype in ("Q5_0", "Q5_1", "Q5_K")
  if qtype in ("Q8_0", "Q6_K"): q = t[0] & 63 if qtype == "Q6_K" and W == 4 else t[0]   # (quads: 6 bits, a bound byte dots read)
  else:
    q = _fields(t[0], 1, 4, 2)
    if five and W == 2 and qtype in _ROW_LANE_CODES: q = q - (_fields(t[1], 1, 1, 8) << 4)   # fifth bits stored inverted: q - 16, offset included
    elif five: q = q | (_fields(t[1], 1, 1, 8) << 4)
  scales = t[1 + five:]
  if k > 1:   # the byte sub-block scales (and mins) times their super-block's float32 scale (and -dmin)
    def sub(sup: Tensor, byte: Tensor) -> Tensor: return (sup.reshape(G, B // k, 1, L).expand(G, B // k, k, L).reshape(G, B, L) *
                                                          byte.cast(dtypes.float32))
    d, m = (sub(scales[1], scales[0]), None) if qtype == "Q6_K" else (sub(scales[2], scales[0]), sub(-scales[3], scales[1]))
  else: d, m = scales[0].cast(dtypes.float32), (scales[1].cast(dtypes.float32) if qtype in ("Q4_1", "Q5_1") else None)
  rl = RowLanes(q.reshape(G, B, S // W, L, W).uop, d.uop, None if m is None else m.uop)
  std_q = Tensor(rl.q).permute(0, 3, 1, 2, 4).reshape(n * k, S)
  def std(u: UOp) -> Tensor: return Tensor(u).permute(0, 2, 1).reshape(n * k, 1)
  # pairs: stored with the offset included (_ROW_LANE_CODES); quads: unsigned, the offset a constant (_quad_off)
  off = _quad_off(qtype) if W == 4 else 0.0 if qtype in _ROW_LANE_CODES else _CODE_OFF.get(qtype, 0.0)
  return Blockwise(std_q.uop, std(rl.d).uop, off, None if rl.m is None else std(rl.m).uop, rows=rl)


def _repack_blocks(raw: np.ndarray, qtype: str, out: int = 0, lanes: int = 0, width: int = 2) -> Blockwise:
  """The parts of the blocks `raw` in one piece (tests; loading goes through `repack_blocks`, in chunks)."""
  return repack_blocks(lambda s, c: raw[s:s + c], raw.shape[0], raw.shape[1], qtype, out, lanes, None, width)


def repack_blocks(read: Callable[[int, int], np.ndarray], n: int, tsize: int, qtype: str, out: int = 0, lanes: int = 0,
                  device: str | None = None, width: int = 2) -> Blockwise:
  """The block-affine parts of a weight of `n` blocks of `qtype` (`tsize` bytes each) whose blocks `read(start, count)`
  returns (uint8 (count, tsize), e.g. from the model file): the stored arrays (`_host_parts`) are allocated on `device`
  once and filled chunk by chunk (about REPACK_CHUNK_BYTES of blocks at a time), so repacking a weight takes its
  repacked size plus a few chunks, never a copy of the whole weight. For a weight of `out` rows of the types
  `_row_lanes` lays out, with `lanes` > 0 dividing `out`, the output-rows-in-lanes layout of `width` codes a lane
  (`RowLanes`: 2, or 4 for int8 activations)."""
  L = lanes if lanes and out and out % lanes == 0 and qtype in _ROW_LANE_TYPES else 0
  quantum = L * (n // out) if L else 8   # blocks whose arrays are computed together (a group of L rows, or of 8 blocks)
  step = max(1, REPACK_CHUNK_BYTES // (tsize * quantum)) * quantum
  with np.errstate(invalid="ignore", over="ignore"):   # inf/nan scales stay inf/nan, as in the file
    def arrays(raw: np.ndarray) -> list[np.ndarray]: return _host_parts(raw, qtype, raw.shape[0] // max(n // max(out, 1), 1) if L else 0, L, width)
    unit, rest = arrays(np.zeros((quantum, tsize), np.uint8)), arrays(np.zeros((n % quantum, tsize), np.uint8)) if n % quantum else None
    shapes = [((n // quantum) * u.shape[0] + (r.shape[0] if rest is not None else 0), *u.shape[1:])
              for u, r in zip(unit, rest if rest is not None else unit)]
    ts = [Tensor.empty(*sh, dtype=_DTYPES[u.dtype], device=device) for sh, u in zip(shapes, unit)]
    Tensor.realize_all(*ts)
    bufs, at = [buffer_for(buffer_of(t.uop)) for t in ts], [0] * len(ts)
    for start in range(0, n, step):
      for k, a in enumerate(arrays(read(start, min(step, n - start)))):
        a = np.ascontiguousarray(a)
        bufs[k].view(a.size, bufs[k].dtype, at[k]).copyin(a)
        at[k] += a.nbytes
  bw = _device_row_lanes(ts, qtype, n, out, L, width) if L else _device_parts(ts, qtype, n)
  return dataclasses.replace(bw, codes=_row_lane_codes(qtype, width) if L else _CODES[qtype])


def _quad_off(qtype: str) -> float:
  """The constant added to every code of the quads layout, which stores unsigned codes (Q8_0's q + 128, the others
  their file codes): the type's offset, less the codes' least value where it is negative."""
  return _CODE_OFF.get(qtype, 0.0) + min(_CODES[qtype][0], 0)


def _row_lane_codes(qtype: str, width: int) -> tuple[int, int]:
  """The stored codes' (least, greatest) values in the output-rows-in-lanes layout of `width` codes a lane."""
  lo, hi = _CODES[qtype]
  if width == 4: return (0, hi - min(lo, 0))
  return _ROW_LANE_CODES.get(qtype, _CODES[qtype])


_DTYPES = {np.dtype(np.uint8): dtypes.uint8, np.dtype(np.int8): dtypes.int8, np.dtype(np.float16): dtypes.float16,
           np.dtype(np.float32): dtypes.float32}


def repacked(bw: Blockwise, shape: tuple) -> UOp:
  """The dense expression of a repacked weight of `shape`, with its parts in the expression's cache (`blockwise_of`)."""
  out = bw.dense().reshape(shape).uop
  out._cached()["blockwise"] = bw
  return out


def repack(u: UOp) -> UOp:
  """A dequantized GGUF weight (any of the `_REPACKABLE` types) re-laid out for fast fused dequantization (see
  `repack_blocks`): dequantizing an element then costs a few shifts and masks and a multiply(-add). The block-affine
  parts are kept in the returned expression's cache (`blockwise_of`). Other tensors are returned unchanged."""
  if (found := _blocks_of(u)) is None or (qtype := _REPACKABLE.get(found[1:])) is None: return u
  b, elems, tsize = found
  raw = Tensor(b).numpy().reshape(-1, tsize)
  bw = repack_blocks(lambda s, c: raw[s:s + c], raw.shape[0], tsize, qtype, int(u.shape[0]) if len(u.shape) == 2 else 0,
                     row_lanes(u.device), u.device, row_width(u.device, qtype))
  return repacked(bw, u.shape)


def blockwise_of(w: UOp) -> Blockwise | None:
  """The block-affine parts of a weight `repack` made, else None."""
  return None if (c := w._cache) is None else c.get("blockwise")


def vector_lanes(device: str | tuple[str, ...]) -> int:
  """The explicit SIMD lanes of `device`'s renderer (0: none, or several devices)."""
  return 0 if isinstance(device, tuple) else Device[device].renderer.caps.vector_lanes


def row_lanes(device: str | tuple[str, ...]) -> int:
  """The output rows a weight on `device` keeps in a vector's lanes (`RowLanes`, `rows_linear`): the renderer's lanes
  where it has `dot2` and the decode products use it (not DOT2=0), unless ROW_LANES=0; else 0 (the sub-block layout)."""
  if not has_dot2(device) or not getenv("DOT2", 1) or not getenv("ROW_LANES", 1): return 0
  return vector_lanes(device)


def row_width(device: str | tuple[str, ...], qtype: str) -> int:
  """The codes a lane of the output-rows-in-lanes layout holds for a `qtype` weight on `device` (`RowLanes.width`):
  4 with ACT_BITS=8 where the renderer's byte dot products (`dot4`) take the type's unsigned codes (int8
  activations), else 2 (int16 activations; Q8_0's codes need 255, which pmaddubsw alone doesn't take)."""
  return 4 if activation_bits() == 8 and 0 < _row_lane_codes(qtype, 4)[1] <= dot4_bound(device) else 2


def has_dot2(device: str | tuple[str, ...]) -> bool:
  """Whether `device`'s renderer computes pairwise int16 multiply-adds on its vectors (`Capabilities.dot2`)."""
  return not isinstance(device, tuple) and vector_lanes(device) >= 2 and Device[device].renderer.caps.dot2


def dot4_bound(device: str | tuple[str, ...]) -> int:
  """The largest unsigned code `device`'s renderer multiplies with int8 in WMMA "DOT4" (`Capabilities.dot4`; 0: none)."""
  return 0 if isinstance(device, tuple) or vector_lanes(device) < 2 else Device[device].renderer.caps.dot4


def _check_fit(x: Tensor, bw: Blockwise, out_features: int, lanes: int) -> tuple[int, int]:
  S, K = bw.q.shape[1], x.shape[-1]
  if not isinstance(K, int) or K % S or out_features * (K // S) != bw.q.shape[0] or lanes < 1:
    raise ValueError(f"blockwise_linear: x's last dim {K} and {out_features} outputs don't fit the weight's "
                     f"{bw.q.shape[0]} sub-blocks of {S} (lanes {lanes})")
  return S, K


def blockwise_linear(x: Tensor, bw: Blockwise, out_features: int, lanes: int, b: Tensor | None = None) -> Tensor:
  """x @ w.T (+ b) for x (..., 1, in) of the weight (out_features, in) whose parts are `bw`, computed per sub-block
  (module docstring) with the sub-block split into chunks of `lanes` elements."""
  S, K = _check_fit(x, bw, out_features, lanes)
  q, d = Tensor(bw.q).cast(dtypes.float32), Tensor(bw.d)
  L = math.gcd(S, max(lanes, 8))   # chunks of at most 4 (S <= 32): the chunk loop stays short enough to unroll
  B, C, R = K // S, S // L, math.prod(x.shape[:-1])
  xr = x.reshape(R, 1, B, C, L)
  xs = xr.sum(3)                                                               # (R, 1, B, L)
  t = (xr * q.reshape(1, out_features, B, C, L)).sum(3)                     # (R, out, B, L)
  if bw.off: t = t + xs * bw.off
  t = d.reshape(1, out_features, B, 1) * t
  if bw.m is not None: t = t + Tensor(bw.m).reshape(1, out_features, B, 1) * xs
  y = t.sum((2, 3)).reshape(*x.shape[:-1], out_features)
  return y + b if b is not None else y


X16 = 32767  # int16 activations: x = dx * xq with |xq| <= X16 per sub-block


def quantize16(x: Tensor, S: int) -> tuple[Tensor, Tensor]:
  """x (..., K) per sub-block of S: (xq int16 (..., K), dx float32 (..., K // S, 1)) with x ~ dx * xq, dx the sub-block's
  max |x| / 32767 (error at most dx / 2 an element, 2^-16 of the sub-block's largest). A zero sub-block gets dx = 0 and
  codes 0; a non-finite one a non-finite dx (its products stay non-finite). xq is realized by a kernel of its own."""
  return _quantize(x, S, X16, dtypes.int16)


def _quantize(x: Tensor, S: int, top: int, dt: DType) -> tuple[Tensor, Tensor]:
  """x per sub-block of S as integer codes of `dt` within +-top (realized) and the float32 scales max |x| / top."""
  xr = x.cast(dtypes.float32).reshape(*x.shape[:-1], x.shape[-1] // S, S)
  amax = xr.abs().max(-1, keepdim=True)
  inv = (amax > 0).where(top / amax, 0.0)
  return _round_small(xr * inv).cast(dt).reshape(x.shape).contiguous(), amax * (1.0 / top)


ROUND_MAGIC = 12582912.0   # 1.5 * 2**23: float32 sums with it have a unit step


def _round_small(v: Tensor) -> Tensor:
  """`v.round()` (half to even) for float32 |v| < 2**22, as the hardware rounds the sum (v + 1.5*2**23) to an integer
  step and the difference is exact: 2 ops a value where the general round is a decomposition of ~25 (quantize16's
  kernel with its launch, 4 rows of 576, one process alternating: 3.59 -> 3.14 us with AVX-512 code, 5.52 -> 4.86 with
  AVX2's). A zero keeps no sign (the codes are integers); non-finite values stay so."""
  return (v + ROUND_MAGIC) - ROUND_MAGIC


def dot2_linear(x: Tensor, bw: Blockwise, out_features: int, lanes: int, b: Tensor | None = None) -> Tensor:
  """x @ w.T (+ b) for x (..., 1, in) as integer products: x quantized to int16 per sub-block (`quantize16`), each
  sub-block's codes (offset included: q + off fits int16) multiplied with it in int32,
  sum_(b,l) d*dx*(sum_(c,p) (q + off)*xq) + m*xs over lanes l of P = min(lanes, S/2) int32 pairs, chunks c and the pair
  p (xs: x summed over c and p; the min acts on x itself, only the codes' product is approximated). A renderer with
  `dot2` reads q and xq as 2P int16 lanes and does a pair's two multiply-adds in one instruction (pmaddwd): the codes
  are unpacked in 16-bit lanes, twice as many an op as float32's (qwen2 Q5_0 gate/up on AVX2: 433 -> 183 us a call
  against `blockwise_linear`)."""
  S, K = _check_fit(x, bw, out_features, lanes)
  P = min(lanes, S // 2)
  B, C, R = K // S, S // (2 * P), math.prod(x.shape[:-1])
  xq, dx = quantize16(x.reshape(R, K), S)
  q = Tensor(bw.q).cast(dtypes.int32)
  if bw.off: q = q + int(bw.off)
  t = (q.reshape(1, out_features, B, C, P, 2) * xq.reshape(R, 1, B, C, P, 2).cast(dtypes.int32)).sum((3, 5))   # (R, out, B, P) int32
  y = (Tensor(bw.d).reshape(1, out_features, B, 1) * dx.reshape(R, 1, B, 1)) * t.cast(dtypes.float32)
  if bw.m is not None: y = y + Tensor(bw.m).reshape(1, out_features, B, 1) * x.reshape(R, 1, B, C, P, 2).cast(dtypes.float32).sum((3, 5)).contiguous()
  y = y.sum((2, 3)).reshape(*x.shape[:-1], out_features)
  return y + b if b is not None else y


def _row_major(x: Tensor) -> bool:
  """Whether `x` is a buffer, or a tensor realized anyway (CONTIGUOUS), seen in row-major order (reshapes, and permutes of
  size-1 axes: attention's output of one position): making it contiguous would only copy it."""
  base, _, top = contiguous_range(x.uop)
  return top is x.uop and (is_buffer_view(base) or base.op is Ops.CONTIGUOUS)


def rows_linear(x: Tensor, bw: Blockwise, out_features: int, b: Tensor | None = None) -> Tensor:
  """x @ w.T (+ b) for x (..., 1, in) of a weight stored output rows in lanes (`bw.rows`, `RowLanes`). Pairs (W = 2):
  `dot2_linear`'s numerics, x quantized to int16 per sub-block, sum_b d*dx*(sum_(p,j) (q + off)*xq) + m*xs with a
  sub-block's products summed in int32 (pairs p, j of a pair) for L rows at once and scaled once (xs: x summed over
  the sub-block). A renderer with `dot2` does one pair of L rows in one instruction against a pair of x broadcast to
  the lanes (SmolLM2's Q4_1 gate/up, 1536x576, on an AVX-512 box: 4 rows 82 -> 23 us, 1 row 34 -> 14 us against
  `dot2_linear`'s lanes along the sub-block). Quads (W = 4, ACT_BITS=8): `dot4_linear`'s numerics (int8 x, the mins
  and the codes' constant times the quantized x's sums), 4 codes of L rows against 4 bytes of x in one byte dot."""
  if (rl := bw.rows) is None: raise ValueError("rows_linear needs a weight stored output rows in lanes (Blockwise.rows)")
  G, B, P, L, W = rl.q.shape
  S, K, R = W * P, B * W * P, math.prod(x.shape[:-1])
  if x.shape[-1] != K or G * L != out_features:
    raise ValueError(f"rows_linear: x's last dim {x.shape[-1]} and {out_features} outputs don't fit the weight's {G * L}x{K}")
  if not _row_major(x): x = x.contiguous()   # read by three kernels (scales, codes, sums): not recomputed by each (a SwiGLU's exp)
  xq, dx = (quantize8 if W == 4 else quantize16)(x.reshape(R, K), S)
  q = Tensor(rl.q).cast(dtypes.int32)
  if bw.off and W == 2: q = q + int(bw.off)
  # the runs as 2 halves of P/2 (the halves' loop unrolls: a 4-bit code's shift is a constant, and the loop over a
  # half steps through the codes WL bytes a trip, a stream the renderer prefetches)
  t = (q.reshape(1, G, B, 2, P // 2, L, W) * xq.reshape(R, 1, B, 2, P // 2, 1, W).cast(dtypes.int32)).sum((3, 4, 6))   # (R, G, B, L) int32
  dxb = dx.reshape(R, 1, B, 1)
  if W == 4:
    xqs = xq.reshape(R, 1, B, S).cast(dtypes.int32).sum(3, keepdim=True)   # (R, 1, B, 1)
    if bw.off: t = t + (xqs * int(bw.off)).contiguous()   # (the add becomes the dot's accumulator)
  y = (Tensor(rl.d).reshape(1, G, B, L) * dxb) * t.cast(dtypes.float32)
  if rl.m is not None:
    xs = (dxb * xqs.cast(dtypes.float32)) if W == 4 else x.reshape(R, B, S).cast(dtypes.float32).sum(2).reshape(R, 1, B, 1)
    y = y + Tensor(rl.m).reshape(1, G, B, L) * xs.contiguous()
  y = y.sum(2).reshape(*x.shape[:-1], out_features)
  return y + b if b is not None else y


X8 = 127  # int8 activations: x = dx * xq with |xq| <= X8 per sub-block


def quantize8(x: Tensor, S: int) -> tuple[Tensor, Tensor]:
  """x (..., K) per sub-block of S: (xq int8 (..., K), dx float32 (..., K // S, 1)) with x ~ dx * xq, dx the sub-block's
  max |x| / 127: llama.cpp's Q8 activations (error at most dx / 2 an element, 1/254 of the sub-block's largest: 258x
  `quantize16`'s). A zero sub-block gets dx = 0 and codes 0; a non-finite one a non-finite dx. xq is realized by a
  kernel of its own."""
  return _quantize(x, S, X8, dtypes.int8)


def unsigned_codes(bw: Blockwise) -> tuple[Tensor, int]:
  """The weight's codes moved to start at 0, as int32 (u = q - lo with lo the codes' least possible value when it is
  negative, else 0), and the constant then added to every u: w = d*(u + lo + off) + m."""
  q, lo = Tensor(bw.q).cast(dtypes.int32), min(bw.codes[0], 0)
  return (q - lo if lo else q), lo + int(bw.off)


def activation_bits() -> int:
  """ACT_BITS, the integer decode products' activation precision: 16 (default; x quantized to int16 per sub-block,
  `dot2_linear` / `rows_linear` over pairs, error 2^-16 of a sub-block's largest) or 8 (llama.cpp's int8 activations,
  `rows_linear` over quads / `dot4_linear`, for the types the byte dot products take: faster on every x86 kind measured,
  258x coarser; greedy answers of small models change: SmolLM2 no longer answers "Paris" to the capital of France)."""
  if (bits := getenv("ACT_BITS", 16)) not in (8, 16): raise ValueError(f"ACT_BITS must be 8 or 16, got {bits}")
  return bits


def fits_dot4(bw: Blockwise, bound: int) -> bool:
  """Whether the weight's unsigned codes (`unsigned_codes`) are at most `bound` and its offset is an integer."""
  return bound > 0 and float(bw.off).is_integer() and bw.codes[1] - min(bw.codes[0], 0) <= bound


def prefers_dot4(bw: Blockwise, bound: int) -> bool:
  """`dot4_linear` over `dot2_linear` for this weight (with ACT_BITS=8): its codes fit DOT4 (`fits_dot4`) and a
  sub-block fills 32 byte lanes (sub-blocks of 32; those of 16 fill half a 256-bit vector, and measured slower than
  DOT2's int16 lanes: qwen2's Q6_K down projection 236 against 174 us on an AVX-512 VNNI box)."""
  return fits_dot4(bw, bound) and bw.q.shape[1] >= 32


def dot4_linear(x: Tensor, bw: Blockwise, out_features: int, lanes: int, b: Tensor | None = None) -> Tensor:
  """x @ w.T (+ b) for x (..., 1, in) as integer products of bytes, llama.cpp's numerics: x quantized to int8 per
  sub-block (`quantize8`), times each sub-block's unsigned codes u (`unsigned_codes`) in int32,
  sum_(b,l) d*dx*(sum_(c,j) u*xq + c0*xqs) + m*dx*xqs over lanes l of P = min(lanes, S/4) int32 lanes of 4 products
  j, chunks c (c0: the codes' constant, xqs: xq summed over c and j, computed once per x): exactly w times the
  quantized x (the mins too take the quantized x's sums, as llama.cpp's Q8_1, so the error sum_i w_i*e_i has centered
  weights; x's exact sums would leave d*sum_i q_i*e_i, ~3x larger for Q4_1). A renderer with `dot4` reads u and xq as
  4P byte lanes and does a lane's 4 multiply-adds in one instruction (vpdpbusd): the codes are unpacked in byte lanes.
  The model takes it with ACT_BITS=8 (model.linear); x's error is 258x `dot2_linear`'s."""
  S, K = _check_fit(x, bw, out_features, lanes)
  P = min(lanes, S // 4)
  B, C, R = K // S, S // (4 * P), math.prod(x.shape[:-1])
  xq, dx = quantize8(x.reshape(R, K), S)
  u, c0 = unsigned_codes(bw)
  xr = xq.reshape(R, 1, B, C, P, 4).cast(dtypes.int32)
  xqs = xr.sum((3, 5))   # (R, 1, B, P)
  t = (u.reshape(1, out_features, B, C, P, 4) * xr).sum((3, 5))   # (R, out, B, P) int32
  if c0: t = t + (xqs * c0).contiguous()   # (the add becomes the dot's accumulator)
  dxb = dx.reshape(R, 1, B, 1)
  y = (Tensor(bw.d).reshape(1, out_features, B, 1) * dxb) * t.cast(dtypes.float32)
  if bw.m is not None: y = y + Tensor(bw.m).reshape(1, out_features, B, 1) * (dxb * xqs.cast(dtypes.float32)).contiguous()
  y = y.sum((2, 3)).reshape(*x.shape[:-1], out_features)
  return y + b if b is not None else y
