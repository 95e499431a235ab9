"""Ops written once for both `Tensor` and `UOp`, over a small primitive interface that each class implements.

`MovementOps` (plugrad/mixin/movement.py): reshape, permute, expand, pad, shrink, flip and the broadcasting helpers,
over `shape`, `dtype` and `_mop(op, arg)` (one movement node). `MathOps` (plugrad/mixin/math.py): arithmetic and
comparison operators, unary ALU math and the keepdim reduction, over `_operands(x, reverse)`, `_alu(op, *srcs)`,
`cast(dtype)`, `_rop(op, axes)`, `_full(shape, value, dtype)` and `contiguous()`.

This package sits right above `plugrad.dtype` and `plugrad.uop.enums` and below `plugrad.uop.ops`: it imports no node
or tensor class.
"""
