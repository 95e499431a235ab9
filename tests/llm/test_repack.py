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
