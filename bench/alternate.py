"""Same-run timing of plugrad against a peer (numpy/OpenBLAS, torch): best times over alternating blocks of calls.

Not a test. Machines here are shared, so both sides are timed in the same minutes, alternately. In blocks, not call by
call, and after a pause: a threaded peer's worker threads keep spinning on their cores after each call (OpenBLAS's
for 50-200 ms), and a threaded plugrad kernel started inside that window gets one core instead of two. Measured on
this 2-core box, 1024^2 f32 matmul on 2 threads: 18-20 ms right after a numpy call, 10.4 ms after a 200 ms pause.
Several rounds, because the VM's cores also deliver half their throughput for stretches of ~100 ms at a time (both
threads busy, every call twice as long: a stride-2 conv input gradient 20-22 ms, then three calls at 40 ms), and the
best of each side is what the machine can do.
"""
from __future__ import annotations

import time
from typing import Callable

PEER_SPIN_S = 0.25  # the pause before each block: longer than OpenBLAS's threads spin after a call


def best_of_blocks(ours: Callable[[], object], theirs: Callable[[], object], reps: int, rounds: int = 5,
                   pause: float = PEER_SPIN_S) -> tuple[list[float], list[float]]:
  """All call times (seconds) of `ours` and `theirs`: `rounds` x (a block of ours, a block of theirs), each block
  about reps/rounds calls after a `pause`; both are called once first (warm-up, not timed)."""
  ours(); theirs()
  t_ours: list[float] = []
  t_theirs: list[float] = []
  for _ in range(rounds):
    for f, ts in ((ours, t_ours), (theirs, t_theirs)):
      time.sleep(pause)
      for _ in range(max(1, -(-reps // rounds))):
        st = time.perf_counter(); f(); ts.append(time.perf_counter() - st)
  return t_ours, t_theirs
