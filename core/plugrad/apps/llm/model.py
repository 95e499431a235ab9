"""Decoder-only Transformers from GGUF files: llama (SmolLM2, Llama 3.x), qwen2 (QKV bias), qwen3 (q/k norm) and MoE
blocks (qwen3moe, olmoe: top-k experts per token). GQA, RoPE in the layout GGUF stores for each architecture, RMSNorm,
tied or separate output weights.

The KV cache of each block is two preallocated buffers written in place by a slice assign at a (symbolic) start
position: keys and values both (B, kv_heads, positions, head_dim), so writing a token's key is one contiguous row
(the score matmul reads the keys through a transposed view, like x @ W.T); CACHE_PAD spare positions
take a padded prefill's tail and its padded key range; attention reads the slice [0, start + T). `Transformer.forward` takes
token embeddings (`write_embeddings` gathers their rows from the quantized table, inside the decode steps' JITs or for
the host) and returns the logits of the last position, so one graph serves every prompt length when T and start are
bound Variables.
"""
from __future__ import annotations

import gc
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from plugrad.device import Buffer, BufferOptions, Device, canonicalize
from plugrad.dtype import DType, dtypes
from plugrad.engine.realize import buffer_for, set_buffer
from plugrad.helpers import getenv
from plugrad import TinyJit, Variable
from plugrad.nn.state import gguf_load
from plugrad.uop.buffers import buffer_of, is_buffer_view
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp

from .quant import (REPACK_CHUNK_BYTES, _REPACKABLE, activation_bits, blockwise_linear, blockwise_of, dot2_linear, dot4_bound, dot4_linear,
                    has_dot2, prefers_dot4, repack_blocks, repacked, row_lanes, row_width, rows_linear, vector_lanes)

sint = int | UOp

# prefill lengths are padded up to a multiple of this, so the symbolic length is 8*v and the kernels over it can be
# register-blocked (codegen splits a range of size c*v by any k dividing c); padded rows come after the real ones,
# so the causal mask hides them from every real query and the next write overwrites their cache rows
PREFILL_MULTIPLE = 8
CACHE_PAD = 2 * PREFILL_MULTIPLE - 1   # positions past max_context a padded prefill may write or read (masked)
# the caches' position axis is allocated a multiple of this long (it was for keys stored transposed, one row per head
# dimension, whose vector loads along the keys straddled cache lines at 1039 positions; kept: it costs < 16 rows)
CACHE_ROW_ALIGN = 16


KV_DTYPES = {"float16": dtypes.float16, "float32": dtypes.float32}


def kv_dtype(name: str | None = None) -> DType:
  """The KV caches' element type: `name`, else KV_DTYPE, default float16 (as llama.cpp keeps them): attention reads
  half the bytes a key of float32 (SmolLM2's decode step at 400 positions, 4 slots, AVX-512 code: ~11 -> ~8.3 ms) and
  the caches take half the memory. Keys and values are rounded to float16 where they are written (a magnitude past
  65504 becomes inf: KV_DTYPE=float32 for a model whose activations reach it); attention computes in float32."""
  key = name if name is not None else getenv("KV_DTYPE", "float16")
  if key not in KV_DTYPES: raise ValueError(f"KV_DTYPE must be one of {sorted(KV_DTYPES)}, got {key!r}")
  return KV_DTYPES[key]


