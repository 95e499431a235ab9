"""UOp nodes: hash-consing, immutability, structural checks, graph walks, constructors, rendering."""
import gc
import pickle
import sys

import pytest

from plugrad.dtype import dtypes
from plugrad.uop import GroupOp, Ops, UOp, UOpSpecError, ucache_compact, ucache_size


def var(name, lo=0, hi=10): return UOp.variable(name, lo, hi)


class TestHashCons:
  def test_identical_nodes_are_the_same_object(self):
    a = var("a")
    assert UOp.variable("a", 0, 10) is a
    assert a + 1 is a + 1
    assert UOp(Ops.ADD, dtypes.index, (a, a.const_like(1))) is a + 1

  def test_different_fields_give_different_nodes(self):
    a = var("a")
    assert a + 1 is not a + 2
    assert UOp.const(dtypes.int32, 1) is not UOp.const(dtypes.int64, 1)
    assert UOp(Ops.NOOP, arg=1) is not UOp(Ops.NOOP, arg=1, tag="t")
    assert var("a", 0, 5) is not var("a", 0, 6)

  def test_unreferenced_nodes_are_collected(self):
    gc.collect()
    before = ucache_size()
    nodes = [UOp(Ops.NOOP, arg=("collect-me", i)) for i in range(1000)]
    assert ucache_size() >= before + 1000
    del nodes
    gc.collect()
    assert ucache_size() <= before + 5
    # rebuilding after collection gives a fresh, valid node
    assert UOp(Ops.NOOP, arg=("collect-me", 1)).arg == ("collect-me", 1)

  def test_table_shrinks_after_a_peak(self):
    """A dict keeps the table of its peak size: ucache_compact rebuilds it for the nodes alive (only when it is mostly
    empty, unless forced), and they stay the nodes construction returns."""
    gc.collect()
    peak = [UOp(Ops.NOOP, arg=("peak", i)) for i in range(100_000)]
    keep = peak[:100]
    del peak
    gc.collect()
    assert ucache_compact(force=True) and not ucache_compact()
    assert sys.getsizeof(UOp._nodes) <= 128 * len(UOp._nodes) + (1 << 20)
    assert all(UOp(Ops.NOOP, arg=("peak", i)) is keep[i] for i in range(100))
    fresh = [UOp(Ops.NOOP, arg=("peak", i)) for i in range(100, 200)]   # and nodes made after it are hash-consed too
    assert all(UOp(Ops.NOOP, arg=("peak", 100 + i)) is fresh[i] for i in range(100))

  def test_immutable(self):
    a = var("a")
    with pytest.raises(AttributeError): a.op = Ops.ADD
    with pytest.raises(AttributeError): a.arg = ("b", 0, 1)

  def test_pickle_roundtrip_keeps_identity(self):
    e = var("a") * 4 + var("b")
    assert pickle.loads(pickle.dumps(e)) is e

  def test_replace(self):
    a = var("a")
    e = a + 1
    assert e.replace() is e
    assert e.replace(op=Ops.MUL) is a * 1
    assert e.replace(src=(a, a)) is a + a
    with pytest.raises(TypeError, match="unknown field"): e.replace(bogus=1)


class TestSpecChecks:
  def test_wrong_source_count_names_op(self):
    a = var("a")
    with pytest.raises(UOpSpecError, match="Ops.ADD takes 2 sources, got 1"): UOp(Ops.ADD, dtypes.index, (a,))
    with pytest.raises(UOpSpecError, match="Ops.WHERE takes 3 sources"): UOp(Ops.WHERE, dtypes.index, (a, a))
    with pytest.raises(UOpSpecError, match="Ops.NEG takes 1 sources, got 0"): UOp(Ops.NEG, dtypes.float32)

  def test_wrong_dtypes_name_op(self):
    a, f = var("a"), UOp.const(dtypes.float32, 1.0)
    with pytest.raises(UOpSpecError, match="Ops.ADD of dtype dtypes.index has a source of dtype dtypes.float32"): UOp(Ops.ADD, dtypes.index, (a, f))
    with pytest.raises(UOpSpecError, match="Ops.CMPLT must have dtype bool"): UOp(Ops.CMPLT, dtypes.index, (a, a))
    with pytest.raises(UOpSpecError, match="compares mismatched"): UOp(Ops.CMPLT, dtypes.bool, (a, f))
    with pytest.raises(UOpSpecError, match="condition must be bool"): UOp(Ops.WHERE, dtypes.index, (a, a, a))

  def test_non_uop_source(self):
    with pytest.raises(UOpSpecError, match="source must be a UOp"): UOp(Ops.ADD, dtypes.index, (var("a"), 3))

  def test_bad_const_and_variable(self):
    with pytest.raises(UOpSpecError, match="CONST needs a value"): UOp(Ops.CONST, dtypes.int32)
    with pytest.raises(ValueError, match="min <= max"): UOp.variable("v", 5, 1)
    with pytest.raises(ValueError, match="non-empty str"): UOp.variable("", 0, 1)
    with pytest.raises(UOpSpecError, match="DEFINE_VAR arg"): UOp(Ops.DEFINE_VAR, dtypes.index, arg="v")

  def test_operator_type_errors(self):
    with pytest.raises(TypeError, match="can't combine float"): var("a") + 0.5
    with pytest.raises(TypeError, match="not iterable"): list(var("a"))


