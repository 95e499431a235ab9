"""Transformer correctness: every architecture against a numpy forward pass, symbolic prefill against token-by-token
forwards, prefill at a start position, one compile for all prompt lengths, and the embedded GGUF against numpy."""
import numpy as np
import pytest
from llm_helpers import np_forward, tiny_config, tiny_model, tiny_weights

from plugrad.apps.llm.generate import Generator
from plugrad.apps.llm.model import PREFILL_MULTIPLE, Config, Transformer
from plugrad.dtype import dtypes
from plugrad.engine.realize import GlobalCounters, buffer_for
from plugrad.uop.buffers import buffer_of
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
  ref = np_forward(m.cfg, w, toks, "float16")[-1]   # the app's float16 caches
  got = embedded_llm.gen.forward(toks, 0)
  assert m.kv_dtype == dtypes.float16 and m.cfg.arch == "llama" and m.cfg.n_layers == 30 and m.output is m.tok_embd
  np.testing.assert_allclose(got, ref, atol=2e-3 * np.abs(ref).max())
  assert got.argmax() == ref.argmax()


# ---------------------------------------------------------------------------- bad metadata is refused at load, naming the key

def _bad_cases():
  import gguf
  T = gguf.GGUFValueType
  w = tiny_weights(tiny_config("llama", vocab_size=262, dim=32, n_layers=2))
  return {   # name -> (meta overrides, weight overrides, what the error must name)
    "negative block count": ({"llama.block_count": (-1, T.INT32)}, {}, "llama.block_count"),
    "zero block count": ({"llama.block_count": (0, T.UINT32)}, {}, "llama.block_count"),
    "fewer blocks than tensors": ({"llama.block_count": (1, T.UINT32)}, {}, "llama.block_count=1"),
    "NaN epsilon": ({"llama.attention.layer_norm_rms_epsilon": (float("nan"), T.FLOAT32)}, {}, "llama.attention.layer_norm_rms_epsilon"),
    "negative epsilon": ({"llama.attention.layer_norm_rms_epsilon": (-1e-5, T.FLOAT32)}, {}, "llama.attention.layer_norm_rms_epsilon"),
    "zero rope base": ({"llama.rope.freq_base": (0.0, T.FLOAT32)}, {}, "llama.rope.freq_base"),
    "infinite rope base": ({"llama.rope.freq_base": (float("inf"), T.FLOAT32)}, {}, "llama.rope.freq_base"),
    "zero head count": ({"llama.attention.head_count": (0, T.UINT32)}, {}, "llama.attention.head_count"),
    "zero kv heads": ({"llama.attention.head_count_kv": (0, T.UINT32)}, {}, "llama.attention.head_count_kv"),
    "kv heads not dividing": ({"llama.attention.head_count_kv": (3, T.UINT32)}, {}, "llama.attention.head_count_kv=3"),
    "heads not dividing dim": ({"llama.attention.head_count": (5, T.UINT32), "llama.attention.head_count_kv": (5, T.UINT32)}, {},
                               "llama.embedding_length=32 is not a multiple of llama.attention.head_count=5"),
    "string for a number": ({"llama.embedding_length": ("32", T.STRING)}, {}, "llama.embedding_length must be an integer"),
    "float for an integer": ({"llama.feed_forward_length": (48.0, T.FLOAT32)}, {}, "llama.feed_forward_length must be an integer"),
    "huge dim": ({"llama.embedding_length": (2**63, T.UINT64)}, {}, "llama.embedding_length"),
    "string epsilon": ({"llama.attention.layer_norm_rms_epsilon": ("tiny", T.STRING)}, {}, "llama.attention.layer_norm_rms_epsilon"),
    "odd head dim": ({"llama.attention.key_length": (7, T.UINT32)}, {}, "llama.attention.key_length=7"),
    "non-string chat template": ({"tokenizer.chat_template": (7, T.INT32)}, {}, "tokenizer.chat_template must be a string"),
    "list chat template": ({"tokenizer.chat_template": (["{{ x }}"], T.ARRAY)}, {}, "tokenizer.chat_template must be a string"),
    "endless chat template": ({"tokenizer.chat_template": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", T.STRING)}, {},
                              "tokenizer.chat_template: chat template exceeded its recursion limit"),
    "list pre-tokenizer": ({"tokenizer.ggml.pre": (["smollm"], T.ARRAY)}, {}, "tokenizer.ggml.pre"),
    "bad token types": ({"tokenizer.ggml.token_type": ([9] * 262, T.ARRAY)}, {}, "tokenizer.ggml.token_type"),
    "string bos flag": ({"tokenizer.ggml.add_bos_token": ("yes", T.STRING)}, {}, "tokenizer.ggml.add_bos_token"),
    "wrong q rows": ({}, {"blk.1.attn_q.weight": w["blk.1.attn_q.weight"][:16]}, "blk.1.attn_q.weight' has shape (16, 32)"),
    "transposed down": ({}, {"blk.0.ffn_down.weight": w["blk.0.ffn_down.weight"].T.copy()}, "blk.0.ffn_down.weight' has shape (48, 32)"),
    "wrong norm": ({}, {"output_norm.weight": np.ones(31, np.float32)}, "output_norm.weight' has shape (31,)"),
    "missing tensor": ({}, {"blk.0.ffn_up.weight": None}, "lacks tensor 'blk.0.ffn_up.weight'"),
    "embedding rows under the vocabulary": ({}, {"token_embd.weight": w["token_embd.weight"][:200]}, "262 tokens, more than the 200 rows"),
  }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_metadata_is_refused_at_load(case, tmp_path, monkeypatch):
  """Invalid model metadata used to load without complaint (a NaN epsilon, a zero RoPE base) or end in
  ZeroDivisionError/TypeError/RuntimeError, or fail at the first forward pass: now each is a ValueError naming the
  key or tensor, raised before any weight is read."""
  from llm_helpers import write_tiny_gguf
  from plugrad.apps.llm import model as model_module
  from plugrad.apps.llm.generate import LLM
  meta, weights, named = _bad_cases()[case]
  path = str(tmp_path / "bad.gguf")
  write_tiny_gguf(path, meta=meta, weights=weights)
  reads = []
  monkeypatch.setattr(model_module, "read_weight", lambda *a: reads.append(a) or pytest.fail("a weight was read"), raising=False)
  with pytest.raises(ValueError) as e: LLM.load(path, max_context=16)
  assert named in str(e.value), str(e.value)
  assert not reads


def test_prefill_scores_live_in_one_scratch():
  """Every block's prefill attention writes its scores into the model's one scratch buffer and takes the softmax there
  in place: the JIT arena holds neither scores nor probabilities (it held both, each (H, T, S) floats), and the
  results still match numpy for every prompt length the capture serves."""
  m, w = tiny_model("llama", max_context=128)
  g = Generator(m)
  toks = [int(t) for t in np.random.default_rng(5).integers(0, m.cfg.vocab_size, 64)]
  for n in (20, 33, 41, 27, 64):   # one short-prefill JIT: call 1 runs, call 2 captures, the rest replay
    np.testing.assert_allclose(g.forward(toks[:n], 0), np_forward(m.cfg, w, toks[:n])[-1], atol=1e-4, rtol=1e-4)
  mult = PREFILL_MULTIPLE
  scores_bytes = m.cfg.n_heads * g.v_short.vmax * mult * g.v_keys.vmax * mult * 4   # (H, T, S) floats at most
  assert m.scores.buf is not None and m.scores.buf.nbytes() >= scores_bytes
  assert all(layer.scratch is m.scores for layer in m.layers)
  assert 0 < g.arena.nbytes < scores_bytes // 2


def test_kv_caches_are_zeroed_allocations():
  """The KV caches read as zeros without a zeroing kernel (BufferOptions.zeroed: on the CPU fresh pages, resident only
  where tokens were written; a kernel writing zeros made all max_context rows resident), and a padded prefill, which
  reads a few never-written rows, still matches numpy."""
  m, w = tiny_model("llama", max_context=128)
  bufs = [buffer_for(buffer_of(c.uop)) for layer in m.layers for c in (layer.cache_k, layer.cache_v)]
  assert all(b.options is not None and b.options.zeroed for b in bufs)
  assert not any(np.frombuffer(b.copyout(), np.float32).any() for b in bufs)
  np.testing.assert_allclose(Generator(m).forward(TOKS[:5], 0), np_forward(m.cfg, w, TOKS[:5])[-1], atol=1e-4, rtol=1e-4)
