"""graph_rewrite: fixed-point and walk drivers, bottom-up/top-down order, bounce detection, diamonds, CALL bodies."""
import sys

import pytest

from plugrad.dtype import dtypes
from plugrad.uop import Ops, PatternMatcher, UOp, UPat, graph_rewrite, graph_rewrite_map


def var(name, lo=0, hi=10): return UOp.variable(name, lo, hi)
def name_is(n): return UPat(Ops.DEFINE_VAR, name="v", arg=(n, 0, 10))


A, B, C, D = var("a"), var("b"), var("c"), var("d")


def recorder():
  """A matcher that logs every node it is tried on, rewriting nothing."""
  log = []
  return log, PatternMatcher([(UPat(name="x"), lambda x: log.append(x))])


class TestFixedPoint:
  def test_children_before_parents(self):
    log, pm = recorder()
    e = (A + B) * C
    graph_rewrite(e, pm)
    assert log.index(A) < log.index(A + B) < log.index(e)
    assert log.index(C) < log.index(e)

  def test_replacements_are_processed_again(self):
    pm = PatternMatcher([(name_is("a"), lambda v: B), (name_is("b"), lambda v: C)])
    assert graph_rewrite(A + D, pm) is C + D

  def test_rewrites_to_fixed_point_up_the_graph(self):
    pm = PatternMatcher([(UPat.var("x") + 0, lambda x: x), (UPat.var("x") * 1, lambda x: x)])
    e = ((A + 0) * 1 + 0) * 1
    assert graph_rewrite(e, pm) is A

  def test_bounce_raises_instead_of_hanging(self):
    pm = PatternMatcher([(name_is("a"), lambda v: B), (name_is("b"), lambda v: A)])
    with pytest.raises(RuntimeError, match="bounce"): graph_rewrite(A + C, pm)

  def test_growing_replacement_raises(self):
    pm = PatternMatcher([(name_is("a"), lambda v: v + 1)])  # a -> a+1 -> (a+1)+1 -> ...
    with pytest.raises(RuntimeError, match="bounce"): graph_rewrite(A * 2, pm)

  def test_bottom_up_rules_see_parents_first(self):
    log, rec = recorder()
    e = (A + B) * C
    graph_rewrite(e, rec, bottom_up=True)
    assert log.index(e) < log.index(A + B) < log.index(A)

  def test_bottom_up_rewrite_of_parent_skips_old_children(self):
    log = []
    pm = PatternMatcher([(UPat(Ops.MUL, name="x"), lambda x: D), (UPat(name="x"), lambda x: log.append(x))])
    assert graph_rewrite((A + B) * C, pm, bottom_up=True) is D
    assert A not in log and (A + B) not in log

  def test_bpm_and_pm_together(self):
    order = []
    bpm = PatternMatcher([(UPat(name="x"), lambda x: order.append(("b", x)))])
    pm = PatternMatcher([(UPat(name="x"), lambda x: order.append(("p", x)))])
    e = A + B
    graph_rewrite(e, pm, bpm=bpm)
    assert order[0] == ("b", e) and order[-1] == ("p", e)
    assert order.index(("b", A)) < order.index(("p", A)) < order.index(("p", e))

  def test_diamond_rewritten_once(self):
    count = {}
    def rule(x):
      count[x] = count.get(x, 0) + 1
      return None
    shared = A * B
    e = (shared + C) * (shared + D)
    graph_rewrite(e, PatternMatcher([(UPat(Ops.MUL, name="x"), rule)]))
    assert count[shared] == 1

  def test_deep_graph(self):
    e = A
    for _ in range(sys.getrecursionlimit() * 3): e = e + 0
    assert graph_rewrite(e, PatternMatcher([(UPat.var("x") + 0, lambda x: x)])) is A

  def test_ctx(self):
    pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: ctx.get(v))])
    assert graph_rewrite(A + B, pm, ctx={A: C}) is C + B

  def test_graph_rewrite_map(self):
    pm = PatternMatcher([(name_is("a"), lambda v: C)])
    m = graph_rewrite_map(A + B, pm)
    assert m[A] is C and m[A + B] is C + B and m[B] is B

  def test_bad_arguments(self):
    with pytest.raises(TypeError, match="needs a UOp"): graph_rewrite(3, PatternMatcher([]))
    with pytest.raises(TypeError, match="PatternMatchers"): graph_rewrite(A, [(UPat(), lambda: None)])


