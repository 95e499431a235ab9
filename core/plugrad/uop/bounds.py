"""Range analysis: `min_max(u)` gives sound bounds (vmin, vmax) of a node from its sources' bounds.

`UOp.vmin`/`vmax` call it in post-order and cache the result on each node; the symbolic rules decide comparisons and
fold div/mod with these bounds. It reads only a node's op, dtype, arg and sources, so it sits below `UOp`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from plugrad.dtype import ConstType, DType, dtypes
from plugrad.uop.alu import exec_alu
from plugrad.uop.enums import GroupOp, Ops

if TYPE_CHECKING:
  from plugrad.uop.ops import UOp


# ***** range analysis *****
def _tdiv(a: int, b: int) -> int: return exec_alu(Ops.IDIV, dtypes.index, (a, b))  # type: ignore[return-value]


def _full(dt: DType) -> tuple[ConstType, ConstType]: return dtypes.min(dt), dtypes.max(dt)


def _clamp(dt: DType, lo, hi) -> tuple[ConstType, ConstType]:
  """(lo, hi) if it fits in `dt`, else the whole range of `dt` (wrap-around would make it unsound)."""
  if dt.scalar() == dtypes.index: return lo, hi
  return (lo, hi) if dtypes.min(dt) <= lo and hi <= dtypes.max(dt) else _full(dt)


def _int_min_max(u: UOp) -> tuple[ConstType, ConstType]:
  s = u.src
  (a0, a1) = (s[0].vmin, s[0].vmax) if s else (0, 0)
  (b0, b1) = (s[1].vmin, s[1].vmax) if len(s) > 1 else (0, 0)
  op, dt = u.op, u.dtype
  if op is Ops.ADD: return _clamp(dt, a0 + b0, a1 + b1)
  if op is Ops.SUB: return _clamp(dt, a0 - b1, a1 - b0)
  if op is Ops.MUL:
    c = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
    return _clamp(dt, min(c), max(c))
  if op is Ops.NEG: return _clamp(dt, -a1, -a0)
  if op is Ops.MAX: return max(a0, b0), max(a1, b1)
  if op is Ops.IDIV and (b0 > 0 or b1 < 0):
    c = (_tdiv(a0, b0), _tdiv(a0, b1), _tdiv(a1, b0), _tdiv(a1, b1))
    return _clamp(dt, min(c), max(c))
  if op is Ops.MOD and (b0 > 0 or b1 < 0):
    m = max(abs(b0), abs(b1)) - 1  # |x % y| < |y|, and the result has the sign of x
    if b0 == b1 and a0 >= 0 and a0 // b0 == a1 // b0 and b0 > 0: return a0 % b0, a1 % b0
    return (max(a0, -m) if a0 < 0 else 0), (min(a1, m) if a1 > 0 else 0)
  if op is Ops.AND and (a0 >= 0 or b0 >= 0): return 0, min(hi for lo, hi in ((a0, a1), (b0, b1)) if lo >= 0)  # a non-negative side's bits
  if op in (Ops.OR, Ops.XOR) and a0 >= 0 and b0 >= 0:
    return (max(a0, b0) if op is Ops.OR else 0), (1 << max(int(a1), int(b1)).bit_length()) - 1
  if op is Ops.SHL and b0 == b1 and 0 <= b0 < dt.itemsize * 8: return _clamp(dt, a0 << b0, a1 << b0)
  if op is Ops.SHR and b0 >= 0 and a0 >= 0 and b1 < dt.itemsize * 8: return a0 >> b1, a1 >> b0
  return _full(dt)


def _bool_min_max(u: UOp) -> tuple[bool, bool]:
  s, op = u.src, u.op
  a0, a1 = s[0].vmin, s[0].vmax
  if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
    b0, b1 = s[1].vmin, s[1].vmax
    if op is Ops.CMPLT: return (True, True) if a1 < b0 else (False, False) if a0 >= b1 else (False, True)
    if a1 < b0 or a0 > b1: ne = (True, True)
    elif a0 == a1 == b0 == b1: ne = (False, False)
    else: ne = (False, True)
    return ne if op is Ops.CMPNE else (not ne[1], not ne[0])
  if op in (Ops.AND, Ops.OR, Ops.XOR):
    b0, b1 = bool(s[1].vmin), bool(s[1].vmax)
    a0, a1 = bool(a0), bool(a1)
    if op is Ops.AND: return a0 and b0, a1 and b1
    if op is Ops.OR: return a0 or b0, a1 or b1
    return (a0 != b0, a0 != b0) if a0 == a1 and b0 == b1 else (False, True)
  if op is Ops.NEG: return not a1, not a0
  return False, True


def min_max(u: UOp) -> tuple[ConstType, ConstType]:
  """Sound bounds (vmin, vmax) of `u`, computed from its sources' cached bounds (UOp.vmin/vmax call this in order)."""
  op, dt = u.op, u.dtype
  if op is Ops.CONST: return u.arg, u.arg
  if op is Ops.VCONST: return min(u.arg), max(u.arg)
  if op is Ops.DEFINE_VAR: return u.arg[1], u.arg[2]
  if op is Ops.BIND: return u.src[0].vmin, u.src[0].vmax
  if op in (Ops.RANGE, Ops.SPECIAL): return 0, u.src[0].vmax - 1
  if op is Ops.WHERE:
    c0, c1 = u.src[0].vmin, u.src[0].vmax
    if c0 == c1: return (u.src[1] if c0 else u.src[2])._min_max
    return min(u.src[1].vmin, u.src[2].vmin), max(u.src[1].vmax, u.src[2].vmax)
  if op is Ops.CAST and u.src:
    s0, s1, sdt = u.src[0].vmin, u.src[0].vmax, u.src[0].dtype
    if dt.scalar() == dtypes.bool: return (False, False) if s0 == s1 == 0 else (True, True) if s0 > 0 or s1 < 0 else (False, True)
    if dtypes.is_int(dt) and (dtypes.is_int(sdt) or sdt.scalar() == dtypes.bool) and dtypes.min(dt) <= s0 and s1 <= dtypes.max(dt):
      return int(s0), int(s1)
    if dtypes.is_float(dt) and (dtypes.is_int(sdt) or sdt.scalar() == dtypes.bool): return float(s0), float(s1)
    return _full(dt)
  if dt.scalar() == dtypes.bool: return _bool_min_max(u)
  if dtypes.is_int(dt) and op in GroupOp.ALU: return _int_min_max(u)
  return _full(dt) if dt.count == 1 and dt.scalar() not in (dtypes.void,) else (-math.inf, math.inf)
