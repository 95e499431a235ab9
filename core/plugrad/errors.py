"""Exceptions shared by every layer that validates user input to ops (no imports: the bottom of the import graph).

`TensorError` is the exception for a bad shape or argument to a Tensor (or tensor-level UOp) op: a ValueError (Python's
convention) and a RuntimeError (what tinygrad and torch raise for shape mismatches), so code written against either
catches it.
"""


class TensorError(ValueError, RuntimeError):
  """A bad shape or argument given to a Tensor op."""


class TensorIndexError(IndexError, TensorError):
  """A dim or index out of range where tinygrad raises IndexError and torch RuntimeError (e.g. cat of 0-d tensors)."""


class TensorTypeError(TypeError, TensorError):
  """An argument of the wrong type or dtype (a shift of floats, one_hot of floats, scatter of another dtype): a TypeError
  (Python's convention) that is also the RuntimeError tinygrad and torch raise, and a ValueError."""


class TensorModeError(NotImplementedError, TensorError):
  """A mode name an op doesn't have (a pad mode typo): the NotImplementedError torch and tinygrad raise, and a
  TensorError (ValueError, RuntimeError)."""
