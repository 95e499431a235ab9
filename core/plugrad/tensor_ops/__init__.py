"""Op-group mixins of Tensor: creation, movement, elementwise math, reductions, nn functional.

`TensorError` is the exception for a bad shape or argument to a Tensor op: a ValueError (Python's convention) and a
RuntimeError (what tinygrad and torch raise for shape mismatches), so code written against either catches it.
"""


class TensorError(ValueError, RuntimeError):
  """A bad shape or argument given to a Tensor op."""
