"""Op-group mixins of Tensor: creation, movement, elementwise math, reductions, nn functional.

These are Tensor's composite ops, written over the primitives of `plugrad.mixin` (shared with UOp) and Tensor's own
(`_broadcasted`, `_reduce`, `full`, ...). They never import `plugrad.tensor`: a method makes new tensors with
`type(self)` (or `cls`), a helper with `type(t)` of a tensor it was given.
"""
from plugrad.errors import TensorError  # noqa: F401  (re-exported: its historical home)
