"""Tensor ops mixin: creation. Methods here are written only in terms of Tensor's primitives (see plugrad/tensor.py)."""
from __future__ import annotations


class CreationMixin:
  __slots__ = ()
