"""Symbolic integer algebra: range analysis (`vmin`/`vmax`), simplification rules, and `sint` helpers for shapes.

Index math in kernels and symbolic shapes are integer expressions over variables with known bounds. `min_max`
gives sound bounds for every node; `pm_symbolic` folds constants, removes identities, collects like terms,
folds div/mod using ranges (`(4*a+b)//4 -> a` when `0<=b<4`) and decides comparisons from bounds.
IDIV and MOD truncate toward zero (C semantics), so rules that rely on floor behaviour check `vmin >= 0`.
"""
from __future__ import annotations

import math
from typing import Union

from plugrad.dtype import ConstType, DType, dtypes
from plugrad.uop.bounds import min_max  # noqa: F401  (re-exported: range analysis lives in uop/bounds.py)
from plugrad.uop.ops import GroupOp, Ops, UOp, exec_alu, register_rewriter
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.upat import PatternMatcher, UPat

sint = Union[int, UOp]
INT_DTYPES = (dtypes.index, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)


# ***** helpers for the rules *****
def _is_int(u: UOp) -> bool: return u.dtype in INT_DTYPES


def _terms(u: UOp) -> list[UOp]:
  """The summands of a chain of ADDs (the chain is already simplified, so this only walks ADD nodes)."""
  out, stack = [], [u]
  while stack:
    x = stack.pop()
    if x.op is Ops.ADD: stack.extend(reversed(x.src))
    else: out.append(x)
  return out


def _split(term: UOp) -> tuple[UOp | None, int]:
  """term == base * coeff; base None means the term is the constant `coeff`."""
  if term.op is Ops.CONST: return None, term.arg
  if term.op is Ops.MUL and term.src[1].op is Ops.CONST: return term.src[0], term.src[1].arg
  return term, 1


def _sum(dt: DType, parts: dict[UOp, int], const: int) -> UOp:
  """Left-deep sum of base*coeff in insertion order, constant last."""
  ret: UOp | None = None
  for base, c in parts.items():
    if c == 0: continue
    t = base if c == 1 else UOp(Ops.MUL, dt, (base, UOp.const(dt, c)))
    ret = t if ret is None else UOp(Ops.ADD, dt, (ret, t))
  if ret is None: return UOp.const(dt, const)
  return ret if const == 0 else UOp(Ops.ADD, dt, (ret, UOp.const(dt, const)))


def _collect(u: UOp) -> tuple[dict[UOp, int], int]:
  parts: dict[UOp, int] = {}
  const = 0
  for t in _terms(u):
    base, c = _split(t)
    if base is None: const += c
    else: parts[base] = parts.get(base, 0) + c
  return parts, const


def _fold_divmod_pairs(dt: DType, parts: dict[UOp, int]) -> dict[UOp, int]:
  """(x%c)*f + (x//c)*(f*c) -> x*f, anywhere in a sum."""
  for base in list(parts):
    if base not in parts or base.op is not Ops.MOD or base.src[1].op is not Ops.CONST: continue
    x, c, f = base.src[0], base.src[1].arg, parts[base]
    div = UOp(Ops.IDIV, dt, (x, base.src[1]))
    if parts.get(div) == f * c:
      del parts[base], parts[div]
      parts[x] = parts.get(x, 0) + f
  return parts


