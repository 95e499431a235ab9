"""Python semantics of the ALU ops: `python_alu` (one callable per op) and `exec_alu` (an op on Python numbers,
truncated to a dtype as C would). Constant folding, range analysis and the PYTHON device use these.
"""
from __future__ import annotations

import math
import operator
from typing import Callable, Iterable

from plugrad.dtype import ConstType, DType, truncate
from plugrad.uop.enums import Ops


# ***** python semantics of the ALU ops (constant folding and the PYTHON device) *****
def _cdiv(a, b): return int(a / b) if isinstance(a, float) or isinstance(b, float) else (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1)
def _cmod(a, b): return a - b * _cdiv(a, b)
def _safe_log2(x): return math.log2(x) if x > 0 else (-math.inf if x == 0 else math.nan)
def _safe_sqrt(x): return math.sqrt(x) if x >= 0 else math.nan
def _safe_recip(x): return 1 / x if x != 0 else math.copysign(math.inf, x)
def _safe_exp2(x):
  try: return 2.0 ** x
  except OverflowError: return math.inf
def _safe_sin(x): return math.sin(x) if math.isfinite(x) else math.nan
def _safe_fdiv(a, b): return a / b if b != 0 else (math.nan if a == 0 or a != a else math.copysign(math.inf, a) * math.copysign(1, b))
def _safe_pow(a, b):
  try: return a ** b if not (a < 0 and b != int(b)) else math.nan
  except (OverflowError, ZeroDivisionError): return math.inf

python_alu: dict[Ops, Callable] = {
  Ops.EXP2: _safe_exp2, Ops.LOG2: _safe_log2, Ops.SIN: _safe_sin, Ops.SQRT: _safe_sqrt, Ops.RECIPROCAL: _safe_recip,
  Ops.NEG: lambda x: (not x) if isinstance(x, bool) else -x, Ops.TRUNC: lambda x: x if not math.isfinite(x) else float(math.trunc(x)),
  Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul, Ops.FDIV: _safe_fdiv, Ops.POW: _safe_pow,
  Ops.MAX: lambda a, b: a if a > b or a != a else b,
  Ops.IDIV: lambda a, b: _cdiv(a, b) if b != 0 else 0, Ops.MOD: lambda a, b: _cmod(a, b) if b != 0 else 0,
  Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne, Ops.CMPEQ: operator.eq, Ops.XOR: operator.xor, Ops.OR: operator.or_, Ops.AND: operator.and_,
  Ops.SHL: lambda a, b: a << b, Ops.SHR: lambda a, b: a >> b, Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c}


def exec_alu(op: Ops, dtype: DType, operands: Iterable[ConstType]) -> ConstType:
  """Evaluate ALU `op` on Python numbers with the result truncated to `dtype` (C semantics: IDIV/MOD truncate)."""
  vals = tuple(operands)
  if dtype.count > 1: return tuple(exec_alu(op, dtype.scalar(), [v[i] if isinstance(v, tuple) else v for v in vals]) for i in range(dtype.count))
  return truncate(dtype)(python_alu[op](*vals))