class TestWalks:
  def test_toposort_orders_sources_first(self):
    a, b = var("a"), var("b")
    e = (a + b) * (a + b) + a
    order = list(e.toposort())
    assert order[-1] is e
    pos = {n: i for i, n in enumerate(order)}
    for n in order:
      for s in n.src: assert pos[s] < pos[n]
    assert len(order) == len(set(order))

  def test_toposort_deep_graph_no_recursion_limit(self):
    x = var("a")
    for i in range(sys.getrecursionlimit() * 3): x = x + i
    assert len(x.toposort()) > sys.getrecursionlimit() * 3

  def test_toposort_gate(self):
    a, b = var("a"), var("b")
    e = (a + b) * 2
    gated = e.toposort(gate=lambda n: n.op is not Ops.ADD)
    assert a not in gated and (a + b) in gated

  def test_backward_slice(self):
    a, b = var("a"), var("b")
    e = a * b
    assert set(e.backward_slice()) == {a, b}

  def test_substitute(self):
    a, b, c = var("a"), var("b"), var("c")
    e = (a + b) * a
    assert e.substitute({a: c}) is (c + b) * c
    assert e.substitute({a + b: c}) is c * a


class TestConstructors:
  def test_const_truncates_to_dtype(self):
    assert UOp.const(dtypes.int8, 200).arg == -56
    assert UOp.const(dtypes.uint8, -1).arg == 255
    assert UOp.const(dtypes.bool, 3).arg is True
    assert UOp.const(dtypes.float32, 0.1).arg == pytest.approx(0.1, rel=1e-7)
    v = UOp.const(dtypes.float32, (1.0, 2.0))
    assert v.op is Ops.VCONST and v.dtype == dtypes.float32.vec(2)

  def test_variable_bind_unbind(self):
    v = UOp.variable("n", 1, 8)
    b = v.bind(3)
    assert b.op is Ops.BIND and b.unbind() == (v, 3) and v.expr == "n"
    with pytest.raises(ValueError, match=r"out of range \[1, 8\]"): v.bind(9)
    with pytest.raises(TypeError, match="only a DEFINE_VAR"): (v + 1).bind(2)
    assert (b * 2).vmin == 2 and (b * 2).vmax == 16  # a bound variable keeps its range for compilation

  def test_operators_build_alu(self):
    a, b = var("a"), var("b")
    assert (a + b).op is Ops.ADD and (a * b).op is Ops.MUL and (a // b).op is Ops.IDIV and (a % b).op is Ops.MOD
    assert (a < b).op is Ops.CMPLT and (a < b).dtype == dtypes.bool
    assert (a > b).src == (b, a)
    assert a.eq(b).op is Ops.CMPEQ and a.ne(b).op is Ops.CMPNE
    assert (3 + a).src == (a.const_like(3), a) and (a - b).op is Ops.ADD
    assert (a < 3).where(a, 0).op is Ops.WHERE
    assert a.maximum(b).op is Ops.MAX
    f = UOp.const(dtypes.float32, 2.0)
    assert (-f).op is Ops.NEG and (f / f).op is Ops.FDIV

  def test_identity_equality_kept(self):
    a = var("a")
    assert a == a and a != var("b")
    assert {a: 1}[var("a")] == 1

  def test_bool_of_decided_and_undecided(self):
    a = var("a", 0, 10)
    assert bool(a < 11) is True and bool(a < 0) is False
    with pytest.raises(TypeError, match="undecided"): bool(a < 5)

  def test_groups_cover_alu(self):
    assert GroupOp.ALU == GroupOp.Unary | GroupOp.Binary | GroupOp.Ternary
    assert Ops.ADD in GroupOp.Commutative and Ops.IDIV not in GroupOp.Commutative


class TestRender:
  def test_render_examples(self):
    a, b = var("a"), var("b", 0, 3)
    assert (a * 4 + b).render() == "(a*4+b)"
    assert (a - b).render() == "(a-b)"
    assert ((a + b) // 4).render(simplify=False) == "(a+b)//4"
    assert (a < 5).render() == "(a<5)"
    assert (a * (b + 1)).render(simplify=False) == "a*(b+1)"
    assert UOp.const(dtypes.index, 7).render() == "7"

  def test_repr_is_readable(self):
    e = UOp.variable("a", 0, 10, dtypes.int32) + 1
    r = repr(e)
    assert "ADD" in r and "DEFINE_VAR" in r and "'a'" in r
    assert "CONST" in repr(UOp.const(dtypes.int32, 3))
    assert repr(var("a") * 4 + var("b")) == "<(a*4+b)>"  # index expressions (symbolic sizes) read as expressions
    assert repr(var("n").bind(3) + 1) == "<(n+1) with n=3>"
