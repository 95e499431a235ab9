"""The KV caches' element type: float16 by default (KV_DTYPE or `kv=`), keys and values rounded where they are written
by a prefill, the batch-1 decode step and the batched one, float32 on request, a bad name refused before a weight is
read. (The other LLM tests run float32 caches: tests/llm/conftest.py.)"""
import numpy as np
import pytest
from llm_helpers import np_forward, tiny_config, tiny_weights

from plugrad.apps.llm.generate import LLM, BatchGenerator, Generator
from plugrad.apps.llm.model import Transformer, kv_dtype
from plugrad.dtype import dtypes
from plugrad.tensor import Tensor

TOKS_SHORT = [3, 7, 1, 60, 22, 9, 41, 5, 17, 33, 2, 8, 50, 12, 0, 63]


def _models(arch: str = "llama", batch: int = 1) -> tuple[Transformer, Transformer, dict]:
  cfg = tiny_config(arch)
  w = tiny_weights(cfg, 3)
  return tuple(Transformer(cfg, {k: Tensor(v) for k, v in w.items()}, max_context=40, batch=batch, kv=kv) for kv in ("float16", "float32")) + (w,)


def test_float16_is_the_default_and_halves_the_caches(monkeypatch):
  monkeypatch.delenv("KV_DTYPE", raising=False)
  assert kv_dtype() == dtypes.float16
  cfg = tiny_config("llama")
  w = {k: Tensor(v) for k, v in tiny_weights(cfg).items()}
  m16, m32 = Transformer(cfg, w, max_context=40), Transformer(cfg, w, max_context=40, kv="float32")
  for a, b in zip(m16.layers, m32.layers):
    assert (a.cache_k.dtype, a.cache_v.dtype, b.cache_k.dtype) == (dtypes.float16, dtypes.float16, dtypes.float32)
    assert a.cache_k.nbytes() * 2 == b.cache_k.nbytes() and a.cache_v.nbytes() * 2 == b.cache_v.nbytes()
  monkeypatch.setenv("KV_DTYPE", "float32")
  assert Transformer(cfg, w, max_context=40).kv_dtype == dtypes.float32


def _f16(x: np.ndarray) -> np.ndarray: return x.astype(np.float16)


def _assert_rounded(c16: np.ndarray, c32: np.ndarray, what: str) -> None:
  """The first block's float16 cache holds its float32 cache's values rounded to nearest (both computed from the same
  embeddings by the same kernels but for the store's cast): in every written row (a position of a head) at most a
  quarter of the elements differ, by one float16 step at most (here none does). Later blocks' inputs differ by the
  earlier blocks' rounding: `_check_caches` compares those loosely."""
  assert c16.dtype == np.float16 and c32.dtype == np.float32, what
  written = (c32 != 0).any(-1)
  assert written.sum() > 10, what
  steps = np.abs(c16.view(np.int16).astype(np.int32) - _f16(c32).view(np.int16).astype(np.int32))[written]
  assert steps.max() <= 1 and (steps != 0).mean(-1).max() <= 0.25, \
    f"{what}: {int((steps != 0).sum())} of {steps.size} differ, up to {steps.max()} steps"


def _check_caches(m16: Transformer, m32: Transformer) -> None:
  for i, (a, b) in enumerate(zip(m16.layers, m32.layers)):
    for n in ("cache_k", "cache_v"):
      c16, c32 = getattr(a, n).numpy(), getattr(b, n).numpy()
      if i == 0: _assert_rounded(c16, c32, f"block 0 {n}")
      np.testing.assert_allclose(c16.astype(np.float32), c32, atol=0.02 * np.abs(c32).max(), err_msg=f"block {i} {n}")


def test_prefill_and_decode_write_rounded_keys_and_values():
  m16, m32, w = _models()
  for m in (m16, m32):
    g = Generator(m)
    g.forward(TOKS_SHORT[:9], 0)
    for i, t in enumerate(TOKS_SHORT[9:13], 9): last = g.forward([t], i)   # run, capture, replay twice
  _check_caches(m16, m32)
  ref = np_forward(m16.cfg, w, TOKS_SHORT[:13], "float16")[-1]   # a wrong cast is far off; a flip costs ~1e-2
  np.testing.assert_allclose(last, ref, atol=0.05 * np.abs(ref).max())


def test_batched_steps_write_rounded_rows():
  m16, m32, w = _models("qwen2", batch=3)
  seqs = {0: TOKS_SHORT[:5], 1: TOKS_SHORT[5:6], 2: TOKS_SHORT[2:11]}
  outs = []
  for m in (m16, m32):
    b, ss = BatchGenerator(m), {s: list(t) for s, t in seqs.items()}
    for s, t in ss.items(): b.prefill(s, t, 0)
    for step in range(3):   # all three rows, then one slot alone (the batch-1 graph on its row), then two
      active = {0: 1, 1: 2, 2: 3} if step == 0 else {2: 4} if step == 1 else {0: 5, 1: 6}
      out = b.decode({s: (t, len(ss[s])) for s, t in active.items()})
      for s, t in active.items(): ss[s].append(t)
    outs.append((out, ss))
  _check_caches(m16, m32)
  (out, ss), _ = outs
  for s in out:
    ref = np_forward(m16.cfg, w, ss[s], "float16")[-1]
    np.testing.assert_allclose(out[s], ref, atol=0.05 * np.abs(ref).max(), err_msg=f"slot {s}")


def test_a_bad_kv_dtype_is_refused_by_name(monkeypatch, tiny_gguf):
  with pytest.raises(ValueError, match="KV_DTYPE must be one of"): kv_dtype("bfloat16")
  monkeypatch.setenv("KV_DTYPE", "half")
  with pytest.raises(ValueError, match="KV_DTYPE.*'half'"): LLM.load(tiny_gguf, max_context=16)
  monkeypatch.delenv("KV_DTYPE")
  with pytest.raises(ValueError, match="KV_DTYPE.*'int8'"): LLM.load(tiny_gguf, max_context=16, kv="int8")
  assert LLM.load(tiny_gguf, max_context=16, kv="float32").model.kv_dtype == dtypes.float32
