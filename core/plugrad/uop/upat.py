"""Patterns over UOps (`UPat`) and rule sets (`PatternMatcher`).

A rule is `(UPat, fn)`: when the pattern matches a node, `fn(**captures)` (plus `ctx=` if fn takes a `ctx`
parameter) returns a replacement UOp, or None to decline. A PatternMatcher indexes its rules by the op they can
match, so a node is only tried against the rules for its own op.
"""
from __future__ import annotations

import inspect
import itertools
from typing import Any, Callable, Iterable, Sequence

from plugrad.dtype import DType
from plugrad.uop.ops import GroupOp, Ops, UOp


class UPat:
  """A pattern. `op`/`dtype` may be one value or a tuple of alternatives; `src` is a tuple (exact order), a list (any
  order) or a single UPat (every source matches it); `arg=None` matches any arg; `name` captures the node (a name used
  twice must capture the same node); `allow_any_len` lets the node have more sources than `src` lists."""
  __slots__ = ("op", "dtype", "arg", "name", "srcs", "repeat", "allow_any_len", "alternatives", "src_desc")

  def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
               src: tuple[UPat, ...] | list[UPat] | UPat | None = None, arg: Any = None, name: str | None = None,
               allow_any_len: bool = False):
    self.op: frozenset[Ops] | None = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
    self.dtype: frozenset[DType] | None = None if dtype is None else frozenset((dtype,) if isinstance(dtype, DType) else dtype)
    self.arg, self.name, self.allow_any_len, self.alternatives = arg, name, allow_any_len, None
    self.repeat: UPat | None = src if isinstance(src, UPat) else None
    self.srcs: list[tuple[UPat, ...]] | None = None
    if isinstance(src, list): self.srcs = [tuple(p) for p in itertools.permutations(src)]
    elif isinstance(src, tuple): self.srcs = [src]
    elif src is not None and not isinstance(src, UPat): raise TypeError(f"UPat src must be a tuple, list or UPat, got {type(src).__name__}")
    for alt in (self.srcs or []):
      for p in alt:
        if not isinstance(p, UPat): raise TypeError(f"UPat sources must be UPats, got {type(p).__name__} {p!r}")
    self.src_desc = src

  # ----- constructors -----
  @staticmethod
  def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat: return UPat(dtype=dtype, name=name)
  @staticmethod
  def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None, vec: bool = True) -> UPat:
    return UPat((Ops.CONST, Ops.VCONST) if vec else Ops.CONST, dtype, name=name)
  @staticmethod
  def const(dtype: DType | Iterable[DType] | None, b: Any) -> UPat: return UPat(Ops.CONST, dtype, arg=b)
  @staticmethod
  def any(*pats: UPat) -> UPat:
    """Matches if any of `pats` matches (captures come from the one that matched)."""
    ret = UPat()
    ret.alternatives = pats
    return ret
  def named(self, name: str) -> UPat:
    ret = UPat.__new__(UPat)
    for k in UPat.__slots__: setattr(ret, k, getattr(self, k))
    ret.name = name
    return ret

  # ----- operator sugar: builds ALU patterns; commutative ops match either source order -----
  def alu(self, op: Ops, *src: UPat | Any) -> UPat:
    pats = [self, *(s if isinstance(s, UPat) else UPat.const(None, s) for s in src)]
    return UPat(op, None, pats if op in GroupOp.Commutative else tuple(pats))
  def __add__(self, x): return self.alu(Ops.ADD, x)
  def __radd__(self, x): return self.alu(Ops.ADD, x)
  def __mul__(self, x): return self.alu(Ops.MUL, x)
  def __rmul__(self, x): return self.alu(Ops.MUL, x)
  def __floordiv__(self, x): return self.alu(Ops.IDIV, x)
  def __truediv__(self, x): return self.alu(Ops.FDIV, x)
  def __mod__(self, x): return self.alu(Ops.MOD, x)
  def __lt__(self, x): return self.alu(Ops.CMPLT, x)
  def __and__(self, x): return self.alu(Ops.AND, x)
  def __or__(self, x): return self.alu(Ops.OR, x)
  def __xor__(self, x): return self.alu(Ops.XOR, x)
  def __lshift__(self, x): return self.alu(Ops.SHL, x)
  def __rshift__(self, x): return self.alu(Ops.SHR, x)
  def __neg__(self): return self.alu(Ops.NEG)
  def maximum(self, x): return self.alu(Ops.MAX, x)
  def ne(self, x): return self.alu(Ops.CMPNE, x)
  def eq(self, x): return self.alu(Ops.CMPEQ, x)
  def where(self, x, y): return self.alu(Ops.WHERE, x, y)
  def cast(self, dtype: DType | None = None, name: str | None = None) -> UPat: return UPat(Ops.CAST, dtype, (self,), name=name)
  __hash__ = object.__hash__
  def __eq__(self, x): return self is x

  def __repr__(self) -> str:
    if self.alternatives is not None: return f"UPat.any({', '.join(map(repr, self.alternatives))})"
    parts = []
    if self.op is not None: parts.append("|".join(sorted(o.name for o in self.op)))
    if self.dtype is not None: parts.append("dtype=" + "|".join(sorted(d.name for d in self.dtype)))
    if self.arg is not None: parts.append(f"arg={self.arg!r}")
    if self.name is not None: parts.append(f"name={self.name!r}")
    if self.src_desc is not None: parts.append(f"src={self.src_desc!r}")
    return f"UPat({', '.join(parts)})"

  # ----- matching -----
  def match(self, uop: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    """Every way this pattern matches `uop`, each as a capture dict extending `store` (which is not modified)."""
    if self.alternatives is not None: return [m for p in self.alternatives for m in p.match(uop, store)]
    if (self.op is not None and uop.op not in self.op) or (self.arg is not None and self.arg != uop.arg): return []
    if self.dtype is not None and uop.dtype not in self.dtype and uop.dtype.scalar() not in self.dtype: return []
    if self.name is not None:
      if (prev := store.get(self.name)) is not None:
        if prev is not uop: return []
      else: store = {**store, self.name: uop}
    if self.repeat is not None:
      stores = [store]
      for s in uop.src: stores = [m for st in stores for m in self.repeat.match(s, st)]
      return stores
    if self.srcs is None: return [store]
    out: list[dict[str, UOp]] = []
    n = len(uop.src)
    for alt in self.srcs:
      if len(alt) != n and not (self.allow_any_len and len(alt) <= n): continue
      stores = [store]
      for s, p in zip(uop.src, alt):
        stores = [m for st in stores for m in p.match(s, st)]
        if not stores: break
      out.extend(stores)
    return out

  def possible_ops(self) -> frozenset[Ops] | None:
    """The ops this pattern can match at its root (None: any op)."""
    if self.alternatives is not None:
      subs = [p.possible_ops() for p in self.alternatives]
      return None if any(s is None for s in subs) else frozenset().union(*subs)  # type: ignore[arg-type]
    return self.op


class RuleError(TypeError):
  """A rewrite rule misbehaved (raised, or returned something that is not a UOp)."""


def _describe(fn: Callable) -> str:
  code = getattr(fn, "__code__", None)
  where = f" at {code.co_filename}:{code.co_firstlineno}" if code is not None else ""
  return f"{getattr(fn, '__qualname__', repr(fn))}{where}"


class PatternMatcher:
  """An ordered rule list, dispatched by op. `pm.rewrite(uop, ctx)` applies the first rule that returns a node."""

  def __init__(self, rules: Sequence[tuple[UPat, Callable]]):
    self.rules = list(rules)
    self.pdict: dict[Ops, list[tuple[UPat, Callable, bool]]] = {}
    wildcard: list[tuple[int, UPat, Callable, bool]] = []
    indexed: list[tuple[int, Ops, UPat, Callable, bool]] = []
    for i, (pat, fn) in enumerate(self.rules):
      if not isinstance(pat, UPat): raise TypeError(f"rule {i}: pattern must be a UPat, got {type(pat).__name__}")
      if not callable(fn): raise TypeError(f"rule {i} ({pat}): rewrite must be callable, got {type(fn).__name__}")
      takes_ctx = _check_signature(i, pat, fn)
      if (ops := pat.possible_ops()) is None: wildcard.append((i, pat, fn, takes_ctx))
      else: indexed.extend((i, op, pat, fn, takes_ctx) for op in ops)
    # wildcard rules go into every op's list, keeping the original rule order
    for op in Ops:
      entries = sorted([(i, pat, fn, c) for i, o, pat, fn, c in indexed if o is op] + wildcard, key=lambda e: e[0])
      if entries: self.pdict[op] = [(pat, fn, c) for _, pat, fn, c in entries]

  def __add__(self, other: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.rules + other.rules)
  def __len__(self) -> int: return len(self.rules)
  def __repr__(self) -> str: return f"<PatternMatcher {len(self.rules)} rules>"

  def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
    """The replacement from the first matching rule, or None if no rule rewrites `uop`."""
    for pat, fn, takes_ctx in self.pdict.get(uop.op, ()):
      for captures in pat.match(uop, {}):
        ret = fn(ctx=ctx, **captures) if takes_ctx else fn(**captures)
        if ret is None or ret is uop: continue
        if not isinstance(ret, UOp): raise RuleError(f"rule {_describe(fn)} for {pat} returned {type(ret).__name__} {ret!r}, not a UOp")
        return ret
    return None

  def apply(self, uop: UOp, ctx: Any = None) -> Any:
    """The raw result of the first matching rule that returns something other than None (any type: e.g. the
    per-source gradients of autograd's rules), or None."""
    for pat, fn, takes_ctx in self.pdict.get(uop.op, ()):
      for captures in pat.match(uop, {}):
        if (ret := fn(ctx=ctx, **captures) if takes_ctx else fn(**captures)) is not None: return ret
    return None


def _capture_names(pat: UPat) -> set[str]:
  names = {pat.name} if pat.name is not None else set()
  for sub in (pat.alternatives or ()): names |= _capture_names(sub)
  if pat.repeat is not None: names |= _capture_names(pat.repeat)
  for alt in (pat.srcs or ())[:1]:
    for p in alt: names |= _capture_names(p)
  return names


def _check_signature(i: int, pat: UPat, fn: Callable) -> bool:
  """Checks at construction that `fn` accepts every capture of `pat`; returns whether it takes `ctx`."""
  try: params = inspect.signature(fn).parameters
  except (TypeError, ValueError): return False
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()): return "ctx" in params
  if missing := _capture_names(pat) - set(params):
    raise RuleError(f"rule {i} {_describe(fn)} does not accept the captures {sorted(missing)} of {pat}")
  return "ctx" in params
