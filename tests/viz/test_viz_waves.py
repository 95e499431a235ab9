"""Device instruction traces (capture.KernelTrace: SQTT on AMD) in the saved trace, the viewer's /api/waves routes and the
Perfetto profile, on the hand-built trace of viz_helpers.py (hot-instruction sums worked out by hand there)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from plugrad.viz.capture import ProfileEvent, Trace
from plugrad.viz.profile import chrome_trace
from plugrad.viz.trace import load, save, serialize
from plugrad.viz.waves import KINDS, decode, encode

from test_viz_profile import check_schema
from viz_helpers import HOT, WAVES, big_kernel_trace, free_port, synthetic_kernel_trace, wait_for_line

FUZZ = int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200"))


def traced(*kts, t0: int = 1_000_000) -> Trace:
  t = Trace()
  t.t0 = t0
  for kt in kts: t.kernel_trace(kt)
  return t


def test_saved_trace_round_trip(tmp_path):
  small, big = synthetic_kernel_trace(st=1_250_000), big_kernel_trace(5000, st=2_000_000)
  data = serialize(traced(small, big))
  assert len(data["waves"]) == 2 and data["waves"][0]["texts"] == sorted(set(data["waves"][0]["texts"]), key=data["waves"][0]["texts"].index)
  assert len(data["waves"][0]["texts"]) == 4, "each distinct instruction text is stored once"
  assert not [e for e in data["profile"]["traceEvents"] if e.get("cat") in ("wave", "inst")], "kept once, compact, in `waves`"
  back = load(save(data, tmp_path / "t.json.gz"))
  assert decode(back["waves"][0]) == replace(small, st=250_000), "st is kept relative to the recording's start"
  assert decode(back["waves"][1]) == replace(big, st=1_000_000)


def test_trace_saved_before_waves_still_loads(tmp_path):
  old = serialize(traced())
  del old["waves"]
  data = load(save(old, tmp_path / "old.json"))
  assert data["waves"] == []
  from plugrad.viz.server import Viewer
  v = Viewer(data)
  assert v.waves() == {"launches": []} and v.summary()["waves"] == 0
  with pytest.raises(KeyError, match="no traced launch 0"): v.wave_launch(0)
  broken = Viewer({**data, "waves": [{**encode(synthetic_kernel_trace(), 0), "clock_hz": -1}]})
  with pytest.raises(ValueError, match="traced launch 0: clock_hz -1 is not a positive number"): broken.waves()
  (tmp_path / "bad.json").write_text(json.dumps({**old, "waves": {"a": 1}}))
  with pytest.raises(ValueError, match="not a list of traced launches"): load(tmp_path / "bad.json")


@pytest.mark.parametrize("mutate, msg", [
  (lambda d: d.update(clock_hz=0), "clock_hz 0 is not a positive"),
  (lambda d: d.update(texts=[1]), "texts is not a list of strings"),
  (lambda d: d["waves"][0].__setitem__(0, "0"), "wave 0\\[0\\] is '0', not an integer"),
  (lambda d: d["waves"][1][6][2].__setitem__(3, len(KINDS)), "wave 1 instruction 2: kind 9"),
  (lambda d: d["waves"][0][6][0].__setitem__(4, 99), "text 99 is not one of the launch's 4"),
  (lambda d: d["waves"].append([0, 0]), "wave 5 is not \\[se,"),
  (lambda d: d.pop("texts"), "not a saved instruction trace"),
])
def test_bad_saved_waves_are_named(mutate, msg):
  d = json.loads(json.dumps(encode(synthetic_kernel_trace(), 0)))
  mutate(d)
  with pytest.raises(ValueError, match=msg): decode(d)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=6) | st.dictionaries(st.text(max_size=8), c, max_size=6), max_leaves=30)


@settings(max_examples=FUZZ, deadline=None, database=None, derandomize=FUZZ <= 200)
@given(st.data())
def test_fuzz_decode_is_a_trace_or_a_value_error(data):
  """Any JSON in place of a saved launch, or a saved launch with one value swapped for random JSON: decode gives a
  KernelTrace or a ValueError, nothing else."""
  d = json.loads(json.dumps(encode(synthetic_kernel_trace(), 0)))
  spot = data.draw(st.sampled_from(["all", "key", "wave", "inst"]))
  junk = data.draw(JSON)
  if spot == "all": d = junk
  elif spot == "key": d[data.draw(st.sampled_from(sorted(d)))] = junk
  elif spot == "wave": d["waves"][data.draw(st.integers(0, 4))][data.draw(st.integers(0, 6))] = junk
  else: d["waves"][0][6][data.draw(st.integers(0, 3))][data.draw(st.integers(0, 4))] = junk
  try: kt = decode(d)
  except ValueError: return
  assert all(isinstance(i.text, str) and i.kind in KINDS for w in kt.waves for i in w.insts)


def r9(x: float) -> float: return round(x, 9)


def test_chrome_trace_places_waves_on_the_device():
  t0 = 1_000_000
  kt = synthetic_kernel_trace(kernel="r_4_8", device="AMD", st=t0 + 5_000)  # launched 5 us in; 2 GHz: 0.0005 us a cycle
  t = traced(kt, t0=t0)
  t.event(ProfileEvent("kernel", "r_4_8", "AMD", t0 + 4_000, t0 + 6_000))
  tr = json.loads(json.dumps(chrome_trace(t)))
  timed = check_schema(tr)
  procs = {e["args"]["name"]: e["pid"] for e in tr["traceEvents"] if e["name"] == "process_name"}
  threads = {e["tid"]: e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "thread_name" and e["pid"] == procs["AMD"]}
  slots = {tid: name for tid, name in threads.items() if name.startswith("SE")}
  assert sorted(slots.values()) == ["SE0 CU0 SIMD0 wave 0", "SE0 CU0 SIMD0 wave 1", "SE0 CU0 SIMD1 wave 0", "SE0 CU0 SIMD1 wave 1"]
  by_name = {v: k for k, v in slots.items()}
  waves = [e for e in timed if e["cat"] == "wave"]
  assert len(waves) == len(WAVES) and all(e["name"] == "r_4_8" and e["pid"] == procs["AMD"] for e in waves)
  expect_waves = sorted((r9(5 + a * 0.0005), by_name[f"SE{se} CU{cu} SIMD{simd} wave {slot}"], len(ins)) for se, cu, simd, slot, a, _, ins in WAVES)
  assert sorted((r9(e["ts"]), e["tid"], e["args"]["instructions"]) for e in waves) == expect_waves
  insts = [e for e in timed if e["cat"] == "inst"]
  expect = sorted((r9(5 + c * 0.0005), r9(d * 0.0005), by_name[f"SE{se} CU{cu} SIMD{simd} wave {slot}"], pc, c, d)
                  for se, cu, simd, slot, _, _, ins in WAVES for pc, c, d in ins)
  got = sorted((r9(e["ts"]), r9(e["dur"]), e["tid"], e["args"]["pc"], e["args"]["cycle"], e["args"]["duration"]) for e in insts)
  assert got == expect
  assert {e["name"] for e in insts if e["args"]["pc"] == 8} == {"s_waitcnt lgkmcnt(0)"}
  assert {e["args"]["kind"] for e in insts} == {"SMEM", "WAIT", "VALU", "OTHER"}
  assert not [e for e in insts if "SIMD1" in slots[e["tid"]]], "waves without instructions are a bar only"
  order = [e["cat"] for e in timed]
  assert order.index("kernel") < order.index("wave"), "the launch (4 us) comes before its first wave (5.005 us)"


@pytest.fixture(scope="module")
def waves_server(tmp_path_factory):
  pytest.importorskip("starlette")
  path = tmp_path_factory.mktemp("waves") / "t.json"
  save(serialize(traced(synthetic_kernel_trace(kernel="r_4_8", st=1_010_000))), path)
  port = free_port()
  proc = subprocess.Popen([sys.executable, "-m", "plugrad.viz", str(path), "--port", str(port)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try: yield wait_for_line(proc, "VIZ: open ").split()[2]
  finally:
    proc.terminate()
    proc.wait(10)
    proc.stdout.close()


def get(url: str) -> tuple[int, dict | str]:
  from test_viz_server import get as get_
  return get_(url)


def test_api_lists_and_shows_traced_launches(waves_server):
  url = waves_server
  code, tr = get(url + "api/trace")
  assert code == 200 and tr["waves"] == 1
  code, ws = get(url + "api/waves")
  n_inst = sum(len(w[6]) for w in WAVES)
  assert code == 200 and ws["launches"] == [{"index": 0, "kernel": "r_4_8", "device": "AMD", "waves": 5, "instructions": n_inst,
                                             "cycles": 90 - 10, "st_us": 10.0, "clock_hz": 2e9, "truncated": False}]
  code, one = get(url + "api/waves/0")
  assert code == 200 and one["launch"] == ws["launches"][0] and one["span"] == [10, 90]
  assert [(w["se"], w["cu"], w["simd"], w["slot"], w["start"], w["end"]) for w in one["waves"]] == [w[:6] for w in WAVES]
  got = [[(i[0], i[1], i[2], one["texts"][i[4]], one["kinds"][i[3]]) for i in w["insts"]] for w in one["waves"]]
  from viz_helpers import PROGRAM
  assert got == [[(pc, c, d, *PROGRAM[pc]) for pc, c, d in w[6]] for w in WAVES]
  assert [(h["pc"], h["text"], h["count"], h["total"]) for h in one["hot"]] == HOT
  assert [h["mean"] for h in one["hot"]] == pytest.approx([total / n for _, _, n, total in HOT])
  code, err = get(url + "api/waves/1")
  assert code == 404 and err["error"] == "no traced launch 1 (the trace has 1)"
  code, _ = get(url + "api/waves/x")
  assert code == 404


@settings(max_examples=min(FUZZ, 60), deadline=None, database=None, derandomize=FUZZ <= 200)
@given(k=st.one_of(st.integers(0, 2**70), st.text(alphabet="0123456789-x/%.", min_size=1, max_size=12)))
def test_fuzz_waves_route_answers_200_or_404(waves_server, k):
  import urllib.parse
  code, body = get(waves_server + "api/waves/" + urllib.parse.quote(str(k), safe=""))
  assert code in (200, 404), (k, code, body)
  if code == 200: assert body["launch"]["index"] == 0
