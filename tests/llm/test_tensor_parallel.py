"""Tensor-parallel LLM decode (apps/llm/parallel.py): a model split over CPU:0/CPU:1 by KV-head groups and FFN units
gives the one-device model's logits and greedy tokens; on a tiny random model, and on the embedded SmolLM2-135M
(`make test-long`: its float32 shards take a minute to build and compile here)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from llm_helpers import tiny_model

from plugrad.apps.llm.generate import Generator, SamplingParams
from plugrad.apps.llm.model import Transformer
from plugrad.apps.llm.parallel import shard_transformer
from plugrad.uop.ops import Ops

D2 = ("CPU:0", "CPU:1")


@pytest.mark.parametrize("kv", ["float32", "float16"])
def test_tiny_model_split_over_two_devices(kv, monkeypatch):
  monkeypatch.setenv("KV_DTYPE", kv)
  kw = dict(max_context=64, n_heads=6, n_kv_heads=3, ffn_dim=50)   # 3 KV heads over 2 devices: uneven shards
  one, _ = tiny_model(**kw)
  two, _ = tiny_model(**kw)
  shard_transformer(two, D2)
  blk = two.layers[0]
  assert blk.wq.op is Ops.MULTI and blk.wq.arg == 0 and [s.shape[0] for s in blk.wq.src] == [2 * 2 * 8, 1 * 2 * 8]
  assert blk.cache_k.device == ("CPU", "CPU:1") and blk.cache_k.shard_bounds == ((0, 2), (2, 3)) and blk.cache_k.dtype.name == kv
  p = SamplingParams(max_tokens=10, temperature=0)
  assert list(Generator(two).generate([1, 5, 9, 2], p)) == list(Generator(one).generate([1, 5, 9, 2], p))
  a, b = Generator(two).prefill([3, 4, 5, 6, 7]), Generator(one).prefill([3, 4, 5, 6, 7])
  # (float16: a key the shards' kernels compute an ulp apart may round to the other neighbour, ~1e-2 in these logits)
  np.testing.assert_allclose(a, b, atol=1e-4 if kv == "float32" else 0.02 * np.abs(b).max())


@pytest.mark.skipif(os.environ.get("PLUGRAD_LONG_TESTS") != "1", reason="~80 s on the 2-core box: make test-long")
def test_embedded_model_greedy_tokens_match(embedded_path):
  prompt = [1, 504, 3458, 282, 4649, 314]   # token ids of a short English prompt
  one, _ = Transformer.from_gguf(embedded_path, max_context=64)
  ref = list(Generator(one).generate(prompt, SamplingParams(max_tokens=8, temperature=0)))
  del one
  two, _ = Transformer.from_gguf(embedded_path, max_context=64)
  shard_transformer(two, D2)
  assert list(Generator(two).generate(prompt, SamplingParams(max_tokens=8, temperature=0))) == ref
