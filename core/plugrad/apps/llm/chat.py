"""Chat prompts: render a GGUF's `tokenizer.chat_template` (a Jinja template) for a list of messages, in a sandboxed jinja2
environment set up the way Hugging Face's `apply_chat_template` sets it up; ChatML when there is no template or it fails.
docs/llm_tokenizer.md describes the behaviour."""
from __future__ import annotations

import datetime
import functools
import json
import warnings
from typing import Any

ROLES = ("system", "user", "assistant", "tool")

def validate_messages(messages: Any) -> list[dict[str, Any]]:
  """Checked copies of OpenAI-style chat messages: each a dict with a `role` in ROLES and a str `content` (a list of
  {"type": "text", "text": ...} parts is joined into one str; an assistant message carrying `tool_calls` may have no content).
  Other keys (name, tool_calls, tool_call_id, ...) are kept for the template."""
  if not isinstance(messages, (list, tuple)): raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
  if not messages: raise ValueError("messages is empty: a chat needs at least one message")
  out = []
  for k, m in enumerate(messages):
    if not isinstance(m, dict): raise TypeError(f"messages[{k}] must be a dict with 'role' and 'content', got {type(m).__name__}")
    role = m.get("role")
    if role not in ROLES: raise ValueError(f"messages[{k}] has role {role!r}; expected one of {list(ROLES)}")
    content = m.get("content")
    if isinstance(content, (list, tuple)):
      parts = []
      for j, p in enumerate(content):
        if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
          raise ValueError(f"messages[{k}].content[{j}] must be a {{'type': 'text', 'text': str}} part (only text is supported), got {p!r}")
        parts.append(p["text"])
      content = "".join(parts)
    elif content is None and role == "assistant" and m.get("tool_calls"): content = ""
    elif not isinstance(content, str):
      raise TypeError(f"messages[{k}] ({role}) content must be a str, got {type(content).__name__}")
    out.append({**m, "content": content})
  return out

def render_chatml(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
  """ChatML: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n` to prompt a reply."""
  s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
  return s + "<|im_start|>assistant\n" if add_generation_prompt else s

def _raise_exception(message: str) -> None:
  from jinja2.exceptions import TemplateError
  raise TemplateError(message)

def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def _strftime_now(fmt: str) -> str: return datetime.datetime.now().strftime(fmt)

@functools.lru_cache(maxsize=16)
def _compile(template: str) -> Any:
  import jinja2.ext
  from jinja2 import nodes
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  class Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text for training masks in HF): renders its body."""
    tags = {"generation"}
    def parse(self, parser: Any) -> Any:
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.Scope(body).set_lineno(lineno)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
  return env.from_string(template)

def render_chat(template: str | None, messages: list[dict], add_generation_prompt: bool = True, bos_token: str = "",
                eos_token: str = "", strict: bool = False, **extra: Any) -> str:
  """The prompt text for `messages` under the Jinja chat `template` (variables: messages, add_generation_prompt, bos_token,
  eos_token and `extra`, e.g. tools). With no template, or one that fails to parse or render (including its own
  raise_exception checks), the ChatML prompt is returned with a warning; `strict=True` raises ValueError instead."""
  msgs = validate_messages(messages)
  if template is None: return render_chatml(msgs, add_generation_prompt)
  if not isinstance(template, str): raise TypeError(f"chat template must be a str or None, got {type(template).__name__}")
  from jinja2.exceptions import TemplateError
  try:
    return _compile(template).render(messages=msgs, add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                                     eos_token=eos_token, **extra)
  except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
    if strict: raise ValueError(f"chat template failed: {type(e).__name__}: {e}") from e
    warnings.warn(f"chat template failed ({type(e).__name__}: {e}); using ChatML instead", stacklevel=2)
    return render_chatml(msgs, add_generation_prompt)
