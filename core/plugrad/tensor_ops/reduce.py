"""Tensor ops mixin: reduce. Methods here are written only in terms of Tensor's primitives (see plugrad/tensor.py)."""
from __future__ import annotations


class ReduceMixin:
  __slots__ = ()