def cache_rows(max_context: int) -> int:
  """Positions allocated in each KV cache: max_context + CACHE_PAD, rounded up to a multiple of CACHE_ROW_ALIGN."""
  return -(-(max_context + CACHE_PAD) // CACHE_ROW_ALIGN) * CACHE_ROW_ALIGN
EMBED_ROWS = 8   # embedding rows gathered per kernel call

# llama.cpp's rope type per architecture: "norm" rotates adjacent pairs (x[2i], x[2i+1]) (the converter permuted q/k
# rows into that order), "neox" rotates halves (x[i], x[i + d/2]).
NEOX_ARCHS = {"qwen2", "qwen2moe", "qwen3", "qwen3moe", "olmoe", "olmo2", "phi3", "gemma", "gemma2", "gemma3", "stablelm", "falcon"}
SUPPORTED_ARCHS = {"llama", "mistral", "granite", "qwen2", "qwen3", "qwen3moe", "olmoe", "gemma3"}
GEMMA3_SWA_PATTERN = 6   # gemma3: every 6th layer attends globally, the 5 before it through the sliding window


@dataclass(frozen=True)
class Config:
  arch: str
  dim: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  vocab_size: int
  norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  rope_dim: int = 0           # 0: head_dim
  rope_neox: bool = False
  n_experts: int = 0
  n_experts_used: int = 0
  expert_norm: bool = False   # renormalize the top-k router weights to sum to 1 (qwen3moe) or not (olmoe)
  context_length: int = 4096  # what the model was trained for (informational)
  embed_scale: float = 1.0    # token embeddings are multiplied by this (gemma3: sqrt(dim))
  sliding_window: int = 0     # sliding-window layers see the keys of the last `sliding_window` positions (itself included)
  swa_pattern: int = 0        # layer i slides when i % swa_pattern < swa_pattern - 1 (gemma3: 6); 0: no layer slides
  rope_theta_local: float = 0.0   # RoPE base of the sliding-window layers (0: rope_theta)
  rope_scale: float = 1.0     # linear RoPE scaling of the other layers: positions divided by it
  post_norms: bool = False    # RMSNorm of each block's attention and FFN outputs before their residual add (gemma3)
  act: str = "silu"           # the FFN gate's activation: "silu" or "gelu_tanh"

  def slides(self, i: int) -> bool:
    """Whether layer i attends through the sliding window."""
    return bool(self.sliding_window and self.swa_pattern and i % self.swa_pattern < self.swa_pattern - 1)

  @staticmethod
  def from_gguf(meta: dict[str, Any], vocab_size: int | None = None) -> Config:
    """The configuration the `<arch>.*` keys of GGUF metadata describe, each checked (type and range) with a
    ValueError naming the key; `vocab_size` (the embedding table's rows) overrides the metadata's."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in SUPPORTED_ARCHS:
      raise ValueError(f"unsupported model architecture {arch!r}; supported: {', '.join(sorted(SUPPORTED_ARCHS))}")
    m = _Meta(meta, arch)
    dim, n_heads = m.integer("embedding_length"), m.integer("attention.head_count")
    n_kv = m.integer("attention.head_count_kv", n_heads)
    if n_heads % n_kv:
      raise ValueError(f"GGUF metadata {arch}.attention.head_count={n_heads} is not a multiple of {arch}.attention.head_count_kv={n_kv}")
    if "attention.key_length" not in m and dim % n_heads:
      raise ValueError(f"GGUF metadata {arch}.embedding_length={dim} is not a multiple of {arch}.attention.head_count={n_heads} "
                       f"(and {arch}.attention.key_length is absent)")
    head_dim = m.integer("attention.key_length", dim // n_heads)
    if head_dim % 2: raise ValueError(f"GGUF metadata {arch}.attention.key_length={head_dim} is odd: RoPE rotates pairs")
    if m.integer("attention.value_length", head_dim) != head_dim:
      raise ValueError(f"GGUF metadata {arch}.attention.value_length differs from {arch}.attention.key_length={head_dim}: not supported")
    n_experts = m.integer("expert_count", 0, lo=0)
    ffn = m.integer("expert_feed_forward_length") if n_experts else m.integer("feed_forward_length")
    n_used = m.integer("expert_used_count", 0, lo=0)
    if n_experts and not 1 <= n_used <= n_experts:
      raise ValueError(f"GGUF metadata {arch}.expert_used_count={n_used} must be in [1, {arch}.expert_count={n_experts}]")
    vocab = vocab_size or m.integer("vocab_size", None) or len(meta.get("tokenizer.ggml.tokens") or [])
    if not vocab: raise ValueError(f"GGUF metadata gives no vocabulary size ({arch}.vocab_size, tokenizer.ggml.tokens, token_embd.weight)")
    rope_dim = m.integer("rope.dimension_count", head_dim)
    if rope_dim % 2 or rope_dim > head_dim:
      raise ValueError(f"GGUF metadata {arch}.rope.dimension_count={rope_dim} must be even and at most the head dim {head_dim}")
    extra: dict[str, Any] = {}
    if arch == "gemma3":
      scaling = m.text("rope.scaling.type", None)
      if scaling not in (None, "none", "linear"):
        raise ValueError(f"GGUF metadata gemma3.rope.scaling.type={scaling!r} isn't supported (none and linear are)")
      extra = dict(embed_scale=math.sqrt(dim), sliding_window=m.integer("attention.sliding_window"), swa_pattern=GEMMA3_SWA_PATTERN,
                   rope_theta_local=10000.0, rope_scale=m.number("rope.scaling.factor", 1.0) if scaling == "linear" else 1.0,
                   post_norms=True, act="gelu_tanh")
    return Config(arch=arch, dim=dim, n_layers=m.integer("block_count"), n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, ffn_dim=ffn,
                  vocab_size=vocab, norm_eps=m.number("attention.layer_norm_rms_epsilon", 1e-5), rope_theta=m.number("rope.freq_base", 10000.0),
                  rope_dim=rope_dim, rope_neox=arch in NEOX_ARCHS, n_experts=n_experts, n_experts_used=n_used,
                  expert_norm=m.flag("expert_weights_norm", arch == "qwen3moe"), context_length=m.integer("context_length", 4096), **extra)


# a bound on sizes in metadata: no real model has a dimension, head count or layer count near it, and sizes past it
# would only overflow later arithmetic (ints in GGUF are up to 64 bits)
META_MAX = 1 << 31


class _Meta:
  """Typed, range-checked reads of `<arch>.<key>` metadata: a ValueError names the key, what it must be and what it is."""
  def __init__(self, meta: dict[str, Any], arch: str): self.meta, self.arch = meta, arch
  def __contains__(self, key: str) -> bool: return f"{self.arch}.{key}" in self.meta

  def _get(self, key: str, default: Any) -> tuple[str, Any]:
    k = f"{self.arch}.{key}"
    v = self.meta.get(k, default)
    if v is None and default is not None: raise ValueError(f"GGUF metadata lacks {k}")
    return k, v

  def integer(self, key: str, default: Any = ..., lo: int = 1) -> Any:
    k, v = self._get(key, None if default is ... else default)
    if v is None and default is ...: raise ValueError(f"GGUF metadata lacks {k}")
    if v is None: return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= META_MAX:
      raise ValueError(f"GGUF metadata {k} must be an integer in [{lo}, {META_MAX}], got {type(v).__name__} {v!r:.60}")
    return v

  def number(self, key: str, default: float) -> float:
    k, v = self._get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
      raise ValueError(f"GGUF metadata {k} must be a finite number > 0, got {type(v).__name__} {v!r:.60}")
    return float(v)

  def text(self, key: str, default: str | None) -> str | None:
    k, v = self._get(key, default)
    if v is not None and not isinstance(v, str): raise ValueError(f"GGUF metadata {k} must be a string, got {type(v).__name__} {v!r:.60}")
    return v

  def flag(self, key: str, default: bool) -> bool:
    k, v = self._get(key, default)
    if not isinstance(v, (bool, int)) or isinstance(v, int) and v not in (0, 1):
      raise ValueError(f"GGUF metadata {k} must be a boolean, got {type(v).__name__} {v!r:.60}")
    return bool(v)


def expected_shapes(cfg: Config) -> dict[str, tuple[bool, set[tuple[int, ...]]]]:
  """name -> (required, the shapes it may have) for every tensor a model of `cfg` reads (GGUF order reversed: rows first)."""
  d, hd, H, KV, f, E = cfg.dim, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.n_experts
  out: dict[str, tuple[bool, set[tuple[int, ...]]]] = {
    "token_embd.weight": (True, {(cfg.vocab_size, d)}), "output.weight": (False, {(cfg.vocab_size, d)}),
    "output_norm.weight": (False, {(d,)}), "rope_freqs.weight": (False, {((cfg.rope_dim or hd) // 2,)})}
  for i in range(cfg.n_layers):
    p = f"blk.{i}."
    out.update({p + "attn_norm.weight": (True, {(d,)}), p + "ffn_norm.weight": (True, {(d,)}),
                p + "attn_q.weight": (True, {(H * hd, d)}), p + "attn_k.weight": (True, {(KV * hd, d)}),
                p + "attn_v.weight": (True, {(KV * hd, d)}), p + "attn_output.weight": (True, {(d, H * hd)}),
                p + "attn_q.bias": (False, {(H * hd,)}), p + "attn_k.bias": (False, {(KV * hd,)}), p + "attn_v.bias": (False, {(KV * hd,)}),
                p + "attn_q_norm.weight": (False, {(hd,), (H * hd,)}), p + "attn_k_norm.weight": (False, {(hd,), (KV * hd,)}),
                p + "post_attention_norm.weight": (cfg.post_norms, {(d,)}), p + "post_ffw_norm.weight": (cfg.post_norms, {(d,)})})
    if E: out.update({p + "ffn_gate_inp.weight": (True, {(E, d)}), p + "ffn_gate_exps.weight": (True, {(E, f, d)}),
                      p + "ffn_up_exps.weight": (True, {(E, f, d)}), p + "ffn_down_exps.weight": (True, {(E, d, f)})})
    else: out.update({p + "ffn_gate.weight": (True, {(f, d)}), p + "ffn_up.weight": (True, {(f, d)}), p + "ffn_down.weight": (True, {(d, f)})})
  return out


def check_shapes(cfg: Config, shapes: dict[str, tuple]) -> None:
  """A ValueError naming the first tensor that is missing or whose shape doesn't fit the metadata, or the number of
  blocks the tensors have when it isn't the metadata's block count."""
  blocks = {int(k.split(".")[1]) for k in shapes if k.startswith("blk.") and k.split(".")[1].isdigit()}
  if (blocks and max(blocks) >= cfg.n_layers) or len(blocks) < cfg.n_layers:   # (before listing n_layers blocks' tensors)
    missing = min(set(range(len(blocks) + 1)) - blocks)
    have = f"tensors for {max(blocks) + 1} blocks" if blocks and max(blocks) >= cfg.n_layers else f"no tensors for block {missing}"
    raise ValueError(f"the model file has {have}, but its metadata says {cfg.arch}.block_count={cfg.n_layers}")
  for name, (required, allowed) in expected_shapes(cfg).items():
    if name not in shapes:
      if required: raise ValueError(f"model file lacks tensor {name!r} ({cfg.arch}, {cfg.arch}.block_count={cfg.n_layers})")
      continue
    if tuple(shapes[name]) not in allowed:
      want = " or ".join(str(s) for s in sorted(allowed))
      raise ValueError(f"tensor {name!r} has shape {tuple(shapes[name])}, but the metadata (dim {cfg.dim}, {cfg.n_heads}/{cfg.n_kv_heads} "
                       f"heads of {cfg.head_dim}, ffn {cfg.ffn_dim}, vocab {cfg.vocab_size}) needs {want}")


def rms_norm(x: Tensor, w: Tensor | None, eps: float) -> Tensor:
  y = x * ((x * x).mean(-1, keepdim=True) + eps).rsqrt()
  return y if w is None else y * w


def _one_token(x: Tensor) -> bool: return x.ndim >= 2 and isinstance(x.shape[-2], int) and x.shape[-2] == 1


def linear(x: Tensor, w: Tensor, b: Tensor | None = None, dense: UOp | None = None) -> Tensor:
  """x @ w.T (+ b) with w stored (out, in) as in GGUF. One token per row (decode, and the batched decode step) with a
  block-quantized weight (`repack`): a weight stored output rows in lanes goes through quant.rows_linear (int16 x
  against pairs of codes, or with ACT_BITS=8 int8 x against quads of unsigned codes); else with ACT_BITS=8 on a device
  with byte dot products (`dot4`) and sub-blocks of 32, x is quantized to int8 per sub-block and multiplied with the
  unsigned codes (quant.dot4_linear, llama.cpp's numerics); else on one with pairwise int16 multiply-adds (`dot2`), x
  is quantized to int16 per sub-block and multiplied with the integer codes (quant.dot2_linear; DOT2=0 turns it off); else, for a lone token
  on a device with SIMD lanes, the codes are summed against x per sub-block and the scales applied once per sub-block
  (quant.blockwise_linear). Otherwise one token per row dequantizes inside the matrix-vector product. With more than
  one token the (quantized) weight is read as a float32 (in, out) matrix, the register-blocked form codegen vectorizes:
  `dense` when the model keeps that copy, else w dequantized into such a buffer first, once, instead of once per token
  inside the matmul."""
  static = all(isinstance(s, int) for s in x.shape)
  if _one_token(x) and static and (bw := blockwise_of(w.uop)) is not None and (lanes := vector_lanes(x.device)) >= 4:
    if bw.rows is not None and has_dot2(x.device): return rows_linear(x, bw, w.shape[0], b)
    if activation_bits() == 8 and prefers_dot4(bw, dot4_bound(x.device)): return dot4_linear(x, bw, w.shape[0], lanes, b)
    if has_dot2(x.device) and getenv("DOT2", 1): return dot2_linear(x, bw, w.shape[0], lanes, b)
    if x.shape[:-1] == (1,) * (x.ndim - 1): return blockwise_linear(x, bw, w.shape[0], lanes, b)
  if _one_token(x) or is_buffer_view(w.uop): return x.linear(w.transpose(), b)
  return x.linear(Tensor(dense) if dense is not None else w.transpose().contiguous(), b)


def rope_tables(head_dim: int, rope_dim: int, max_context: int, theta: float, freq_factors: np.ndarray | None = None,
                scale: float = 1.0) -> tuple[Tensor, Tensor]:
  """(cos, sin), each (max_context, rope_dim // 2), realized; freq_factors divide the frequencies (Llama 3 rope_freqs),
  `scale` the positions (linear RoPE scaling)."""
  inv = 1.0 / (theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim))
  if freq_factors is not None: inv = inv / freq_factors.astype(np.float64)
  ang = np.arange(max_context, dtype=np.float64)[:, None] / scale * inv[None, :]
  return Tensor(np.cos(ang).astype(np.float32)).realize(), Tensor(np.sin(ang).astype(np.float32)).realize()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, neox: bool) -> Tensor:
  """Rotate x (B, T, heads, head_dim) by the angles cos/sin (T, head_dim/2), or (B, T, head_dim/2) when each row of the
  batch has its own positions. Pairs are (x[i], x[i + d/2]) (neox) or (x[2i], x[2i+1]); written with a flip over the
  pair axis instead of a concatenation (cat of symbolic shapes leaves unsimplified sizes, see the report)."""
  B, T, H, D = x.shape
  half = D // 2
  sign = Tensor([-1.0, 1.0], device=x.device)
  x = x.contiguous()   # read twice below (direct and flipped): don't let the projection producing x run twice
  cb = B if cos.ndim == 3 else 1
  if neox:
    xp, c, s, sign = x.reshape(B, T, H, 2, half), cos.reshape(cb, T, 1, 1, half), sin.reshape(cb, T, 1, 1, half), sign.reshape(2, 1)
  else:
    xp, c, s = x.reshape(B, T, H, half, 2), cos.reshape(cb, T, 1, half, 1), sin.reshape(cb, T, 1, half, 1)
  return (xp * c + xp.flip(3 if neox else 4) * s * sign).reshape(B, T, H, D)


def causal_mask(T: sint, S: sint, start: sint, window: int = 0, device: str | tuple[str, ...] | None = None) -> Tensor:
  """(1, 1, 1, T, S) on `device`: 0 where query t (at position start + t) may read key s, -inf elsewhere: keys after
  it, and with a `window` the keys `window` or more positions before it."""
  m = Tensor.full((1, 1, 1, T, S), float("-inf"), device=device).triu(start + 1)
  return m if not window else m + Tensor.full((1, 1, 1, T, S), float("-inf"), device=device).tril(start - window)


class ScoresScratch:
  """One float32 buffer that the blocks' prefill attentions write their scores into, each taking its softmax there in
  place: blocks run one after another and a block's scores are dead once its p.V product ran. Otherwise each attention
  has a scores and a probabilities buffer of (B, H, T, S) floats alive at once, 2 x 19 MB of SmolLM2's 512-token chunk.
  The buffer grows to the largest request (symbolic sizes count at their maximum); a single device only."""

  def __init__(self) -> None: self.buf: Tensor | None = None

  def discard(self) -> None:
    """The scores are dead between prefills: give the buffer's memory back until the next one writes it."""
    if self.buf is not None: buffer_for(buffer_of(self.buf.uop)).discard()

  def view(self, shape: tuple[sint, ...], device: str | tuple[str, ...]) -> Tensor | None:
    """A contiguous float32 (shape) view of the buffer (laid out for the call's sizes), or None on several devices."""
    if not isinstance(device, str): return None
    n: sint = math.prod(shape)
    need = int(n.vmax) if isinstance(n, UOp) else n
    if self.buf is None or self.buf.shape[0] < need or self.buf.device != device:
      self.buf = Tensor.empty(need, dtype=dtypes.float32, device=device).realize()
    return self.buf[:n].reshape(shape)


def attend(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scratch: ScoresScratch | None = None) -> Tensor:
  """softmax(q k^T / sqrt(d) + mask) v with grouped query heads: q (B, H, T, D), keys and values (B, KV, S, D), mask
  broadcastable to (B, KV, H/KV, T, S). q (after RoPE) and the probabilities are materialized so the score and output
  kernels read them instead of recomputing RoPE per key and exp per output; with a `scratch` (and more than one query)
  the scores and then the probabilities are written into it, the softmax in place. The output is realized in its own
  shape: a consumer that made it contiguous as (T, H*D) would give its kernel one range of H*D outputs, and the values
  of a position, shared by the H/KV heads of a KV head, would be read once per head (gemma3's decode: 22 -> 34 us a
  layer)."""
  B, H, T, D = q.shape
  KV, S = keys.shape[1], keys.shape[2]
  qg = q.contiguous().reshape(B, KV, H // KV, T, D)
  sc = qg @ keys.reshape(B, KV, 1, S, D).transpose(3, 4) * (1.0 / math.sqrt(D))
  if mask is not None: sc = sc + mask
  one = isinstance(T, int) and T == 1
  if scratch is not None and not one and (buf := scratch.view(sc.shape, q.device)) is not None:
    scores = buf.assign(sc)
    probs = scores.assign(scores.softmax(-1))
  else: probs = sc.softmax(-1).contiguous()
  return (probs @ values.reshape(B, KV, 1, S, D)).contiguous().reshape(B, H, T, D)


def zeroed(*shape: int, dtype: DType = dtypes.float32) -> Tensor:
  """A `dtype` tensor of its own buffer on the default device, reading as zero (BufferOptions.zeroed): where the device
  gives fresh zero pages (CPU), a KV cache reserved for max_context is resident only where tokens were written. The
  cache must read as zeros, not garbage: a padded prefill reads a few keys past those written, and masks them by adding
  -inf to their scores, which only a finite key leaves at -inf."""
  t = Tensor.empty(*shape, dtype=dtype)
  set_buffer(buffer_of(t.uop), Buffer(t.device, t.numel(), t.dtype, BufferOptions(zeroed=True)).ensure_allocated())
  return t


def _t(u: UOp | None) -> Tensor | None: return None if u is None else Tensor(u)


def written(cache: Tensor, start: sint, T: sint, x: Tensor, axis: int = 2) -> Tensor:
  """cache[..., start:start+T, ...] = x in place (positions along `axis`, x cast to the cache's dtype); returns the cache
  as seen after that write (an AFTER node, so every kernel reading it is ordered after the write within the same graph)."""
  w = cache[(slice(None),) * axis + (slice(start, start + T),)].assign(x.cast(cache.dtype))
  return Tensor(UOp(Ops.AFTER, cache.dtype, (cache.uop, w.uop)))


def file_range(u: UOp) -> tuple[int, int, DType, tuple[int, ...]] | None:
  """(byte offset, byte count, dtype, shape) of the one range of its file that a tensor from `gguf_load` copies to
  the compute device (the blocks of a quantized one, as uint8 (blocks, block bytes)), else None."""
  copies = [n for n in u.toposort() if n.op is Ops.COPY]
  if len(copies) != 1: return None
  src = copies[0].src[0]
  views = [n for n in src.toposort() if n.op is Ops.BUFFER_VIEW]
  if len(views) != 1 or not all(isinstance(x, int) for x in src.shape): return None
  count, offset = views[0].arg
  return offset, count * views[0].dtype.itemsize, views[0].dtype, tuple(src.shape)


def _pread(fd: int, path: str, offset: int, n: int) -> bytes:
  data = os.pread(fd, n, offset)
  if len(data) != n: raise ValueError(f"{path}: {n} bytes at offset {offset} are beyond the end of the file (truncated while loading?)")
  return data


def read_weight(fd: int, path: str, u: UOp, device: str) -> UOp:
  """A tensor of a GGUF file (`u`: its lazy graph from `gguf_load`) read into `device` memory, a few MB at a time
  with pread (nothing of the file stays mapped): a quantized weight repacked (`quant.repack_blocks`) into its stored
  arrays, any other tensor copied into a buffer of its own. The memory a weight takes while it is read is its size
  plus a few chunks, so loading peaks near the loaded model's size."""
  where = file_range(u)
  if where is None: return Tensor(u).realize().uop   # (not a plain range of the file: whatever gguf_load built)
  offset, nbytes, dtype, shape = where
  if len(shape) == 2 and dtype == dtypes.uint8 and u.dtype == dtypes.float32:   # quantized blocks
    n, tsize = shape
    qtype = _REPACKABLE.get((math.prod(u.shape) // n if n else 0, tsize))
    if qtype is None: return Tensor(u).realize().uop
    def blocks(start: int, count: int) -> np.ndarray:
      return np.frombuffer(_pread(fd, path, offset + start * tsize, count * tsize), np.uint8).reshape(count, tsize)
    bw = repack_blocks(blocks, n, tsize, qtype, int(u.shape[0]) if len(u.shape) == 2 else 0, row_lanes(device), device,
                       row_width(device, qtype))
    return repacked(bw, u.shape)
  t = Tensor.empty(*u.shape, dtype=u.dtype, device=device).realize()
  buf = buffer_for(buffer_of(t.uop))
  for at in range(0, nbytes, REPACK_CHUNK_BYTES):
    chunk = _pread(fd, path, offset + at, min(REPACK_CHUNK_BYTES, nbytes - at))
    buf.view(len(chunk), dtypes.uint8, at).copyin(chunk)
  return t.uop


def release_file(path: str) -> None:
  """Give back the memory of loading: the file's mapping (its pages count as resident while mapped; the tensors read
  from it are copies), the raw blocks repacking replaced (freed by a garbage collection: lazy graphs hold cycles) and
  what the allocators cache."""
  dev = Device[canonicalize(f"DISK:{os.path.abspath(path)}")]
  if hasattr(dev, "release"): dev.release()
  gc.collect()
  for d in {canonicalize(Device.DEFAULT)}:
    if hasattr(alloc := Device[d].allocator, "free_cache"): alloc.free_cache()


class Block:
  def __init__(self, cfg: Config, w: dict[str, Tensor], i: int, max_context: int, batch: int = 1, kv: DType | None = None):
    # weights are kept as UOps and wrapped in Tensors when a graph is built: live lazy Tensors make every realize
    # walk their graphs (see the report on Tensor.realize_all)
    self.cfg, self.i = cfg, i
    p = f"blk.{i}."
    def get(name: str, required: bool = True) -> UOp | None:
      if p + name in w: return w[p + name].uop
      if required: raise ValueError(f"model file lacks tensor {p + name!r} ({cfg.arch})")
      return None
    self.attn_norm, self.ffn_norm = get("attn_norm.weight"), get("ffn_norm.weight")
    self.wq, self.wk, self.wv, self.wo = get("attn_q.weight"), get("attn_k.weight"), get("attn_v.weight"), get("attn_output.weight")
    self.bq, self.bk, self.bv = get("attn_q.bias", False), get("attn_k.bias", False), get("attn_v.bias", False)
    self.q_norm, self.k_norm = get("attn_q_norm.weight", False), get("attn_k_norm.weight", False)
    self.post_attn_norm = get("post_attention_norm.weight", cfg.post_norms)
    self.post_ffn_norm = get("post_ffw_norm.weight", cfg.post_norms)
    self.window = cfg.sliding_window if cfg.slides(i) else 0
    if cfg.n_experts:
      self.router, self.gate_exps = get("ffn_gate_inp.weight"), get("ffn_gate_exps.weight")
      self.up_exps, self.down_exps = get("ffn_up_exps.weight"), get("ffn_down_exps.weight")
    else: self.w_gate, self.w_up, self.w_down = get("ffn_gate.weight"), get("ffn_up.weight"), get("ffn_down.weight")
    rows, kv = cache_rows(max_context), kv_dtype() if kv is None else kv
    self.cache_k = zeroed(batch, cfg.n_kv_heads, rows, cfg.head_dim, dtype=kv)
    self.cache_v = zeroed(batch, cfg.n_kv_heads, rows, cfg.head_dim, dtype=kv)
    self.dense: dict[UOp, UOp] = {}   # quantized weight -> realized float32 (in, out) copy for prefill (Transformer fills it)
    self.scratch: ScoresScratch | None = None   # the prefill attention's scores (one the Transformer gives every block)

  def lin(self, x: Tensor, w: UOp, b: UOp | None = None, fused: bool = False) -> Tensor:
    """`linear` with this block's weight w, reading its dense prefill copy when the model keeps one; `fused`: the
    dequantization inside the matmul even for several tokens (short prefills: no (in, out) buffer to fill first)."""
    if fused: return x.linear(_t(w).transpose(), _t(b))
    return linear(x, _t(w), _t(b), self.dense.get(w))

  def dense_weights(self) -> list[UOp]:
    """The quantized (computed, not stored) weights of the block that a prefill reads as matrices."""
    ws = [self.wq, self.wk, self.wv, self.wo] + ([] if self.cfg.n_experts else [self.w_gate, self.w_up, self.w_down])
    return [w for w in ws if not is_buffer_view(w)]

  def _qk_norm(self, x: Tensor, w: Tensor | None) -> Tensor:
    if w is None: return x
    if w.shape[0] == x.shape[-1]: return rms_norm(x, w, self.cfg.norm_eps)   # per head (qwen3)
    B, T, H, D = x.shape                                                        # over the whole projection (olmoe)
    return rms_norm(x.reshape(B, T, H * D), w, self.cfg.norm_eps).reshape(B, T, H, D)

  def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor, fused: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, heads, T, head_dim), k and v (B, kv_heads, T, head_dim) of x (B, T, dim), RoPE applied."""
    c = self.cfg
    B, T, _ = x.shape
    q = self.lin(x, self.wq, self.bq, fused).reshape(B, T, c.n_heads, c.head_dim)
    k = self.lin(x, self.wk, self.bk, fused).reshape(B, T, c.n_kv_heads, c.head_dim)
    v = self.lin(x, self.wv, self.bv, fused).reshape(B, T, c.n_kv_heads, c.head_dim)
    q, k = self._qk_norm(q, _t(self.q_norm)), self._qk_norm(k, _t(self.k_norm))
    q, k = apply_rope(q, cos, sin, c.rope_neox), apply_rope(k, cos, sin, c.rope_neox)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

  def attention(self, x: Tensor, start: sint, cos: Tensor, sin: Tensor, keys_len: sint | None = None, slot: sint | None = None,
                fused: bool = False) -> Tensor:
    """Self-attention of x's T tokens at [start, start + T) over the cached keys [0, keys_len) (default start + T;
    a padded prefill reads a multiple of PREFILL_MULTIPLE keys, the extra ones masked). With `slot`, x is one
    sequence (B = 1) living in that row of the batched caches."""
    c = self.cfg
    B, T, _ = x.shape
    q, k, v = self._qkv(x, cos, sin, fused)
    end = keys_len if keys_len is not None else T if isinstance(start, int) and start == 0 else start + T  # 0+T != T structurally
    ck, cv = (self.cache_k, self.cache_v) if slot is None else (self.cache_k[slot:slot + 1], self.cache_v[slot:slot + 1])
    keys = written(ck, start, T, k)[:, :, 0:end].cast(dtypes.float32)
    values = written(cv, start, T, v)[:, :, 0:end].cast(dtypes.float32)
    one = isinstance(T, int) and T == 1 and keys_len is None and not self.window   # one token over exactly its keys: nothing to mask
    mask = None if one else causal_mask(T, end, start, self.window, x.device)
    out = attend(q, keys, values, mask, self.scratch)
    return self.lin(out.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim), self.wo, None, fused)

  def attention_slots(self, x: Tensor, positions: list[sint], cos: Tensor, sin: Tensor, keys_len: sint, mask: Tensor) -> Tensor:
    """One new token per row of the batch, row b at its own position positions[b] (cos/sin: (B, 1, head_dim/2)); each row
    attends to its cached keys [0, keys_len) through `mask` (B, 1, 1, 1, keys_len): 0 where a key belongs to it, -inf
    elsewhere."""
    c = self.cfg
    B = x.shape[0]
    q, k, v = self._qkv(x, cos, sin)
    wk = [self.cache_k[b:b + 1, :, p:p + 1].assign(k[b:b + 1].cast(self.cache_k.dtype)) for b, p in enumerate(positions)]
    wv = [self.cache_v[b:b + 1, :, p:p + 1].assign(v[b:b + 1].cast(self.cache_v.dtype)) for b, p in enumerate(positions)]
    keys = Tensor(UOp(Ops.AFTER, self.cache_k.dtype, (self.cache_k.uop, *[w.uop for w in wk])))[:, :, 0:keys_len]
    values = Tensor(UOp(Ops.AFTER, self.cache_v.dtype, (self.cache_v.uop, *[w.uop for w in wv])))[:, :, 0:keys_len]
    keys, values = keys.cast(dtypes.float32), values.cast(dtypes.float32)
    out = attend(q, keys, values, mask)
    return self.lin(out.transpose(1, 2).reshape(B, 1, c.n_heads * c.head_dim), self.wo)

  def ffn(self, x: Tensor, fused: bool = False) -> Tensor:
    if not self.cfg.n_experts:
      g, u = self.lin(x, self.w_gate, None, fused), self.lin(x, self.w_up, None, fused)
      if _one_token(x): g, u = g.contiguous(), u.contiguous()
      g = g.silu() if self.cfg.act == "silu" else g.gelu(approximate="tanh")
      return self.lin(g * u, self.w_down, None, fused)
    return self.moe(x)

  def moe(self, x: Tensor) -> Tensor:
    """Top-k experts per token: router softmax, the k largest weights kept (optionally renormalized), the experts'
    SwiGLU outputs mixed by them. Computed densely over all experts with zero weight on the unselected ones."""
    c = self.cfg
    B, T, D = x.shape
    probs = linear(x, _t(self.router)).softmax(-1)
    sel, masked = None, probs
    for _ in range(c.n_experts_used):
      oh = masked.argmax(-1).one_hot(c.n_experts) == 1
      sel = oh if sel is None else sel | oh
      masked = oh.where(float("-inf"), masked)
    wts = sel.where(probs, 0.0)
    if c.expert_norm: wts = wts / wts.sum(-1, keepdim=True)
    xe = x.reshape(B, T, 1, 1, D)
    g = (xe * _t(self.gate_exps).reshape(1, 1, c.n_experts, c.ffn_dim, D)).sum(-1)
    u = (xe * _t(self.up_exps).reshape(1, 1, c.n_experts, c.ffn_dim, D)).sum(-1)
    h = (g.silu() * u).reshape(B, T, c.n_experts, 1, c.ffn_dim)
    d = (h * _t(self.down_exps).reshape(1, 1, c.n_experts, D, c.ffn_dim)).sum(-1)
    return (d * wts.reshape(B, T, c.n_experts, 1)).sum(2)

  def __call__(self, x: Tensor, start: sint, cos: Tensor, sin: Tensor, keys_len: sint | None = None, slot: sint | None = None,
               fused: bool = False) -> Tensor:
    # the residual stream is materialized after each half: otherwise every later kernel re-adds all earlier outputs
    h = (x + self._post(self.attention(self._pre(x, self.attn_norm), start, cos, sin, keys_len, slot, fused), self.post_attn_norm)).contiguous()
    return (h + self._post(self.ffn(self._pre(h, self.ffn_norm), fused), self.post_ffn_norm)).contiguous()

  def _pre(self, x: Tensor, w: UOp | None) -> Tensor:
    # materialized (a row of floats per token): fused into the projections after it, the normalization was recomputed
    # for every block of output columns (a batched decode step's gate+up: as many operations as dequantizing the weight)
    return rms_norm(x, _t(w), self.cfg.norm_eps).contiguous()
  def _post(self, y: Tensor, w: UOp | None) -> Tensor: return y if w is None else rms_norm(y, _t(w), self.cfg.norm_eps)

  def slots_step(self, x: Tensor, positions: list[sint], cos: Tensor, sin: Tensor, keys_len: sint, mask: Tensor) -> Tensor:
    h = (x + self._post(self.attention_slots(self._pre(x, self.attn_norm), positions, cos, sin, keys_len, mask), self.post_attn_norm)).contiguous()
    return (h + self._post(self.ffn(self._pre(h, self.ffn_norm)), self.post_ffn_norm)).contiguous()


class Transformer:
  """A decoder with per-block KV caches of `max_context` positions (of `kv_dtype(kv)`). `forward(x, start)`: x (B, T, dim) embeddings of
  the tokens at positions [start, start + T) -> logits (B, vocab) of the last one (float32)."""

  def __init__(self, cfg: Config, weights: dict[str, Tensor], max_context: int = 4096, batch: int = 1,
               dense_prefill_bytes: int = 0, kv: str | None = None):
    if (cfg.rope_dim or cfg.head_dim) != cfg.head_dim:
      raise ValueError(f"partial rotary embeddings (rope dim {cfg.rope_dim} < head dim {cfg.head_dim}) aren't supported")
    if not isinstance(max_context, int) or max_context < 2: raise ValueError(f"max_context must be an int >= 2, got {max_context!r}")
    self.cfg, self.max_context, self.batch = cfg, max_context, batch
    self.devices: tuple[str, ...] | None = None   # set by parallel.shard_transformer: inputs are replicated onto them
    check_shapes(cfg, {k: v.shape for k, v in weights.items()})
    self.tok_embd = weights["token_embd.weight"].uop
    self.output = weights["output.weight"].uop if "output.weight" in weights else self.tok_embd  # tied when absent
    self.norm = weights["output_norm.weight"].uop if "output_norm.weight" in weights else None
    self.kv_dtype = kv_dtype(kv)
    self.layers = [Block(cfg, weights, i, max_context, batch, self.kv_dtype) for i in range(cfg.n_layers)]
    self.scores = ScoresScratch()
    for layer in self.layers: layer.scratch = self.scores
    ff = weights.get("rope_freqs.weight")
    self.cos, self.sin = rope_tables(cfg.head_dim, cfg.rope_dim or cfg.head_dim, max_context + CACHE_PAD, cfg.rope_theta,
                                     None if ff is None else Tensor(ff.uop).numpy(), cfg.rope_scale)
    self.cos_l, self.sin_l = self.cos, self.sin   # the sliding-window layers' RoPE tables
    if any(layer.window for layer in self.layers) and cfg.rope_theta_local and (cfg.rope_theta_local, 1.0) != (cfg.rope_theta, cfg.rope_scale):
      self.cos_l, self.sin_l = rope_tables(cfg.head_dim, cfg.rope_dim or cfg.head_dim, max_context + CACHE_PAD, cfg.rope_theta_local)
    self._row_vars = [Variable(f"tok{i}", 0, cfg.vocab_size - 1) for i in range(EMBED_ROWS)]
    self._rows_jit = TinyJit(self._gather_rows)
    self._rows = Tensor.empty(EMBED_ROWS, cfg.dim).realize()
    self.keep_dense_weights(dense_prefill_bytes)

  def keep_dense_weights(self, budget: int) -> bool:
    """When float32 (in, out) copies of all the blocks' quantized weights fit in `budget` bytes, compute them once now:
    a prefill then reads them instead of dequantizing every weight on every call (a fixed ~0.25 s per prefill for
    SmolLM2-135M, most of a short prompt's time). Decode keeps reading the quantized weights. Returns whether it did."""
    ws = [(layer, w) for layer in self.layers for w in layer.dense_weights()]
    if not ws or sum(math.prod(w.shape) * 4 for _, w in ws) > budget: return False
    ts = [Tensor(w).transpose().contiguous() for _, w in ws]
    Tensor.realize_all(*ts)
    for (layer, w), t in zip(ws, ts): layer.dense[w] = t.uop
    return True

  def fused_long_prefill(self) -> bool:
    """Whether a long prefill should read the quantized weights through the fused graph (`forward(fused=True)`)
    rather than dequantize each weight into an (in, out) buffer first: when the model keeps no dense copies and the
    device's codegen packs a matmul operand that is an expression (CPU renderers with SIMD lanes, PACK not off: the
    PACK optimization, codegen/pack.py, dequantizes each weight once into its panel-major scratch buffer, so the
    separate (in, out) buffer would only add a write and a read of every weight; 1.35x faster on the qwen2-shaped
    benchmark model, see BENCHMARKS.md)."""
    if any(layer.dense for layer in self.layers): return False
    devs = self.devices if self.devices is not None else (canonicalize(Device.DEFAULT),)
    return bool(getenv("PACK", 1)) and all(vector_lanes(d) >= 2 for d in devs)

  def check_ids(self, ids: Iterable[int] | np.ndarray) -> None:
    """IndexError naming the token ids outside the vocabulary."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
      raise IndexError(f"token id out of range [0, {self.cfg.vocab_size}): {ids[(ids < 0) | (ids >= self.cfg.vocab_size)][:5].tolist()}")

  def write_embeddings(self, dst: Tensor, ids: Sequence[sint]) -> None:
    """Write the embedding rows of token `ids` (ints or bound Variables) into rows [0, len(ids)) of dst (n, dim), in
    place, scaled by embed_scale: each row dequantized from the (quantized) table by a small kernel of its own that
    reads only that row. (A cat of the rows would be one kernel whose every element evaluates all the gated pieces:
    360 us a call for 8 SmolLM2 rows, against ~10 us.) The decode steps call it inside their TinyJit with their
    tokens' Variables, so a step gathers its own rows."""
    table = Tensor(self.tok_embd)
    rows = [table[i:i + 1].cast(dtypes.float32) for i in ids]
    if self.cfg.embed_scale != 1.0: rows = [r * self.cfg.embed_scale for r in rows]
    Tensor.realize_all(*[dst[j:j + 1].assign(r) for j, r in enumerate(rows)])

  def _gather_rows(self, *ids: Any) -> Tensor:
    self.write_embeddings(self._rows, ids)
    return self._rows

  def embed(self, tokens: Iterable[int]) -> np.ndarray:
    """The embeddings (n, dim) of token ids, float32 on the host (`write_embeddings`, EMBED_ROWS rows per call of one
    TinyJit whose row indices are bound Variables), so no dequantized copy of the table is kept."""
    ids = np.asarray(list(tokens), dtype=np.int64)
    self.check_ids(ids)
    k = EMBED_ROWS
    padded = np.concatenate([ids, np.zeros(-len(ids) % k, np.int64)])
    rows = [self._rows_jit(*[v.bind(int(i)) for v, i in zip(self._row_vars, padded[j:j + k])]).numpy() for j in range(0, len(padded), k)]
    return np.concatenate(rows)[:len(ids)] if rows else np.zeros((0, self.cfg.dim), np.float32)

  def forward(self, x: Tensor, start: sint, last: sint | None = None, keys_len: sint | None = None, slot: sint | None = None,
              fused: bool = False) -> Tensor:
    """Logits of row `last` (default T - 1) of the T tokens x runs at [start, start + T), attending to the cached
    keys [0, keys_len) (default start + T); a padded prefill passes its last real row and a padded key count. With
    `slot`, x (1, T, dim) is the sequence cached in that row of the batch. `fused`: the matmuls dequantize the
    weights in their inner loop (fast for a few tokens) instead of into an (in, out) buffer first."""
    T = x.shape[1]
    if self.devices is not None: x = x.to(self.devices)
    cos, sin = self.cos[start:start + T], self.sin[start:start + T]
    cos_l, sin_l = (cos, sin) if self.cos_l is self.cos else (self.cos_l[start:start + T], self.sin_l[start:start + T])
    for layer in self.layers: x = layer(x, start, *((cos_l, sin_l) if layer.window else (cos, sin)), keys_len, slot, fused)
    if last is None: last = T - 1
    last = x[:, last:last + 1] if not (isinstance(T, int) and T == 1) else x
    h = rms_norm(last.reshape(x.shape[0], self.cfg.dim), _t(self.norm), self.cfg.norm_eps).contiguous()   # (see Block._pre)
    return linear(h, _t(self.output)).cast(dtypes.float32)

  def forward_slots(self, x: Tensor, positions: list[sint], ropes: tuple[Tensor, Tensor, Tensor, Tensor], keys_len: sint,
                    masks: tuple[Tensor, Tensor]) -> Tensor:
    """Logits (B, vocab) of one new token per batch row, row b at position positions[b] of its own cache row (see
    `Block.attention_slots`): the batched decode step of continuous batching. ropes: (cos, sin, cos, sin) rows of
    the global and the sliding-window layers; masks: (global, sliding-window) masks."""
    for layer in self.layers:
      w = bool(layer.window)
      x = layer.slots_step(x, positions, ropes[2 * w], ropes[2 * w + 1], keys_len, masks[w])
    h = rms_norm(x, _t(self.norm), self.cfg.norm_eps).contiguous()   # (B, 1, dim): one token per row, so the output layer reads the quantized table
    return linear(h, _t(self.output)).cast(dtypes.float32).reshape(x.shape[0], -1)

  def reference_logits(self, tokens: list[int]) -> np.ndarray:
    """All positions' logits (T, vocab) of `tokens` from position 0, without touching the KV cache (keys and values
    rounded to its dtype all the same): plain concrete shapes and a causal mask, for tests."""
    x = Tensor(self.embed(tokens)[None])
    T = len(tokens)
    for layer in self.layers:
      c = self.cfg
      cos, sin = (self.cos_l, self.sin_l) if layer.window else (self.cos, self.sin)
      h = rms_norm(x, _t(layer.attn_norm), c.norm_eps)
      q = linear(h, _t(layer.wq), _t(layer.bq)).reshape(1, T, c.n_heads, c.head_dim)
      k = linear(h, _t(layer.wk), _t(layer.bk)).reshape(1, T, c.n_kv_heads, c.head_dim)
      v = linear(h, _t(layer.wv), _t(layer.bv)).reshape(1, T, c.n_kv_heads, c.head_dim)
      q, k = layer._qk_norm(q, _t(layer.q_norm)), layer._qk_norm(k, _t(layer.k_norm))
      q, k = apply_rope(q, cos[0:T], sin[0:T], c.rope_neox), apply_rope(k, cos[0:T], sin[0:T], c.rope_neox)
      k, v = (t.cast(self.kv_dtype).cast(dtypes.float32) for t in (k, v))   # as the caches round them
      if layer.window: o = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal_mask(T, T, 0, layer.window, x.device))
      else: o = q.transpose(1, 2).scaled_dot_product_attention(k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
      a = linear(o.transpose(1, 2).reshape(1, T, c.n_heads * c.head_dim), _t(layer.wo))
      x = (x + layer._post(a, layer.post_attn_norm)).contiguous()
      x = (x + layer._post(layer.ffn(rms_norm(x, _t(layer.ffn_norm), c.norm_eps)), layer.post_ffn_norm)).contiguous()
    return linear(rms_norm(x, _t(self.norm), self.cfg.norm_eps), _t(self.output))[0].numpy()

  @staticmethod
  def from_gguf(path: str, max_context: int = 4096, progress: Callable[[Iterable], Iterable] | None = None,
                dense_prefill_bytes: int = 0, batch: int = 1, kv: str | None = None) -> tuple[Transformer, dict[str, Any]]:
    """Load a GGUF file: (model, metadata). Quantized weights stay quantized in memory and are dequantized inside the
    kernels that use them (plus float32 prefill copies within `dense_prefill_bytes`, see `keep_dense_weights`).
    `progress` wraps the iteration over tensors being read (e.g. tqdm)."""
    meta, tensors = gguf_load(path)
    return Transformer.from_loaded(path, meta, tensors, max_context, progress, dense_prefill_bytes, batch, kv), meta

  @staticmethod
  def from_loaded(path: str, meta: dict[str, Any], tensors: dict[str, Tensor], max_context: int = 4096,
                  progress: Callable[[Iterable], Iterable] | None = None, dense_prefill_bytes: int = 0, batch: int = 1,
                  kv: str | None = None) -> Transformer:
    """The model of `gguf_load(path)`'s (meta, tensors): the metadata and every tensor's shape checked first
    (`Config.from_gguf`, `check_shapes`: a ValueError naming the key or tensor, before anything is read), then the
    tensors read one at a time (`read_weight`)."""
    kv_dtype(kv)   # a bad KV_DTYPE is refused before anything is read
    uops = {k: t.uop for k, t in tensors.items()}
    tensors.clear()   # no live lazy Tensors while realizing (each realize walks them)
    cfg = Config.from_gguf(meta, uops["token_embd.weight"].shape[0] if "token_embd.weight" in uops else None)
    check_shapes(cfg, {k: u.shape for k, u in uops.items()})
    dev = canonicalize(Device.DEFAULT)
    fd = os.open(path, os.O_RDONLY)
    try:
      for name in (progress(list(uops)) if progress is not None else list(uops)): uops[name] = read_weight(fd, path, uops[name], dev)
    finally: os.close(fd)
    release_file(path)
    model = Transformer(cfg, {k: Tensor(u) for k, u in uops.items()}, max_context, batch, dense_prefill_bytes, kv)
    del uops
    release_file(path)
    return model

  def param_count(self) -> int:
    """Parameters (elements of every weight, the tied output counted once)."""
    n = math.prod(self.tok_embd.shape)
    if self.output is not self.tok_embd: n += math.prod(self.output.shape)
    for layer in self.layers:
      for k, v in vars(layer).items():
        if isinstance(v, UOp): n += math.prod(v.shape)
    return n + (math.prod(self.norm.shape) if self.norm is not None else 0)
