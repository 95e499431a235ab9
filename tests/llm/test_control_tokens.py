"""Text a user types never becomes a token the app treats as control (issue 47): for every control and stop id of
every vocabulary here — SentencePiece with gemma's `</s>` as a user-defined token and end of sequence, byte-level BPE
with ChatML controls, a user-defined end-of-text and a user-defined turn marker, and the embedded SmolLM2 — the
token's text in a chat message or a completion prompt stays text: no control id appears that the template didn't
write, its text decodes back, and merges that would spell a control token are not applied."""
from collections import Counter

import pytest
from llm_helpers import _byte_chars

from plugrad.apps.llm.generate import LLM
from plugrad.apps.llm.tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, Tokenizer

# a gemma-style vocabulary: controls, then `</s>` user-defined at id 212 as in gemma 3, byte tokens, pieces whose
# merges would spell `</s>` and `<end_of_turn>` from typed text
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
                  "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
PIECES = ["▁", "<", "/", "s", ">", "</", "s>", "</s", "e", "n", "d", "_", "o", "f", "t", "u", "r", "<e", "nd", "of", "tu", "rn",
          "_of", "_turn", "<end", "<end_of", "<end_of_turn", "end", "x", "h", "i"]


def gemma_like() -> Tokenizer:
  tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"] + [f"<unused{i}>" for i in range(206)]
  types = [CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL, CONTROL] + [UNKNOWN] * 206
  tokens, types = tokens + ["</s>", "<h1>"], types + [USER_DEFINED, USER_DEFINED]   # </s> is id 212
  tokens, types = tokens + [f"<0x{b:02X}>" for b in range(256)] + PIECES, types + [BYTE] * 256 + [NORMAL] * len(PIECES)
  assert tokens.index("</s>") == 212
  scores = [0.0] * (len(tokens) - len(PIECES)) + [-float(len(PIECES) - k) + 100 * len(p) for k, p in enumerate(PIECES)]
  return Tokenizer(tokens, types, "llama", scores=scores, bos_id=2, eos_ids={1}, unk_id=3, add_space_prefix=False, add_bos_token=True)


MERGES_OF: dict[str, list[str]] = {}   # the merges byte_bpe wrote that spell a token


def byte_bpe(end_type: int = CONTROL, turn_type: int = CONTROL) -> Tokenizer:
  """Byte-level BPE with ChatML specials of the given types and merges that spell each of them from typed text."""
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<||>", "<think>"]   # "<||>": one pre-token, merged whole
  types = [end_type, turn_type, turn_type, CONTROL, USER_DEFINED]
  merges, pieces = [], []
  for sp in specials[:4]:   # left to right: "<|" + "e", "<|e" + "n", ...
    for k in range(2, len(sp) + 1):
      a, b = (sp[:k - 1], sp[k - 1]) if k > 2 else (sp[0], sp[1])
      merges.append(f"{a} {b}")
      pieces.append(sp[:k])
  pieces = list(dict.fromkeys(p for p in pieces if p not in specials))
  MERGES_OF["<||>"] = [m for m in merges if m.replace(" ", "") == "<||>"]
  tokens = specials + _byte_chars() + pieces
  return Tokenizer(tokens, types + [NORMAL] * (len(tokens) - len(specials)), "gpt2", pre="smollm", merges=merges, bos_id=1, eos_ids={2})


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def vocabularies(embedded_meta=None):
  out = [("gemma-like </s> user-defined", LLM(None, gemma_like(), GEMMA_TEMPLATE)),
         ("ChatML controls", LLM(None, byte_bpe(), CHATML)),
         ("user-defined end of text", LLM(None, byte_bpe(end_type=USER_DEFINED), CHATML)),
         ("user-defined turn markers", LLM(None, byte_bpe(turn_type=USER_DEFINED), CHATML)),
         ("ChatML fallback, no template", LLM(None, byte_bpe(turn_type=USER_DEFINED), None))]
  if embedded_meta is not None:
    out.append(("SmolLM2", LLM(None, Tokenizer.from_gguf_metadata(embedded_meta), embedded_meta["tokenizer.chat_template"])))
  return out


@pytest.fixture(scope="module")
def smollm_meta():
  from llm_helpers import embedded_gguf_path
  from plugrad.nn.serialize import gguf_load
  p = embedded_gguf_path()
  return gguf_load(p)[0] if p is not None else None


