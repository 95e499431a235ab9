"""Generation: KV-cache reuse across turns, symbolic prefill, JIT decode, sampling, stop conditions.

`Generator` runs a `Transformer` over token ids. The new part of a prompt is prefilled in one pass through kernels
compiled once for a symbolic length (2..max_context, padded up to a multiple of PREFILL_MULTIPLE) and start position;
single tokens are decoded under TinyJit with a symbolic start position. The tokens whose keys/values sit in the cache
are remembered, so a follow-up prompt that extends them only prefills its new tokens; a prompt that diverges rewrites
the cache from the first difference.
`LLM` adds the tokenizer, chat template, streaming detokenization and stop strings on top.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from plugrad import TinyJit, Variable
from plugrad.device import Device
from plugrad.engine.memory import JitArena
from plugrad.engine.realize import buffer_for
from plugrad.nn.state import gguf_load
from plugrad.uop.buffers import buffer_of
from plugrad.tensor import Tensor

from plugrad.apps.llm.chat import TemplateLimitError, render_chat, validate_messages
from plugrad.apps.llm.model import CACHE_PAD, PREFILL_MULTIPLE, Config, Transformer, check_shapes
from plugrad.apps.llm.tokenizer import Tokenizer

# prefills of at most this many (padded) tokens run the graph whose matmuls dequantize weights in their inner loop;
# longer ones run the same fused graph sized for PREFILL_CHUNK where the device packs the dequantized operand
# (`Transformer.fused_long_prefill`), else dequantize each weight into an (in, out) buffer first (or read the model's
# dense copies, if it keeps them)
SHORT_PREFILL = 64
# longer prefills run in chunks of this many tokens: the intermediate buffers (attention scores: heads x chunk x
# context) are sized for the largest chunk
PREFILL_CHUNK = 512


class ContextLengthExceeded(ValueError):
  """A prompt (plus at least one generated token) doesn't fit in max_context."""
  code = "context_length_exceeded"


@dataclass
class SamplingParams:
  max_tokens: int = 256
  temperature: float = 0.0     # 0: greedy
  top_k: int = 0               # 0: off
  top_p: float = 1.0           # 1: off
  seed: int | None = None
  stop: list[str] = field(default_factory=list)

  def check(self) -> SamplingParams:
    if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
      raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
    if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool) or not 0 <= self.temperature <= 100:
      raise ValueError(f"temperature must be a number in [0, 100], got {self.temperature!r}")
    if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
      raise ValueError(f"top_k must be a non-negative integer, got {self.top_k!r}")
    if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool) or not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
    if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
      raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
    if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
      raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
    return self


def sample(logits: np.ndarray, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           rng: np.random.Generator | None = None) -> int:
  """One token id from a logits vector: argmax when temperature is 0, else softmax(logits / temperature) restricted
  to the top_k largest and to the smallest set whose probability reaches top_p."""
  logits = np.asarray(logits, dtype=np.float64).reshape(-1)
  if temperature <= 0: return int(np.argmax(logits))
  with np.errstate(over="ignore"): z = logits / temperature
  if not np.isfinite(z).all(): return int(np.argmax(logits))   # a temperature so small (5e-324) that it overflows: the limit is greedy
  if 0 < top_k < z.size: z = np.where(z < np.partition(z, -top_k)[-top_k], -np.inf, z)
  p = np.exp(z - z.max())
  p /= p.sum()
  if top_p < 1.0:
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    drop = order[(cum - p[order]) >= top_p]   # keep tokens until the mass before them reaches top_p
    p[drop] = 0.0
    p /= p.sum()
  return int((rng or np.random.default_rng()).choice(p.size, p=p))


def release_prefill_memory(model: Transformer, arena: JitArena, *decode: TinyJit) -> None:
  """After a prefill: its scores scratch and its intermediates in the arena past what the `decode` steps use are dead
  until the next prefill, and go back to the system (SmolLM2 after a 450-token prompt: 169 -> 146 MB resident). The
  next prefill takes them again as zero pages (that prompt's prefill: 741-759 ms against 747-750 keeping them)."""
  model.scores.discard()
  arena.discard(keep=[c for jit in decode for c in jit.captures])


