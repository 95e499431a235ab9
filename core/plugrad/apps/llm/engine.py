"""The serving engine: one thread owns the model and its `parallel` KV-cache slots; requests arrive tokenized (the
HTTP layer tokenizes them on its own threads) and wait in a queue for a free slot. A request takes the free slot whose
cached tokens share the longest prefix with its prompt (the prefix cache: only the rest is prefilled; a seeded
sampled request prefills all of its prompt, so that its answer doesn't depend on what the slots hold), prefills in
chunks interleaved with batched decode steps of the running requests (one step advances every decoding slot by a
token), samples with its own parameters and random generator, and streams text back to asyncio through its own
queue. A cancelled request (a client that went away) frees its slot before the next step.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

import numpy as np

from plugrad.apps.llm.generate import SamplingParams, StopMatcher, sample


@dataclass
class Finished:
  """The last item of a job's stream."""
  reason: str            # "stop", "length", or "cancelled" (engine shut down)
  prompt_tokens: int
  completion_tokens: int
  cached_tokens: int     # prompt tokens whose keys/values were reused from the slot's cache


class EngineError(RuntimeError):
  """The engine failed while running a request (reported to its client as a server error)."""


class Job:
  """One generation request: its prompt ids and sampling parameters, and the asyncio queue its text goes to."""

  def __init__(self, ids: Sequence[int], params: SamplingParams, loop: asyncio.AbstractEventLoop | None = None):
    self.ids, self.params = list(ids), params.check()
    self.loop = loop
    self.out: asyncio.Queue = asyncio.Queue()
    self.cancelled = self.done = False
    self.rng = np.random.default_rng(params.seed)
    self.stop = StopMatcher(params.stop)
    self.dec: Any = None
    self.generated = self.cached_tokens = 0
    self.admitted = time.monotonic()

  def push(self, item: Any) -> None:
    if self.loop is None: return self.out.put_nowait(item)
    try: self.loop.call_soon_threadsafe(self.out.put_nowait, item)
    except RuntimeError: self.cancelled = True   # its event loop is closed: nobody is listening any more


class Slot:
  """A KV-cache row: `cached` are the tokens whose keys/values it holds from position 0."""
  def __init__(self, idx: int):
    self.idx, self.cached, self.job, self.todo, self.next, self.used = idx, [], None, [], None, 0.0
    self.cached: list[int]
    self.job: Job | None
    self.todo: list[int]        # prompt tokens still to prefill
    self.next: int | None       # sampled token whose keys/values the next decode step writes


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
  n = 0
  for x, y in zip(a, b):
    if x != y: break
    n += 1
  return n


def reproducible(p: SamplingParams) -> bool:
  """Whether a request must not reuse cached keys: a seeded sampled one, whose answer must be the same whatever the
  slots hold (docs/llm.md). Cached keys and values were computed in other prefill chunks or by decode steps (int16
  products of quantized weights), whose last bits differ from the prefill a fresh server runs, and sampling turns a
  last-bit difference into another token now and then; greedy requests keep the prefix cache."""
  return p.seed is not None and p.temperature > 0


