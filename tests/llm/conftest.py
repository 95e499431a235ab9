"""Fixtures of the LLM tests (defined in llm_helpers)."""
import pytest
from llm_helpers import embedded_llm, embedded_meta, embedded_path, tiny_gguf  # noqa: F401


@pytest.fixture(scope="module", autouse=True)
def float32_caches_for_random_models():
  """The LLM tests' models keep float32 KV caches (KV_DTYPE=float32) unless a test asks for float16: the tiny random
  models' tests compare code paths and the float64 oracle at 1e-4 to 1e-5, and such a model turns one key rounded to
  the other float16 neighbour (two kernels' float32 sums an ulp apart) into ~1e-2 in its logits, so which paths agree
  would depend on the machine's kernels. The real models load with float16 (the default the app runs:
  `embedded_llm`, `kv="float16"`), and tests/llm/test_kv_dtype.py tests the float16 caches with assertions that hold
  under such flips. (Module scope: set before the module's fixtures build their models, unset after it.)"""
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("KV_DTYPE", "float32")
    yield
