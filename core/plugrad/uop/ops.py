"""The IR node: `UOp`, an immutable, hash-consed graph node (the op vocabulary is in `plugrad.uop.enums`).

`UOp(op, dtype, src, arg, tag)` returns the existing node when an identical one is alive, so graph equality is
object identity and `dict`/`set` lookups on nodes are O(1). Nodes hold no back-references; a node that nothing
references is collected and leaves the cache. Operator overloads build ALU nodes, so index math reads like Python.

UOp implements the primitive interface of the op mixins (`plugrad.mixin`), so movement and elementwise ops are written
once for UOp and Tensor; autograd (`plugrad.gradient`) builds gradient graphs with them directly on UOps.

Layering inside `plugrad.uop`: enums -> alu -> bounds/shape/render -> ops -> upat -> rewrite -> symbolic. The two
UOp methods that run rule sets (`simplify`, `substitute`) call entry points that `rewrite.py` and `symbolic.py` hand
to `register_rewriter` when they are imported (dependency inversion instead of an import cycle); `plugrad.uop`'s
`__init__` imports both, and importing any `plugrad.uop.*` module runs that `__init__` first.
"""
from __future__ import annotations

import itertools
import math
import operator
import sys
import weakref
from typing import Any, Callable, Iterator

from plugrad.dtype import ConstType, DType, PtrDType, dtypes
from plugrad.mixin.math import MathOps
from plugrad.mixin.movement import MovementOps, SymbolicDim
from plugrad.uop.alu import exec_alu, python_alu  # noqa: F401  (re-exported: the ALU's Python semantics)
from plugrad.uop.bounds import min_max
from plugrad.uop.enums import GroupOp, Ops
from plugrad.uop.render import render_expr
from plugrad.uop.shape import device_of, shape_of

_rewriters: dict[str, Callable] = {}


def register_rewriter(name: str, fn: Callable) -> None:
  """Install the implementation of a UOp method that runs a rule set ("simplify": uop -> uop, from uop/symbolic.py;
  "substitute": (uop, mapping, walk, name) -> uop, from uop/rewrite.py). Called once, at those modules' import."""
  if name not in ("simplify", "substitute"): raise ValueError(f"unknown UOp rewriter {name!r} (simplify, substitute)")
  _rewriters[name] = fn


def _rewriter(name: str) -> Callable:
  if (fn := _rewriters.get(name)) is None:
    raise RuntimeError(f"UOp.{name} needs plugrad.uop.{'symbolic' if name == 'simplify' else 'rewrite'}, which is not imported yet")
  return fn


# ***** structural checks: malformed nodes fail at construction, naming the op *****
_ARITY: dict[Ops, tuple[int, int]] = {**{o: (1, 1) for o in GroupOp.Unary}, **{o: (2, 2) for o in GroupOp.Binary},
  **{o: (3, 3) for o in GroupOp.Ternary}, Ops.CONST: (0, 2), Ops.VCONST: (0, 1), Ops.DEFINE_VAR: (0, 0), Ops.BIND: (2, 2),
  Ops.CAST: (1, 1), Ops.BITCAST: (1, 1), Ops.GEP: (1, 1), Ops.RANGE: (1, 1), Ops.INDEX: (2, 3), Ops.LOAD: (1, 3),
  Ops.STORE: (2, 3), Ops.PARAM: (0, 1), Ops.CALL: (1, 1 << 30), Ops.AT: (2, 1 << 30), Ops.REDUCE_AXIS: (1, 1), Ops.COPY: (2, 2),
  Ops.ASSIGN: (2, 2), Ops.CONTIGUOUS: (1, 1), Ops.MULTI: (1, 1 << 30), Ops.DETACH: (1, 1),
  Ops.CONTIGUOUS_BACKWARD: (1, 1), Ops.CUSTOM_GRAD: (3, 1 << 30), **{o: (1, 1) for o in GroupOp.Movement}}


class UOpSpecError(TypeError):
  """A UOp was built with the wrong number of sources or wrong dtypes for its op."""


_CMP, _WHERE, _SAME, _CONST, _VAR = range(5)  # what _check verifies beyond arity and source types, per op
_CHECK_KIND: dict[Ops, int] = {**{o: _SAME for o in GroupOp.ALU if o not in (Ops.SHL, Ops.SHR, Ops.THREEFRY)},
                               **{o: _CMP for o in GroupOp.Comparison}, Ops.WHERE: _WHERE, Ops.CONST: _CONST, Ops.DEFINE_VAR: _VAR}


