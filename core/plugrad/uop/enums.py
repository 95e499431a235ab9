"""The IR's vocabulary: the `Ops` enum and the named op groups of `GroupOp` (no node class: every layer may import this).

`plugrad.uop.ops` re-exports both, so `from plugrad.uop.ops import Ops` keeps working.
"""
from __future__ import annotations

from enum import Enum, auto


class Ops(Enum):
  """Every operation in the IR. Groups are in `GroupOp`; the comment above each block says what its nodes mean."""
  # graph roots and ordering: SINK gathers outputs; AFTER(x, *deps) is x, ordered after deps; GROUP bundles without value
  SINK = auto(); AFTER = auto(); GROUP = auto(); NOOP = auto()
  # function calls: CALL(body, *args) runs body (a graph over PARAM placeholders) on args; PARAM(arg=slot index)
  CALL = auto(); PARAM = auto()
  # constants and variables: CONST(arg=value), VCONST(arg=tuple), DEFINE_VAR(arg=(name, min, max)), BIND(var, CONST)
  CONST = auto(); VCONST = auto(); DEFINE_VAR = auto(); BIND = auto()
  # buffers and devices (tensor level): BUFFER(UNIQUE, DEVICE, arg=size), BUFFER_VIEW, COPY, ASSIGN, CONTIGUOUS, DETACH
  UNIQUE = auto(); DEVICE = auto(); BUFFER = auto(); BUFFER_VIEW = auto(); COPY = auto(); ASSIGN = auto()
  CONTIGUOUS = auto(); DETACH = auto(); KERNEL = auto()
  # autograd markers (tensor level, the value of src[0] to the scheduler): CONTIGUOUS_BACKWARD(x) makes x's gradient
  # contiguous; CUSTOM_GRAD(value, x1, g1, x2, g2, ...) is value, whose gradient to each x_i is the incoming one times g_i
  # (with a callable arg, CUSTOM_GRAD(value, x1, x2, ...): the arg computes the x_i's gradients, gradient.py)
  CONTIGUOUS_BACKWARD = auto(); CUSTOM_GRAD = auto()
  # multi-device tensors: MULTI(*one node per device, arg=shard axis or None when replicated); schedule/multi.py lowers ops over it
  MULTI = auto()
  # movement (tensor level, arg is the new shape/order/padding)
  RESHAPE = auto(); PERMUTE = auto(); EXPAND = auto(); PAD = auto(); SHRINK = auto(); FLIP = auto()
  # reduce: REDUCE_AXIS(x, arg=(op, axes)) at tensor level; REDUCE(x, *ranges, arg=op) in kernels
  REDUCE_AXIS = auto(); REDUCE = auto()
  # memory (kernel level): DEFINE_GLOBAL/LOCAL/REG(arg=slot) pointers, INDEX(ptr, idx[, gate]), LOAD(index[, alt]), STORE(index, val)
  DEFINE_GLOBAL = auto(); DEFINE_LOCAL = auto(); DEFINE_REG = auto(); INDEX = auto(); LOAD = auto(); STORE = auto()
  # ranges and control flow: RANGE(end, arg=id) is a loop variable, END(value, *ranges) closes loops; SPECIAL is a gpu id
  RANGE = auto(); END = auto(); IF = auto(); ENDIF = auto(); BARRIER = auto(); SPECIAL = auto()
  # vectors: VECTORIZE(*scalars), GEP(vec, arg=lanes)
  VECTORIZE = auto(); GEP = auto()
  # tensor cores: WMMA(a, b, c, arg=TensorCore name) is one warp's D = A @ B + C on per-lane fragments (codegen/tc.py)
  WMMA = auto()
  # type conversion
  CAST = auto(); BITCAST = auto()
  # unary ALU
  EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); RECIPROCAL = auto(); NEG = auto(); TRUNC = auto()
  # binary ALU (IDIV and MOD truncate toward zero, as C does; MAX propagates nan, as numpy.maximum)
  ADD = auto(); SUB = auto(); MUL = auto(); FDIV = auto(); IDIV = auto(); MOD = auto(); MAX = auto(); POW = auto()
  CMPLT = auto(); CMPNE = auto(); CMPEQ = auto(); XOR = auto(); OR = auto(); AND = auto(); SHL = auto(); SHR = auto()
  THREEFRY = auto()
  # ternary ALU
  WHERE = auto(); MULACC = auto()
  # escape hatch: CUSTOM(arg=format string) renders literally
  CUSTOM = auto()
  # AT(x, gate, *idxs): the scalar value of tensor x at integer indices idxs (scheduler-internal; loads gated by gate)
  AT = auto()

  def __repr__(self) -> str: return f"Ops.{self.name}"
  __hash__ = object.__hash__  # members are singletons; Enum's own __hash__ is a slow Python-level call


class GroupOp:
  """Named sets of ops used by rules and checks."""
  Unary = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC})
  Binary = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.POW, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ,
                      Ops.XOR, Ops.OR, Ops.AND, Ops.SHL, Ops.SHR, Ops.THREEFRY})
  Ternary = frozenset({Ops.WHERE, Ops.MULACC})
  ALU = Unary | Binary | Ternary
  Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
  Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.XOR, Ops.OR, Ops.AND})
  Associative = frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX})
  Movement = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
  Buffer = frozenset({Ops.BUFFER, Ops.BUFFER_VIEW, Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_REG})
  Memory = frozenset({Ops.INDEX, Ops.LOAD, Ops.STORE})
  Reduce = frozenset({Ops.REDUCE_AXIS, Ops.REDUCE})
  Control = frozenset({Ops.RANGE, Ops.END, Ops.IF, Ops.ENDIF, Ops.BARRIER, Ops.SPECIAL})
  Irreducible = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.SPECIAL, Ops.RANGE})
