"""Tokenizers built from GGUF metadata: byte-level BPE (`tokenizer.ggml.model == "gpt2"`: merge ranks, the pre-tokenizer regex
of the `tokenizer.ggml.pre` preset) and SentencePiece-style llama vocabularies (`"llama"`: score-driven merges, ▁ for spaces,
`<0xNN>` byte fallback), with special tokens matched in the text and UTF-8-safe streaming detokenization.
docs/llm_tokenizer.md describes the behaviour and its limits."""
from __future__ import annotations

import array
import codecs
import functools
import heapq
import math
import operator
import re
import unicodedata
import warnings
from typing import Any

from plugrad.apps.llm.vocab import PairTable, TokenTable, first_ids

# token types as GGUF stores them (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_EOG_NAMES = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "</s>")
_CACHE_MAX = 1 << 17  # per-tokenizer cache of BPE results per pre-token; cleared when it grows past this
_HEAP_MIN = 48        # words with more symbols than this merge with a heap (O(n log n)) instead of rescanning pairs

# ---------------------------------------------------------------------------- pre-tokenizer regexes

_WHITE_SPACE = [*range(9, 14), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]

def _ranges(cps: list[int]) -> str:
  """A regex character-class body matching exactly the sorted code points `cps`, as \\U escapes and ranges."""
  out, i = [], 0
  while i < len(cps):
    j = i
    while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1: j += 1
    out.append(f"\\U{cps[i]:08x}" if i == j else f"\\U{cps[i]:08x}-\\U{cps[j]:08x}")
    i = j + 1
  return "".join(out)

@functools.cache
def _classes() -> dict[str, str]:
  """Class bodies for \\p{L} (letters), \\p{N} (numbers) and \\s (Unicode White_Space), from this Python's unicodedata."""
  L: list[int] = []
  N: list[int] = []
  cat = unicodedata.category
  for c in range(0x40000):  # planes 4-16 hold no letters or numbers (unassigned, tags, private use)
    k = cat(chr(c))[0]
    if k == "L": L.append(c)
    elif k == "N": N.append(c)
  return {"{L}": _ranges(L), "{N}": _ranges(N), "{S}": _ranges(_WHITE_SPACE)}

# The presets' patterns, written with {L} {N} {S} for the bodies of \p{L}, \p{N}, \s (so `[^{S}]` is \S).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n{L}{N}]?[{L}]+|[{N}]{1,3}| ?[^{S}{L}{N}]+[\r\n]*"
           r"|[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+")
_QWEN2 = _LLAMA3.replace("[{N}]{1,3}", "[{N}]")
# preset -> (pattern, isolate every digit first, whole pre-token taken from the vocab before merging (llama.cpp's ignore_merges))
PRESETS: dict[str, tuple[str, bool, bool]] = {"gpt2": (_GPT2, False, False), "smollm": (_GPT2, True, False),
                                              "qwen2": (_QWEN2, False, False), "llama3": (_LLAMA3, False, True)}
PRE_ALIASES = {"gpt-2": "gpt2", "olmo": "gpt2", "starcoder": "smollm", "refact": "smollm", "deepseek-r1-qwen": "qwen2",
               "llama-bpe": "llama3", "llama-v3": "llama3", "dbrx": "llama3"}

@functools.cache
def _compile(pattern: str) -> re.Pattern:
  for k, v in _classes().items(): pattern = pattern.replace(k, v)
  return re.compile(pattern)

def _bytes_to_unicode() -> list[str]:
  """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves, the rest take 256, 257, ..."""
  keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
  out, extra = [""] * 256, 0
  for b in range(256):
    if b in keep: out[b] = chr(b)
    else: out[b], extra = chr(256 + extra), extra + 1
  return out

_B2U = _bytes_to_unicode()
_B2U_TABLE = str.maketrans({chr(b): u for b, u in enumerate(_B2U)})
_U2B = {u: b for b, u in enumerate(_B2U)}

# ---------------------------------------------------------------------------- merging

