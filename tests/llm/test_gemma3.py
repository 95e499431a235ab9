"""gemma3 on a synthetic tiny GGUF written with the `gguf` package (7 layers: 6 sliding-window and 1 global, window 4,
qk-norm, post-attention/post-FFN norms, GELU-tanh, embeddings scaled by sqrt(dim), linear RoPE scaling on the global
layer and base 10000 on the others, head_dim != dim / heads, a SentencePiece vocabulary) against the float64 numpy
forward pass of llm_helpers: prefill, decode past the window, the batched engine's decode (several slots and one), and
the tokenizer."""
import numpy as np
import pytest
from llm_helpers import np_forward, tiny_config, tiny_weights

from plugrad.apps.llm.generate import LLM, BatchGenerator
from plugrad.apps.llm.model import Config

gguf = pytest.importorskip("gguf")

PIECES = [("▁", -1.0), ("h", -2.0), ("e", -2.0), ("l", -2.0), ("o", -2.0), ("w", -3.0), ("r", -3.0), ("d", -3.0), ("ll", -5.0),
          ("he", -6.0), ("llo", -7.0), ("hello", -8.0), ("▁w", -6.5), ("or", -5.5), ("▁wor", -10.0), ("▁world", -11.0), ("ld", -12.0)]
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


def write_gemma3(path: str) -> tuple[Config, dict[str, np.ndarray]]:
  tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + [p for p, _ in PIECES]
  types = [3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * len(PIECES)
  cfg = tiny_config("gemma3", vocab_size=len(tokens))
  w = tiny_weights(cfg, seed=3)
  wr = gguf.GGUFWriter(path, "gemma3")
  wr.add_block_count(cfg.n_layers), wr.add_context_length(1024), wr.add_embedding_length(cfg.dim)
  wr.add_feed_forward_length(cfg.ffn_dim), wr.add_head_count(cfg.n_heads), wr.add_head_count_kv(cfg.n_kv_heads)
  wr.add_key_length(cfg.head_dim), wr.add_value_length(cfg.head_dim), wr.add_rope_freq_base(cfg.rope_theta)
  wr.add_layer_norm_rms_eps(cfg.norm_eps), wr.add_sliding_window(cfg.sliding_window)
  wr.add_rope_scaling_type(gguf.RopeScalingType.LINEAR), wr.add_rope_scaling_factor(cfg.rope_scale)
  wr.add_tokenizer_model("llama"), wr.add_token_list(tokens), wr.add_token_types(types)
  wr.add_token_scores([0.0] * (len(tokens) - len(PIECES)) + [s for _, s in PIECES])
  wr.add_bos_token_id(2), wr.add_eos_token_id(1), wr.add_unk_token_id(3), wr.add_pad_token_id(0)
  wr.add_add_bos_token(True), wr.add_add_space_prefix(False)
  for name, arr in w.items(): wr.add_tensor(name, arr)
  wr.write_header_to_file(), wr.write_kv_data_to_file(), wr.write_tensors_to_file()
  wr.close()
  return cfg, w


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf")
  cfg, w = write_gemma3(path)
  return path, cfg, w


def test_config_from_gguf(gemma):
  path, cfg, _ = gemma
  llm = LLM.load(path, max_context=32)
  c = llm.model.cfg
  got = (c.arch, c.head_dim, c.sliding_window, c.rope_scale, c.rope_theta_local, c.act, c.post_norms)
  assert got == ("gemma3", 16, 4, 2.0, 10000.0, "gelu_tanh", True)
  assert c.embed_scale == pytest.approx(cfg.dim ** 0.5) and c.rope_neox
  assert [layer.window for layer in llm.model.layers] == [4, 4, 4, 4, 4, 0, 4]


def test_prefill_and_decode_match_float64_reference(gemma):
  path, cfg, w = gemma
  llm = LLM.load(path, max_context=32)
  toks = [2, 270, 275, 9, 100, 45, 271, 33, 278, 12, 7]   # 11 tokens: the window (4) matters from the 5th on
  ref = np_forward(cfg, w, toks + [5, 61, 200])
  g = llm.gen
  np.testing.assert_allclose(g.forward(toks, 0), ref[len(toks) - 1], rtol=2e-4, atol=2e-4)
  for i, t in enumerate([5, 61, 200]):   # decode steps (run, capture, replay)
    np.testing.assert_allclose(g.forward([t], len(toks) + i), ref[len(toks) + i], rtol=2e-4, atol=2e-4, err_msg=f"decode {i}")
  np.testing.assert_allclose(llm.model.reference_logits(toks), ref[:len(toks)], rtol=2e-4, atol=2e-4)
  short = [2, 7, 8]   # the short-prefill graph (matmuls dequantize in their loop) too
  np.testing.assert_allclose(g.forward(short, 0), np_forward(cfg, w, short)[-1], rtol=2e-4, atol=2e-4)


def test_batched_decode_with_sliding_window(gemma):
  path, cfg, w = gemma
  llm = LLM.load(path, max_context=32, batch=2)
  b = BatchGenerator(llm.model)
  seqs = {0: [2, 270, 275, 9, 100, 45], 1: [2, 33, 278]}
  nxt = {s: int(b.prefill(s, t, 0).argmax()) for s, t in seqs.items()}
  for step in range(6):   # steps 3 and 4: slot 1 alone (the batch-1 graph on its cache row)
    active = {s: (nxt[s], len(seqs[s])) for s in seqs if step not in (3, 4) or s == 1}
    out = b.decode(active)
    for s in active:
      seqs[s].append(nxt[s])
      np.testing.assert_allclose(out[s], np_forward(cfg, w, seqs[s])[-1], rtol=2e-4, atol=2e-4, err_msg=f"step {step} slot {s}")
      nxt[s] = int(out[s].argmax())


def test_sentencepiece_vocabulary(gemma):
  llm = LLM.load(gemma[0], max_context=16)
  tok = llm.tok
  ids = tok.encode("hello world", add_bos=True)
  assert [tok.id_to_token(i) for i in ids] == ["<bos>", "hello", "▁world"]   # no space prefix (gemma's add_space_prefix=false)
  assert tok.decode(ids, skip_special=True) == "hello world"
  assert tok.eos_ids == {1, 5}   # <eos> and <end_of_turn> (the end of a chat turn) both end a generation
  assert tok.encode("hé") == [tok.token_to_id("h"), 6 + 0xC3, 6 + 0xA9]   # byte fallback


def test_unknown_architecture_lists_gemma3():
  with pytest.raises(ValueError, match=r"unsupported model architecture 'gemma2'; supported: .*gemma3.*"):
    Config.from_gguf({"general.architecture": "gemma2"})
