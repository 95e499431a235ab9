"""Tensor ops mixin: nn. Methods here are written only in terms of Tensor's primitives (see plugrad/tensor.py)."""
from __future__ import annotations


class NnMixin:
  __slots__ = ()
