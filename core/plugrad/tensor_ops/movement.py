"""Tensor ops mixin: movement. Methods here are written only in terms of Tensor's primitives (see plugrad/tensor.py)."""
from __future__ import annotations


class MovementMixin:
  __slots__ = ()
