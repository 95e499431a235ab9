"""TinyJit's arena (engine/memory.py): internal buffers placed by lifetime, shared between captures, outputs untouched."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from plugrad import Tensor, TinyJit
from plugrad.device import Buffer, Device
from plugrad.dtype import dtypes
from plugrad.engine.memory import ALIGN, JitArena, place, plan_capture
from plugrad.engine import jit
from plugrad.schedule import kernelize
from plugrad.uop.ops import UOp

rng = np.random.default_rng(3)
N = 64
WS = [rng.standard_normal(s).astype(np.float32) / 16 for s in ((256, 256), (256, 128), (128, 192), (192, 8))]
LIVE_MAX = max(N * (256 + 128), 256 * 256 + N * 256) * 4   # bytes alive at once in `chain` (see the first test)


def chain(x: Tensor, ws: list[Tensor]) -> Tensor:
  # three intermediates of different sizes (64x256, 64x128, 64x192 floats), each alive over two kernels only
  return ((((x @ ws[0]).relu().contiguous() @ ws[1]).relu().contiguous() @ ws[2]).relu().contiguous() @ ws[3]).realize()


def chain_np(x: np.ndarray) -> np.ndarray:
  for w in WS[:3]: x = np.maximum(x @ w, 0)
  return x @ WS[3]


@pytest.fixture
def ws():
  return [Tensor(w).realize() for w in WS]


def test_internal_buffers_share_memory_by_lifetime(ws):
  f = TinyJit(lambda x: chain(x, ws))
  for _ in range(5):
    x = rng.standard_normal((N, 256)).astype(np.float32)
    np.testing.assert_allclose(f(Tensor(x)).numpy(), chain_np(x), rtol=1e-4, atol=1e-5)
  # 64K + 32K + 48K bytes of intermediates, and the packing kernels' scratch (the weights repacked: 256K, 128K, 96K)
  # where the CPU heuristic packs; at most two intermediates, or a packed weight and its matmul's output, live at once
  assert 0 < f.arena.nbytes <= LIVE_MAX + 2 * ALIGN


def test_jit_arena_off_keeps_the_buffers(ws, monkeypatch):
  monkeypatch.setenv("JIT_ARENA", "0")
  f = TinyJit(lambda x: chain(x, ws))
  for _ in range(3):
    x = rng.standard_normal((N, 256)).astype(np.float32)
    np.testing.assert_allclose(f(Tensor(x)).numpy(), chain_np(x), rtol=1e-4, atol=1e-5)
  assert f.arena.nbytes == 0


def test_shared_arena_takes_the_largest_plan_and_keeps_outputs(ws):
  arena = JitArena()
  big = TinyJit(lambda x: chain(x, ws), arena=arena)
  small = TinyJit(lambda x: ((x * 2).exp().contiguous().sum(1) + 1).realize(), arena=arena)
  small_need = []
  for i in range(4):
    xs = rng.standard_normal((N, 32)).astype(np.float32) / 4
    np.testing.assert_allclose(small(Tensor(xs)).numpy(), np.exp(xs * 2).sum(1) + 1, rtol=1e-5)
    small_need.append(arena.nbytes)
    xb = rng.standard_normal((N, 256)).astype(np.float32)
    out_big = big(Tensor(xb))
    np.testing.assert_allclose(out_big.numpy(), chain_np(xb), rtol=1e-4, atol=1e-5)
    # the small step's replay reuses the big one's memory, never its returned tensor
    small(Tensor(xs))
    np.testing.assert_allclose(out_big.numpy(), chain_np(xb), rtol=1e-4, atol=1e-5)
  assert 0 < small_need[1] < arena.nbytes   # the arena grew for the big capture and re-pointed the small one's
  assert arena.nbytes <= LIVE_MAX + 2 * ALIGN


def test_reset_gives_the_memory_back(ws):
  f = TinyJit(lambda x: chain(x, ws))
  for _ in range(3): f(Tensor(rng.standard_normal((N, 256)).astype(np.float32)))
  assert f.arena.nbytes > 0
  f.reset()
  assert f.arena.nbytes == 0 and not f.arena.bases


def test_replaced_buffers_are_freed_not_cached(ws):
  alloc = Device["CPU"].allocator
  f = TinyJit(lambda x: chain(x, ws))
  x = Tensor(rng.standard_normal((N, 256)).astype(np.float32)).realize()
  f(x)
  cached = alloc.cached_bytes   # the plain run's intermediates, freed into the allocator's cache
  f(x)                          # the capture takes them again, then moves them into the arena
  assert alloc.cached_bytes <= cached - N * (256 + 128 + 192) * 4   # and their old memory isn't kept by the cache


def test_capture_forgets_the_schedules_it_used(ws):
  f = TinyJit(lambda x: chain(x, ws))
  x = Tensor(rng.standard_normal((N, 256)).astype(np.float32)).realize()
  f(x)
  before = set(kernelize._SCHEDULE_CACHE)
  f(x)
  assert not set(kernelize._SCHEDULE_CACHE) - before and len(kernelize._SCHEDULE_CACHE) < len(before)
  np.testing.assert_allclose(f(x).numpy(), chain_np(x.numpy()), rtol=1e-4, atol=1e-5)
  misses = kernelize.SCHEDULE_STATS["misses"]
  np.testing.assert_allclose(chain(x, ws).numpy(), chain_np(x.numpy()), rtol=1e-4, atol=1e-5)
  assert kernelize.SCHEDULE_STATS["misses"] == misses + 1   # the same graph outside the jit is scheduled again


def test_arena_must_be_a_jit_arena():
  with pytest.raises(TypeError, match="JitArena"): TinyJit(lambda x: x, arena=object())


spans = st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 10)), min_size=0, max_size=40)


@settings(max_examples=200, deadline=None)
@given(spans)
def test_place_never_overlaps_live_spans(raw):
  sp = [(size, first, first + length) for size, first, length in raw]
  offs, total = place(sp)
  assert all(o % ALIGN == 0 for o in offs) and total % ALIGN == 0
  for i, (si, fi, li) in enumerate(sp):
    assert offs[i] + si <= total
    for j in range(i):
      sj, fj, lj = sp[j]
      if fi <= lj and fj <= li: assert offs[i] + si <= offs[j] or offs[j] + sj <= offs[i], (sp[i], sp[j], offs[i], offs[j])
  # never more than the sum of the sizes (aligned), at least the most memory alive at one item
  assert total <= sum((s + ALIGN - 1) // ALIGN * ALIGN for s, _, _ in sp)
  assert total >= max((sum(s for s, f, la in sp if f <= t <= la) for t in range(41)), default=0)


def test_runners_keep_no_linear_ir():
  """A compiled runner lives as long as the process (the runner cache), so it keeps its program's source, parameters
  and launch sizes but not the linear uops (SmolLM2: ~6,000 UOps, 4.9 MB resident), and a loaded CPU program not its
  library's bytes (1.3 MB); the kernel still runs."""
  from plugrad.engine import realize
  a = np.arange(24, dtype=np.float32).reshape(4, 6)
  out = (Tensor(a) * 3 + 1).sum(1).numpy()
  np.testing.assert_allclose(out, (a * 3 + 1).sum(1))
  runners = [r for r in realize._RUNNERS.values() if r.device == Device.DEFAULT]
  assert runners and all(r.spec.uops == [] and r.spec.src and r.spec.globals for r in runners)
  assert Device.DEFAULT != "CPU" or all(r.prg.lib == b"" for r in runners)


