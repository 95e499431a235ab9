"""The tokenizer's compact vocabulary tables (apps/llm/vocab.py) against dict oracles, and what a tokenizer holds."""
import gc
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st
from llm_helpers import _byte_chars

from plugrad.apps.llm.tokenizer import NORMAL, Tokenizer
from plugrad.apps.llm.vocab import PairTable, TokenTable

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, min_size=1, max_size=60), st.lists(texts, max_size=20))
def test_token_table_matches_a_dict(tokens, others):
  t = TokenTable(tokens)
  first: dict[str, int] = {}
  for i, x in enumerate(tokens): first.setdefault(x, i)
  assert len(t) == len(tokens) and list(t) == tokens and [t[i] for i in range(len(tokens))] == tokens
  for x in tokens + others: assert t.get(x) == first.get(x) and (x in t) == (x in first), x


def test_token_table_errors():
  t = TokenTable(["a", "é"])
  for i in (-1, 2):
    try: t[i]
    except IndexError as e: assert "out of range" in str(e)
    else: raise AssertionError(i)
  assert t.get("\udc80") is None   # a lone surrogate is no token's text
  try: TokenTable(["a", "b\udc80"])
  except ValueError as e: assert "token 1" in str(e)
  else: raise AssertionError("a token that is not text was accepted")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.data())
def test_pair_table_matches_a_dict(n, data):
  ids = st.integers(0, n - 1)
  merges = data.draw(st.lists(st.tuples(ids, ids, ids), max_size=80))
  drop = set(data.draw(st.lists(ids, max_size=3)))
  p = PairTable(n, merges)
  want: dict[tuple[int, int], tuple[int, int]] = {}
  for r, (a, b, m) in enumerate(merges): want.setdefault((a, b), (r, m))
  assert len(p) == len(want)
  for a in range(n):
    for b in range(n): assert p.get(a, b) == want.get((a, b)), (a, b)
  p.drop_making(drop)
  want = {k: v for k, v in want.items() if v[1] not in drop}
  assert len(p) == len(want) and all(p.get(a, b) == want.get((a, b)) for a in range(n) for b in range(n))


def test_merge_through_a_text_that_is_no_token():
  """llama.cpp merges texts: "a b" then "ab c" spells "abc" though "ab" is no token; the ids past the vocabulary carry it."""
  tokens = _byte_chars() + ["abc", "xy"]
  tok = Tokenizer(tokens, [NORMAL] * len(tokens), "gpt2", pre="gpt2", merges=["a b", "ab c", "x y"])
  assert tok.encode("abc") == [tok.token_to_id("abc")] and tok.encode("xy ab") == [tok.token_to_id("xy"), tok.token_to_id("Ġ"),
                                                                                   tok.token_to_id("a"), tok.token_to_id("b")]
  assert tok.decode(tok.encode("abc xy ab")) == "abc xy ab"


def test_tokenizer_holds_its_vocabulary_compactly():
  """A 100k-token vocabulary costs the tokenizer under 40 bytes a token once the metadata's strings are gone (as Python
  strings in a list and a text -> id dict it was ~140)."""
  n = 100_000
  gc.collect()
  tracemalloc.start()
  try:
    tokens = _byte_chars() + [f"w{i:x}ü" for i in range(n)]
    merges = [f"w {i:x}" for i in range(200)]
    tok = Tokenizer(tokens, [NORMAL] * len(tokens), "gpt2", pre="gpt2", merges=merges)
    del tokens, merges
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
  finally: tracemalloc.stop()
  assert tok.id_to_token(256 + 0x2c) == "w2cü" and tok.token_to_id("w2cü") == 256 + 0x2c and held / n < 40, held / n
