"""Render integer/bool expressions as compact strings, e.g. `(a*4+b)`, `(x//4)`, `(i<10)`, for reprs and debugging.

Sums are wrapped in parentheses and print subtraction for negative coefficients; products, `//` and `%` print bare.
IDIV and MOD print as `//` and `%` but keep their C (truncating) meaning.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from plugrad.uop.enums import Ops

if TYPE_CHECKING:
  from plugrad.uop.ops import UOp

_INFIX = {Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.FDIV: "/", Ops.SHL: "<<", Ops.SHR: ">>"}
_BRACKETED = {Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}
ATOM, PRODUCT = 2, 1


def _neg_term(t: UOp) -> UOp | None:
  """For t == x*c with c < 0 (or a negative constant), the positive term x*-c; else None."""
  if t.op is Ops.CONST and not isinstance(t.arg, bool) and t.arg < 0: return t.const_like(-t.arg)
  if t.op is Ops.MUL and t.src[1].op is Ops.CONST and not isinstance(t.src[1].arg, bool) and t.src[1].arg < 0:
    return t.src[0] if t.src[1].arg == -1 else t.src[0] * (-t.src[1].arg)
  return None


def render_expr(root: UOp) -> str:
  memo: dict[UOp, tuple[str, int]] = {}

  def get(u: UOp) -> tuple[str, int]:
    stack = [(u, False)]
    while stack:  # iterative post-order, so deep expressions don't hit the recursion limit
      n, done = stack.pop()
      if n in memo: continue
      if not done:
        stack.append((n, True))
        stack.extend((s, False) for s in n.src if s not in memo)
        if n.op is Ops.ADD: stack.extend((t, False) for t in _extra_terms(n) if t not in memo)
        continue
      memo[n] = one(n)
    return memo[u]

  def atom(u: UOp) -> str:
    s, lvl = get(u)
    return s if lvl == ATOM else f"({s})"

  def _extra_terms(n: UOp) -> list[UOp]:
    return [nt for nt in (_neg_term(s) for s in n.src) if nt is not None]

  def term(t: UOp, first: bool) -> str:
    if (nt := _neg_term(t)) is not None: return "-" + get(nt)[0]
    return ("" if first else "+") + get(t)[0]

  def one(n: UOp) -> tuple[str, int]:
    op, s = n.op, n.src
    if op is Ops.CONST: return repr(n.arg), ATOM
    if op is Ops.DEFINE_VAR: return n.arg[0], ATOM
    if op is Ops.BIND: return get(s[0])[0], ATOM
    if op in (Ops.RANGE, Ops.SPECIAL): return (n.arg if isinstance(n.arg, str) else f"r{n.arg}" if not isinstance(n.arg, tuple)
                                               else "r" + "_".join(map(str, n.arg))), ATOM
    if op is Ops.ADD:
      a = get(s[0])[0] if s[0].op is Ops.ADD else term(s[0], True)
      inner = a[1:-1] if s[0].op is Ops.ADD else a
      return f"({inner}{term(s[1], False)})", ATOM
    if op in _INFIX:
      rhs = get(s[1])
      return f"{get(s[0])[0]}{_INFIX[op]}{rhs[0] if rhs[1] == ATOM else '(' + rhs[0] + ')'}", PRODUCT
    if op in _BRACKETED: return f"({get(s[0])[0]}{_BRACKETED[op]}{get(s[1])[0]})", ATOM
    if op is Ops.NEG: return f"-{atom(s[0])}", ATOM
    if op is Ops.MAX: return f"max({get(s[0])[0]}, {get(s[1])[0]})", ATOM
    if op is Ops.WHERE: return f"({get(s[1])[0]} if {get(s[0])[0]} else {get(s[2])[0]})", ATOM
    if op is Ops.CAST: return f"({n.dtype.name}){atom(s[0])}", ATOM
    return f"{op.name}({', '.join(get(x)[0] for x in s)}{', ' if s and n.arg is not None else ''}{'' if n.arg is None else repr(n.arg)})", ATOM

  return get(root)[0]
