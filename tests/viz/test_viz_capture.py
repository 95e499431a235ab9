"""VIZ=1 capture: rewrites grouped by what ran them, recorded steps that replay (on the saved trace's node ids alone) to
the very output graph the engine produced, the recording cap, and saving/loading traces."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrad import Tensor
from plugrad.dtype import dtypes
from plugrad.uop import Ops, PatternMatcher, RuleError, UOp, UPat, graph_rewrite, pm_symbolic
from plugrad.viz import capture
from plugrad.viz.graph import NodeGraph, replay
from plugrad.viz.server import Viewer
from plugrad.viz.trace import NodeTable, load, save, serialize


def check_replays(data: dict) -> int:
  """Every recorded rewrite replays to its recorded output; returns how many rewrites had steps."""
  g, n = NodeGraph(data["nodes"]), 0
  for rw in data["rewrites"]:
    assert replay(g, rw) == rw["output"], f"rewrite {rw['name']} ({len(rw['steps'])} steps) does not replay to its output"
    n += bool(rw["steps"])
  return n


def expr(draw_ops: list[tuple[int, int]]) -> UOp:
  xs = [UOp.variable(f"v{i}", 0, 20 * (i + 1)) for i in range(3)]
  e = xs[0]
  for op, c in draw_ops:
    c = UOp.const(dtypes.index, c)
    e = [e + c, e * c, e // c, e % c, e + xs[op % 3], (e + xs[1]) * c][op % 6]
  return e


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.integers(1, 9)), min_size=1, max_size=12))
def test_symbolic_steps_replay_to_the_output(ops):
  was = capture.VIZ
  capture.TRACE.clear()
  capture.enable(viz=True)
  try: out = expr(ops).simplify()
  finally: capture.enable(viz=was)
  data = serialize()
  capture.TRACE.clear()
  assert [g["kind"] for g in data["groups"]] == ["symbolic"] and data["groups"][0]["name"] == "symbolic simplifier"
  check_replays(data)
  rw = data["rewrites"][-1]
  row = data["nodes"][rw["output"]]
  assert row[0] == out.op.name and row[2] == repr(out.arg)


def test_program_is_grouped_by_schedule_and_kernel(recording):
  a = Tensor(np.arange(35, dtype=np.float32).reshape(5, 7))
  b = Tensor(np.ones((7, 3), dtype=np.float32))
  want = np.maximum(np.arange(35, dtype=np.float32).reshape(5, 7) @ np.ones((7, 3)), 0).sum(axis=1)
  np.testing.assert_allclose((a @ b).relu().sum(axis=1).numpy(), want)
  data = serialize()
  kinds = [g["kind"] for g in data["groups"]]
  assert kinds[:2] == ["schedule", "kernel"], kinds
  sched = data["groups"][0]
  assert [data["rewrites"][r]["name"] for r in sched["rewrites"]][:1] == ["normalize"]
  assert "indexing" in {data["rewrites"][r]["name"] for r in sched["rewrites"]}
  k = data["groups"][1]["kernel"]
  assert k["name"].startswith("r_") and k["device"] and k["name"] in k["src"] and "STORE" in k["ast_text"]
  assert "RANGE" in k["linear"] and isinstance(k["opts"], list)
  assert all(data["rewrites"][r]["group"] == 1 for r in data["groups"][1]["rewrites"])
  assert [data["rewrites"][r]["name"] for r in k["built_by"]] == ["indexing", "simplify kernel"]
  assert data["rewrites"][k["built_by"][-1]]["output"] == k["ast"]
  assert check_replays(data) >= 3
  for ri, b, a in (s for rw in data["rewrites"] for s in rw["steps"]):
    rule = data["rules"][ri]
    assert rule["name"] and ".py:" in rule["where"], rule
    assert 0 <= b < len(data["nodes"]) and 0 <= a < len(data["nodes"])


def test_saved_trace_reopens_and_replays(recording, tmp_path):
  (Tensor(np.arange(12, dtype=np.float32)).reshape(3, 4).exp2() * 3).sum(axis=0).numpy()
  data = serialize()
  for name in ("t.json", "t.json.gz"):
    back = load(save(data, tmp_path / name))
    assert back == json.loads(json.dumps(data))
    check_replays(back)
  assert (tmp_path / "t.json.gz").stat().st_size < (tmp_path / "t.json").stat().st_size


def test_cap_truncates_with_a_marker(recording, monkeypatch):
  monkeypatch.setattr(capture, "MAX_STEPS", 10)
  (Tensor(np.arange(20, dtype=np.float32)).reshape(4, 5) + 1).max(axis=1).numpy()
  assert capture.TRACE.n_steps == 10 and capture.TRACE.truncated
  data = serialize()
  assert data["truncated"] and any(rw["truncated"] for rw in data["rewrites"])
  assert Viewer(data).summary()["truncated"]
  monkeypatch.setattr(capture, "MAX_REWRITES", capture.TRACE.n_rewrites)
  before = len(data["rewrites"])
  (Tensor(np.arange(6, dtype=np.float32)) * 5).numpy()
  assert len(serialize()["rewrites"]) == before


def test_off_records_nothing():
  if capture.VIZ: pytest.skip("VIZ is set in this environment")
  capture.TRACE.clear()
  (UOp.variable("q", 0, 9) * 2 + 0).simplify()
  (Tensor(np.arange(4, dtype=np.float32)) + 7).numpy()
  assert capture.TRACE.groups == [] and capture.TRACE.n_rewrites == 0


def test_rule_errors_are_the_same_when_recording(recording):
  bad = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: 3)])
  capture.enable(viz=False)
  with pytest.raises(RuleError) as off: graph_rewrite(UOp.variable("q", 0, 9) + 1, bad)
  capture.enable(viz=True)
  with pytest.raises(RuleError) as on: graph_rewrite(UOp.variable("q", 0, 9) + 1, bad)
  assert str(on.value) == str(off.value) and "not a UOp" in str(on.value)


def test_node_table_is_hash_consed():
  x = UOp.variable("x", 0, 10)
  t = NodeTable()
  i, j = t.add((x + 1) * 2), t.add(x + 1)
  assert t.rows[i][3][0] == j and t.add(x) == t.rows[j][3][0]
  assert len(t.rows) == len(((x + 1) * 2).toposort())


def test_group_context_nests_and_is_free_when_off():
  if capture.VIZ: pytest.skip("VIZ is set in this environment")
  with capture.group("schedule", lambda: pytest.fail("the name is not built when VIZ is off")) as g: assert g is None
  capture.TRACE.clear()
  capture.enable(viz=True)
  try:
    with capture.group("kernel", "outer"):
      with capture.group("kernel", "inner"): graph_rewrite(UOp.variable("q", 0, 9) * 1, pm_symbolic, name="x")
      graph_rewrite(UOp.variable("q", 0, 9) + 0, pm_symbolic, name="y")
  finally: capture.enable(viz=False)
  names = [(g.name, [r.name for r in g.rewrites]) for g in capture.TRACE.groups]
  capture.TRACE.clear()
  assert names == [("outer", ["y"]), ("inner", ["x"])]