class Engine:
  """Schedules jobs over the slots of a batched generator (`BatchGenerator`: prefill(slot, tokens, start) -> logits,
  decode({slot: (token, position)}, batched) -> {slot: logits}, `slots`, `max_context`) on a thread of its own."""

  def __init__(self, backend: Any, tokenizer: Any, prefill_chunk: int = 128):
    if prefill_chunk < 1: raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
    self.backend, self.tok, self.prefill_chunk = backend, tokenizer, prefill_chunk
    self.max_context: int = backend.max_context
    self.slots = [Slot(i) for i in range(backend.slots)]
    self.waiting: collections.deque[Job] = collections.deque()
    self.cond = threading.Condition()
    self.stopping = False
    self.stop_ids = frozenset(tokenizer.eos_ids)
    self.steps = 0
    self.thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
    self.thread.start()

  # ------------------------------------------------------------------ the asyncio side
  def submit(self, job: Job) -> None:
    with self.cond:
      if self.stopping: raise EngineError("the server is shutting down")
      self.waiting.append(job)
      self.cond.notify()

  def cancel(self, job: Job) -> None:
    job.cancelled = True
    with self.cond: self.cond.notify()

  async def run(self, job: Job) -> AsyncIterator[str | Finished]:
    """Submit `job` and yield its text pieces, then its `Finished`; leaving early (a client gone) cancels it."""
    self.submit(job)
    try:
      while True:
        item = await job.out.get()
        if isinstance(item, BaseException): raise item
        yield item
        if isinstance(item, Finished): return
    finally:
      if not job.done: self.cancel(job)

  def shutdown(self, timeout: float = 1.0) -> None:
    """Stop the engine thread; running and waiting jobs end with reason "cancelled"."""
    with self.cond:
      self.stopping = True
      self.cond.notify()
    self.thread.join(timeout)

  # ------------------------------------------------------------------ the engine thread
  def _busy(self) -> bool: return any(s.job is not None for s in self.slots)

  def _run(self) -> None:
    while True:
      with self.cond:
        while not self.stopping and not self.waiting and not self._busy(): self.cond.wait()
        if self.stopping: break
        self._admit()
      try: self._step()
      except Exception as e:   # a failure ends the jobs it touched, never the engine
        for s in self.slots:
          if s.job is not None: self._fail(s, e)
    for s in self.slots:
      if s.job is not None: self._finish(s, "cancelled")
    with self.cond:
      while self.waiting:
        job = self.waiting.popleft()
        job.done = True
        job.push(Finished("cancelled", len(job.ids), 0, 0))

  def _admit(self) -> None:
    """Give waiting jobs free slots, each the one sharing the longest prefix with its prompt (then the least recently used)."""
    while self.waiting and self.waiting[0].cancelled: self.waiting.popleft().done = True
    for s in self.slots:
      if s.job is not None and s.job.cancelled: self._release(s)
    while self.waiting:
      free = [s for s in self.slots if s.job is None]
      if not free: return
      job = self.waiting.popleft()
      if job.cancelled:
        job.done = True
        continue
      if reproducible(job.params):   # computed as on a fresh server, in the least recently used slot
        best, start = min(free, key=lambda s: s.used), 0
      else:
        best = max(free, key=lambda s: (common_prefix(s.cached, job.ids), -s.used))
        start = min(common_prefix(best.cached, job.ids), len(job.ids) - 1)   # the last prompt token always runs: its logits
      best.cached, best.todo, best.job, best.next = best.cached[:start], job.ids[start:], job, None
      job.cached_tokens, job.dec, job.admitted = start, self.tok.stream(), time.monotonic()

  def _step(self) -> None:
    prefilling = [s for s in self.slots if s.job is not None and s.todo]
    if prefilling:   # one chunk of the oldest request's prompt, then a decode step for the running ones
      s = min(prefilling, key=lambda s: s.job.admitted)
      chunk = s.todo[:self.prefill_chunk]
      logits = self.backend.prefill(s.idx, chunk, len(s.cached))
      s.cached += chunk
      s.todo = s.todo[len(chunk):]
      if not s.todo: self._sampled(s, logits)
    decoding = [s for s in self.slots if s.job is not None and s.next is not None and not s.job.cancelled]
    if decoding:
      out = self.backend.decode({s.idx: (s.next, len(s.cached)) for s in decoding}, batched=any(reproducible(s.job.params) for s in decoding))
      self.steps += 1
      for s in decoding:
        s.cached.append(s.next)
        self._sampled(s, out[s.idx])

  def _sampled(self, s: Slot, logits: np.ndarray) -> None:
    """Sample the slot's next token from `logits` and stream its text; finish the job on a stop condition."""
    job, p = s.job, s.job.params
    tok = sample(logits, p.temperature, p.top_k, p.top_p, job.rng)
    if tok in self.stop_ids: return self._finish(s, "stop")
    job.generated += 1
    if (piece := job.stop.feed(job.dec.feed(tok))): job.push(piece)
    if job.stop.stopped: return self._finish(s, "stop")
    if job.generated >= p.max_tokens or len(s.cached) + 1 >= self.max_context: return self._finish(s, "length")
    s.next = tok

  def _finish(self, s: Slot, reason: str) -> None:
    job = s.job
    if reason != "cancelled" and not job.stop.stopped and (piece := job.stop.feed(job.dec.flush()) + job.stop.flush()): job.push(piece)
    job.done = True
    job.push(Finished(reason, len(job.ids), job.generated, job.cached_tokens))
    self._release(s)

  def _fail(self, s: Slot, e: Exception) -> None:
    job = s.job
    job.done = True
    job.push(EngineError(f"{type(e).__name__}: {e}"))
    s.cached = []   # what the failed step wrote is unknown
    self._release(s)

  def _release(self, s: Slot) -> None:
    if s.job is not None: s.job.done = True
    s.job, s.todo, s.next, s.used = None, [], None, time.monotonic()