class TestWalk:
  def test_top_down_walk_is_post_order_on_rebuilt_node(self):
    seen = []
    pm = PatternMatcher([(name_is("a"), lambda v: C), (UPat(Ops.ADD, name="x"), lambda x: seen.append(x))])
    graph_rewrite(A + B, pm, walk=True)
    assert seen == [C + B]  # the rule sees the parent after its children were rewritten

  def test_top_down_walk_does_not_rewrite_inside_replacement(self):
    # a -> b+c, and b -> d would apply to a b anywhere else, but not to the b inside the replacement
    pm = PatternMatcher([(name_is("a"), lambda v: B + C), (name_is("b"), lambda v: D)])
    assert graph_rewrite(A * B, pm, walk=True) is (B + C) * D
    assert graph_rewrite(A * B, pm) is (D + C) * D  # the fixed point does rewrite it

  def test_bottom_up_walk_is_pre_order_and_match_short_circuits(self):
    log = []
    bpm = PatternMatcher([(UPat(Ops.MUL, name="x"), lambda x: D), (UPat(name="x"), lambda x: log.append(x))])
    e = (A * B) + C
    assert graph_rewrite(e, bpm, bottom_up=True, walk=True) is D + C
    assert log == [e, C]  # pre-order; A and B are never visited because their parent matched

  def test_bottom_up_walk_result_used_as_is(self):
    bpm = PatternMatcher([(name_is("a"), lambda v: B), (name_is("b"), lambda v: C)])
    assert graph_rewrite(A + D, bpm, bottom_up=True, walk=True) is B + D

  def test_bottom_up_walk_descends_on_no_match(self):
    bpm = PatternMatcher([(name_is("a"), lambda v: C)])
    assert graph_rewrite((A + B) * A, bpm, bottom_up=True, walk=True) is (C + B) * C

  def test_both_bpm_short_circuits_pm(self):
    pm_seen = []
    bpm = PatternMatcher([(UPat(Ops.MUL, name="x"), lambda x: D)])
    pm = PatternMatcher([(UPat(name="x"), lambda x: pm_seen.append(x))])
    e = (A * B) + C
    assert graph_rewrite(e, pm, bpm=bpm, walk=True) is D + C
    assert (A * B) not in pm_seen and A not in pm_seen and B not in pm_seen
    assert C in pm_seen and (D + C) in pm_seen  # pm runs post-order on the rebuilt parent

  def test_bouncing_pair_applies_once(self):
    pm = PatternMatcher([(name_is("a"), lambda v: B), (name_is("b"), lambda v: A)])
    assert graph_rewrite(A + C, pm, walk=True) is B + C
    assert graph_rewrite(A + C, pm, bottom_up=True, walk=True) is B + C

  def test_diamond_rewritten_once(self):
    count = []
    shared = A * B
    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.var("y")), name="m"), lambda m, x, y: count.append(m))])
    graph_rewrite((shared + C) * (shared + D), pm, walk=True)
    assert count.count(shared) == 1

  def test_replacement_containing_node_does_not_recurse(self):
    pm = PatternMatcher([(name_is("a"), lambda v: v + 1)])
    assert graph_rewrite(A * 2, pm, walk=True) is (A + 1) * 2
    assert graph_rewrite(A * 2, pm, bottom_up=True, walk=True) is (A + 1) * 2

  def test_substitute_walk(self):
    assert (A * 2).substitute({A: A + 1}, walk=True) is (A + 1) * 2
    assert (A + B).substitute({A: B, B: C}, walk=True) is B + C
    assert (A + B).substitute({A: B, B: C}) is C + C


class TestCall:
  def body_and_call(self):
    p0 = UOp(Ops.PARAM, dtypes.index, arg=0)
    body = (p0 + A).sink()  # the body mentions A too, to see whether a rewrite enters it
    return body, UOp(Ops.CALL, dtypes.void, (body, A), arg="f")

  def test_call_body_not_entered_by_default(self):
    body, call = self.body_and_call()
    pm = PatternMatcher([(name_is("a"), lambda v: B)])
    out = graph_rewrite(call, pm)
    assert out.src[0] is body and out.src[1] is B
    out = graph_rewrite(call, pm, walk=True)
    assert out.src[0] is body and out.src[1] is B

  def test_call_body_entered_when_asked(self):
    body, call = self.body_and_call()
    out = graph_rewrite(call, PatternMatcher([(name_is("a"), lambda v: B)]), enter_calls=True)
    assert out.src[0] is body.substitute({A: B}) and out.src[1] is B


class TestSubstituteMatcher:
  def test_same_result_as_the_generic_rule(self):
    from plugrad.uop.rewrite import pm_substitute
    generic = PatternMatcher(list(pm_substitute.rules))  # the plain rule, matched the generic way
    e, m = (A + B) * (A + C), {A: B, B: C + 1}
    for walk in (False, True):
      assert e.substitute(m, walk=walk) is graph_rewrite(e, generic, ctx=m, bottom_up=True, walk=walk)

  def test_non_uop_value_is_a_clear_error(self):
    from plugrad.uop.upat import RuleError
    with pytest.raises(RuleError, match="pm_substitute.*int"):
      (A + B).substitute({A: 3})