class Generator:
  """Token-level inference over one sequence with a reusable KV cache."""

  def __init__(self, model: Transformer):
    self.model, self.max_context = model, model.max_context
    self.cached: list[int] = []   # tokens whose keys/values are in the cache, from position 0
    m = PREFILL_MULTIPLE
    self.v_len = Variable("T", 1, (min(self.max_context, PREFILL_CHUNK) + m - 1) // m)   # the padded prefill length is m*T
    self.v_short = Variable("Ts", 1, min(SHORT_PREFILL, self.max_context + m - 1) // m)   # the same for a short prefill
    self.v_start, self.v_last = Variable("start", 0, self.max_context - 1), Variable("last", 1, self.max_context - 1)
    self.v_keys = Variable("S", 1, (self.max_context + CACHE_PAD) // m)   # keys read: m*S >= start + m*T, the rest masked
    dim = model.cfg.dim
    rows = (min(self.max_context, PREFILL_CHUNK) + m - 1) // m * m
    self.inp = Tensor.zeros(model.batch, rows, dim).contiguous().realize()   # prefill embeddings, written in place
    self.inp1 = Tensor.zeros(model.batch, 1, dim).contiguous().realize()   # decode embedding, written by the decode step
    self.v_tok = Variable("tok", 0, model.cfg.vocab_size - 1)
    # the three steps never run at once: their intermediates share one arena (the largest plan's memory, not the sum)
    self.arena = JitArena()
    self.prefill_jit = TinyJit(functools.partial(self._prefill, fused=model.fused_long_prefill()), arena=self.arena)
    self.decode_jit = TinyJit(self._decode, arena=self.arena)
    self.short_jit = TinyJit(functools.partial(self._prefill, fused=True), arena=self.arena)
    self.finish_reason: str | None = None

  def _prefill(self, T: Any, start: Any, last: Any, keys: Any, fused: bool = False) -> Tensor:
    m = PREFILL_MULTIPLE
    return self.model.forward(self.inp[:, :T * m], start, last, keys * m, fused=fused).realize()
  def _decode(self, start: Any, keys: Any, tok: Any) -> Tensor:
    self.model.write_embeddings(self.inp1[0], [tok])
    return self.model.forward(self.inp1, start, keys_len=keys * PREFILL_MULTIPLE).realize()

  @staticmethod
  def _write(t: Tensor, rows: np.ndarray) -> None:
    buf = buffer_for(buffer_of(t.uop))
    Device[buf.device].synchronize()
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    (buf if rows.nbytes == buf.nbytes else buf.view(rows.size, buf.dtype, 0)).copyin(rows)

  def forward(self, tokens: Sequence[int], start: int) -> np.ndarray:
    """Run `tokens` at positions [start, start + len) (the cache must hold the tokens before start); the logits of
    the last one (float32, vocab)."""
    n = len(tokens)
    if n == 0: raise ValueError("forward needs at least one token")
    if start < 0 or start + n > self.max_context:
      raise ContextLengthExceeded(f"positions [{start}, {start + n}) don't fit in max_context={self.max_context}")
    out = self._run(tokens, start)
    if n > 1: release_prefill_memory(self.model, self.arena, self.decode_jit)
    return out

  def _run(self, tokens: Sequence[int], start: int) -> np.ndarray:
    n = len(tokens)
    if n > PREFILL_CHUNK:
      for i in range(0, n - PREFILL_CHUNK, PREFILL_CHUNK): self._run(tokens[i:i + PREFILL_CHUNK], start + i)
      done = (n - 1) // PREFILL_CHUNK * PREFILL_CHUNK
      return self._run(tokens[done:], start + done)
    if n == 1:
      self.model.check_ids(tokens)
      out = self.decode_jit(self.v_start.bind(start), self.v_keys.bind(-(-(start + 1) // PREFILL_MULTIPLE)), self.v_tok.bind(int(tokens[0])))
    else:
      emb = self.model.embed(tokens)
      m = PREFILL_MULTIPLE
      padded = -(-n // m)
      self._write(self.inp, np.concatenate([emb, np.zeros((padded * m - n, emb.shape[1]), np.float32)]))
      keys = -(-(start + padded * m) // m)
      jit, v_len = (self.short_jit, self.v_short) if padded * m <= SHORT_PREFILL else (self.prefill_jit, self.v_len)
      out = jit(v_len.bind(padded), self.v_start.bind(start), self.v_last.bind(n - 1), self.v_keys.bind(keys))
    self.cached = self.cached[:start] + list(tokens)
    return out.numpy()[0]

  def prefill(self, tokens: Sequence[int]) -> np.ndarray:
    """Make the cache hold `tokens` (reusing the longest common prefix of what it holds) and return the logits after
    the last one."""
    tokens = list(tokens)
    if not tokens: raise ValueError("the prompt is empty: at least one token is needed")
    if len(tokens) >= self.max_context:
      raise ContextLengthExceeded(f"the prompt has {len(tokens)} tokens, but max_context is {self.max_context} "
                                  f"(it must leave room for at least one generated token); raise --max_context or shorten the prompt")
    same = 0
    for a, b in zip(self.cached, tokens):
      if a != b: break
      same += 1
    start = min(same, len(tokens) - 1)   # at least the last token runs, to get its logits
    return self.forward(tokens[start:], start)

  def generate(self, prompt: Sequence[int], params: SamplingParams | None = None, stop_ids: set[int] | frozenset = frozenset()) -> Iterator[int]:
    """Yield generated token ids until max_tokens, an id in stop_ids (not yielded) or the end of the context;
    `finish_reason` is then "length" or "stop"."""
    p = (params or SamplingParams()).check()
    rng = np.random.default_rng(p.seed)
    self.finish_reason = None
    seq = list(prompt)
    logits = self.prefill(seq)
    for i in range(p.max_tokens):
      tok = sample(logits, p.temperature, p.top_k, p.top_p, rng)
      if tok in stop_ids:
        self.finish_reason = "stop"
        return
      yield tok
      seq.append(tok)
      if i == p.max_tokens - 1 or len(seq) >= self.max_context: break
      logits = self.forward([tok], len(seq) - 1)
    self.finish_reason = "length"


class StopMatcher:
  """Streams text while holding back anything that could be the start of a stop string."""
  def __init__(self, stops: Sequence[str]): self.stops, self.buf, self.stopped = list(stops), "", False

  def feed(self, text: str) -> str:
    if self.stopped: return ""
    self.buf += text
    hits = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
    if hits:
      out, self.buf, self.stopped = self.buf[:min(hits)], "", True
      return out
    hold = max((k for s in self.stops for k in range(1, min(len(s), len(self.buf)) + 1) if self.buf.endswith(s[:k])), default=0)
    out, self.buf = self.buf[:len(self.buf) - hold], self.buf[len(self.buf) - hold:]
    return out

  def flush(self) -> str:
    out, self.buf = ("" if self.stopped else self.buf), ""
    return out


def literal_markers(texts: Sequence[str]) -> tuple[str, str]:
  """Two Unicode noncharacters (U+FDD0..U+FDEF, never meaningful in text) that occur in none of `texts`."""
  free = [c for c in map(chr, range(0xFDD0, 0xFDF0)) if not any(c in t for t in texts)]
  if len(free) < 2: raise ValueError("the messages use every Unicode noncharacter U+FDD0..U+FDEF; remove some")
  return free[0], free[1]


def _not_empty(ids: list[int], what: str) -> list[int]:
  if not ids: raise ValueError(f"the prompt is empty: the {what} text gives no tokens (at least one is needed)")
  return ids


class LLM:
  """A model with its tokenizer and chat template: text in, streamed text out."""

  def __init__(self, model: Transformer | None, tokenizer: Any, chat_template: str | None = None, name: str = "model"):
    self.model, self.tok, self.template, self.name = model, tokenizer, chat_template, name
    self.last_usage = {"prompt_tokens": 0, "completion_tokens": 0}
    self.finish_reason: str | None = None
    if hasattr(tokenizer, "add_control"): tokenizer.add_control(self.template_markers())

  # conversations whose rendering shows the template's own markup (turn markers, role headers); templates that refuse
  # a system turn or want strict alternation render at least one of them
  _PROBES = ([{"role": "system", "content": "x"}, {"role": "user", "content": "x"}, {"role": "assistant", "content": "x"},
              {"role": "user", "content": "x"}],
             [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "x"}])

  def template_markers(self) -> set[int]:
    """The special tokens the chat template writes around messages (rendered for short conversations): control for
    the app whatever their type in the vocabulary, so that no message content or completion prompt produces them."""
    special = set(self.tok.special_tokens.values())
    out: set[int] = set()
    for msgs in self._PROBES:
      try: text = render_chat(self.template, msgs, add_generation_prompt=True, bos_token=self._special(self.tok.bos_id),
                              eos_token=self._special(min(self.tok.eos_ids, default=None)), strict=True)
      except TemplateLimitError as e: raise ValueError(f"GGUF tokenizer.chat_template: {e}") from None
      except (ValueError, TypeError): continue
      out |= {i for i in self.tok.encode(text, parse_special=True) if i in special}
    return out

  @functools.cached_property
  def gen(self) -> Generator:
    """The single-sequence generator (REPL, --prompt, --benchmark); built on first use."""
    return Generator(self.model)

  @staticmethod
  def load(path: str, max_context: int = 4096, progress: Any = None, name: str = "model", dense_prefill_mb: int = 0, batch: int = 1,
           kv: str | None = None) -> LLM:
    """A GGUF model with its tokenizer and template; `batch` KV-cache rows (the server's slots) of `kv` elements
    ("float16" or "float32"; default KV_DTYPE, else float16: model.kv_dtype). The metadata is checked
    before any weight is read: the tokenizer's keys, the chat template (a string that renders within its limits), the
    model's keys and tensor shapes (`Transformer.from_loaded`); each problem is a ValueError naming the key or tensor."""
    meta, tensors = gguf_load(path)
    llm = LLM.from_metadata(meta, {k: t.shape for k, t in tensors.items()}, name)
    llm.model = Transformer.from_loaded(path, meta, tensors, max_context, progress, dense_prefill_mb << 20, batch, kv)
    return llm

  @staticmethod
  def from_metadata(meta: dict[str, Any], shapes: dict[str, tuple], name: str = "model") -> LLM:
    """An LLM without its model yet, from GGUF metadata and the file's tensor shapes, everything checked that can be
    without reading a weight: the tokenizer's keys, the chat template (a string that renders within its limits), the
    vocabulary against the embedding rows, the model's keys and the tensor shapes (`Config.from_gguf`,
    `check_shapes`); each problem a ValueError naming the key or tensor."""
    tok = Tokenizer.from_gguf_metadata(meta)
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
      raise ValueError(f"GGUF tokenizer.chat_template must be a string, got {type(template).__name__} {template!r:.60}")
    rows = shapes["token_embd.weight"][0] if "token_embd.weight" in shapes else None
    if rows is not None and tok.vocab_size > rows:
      raise ValueError(f"GGUF tokenizer.ggml.tokens has {tok.vocab_size} tokens, more than the {rows} rows of token_embd.weight")
    check_shapes(Config.from_gguf(meta, rows), shapes)
    return LLM(None, tok, template, name)   # (renders the template: one that runs past its limits is refused here)

  def _special(self, tid: int | None) -> str:
    if tid is None: return ""
    try: return self.tok.decode([tid], skip_special=False)
    except Exception: return ""

  def _check_length(self, text: str, max_context: int | None) -> None:
    """Refuse a prompt that can't fit before tokenizing it: a token covers at most `max_token_bytes` bytes."""
    if max_context is None: return
    per = self.tok.max_token_bytes
    if len(text) * 4 // per >= max_context and (n := len(text.encode("utf-8", "replace"))) // per >= max_context:
      raise ContextLengthExceeded(f"this model's maximum context length is {max_context} tokens, but the prompt has at least "
                                  f"{n // per} ({n} bytes of text)")

  def chat_prompt(self, messages: list[dict[str, Any]], max_context: int | None = None) -> list[int]:
    """The token ids of `messages` under the chat template (a prompt that can't fit in `max_context` is refused early)."""
    eos = next(iter(sorted(self.tok.eos_ids)), None)
    bos = self._special(self.tok.bos_id)
    msgs = validate_messages(messages)
    marks = literal_markers([m["content"] for m in msgs] + [self.template or ""])
    rx = self.tok.control_rx   # control tokens typed in a message are text: fenced by the markers through the template
    if rx is not None: msgs = [{**m, "content": rx.sub(lambda t: marks[0] + t.group() + marks[1], m["content"])} for m in msgs]
    text = render_chat(self.template, msgs, add_generation_prompt=True, bos_token=bos, eos_token=self._special(eos))
    self._check_length(text, max_context)
    add_bos = bool(getattr(self.tok, "add_bos_token", False)) and self.tok.bos_id is not None and not (bos and text.startswith(bos))
    return _not_empty(self.tok.encode(text, add_bos=add_bos, parse_special=True, literal=marks), "chat template's")

  def completion_prompt(self, prompt: str, max_context: int | None = None) -> list[int]:
    self._check_length(prompt, max_context)
    add_bos = bool(getattr(self.tok, "add_bos_token", False)) and self.tok.bos_id is not None
    return _not_empty(self.tok.encode(prompt, add_bos=add_bos, parse_special=False), "prompt's")

  def backend(self) -> BatchGenerator:
    """What the serving engine generates with: one KV-cache slot per row of the model's batch (`load(batch=...)`)."""
    return BatchGenerator(self.model)

  def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[str]:
    """Text pieces of the answer to `prompt_ids`; sets finish_reason and last_usage when done (or when the
    consumer closes the iterator, e.g. a client that went away)."""
    params.check()
    dec, stop = self.tok.stream(), StopMatcher(params.stop)
    self.last_usage, self.finish_reason = {"prompt_tokens": len(prompt_ids), "completion_tokens": 0}, None
    for tid in self.gen.generate(prompt_ids, params, stop_ids=set(self.tok.eos_ids)):
      self.last_usage["completion_tokens"] += 1
      if (piece := stop.feed(dec.feed(tid))): yield piece
      if stop.stopped:
        self.finish_reason = "stop"
        return
    if (piece := stop.feed(dec.flush()) + stop.flush()): yield piece
    self.finish_reason = "stop" if stop.stopped else self.gen.finish_reason


class BatchGenerator:
  """The engine's backend for continuous batching: `slots` sequences, sequence b in row b of a batched model's KV caches
  (`Transformer(batch=slots)`). `prefill(slot, tokens, start)` runs a chunk of one sequence through the symbolic prefill
  graph with the slot a bound Variable too (one compile for every slot and length); `decode({slot: (token, pos)})`
  advances every listed sequence by a token in one batched step captured once by TinyJit: each row writes its keys and
  values at its own position (a bound Variable per row), takes its RoPE angles from host-written rows and attends
  through a host-written mask to exactly its own cached keys. Rows with nothing to do this step write to a scratch
  position no mask ever opens, so the caches of idle slots (their prefix cache) stay intact."""

  def __init__(self, model: Transformer):
    self.model, self.slots, self.max_context = model, model.batch, model.max_context
    m, cfg = PREFILL_MULTIPLE, model.cfg
    rows = self.max_context + CACHE_PAD
    self.scratch = rows - 1
    self.v_len = Variable("T", 1, (min(self.max_context, PREFILL_CHUNK) + m - 1) // m)
    self.v_short = Variable("Ts", 1, min(SHORT_PREFILL, self.max_context + m - 1) // m)
    self.v_start, self.v_last = Variable("start", 0, self.max_context - 1), Variable("last", 1, self.max_context - 1)
    self.v_keys = Variable("S", 1, rows // m)
    self.v_slot = Variable("slot", 0, self.slots - 1)
    self.v_pos = [Variable(f"pos{b}", 0, rows - 1) for b in range(self.slots)]
    self.v_tok = [Variable(f"tok{b}", 0, cfg.vocab_size - 1) for b in range(self.slots)]   # the tokens a step embeds (row b's in tok{b})
    half = cfg.head_dim // 2
    # Tensor.empty: a buffer of its own each (equal zeros(...).contiguous() graphs would be one hash-consed buffer)
    self.inp = Tensor.empty(1, (min(self.max_context, PREFILL_CHUNK) + m - 1) // m * m, cfg.dim)
    self.inp_b, self.cos_b, self.sin_b = Tensor.empty(self.slots, 1, cfg.dim), Tensor.empty(self.slots, 1, half), Tensor.empty(self.slots, 1, half)
    self.mask_b = Tensor.empty(self.slots, 1, 1, 1, rows // m * m)
    self.inp1 = Tensor.empty(1, 1, cfg.dim)
    # the sliding-window layers' RoPE rows and mask (the global ones' when no layer slides)
    self.window = max((layer.window for layer in model.layers), default=0)
    local = model.cos_l is not model.cos
    self.cos_lb, self.sin_lb = (Tensor.empty(self.slots, 1, half), Tensor.empty(self.slots, 1, half)) if local else (self.cos_b, self.sin_b)
    self.mask_lb = Tensor.empty(self.slots, 1, 1, 1, rows // m * m) if self.window else self.mask_b
    Tensor.realize_all(*{t.uop: t for t in (self.inp, self.inp_b, self.cos_b, self.sin_b, self.mask_b, self.inp1, self.cos_lb, self.sin_lb,
                                            self.mask_lb)}.values())
    self.cos_np, self.sin_np = model.cos.numpy(), model.sin.numpy()
    self.cos_lnp, self.sin_lnp = (model.cos_l.numpy(), model.sin_l.numpy()) if local else (None, None)
    self.arena = JitArena()   # the steps run one at a time (the engine's thread): one arena, as Generator's
    self.prefill_jit = TinyJit(functools.partial(self._prefill, fused=model.fused_long_prefill()), arena=self.arena)
    self.decode_jit, self.decode1_jit = TinyJit(self._decode, arena=self.arena), TinyJit(self._decode1, arena=self.arena)
    self.short_jit = TinyJit(functools.partial(self._prefill, fused=True), arena=self.arena)

  def _prefill(self, T: Any, start: Any, last: Any, keys: Any, slot: Any, fused: bool = False) -> Tensor:
    m = PREFILL_MULTIPLE
    return self.model.forward(self.inp[:, :T * m], start, last, keys * m, slot=slot, fused=fused).realize()

  def _decode(self, keys: Any, *pos_tok: Any) -> Tensor:
    n, B = keys * PREFILL_MULTIPLE, self.slots
    pos, toks = pos_tok[:B], pos_tok[B:]
    self.model.write_embeddings(self.inp_b.reshape(B, -1), toks)
    return self.model.forward_slots(self.inp_b, list(pos), (self.cos_b, self.sin_b, self.cos_lb, self.sin_lb), n,
                                    (self.mask_b[:, :, :, :, 0:n], self.mask_lb[:, :, :, :, 0:n])).realize()

  def _decode1(self, start: Any, keys: Any, slot: Any, tok: Any) -> Tensor:
    self.model.write_embeddings(self.inp1[0], [tok])
    return self.model.forward(self.inp1, start, keys_len=keys * PREFILL_MULTIPLE, slot=slot).realize()

  def prefill(self, slot: int, tokens: Sequence[int], start: int) -> np.ndarray:
    """Run `tokens` at positions [start, start + len) of sequence `slot` (its cache must hold the tokens before start);
    the logits of the last one."""
    n = len(tokens)
    if n == 0: raise ValueError("prefill needs at least one token")
    if not 0 <= slot < self.slots: raise IndexError(f"slot {slot} out of range [0, {self.slots})")
    if start < 0 or start + n > self.max_context:
      raise ContextLengthExceeded(f"positions [{start}, {start + n}) don't fit in max_context={self.max_context}")
    if n == 1: return self.decode({slot: (tokens[0], start)})[slot]   # the prefill graph's last row index starts at 1
    out = self._prefill_run(slot, tokens, start)
    release_prefill_memory(self.model, self.arena, self.decode_jit, self.decode1_jit)
    return out

  def _prefill_run(self, slot: int, tokens: Sequence[int], start: int) -> np.ndarray:
    n, m = len(tokens), PREFILL_MULTIPLE
    if n > PREFILL_CHUNK:
      for i in range(0, n - PREFILL_CHUNK, PREFILL_CHUNK): self._prefill_run(slot, tokens[i:i + PREFILL_CHUNK], start + i)
      done = (n - 1) // PREFILL_CHUNK * PREFILL_CHUNK
      return self._prefill_run(slot, tokens[done:], start + done)
    emb = self.model.embed(tokens)
    padded = -(-n // m)
    Generator._write(self.inp, np.concatenate([emb, np.zeros((padded * m - n, emb.shape[1]), np.float32)]))
    jit, v_len = (self.short_jit, self.v_short) if padded * m <= SHORT_PREFILL else (self.prefill_jit, self.v_len)
    out = jit(v_len.bind(padded), self.v_start.bind(start), self.v_last.bind(n - 1),
              self.v_keys.bind(-(-(start + padded * m) // m)), self.v_slot.bind(slot))
    return out.numpy()[0]

  def warm_up(self) -> None:
    """Compile and capture every step the engine takes (the batched decode step, the batch-1 decode, the short and the
    long prefill graphs: each TinyJit runs once and is captured on its second call), then replay one, which pays the
    collection the captures leave owed (engine/jit.py `_Compaction`), so that the first requests replay kernels instead
    of paying schedule, compile, capture and collection. What it writes into the caches is below positions no slot
    holds (a slot's cache is only read up to the tokens it ran itself), so every slot's cache starts empty after it."""
    everyone = {b: (0, 0) for b in range(self.slots)}
    lengths = [n for n in (2, SHORT_PREFILL + 1) if n <= min(self.max_context, PREFILL_CHUNK)]
    for _ in range(2):
      self.decode(everyone)
      if self.slots > 1: self.decode({0: (0, 0)})
      for n in lengths: self.prefill(0, [0] * n, 0)
    self.decode(everyone)

  def decode(self, steps: dict[int, tuple[int, int]], batched: bool = False) -> dict[int, np.ndarray]:
    """One token for each listed slot ({slot: (token, position)}), all in one batched step: {slot: logits}. A single
    slot runs the batch-1 decode graph on its cache row instead (the batched step computes every row), unless `batched`:
    the batched step computes a row the same way whichever other rows take part (extra keys are masked to exact zeros),
    while the batch-1 graph's kernels round differently, so a request that must give the same answer alone and among
    others (a seeded one) always takes the batched step."""
    if not steps: return {}
    B, m = self.slots, PREFILL_MULTIPLE
    for b, (_, p) in steps.items():
      if not 0 <= b < B: raise IndexError(f"slot {b} out of range [0, {B})")
      if not 0 <= p < self.max_context: raise ContextLengthExceeded(f"position {p} doesn't fit in max_context={self.max_context}")
    self.model.check_ids([tok for tok, _ in steps.values()])
    if len(steps) == 1 and B > 1 and not batched:
      (b, (tok, p)), = steps.items()
      out = self.decode1_jit(self.v_start.bind(p), self.v_keys.bind(-(-(p + 1) // m)), self.v_slot.bind(b), self.v_tok[0].bind(int(tok)))
      return {b: out.numpy()[0]}
    pos, toks = [self.scratch] * B, [0] * B   # idle rows embed token 0 at the scratch position
    for b, (tok, p) in steps.items(): pos[b], toks[b] = p, int(tok)
    keys = -(-(max(p for _, p in steps.values()) + 1) // m)
    mask = np.full((B, self.mask_b.shape[-1]), -np.inf, np.float32)
    for b in range(B): mask[b, :pos[b] + 1 if b in steps else 1] = 0.0   # idle rows: one (garbage) key keeps them finite
    Generator._write(self.cos_b, self.cos_np[pos])
    Generator._write(self.sin_b, self.sin_np[pos])
    Generator._write(self.mask_b, mask)
    if self.cos_lnp is not None:
      Generator._write(self.cos_lb, self.cos_lnp[pos])
      Generator._write(self.sin_lb, self.sin_lnp[pos])
    if self.window:   # the sliding-window layers see only the last `window` positions of each row
      for b in steps: mask[b, :max(0, pos[b] + 1 - self.window)] = -np.inf
      Generator._write(self.mask_lb, mask)
    binds = [v.bind(p) for v, p in zip(self.v_pos, pos)] + [v.bind(t) for v, t in zip(self.v_tok, toks)]
    out = self.decode_jit(self.v_keys.bind(keys), *binds).numpy()
    return {b: out[b] for b in steps}
