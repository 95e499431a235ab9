"""Tokenizer tests: byte-level BPE of the embedded SmolLM2 GGUF against Hugging Face `tokenizers` built from the same vocab
and merges, the other pre-tokenizer presets against `tokenizers`' regex splitting, streaming detokenization, and a small
SentencePiece-style vocabulary against hand-computed merges."""

import pytest

from plugrad.apps.llm.tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, Tokenizer

@pytest.fixture(scope="module")
def meta(embedded_meta): return embedded_meta

@pytest.fixture(scope="module")
def tok(meta): return Tokenizer.from_gguf_metadata(meta)

CORPUS = [
  "Hello world! It's a test.", "The quick brown fox jumps over the lazy dog.", "I'M you'LL we'd they've she's O'Neil",
  "Numbers: 0 7 42 1234567 3.14159 -2.5e-10 1,000,000 0x1F 2024-11-29 12:30:59 ١٢٣ ½ Ⅻ",
  "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; }  // C++ \t\t tabs",
  '{"key": [1, 2, {"nested": null}], "s": "a\\nb"}', "SELECT * FROM t WHERE x >= 10 AND y != 'z';",
  "日本語のテキストと中文文本，还有한국어 텍스트。", "Emoji: 🤖🚀👍🏽 👨‍👩‍👧 ❤️ flags 🇫🇷", "café naïve résumé Ångström ß ẞ Ωμέγα Привет мир",
  "combining: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 ज़", "Arabic: مرحبا بالعالم and Hebrew: שלום עולם",
  "   leading spaces", "trailing spaces   ", "many     spaces    between\t\twords", "\n\n\nnewlines\r\n\r\nCRLF\n \n  \n",
  "mixed \u00a0nbsp \u2003emsp \u3000ideographic\u2028line sep", "x" * 300, " " * 200 + "end", "ab" * 150,
  "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|><|im_end|>text<|im_start|>",
  "almost <|im_start special <|im_end |> tokens", "URL https://example.com/a?b=c&d=e#f and email a.b@c.org",
  "$$ \\frac{a}{b} = \\sum_{i=0}^{n} x_i^2 $$", "…— “quotes” ‘single’ «guillemets» ‹›", "a\tb\vc\fd\x85e",
  "sep\x1c\x1e \x1f x\x1c", "\x1f\x1f  \x1c\x1c a", "   ", "", "1", " 1", "a1b2c3", "x  = 1\n\n\n\ny = 22\n",
]

# ---------------------------------------------------------------------------- Hugging Face tokenizers as the oracle

def hf_tokenizer(meta, pre_tokenizer, ignore_merges: bool = False):
  tk = pytest.importorskip("tokenizers")
  toks = meta["tokenizer.ggml.tokens"]
  vocab = {t: i for i, t in enumerate(toks)}
  merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
  h = tk.Tokenizer(tk.models.BPE(vocab, merges, ignore_merges=ignore_merges))
  h.pre_tokenizer = pre_tokenizer
  h.decoder = tk.decoders.ByteLevel()
  types = meta["tokenizer.ggml.token_type"]
  h.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for i, t in enumerate(toks) if types[i] == CONTROL])
  return h

