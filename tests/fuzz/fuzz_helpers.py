"""Shared checks for the fuzzers: run a parser on hostile input and require that it ends in success or the documented
exception class, quickly, without allocating more than a small multiple of the input."""
from __future__ import annotations
import time
import tracemalloc
from typing import Any, Callable

TIME_LIMIT = 10.0  # seconds per case: far above any legitimate parse of these small inputs

def bounded(fn: Callable[[], Any], allowed: tuple[type[BaseException], ...], input_size: int, warm: bool = False) -> tuple[Any, BaseException | None]:
  """(result, None) or (None, the allowed exception). Anything else propagates and fails the case; so does a run longer
  than TIME_LIMIT or a traced peak allocation above 64x the input plus 8 MiB (a length field believed and allocated).
  `warm` (a loader without side effects): call fn once untraced first, so a process-wide table the call grows (the
  UOp and plan tables of a long-lived test worker, resized by the tensors a load makes) isn't counted as the case's
  allocation (a 224-byte GGUF case once peaked at 10.1 MiB that way in the full suite, and not on replay)."""
  if warm:
    try: fn()
    except allowed: pass
  tracemalloc.start()
  t0 = time.perf_counter()
  try:
    try: res, err = fn(), None
    except allowed as e: res, err = None, e
    _, peak = tracemalloc.get_traced_memory()
  finally: tracemalloc.stop()
  took = time.perf_counter() - t0
  assert took < TIME_LIMIT, f"case took {took:.1f} s"
  assert peak <= 64 * input_size + (8 << 20), f"peak allocation {peak} bytes for a {input_size}-byte input"
  return res, err