def test_first_replay_shrinks_the_hash_cons_table(ws, monkeypatch):
  """The graphs a capture built die once its caller lets go of them, so its first replay (once, not every replay, and
  not the capture, where they are still alive) asks for the hash-cons table they grew to be rebuilt (a dict keeps its
  peak size: SmolLM2's warm-up left ~5 MB of table to ~16k nodes)."""
  calls = []
  monkeypatch.setattr(jit, "ucache_compact", lambda: calls.append(len(calls)) or False)
  f = TinyJit(lambda x: chain(x, ws))
  x = Tensor(rng.standard_normal((N, 256)).astype(np.float32)).realize()
  f(x), f(x)
  assert f.cnt == 2 and calls == []
  for _ in range(3): np.testing.assert_allclose(f(x).numpy(), chain_np(x.numpy()), rtol=1e-4, atol=1e-5)
  assert calls == [0]


def test_a_burst_of_captures_owes_one_collection(ws, monkeypatch):
  """Regression: every capture's first replay collected and compacted (a full collection of a 135M LLM's objects:
  ~130 ms), so after the server's warm-up captured four graphs each one's first replay paid it on a request (a prefix
  cache hit's time to first token 224-317 ms against 75-90 once replayed). A capture leaves one compaction owed;
  the next replay of any TinyJit pays it, and a capture after that owes another."""
  calls = []
  monkeypatch.setattr(jit, "ucache_compact", lambda: calls.append(len(calls)) or False)
  f, g = TinyJit(lambda x: chain(x, ws)), TinyJit(lambda x: chain(x, ws) * 2)
  x = Tensor(rng.standard_normal((N, 256)).astype(np.float32)).realize()
  f(x), f(x), g(x), g(x)
  assert calls == []
  f(x), g(x), f(x), g(x)
  assert calls == [0]
  h = TinyJit(lambda x: chain(x, ws) + 1)
  h(x), h(x), f(x)
  np.testing.assert_allclose(g(x).numpy(), 2 * chain_np(x.numpy()), rtol=1e-4, atol=1e-5)
  assert calls == [0, 1]


