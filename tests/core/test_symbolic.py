"""Symbolic integer algebra: rules, range analysis, sint helpers, and property tests against direct evaluation."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrad.dtype import dtypes
from plugrad.uop import Ops, UOp, ceildiv, prod, resolve, smax, smin, ssimplify, sym_infer


def var(name, lo=0, hi=10): return UOp.variable(name, lo, hi)


# ***** an evaluator independent of the library's exec_alu: C semantics written out here *****
def c_div(a, b): q = abs(a) // abs(b); return q if (a >= 0) == (b > 0) else -q
def c_mod(a, b): return a - b * c_div(a, b)


def evaluate(u: UOp, env: dict) -> int:
  vals = {}
  for n in u.toposort():
    s = [vals[x] for x in n.src]
    if n.op is Ops.CONST: vals[n] = n.arg
    elif n.op is Ops.DEFINE_VAR: vals[n] = env[n.arg[0]]
    elif n.op is Ops.ADD: vals[n] = s[0] + s[1]
    elif n.op is Ops.MUL: vals[n] = s[0] * s[1]
    elif n.op is Ops.IDIV: vals[n] = c_div(s[0], s[1])
    elif n.op is Ops.MOD: vals[n] = c_mod(s[0], s[1])
    elif n.op is Ops.MAX: vals[n] = max(s[0], s[1])
    elif n.op is Ops.CMPLT: vals[n] = s[0] < s[1]
    elif n.op is Ops.CMPNE: vals[n] = s[0] != s[1]
    elif n.op is Ops.CMPEQ: vals[n] = s[0] == s[1]
    elif n.op is Ops.AND: vals[n] = s[0] & s[1]
    elif n.op is Ops.OR: vals[n] = s[0] | s[1]
    elif n.op is Ops.WHERE: vals[n] = s[1] if s[0] else s[2]
    elif n.op is Ops.NEG: vals[n] = -s[0] if not isinstance(s[0], bool) else not s[0]
    else: raise AssertionError(f"evaluator does not know {n.op}")
  return vals[u]


class TestRules:
  def test_constant_folding(self):
    c = lambda v: UOp.const(dtypes.index, v)
    assert (c(3) + c(4)).simplify() is c(7)
    assert (c(-7) // c(2)).simplify() is c(-3)  # truncation, as C
    assert (c(-7) % c(2)).simplify() is c(-1)
    i8 = UOp.const(dtypes.int8, 100)
    assert (i8 + i8).simplify().arg == -56  # wraps like int8

  def test_identities(self):
    a = var("a")
    assert (a + 0).simplify() is a and (a * 1).simplify() is a and (a * 0).simplify() is a.const_like(0)
    assert (a // 1).simplify() is a and (a % 1).simplify() is a.const_like(0)
    assert (a - a).simplify() is a.const_like(0)
    assert a.maximum(a).simplify() is a
    assert (a < 3).where(a, a).simplify() is a

  def test_like_terms(self):
    a, b = var("a"), var("b")
    assert (a + a).simplify() is a * 2
    assert (a * 3 + b + a * -3).simplify() is b
    assert ((a + 3) + 4).simplify() is a + 7
    assert ((a * 2) * 3).simplify() is a * 6
    assert (3 * a).simplify() is a * 3
    assert ((a + b) * 2 - b * 2).simplify() is a * 2

  def test_divmod_folding_with_ranges(self):
    a, b = var("a", 0, 100), var("b", 0, 3)
    assert ((a * 4 + b) // 4).simplify() is a
    assert ((a * 4 + b) % 4).simplify() is b
    assert ((a * 4 + b + 8) // 4).simplify() is a + 2
    assert (b // 4).simplify() is b.const_like(0) and (b % 4).simplify() is b
    assert ((a % 4) + (a // 4) * 4).simplify() is a
    assert ((a // 4) // 8).simplify() is a // 32
    assert ((a % 8) % 4).simplify() is a % 4

  def test_exact_division_works_for_negative_values(self):
    a = var("a", -50, 50)
    assert ((a * 6) // 3).simplify() is a * 2
    assert ((a * 6 + 12) // 6).simplify() is a + 2

  def test_floor_only_rules_are_not_applied_to_negatives(self):
    a = var("a", -8, 8)
    e = ((a * 4 + 1) // 4).simplify()
    for v in range(-8, 9): assert sym_infer(e, {"a": v}) == c_div(v * 4 + 1, 4)

  def test_comparisons_from_bounds(self):
    a = var("a", 0, 10)
    assert (a < 11).simplify() is UOp.const(dtypes.bool, True)
    assert (a < 0).simplify() is UOp.const(dtypes.bool, False)
    assert a.ne(20).simplify() is UOp.const(dtypes.bool, True)
    assert ((a + 3) < 5).simplify() is (a < 2)
    assert ((a * 3) < 10).simplify() is (a < 4)

  def test_vmin_vmax(self):
    a, b = var("a", -3, 5), var("b", 2, 4)
    assert ((a * b).vmin, (a * b).vmax) == (-12, 20)
    assert ((a // 2).vmin, (a // 2).vmax) == (-1, 2)
    assert ((b % 3).vmin, (b % 3).vmax) == (0, 2)
    assert (a.maximum(b).vmin, a.maximum(b).vmax) == (2, 5)
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 16),), arg=0)
    assert (r.vmin, r.vmax) == (0, 15)
    big = UOp.variable("big", 0, 2**31 - 1, dtypes.int32)
    assert ((big + big).vmin, (big + big).vmax) == (-2**31, 2**31 - 1)  # may wrap: whole int32 range

  def test_resolve(self):
    a = var("a", 0, 10)
    assert resolve(a < 11) is True and resolve(a < 5) is True and resolve(a < 5, False) is False
    assert resolve(True) is True and resolve(0) is False
    with pytest.raises(TypeError, match="bool expression"): resolve(a)


class TestSintHelpers:
  def test_ints_stay_ints(self):
    assert smax(3, 5) == 5 and smin(3, 5) == 3 and prod([2, 3, 4]) == 24 and ceildiv(7, 2) == 4 and ssimplify(3) == 3

  def test_symbolic(self):
    a = var("a", 1, 10)
    assert ssimplify(a * 0 + 4) == 4
    assert smax(a, 0) is a  # a >= 1 > 0 decides it
    assert sym_infer(smin(a, 5), {"a": 7}) == 5 and sym_infer(smin(a, 5), {"a": 2}) == 2
    assert sym_infer(ceildiv(a, 4), {"a": 9}) == 3
    assert sym_infer(prod([a, 2, a]), {a: 3}) == 18
    with pytest.raises(KeyError, match="no value for variable 'a'"): sym_infer(a + 1, {})


# ***** property tests *****
VARS = ["a", "b", "c", "d"]


@st.composite
def bounds(draw):
  lo = draw(st.integers(-20, 20))
  return lo, lo + draw(st.integers(0, 30))


@st.composite
def expr(draw, variables, depth=0):
  if depth > 4 or draw(st.integers(0, 3)) == 0:
    return draw(st.sampled_from(variables)) if draw(st.booleans()) else UOp.const(dtypes.index, draw(st.integers(-10, 10)))
  op = draw(st.sampled_from(["add", "sub", "mul", "mulc", "div", "mod", "max", "where", "divv", "modv"]))
  x = draw(expr(variables, depth + 1))
  if op in ("div", "mod"):
    c = draw(st.integers(-9, 9).filter(lambda v: v != 0))
    return x // c if op == "div" else x % c
  if op in ("divv", "modv"):  # divide by a strictly positive variable expression
    d = draw(st.sampled_from(variables))
    d = d - d.vmin + 1 if d.vmin < 1 else d
    return x // d if op == "divv" else x % d
  if op == "mulc": return x * draw(st.integers(-5, 5))
  y = draw(expr(variables, depth + 1))
  if op == "where": return (x < y).where(x, y * 2)
  return {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "max": lambda: x.maximum(y)}[op]()


@st.composite
def case(draw):
  variables = [UOp.variable(n, *draw(bounds())) for n in VARS]
  e = draw(expr(variables))
  envs = [{v.arg[0]: draw(st.integers(v.arg[1], v.arg[2])) for v in variables} for _ in range(8)]
  for v in variables:  # always test the corners too
    envs.append({**envs[0], v.arg[0]: v.arg[1]}); envs.append({**envs[0], v.arg[0]: v.arg[2]})
  return e, envs


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case())
def test_simplify_preserves_value_and_bounds_hold(c):
  e, envs = c
  s = e.simplify()
  for env in envs:
    want = evaluate(e, env)
    got = evaluate(s, env)
    assert got == want, f"{e.render(simplify=False)} -> {s.render(simplify=False)} at {env}: {got} != {want}"
    assert s.vmin <= want <= s.vmax, f"bounds [{s.vmin}, {s.vmax}] of {s.render(simplify=False)} miss {want} at {env}"
    assert e.vmin <= want <= e.vmax, f"bounds [{e.vmin}, {e.vmax}] of unsimplified {e.render(simplify=False)} miss {want} at {env}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case(), st.integers(-15, 15))
def test_comparisons_simplify_soundly(c, k):
  e, envs = c
  for cond in (e < k, e.ne(k), e.eq(k)):
    s = cond.simplify()
    for env in envs: assert evaluate(s, env) == evaluate(cond, env)


@settings(max_examples=100, deadline=None)
@given(case())
def test_simplify_is_idempotent(c):
  s = c[0].simplify()
  assert s.simplify() is s


# ***** an arange's sum of bits (Tensor.arange is reduce-free: sum over b of where(x % 2^(b+1) >= 2^b, 2^b, 0)) *****
def bit(x: UOp, m: int, form: int, k: int = 1) -> UOp:
  """k times the bit of value m of x in the forms Tensor ops produce (and near misses the fold must leave alone)."""
  y = x % (2 * m) if form != 2 else x
  if form == 1: return (y < m).where(x.const_like(0), x.const_like(k * m))
  return (y < m).ne(True).where(x.const_like(k * m), x.const_like(0))


def test_an_arange_bit_sum_folds_to_its_index():
  x = UOp.variable("x", 0, 999)
  s = None
  for b in range(10): s = bit(x, 1 << b, 0) if s is None else s + bit(x, 1 << b, b % 2)
  assert s.simplify() is x
  top = bit(x, 512, 2)   # the last bit: x >= 512 (x % 1024 is x already)
  low = None
  for b in range(9): low = bit(x, 1 << b, 0) if low is None else low + bit(x, 1 << b, 0)
  assert (low + top).simplify() is x
  y = UOp.variable("y", 0, 27)   # a scaled arange of an index: 2 * (y % 4), as Q5's bit-field shifts are
  assert (bit(y, 1, 0, 2) + bit(y, 2, 0, 2)).simplify() is (y % 4 * 2).simplify()


@st.composite
def bit_sum(draw):
  lo = draw(st.integers(-4, 8))
  x = UOp.variable("x", lo, lo + draw(st.integers(0, 70)))
  terms = []
  for b in range(draw(st.integers(1, 7))):
    if draw(st.integers(0, 4)) == 0: continue   # a missing bit
    m = (1 << b) + (1 if draw(st.integers(0, 6)) == 0 else 0)   # sometimes not the next power of two
    t = bit(x, m, draw(st.integers(0, 2)), draw(st.sampled_from([1, 1, 2, 3])))
    terms.append(t * draw(st.sampled_from([1, 1, 1, 2, -1])))
  extra = draw(st.sampled_from([None, x % 4, x % 8, x]))
  if extra is not None: terms.append(extra)
  if not terms: terms.append(x)
  s = terms[0]
  for t in terms[1:]: s = s + t
  return x, s


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bit_sum())
def test_bit_sums_simplify_soundly(c):
  x, s = c
  f = s.simplify()
  for v in range(x.arg[1], x.arg[2] + 1):
    assert evaluate(f, {"x": v}) == evaluate(s, {"x": v}), f"{s.render(simplify=False)} -> {f.render(simplify=False)} at x={v}"
