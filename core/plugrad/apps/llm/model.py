"""Decoder-only Transformers from GGUF files: llama (SmolLM2, Llama 3.x), qwen2 (QKV bias), qwen3 (q/k norm) and MoE
blocks (qwen3moe, olmoe: top-k experts per token). GQA, RoPE in the layout GGUF stores for each architecture, RMSNorm,
tied or separate output weights.

The KV cache of each block is two preallocated buffers written in place by a slice assign at a (symbolic) start
position: keys transposed (B, kv_heads, head_dim, positions), so the score matmul reads them contiguously along the
key axis like any matmul's right operand, and values (B, kv_heads, positions, head_dim); CACHE_PAD spare positions
take a padded prefill's tail and its padded key range; attention reads the slice [0, start + T). `Transformer.forward` takes
token embeddings (the embedding rows are gathered on the host from a dequantized table) and returns the logits of
the last position, so one graph serves every prompt length when T and start are bound Variables.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from plugrad.dtype import dtypes
from plugrad.nn.state import gguf_load
from plugrad.schedule.kernelize import buffer_of, is_buffer_view
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp

sint = int | UOp

# prefill lengths are padded up to a multiple of this, so the symbolic length is 8*v and the kernels over it can be
# register-blocked (codegen splits a range of size c*v by any k dividing c); padded rows come after the real ones,
# so the causal mask hides them from every real query and the next write overwrites their cache rows
PREFILL_MULTIPLE = 8
CACHE_PAD = 2 * PREFILL_MULTIPLE - 1   # positions past max_context a padded prefill may write or read (masked)

# llama.cpp's rope type per architecture: "norm" rotates adjacent pairs (x[2i], x[2i+1]) (the converter permuted q/k
# rows into that order), "neox" rotates halves (x[i], x[i + d/2]).
NEOX_ARCHS = {"qwen2", "qwen2moe", "qwen3", "qwen3moe", "olmoe", "olmo2", "phi3", "gemma", "gemma2", "stablelm", "falcon"}
SUPPORTED_ARCHS = {"llama", "mistral", "granite", "qwen2", "qwen3", "qwen3moe", "olmoe"}


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

  @staticmethod
  def from_gguf(meta: dict[str, Any], vocab_size: int | None = None) -> Config:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
      raise ValueError(f"unsupported model architecture {arch!r}; supported: {', '.join(sorted(SUPPORTED_ARCHS))}")
    def g(key: str, default: Any = None) -> Any:
      v = meta.get(f"{arch}.{key}", default)
      if v is None: raise ValueError(f"GGUF metadata lacks {arch}.{key}")
      return v
    dim, n_heads = g("embedding_length"), g("attention.head_count")
    n_kv = g("attention.head_count_kv", n_heads)
    head_dim = g("attention.key_length", dim // n_heads)
    n_experts = g("expert_count", 0)
    ffn = g("expert_feed_forward_length", 0) if n_experts else g("feed_forward_length")
    vocab = vocab_size or meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    return Config(arch=arch, dim=dim, n_layers=g("block_count"), n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, ffn_dim=ffn,
                  vocab_size=vocab, norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)), rope_theta=float(g("rope.freq_base", 10000.0)),
                  rope_dim=g("rope.dimension_count", head_dim), rope_neox=arch in NEOX_ARCHS, n_experts=n_experts,
                  n_experts_used=g("expert_used_count", 0), expert_norm=bool(g("expert_weights_norm", arch == "qwen3moe")),
                  context_length=g("context_length", 4096))


def rms_norm(x: Tensor, w: Tensor | None, eps: float) -> Tensor:
  y = x * ((x * x).mean(-1, keepdim=True) + eps).rsqrt()
  return y if w is None else y * w


def _one_token(x: Tensor) -> bool: return x.ndim >= 2 and isinstance(x.shape[-2], int) and x.shape[-2] == 1


def linear(x: Tensor, w: Tensor, b: Tensor | None = None, dense: UOp | None = None) -> Tensor:
  """x @ w.T (+ b) with w stored (out, in) as in GGUF. With more than one token the (quantized) weight is read as a
  float32 (in, out) matrix, the register-blocked form codegen vectorizes: `dense` when the model keeps that copy,
  else w dequantized into such a buffer first, once, instead of once per token inside the matmul."""
  if _one_token(x) or is_buffer_view(w.uop): return x.linear(w.transpose(), b)
  return x.linear(Tensor(dense) if dense is not None else w.transpose().contiguous(), b)


def rope_tables(head_dim: int, rope_dim: int, max_context: int, theta: float, freq_factors: np.ndarray | None = None) -> tuple[Tensor, Tensor]:
  """(cos, sin), each (max_context, rope_dim // 2), realized; freq_factors divide the frequencies (Llama 3 rope_freqs)."""
  inv = 1.0 / (theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim))
  if freq_factors is not None: inv = inv / freq_factors.astype(np.float64)
  ang = np.arange(max_context, dtype=np.float64)[:, None] * inv[None, :]
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


