"""The LLM's weight repacking (block scales decoded once at load) against the `gguf` package's own dequantize, for
every type it repacks, including Q4_K (whose 18 bytes per 32 weights must not be mistaken for Q4_0's)."""
import gguf
import numpy as np
import pytest

from plugrad.apps.llm.model import repack
from plugrad.nn.serialize import dequantize
from plugrad.tensor import Tensor

# (elements, bytes) per block and the byte offsets of the float16 fields
GEOMETRY = {"Q4_0": (32, 18, (0,)), "Q4_1": (32, 20, (0, 2)), "Q8_0": (32, 34, (0,)), "Q4_K": (256, 144, (0, 2))}


@pytest.mark.parametrize("qtype", list(GEOMETRY))
def test_repack_matches_gguf(qtype):
  elems, tsize, f16s = GEOMETRY[qtype]
  rows, cols = 6, 512
  rng = np.random.default_rng(11)
  blocks = rng.integers(0, 256, (rows * cols // elems, tsize), dtype=np.uint8)
  for off in f16s: blocks[:, off:off + 2] = rng.uniform(-2, 2, len(blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
  u = dequantize(Tensor(blocks).realize(), qtype).reshape(rows, cols).uop
  packed = repack(u)
  assert packed is not u, f"{qtype} was not repacked"
  ref = gguf.quants.dequantize(blocks.reshape(rows, -1), getattr(gguf.GGMLQuantizationType, qtype))
  np.testing.assert_allclose(Tensor(packed).numpy(), ref, rtol=1e-6, atol=1e-6)
  x = rng.standard_normal(cols).astype(np.float32)   # and fused into a matrix-vector product
  np.testing.assert_allclose((Tensor(packed) @ Tensor(x)).numpy(), ref.astype(np.float64) @ x, rtol=1e-4, atol=1e-3 * np.abs(ref).max())


def test_unquantized_weights_are_not_repacked():
  u = Tensor(np.ones((4, 32), np.float32)).realize().uop
  assert repack(u) is u


def test_dense_prefill_weights_give_the_same_logits():
  """Quantized block weights kept as dense float32 copies for prefill (the default when they fit the budget) give
  the same prefill logits as dequantizing inside every prefill, and decode still reads the quantized weights."""
  from llm_helpers import tiny_config, tiny_weights

  from plugrad.apps.llm.generate import Generator
  from plugrad.apps.llm.model import Transformer
  cfg = tiny_config("llama")
  w = tiny_weights(cfg, 5, True)
  def quantized(k: str, v: np.ndarray) -> Tensor:
    if not k.startswith("blk.") or v.ndim != 2 or v.shape[1] % 32: return Tensor(v)
    blocks = gguf.quants.quantize(v.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    return dequantize(Tensor(blocks.reshape(-1, 34)).realize(), "Q8_0").reshape(v.shape)
  models = [Transformer(cfg, {k: quantized(k, v) for k, v in w.items()}, max_context=48, dense_prefill_bytes=b) for b in (0, 1 << 30)]
  assert not any(layer.dense for layer in models[0].layers) and all(layer.dense for layer in models[1].layers)
  toks = [3, 9, 4, 1, 7, 2, 8, 5, 6, 10, 11]
  outs = []
  for m in models:
    g = Generator(m)
    outs.append((g.forward(toks, 0), g.forward([12], len(toks))))
  for a, b in zip(*outs): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