def _bit_of(w: UOp) -> tuple[UOp, int, int] | None:
  """(x, m, k) when `w` is k times the bit of value m of x >= 0: where((x % 2m) >= m, k*m, 0), or the same with
  x >= m when x < 2m (`Tensor.arange` is reduce-free: a sum of such bits, see tensor_ops/creation.py)."""
  c, a, b = w.src
  if a.op is not Ops.CONST or b.op is not Ops.CONST: return None
  if b.arg == 0 and c.op is Ops.CMPNE and c.src[1].op is Ops.CONST and c.src[1].arg is True: lt, v = c.src[0], a.arg
  elif a.arg == 0: lt, v = c, b.arg
  else: return None
  if lt.op is not Ops.CMPLT or lt.src[1].op is not Ops.CONST or not isinstance(m := lt.src[1].arg, int) or m <= 0: return None
  if not isinstance(v, int) or isinstance(v, bool) or v == 0 or v % m: return None
  y = lt.src[0]
  if y.op is Ops.MOD and y.src[1].op is Ops.CONST and y.src[1].arg == 2 * m: x = y.src[0]
  elif 0 <= y.vmin and y.vmax < 2 * m: x = y
  else: return None
  return (x, m, v // m) if _is_int(x) and x.vmin >= 0 else None


def _fold_bits(dt: DType, parts: dict[UOp, int]) -> dict[UOp, int]:
  """(x % m)*f + (bit m of x)*f -> (x % 2m)*f, anywhere in a sum (the bit of value 1 alone is x % 2): an arange's
  sum of bits becomes its index (times a constant: arange(n) * 2 is a sum of bits of values 2m)."""
  changed = True
  while changed:
    changed = False
    for base in list(parts):
      if base not in parts or base.op is not Ops.WHERE or (bit := _bit_of(base)) is None: continue
      (x, m, k), f = bit, parts[base]
      f *= k
      low = UOp(Ops.MOD, x.dtype, (x, UOp.const(x.dtype, m))).cast(dt)
      if m != 1 and parts.get(low) != f: continue
      del parts[base]
      if m != 1: del parts[low]
      whole = UOp(Ops.MOD, x.dtype, (x, UOp.const(x.dtype, 2 * m))).cast(dt)
      parts[whole], changed = parts.get(whole, 0) + f, True
  return parts


def normalize_sum(x: UOp) -> UOp | None:
  """Collect like terms of an integer sum: x+x -> x*2, (x+3)+4 -> x+7, x*2+x*-2 -> 0, constants last."""
  if not _is_int(x): return None
  parts, const = _collect(x)
  ret = _sum(x.dtype, _fold_bits(x.dtype, _fold_divmod_pairs(x.dtype, parts)), exec_alu(Ops.ADD, x.dtype, (const, 0)))  # type: ignore[arg-type]
  return None if ret is x else ret


def fold_divmod(x: UOp, d: UOp, op: Ops) -> UOp | None:
  """x//c and x%c for a constant c: exact terms leave the division, and a remainder with a known range folds away."""
  c = d.arg
  if not _is_int(x) or c == 0: return None
  if c < 0: return (-(x // -c) if op is Ops.IDIV else x % -c) if x.dtype.scalar() == dtypes.index or not dtypes.is_unsigned(x.dtype) else None
  parts, const = _collect(x)
  if (g := math.gcd(c, const, *parts.values())) > 1 and c != 1:  # exact common factor: sign independent
    red = _sum(x.dtype, {b: f // g for b, f in parts.items()}, const // g)
    return red // (c // g) if op is Ops.IDIV else (red % (c // g)) * g
  quot = {b: f // c for b, f in parts.items()}
  rem = _sum(x.dtype, {b: f % c for b, f in parts.items()}, const % c)
  q = _sum(x.dtype, quot, const // c)
  if x.vmin < 0 or rem.vmin < 0: return None  # truncation equals floor only for non-negative values
  if op is Ops.MOD:
    if 0 <= rem.vmin and rem.vmax < c: return rem
    return rem % c if rem is not x else None
  if rem.vmin // c == rem.vmax // c: return q + rem.vmin // c
  if q.op is Ops.CONST and q.arg == 0: return None  # nothing came out of the division
  return q + rem // c


def _const_fold(x: UOp) -> UOp | None:
  if x.op is Ops.THREEFRY or any(s.op is not Ops.CONST for s in x.src): return None
  return x.const_like(exec_alu(x.op, x.dtype, [s.arg for s in x.src]))


def _fold_by_range(x: UOp) -> UOp | None:
  if x.dtype.count != 1 or not (_is_int(x) or x.dtype == dtypes.bool): return None
  return x.const_like(x.vmin) if x.vmin == x.vmax else None


def _cmp_shift(x: UOp, c: UOp, c2: UOp) -> UOp | None:
  """x+c < c2 -> x < c2-c (ints)."""
  return UOp(Ops.CMPLT, dtypes.bool, (x, x.const_like(c2.arg - c.arg))) if _is_int(x) else None


def _cmp_scale(x: UOp, c: UOp, c2: UOp) -> UOp | None:
  """x*c < c2 -> x < ceil(c2/c) for c > 0 (ints)."""
  return UOp(Ops.CMPLT, dtypes.bool, (x, x.const_like(-(-c2.arg // c.arg)))) if _is_int(x) and c.arg > 0 else None


_ints = UPat.var("x", INT_DTYPES)
pm_const_fold = PatternMatcher([
  (UPat(GroupOp.ALU, name="x"), _const_fold),
  (UPat(Ops.CAST, src=(UPat(Ops.CONST, name="c"),), name="x"), lambda x, c: x.const_like(c.arg) if x.dtype.count == 1 else None),
])

pm_symbolic = pm_const_fold + PatternMatcher([
  # bounds decide the value (covers comparisons, x%1, x//big, ...)
  (UPat(GroupOp.ALU, name="x"), _fold_by_range),
  # identities
  (_ints + 0, lambda x: x), (UPat.var("x") * 1, lambda x: x), (_ints * 0, lambda x: x.const_like(0)),
  (UPat.var("x") // 1, lambda x: x), (UPat.var("x", dtypes.bool) & True, lambda x: x), (UPat.var("x", dtypes.bool) | False, lambda x: x),
  (UPat.var("x", dtypes.bool) & False, lambda x: x.const_like(False)), (UPat.var("x", dtypes.bool) | True, lambda x: x.const_like(True)),
  (UPat.var("x", dtypes.bool).ne(False), lambda x: x), (UPat.var("x", dtypes.bool).ne(True).ne(True), lambda x: x),
  (UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("x"))), lambda x: x), (UPat(Ops.AND, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
  (UPat(Ops.OR, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
  (UPat(Ops.MAX, src=[UPat.var("x"), UPat.var("y")]), lambda x, y: x if _is_int(x) and x.vmin >= y.vmax else None),
  (UPat.var().where(UPat.var("x"), UPat.var("x")), lambda x: x),
  (UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
  (UPat(Ops.CAST, name="x"), lambda x: x.src[0] if x.src[0].dtype == x.dtype else None),
  # products: constants right, folded together, distributed over sums
  (UPat(Ops.MUL, src=(UPat(Ops.CONST, name="c"), UPat.var("x"))), lambda c, x: x * c if x.op is not Ops.CONST else None),
  ((_ints * UPat.cvar("c1", vec=False)) * UPat.cvar("c2", vec=False), lambda x, c1, c2: x * (c1.arg * c2.arg)),
  ((UPat(Ops.ADD, INT_DTYPES, name="s")) * UPat.cvar("c", vec=False), lambda s, c: s.src[0] * c + s.src[1] * c),
  # sums: like terms collected, constants last
  (UPat(Ops.ADD, name="x"), normalize_sum),
  # division and modulo by constants
  (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("d", vec=False))), lambda x, d: fold_divmod(x, d, Ops.IDIV)),
  (UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("d", vec=False))), lambda x, d: fold_divmod(x, d, Ops.MOD)),
  ((_ints // UPat.cvar("a", vec=False)) // UPat.cvar("b", vec=False), lambda x, a, b: x // (a.arg * b.arg) if a.arg > 0 and b.arg > 0 else None),
  ((_ints % UPat.cvar("a", vec=False)) % UPat.cvar("b", vec=False), lambda x, a, b: x % b if b.arg != 0 and a.arg % b.arg == 0 else None),
  (UPat.var("x") // UPat.var("x"), lambda x: x.const_like(1) if _is_int(x) and (x.vmin > 0 or x.vmax < 0) else None),
  # comparisons against constants
  ((_ints + UPat.cvar("c", vec=False)) < UPat.cvar("c2", vec=False), _cmp_shift),
  ((_ints * UPat.cvar("c", vec=False)) < UPat.cvar("c2", vec=False), _cmp_scale),
])


# ***** sint helpers *****
def resolve(x: UOp | ConstType, default: bool = True) -> bool:
  """The truth of a (possibly symbolic) condition: a bool when bounds decide it, else `default`."""
  if not isinstance(x, UOp): return bool(x)
  if x.dtype != dtypes.bool: raise TypeError(f"resolve needs a bool expression, got {x.dtype}")
  if x.vmin == x.vmax: return bool(x.vmin)
  sx = x.simplify()
  return bool(sx.vmin) if sx.vmin == sx.vmax else default


def ssimplify(x: sint) -> sint:
  """Simplified form of an int or expression; a Python int when it folds to a constant."""
  return x.ssimplify() if isinstance(x, UOp) else x  # type: ignore[return-value]


def smax(*xs: sint) -> sint:
  """Maximum of ints and expressions (a Python int when all are ints)."""
  if len(xs) == 1 and isinstance(xs[0], (list, tuple)): xs = tuple(xs[0])
  if all(isinstance(x, int) for x in xs): return max(xs)  # type: ignore[type-var]
  ret = None
  for x in xs: ret = x if ret is None else (ret.maximum(x) if isinstance(ret, UOp) else _as_uop(x).maximum(ret))
  return ssimplify(ret)


def smin(*xs: sint) -> sint:
  """Minimum of ints and expressions."""
  if len(xs) == 1 and isinstance(xs[0], (list, tuple)): xs = tuple(xs[0])
  if all(isinstance(x, int) for x in xs): return min(xs)  # type: ignore[type-var]
  return ssimplify(-smax(*(-_as_uop(x) if isinstance(x, UOp) else -x for x in xs)))  # type: ignore[operator]


def _as_uop(x: sint) -> UOp: return x if isinstance(x, UOp) else UOp.const(dtypes.index, x)


def prod(xs) -> sint:
  """Product of ints and expressions (1 for an empty sequence)."""
  ret: sint = 1
  for x in xs: ret = ret * x
  return ret


def ceildiv(a: sint, b: sint) -> sint:
  """ceil(a / b) for positive b, for ints and expressions."""
  if isinstance(a, int) and isinstance(b, int): return -(-a // b)
  return ssimplify((_as_uop(a) + (b - 1)) // b)


def sym_infer(x: sint, var_vals: dict) -> int:
  """Evaluate an expression with variables given by `var_vals` (keys: variable UOps or names)."""
  if not isinstance(x, UOp): return x
  vals: dict[UOp, ConstType] = {}
  for n in x.toposort():
    if n.op is Ops.DEFINE_VAR:
      v = var_vals.get(n, var_vals.get(n.arg[0]))
      if v is None: raise KeyError(f"no value for variable {n.arg[0]!r}")
      vals[n] = v
    elif n.op is Ops.CONST: vals[n] = n.arg
    elif n.op is Ops.BIND: vals[n] = n.src[1].arg
    elif n.op in GroupOp.ALU: vals[n] = exec_alu(n.op, n.dtype, [vals[s] for s in n.src])
    elif n.op is Ops.CAST: vals[n] = dtypes.as_const(vals[n.src[0]], n.dtype)
    else: raise ValueError(f"sym_infer can't evaluate {n.op}")
  return vals[x]  # type: ignore[return-value]


def _simplify(u: UOp) -> UOp: return graph_rewrite(u, pm_symbolic, name="simplify")


register_rewriter("simplify", _simplify)