def _check(op: Ops, dtype: DType, src: tuple, arg) -> None:
  if (ar := _ARITY.get(op)) is not None and not ar[0] <= len(src) <= ar[1]:
    want = str(ar[0]) if ar[0] == ar[1] else f"{ar[0]}..{ar[1]}"
    raise UOpSpecError(f"{op} takes {want} sources, got {len(src)}: {[s.op for s in src]}")
  for s in src:
    if type(s) is not UOp and not isinstance(s, UOp): raise UOpSpecError(f"{op} source must be a UOp, got {type(s).__name__} {s!r}")
  if (kind := _CHECK_KIND.get(op)) is None: return
  if kind == _SAME:  # (dtypes are compared by identity first: DType.__eq__ is a Python call, and this runs per node)
    for s in src:
      if s.dtype is not dtype and s.dtype != dtype: raise UOpSpecError(f"{op} of dtype {dtype} has a source of dtype {s.dtype}")
  elif kind == _CMP:
    if dtype is not dtypes.bool and dtype.scalar() != dtypes.bool: raise UOpSpecError(f"{op} must have dtype bool, got {dtype}")
    if src[0].dtype is not src[1].dtype and src[0].dtype != src[1].dtype:
      raise UOpSpecError(f"{op} compares mismatched dtypes {src[0].dtype} and {src[1].dtype}")
  elif kind == _WHERE:
    if src[0].dtype is not dtypes.bool and src[0].dtype.scalar() != dtypes.bool:
      raise UOpSpecError(f"Ops.WHERE condition must be bool, got {src[0].dtype}")
    if not ((src[1].dtype is dtype or src[1].dtype == dtype) and (src[2].dtype is dtype or src[2].dtype == dtype)):
      raise UOpSpecError(f"Ops.WHERE branches {src[1].dtype}, {src[2].dtype} must match {dtype}")
  elif kind == _CONST:
    if not src and arg is None: raise UOpSpecError("Ops.CONST needs a value in arg")
  elif not (isinstance(arg, tuple) and len(arg) == 3 and isinstance(arg[0], str)):
    raise UOpSpecError(f"Ops.DEFINE_VAR arg must be (name, min, max), got {arg!r}")


_CHECKED_LEAVES = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, *(o for o, (lo, _) in _ARITY.items() if lo > 0)})  # _check can fail


def _float_key(op, dtype, src, arg: float, tag) -> tuple:
  """Cache key for float args Python compares oddly: -0.0 == 0.0 (but 1/-0.0 is -inf) and nan != nan (but all nan
  constants are the same constant)."""
  return (op, dtype, src, ("nan",) if arg != arg else ("-0.0",) if math.copysign(1.0, arg) < 0 else arg, tag)


