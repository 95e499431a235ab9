"""Chat prompts: render a GGUF's `tokenizer.chat_template` (a Jinja template) for a list of messages, in a sandboxed jinja2
environment set up the way Hugging Face's `apply_chat_template` sets it up, with limits on time, sizes and recursion
(a template comes from a model file: it must not hang or exhaust the process); ChatML when there is no template or it
fails. docs/llm_tokenizer.md describes the behaviour."""
from __future__ import annotations

import datetime
import functools
import json
import re
import sys
import threading
import time
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

def _strftime_now(fmt: str) -> str: return datetime.datetime.now().strftime(fmt)

# ---------------------------------------------------------------------------- limits of a template's rendering

TEMPLATE_SECONDS = 2.0        # wall time one rendering may take
TEMPLATE_MAX_LEN = 1 << 20    # elements (characters, items) a string or sequence built by a template may have; also
                              # what its output may hold beyond the messages' own text
MAX_INT_BITS = 1 << 16        # bits of an integer a template computes with * or **
MAX_INDENT = 1024             # tojson's indent

class TemplateLimitError(ValueError):
  """A chat template ran past a limit (time, size, recursion): an error of the template, never a fallback."""

def _too_big(what: str) -> TemplateLimitError: return TemplateLimitError(f"chat template exceeded its size limit: {what}")

_rendering = threading.local()   # .limit: the size limit of the rendering running on this thread

def _need(n: int, what: str) -> None:
  if n > (limit := getattr(_rendering, "limit", TEMPLATE_MAX_LEN)): raise _too_big(f"{what} would hold {n} elements (limit {limit})")

def _is_seq(x: Any) -> bool: return isinstance(x, (str, list, tuple))

def _int_arg(x: Any, what: str) -> None:
  if isinstance(x, int): _need(abs(x), what)

_WIDE_FORMAT = re.compile(r"%[-#0 +]*(?:\*|\d{7,})|%[-#0 +]*\d*\.(?:\*|\d{7,})|\{[^{}]*:[^{}]*\d{7,}[^{}]*\}")

def _check_format(fmt: Any) -> None:
  if isinstance(fmt, str) and _WIDE_FORMAT.search(fmt):
    raise _too_big(f"a format with a width of a million or more (or '*') in {fmt[:40]!r}")

def _check_binop(op: str, a: Any, b: Any) -> None:
  """Refuse `a op b` before computing it when the result would be over the limits (jinja's sandbox computes it)."""
  if op == "*":
    if _is_seq(a) and isinstance(b, int): _need(len(a) * max(b, 0), "a repeated sequence")
    elif _is_seq(b) and isinstance(a, int): _need(len(b) * max(a, 0), "a repeated sequence")
    elif isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > MAX_INT_BITS:
      raise _too_big(f"a product of {a.bit_length() + b.bit_length()} bits")
  elif op == "+" and _is_seq(a) and _is_seq(b): _need(len(a) + len(b), "a concatenation")
  elif op == "**" and isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 and (a.bit_length() - 1) * b > MAX_INT_BITS:
    raise _too_big(f"a power of more than {MAX_INT_BITS} bits")
  elif op == "%": _check_format(a)

_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs"}

def _check_call(fn: Any, args: tuple, kwargs: dict) -> None:
  """Refuse a call of a str method whose result would be over the limits (widths, joins, replacements, formats)."""
  fn = getattr(fn, "__wrapped__", fn)   # the sandbox wraps str.format
  owner, name = getattr(fn, "__self__", None), getattr(fn, "__name__", "")
  if not isinstance(owner, str): return
  if name in _WIDTH_METHODS:
    for x in (*args, *kwargs.values()): _int_arg(x, f"str.{name}'s result")
  elif name == "join" and args and isinstance(args[0], (list, tuple)):
    _need(sum(len(x) if isinstance(x, str) else 0 for x in args[0]) + len(owner) * max(len(args[0]) - 1, 0), "a joined string")
  elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
    n = owner.count(args[0]) if args[0] else len(owner) + 1
    if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0: n = min(n, args[2])
    _need(len(owner) + n * max(len(args[1]) - len(args[0]), 0), "a replaced string")
  elif name in ("format", "format_map"): _check_format(owner)

