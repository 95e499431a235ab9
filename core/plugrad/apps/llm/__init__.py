"""The LLM app: GGUF models, tokenizer (tokenizer.py), chat templates (chat.py), inference, CLI and server."""
