"""Tensor ops mixin: elementwise. Methods here are written only in terms of Tensor's primitives (see plugrad/tensor.py)."""
from __future__ import annotations


class ElementwiseMixin:
  __slots__ = ()