def test_smollm_matches_hf(meta, tok):
  tk = pytest.importorskip("tokenizers")
  pre = tk.pre_tokenizers.Sequence([tk.pre_tokenizers.Digits(individual_digits=True),
                                    tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  h = hf_tokenizer(meta, pre)
  for text in [*CORPUS, "".join(CORPUS)]:
    assert tok.encode(text) == h.encode(text).ids, repr(text)
    assert tok.decode(tok.encode(text)) == h.decode(h.encode(text).ids, skip_special_tokens=False)

# the presets' regexes as written by their authors (\p classes), split by tokenizers' own regex engine
HF_PATTERNS = {
  "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
  "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
  "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}

@pytest.mark.parametrize("pre", ["gpt2", "llama3", "qwen2", "llama-bpe"])
def test_presets_match_hf(meta, pre):
  tk = pytest.importorskip("tokenizers")
  name = {"llama-bpe": "llama3"}.get(pre, pre)
  split = tk.pre_tokenizers.Split(tk.Regex(HF_PATTERNS[name]), behavior="isolated")
  h = hf_tokenizer(meta, tk.pre_tokenizers.Sequence([split, tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                   ignore_merges=name == "llama3")
  ours = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": pre})
  assert ours.pre == name
  for text in [*CORPUS, "".join(CORPUS), "I'VE 'Ll"]:
    assert ours.pretokenize(text) == [p for p, _ in split.pre_tokenize_str(text)], repr(text)
    assert ours.encode(text) == h.encode(text).ids, repr(text)

def test_llama3_ignore_merges(meta):
  # a whole pre-token found in the vocabulary is taken as is, even where the merges would split it differently
  toks = ["a", "b", "c", "ab", "bc", "abc"]
  kw = dict(tokens=toks, types=[NORMAL] * 6, model="gpt2", merges=["b c", "a b"])
  assert Tokenizer(pre="qwen2", **kw).encode("abc") == [0, 4]
  assert Tokenizer(pre="llama3", **kw).encode("abc") == [5]

# ---------------------------------------------------------------------------- smollm vocabulary facts and behaviour

def test_smollm_vocab(tok):
  assert tok.model == "gpt2" and tok.pre == "smollm" and tok.vocab_size == 49152
  assert tok.bos_id == 1 and tok.eos_ids == {0, 2}  # eos <|im_end|>, plus <|endoftext|>
  assert len(tok.special_tokens) == 17 and tok.special_tokens["<|im_start|>"] == 1
  assert tok.id_to_token(2) == "<|im_end|>" and tok.token_to_id("<|im_end|>") == 2 and tok.token_to_id("no such token") is None
  assert tok.pretokenize("a 123 b") == ["a", " ", "1", "2", "3", " b"]  # every digit on its own

def test_special_tokens(tok):
  assert tok.encode("<|im_start|>user") == [1, tok.token_to_id("user")]
  literal = tok.encode("<|im_start|>user", parse_special=False)
  assert 1 not in literal and tok.decode(literal) == "<|im_start|>user"
  assert tok.encode("hi", add_bos=True)[0] == 1
  ids = tok.encode("<|im_start|>a<|im_end|>")
  assert tok.decode(ids) == "<|im_start|>a<|im_end|>" and tok.decode(ids, skip_special=True) == "a"

def test_roundtrip(tok):
  for text in CORPUS: assert tok.decode(tok.encode(text)) == text

def test_unrepresentable_byte_dropped(meta, tok):
  # SmolLM2's vocabulary has no token for byte 0x1d: dropped with a warning, as llama.cpp and tokenizers drop it
  with pytest.warns(UserWarning, match="0x1d"): ids = Tokenizer.from_gguf_metadata(meta).encode("a\x1db")
  assert ids == tok.encode("a") + tok.encode("b")

def test_long_words(meta, tok):
  # pre-tokens of thousands of symbols merge with the heap path; must agree with tokenizers and stay fast
  tk = pytest.importorskip("tokenizers")
  h = hf_tokenizer(meta, tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
  ours = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "gpt2"})
  for text in ["a" * 5000, "ab" * 2500, " " * 4000 + "x", "z9" * 100, "\u00e9" * 2000]:
    assert ours.encode(text) == h.encode(text).ids

# ---------------------------------------------------------------------------- streaming

def test_stream_multibyte_split(tok):
  text = "Emoji 🤖🚀👍🏽 and 日本語 ok"
  ids = tok.encode(text)
  pieces = [tok.piece_bytes(i) for i in ids]
  split = [k for k, b in enumerate(pieces) if b and not _complete(b)]
  assert split, "test needs a character split across tokens"
  d, outs = tok.stream(), []
  for i in ids: outs.append(d.feed(i))
  outs.append(d.flush())
  assert "".join(outs) == text and all("\ufffd" not in s for s in outs)
  assert any(outs[k] == "" for k in split)  # a token ending mid-character emits nothing yet

def _complete(b: bytes) -> bool:
  try: b.decode("utf-8"); return True
  except UnicodeDecodeError: return False

def test_stream_flush_incomplete(tok):
  ids = tok.encode("🤖")
  assert len(ids) > 1
  d = tok.stream()
  assert d.feed(ids[0]) == "" and d.flush() == "\ufffd"
  assert tok.decode(ids[:1]) == "\ufffd"

def test_bad_ids(tok):
  with pytest.raises(IndexError, match="49152"): tok.decode([49152])
  with pytest.raises(IndexError): tok.decode([-1])
  with pytest.raises(IndexError): tok.id_to_token(10**6)
  with pytest.raises(TypeError): tok.decode([1.5])
  with pytest.raises(TypeError): tok.encode(b"bytes")

# ---------------------------------------------------------------------------- metadata errors

def test_metadata_errors(meta):
  with pytest.raises(ValueError, match="no tokenizer.ggml.model"): Tokenizer.from_gguf_metadata({})
  with pytest.raises(ValueError, match="unsupported tokenizer model 'bert'"): Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.model": "bert"})
  with pytest.raises(ValueError, match="supported:.*qwen2"): Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "mystery"})
  with pytest.raises(ValueError, match="merges"): Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.merges": None})
  with pytest.raises(ValueError, match="not two tokens"): Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.merges": ["ab"]})
  with pytest.raises(ValueError, match="bos_token_id"): Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.bos_token_id": 10**6})
  with pytest.raises(ValueError, match="token_type"): Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.token_type": [1]})
  with pytest.raises(ValueError, match="list of strings"): Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.tokens": [1, 2]})
  with pytest.warns(UserWarning, match="gpt2 pre-tokenizer"):
    t = Tokenizer.from_gguf_metadata({k: v for k, v in meta.items() if k != "tokenizer.ggml.pre"})
  assert t.pre == "gpt2"
  with pytest.raises(ValueError, match="no BOS"):
    Tokenizer.from_gguf_metadata({k: v for k, v in meta.items() if k != "tokenizer.ggml.bos_token_id"}).encode("x", add_bos=True)

# ---------------------------------------------------------------------------- SentencePiece-style (llama) vocabulary

SPM_PIECES = [("▁", -1), ("h", -2), ("e", -2), ("l", -2), ("o", -2), ("w", -3), ("r", -3), ("d", -3), ("a", -3), ("ll", -5),
              ("he", -6), ("llo", -7), ("hello", -8), ("▁hello", -9), ("or", -5.5), ("▁w", -6.5), ("▁wor", -10), ("▁world", -11),
              ("ld", -12), ("aa", -4), ("<tool>", 0)]

def spm_meta(**over):
  toks = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *(p for p, _ in SPM_PIECES)]
  types = [UNKNOWN, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * (len(SPM_PIECES) - 1), USER_DEFINED]
  m = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": toks, "tokenizer.ggml.token_type": types,
       "tokenizer.ggml.scores": [0.0] * 259 + [s for _, s in SPM_PIECES], "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
  return {**m, **{f"tokenizer.ggml.{k}": v for k, v in over.items()}}

@pytest.fixture(scope="module")
def spm(): return Tokenizer.from_gguf_metadata(spm_meta())

def P(spm, *pieces): return [spm.token_to_id(p) for p in pieces]

def test_spm_merges_by_score(spm):
  # "▁hello▁world": ll(-5) or(-5.5) he(-6) ▁w(-6.5) llo(-7) hello(-8) ▁hello(-9) ▁wor(-10) ld(-12) then ▁world(-11)
  assert spm.encode("hello world") == P(spm, "▁hello", "▁world")
  assert spm.encode("hello world", add_bos=True) == [1, *P(spm, "▁hello", "▁world")]
  assert spm.encode("wold") == P(spm, "▁w", "o", "ld")
  assert spm.encode("aaa") == P(spm, "▁", "aa", "a")  # equal scores: leftmost pair first
  assert spm.decode(spm.encode("hello world")) == "hello world"

def test_spm_byte_fallback(spm):
  ids = spm.encode("hé!")
  assert ids == [*P(spm, "▁", "h"), 3 + 0xC3, 3 + 0xA9, 3 + 0x21]
  assert spm.decode(ids) == "hé!"
  d = spm.stream()
  assert [d.feed(i) for i in ids] == ["", "h", "", "é", "!"]  # the space SentencePiece added is not shown

def test_spm_special_tokens(spm):
  ids = spm.encode("<s>hello</s>x<tool>")
  assert ids == [1, *P(spm, "▁hello"), 2, *P(spm, "▁"), 3 + ord("x"), spm.token_to_id("<tool>")]
  assert spm.decode(ids) == "<s>hello</s>x<tool>" and spm.decode(ids, skip_special=True) == "hellox<tool>"
  assert spm.encode("<s>", parse_special=False) == [*P(spm, "▁"), 3 + ord("<"), 3 + ord("s"), 3 + ord(">")]
  assert spm.encode("<tool>", parse_special=False) == P(spm, "<tool>")  # user-defined tokens always match
  assert spm.eos_ids == {2} and spm.bos_id == 1 and spm.add_bos_token

def test_spm_no_space_prefix():
  t = Tokenizer.from_gguf_metadata(spm_meta(add_space_prefix=False))
  assert t.encode("hello") == [t.token_to_id("hello")] and t.decode(t.encode(" hello")) == " hello"

def test_spm_roundtrip(spm):
  for text in ["hello world", "  two  spaces ", "日本 🤖", "a\nb\tc", "wor ld hello"]: assert spm.decode(spm.encode(text)) == text

def test_spm_unknown_without_byte_fallback():
  m = spm_meta()
  toks = [t if not t.startswith("<0x") else f"<unused{i}>" for i, t in enumerate(m["tokenizer.ggml.tokens"])]
  t = Tokenizer.from_gguf_metadata({**m, "tokenizer.ggml.tokens": toks})
  assert t.encode("hé") == [*P(t, "▁", "h"), 0]