def control_ids_of(llm: LLM) -> set[int]:
  """What the app stops on, what starts a sequence, control tokens, and the special tokens the chat template spells
  (ChatML's when there is none): every id a user's text must never produce."""
  tok = llm.tok
  template = llm.template if llm.template is not None else "<|im_start|><|im_end|>"
  return set(tok.eos_ids) | {tok.bos_id} | {i for i, t in enumerate(tok.types) if t in (CONTROL, UNKNOWN)} | \
         {i for t, i in tok.special_tokens.items() if t in template}


def test_gemma_user_defined_end_of_sequence_is_control():
  llm = LLM(None, gemma_like(), GEMMA_TEMPLATE)
  assert 212 in llm.tok.eos_ids and 212 in llm.tok.control_ids   # the app stops on it...
  assert 212 not in llm.tok.encode("</s>", parse_special=False)   # ...so typed text never becomes it
  assert 212 in llm.tok.encode("</s>", parse_special=True)         # (the template's own text still may)
  assert llm.tok.encode("<h1>", parse_special=False) == [213]      # user-defined tokens that aren't control still match
  ids = llm.chat_prompt([{"role": "user", "content": "hi</s>"}])
  assert 212 not in ids and llm.tok.decode(ids).count("hi</s><end_of_turn>") == 1
  assert 212 not in llm.completion_prompt("stop here</s> and go on</s>")


@pytest.mark.parametrize("case", range(6))
def test_no_typed_text_becomes_a_control_or_stop_id(case, smollm_meta):
  vocabs = vocabularies(smollm_meta)
  if case >= len(vocabs): pytest.skip("the embedded model isn't installed")
  name, llm = vocabs[case]
  tok, ctrl = llm.tok, control_ids_of(llm)
  texts = [tok.tokens[i] for i in sorted(ctrl) if tok.tokens[i]]
  assert texts, name
  for t in texts + ["".join(texts), "x" + "x".join(texts) + "x", " ".join(texts)]:
    ids = tok.encode(t, parse_special=False)
    assert not ctrl & set(ids), (name, t, [tok.tokens[i] for i in ids if i in ctrl])
    assert tok.decode(ids) == t, (name, t)
    got = llm.completion_prompt(t)
    assert not ctrl & set(got[1:] if got[:1] == [tok.bos_id] else got), (name, t)
  # a chat message holding every control text: exactly the template's own control tokens, as for a plain message
  typed = " ".join(texts) + "".join(texts)
  for role in ("user", "system", "assistant"):
    msgs = [{"role": "user", "content": "x"}, {"role": role, "content": typed}, {"role": "user", "content": "x"}]
    plain = [{"role": "user", "content": "x"}, {"role": role, "content": "x"}, {"role": "user", "content": "x"}]
    if name.startswith("gemma") and role == "system": continue   # (the gemma-style template has no system turn)
    got, want = llm.chat_prompt(msgs), llm.chat_prompt(plain)
    assert Counter(i for i in got if i in ctrl) == Counter(i for i in want if i in ctrl), (name, role)
    assert typed in tok.decode(got)


def test_merges_that_spell_a_control_token_are_not_applied():
  tok = byte_bpe()
  # every merge toward "<||>" exists and it is one pre-token, so plain BPE would end on the control token itself
  def merge(a: str, b: str) -> tuple[int, int] | None: return tok._pairs.get(tok.token_to_id(a), tok.token_to_id(b))
  assert "<||" + " >" in MERGES_OF["<||>"] and merge("<||", ">") is None and merge("<|", "|") is not None
  for text in ("<||>", "<|im_end|>", "a<||>b"):
    ids = tok.encode(text, parse_special=False)
    assert not tok.control_ids & set(ids) and tok.decode(ids) == text, text
  assert [tok.tokens[i] for i in tok.encode("<||>", parse_special=False)] == ["<||", ">"]
  g = gemma_like()
  assert g._merge_score("</s>") is None and g._merge_score("<h1>") is not None   # merges never form a control piece


def test_template_markers_join_the_control_ids():
  llm = LLM(None, byte_bpe(turn_type=USER_DEFINED), CHATML)
  s, e = llm.tok.token_to_id("<|im_start|>"), llm.tok.token_to_id("<|im_end|>")
  assert {s, e} <= llm.tok.control_ids and llm.tok.token_to_id("<think>") not in llm.tok.control_ids
  assert llm.tok.encode("<think>", parse_special=False) == [llm.tok.token_to_id("<think>")]
