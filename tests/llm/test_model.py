"""Transformer correctness: every architecture against a numpy forward pass, symbolic prefill against token-by-token
forwards, prefill at a start position, one compile for all prompt lengths, and the embedded GGUF against numpy."""
import numpy as np
import pytest
from llm_helpers import np_forward, tiny_model

from plugrad.apps.llm.generate import Generator
from plugrad.apps.llm.model import Config, Transformer
from plugrad.engine.realize import GlobalCounters
from plugrad.tensor import Tensor

TOKS = [3, 7, 1, 60, 22, 9, 41, 5, 17, 33, 2, 8, 50, 12, 0, 63]


@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen2", False), ("qwen3", True), ("qwen3moe", True), ("olmoe", True)])
def test_architectures_match_numpy(arch, tied):
  m, w = tiny_model(arch, tied=tied)
  ref = np_forward(m.cfg, w, TOKS[:6])
  np.testing.assert_allclose(m.reference_logits(TOKS[:6]), ref, atol=1e-4, rtol=1e-4)
  g = Generator(m)
  np.testing.assert_allclose(g.forward(TOKS[:6], 0), ref[-1], atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def llama():
  return tiny_model("llama", max_context=32)


def test_prefill_equals_token_by_token(llama):
  m, w = llama
  g = Generator(m)
  for n in (2, 4, 8, 16):
    pre = g.forward(TOKS[:n], 0)
    step = [g.forward([t], i) for i, t in enumerate(TOKS[:n])]
    np.testing.assert_allclose(pre, step[-1], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(pre, np_forward(m.cfg, w, TOKS[:n])[-1], atol=1e-4, rtol=1e-4)


def test_prefill_at_start_position_equals_all_at_once(llama):
  m, _ = llama
  g = Generator(m)
  whole = g.forward(TOKS[:12], 0)
  for split in (1, 5, 9):
    g.forward(TOKS[:split], 0)
    np.testing.assert_allclose(g.forward(TOKS[split:12], split), whole, atol=1e-5, rtol=1e-5)


def test_ten_prompt_lengths_compile_prefill_once(llama):
  m, w = llama
  g = Generator(m)
  g.forward(TOKS[:3], 0)   # JIT call 1 compiles, call 2 captures
  g.forward(TOKS[:4], 0)
  before = GlobalCounters["compiles"]
  for n in range(2, 12):
    np.testing.assert_allclose(g.forward(TOKS[:n], 0), np_forward(m.cfg, w, TOKS[:n])[-1], atol=1e-4, rtol=1e-4)
  assert GlobalCounters["compiles"] == before


def test_symbolic_graph_compiles_once_without_jit(llama, monkeypatch):
  monkeypatch.setenv("JIT", "0")
  m, _ = llama
  g = Generator(m)
  g.forward(TOKS[:5], 0)
  before = GlobalCounters["compiles"]
  for n in (2, 3, 7, 9): g.forward(TOKS[:n], 0)
  assert GlobalCounters["compiles"] == before


def test_forward_errors(llama):
  m, _ = llama
  g = Generator(m)
  with pytest.raises(ValueError, match="max_context=32"): g.forward(TOKS[:4], 30)
  with pytest.raises(ValueError, match="at least one token"): g.forward([], 0)
  with pytest.raises(IndexError, match="out of range"): g.forward([1, 64], 0)
  with pytest.raises(ValueError, match="max_context"): Transformer(m.cfg, {}, max_context=1)


def test_config_errors():
  with pytest.raises(ValueError, match="unsupported model architecture 'gpt2'"): Config.from_gguf({"general.architecture": "gpt2"})
  with pytest.raises(ValueError, match="llama.embedding_length"): Config.from_gguf({"general.architecture": "llama"})
  m, w = tiny_model("llama")
  ws = {k: Tensor(v) for k, v in w.items() if k != "blk.1.attn_q.weight"}
  with pytest.raises(ValueError, match="blk.1.attn_q.weight"): Transformer(m.cfg, ws, max_context=8)


# ---------------------------------------------------------------------------- the embedded model vs numpy + gguf

def test_embedded_logits_match_numpy_gguf(embedded_path, embedded_llm):
  gguf = pytest.importorskip("gguf")
  from gguf.quants import dequantize
  r = gguf.GGUFReader(embedded_path)
  w = {t.name: dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)]).astype(np.float32) for t in r.tensors}
  m = embedded_llm.model
  toks = [1, 9690, 198, 2683, 359, 253, 5356, 2]
  ref = np_forward(m.cfg, w, toks)[-1]
  got = embedded_llm.gen.forward(toks, 0)
  assert m.cfg.arch == "llama" and m.cfg.n_layers == 30 and m.output is m.tok_embd
  np.testing.assert_allclose(got, ref, atol=2e-3 * np.abs(ref).max())
  assert got.argmax() == ref.argmax()
