"""Fixtures of the LLM tests (defined in llm_helpers)."""
from llm_helpers import embedded_llm, embedded_meta, embedded_path, tiny_gguf  # noqa: F401
