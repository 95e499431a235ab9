"""The registry of live tensors: a weak set every Tensor adds itself to on creation.

Realization repoints every live tensor at its results, `backward` finds the tensors to give gradients, and setitem
checks for other uses; the Tensor class and its op mixins share this set, so it lives below both.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator


class LiveSet:
  """A set of objects held weakly (an object leaves it when it dies), like `weakref.WeakSet` but cheaper: adding an
  object and dropping it when it dies are C-level calls (a WeakSet runs a Python method for each, and a Tensor is made
  per operation). Iterating gives a snapshot of the objects alive at the time. Members must hash by identity."""
  __slots__ = ("_refs", "_drop")

  def __init__(self) -> None:
    self._refs: set[weakref.ref] = set()
    self._drop = self._refs.discard  # a weakref's callback: the dead reference leaves the set

  def add(self, x: Any) -> None: self._refs.add(weakref.ref(x, self._drop))

  def hooks(self) -> tuple[Callable[[weakref.ref], None], Callable[[weakref.ref], None]]:
    """(add a reference, the callback it must carry): for a caller that adds an object per operation, `add(weakref.ref(x,
    callback))` is `self.add(x)` without a Python frame."""
    return self._refs.add, self._drop
  def __iter__(self) -> Iterator[Any]: return iter([x for r in list(self._refs) if (x := r()) is not None])
  def __len__(self) -> int: return len(self._refs)


all_tensors: LiveSet = LiveSet()