def _merge_ranked(ids: list[int], pairs: PairTable) -> list[int]:
  """Byte-level BPE on token ids: repeatedly merge the adjacent pair with the lowest rank (leftmost first when it repeats)."""
  if len(ids) > _HEAP_MIN: return _merge_heap(ids, pairs.get, lambda a, b, p: p[1])
  while len(ids) > 1:
    best, a, b = None, 0, 0
    for x, y in zip(ids, ids[1:]):
      if (r := pairs.get(x, y)) is not None and (best is None or r < best): best, a, b = r, x, y
    if best is None: break
    out, i, n = [], 0, len(ids)
    while i < n:
      if i + 1 < n and ids[i] == a and ids[i + 1] == b: out.append(best[1]); i += 2
      else: out.append(ids[i]); i += 1
    ids = out
  return ids

def _merge_heap(syms: list, prio: Any, join: Any) -> list:
  """Merge adjacent symbols in order of `p = prio(a, b)` (smaller first, None: never; ties go to the leftmost pair) into
  `join(a, b, p)`, with a heap of candidate pairs and a linked list of symbols; stale heap entries are recognized by a
  changed priority."""
  n = len(syms)
  nxt, prv, alive = list(range(1, n + 1)), list(range(-1, n - 1)), [True] * n
  heap = [(p, i) for i in range(n - 1) if (p := prio(syms[i], syms[i + 1])) is not None]
  heapq.heapify(heap)
  while heap:
    p, i = heapq.heappop(heap)
    if not alive[i] or (j := nxt[i]) >= n or prio(syms[i], syms[j]) != p: continue
    syms[i] = join(syms[i], syms[j], p)
    alive[j], nxt[i] = False, nxt[j]
    if nxt[i] < n: prv[nxt[i]] = i
    for a in (prv[i], i):
      if a >= 0 and nxt[a] < n and (q := prio(syms[a], syms[nxt[a]])) is not None: heapq.heappush(heap, (q, a))
  return [s for s, ok in zip(syms, alive) if ok]

# ---------------------------------------------------------------------------- tokenizer

