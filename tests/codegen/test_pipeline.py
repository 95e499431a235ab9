"""Codegen is one declared list of named passes (plugrad.codegen.PIPELINE): get_program runs exactly that list, in
order, DEBUG>=5 and VIZ=1 show every pass by name, and a renderer's extra_matcher runs as the decompositions pass."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import plugrad.codegen as codegen
from plugrad.codegen import PIPELINE, Pass, get_program, run_pipeline
from plugrad.device import Device
from plugrad.engine import realize
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.upat import PatternMatcher, UPat
from plugrad.viz import capture

NAMES = ["merge ranges", "optimize", "expand", "tensor cores", "vectorize", "gpudims", "decompositions", "reduce ranges",
         "accumulators", "linearize", "param slots", "render"]


def _ast(dev: str = "PYTHON") -> UOp:
  """A matmul-with-bias kernel (a reduce, several globals) scheduled for `dev`."""
  a, b, c = Tensor.empty(8, 16, device=dev), Tensor.empty(16, 4, device=dev), Tensor.empty(4, device=dev)
  return next(it.ast for it in (a @ b + c).schedule() if it.ast.op is Ops.SINK)


def test_the_declared_order():
  assert [p.name for p in PIPELINE] == NAMES
  assert len({p.run for p in PIPELINE}) == len(PIPELINE)
  assert all(p.doc for p in PIPELINE)


def test_get_program_runs_exactly_the_pipeline(monkeypatch):
  ren = Device["PYTHON"].renderer
  ast = _ast()
  want = get_program(ast, ren)
  ran: list[str] = []
  def traced(p: Pass) -> Pass: return dataclasses.replace(p, run=lambda k, p=p: (ran.append(p.name), p.run(k))[1])
  monkeypatch.setattr(codegen, "PIPELINE", tuple(traced(p) for p in PIPELINE))
  got = get_program(ast, ren)
  assert ran == NAMES
  assert got.src == want.src and got.uops == want.uops


def test_a_pass_left_out_is_not_run(monkeypatch):
  ren = Device["PYTHON"].renderer
  ast = _ast()
  monkeypatch.setattr(codegen, "PIPELINE", tuple(p for p in PIPELINE if p.name != "render"))
  assert get_program(ast, ren).src == ""  # nothing rendered: the list is what runs, not a fixed sequence beside it
  k = run_pipeline(ast, ren, passes=tuple(p for p in PIPELINE if p.name in ("gpudims", "reduce ranges", "accumulators", "linearize")))
  assert any(u.op is Ops.RANGE for u in k.uops) and k.src == ""  # unoptimized, linearized, not rendered


def test_debug_prints_every_pass(monkeypatch, capsys):
  monkeypatch.setenv("DEBUG", "5")
  get_program(_ast(), Device["PYTHON"].renderer)
  lines = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("codegen pass")]
  assert [" ".join(ln[3:-3]) for ln in lines] == NAMES
  assert [int(ln[2]) for ln in lines] == list(range(len(NAMES)))


def test_viz_records_every_pass_in_the_kernel_group():
  was = (capture.VIZ, capture.PROFILE)
  capture.TRACE.clear()
  capture.enable(viz=True)
  try:
    with capture.group("kernel", "test kernel") as g:
      spec = get_program(_ast(), Device["PYTHON"].renderer)
  finally: capture.enable(*was)
  names = [r.name for r in g.rewrites]
  assert [n[len("pass "):] for n in names if n.startswith("pass ")] == NAMES
  # each marker holds the AST after its pass, after that pass's own rewrites (gpudims' substitution comes first)
  marks = {r.name: r for r in g.rewrites if r.name.startswith("pass ")}
  assert marks["pass optimize"].out is marks["pass optimize"].sink and marks["pass render"].out.op is Ops.SINK
  assert names.index("pass optimize") < names.index("pass linearize") and spec.src


def _max_as_where(a: UOp, b: UOp, x: UOp) -> UOp: return (a < b).where(b, a)


def test_decompositions_pass_runs_the_renderers_extra_matcher(monkeypatch):
  ren = Device["PYTHON"].renderer
  monkeypatch.setattr(realize, "_RUNNERS", {})  # compile anew with the decomposition
  monkeypatch.setattr(ren, "extra_matcher", PatternMatcher([(UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("b")), name="x"), _max_as_where)]),
                      raising=False)
  x, y = np.array([1.0, -2.0, 3.5, -0.5], np.float32), np.array([0.5, -1.0, 4.0, -3.0], np.float32)
  out = Tensor(x, device="PYTHON").maximum(Tensor(y, device="PYTHON"))
  item = next(it for it in out.schedule() if it.ast.op is Ops.SINK)
  assert any(u.op is Ops.MAX for u in item.ast.toposort())
  uops = get_program(item.ast, ren).uops
  assert not any(u.op is Ops.MAX for u in uops) and any(u.op is Ops.WHERE for u in uops)
  np.testing.assert_array_equal(out.numpy(), np.maximum(x, y))


def test_without_an_extra_matcher_the_ops_stay():
  assert Device["PYTHON"].renderer.extra_matcher is None
  a = Tensor.empty(4, device="PYTHON").maximum(Tensor.empty(4, device="PYTHON"))
  item = next(it for it in a.schedule() if it.ast.op is Ops.SINK)
  assert any(u.op is Ops.MAX for u in get_program(item.ast, Device["PYTHON"].renderer).uops)


def test_state_after_the_pipeline():
  k = run_pipeline(_ast(), Device["PYTHON"].renderer)
  assert k.dims is not None and k.uops and k.src
  assert [u.arg for u in k.uops if u.op is Ops.DEFINE_GLOBAL] == sorted(u.arg for u in k.source.toposort() if u.op is Ops.DEFINE_GLOBAL)


def test_only_choosing_ordering_and_rendering_are_steps():
  """Every pass that transforms the kernel is a graph_rewrite with its PatternMatchers; what is left as a step chooses
  the Opts, orders the program, keeps the parameter slots or renders (the vectorize and tensor-core passes were steps:
  an expander object walking the lanes, and a tile builder)."""
  assert [p.name for p in PIPELINE if not p.rewrite] == ["optimize", "linearize", "param slots", "render"]


def _cpu_rewrites(t: Tensor) -> tuple[list[str], UOp]:
  """The rewrites VIZ records for `t`'s last kernel on the CPU renderer (the heuristic's Opts), and the AST after vectorize."""
  ast = t.schedule(optimize=False)[-1].ast
  was = (capture.VIZ, capture.PROFILE)
  capture.TRACE.clear()
  capture.enable(viz=True)
  try:
    with capture.group("kernel", "test kernel") as g: get_program(ast, Device["CPU"].renderer)
  finally: capture.enable(*was)
  return [r.name for r in g.rewrites], next(r.out for r in g.rewrites if r.name == "pass vectorize")


def test_the_vectorize_and_expand_passes_are_rewrites():
  """A register-tiled matmul on the CPU: its copies are made by the expand pass's "copy stores" rewrite and its lanes by
  the vectorize pass's "vectorize lane" rewrite (pre-order rules on loads and stores, post-order ones on ALU ops), both
  between their pass markers; what comes out has no lane range and none of the pass's own marks (wrapper NOOPs, tags)."""
  a, b = Tensor(np.ones((64, 64), np.float32)).realize(), Tensor(np.ones((64, 64), np.float32)).realize()
  names, ast = _cpu_rewrites(a @ b)
  assert names.index("pass optimize") < names.index("copy stores") < names.index("pass expand")
  assert names.index("pass tensor cores") < names.index("vectorize lane") < names.index("pass vectorize")
  nodes = ast.toposort()
  assert any(n.dtype.count > 1 for n in nodes), "nothing vectorized"
  assert not any(n.op is Ops.RANGE and len(n.arg) > 2 and n.arg[2] == "vector" for n in nodes)
  assert not any(n.op in (Ops.NOOP, Ops.GROUP) or n.tag is not None for n in nodes)


@pytest.mark.parametrize("kernel", ["softmax", "sum", "gather", "where", "half"])
def test_vectorize_leaves_none_of_its_marks(kernel: str):
  """Kernels through each kind of rule (a reduce over the lane and its horizontal step, a split reduce's tree, a gather
  done lane by lane, a bool select, float16 loads): no wrapper, GROUP or tag survives the pass."""
  rng = np.random.default_rng(0)
  x = Tensor(rng.standard_normal((16, 256)).astype(np.float32)).realize()
  t = {"softmax": lambda: x.softmax(-1), "sum": lambda: x.sum(1), "where": lambda: (x > 0).where(x, x * 2).sum(0),
       "gather": lambda: x[:, Tensor(rng.integers(0, 256, (64,)).astype(np.int32)).realize()],
       "half": lambda: x.cast("float16").realize().cast("float32").sum(0)}[kernel]()
  _, ast = _cpu_rewrites(t)
  assert not any(n.op in (Ops.NOOP, Ops.GROUP) or n.tag is not None for n in ast.toposort())
