"""Memory planning of TinyJit captures: their internal buffers placed at offsets of one arena per device.

A capture's kernels read and write three kinds of buffers: its inputs (swapped on every replay), memory that outlives
it (weights, caches, the returned tensors) and *internal* buffers, intermediates of the schedules it ran that no
tensor can see afterwards (`Buffer.internal`, set by the scheduler's planner). The scheduler already lets an
intermediate reuse the memory of an earlier one of the same size within one schedule. Once the whole capture is known
this module does better: each internal buffer lives from the first to the last captured item that uses it, and
buffers whose lifetimes don't overlap share memory whatever their sizes (`place`: largest first, at the lowest offset
free over its lifetime).

A `JitArena` holds that memory, one base buffer per device, and may serve several captures, of one TinyJit or of
several (`TinyJit(fn, arena=...)`), that never run at the same time: a model's prefill and decode steps need the
largest of their plans, not the sum. When a capture needs more than the arena has, the arena grows and re-points the
captures it serves. Replays of captures sharing an arena must not run concurrently (from two threads); each TinyJit
gets an arena of its own unless it is given one.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

from plugrad.device import Buffer, BufferOptions, Device
from plugrad.dtype import dtypes

ALIGN = 256   # byte alignment of every placed buffer (a cache line and more; GPU loads of 16-byte vectors)
ARENA_OPTIONS = BufferOptions(nolru=True)   # an arena given up is freed, not kept by the allocator's cache


def _aligned(n: int) -> int: return (n + ALIGN - 1) // ALIGN * ALIGN


def place(spans: list[tuple[int, int, int]]) -> tuple[list[int], int]:
  """Byte offsets for (size, first, last) spans (a buffer used by items first..last) such that two spans alive at
  the same item never overlap in memory, and the total size. Largest first, each at the lowest aligned offset that is
  free over its lifetime (a greedy first fit: optimal packing is NP-hard, this is what memory planners do)."""
  offsets, placed, total = [0] * len(spans), [], 0
  for i in sorted(range(len(spans)), key=lambda i: (-spans[i][0], spans[i][1])):
    size, first, last = spans[i]
    off = 0
    for lo, hi in sorted((lo, hi) for lo, hi, f, la in placed if f <= last and first <= la):
      if off + size <= lo: break
      off = max(off, _aligned(hi))
    offsets[i] = off
    placed.append((off, off + size, first, last))
    total = max(total, off + size)
  return offsets, _aligned(total)


class Step(Protocol):
  bufs: list[Buffer]


@dataclass(frozen=True)
class Layout:
  """Where a capture's internal buffers went: per (item, slot) the device, byte offset, size and dtype of its view of
  the arena, and the bytes it needs per device."""
  slots: dict[tuple[int, int], tuple[str, int, int, Any]]
  need: dict[str, int]


def plan_capture(items: list[Step], keep: set[int]) -> tuple[Layout, list[Buffer]]:
  """The layout of `items`' internal buffers (bases not in `keep`, ids of buffers that must stay as they are) on
  devices that can give offset views, and the base buffers it replaces. A base is placed per *value*: an item that
  writes the whole base (its output, not read by the same item) starts a new span, since the scheduler hands one
  intermediate's memory to the next once its last reader ran (one buffer serving every layer of a model would
  otherwise be one span over the whole capture, alive beside everything)."""
  spans: list[list] = []        # [base, first item, last item]
  current: dict[int, int] = {}  # id(base) -> its current span
  of_slot: dict[tuple[int, int], int] = {}
  offsets_ok: dict[str, bool] = {}
  for i, it in enumerate(items):
    for j, b in enumerate(it.bufs):
      base = b.base
      if not base.internal or id(base) in keep: continue
      if (ok := offsets_ok.get(base.device)) is None: ok = offsets_ok[base.device] = Device[base.device].allocator.supports_offset
      if not ok: continue
      fresh = j == 0 and b is base and not any(x.base is base for x in it.bufs[1:])
      if (k := current.get(id(base))) is None or fresh:
        k = current[id(base)] = len(spans)
        spans.append([base, i, i])
      else: spans[k][2] = i
      of_slot[(i, j)] = k
  by_dev: dict[str, list[int]] = {}
  for k, s in enumerate(spans): by_dev.setdefault(s[0].device, []).append(k)
  at: dict[int, int] = {}   # span -> byte offset in its device's arena
  need: dict[str, int] = {}
  for dev, ks in by_dev.items():
    offs, need[dev] = place([(spans[k][0].nbytes, spans[k][1], spans[k][2]) for k in ks])
    at.update(zip(ks, offs))
  slots = {(i, j): (b.device, at[of_slot[(i, j)]] + b.offset, b.size, b.dtype)
           for i, it in enumerate(items) for j, b in enumerate(it.bufs) if (i, j) in of_slot}
  return Layout(slots, need), list({id(s[0]): s[0] for s in spans}.values())


class JitArena:
  """Memory shared by the internal buffers of captures that never run at the same time (see the module docstring)."""

  def __init__(self) -> None:
    self.bases: dict[str, Buffer] = {}
    self._users: weakref.WeakKeyDictionary[Any, tuple[list[Step], Layout]] = weakref.WeakKeyDictionary()

  @property
  def nbytes(self) -> int:
    """The arena's memory on all devices."""
    return sum(b.nbytes for b in self.bases.values())

  def adopt(self, owner: Any, items: list[Step], keep: set[int]) -> None:
    """Move the internal buffers of `items` (a capture owned by `owner`, a weak key) into this arena, growing it where
    they need more, and free the memory they had. The owner then rebuilds what holds buffer pointers (batch runners);
    the other captures re-pointed by a growth get their `rebind()` called."""
    layout, replaced = plan_capture(items, keep)
    if not layout.slots: return
    self._users[owner] = (items, layout)
    self._fit(shrink=False, owner=owner)
    self._point(items, layout)
    for b in replaced: b.deallocate(cache=False)

  def discard(self, keep: Iterable[Any] = ()) -> None:
    """Between calls no byte of the arena holds anything (a capture's internal buffers live within one call): give
    each device's memory back to the system past what the captures in `keep` use, whose pages stay for their next
    call (`Buffer.discard`; a long prefill's intermediates, where the decode step that follows needs a few MB)."""
    need: dict[str, int] = {}
    for owner in keep:
      if (u := self._users.get(owner)) is not None:
        for d, n in u[1].need.items(): need[d] = max(need.get(d, 0), n)
    for d, b in self.bases.items():
      if (n := need.get(d, 0)) < b.nbytes: b.discard(n)

  def trim(self) -> None:
    """Shrink (or free) each device's base to what the captures still alive need, re-pointing them: after captures
    were dropped (`TinyJit.reset`, a capture evicted)."""
    self._fit(shrink=True)

  def _fit(self, shrink: bool, owner: Any = None) -> None:
    """Size each device's base to the largest need of the captures served (only up, unless `shrink`), re-pointing and
    rebinding those on a resized device other than `owner`."""
    users = list(self._users.items())
    for d in {*self.bases, *(d for _, (_, lay) in users for d in lay.need)}:
      n, have = max((lay.need.get(d, 0) for _, (_, lay) in users), default=0), self.bases[d].nbytes if d in self.bases else 0
      if n == have or (n < have and not shrink): continue
      if n == 0: del self.bases[d]
      else: self.bases[d] = Buffer(d, n, dtypes.uint8, ARENA_OPTIONS).ensure_allocated()
      for o, (its, lay) in users:
        if d in lay.need and o is not owner:
          self._point(its, lay)
          o.rebind()

  def _point(self, items: list[Step], layout: Layout) -> None:
    views: dict[tuple, Buffer] = {}
    for (i, j), (dev, off, size, dtype) in layout.slots.items():
      if (v := views.get(key := (dev, off, size, dtype))) is None:
        v = views[key] = self.bases[dev].view(size, dtype, off).ensure_allocated()
      items[i].bufs[j] = v