# ***** the node *****
class UOp(MathOps, MovementOps):
  """An immutable IR node. Build with `UOp(op, dtype, src, arg, tag)`; identical nodes are the same object."""
  __slots__ = ("op", "dtype", "src", "arg", "tag", "_cache", "_key", "seq", "__weakref__")
  _nodes: dict[tuple, weakref.ref] = {}
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any
  tag: Any

  def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None, tag: Any = None) -> UOp:
    # the dtype enters the key as its `_key` tuple (equal dtypes have equal tuples): hashing a DType is a Python call;
    # the sources as their creation numbers (`_seq_of`, below)
    if type(dtype) is not DType and not isinstance(dtype, DType): raise UOpSpecError(f"{op} dtype must be a DType, got {dtype!r}")
    try: sk = (src[0].seq, src[1].seq) if len(src) == 2 else (src[0].seq,) if len(src) == 1 else tuple(map(_seq_of, src)) if src else ()
    except (AttributeError, TypeError):  # a source that isn't a UOp: the checks name it
      _check(op, dtype, tuple(src), arg)
      raise
    key = (op, dtype._key, sk, arg, tag) if type(arg) is not float or (arg != 0.0 and arg == arg) else _float_key(op, dtype._key, sk, arg, tag)
    if (ref := _nodes_get(key)) is not None and (node := ref()) is not None: return node
    if type(src) is not tuple: src = tuple(src); return UOp(op, dtype, src, arg, tag)
    if src or op in _CHECKED_LEAVES: _check(op, dtype, src, arg)
    node = _new_node(cls)
    _set_op(node, op); _set_dtype(node, dtype); _set_src(node, src); _set_arg(node, arg); _set_tag(node, tag)  # (slot setters:
    _set_cache(node, None); _set_key(node, key); _set_seq(node, next(_seq))  # a node is created per op: 2x faster than object.__setattr__)
    _nodes[key] = _weakref(node)
    return node

  def __del__(self) -> None:
    try:
      key = self._key
      if (ref := _nodes_get(key)) is not None and ((r := ref()) is None or r is self): del _nodes[key]
    except (AttributeError, TypeError, NameError): pass  # interpreter shutdown or a half-built node

  def __reduce__(self): return (UOp, (self.op, self.dtype, self.src, self.arg, self.tag))
  def __setattr__(self, name, value): raise AttributeError(f"UOp is immutable: can't set {name!r}")

  def _cached(self) -> dict:
    if self._cache is None: object.__setattr__(self, "_cache", {})
    return self._cache

  def replace(self, **kwargs) -> UOp:
    """A copy with some of op/dtype/src/arg/tag changed (the same object if nothing changes)."""
    for k in kwargs:
      if k not in ("op", "dtype", "src", "arg", "tag"): raise TypeError(f"UOp.replace got an unknown field {k!r}")
    return UOp(kwargs.get("op", self.op), kwargs.get("dtype", self.dtype), kwargs.get("src", self.src), kwargs.get("arg", self.arg),
               kwargs.get("tag", self.tag))

  # ----- graph walks (iterative: graphs can be far deeper than Python's recursion limit) -----
  def toposort(self, gate: Callable[[UOp], bool] | None = None, memo: bool = True) -> dict[UOp, None]:
    """All nodes reachable from self, each after its sources (an insertion-ordered dict used as a set).
    `gate(node)` returning False stops the walk from entering that node's sources (the node itself is kept).
    Without a gate the result is memoized on self, which makes self part of a reference cycle (its cache holds a
    dict holding self): the graph then lives until Python's cycle collector runs. `memo=False` for a temporary root
    (a SINK made to walk several graphs at once) keeps those graphs freeable the moment their last user drops them."""
    if gate is None and (c := self._cache) is not None and "topo" in c: return c["topo"]
    out: dict[UOp, None] = {}
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      node, expanded = stack.pop()
      if node in out: continue
      if expanded: out[node] = None; continue
      stack.append((node, True))
      if gate is None or gate(node): stack.extend((s, False) for s in reversed(node.src) if s not in out)
    if gate is None and memo: self._cached()["topo"] = out
    return out

  def backward_slice(self, gate: Callable[[UOp], bool] | None = None) -> dict[UOp, None]:
    """Every node self depends on, excluding self."""
    ret = dict(self.toposort(gate)); del ret[self]
    return ret

  def substitute(self, mapping: dict[UOp, UOp], walk: bool = False, name: str | None = None) -> UOp:
    """Replace nodes by identity using `mapping`; walk=True does one pass without rewriting inside replacements."""
    return _rewriter("substitute")(self, mapping, walk, name or "substitute")

  # ----- construction helpers -----
  @staticmethod
  def const(dtype: DType, b: ConstType | tuple) -> UOp:
    """A constant of `dtype` (a tuple makes a VCONST of a vector dtype)."""
    if isinstance(b, UOp): raise TypeError(f"UOp.const takes a Python number, got a UOp {b.op}")
    if isinstance(b, tuple):
      if dtype.count == 1: dtype = dtype.vec(len(b))
      return UOp(Ops.VCONST, dtype, arg=dtypes.as_const(b, dtype))
    return UOp(Ops.CONST, dtype, arg=dtypes.as_const(b, dtype))
  def const_like(self, b: ConstType) -> UOp: return UOp.const(self.dtype, b)

  @staticmethod
  def variable(name: str, min_val: ConstType, max_val: ConstType, dtype: DType = dtypes.index) -> UOp:
    """A named integer variable with inclusive bounds, e.g. a symbolic sequence length."""
    if not isinstance(name, str) or not name: raise ValueError(f"variable name must be a non-empty str, got {name!r}")
    if isinstance(min_val, UOp) or isinstance(max_val, UOp) or min_val > max_val:
      raise ValueError(f"variable {name!r} needs constant bounds with min <= max, got {min_val!r}..{max_val!r}")
    return UOp(Ops.DEFINE_VAR, dtype, arg=(name, min_val, max_val))

  def bind(self, val: int) -> UOp:
    """Bind this variable to a concrete value (checked against its bounds)."""
    if self.op is not Ops.DEFINE_VAR: raise TypeError(f"only a DEFINE_VAR can be bound, not {self.op}")
    if not isinstance(val, int) or isinstance(val, bool): raise TypeError(f"bind value of {self.arg[0]!r} must be an int, got {val!r}")
    if not self.arg[1] <= val <= self.arg[2]: raise ValueError(f"bind value {val} out of range [{self.arg[1]}, {self.arg[2]}] for {self.arg[0]!r}")
    return UOp(Ops.BIND, self.dtype, (self, self.const_like(val)))

  def unbind(self) -> tuple[UOp, int]:
    """(variable, value) of a BIND."""
    if self.op is not Ops.BIND: raise TypeError(f"unbind needs a BIND, got {self.op}")
    return self.src[0], self.src[1].arg

  @property
  def expr(self) -> str:
    if self.op is not Ops.DEFINE_VAR: raise TypeError(f"expr is the name of a DEFINE_VAR, not of {self.op}")
    return self.arg[0]

  def alu(self, op: Ops, *src: UOp) -> UOp:
    """An ALU node of `op` over self and `src`; comparisons give bool (vectors keep their width)."""
    out = dtypes.bool.vec(self.dtype.count) if op in GroupOp.Comparison else (src[-1] if op is Ops.WHERE else self).dtype
    return UOp(op, out, (self, *src))

  def cast(self, dtype: DType) -> UOp: return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))
  def bitcast(self, dtype: DType) -> UOp: return self if self.dtype == dtype else UOp(Ops.BITCAST, dtype, (self,))
  def where(self, x, y) -> UOp:
    """x where self is true else y; one of x, y must be a UOp, the other may be a Python number."""
    if isinstance(x, UOp): y = x.ufix(y)
    elif isinstance(y, UOp): x = y.ufix(x)
    else: raise TypeError("UOp.where needs at least one UOp branch to take the dtype from")
    return UOp(Ops.WHERE, x.dtype, (self, x, y))
  def minimum(self, x) -> UOp: return -(-self).maximum(-self.ufix(x))
  def sink(self, *srcs: UOp) -> UOp: return UOp(Ops.SINK, dtypes.void, (self, *srcs))
  @staticmethod
  def sink_of(*srcs: UOp) -> UOp: return UOp(Ops.SINK, dtypes.void, srcs)

  def ufix(self, x) -> UOp:
    """`x` as a UOp of self's dtype (Python numbers become constants; a float with an int self makes an error)."""
    if isinstance(x, UOp): return x
    if isinstance(x, float) and not dtypes.is_float(self.dtype) and x != int(x):
      raise TypeError(f"can't combine float {x} with a {self.dtype} expression")
    return self.const_like(x)

  # ----- primitives of the shared op mixins (plugrad/mixin): arithmetic, comparisons, movement, reduce -----
  def _operands(self, x, reverse: bool = False) -> tuple[UOp, UOp]:
    other = self.ufix(x)
    return (other, self) if reverse else (self, other)
  def _alu(self, op: Ops, *src: UOp, dtype: DType | None = None) -> UOp: return self.alu(op, *src) if dtype is None else UOp(op, dtype, (self, *src))
  def _mop(self, op: Ops, arg: Any) -> UOp: return UOp(op, self.dtype, (self,), arg)
  def _rop(self, op: Ops, axes: tuple[int, ...]) -> UOp: return UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, axes))
  def _full(self, shape: tuple, value: ConstType, dtype: DType) -> UOp:
    """A tensor-level constant of `shape` on self's device (a CONST with a DEVICE source, reshaped and expanded)."""
    c = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=self.device),), dtypes.as_const(value, dtype))
    if not shape: return c
    c = UOp(Ops.RESHAPE, dtype, (c,), (1,) * len(shape))
    return c if all(s == 1 for s in shape) else UOp(Ops.EXPAND, dtype, (c,), tuple(shape))
  def full_like(self, value: ConstType, dtype: DType | None = None) -> UOp:
    """A tensor-level constant with self's shape and device (self's dtype unless given)."""
    return self._full(self.shape, value, dtype or self.dtype)
  def contiguous(self) -> UOp: return UOp(Ops.CONTIGUOUS, self.dtype, (self,))
  @property
  def device(self) -> str:
    """The device of a tensor-level node (from the DEVICE/BUFFER/COPY it is built on)."""
    return device_of(self)

  # ----- operator overloads not shared with Tensor (identity `==` is kept: use .eq/.ne for comparisons) -----
  def _bin(self, op: Ops, x, reverse=False) -> UOp:
    other = self.ufix(x)
    return other.alu(op, self) if reverse else self.alu(op, other)
  def __floordiv__(self, x): return self._bin(Ops.IDIV, x)
  def __rfloordiv__(self, x): return self._bin(Ops.IDIV, x, True)
  def __truediv__(self, x): return self._bin(Ops.FDIV, x)
  def __rtruediv__(self, x): return self._bin(Ops.FDIV, x, True)
  def __mod__(self, x): return self._bin(Ops.MOD, x)
  def __rmod__(self, x): return self._bin(Ops.MOD, x, True)
  def __and__(self, x): return self._bin(Ops.AND, x)
  def __rand__(self, x): return self._bin(Ops.AND, x, True)
  def __or__(self, x): return self._bin(Ops.OR, x)
  def __ror__(self, x): return self._bin(Ops.OR, x, True)
  def __xor__(self, x): return self._bin(Ops.XOR, x)
  def __rxor__(self, x): return self._bin(Ops.XOR, x, True)
  def __lshift__(self, x): return self._bin(Ops.SHL, x)
  def __rshift__(self, x): return self._bin(Ops.SHR, x)
  def __le__(self, x): return (self > x).logical_not()
  def __ge__(self, x): return (self < x).logical_not()
  __hash__ = object.__hash__
  def __eq__(self, x): return self is x
  def __bool__(self) -> bool:
    """Non-bool nodes are truthy; a bool expression is decided by range analysis or raises (use resolve())."""
    if self.dtype != dtypes.bool: return True
    if self.vmin == self.vmax: return bool(self.vmin)
    raise TypeError(f"truth value of symbolic {self.render(simplify=False)} is undecided; use resolve(expr, default)")

  # ----- analysis -----
  @property
  def vmin(self) -> ConstType: return self._min_max[0]
  @property
  def vmax(self) -> ConstType: return self._min_max[1]
  @property
  def _min_max(self) -> tuple[ConstType, ConstType]:
    if (c := self._cache) is not None and "mm" in c: return c["mm"]
    order: list[UOp] = []  # post-order of the nodes whose bounds are not known yet
    stack, seen = [(self, False)], set()
    while stack:
      n, done = stack.pop()
      if done: order.append(n); continue
      if n in seen or (n._cache is not None and "mm" in n._cache): continue
      seen.add(n)
      stack.append((n, True))
      stack.extend((s, False) for s in n.src)
    for n in order: n._cached()["mm"] = min_max(n)
    return self._cache["mm"]

  def simplify(self) -> UOp:
    """This expression rewritten by the symbolic rule set."""
    return _rewriter("simplify")(self)

  def ssimplify(self) -> UOp | ConstType:
    """simplify(), returning a Python number when the result is a constant."""
    s = self.simplify()
    return s.arg if s.op is Ops.CONST else s

  def render(self, simplify: bool = True) -> str:
    """The expression as a string, e.g. `(a*4+b)`; nodes with no infix form render as `OP(...)`."""
    return render_expr(self.simplify() if simplify else self)

  @property
  def shape(self) -> tuple:
    """The tensor shape of a tensor-level node (ints or symbolic UOps); () for scalars."""
    if (c := self._cache) is not None and "shape" in c: return c["shape"]
    ret = self._cached()["shape"] = shape_of(self)
    return ret
  def numel(self):
    ret = 1
    for s in self.shape: ret = ret * s
    return ret

  def __repr__(self) -> str:
    if self.dtype == dtypes.index and all(n.op in GroupOp.ALU or n.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND) for n in self.toposort()):
      binds = [f"{n.src[0].arg[0]}={n.src[1].arg}" for n in self.toposort() if n.op is Ops.BIND]
      return f"<{self.render(simplify=False)}{' with ' + ', '.join(binds) if binds else ''}>"  # symbolic sizes read as expressions
    return pretty(self)

  def __iter__(self) -> Iterator[UOp]: raise TypeError(f"UOp {self.op} is not iterable")


