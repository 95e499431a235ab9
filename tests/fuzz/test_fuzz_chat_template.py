"""Fuzzing chat templates (they come from model files): random Jinja templates built from loops, conditionals,
recursive macros, namespaces and the string and list operations that grow data (repetition, concatenation, powers,
widths, joins, replacements, batches, JSON indents), with sizes from 0 to 2**63, over random messages. Every case
renders to a string within the output limit, or ends in a ValueError (the template's own error, or a
TemplateLimitError), within the time limit plus a margin and a bounded allocation: never another exception, a hang
or gigabytes."""
from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from plugrad.apps.llm import chat
from plugrad.apps.llm.chat import TemplateLimitError, render_chat

SIZES = st.sampled_from([0, 1, 2, 3, 7, 40, 100, 1000, 10**5, 10**6, 10**9, 2**63, -1, -(10**9)])
SMALL = st.sampled_from([0, 1, 2, 3, 40, 1000, 10**5])
TEXT = st.sampled_from(["'x'", "'ab'", "''", "messages[0].content", "m.content", "'%d'", "'{}'", "'{:>9}'", "'a\\nb'", "(ns.s)", "' '"])


@st.composite
def expression(draw, depth: int = 0) -> str:
  n, s = draw(SIZES), draw(TEXT)
  simple = [f"{s}", f"{n}", f"{s} * {n}", f"{s} ~ {s}", f"{s} + {s}", f"{n} ** {draw(SIZES)}", f"{n} * {draw(SIZES)}",
            f"{s}|center({n})", f"{s}|indent({n})", f"{s}|replace('x', {s} * {draw(SMALL)})", f"{s}.ljust({n})", f"{s}.zfill({n})",
            f"'%{n}d' % 1", f"'%*d' % ({n}, 1)", f"'{{:>{n}}}'.format(1)", f"{s}|format(1)", f"range({draw(SMALL)})|list|join({s})",
            f"[{s}] * {n}", f"([1] * {draw(SMALL)})|batch({n}, 0)|list|length", f"messages|tojson(indent={n})", f"{s}.join([{s}] * {draw(SMALL)})",
            f"({s} * {draw(SMALL)}).replace('', {s} * {draw(SMALL)})", "loop.index", "nope.x", f"{s}[{n}]", f"{s}|length", f"{n} // 0"]
  e = draw(st.sampled_from(simple))
  if depth < 2 and draw(st.booleans()): e = f"({e}) ~ ({draw(expression(depth + 1))})"
  return e


@st.composite
def body(draw, depth: int = 0) -> str:
  parts = []
  for _ in range(draw(st.integers(1, 3))):
    kind = draw(st.sampled_from(["expr", "text", "for", "if", "set", "messages", "raise", "junk"] if depth < 3 else ["expr", "text", "set"]))
    if kind == "expr": parts.append("{{ " + draw(expression()) + " }}")
    elif kind == "text": parts.append(draw(st.text(max_size=8)).replace("{", "(").replace("%", "p"))
    elif kind == "for": parts.append(f"{{% for i in range({draw(SMALL)}) %}}{draw(body(depth + 1))}{{% endfor %}}")
    elif kind == "if": parts.append(f"{{% if {draw(expression())} %}}{draw(body(depth + 1))}{{% endif %}}")
    elif kind == "set": parts.append(f"{{% set ns.s = ns.s ~ ({draw(expression())}) %}}")
    elif kind == "messages": parts.append(f"{{% for m in messages %}}{draw(body(depth + 1))}{{% endfor %}}")
    elif kind == "raise": parts.append("{{ raise_exception('refused') }}")
    else: parts.append(draw(st.sampled_from(["{% for %}", "{{", "{% endif %}", "{{ ''.__class__.__mro__ }}", "{% set _ = messages.append(1) %}"])))
  return "".join(parts)


@st.composite
def template(draw) -> str:
  t = "{% set ns = namespace(s='') %}" + draw(body())
  if draw(st.booleans()):   # a macro, maybe recursive, maybe branching twice per level
    calls = draw(st.sampled_from(["", "{{ f(n + 1) }}", "{{ f(n + 1) }}{{ f(n + 1) }}", "{{ f(n) }}"]))
    t = f"{{% macro f(n) %}}{{% if n < {draw(SMALL)} %}}{draw(body(2))}{calls}{{% endif %}}{{% endmacro %}}" + t + "{{ f(0) }}"
  return t


MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]), "content": st.text(max_size=40)}),
                    min_size=1, max_size=3)
MEMORY = 64 << 20   # traced peak allocation a case may reach (the size limit: 1 Mi elements; lists hold 8-byte pointers)


@pytest.mark.filterwarnings("ignore:chat template failed:UserWarning")
@given(template(), MESSAGES, st.booleans())
def test_fuzz_chat_template(tmpl, messages, strict):
  old = chat.TEMPLATE_SECONDS
  chat.TEMPLATE_SECONDS = 0.2
  tracemalloc.start()
  t0 = time.perf_counter()
  try:
    try:
      out = render_chat(tmpl, messages, strict=strict)
      event("rendered")
      assert isinstance(out, str) and len(out) <= chat.TEMPLATE_MAX_LEN + sum(len(m["content"]) for m in messages)
    except TemplateLimitError as e: event(f"limit: {str(e).split(':')[0]}")
    except ValueError as e:
      assert strict and "chat template failed" in str(e), e
      event("template error")
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
    chat.TEMPLATE_SECONDS = old
  took = time.perf_counter() - t0
  assert took < 0.2 + 3.0, f"took {took:.1f} s"
  assert peak <= MEMORY, f"peak allocation {peak >> 20} MB"
