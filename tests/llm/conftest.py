"""Fixtures of the LLM tests (defined in llm_helpers)."""
from llm_helpers import embedded_path, tiny_gguf, embedded_llm  # noqa: F401