_set_op, _set_dtype, _set_src, _set_arg, _set_tag, _set_cache, _set_key, _set_seq = \
  (UOp.__dict__[k].__set__ for k in ("op", "dtype", "src", "arg", "tag", "_cache", "_key", "seq"))
_nodes = UOp._nodes  # (module globals: read on every node construction)
_nodes_get, _new_node, _weakref = _nodes.get, object.__new__, weakref.ref
_seq = itertools.count()  # creation order: a graph only contains nodes created before its root (nodes are immutable)
# The hash-cons key names a node's sources by their creation numbers, never reused, rather than holding the nodes: a
# key in the (global) table holding its sources would make every node below a live one reachable from a global root,
# so a cycle through a node's cache (a buffer's pending writes, which reference the buffer) could never be collected.
# A live node's sources are alive, so its key is exact; a dead node's key is dropped with it.
_seq_of = operator.attrgetter("seq")
SymbolicDim.register(UOp)  # a UOp is a valid (symbolic) dimension for the movement mixin's shape checks


def elementwise(op: Ops, dtype: DType, src: tuple[UOp, ...], shape: tuple | None, device: str, arg: Any = None) -> tuple[UOp, dict | None]:
  """`UOp(op, dtype, src, arg)` for a builder that guarantees what construction checks (Tensor's fast paths: a tuple
  of UOp sources of the right count, dtypes that agree, a validated movement arg), with its tensor shape (unless None)
  and device memoized when the node is new: (node, its new cache dict) or (node, None) when the node existed already.
  The same hash-consing as `UOp.__new__` (the key of a node with no tag and no float arg), without `_check`."""
  if type(arg) is float: return UOp(op, dtype, src, arg), None  # (-0.0 and nan keys: the general constructor)
  sk = (src[0].seq, src[1].seq) if len(src) == 2 else (src[0].seq,) if len(src) == 1 else tuple(map(_seq_of, src))
  key = (op, dtype._key, sk, arg, None)
  if (ref := _nodes_get(key)) is not None and (node := ref()) is not None: return node, None
  node = _new_node(UOp)
  _set_op(node, op); _set_dtype(node, dtype); _set_src(node, src); _set_arg(node, arg); _set_tag(node, None)
  _set_cache(node, c := {"device": device} if shape is None else {"shape": shape, "device": device})
  _set_key(node, key); _set_seq(node, next(_seq))
  _nodes[key] = _weakref(node)
  return node, c


