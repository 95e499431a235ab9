"""The registry of live tensors: a weak set every Tensor adds itself to on creation.

Realization repoints every live tensor at its results, `backward` finds the tensors to give gradients, and setitem
checks for other uses; the Tensor class and its op mixins share this set, so it lives below both.
"""
from __future__ import annotations

import weakref
from typing import Any

all_tensors: weakref.WeakSet[Any] = weakref.WeakSet()
