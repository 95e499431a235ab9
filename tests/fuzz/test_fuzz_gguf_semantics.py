"""Fuzzing what GGUF metadata means to the LLM app (the parser's own fuzzer, test_fuzz_gguf, covers the bytes): valid
metadata and tensor shapes of four architectures (llama with a byte-level BPE vocabulary, qwen2, qwen3moe, gemma3 with
a SentencePiece one), with 1-3 hostile edits: any model or tokenizer key replaced by a value of another GGUF type, a
negative, zero, huge, NaN or infinite number, or removed; a tensor's shape changed, a tensor removed or one added past
the block count. `LLM.from_metadata` (everything `LLM.load` checks before reading a weight) either accepts the file,
and then every dimension, count and constant is in range, the shapes fit, and the tokenizer and chat prompt work, or
raises a ValueError naming a GGUF key or a tensor: never another exception."""
from __future__ import annotations

import math

from hypothesis import event, given
from hypothesis import strategies as st

from plugrad.apps.llm.generate import LLM
from plugrad.apps.llm.model import META_MAX, Config, expected_shapes

BYTES = [chr(c) for c in range(0x21, 0x7F)]


def base(arch: str) -> tuple[dict, dict]:
  """(metadata, tensor shapes) of a small valid model of `arch`, as gguf_load returns them."""
  dim, heads, kv, ffn = 32, 4, 2, 48
  meta = {"general.architecture": arch, f"{arch}.block_count": 2, f"{arch}.context_length": 256, f"{arch}.embedding_length": dim,
          f"{arch}.feed_forward_length": ffn, f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": kv,
          f"{arch}.rope.freq_base": 10000.0, f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
          "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"}
  if arch == "qwen3moe": meta.update({f"{arch}.expert_count": 4, f"{arch}.expert_used_count": 2, f"{arch}.expert_feed_forward_length": 16})
  if arch == "gemma3":
    meta.update({f"{arch}.attention.key_length": 16, f"{arch}.attention.value_length": 16, f"{arch}.attention.sliding_window": 4,
                 f"{arch}.rope.scaling.type": "linear", f"{arch}.rope.scaling.factor": 2.0})
    pieces = ["▁", "h", "e", "l", "o", "he", "llo", "hello"]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    meta.update({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                 "tokenizer.ggml.token_type": [3, 3, 3, 2, 3, 3, 4] + [6] * 256 + [1] * len(pieces),
                 "tokenizer.ggml.scores": [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))],
                 "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.add_space_prefix": False})
  else:
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + BYTES + ["he", "llo"]
    meta.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2" if arch != "llama" else "smollm", "tokenizer.ggml.tokens": tokens,
                 "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3), "tokenizer.ggml.merges": ["h e", "l lo", "l o"],
                 "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2})
  cfg = Config.from_gguf(meta, len(tokens))
  shapes = {name: min(allowed) for name, (required, allowed) in expected_shapes(cfg).items()
            if required or (arch == "qwen2" and name.endswith(".bias")) or (arch in ("qwen3moe", "gemma3") and "_norm." in name and "attn_" in name)}
  return meta, shapes


ARCHS = ("llama", "qwen2", "qwen3moe", "gemma3")
OPTIONAL = ["attention.key_length", "attention.value_length", "rope.dimension_count", "expert_count", "expert_used_count",
            "expert_feed_forward_length", "attention.sliding_window", "rope.scaling.type", "rope.scaling.factor", "vocab_size",
            "expert_weights_norm"]
TOKENIZER = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores",
             "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
             "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template"]
INTS = st.sampled_from([0, 1, 2, 3, 4, 7, 8, 16, 32, 48, 255, 256, 2**31, 2**31 - 1, 2**32, 2**63, 2**64 - 1, -1, -2**31, -2**63])
FLOATS = st.sampled_from([0.0, -0.0, 1e-6, 0.5, 1.0, 1e6, 1e308, -1.0, float("nan"), float("inf"), float("-inf"), 5e-324])
VALUES = st.one_of(INTS, FLOATS, st.booleans(), st.text(max_size=8), st.none(),
                   st.lists(st.one_of(INTS, FLOATS, st.text(max_size=3), st.booleans()), max_size=5),
                   st.lists(st.lists(INTS, max_size=2), max_size=2))


@st.composite
def case(draw) -> tuple[dict, dict, list[str]]:
  arch = draw(st.sampled_from(ARCHS))
  meta, shapes = base(arch)
  edits = []
  for _ in range(draw(st.integers(1, 3))):
    kind = draw(st.sampled_from(["key", "key", "key", "shape", "drop", "extra"]))
    if kind == "key":
      key = draw(st.sampled_from([k for k in meta if k.startswith(arch + ".")] + [f"{arch}.{k}" for k in OPTIONAL] + TOKENIZER))
      value = draw(VALUES)
      if value is None: meta.pop(key, None)
      else: meta[key] = value
      edits.append(key)
    elif kind == "shape":
      name = draw(st.sampled_from(sorted(shapes)))
      shape = list(shapes[name])
      op = draw(st.sampled_from(["dim", "drop", "add", "swap"]))
      if op == "dim": shape[draw(st.integers(0, len(shape) - 1))] = draw(st.sampled_from([0, 1, 2, 16, 31, 33, 64, 2**40]))
      elif op == "drop" and len(shape) > 1: shape.pop()
      elif op == "add": shape.append(draw(st.sampled_from([1, 2])))
      else: shape.reverse()
      shapes[name] = tuple(shape)
      edits.append(name)
    elif kind == "drop":
      name = draw(st.sampled_from(sorted(shapes)))
      del shapes[name]
      edits.append(name)
    else:
      shapes[f"blk.{draw(st.sampled_from([2, 5, 1000]))}.attn_q.weight"] = (32, 32)
      edits.append("extra block")
  return meta, shapes, edits


def _sane(llm: LLM, meta: dict, shapes: dict) -> None:
  cfg = Config.from_gguf(meta, shapes["token_embd.weight"][0])
  for f in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size", "context_length"):
    v = getattr(cfg, f)
    assert type(v) is int and 1 <= v <= META_MAX, (f, v)
  assert cfg.n_heads % cfg.n_kv_heads == 0 and cfg.head_dim % 2 == 0 and 0 < (cfg.rope_dim or cfg.head_dim) <= cfg.head_dim
  for f in ("norm_eps", "rope_theta", "rope_scale", "embed_scale"):
    assert math.isfinite(getattr(cfg, f)) and getattr(cfg, f) > 0, f
  assert not cfg.n_experts or 1 <= cfg.n_experts_used <= cfg.n_experts
  tok = llm.tok
  ids = tok.encode("hello <|im_end|></s> world", parse_special=False)
  assert all(0 <= i < tok.vocab_size for i in ids) and not tok.control_ids & set(ids)
  assert tok.vocab_size <= cfg.vocab_size and all(0 <= i < tok.vocab_size for i in tok.eos_ids)
  try: prompt = llm.chat_prompt([{"role": "user", "content": "hello"}])
  except ValueError as e: assert "the prompt is empty" in str(e) or "chat template" in str(e), e   # (a template that renders nothing)
  else: assert prompt and all(0 <= i < tok.vocab_size for i in prompt)


@given(case())
def test_fuzz_gguf_semantics(c):
  meta, shapes, edits = c
  try: llm = LLM.from_metadata(meta, shapes)
  except ValueError as e:
    msg = str(e)
    assert "GGUF" in msg or "tensor" in msg or "architecture" in msg or "tokenizer" in msg or "template" in msg, (edits, msg)
    event("refused")
    return
  event("accepted")
  _sane(llm, meta, shapes)
