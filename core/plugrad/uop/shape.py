"""Shape inference for tensor-level UOps (movement ops, reduces, elementwise ops, buffers, copies).

Shapes are tuples of `sint` (int or a symbolic index UOp). Movement ops carry their target in `arg`:
RESHAPE/EXPAND the new shape, PERMUTE the order, PAD ((before, after), ...), SHRINK ((start, end), ...),
FLIP a tuple of bools; REDUCE_AXIS arg is (op, axes) and keeps reduced axes as size 1.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from plugrad.uop.enums import GroupOp, Ops

if TYPE_CHECKING:
  from plugrad.uop.ops import UOp

_SHAPELESS = frozenset({Ops.CONST, Ops.VCONST, Ops.DEFINE_VAR, Ops.BIND, Ops.DEVICE, Ops.UNIQUE, Ops.SINK, Ops.RANGE, Ops.SPECIAL, Ops.AT})
_ALU = GroupOp.ALU


def shape_of(u: UOp) -> tuple:
  op, arg = u.op, u.arg
  if op in _ALU:  # the widest source (the first of the widest): a WHERE may mix a tensor with scalar constants
    src = u.src
    ret = src[0].shape
    for s in src[1:]:
      if len(sh := s.shape) > len(ret): ret = sh
    return ret
  if op in _SHAPELESS: return ()
  if op is Ops.BUFFER: return (arg,)
  if op is Ops.PARAM and isinstance(arg, tuple) and arg[0] == "fn": return arg[2]  # @function placeholder: (kind, index, shape)
  if op is Ops.PARAM and isinstance(arg, tuple) and len(arg) == 4: return (arg[2],)  # scheduler buffer placeholder
  if op is Ops.BUFFER_VIEW: return (arg[0],)
  if op in (Ops.RESHAPE, Ops.EXPAND): return tuple(arg)
  if op is Ops.MULTI:  # the logical shape: the shards' sizes along the shard axis add up (replicas all have the shape)
    first = u.src[0].shape
    return first if arg is None else tuple(sum(s.shape[arg] for s in u.src) if i == arg else d for i, d in enumerate(first))
  src = u.src[0].shape if u.src else ()
  if op is Ops.PERMUTE: return tuple(src[i] for i in arg)
  if op is Ops.PAD: return tuple(s + b + a for s, (b, a) in zip(src, arg))
  if op is Ops.SHRINK: return tuple(e if isinstance(b, int) and b == 0 else e - b for b, e in arg)  # (0, e): e itself, the same node
  if op is Ops.FLIP: return src
  if op is Ops.REDUCE_AXIS: return tuple(1 if i in arg[1] else s for i, s in enumerate(src))
  return src  # CAST, BITCAST, CONTIGUOUS, DETACH, CONTIGUOUS_BACKWARD, CUSTOM_GRAD, COPY, ASSIGN, AFTER, BUFFER_VIEW ...


_DEVICE_LEAVES = frozenset({Ops.DEVICE, Ops.BUFFER, Ops.PARAM, Ops.COPY, Ops.MULTI})  # nodes whose device isn't their first source's


def device_of(u: UOp) -> str:
  """The device a tensor-level node lives on (from its DEVICE source, searched through its first sources); cached on
  the node, since Tensor.device asks for it on every operation. A MULTI node's device is the tuple of its shards'."""
  if (c := u._cache) is not None and (dev := c.get("device")) is not None: return dev
  if u.op not in _DEVICE_LEAVES and (src := u.src) and (s := src[0]).op is not Ops.DEFINE_VAR and s.op is not Ops.BIND and \
     (c := s._cache) is not None and (dev := c.get("device")) is not None:  # the common case: a new op on a known tensor
    u._cached()["device"] = dev
    return dev
  x, path = u, []  # every node on the way down is cached too: a chain of new ops is O(1) per op, not O(depth)
  while True:
    if x is not u and (c := x._cache) is not None and "device" in c: dev = c["device"]
    elif x.op is Ops.DEVICE: dev = x.arg
    elif x.op is Ops.BUFFER: dev = x.src[1].arg
    elif x.op is Ops.PARAM and isinstance(x.arg, tuple) and len(x.arg) == 4: dev = x.arg[3]
    elif x.op is Ops.COPY: dev = x.src[1].arg
    elif x.op is Ops.MULTI: dev = tuple(device_of(s) for s in x.src)  # a multi-device tensor: one device per shard
    elif not x.src: raise RuntimeError(f"{u.op} has no device")
    else:
      path.append(x)
      x = next((s for s in x.src if s.op is not Ops.DEFINE_VAR and s.op is not Ops.BIND), x.src[0])
      continue
    for n in path: n._cached()["device"] = dev
    u._cached()["device"] = dev
    return dev
