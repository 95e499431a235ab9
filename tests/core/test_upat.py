"""UPat matching and PatternMatcher dispatch."""
import pytest

from plugrad.dtype import dtypes
from plugrad.uop import Ops, PatternMatcher, RuleError, UOp, UPat


def var(name, lo=0, hi=10): return UOp.variable(name, lo, hi)
def matches(pat, u): return pat.match(u, {})


class TestUPat:
  def test_op_dtype_arg(self):
    a = var("a")
    c = UOp.const(dtypes.int32, 3)
    assert matches(UPat(Ops.CONST), c) and not matches(UPat(Ops.ADD), c)
    assert matches(UPat((Ops.ADD, Ops.CONST)), c)
    assert matches(UPat(dtype=dtypes.int32), c) and not matches(UPat(dtype=dtypes.float32), c)
    assert matches(UPat(dtype=(dtypes.float32, dtypes.int32)), c)
    assert matches(UPat(Ops.CONST, arg=3), c) and not matches(UPat(Ops.CONST, arg=4), c)
    assert matches(UPat(Ops.DEFINE_VAR, arg=("a", 0, 10)), a)

  def test_vector_dtype_matches_scalar_pattern(self):
    v = UOp.const(dtypes.float32, (1.0, 2.0))
    assert matches(UPat(dtype=dtypes.float32), v)

  def test_named_captures(self):
    a, b = var("a"), var("b")
    m = matches(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y")), name="root"), a + b)
    assert m == [{"x": a, "y": b, "root": a + b}]

  def test_same_name_must_capture_same_node(self):
    a, b = var("a"), var("b")
    pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
    assert matches(pat, a + a) == [{"x": a}]
    assert matches(pat, a + b) == []

  def test_exact_order_vs_any_order(self):
    a = var("a")
    c = a.const_like(2)
    exact = UPat(Ops.MUL, src=(UPat.cvar("c"), UPat.var("x")))
    assert matches(exact, a * 2) == []
    anyorder = UPat(Ops.MUL, src=[UPat.cvar("c"), UPat.var("x")])
    assert matches(anyorder, a * 2) == [{"c": c, "x": a}]
    assert matches(anyorder, UOp(Ops.MUL, dtypes.index, (c, a))) == [{"c": c, "x": a}]

  def test_operator_sugar_is_commutative_for_commutative_ops(self):
    a = var("a")
    pat = UPat.var("x") + UPat.cvar("c")
    assert matches(pat, a + 3) and matches(pat, UOp(Ops.ADD, dtypes.index, (a.const_like(3), a)))
    div = UPat.var("x") // UPat.cvar("c")
    assert matches(div, a // 3) and not matches(div, UOp(Ops.IDIV, dtypes.index, (a.const_like(3), a)))

  def test_any_order_yields_every_match(self):
    a, b = var("a"), var("b")
    ms = matches(UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")]), a + b)
    assert {(m["x"], m["y"]) for m in ms} == {(a, b), (b, a)}

  def test_allow_any_len(self):
    a, b = var("a"), var("b")
    s = UOp.sink_of(a, b, a + b)
    assert matches(UPat(Ops.SINK, src=(UPat.var("first"),)), s) == []
    assert matches(UPat(Ops.SINK, src=(UPat.var("first"),), allow_any_len=True), s) == [{"first": a}]

  def test_repeated_src_pattern(self):
    a = var("a")
    s = UOp.sink_of(a.const_like(1), a.const_like(2))
    assert matches(UPat(Ops.SINK, src=UPat(Ops.CONST)), s)
    assert not matches(UPat(Ops.SINK, src=UPat(Ops.CONST)), UOp.sink_of(a.const_like(1), a))

  def test_any_alternatives(self):
    a = var("a")
    pat = UPat.any(UPat(Ops.ADD, name="x"), UPat(Ops.MUL, name="x"))
    assert matches(pat, a + 1) and matches(pat, a * 2) and not matches(pat, a // 2)

  def test_bad_pattern_construction(self):
    with pytest.raises(TypeError, match="UPat src"): UPat(Ops.ADD, src=3)
    with pytest.raises(TypeError, match="must be UPats"): UPat(Ops.ADD, src=(UPat(), 3))


class TestPatternMatcher:
  def test_first_matching_rule_wins_and_none_declines(self):
    a = var("a")
    pm = PatternMatcher([
      (UPat(Ops.ADD, name="x"), lambda x: None),
      (UPat(Ops.ADD, name="x"), lambda x: x.src[0]),
      (UPat(Ops.ADD, name="x"), lambda x: x.src[1]),
    ])
    assert pm.rewrite(a + 1) is a
    assert pm.rewrite(a * 2) is None

  def test_ctx_is_passed_when_asked_for(self):
    a = var("a")
    seen = []
    pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: seen.append((ctx, v)))])
    pm.rewrite(a, ctx="C")
    assert seen == [("C", a)]

  def test_compose_with_plus_keeps_order(self):
    a = var("a")
    pm1 = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x.src[0])])
    pm2 = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x.src[1])])
    assert (pm1 + pm2).rewrite(a + 1) is a
    assert (pm2 + pm1).rewrite(a + 1) is a.const_like(1)
    assert len(pm1 + pm2) == 2

  def test_wildcard_rules_keep_relative_order(self):
    a = var("a")
    pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x.src[0]), (UPat(name="x"), lambda x: a.const_like(99))])
    assert pm.rewrite(a + 1) is a
    assert pm.rewrite(a * 2) is a.const_like(99)

  def test_rule_returning_non_uop_is_a_clear_error(self):
    def bad_rule(x): return 42
    pm = PatternMatcher([(UPat(Ops.ADD, name="x"), bad_rule)])
    with pytest.raises(RuleError, match=r"bad_rule.*returned int 42, not a UOp"): pm.rewrite(var("a") + 1)

  def test_rule_not_accepting_captures_fails_at_construction(self):
    with pytest.raises(RuleError, match=r"does not accept the captures \['y'\]"):
      PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y"))), lambda x: x)])

  def test_bad_rules(self):
    with pytest.raises(TypeError, match="must be a UPat"): PatternMatcher([(Ops.ADD, lambda x: x)])
    with pytest.raises(TypeError, match="must be callable"): PatternMatcher([(UPat(Ops.ADD), 3)])

  def test_dispatch_scales_to_hundreds_of_rules(self):
    a = var("a")
    rules = [(UPat(Ops.CONST, arg=i, name="x"), lambda x: x.const_like(-1)) for i in range(500)]
    rules.append((UPat(Ops.ADD, name="x"), lambda x: x.src[0]))
    pm = PatternMatcher(rules)
    assert len(pm.pdict[Ops.ADD]) == 1  # an ADD is only tried against the one ADD rule
    assert pm.rewrite(a + 1) is a