class Tokenizer:
  """Text <-> token ids for a GGUF vocabulary. Build it with `Tokenizer.from_gguf_metadata(meta)`."""
  def __init__(self, tokens: list[str], types: list[int], model: str, pre: str | None = None, merges: list[str] | None = None,
               scores: list[float] | None = None, bos_id: int | None = None, eos_ids: set[int] | None = None,
               unk_id: int | None = None, add_space_prefix: bool = True, add_bos_token: bool = False):
    if model not in ("gpt2", "llama"):
      raise ValueError(f"unsupported tokenizer model {model!r} (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")
    if len(types) != len(tokens): raise ValueError(f"token_type has {len(types)} entries for {len(tokens)} tokens")
    # the texts live in one UTF-8 blob (TokenTable): as Python strings in a list and a dict they cost ~140 bytes a token
    first = first_ids(tokens)   # for the construction only
    self.model, self.tokens, self.types, self.vocab_size = model, TokenTable(tokens, first), array.array("B", types), len(tokens)
    self.special_tokens = {t: i for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED, UNKNOWN) and t}
    self.bos_id, self.unk_id, self.add_space_prefix, self.add_bos_token = bos_id, unk_id, add_space_prefix, add_bos_token
    self.eos_ids = set(eos_ids or ()) | {i for t in _EOG_NAMES if (i := self.special_tokens.get(t)) is not None}
    self._cache: dict[str, list[int]] = {}
    self.control_ids: frozenset[int] = frozenset()
    self.add_control({i for i, t in enumerate(types) if t in (CONTROL, UNKNOWN)} | self.eos_ids | ({bos_id} if bos_id is not None else set()))
    self._pieces: dict[int, bytes] = {}
    self._warned = False
    if model == "gpt2":
      self.pre = self._preset(pre)
      pattern, self._digits, self._ignore_merges = PRESETS[self.pre]
      self._rx, self._digit_rx = _compile(pattern), _compile("([{N}])")
      self._pairs, self._extra, self._byte_syms = self._merge_table(merges if merges is not None else [], first)
    else:
      self.pre = None
      sc = scores if scores is not None else [0.0] * len(tokens)
      if len(sc) != len(tokens): raise ValueError(f"scores has {len(sc)} entries for {len(tokens)} tokens")
      # -score per id (NaN: a token no merge may produce), read through vocab: a dict of 262144 floats for gemma's
      # vocabulary is 14 MB, this array 2 MB
      self._neg_scores = array.array("d", (-float(sc[i]) if types[i] in (NORMAL, USER_DEFINED, UNUSED) else math.nan
                                          for i in range(len(tokens))))
      self._byte_ids = [self.tokens.get(f"<0x{b:02X}>") for b in range(256)]
    self._derive()

  def _merge_table(self, merges: list[str], first: dict[str, int]) -> tuple[PairTable, list[str], list[int]]:
    """The merges keyed by their parts' ids; the texts with no token that they name, and byte characters without a
    token, as ids from vocab_size on (llama.cpp merges texts, so a merge may pass through such a text; real
    vocabularies have none); and the id each byte starts as."""
    extra: dict[str, int] = {}
    def sym(t: str) -> int:
      return i if (i := first.get(t)) is not None else extra.setdefault(t, self.vocab_size + len(extra))
    triples = []
    for r, m in enumerate(merges):
      if not isinstance(m, str) or (k := m.find(" ", 1)) < 0:
        raise ValueError(f"merge {r} ({m!r:.40}) is not two tokens separated by a space (GGUF tokenizer.ggml.merges)")
      triples.append((sym(m[:k]), sym(m[k + 1:]), sym(m[:k] + m[k + 1:])))
    byte_syms = [sym(c) for c in _B2U]
    return PairTable(self.vocab_size + len(extra), triples), list(extra), byte_syms

  def add_control(self, ids: set[int] | frozenset[int]) -> None:
    """Treat these token ids as control too: no text ever encodes to them unless `parse_special` reads special tokens
    (and a chat prompt's message content never does, see `control_rx`), whatever their type in the vocabulary. The
    constructor adds control and unknown tokens, the end-of-generation ids and BOS; `LLM` adds the special tokens
    its chat template writes and any stop id (gemma's `</s>` is a user-defined token and an end of sequence)."""
    ids = frozenset(int(i) for i in ids if 0 <= i < self.vocab_size)
    if ids <= self.control_ids: return
    self.control_ids = self.control_ids | ids
    if hasattr(self, "_byte_ids") or hasattr(self, "_pairs"): self._derive()

  def _derive(self) -> None:
    """The regexes and merge tables that depend on `control_ids`."""
    ctrl, types = self.control_ids, self.types
    control_texts = {self.tokens[i] for i in ctrl}   # (a text's first id may be a normal token spelled the same)
    self._special_rx = {True: self._special_regex(list(self.special_tokens)),
                        False: self._special_regex([t for t, i in self.special_tokens.items() if types[i] == USER_DEFINED and i not in ctrl])}
    # the control tokens' texts: what a chat prompt's message content must not be able to produce (fenced as text)
    self.control_rx = self._special_regex(sorted(t for t in control_texts if t in self.special_tokens))
    self._cache.clear()
    # merges that would spell a control token go (control ids only ever grow, so none has to come back)
    spelled = {self.tokens.get(t) for t in control_texts}   # the ids a merge of these texts produces
    if self.model == "gpt2": self._pairs.drop_making(i for i in spelled if i is not None)
    else:
      for i in spelled:
        if i is not None: self._neg_scores[i] = math.nan

  @staticmethod
  def _preset(pre: str | None) -> str:
    if pre is None or pre == "default":
      warnings.warn(f"GGUF tokenizer.ggml.pre is {pre!r}: using the gpt2 pre-tokenizer", stacklevel=3)
      return "gpt2"
    name = PRE_ALIASES.get(pre, pre)
    if name not in PRESETS:
      raise ValueError(f"unsupported pre-tokenizer tokenizer.ggml.pre={pre!r}; supported: {sorted([*PRESETS, *PRE_ALIASES])}")
    return name

  @staticmethod
  def _special_regex(texts: list[str]) -> re.Pattern | None:
    return re.compile("(" + "|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)) + ")") if texts else None

  @classmethod
  def from_gguf_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
    """The tokenizer described by the `tokenizer.ggml.*` keys of a GGUF's metadata (as returned by gguf_load)."""
    def get(key: str, default: Any = None) -> Any: return meta.get(f"tokenizer.ggml.{key}", default)
    if (model := get("model")) is None: raise ValueError("GGUF metadata has no tokenizer.ggml.model: the file carries no tokenizer")
    tokens = get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
      raise ValueError("GGUF tokenizer.ggml.tokens must be a non-empty list of strings")
    n = len(tokens)
    def tid(key: str, default: int | None = None) -> int | None:
      v = get(key, default)
      if v is None: return None
      if type(v) is not int or not 0 <= v < n:
        raise ValueError(f"GGUF tokenizer.ggml.{key}={v!r} is not a token id of the {n}-token vocabulary")
      return v
    spm = model == "llama"
    types = get("token_type", [NORMAL] * n)
    if not isinstance(types, list) or len(types) != n or not all(type(t) is int and 0 <= t <= BYTE for t in types):
      raise ValueError(f"GGUF tokenizer.ggml.token_type must be a list of {n} token types (integers 0-6), got {str(types)[:60]}")
    scores = get("scores")
    if scores is not None and (not isinstance(scores, list) or len(scores) != n or
                               not all(type(x) in (int, float) and math.isfinite(x) for x in scores)):
      raise ValueError(f"GGUF tokenizer.ggml.scores must be a list of {n} finite numbers, got {str(scores)[:60]}")
    pre = get("pre")
    if pre is not None and not isinstance(pre, str): raise ValueError(f"GGUF tokenizer.ggml.pre must be a string, got {pre!r:.60}")
    def flag(key: str, default: bool) -> bool:
      v = get(key, default)
      if type(v) is not bool and v not in (0, 1): raise ValueError(f"GGUF tokenizer.ggml.{key} must be a boolean, got {v!r:.60}")
      return bool(v)
    if not isinstance(model, str): raise ValueError(f"GGUF tokenizer.ggml.model must be a string, got {model!r:.60}")
    if model == "gpt2" and get("merges") is None: raise ValueError("GGUF byte-level BPE tokenizer has no tokenizer.ggml.merges")
    eos = {i for k in ("eos_token_id", "eot_token_id", "eom_token_id") if (i := tid(k)) is not None}
    if spm and get("eos_token_id") is None and n > 2: eos.add(2)  # llama.cpp's SentencePiece defaults: unk 0, bos 1, eos 2
    merges = get("merges")
    if merges is not None and not isinstance(merges, list):
      raise ValueError(f"GGUF tokenizer.ggml.merges must be a list of strings, got {merges!r:.60}")
    return cls(tokens, list(types), model, pre=pre, merges=merges, scores=scores,
               bos_id=tid("bos_token_id", 1 if spm and n > 1 else None), eos_ids=eos, unk_id=tid("unknown_token_id", 0 if spm else None),
               add_space_prefix=flag("add_space_prefix", True), add_bos_token=flag("add_bos_token", spm))

  # -------------------------------------------------------------------------- lookups

  def id_to_token(self, i: int) -> str:
    if not 0 <= (i := operator.index(i)) < self.vocab_size: raise IndexError(f"token id {i} out of range for a vocabulary of {self.vocab_size}")
    return self.tokens[i]

  def token_to_id(self, s: str) -> int | None: return self.tokens.get(s)

  @functools.cached_property
  def max_token_bytes(self) -> int:
    """The most UTF-8 bytes of text one token stands for (a text of n bytes has at least n / this many tokens)."""
    return max(4, max(len(self.piece_bytes(i)) for i in range(self.vocab_size)), max((len(t.encode()) for t in self.special_tokens), default=1))

  # -------------------------------------------------------------------------- encoding

  def encode(self, text: str, add_bos: bool = False, parse_special: bool = True, literal: tuple[str, str] | None = None) -> list[int]:
    """Token ids of `text`. Special tokens written in the text become their ids when `parse_special`; without it only
    user-defined tokens that aren't control (`control_ids`) do (llama.cpp parses every user-defined token: gemma's
    `</s>` would end a generation), and no text encodes to a control id; `add_bos` prepends the BOS token.
    `literal=(open, close)`: what lies between an `open` and the next `close` marker is plain text even where it spells
    a special token (the markers themselves are dropped)."""
    if not isinstance(text, str): raise TypeError(f"encode() takes a str, got {type(text).__name__}")
    out: list[int] = []
    if add_bos:
      if self.bos_id is None: raise ValueError("add_bos=True but this vocabulary has no BOS token (tokenizer.ggml.bos_token_id)")
      out.append(self.bos_id)
    rx = self._special_rx[bool(parse_special)]
    parts = self._split_literal(text, rx, *literal) if literal is not None else rx.split(text) if rx is not None else [text]
    after_special = True
    for k, part in enumerate(parts):
      if k & 1: out.append(self.special_tokens[part]); after_special = True
      elif part:
        out.extend(self._encode_bpe(part) if self.model == "gpt2" else self._encode_spm(part, after_special))
        after_special = False
    return out

  @staticmethod
  def _split_literal(text: str, rx: re.Pattern | None, open_: str, close: str) -> list[str]:
    """Like rx.split(text) (text, special, text, ..., text), with the spans between the markers kept as text."""
    out = [""]
    for k, seg in enumerate(re.split(f"({re.escape(open_)}.*?{re.escape(close)})", text, flags=re.S)):
      if k & 1: out[-1] += seg[len(open_):len(seg) - len(close)]
      else:
        sub = rx.split(seg) if rx is not None else [seg]
        out[-1] += sub[0]
        out.extend(sub[1:])
    return [p.replace(open_, "").replace(close, "") if not k & 1 else p for k, p in enumerate(out)]

  def pretokenize(self, text: str) -> list[str]:
    """The pieces the byte-level BPE pre-tokenizer splits `text` into (BPE never merges across them)."""
    segs = self._digit_rx.split(text) if self._digits else [text]
    out: list[str] = []
    for k, seg in enumerate(segs):
      if k & 1: out.append(seg)
      elif seg:
        pos = 0
        for m in self._rx.finditer(seg):  # keep anything the pattern skips as its own piece (no preset skips text)
          if m.start() > pos: out.append(seg[pos:m.start()])
          out.append(m.group())
          pos = m.end()
        if pos < len(seg): out.append(seg[pos:])
    return out

  def _encode_bpe(self, text: str) -> list[int]:
    out, cache = [], self._cache
    for piece in self.pretokenize(text):
      ids = cache.get(piece)
      if ids is None:
        if len(cache) > _CACHE_MAX: cache.clear()
        ids = cache[piece] = self._bpe_word(piece.encode("utf-8"))
      out.extend(ids)
    return out

  def _text_id(self, sym: str) -> int | None:
    """The id of a piece of plain text: its token unless that is a control token (`control_ids`)."""
    return None if (i := self.tokens.get(sym)) is None or i in self.control_ids else i

  def _bpe_word(self, raw: bytes) -> list[int]:
    if self._ignore_merges and (i := self._text_id(raw.decode("latin-1").translate(_B2U_TABLE))) is not None: return [i]
    out, n, ctrl = [], self.vocab_size, self.control_ids
    for sym in _merge_ranked([self._byte_syms[b] for b in raw], self._pairs):
      if sym < n and sym not in ctrl: out.append(sym)
      else: out.extend(i for c in self._sym_text(sym) for i in self._unk_char(c))
    return out

  def _sym_text(self, sym: int) -> str: return self.tokens[sym] if sym < self.vocab_size else self._extra[sym - self.vocab_size]

  def _unk_char(self, c: str) -> list[int]:
    """A byte with no token: dropped with a warning, as llama.cpp and Hugging Face tokenizers do (the unknown token of
    byte-level vocabularies is often also their end-of-text token, which must not appear in a prompt)."""
    if (i := self._text_id(c)) is not None: return [i]
    if not self._warned:
      warnings.warn(f"byte 0x{_U2B.get(c, 0):02x} has no token in this vocabulary: dropped from the encoding", stacklevel=4)
      self._warned = True
    return []

  def _merge_score(self, t: str) -> float | None:
    """SentencePiece: -score of the piece t when merging may form it (lower merges first), else None."""
    return None if (i := self.tokens.get(t)) is None or (v := self._neg_scores[i]) != v else v

  def _encode_spm(self, text: str, after_special: bool) -> list[int]:
    if self.add_space_prefix and after_special: text = " " + text
    syms = _merge_heap(list(text.replace(" ", "\u2581")), lambda a, b: self._merge_score(a + b), lambda a, b, p: a + b)
    out = []
    for s in syms:
      if (i := self._text_id(s)) is not None: out.append(i); continue
      byte_ids = [self._byte_ids[b] for b in s.encode("utf-8")]  # byte fallback, else one unknown token per symbol
      if None not in byte_ids: out.extend(byte_ids)
      elif self.unk_id is not None: out.append(self.unk_id)
      else: raise ValueError(f"character {s!r} has no token, byte fallback or unknown token in this vocabulary")
    return out

  # -------------------------------------------------------------------------- decoding

  def piece_bytes(self, i: int, skip_special: bool = False) -> bytes:
    """The bytes token `i` stands for (control and unknown tokens: their text, or nothing when `skip_special`)."""
    i = operator.index(i)
    if not 0 <= i < self.vocab_size: raise IndexError(f"token id {i} out of range for a vocabulary of {self.vocab_size}")
    t = self.types[i]
    if t in (CONTROL, UNKNOWN): return b"" if skip_special else self.tokens[i].encode("utf-8")
    if (b := self._pieces.get(i)) is not None: return b
    s = self.tokens[i]
    if t == USER_DEFINED: b = s.encode("utf-8")
    elif self.model == "gpt2": b = bytes(_U2B[c] for c in s) if all(c in _U2B for c in s) else s.encode("utf-8")
    elif t == BYTE and len(s) == 6 and s.startswith("<0x") and s.endswith(">"): b = bytes([int(s[3:5], 16)])
    else: b = s.replace("\u2581", " ").encode("utf-8")
    self._pieces[i] = b
    return b

  def decode(self, ids: list[int], skip_special: bool = False) -> str:
    """The text of `ids` (invalid UTF-8 becomes U+FFFD). Exactly what a StreamDecoder fed the same ids produces."""
    d = self.stream(skip_special)
    return "".join([d.feed(i) for i in ids]) + d.flush()

  def stream(self, skip_special: bool = False) -> StreamDecoder: return StreamDecoder(self, skip_special)

class StreamDecoder:
  """Incremental detokenizer: `feed(id)` returns the text completed by that token (never half a UTF-8 character),
  `flush()` whatever is left at the end (an unfinished character becomes U+FFFD)."""
  def __init__(self, tok: Tokenizer, skip_special: bool = False):
    self.tok, self.skip_special = tok, skip_special
    self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    self._strip = tok.model == "llama" and tok.add_space_prefix  # undo the space SentencePiece adds after BOS/specials
    self._after_special = True

  def feed(self, i: int) -> str:
    b, t = self.tok.piece_bytes(i, self.skip_special), self.tok.types[operator.index(i)]
    if t in (CONTROL, UNKNOWN): self._after_special = True
    elif b:
      if self._strip and self._after_special and t == NORMAL and b.startswith(b" "): b = b[1:]
      self._after_special = False
    return self._dec.decode(b)

  def flush(self) -> str: return self._dec.decode(b"", final=True)