def _limited_filters(filters: dict) -> dict:
  """Jinja's filters that build strings or lists from size arguments, each checked before it runs."""
  def center(value: Any, width: int = 80) -> str:
    _int_arg(width, "center's result")
    return filters["center"](value, width)
  def indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
    if isinstance(width, str): _need(len(width) * (str(s).count("\n") + 1) + len(str(s)), "an indented string")
    else: _int_arg(width, "indent's width")
    return filters["indent"](s, width, first, blank)
  def batch(value: Any, linecount: int, fill_with: Any = None) -> Any:
    _int_arg(linecount, "a batch")
    return filters["batch"](value, linecount, fill_with)
  def join(ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
    if isinstance(value, (list, tuple)):
      _need(sum(len(x) if isinstance(x, str) else 0 for x in value) + len(str(d)) * max(len(value) - 1, 0), "a joined string")
    return filters["join"](ctx, value, d, attribute)
  def replace(ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> str:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
      _check_call(s.replace, (old, new) + ((count,) if isinstance(count, int) else ()), {})
    return filters["replace"](ctx, s, old, new, count)
  def format_(value: Any, *args: Any, **kwargs: Any) -> str:
    _check_format(value)
    return filters["format"](value, *args, **kwargs)
  join.jinja_pass_arg = replace.jinja_pass_arg = filters["join"].jinja_pass_arg   # type: ignore[attr-defined]  # eval context, as jinja's own
  return {"center": center, "indent": indent, "batch": batch, "join": join, "replace": replace, "format": format_}

def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
  if isinstance(indent, int) and indent > MAX_INDENT: raise _too_big(f"tojson indent {indent} (limit {MAX_INDENT})")
  if isinstance(indent, str) and len(indent) > MAX_INDENT: raise _too_big(f"a tojson indent of {len(indent)} characters")
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

class _Deadline:
  """A trace function for the rendering thread: raises TemplateLimitError once TEMPLATE_SECONDS have passed (checked
  every 256 traced events: loops and recursion written in a template are Python code, so they can't run past it)."""
  def __init__(self, seconds: float): self.end, self.n = time.monotonic() + seconds, 0
  def __call__(self, frame: Any, event: str, arg: Any) -> Any:
    self.n += 1
    if not self.n & 255 and time.monotonic() > self.end:
      raise TemplateLimitError(f"chat template exceeded its time limit: still rendering after {TEMPLATE_SECONDS:g} s")
    return self

@functools.lru_cache(maxsize=16)
def _compile(template: str) -> Any:
  import jinja2.ext
  from jinja2 import nodes
  from jinja2.compiler import CodeGenerator
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  class Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text for training masks in HF): renders its body."""
    tags = {"generation"}
    def parse(self, parser: Any) -> Any:
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.Scope(body).set_lineno(lineno)

  class LimitedCode(CodeGenerator):
    """`a ~ b` (string concatenation) through `environment.limited_join`, which checks the result's length first."""
    def visit_Concat(self, node: Any, frame: Any) -> None:
      self.write("environment.limited_join((")
      for arg in node.nodes:
        self.visit(arg, frame)
        self.write(", ")
      self.write("))")

  class Limited(ImmutableSandboxedEnvironment):
    """The sandbox with size checks on `*`, `+`, `**`, `%`, `~`, the str methods and filters that take sizes."""
    code_generator_class = LimitedCode
    intercepted_binops = frozenset({"*", "+", "**", "%"})
    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
      _check_binop(operator, left, right)
      return super().call_binop(context, operator, left, right)
    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:   # (jinja's own signature)
      _check_call(__obj, args, kwargs)
      return super().call(__context, __obj, *args, **kwargs)
    @staticmethod
    def limited_join(parts: tuple) -> str:
      strs = [str(p) for p in parts]
      _need(sum(map(len, strs)), "a concatenation")
      return "".join(strs)

  env = Limited(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
  env.filters.update(_limited_filters(dict(env.filters)), tojson=_tojson)
  env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
  return env.from_string(template)

def _render(template: str, variables: dict[str, Any], text_len: int) -> str:
  """The template rendered within the limits: TEMPLATE_SECONDS; strings and sequences it builds, and its output, up to
  TEMPLATE_MAX_LEN elements beyond `text_len` (the messages' own text); the interpreter's recursion limit (a
  RecursionError becomes a TemplateLimitError)."""
  tmpl, limit = _compile(template), TEMPLATE_MAX_LEN + text_len
  prev = sys.gettrace()
  _rendering.limit = limit
  sys.settrace(_Deadline(TEMPLATE_SECONDS))
  try:
    out, n = [], 0
    for piece in tmpl.generate(**variables):
      n += len(piece)
      if n > limit: raise _too_big(f"output over {limit} characters")
      out.append(piece)
    return "".join(out)
  except RecursionError: raise TemplateLimitError("chat template exceeded its recursion limit (a macro calling itself without end?)") from None
  except MemoryError: raise TemplateLimitError("chat template exceeded the memory available") from None
  finally:
    sys.settrace(prev)
    _rendering.limit = TEMPLATE_MAX_LEN

def render_chat(template: str | None, messages: list[dict], add_generation_prompt: bool = True, bos_token: str = "",
                eos_token: str = "", strict: bool = False, **extra: Any) -> str:
  """The prompt text for `messages` under the Jinja chat `template` (variables: messages, add_generation_prompt, bos_token,
  eos_token and `extra`, e.g. tools). With no template, or one that fails to parse or render (including its own
  raise_exception checks), the ChatML prompt is returned with a warning; `strict=True` raises ValueError instead.
  A template that runs past its limits (time, size, recursion: `_render`) raises TemplateLimitError (a ValueError)
  either way."""
  msgs = validate_messages(messages)
  if template is None: return render_chatml(msgs, add_generation_prompt)
  if not isinstance(template, str): raise TypeError(f"chat template must be a str or None, got {type(template).__name__}")
  variables = dict(messages=msgs, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token, **extra)
  try:
    return _render(template, variables, sum(len(m["content"]) for m in msgs) + len(bos_token) + len(eos_token))
  except TemplateLimitError: raise
  except Exception as e:   # whatever the template did (TemplateError, TypeError, ZeroDivisionError...): the template's failure
    if strict: raise ValueError(f"chat template failed: {type(e).__name__}: {e}") from e
    warnings.warn(f"chat template failed ({type(e).__name__}: {e}); using ChatML instead", stacklevel=2)
    return render_chatml(msgs, add_generation_prompt)