def test_first_replay_collects_cyclic_graphs_before_compacting(ws):
  """Regression: tensor graphs hold reference cycles, so the capture's graphs were often still alive (uncollected) at
  its first replay and the table, not sparse yet, stayed at its peak (a 135M LLM: 5.2 MB of table for ~15k live
  nodes, after one more kernel in a capture moved the collector's timing). The first replay collects first."""
  import gc
  import sys
  from plugrad.uop import ops
  f = TinyJit(lambda x: chain(x, ws))
  x = Tensor(rng.standard_normal((N, 256)).astype(np.float32)).realize()
  gc.disable()
  try:
    f(x), f(x)
    junk: list = [UOp.const(dtypes.float32, 0.5 + i) for i in range(200_000)]   # a cycle of many nodes, like a dead graph
    junk.append(junk)
    del junk
    f(x)
  finally: gc.enable()
  gc.collect()
  assert sys.getsizeof(ops._nodes) <= 128 * len(ops._nodes) + (1 << 20)


class _Item:
  def __init__(self, *bufs: Buffer) -> None: self.bufs = list(bufs)


def _internal(nbytes: int) -> Buffer:
  b = Buffer("CPU", nbytes // 4, dtypes.float32)
  b.internal = True
  return b


def test_a_buffer_the_scheduler_reused_is_placed_per_value():
  """Regression: one intermediate the scheduler handed from value to value (every layer of a model writes its
  activations into the same buffer) was one span from its first to its last use, alive beside everything in between.
  A whole write that doesn't read the buffer starts a new value: A's two values and B share memory (the arena needs
  max(A, B), not A + B); a partial write (a view) or a write that reads the buffer continues the value."""
  a, b, x, y = _internal(1 << 20), _internal(2 << 20), Buffer("CPU", 16, dtypes.float32), Buffer("CPU", 16, dtypes.float32)
  items = [_Item(a, x), _Item(y, a), _Item(b, x), _Item(y, b), _Item(a, x), _Item(y, a)]
  layout, replaced = plan_capture(items, keep=set())
  assert layout.need["CPU"] == 2 << 20 and {id(r) for r in replaced} == {id(a), id(b)}
  assert layout.slots[(0, 0)][1] == layout.slots[(2, 0)][1] == layout.slots[(4, 0)][1] == 0
  for continued in (_Item(a.view(8, dtypes.float32, 0), x), _Item(a, a, x)):   # not a new value: one span over B's
    layout, _ = plan_capture([*items[:4], continued, items[5]], keep=set())
    assert layout.need["CPU"] == 3 << 20