def pretty(u: UOp, max_lines: int = 60) -> str:
  """A readable multi-line repr: each shared node is printed once and referred to by its number."""
  topo = list(u.toposort())
  if len(topo) == 1 or len(topo) > max_lines:
    sz = f" <{len(topo)} nodes>" if len(topo) > 1 else ""
    return f"UOp({u.op}, {u.dtype!r}, arg={u.arg!r}{', tag=' + repr(u.tag) if u.tag is not None else ''}, src=({len(u.src)} nodes)){sz}" \
      if u.src else f"UOp({u.op}, {u.dtype!r}, arg={u.arg!r}{', tag=' + repr(u.tag) if u.tag is not None else ''})"
  num = {n: i for i, n in enumerate(topo)}
  lines = [f"  %{num[n]} = {n.op.name} {n.dtype!r} {'(' + ', '.join(f'%{num[s]}' for s in n.src) + ')' if n.src else ''}"
           f"{' arg=' + repr(n.arg) if n.arg is not None else ''}{' tag=' + repr(n.tag) if n.tag is not None else ''}" for n in topo]
  return "UOp graph:\n" + "\n".join(lines)


def ucache_compact(force: bool = False) -> bool:
  """Rebuild the hash-cons table when most of it is empty (or `force`), and say whether it did: a dict keeps the table
  of its peak (a 135M LLM's warm-up leaves ~5 MB of table to ~16k live nodes). Call it where large graphs just died; like
  node construction itself, not while another thread builds nodes."""
  if not force and sys.getsizeof(_nodes) <= 128 * len(_nodes) + (1 << 20): return False   # (compact: ~50 bytes an entry)
  live = _nodes.copy()   # a compact copy; clearing and refilling keeps the dict (and its bound `get`) the same object
  _nodes.clear()
  _nodes.update(live)
  return True


def ucache_size() -> int:
  """How many nodes are alive in the hash-cons cache (for tests and leak checks)."""
  return sum(1 for r in UOp._nodes.values() if r() is not None)


def is_ptr(dt: DType) -> bool: return isinstance(dt, PtrDType)