def attend(q: Tensor, keys_t: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
  """softmax(q k^T / sqrt(d) + mask) v with grouped query heads: q (B, H, T, D), keys_t (B, KV, D, S) (transposed),
  values (B, KV, S, D), mask broadcastable to (B, KV, H/KV, T, S). q (after RoPE) and the probabilities are
  materialized so the score and output kernels read them instead of recomputing RoPE per key and exp per output."""
  B, H, T, D = q.shape
  KV, S = keys_t.shape[1], keys_t.shape[3]
  qg = q.contiguous().reshape(B, KV, H // KV, T, D)
  sc = qg @ keys_t.reshape(B, KV, 1, D, S) * (1.0 / math.sqrt(D))
  if mask is not None: sc = sc + mask
  return (sc.softmax(-1).contiguous() @ values.reshape(B, KV, 1, S, D)).reshape(B, H, T, D)


def _t(u: UOp | None) -> Tensor | None: return None if u is None else Tensor(u)


def written(cache: Tensor, start: sint, T: sint, x: Tensor, axis: int = 2) -> Tensor:
  """cache[..., start:start+T, ...] = x in place (positions along `axis`); returns the cache as seen after that write
  (an AFTER node, so every kernel reading it is ordered after the write within the same graph)."""
  w = cache[(slice(None),) * axis + (slice(start, start + T),)].assign(x)
  return Tensor(UOp(Ops.AFTER, cache.dtype, (cache.uop, w.uop)))


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


# (elements, bytes) per block -> ggml type, for the types repack handles
_REPACKABLE = {(32, 18): "Q4_0", (32, 20): "Q4_1", (32, 34): "Q8_0", (256, 144): "Q4_K"}


def _nibbles_of(qs: np.ndarray, groups: int) -> Tensor:
  """uint8 (n, groups*width) -> float32 (n, groups*2*width): per group of `width` bytes, low nibbles then high ones."""
  n, width = qs.shape[0], qs.shape[1] // groups
  a, sh = Tensor(np.ascontiguousarray(qs)).reshape(n, groups, 1, width)._broadcasted(Tensor(np.array([0, 4], np.uint8)).reshape(1, 1, 2, 1))
  return (a._alu(Ops.SHR, sh) & 15).reshape(n, groups * 2 * width).cast(dtypes.float32)


def repack(u: UOp) -> UOp:
  """Q4_0 / Q4_1 / Q8_0 / Q4_K weights re-laid out for fast fused dequantization: the float16 block scales (and mins,
  and Q4_K's 6-bit sub-block scales) decoded once into float32 arrays, the quants in their own contiguous array.
  Dequantizing an element then costs a shift, a mask and a multiply-add. Other tensors are returned unchanged."""
  if (found := _blocks_of(u)) is None or (qtype := _REPACKABLE.get(found[1:])) is None: return u
  b, _, tsize = found
  raw = Tensor(b).numpy().reshape(-1, tsize)
  n = raw.shape[0]
  def f16(col: int) -> np.ndarray: return np.ascontiguousarray(raw[:, col:col + 2]).view(np.float16).astype(np.float32).reshape(n, 1)
  if qtype == "Q4_K":   # 8 sub-blocks of 32: w = d*sc[j]*q - dmin*mn[j], the 6-bit (sc, mn) pairs packed in 12 bytes
    d_, m_, md = (raw[:, 4 + 4 * i:8 + 4 * i].astype(np.int32) for i in range(3))
    sc = np.concatenate([d_ & 63, (md & 15) | ((d_ >> 2) & 0x30)], axis=1).astype(np.float32)
    mn = np.concatenate([m_ & 63, (md >> 4) | ((m_ >> 2) & 0x30)], axis=1).astype(np.float32)
    q = _nibbles_of(raw[:, 16:], 4).reshape(n, 8, 32)
    w = Tensor((f16(0) * sc).reshape(n, 8, 1)) * q - Tensor((f16(2) * mn).reshape(n, 8, 1))
  elif qtype == "Q8_0": w = Tensor(f16(0)) * Tensor(np.ascontiguousarray(raw[:, 2:]).view(np.int8)).cast(dtypes.float32)
  else:
    q = _nibbles_of(raw[:, tsize - 16:], 1)   # low nibbles are elements 0..15, high 16..31
    w = Tensor(f16(0)) * (q - 8.0 if qtype == "Q4_0" else q) + (Tensor(f16(2)) if qtype == "Q4_1" else 0.0)
  return w.reshape(u.shape).uop


class Block:
  def __init__(self, cfg: Config, w: dict[str, Tensor], i: int, max_context: int, batch: int = 1):
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
    if cfg.n_experts:
      self.router, self.gate_exps = get("ffn_gate_inp.weight"), get("ffn_gate_exps.weight")
      self.up_exps, self.down_exps = get("ffn_up_exps.weight"), get("ffn_down_exps.weight")
    else: self.w_gate, self.w_up, self.w_down = get("ffn_gate.weight"), get("ffn_up.weight"), get("ffn_down.weight")
    # Tensor.empty: a unique buffer each (zeros(...).contiguous() twice is one hash-consed node, hence one buffer)
    rows = max_context + CACHE_PAD
    self.cache_k = Tensor.empty(batch, cfg.n_kv_heads, cfg.head_dim, rows)   # transposed; zeroed by Transformer
    self.cache_v = Tensor.empty(batch, cfg.n_kv_heads, rows, cfg.head_dim)
    self.dense: dict[UOp, UOp] = {}   # quantized weight -> realized float32 (in, out) copy for prefill (Transformer fills it)

  def lin(self, x: Tensor, w: UOp, b: UOp | None = None) -> Tensor:
    """`linear` with this block's weight w, reading its dense prefill copy when the model keeps one."""
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

  def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, heads, T, head_dim), k and v (B, kv_heads, T, head_dim) of x (B, T, dim), RoPE applied."""
    c = self.cfg
    B, T, _ = x.shape
    q = self.lin(x, self.wq, self.bq).reshape(B, T, c.n_heads, c.head_dim)
    k = self.lin(x, self.wk, self.bk).reshape(B, T, c.n_kv_heads, c.head_dim)
    v = self.lin(x, self.wv, self.bv).reshape(B, T, c.n_kv_heads, c.head_dim)
    q, k = self._qk_norm(q, _t(self.q_norm)), self._qk_norm(k, _t(self.k_norm))
    q, k = apply_rope(q, cos, sin, c.rope_neox), apply_rope(k, cos, sin, c.rope_neox)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

  def attention(self, x: Tensor, start: sint, cos: Tensor, sin: Tensor, keys_len: sint | None = None, slot: sint | None = None) -> Tensor:
    """Self-attention of x's T tokens at [start, start + T) over the cached keys [0, keys_len) (default start + T;
    a padded prefill reads a multiple of PREFILL_MULTIPLE keys, the extra ones masked). With `slot`, x is one
    sequence (B = 1) living in that row of the batched caches."""
    c = self.cfg
    B, T, _ = x.shape
    q, k, v = self._qkv(x, cos, sin)
    end = keys_len if keys_len is not None else T if isinstance(start, int) and start == 0 else start + T  # 0+T != T structurally
    ck, cv = (self.cache_k, self.cache_v) if slot is None else (self.cache_k[slot:slot + 1], self.cache_v[slot:slot + 1])
    keys = written(ck, start, T, k.transpose(2, 3), axis=3)[:, :, :, 0:end]
    values = written(cv, start, T, v)[:, :, 0:end]
    one = isinstance(T, int) and T == 1 and keys_len is None   # one token over exactly its keys: nothing to mask
    mask = None if one else Tensor.full((1, 1, 1, T, end), float("-inf"), device=x.device).triu(start + 1)
    out = attend(q, keys, values, mask)
    return self.lin(out.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim), self.wo)

  def attention_slots(self, x: Tensor, positions: list[sint], cos: Tensor, sin: Tensor, keys_len: sint, mask: Tensor) -> Tensor:
    """One new token per row of the batch, row b at its own position positions[b] (cos/sin: (B, 1, head_dim/2)); each row
    attends to its cached keys [0, keys_len) through `mask` (B, 1, 1, 1, keys_len): 0 where a key belongs to it, -inf
    elsewhere."""
    c = self.cfg
    B = x.shape[0]
    q, k, v = self._qkv(x, cos, sin)
    kt = k.transpose(2, 3)
    wk = [self.cache_k[b:b + 1, :, :, p:p + 1].assign(kt[b:b + 1]) for b, p in enumerate(positions)]
    wv = [self.cache_v[b:b + 1, :, p:p + 1].assign(v[b:b + 1]) for b, p in enumerate(positions)]
    keys = Tensor(UOp(Ops.AFTER, self.cache_k.dtype, (self.cache_k.uop, *[w.uop for w in wk])))[:, :, :, 0:keys_len]
    values = Tensor(UOp(Ops.AFTER, self.cache_v.dtype, (self.cache_v.uop, *[w.uop for w in wv])))[:, :, 0:keys_len]
    out = attend(q, keys, values, mask)
    return self.lin(out.transpose(1, 2).reshape(B, 1, c.n_heads * c.head_dim), self.wo)

  def ffn(self, x: Tensor) -> Tensor:
    if not self.cfg.n_experts: return self.lin(self.lin(x, self.w_gate).silu() * self.lin(x, self.w_up), self.w_down)
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

  def __call__(self, x: Tensor, start: sint, cos: Tensor, sin: Tensor, keys_len: sint | None = None, slot: sint | None = None) -> Tensor:
    # the residual stream is materialized after each half: otherwise every later kernel re-adds all earlier outputs
    h = (x + self.attention(rms_norm(x, _t(self.attn_norm), self.cfg.norm_eps), start, cos, sin, keys_len, slot)).contiguous()
    return (h + self.ffn(rms_norm(h, _t(self.ffn_norm), self.cfg.norm_eps))).contiguous()

  def slots_step(self, x: Tensor, positions: list[sint], cos: Tensor, sin: Tensor, keys_len: sint, mask: Tensor) -> Tensor:
    h = (x + self.attention_slots(rms_norm(x, _t(self.attn_norm), self.cfg.norm_eps), positions, cos, sin, keys_len, mask)).contiguous()
    return (h + self.ffn(rms_norm(h, _t(self.ffn_norm), self.cfg.norm_eps))).contiguous()


class Transformer:
  """A decoder with per-block KV caches of `max_context` positions. `forward(x, start)`: x (B, T, dim) embeddings of
  the tokens at positions [start, start + T) -> logits (B, vocab) of the last one (float32)."""

  def __init__(self, cfg: Config, weights: dict[str, Tensor], max_context: int = 4096, batch: int = 1,
               dense_prefill_bytes: int = 1 << 30):
    if (cfg.rope_dim or cfg.head_dim) != cfg.head_dim:
      raise ValueError(f"partial rotary embeddings (rope dim {cfg.rope_dim} < head dim {cfg.head_dim}) aren't supported")
    if not isinstance(max_context, int) or max_context < 2: raise ValueError(f"max_context must be an int >= 2, got {max_context!r}")
    self.cfg, self.max_context, self.batch = cfg, max_context, batch
    self.devices: tuple[str, ...] | None = None   # set by parallel.shard_transformer: inputs are replicated onto them
    if "token_embd.weight" not in weights: raise ValueError("model file lacks tensor 'token_embd.weight'")
    self.tok_embd = weights["token_embd.weight"].uop
    if tuple(self.tok_embd.shape) != (cfg.vocab_size, cfg.dim):
      raise ValueError(f"token_embd.weight has shape {self.tok_embd.shape}, expected (vocab={cfg.vocab_size}, dim={cfg.dim})")
    self.output = weights["output.weight"].uop if "output.weight" in weights else self.tok_embd  # tied when absent
    self.norm = weights["output_norm.weight"].uop if "output_norm.weight" in weights else None
    self.layers = [Block(cfg, weights, i, max_context, batch) for i in range(cfg.n_layers)]
    caches = [c for layer in self.layers for c in (layer.cache_k, layer.cache_v)]
    Tensor.realize_all(*caches)
    Tensor.realize_all(*[c.assign(0.0) for c in caches])   # one realize for all caches
    ff = weights.get("rope_freqs.weight")
    self.cos, self.sin = rope_tables(cfg.head_dim, cfg.rope_dim or cfg.head_dim, max_context + CACHE_PAD, cfg.rope_theta,
                                     None if ff is None else Tensor(ff.uop).numpy())
    self._embd_np: np.ndarray | None = None
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

  def embedding_table(self) -> np.ndarray:
    """The dequantized token embeddings on the host (float32; float16 when that would exceed 512 MB)."""
    if self._embd_np is None:
      t = Tensor(self.tok_embd).contiguous()   # a new node: the quantized tok_embd stays lazy for the output layer
      big = self.cfg.vocab_size * self.cfg.dim * 4 > 512 << 20
      self._embd_np = (t.cast(dtypes.float16) if big else t).numpy()
    return self._embd_np

  def embed(self, tokens: Iterable[int]) -> np.ndarray:
    ids = np.asarray(list(tokens), dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
      raise IndexError(f"token id out of range [0, {self.cfg.vocab_size}): {ids[(ids < 0) | (ids >= self.cfg.vocab_size)][:5].tolist()}")
    return self.embedding_table()[ids].astype(np.float32)

  def forward(self, x: Tensor, start: sint, last: sint | None = None, keys_len: sint | None = None, slot: sint | None = None) -> Tensor:
    """Logits of row `last` (default T - 1) of the T tokens x runs at [start, start + T), attending to the cached
    keys [0, keys_len) (default start + T); a padded prefill passes its last real row and a padded key count. With
    `slot`, x (1, T, dim) is the sequence cached in that row of the batch."""
    T = x.shape[1]
    if self.devices is not None: x = x.to(self.devices)
    cos, sin = self.cos[start:start + T], self.sin[start:start + T]
    for layer in self.layers: x = layer(x, start, cos, sin, keys_len, slot)
    if last is None: last = T - 1
    last = x[:, last:last + 1] if not (isinstance(T, int) and T == 1) else x
    h = rms_norm(last.reshape(x.shape[0], self.cfg.dim), _t(self.norm), self.cfg.norm_eps)
    return linear(h, _t(self.output)).cast(dtypes.float32)

  def forward_slots(self, x: Tensor, positions: list[sint], cos: Tensor, sin: Tensor, keys_len: sint, mask: Tensor) -> Tensor:
    """Logits (B, vocab) of one new token per batch row, row b at position positions[b] of its own cache row (see
    `Block.attention_slots`): the batched decode step of continuous batching."""
    for layer in self.layers: x = layer.slots_step(x, positions, cos, sin, keys_len, mask)
    h = rms_norm(x, _t(self.norm), self.cfg.norm_eps)   # (B, 1, dim): one token per row, so the output layer reads the quantized table
    return linear(h, _t(self.output)).cast(dtypes.float32).reshape(x.shape[0], -1)

  def reference_logits(self, tokens: list[int]) -> np.ndarray:
    """All positions' logits (T, vocab) of `tokens` from position 0, without touching the KV cache: plain concrete
    shapes and a causal mask, for tests."""
    x = Tensor(self.embed(tokens)[None])
    T = len(tokens)
    cos, sin = self.cos[0:T], self.sin[0:T]
    for layer in self.layers:
      c = self.cfg
      h = rms_norm(x, _t(layer.attn_norm), c.norm_eps)
      q = linear(h, _t(layer.wq), _t(layer.bq)).reshape(1, T, c.n_heads, c.head_dim)
      k = linear(h, _t(layer.wk), _t(layer.bk)).reshape(1, T, c.n_kv_heads, c.head_dim)
      v = linear(h, _t(layer.wv), _t(layer.bv)).reshape(1, T, c.n_kv_heads, c.head_dim)
      q, k = layer._qk_norm(q, _t(layer.q_norm)), layer._qk_norm(k, _t(layer.k_norm))
      q, k = apply_rope(q, cos, sin, c.rope_neox), apply_rope(k, cos, sin, c.rope_neox)
      o = q.transpose(1, 2).scaled_dot_product_attention(k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
      x = (x + linear(o.transpose(1, 2).reshape(1, T, c.n_heads * c.head_dim), _t(layer.wo))).contiguous()
      x = (x + layer.ffn(rms_norm(x, _t(layer.ffn_norm), c.norm_eps))).contiguous()
    return linear(rms_norm(x, _t(self.norm), self.cfg.norm_eps), _t(self.output))[0].numpy()

  @staticmethod
  def from_gguf(path: str, max_context: int = 4096, progress: Callable[[Iterable], Iterable] | None = None,
                dense_prefill_bytes: int = 1 << 30, batch: int = 1) -> tuple[Transformer, dict[str, Any]]:
    """Load a GGUF file: (model, metadata). Quantized weights stay quantized in memory and are dequantized inside the
    kernels that use them (plus float32 prefill copies within `dense_prefill_bytes`, see `keep_dense_weights`).
    `progress` wraps the iteration over tensors being read (e.g. tqdm)."""
    meta, tensors = gguf_load(path)
    uops = {k: t.uop for k, t in tensors.items()}
    del tensors   # no live lazy Tensors while realizing (each realize walks them)
    copies: dict[UOp, UOp] = {}
    for name in (progress(list(uops)) if progress is not None else uops):   # read each tensor's bytes into memory once
      todo = [n for n in uops[name].toposort() if n.op is Ops.COPY and n not in copies]
      if todo:
        ts = [Tensor(n) for n in todo]
        Tensor.realize_all(*ts)
        copies.update({n: t.uop for n, t in zip(todo, ts)})
    weights = {k: Tensor(repack(u.substitute(copies))) for k, u in uops.items()}
    cfg = Config.from_gguf(meta, weights["token_embd.weight"].shape[0] if "token_embd.weight" in weights else None)
    return Transformer(cfg, weights, max_context, batch=batch, dense_prefill_bytes=dense_prefill_bytes), meta

  def param_count(self) -> int:
    """Parameters (elements of every weight, the tied output counted once)."""
    n = math.prod(self.tok_embd.shape)
    if self.output is not self.tok_embd: n += math.prod(self.output.shape)
    for layer in self.layers:
      for k, v in vars(layer).items():
        if isinstance(v, UOp): n += math.prod(v.shape)
    return n + (math.prod(self.norm.shape) if self.norm is not None else 0)
