"""Shared checks for the fuzzers: run a parser on hostile input and require that it ends in success or the documented
exception class, quickly, without allocating more than a small multiple of the input."""
from __future__ import annotations
import time
import tracemalloc
from typing import Any, Callable

TIME_LIMIT = 10.0  # seconds per case: far above any legitimate parse of these small inputs

def _traced(fn: Callable[[], Any], allowed: tuple[type[BaseException], ...]) -> tuple[Any, BaseException | None, float, int]:
  """(result, allowed exception or None, seconds, traced peak bytes) of one call of fn."""
  tracemalloc.start()
  t0 = time.perf_counter()
  try:
    try: res, err = fn(), None
    except allowed as e: res, err = None, e
    _, peak = tracemalloc.get_traced_memory()
  finally: tracemalloc.stop()
  return res, err, time.perf_counter() - t0, peak


def bounded(fn: Callable[[], Any], allowed: tuple[type[BaseException], ...], input_size: int, pure: bool = False) -> tuple[Any, BaseException | None]:
  """(result, None) or (None, the allowed exception). Anything else propagates and fails the case; so does a run longer
  than TIME_LIMIT or a traced peak allocation above 64x the input plus 8 MiB (a length field believed and allocated).
  `pure` (a loader without side effects): fn is called once untraced first, and a peak over the limit must repeat on a
  second traced call: tracemalloc counts every allocation of the process, and in a long-lived test worker something
  else (a process-wide table growing, a collection's finalizers) now and then lands inside the call (GGUF cases of
  224 and 352 bytes peaked at 10.1 MiB in two full-suite runs and not on replay); a parser's own allocation repeats."""
  limit = 64 * input_size + (8 << 20)
  if pure:
    try: fn()
    except allowed: pass
  res, err, took, peak = _traced(fn, allowed)
  if pure and peak > limit: res, err, took, peak = _traced(fn, allowed)
  assert took < TIME_LIMIT, f"case took {took:.1f} s"
  assert peak <= limit, f"peak allocation {peak} bytes for a {input_size}-byte input"
  return res, err
