"""The RDNA3 emulator's thread trace: the cycle model (mock/rdna3/timing.py) on hand-built instruction streams with
hand-computed cycles and on real encodings; and end to end on clang-19 kernels (elementwise, an LDS + s_barrier
reduction, a matmul loop): the trace decoded by plugrad_amd.sqtt against the instructions the emulator executed,
recorded independently by wrapping every compiled instruction, and against llvm-objdump-19's text; results with
tracing on equal those with it off; token_exclude; several shader engines."""
from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from rdna3_harness import HAVE_TOOLS, TestMemory, build, kernargs, load, objdump, reduce_source

from plugrad_amd import sqtt
from plugrad_amd.mock import dispatch as mock_dispatch
from plugrad_amd.mock import rdna3
from plugrad_amd.mock.dispatch import Dispatch, TraceTarget, execute
from plugrad_amd.mock.rdna3 import emulator, trace
from plugrad_amd.mock.rdna3.decode import decode_one
from plugrad_amd.mock.rdna3.timing import NO_LIMIT, Op, classify, schedule

V, T4, END, BAR = Op("VALU"), Op("VALU", 4), Op("END"), Op("BARRIER")


def wait(vm: int = NO_LIMIT, vs: int = NO_LIMIT, lgkm: int = NO_LIMIT) -> Op: return Op("WAIT", limits=(vm, vs, lgkm))


def issues(waves, simds, start=0):
  return [(t.issue, t.end) for t in schedule(waves, simds, start)]


def test_waitcnt_waits_for_what_is_outstanding() -> None:
  # s_load at 0 (done 32); s_waitcnt lgkmcnt(0) at 1 holds the wave until 32
  assert issues([[Op("SMEM"), wait(lgkm=0), V, END]], [0]) == [([0, 1, 32, 33], 34)]
  # two loads at 0 and 1 (done 128, 129); vmcnt(1) waits for the first only; vmcnt(0) then for the second
  assert issues([[Op("VMEM_LOAD"), Op("VMEM_LOAD"), wait(vm=1), V, wait(vm=0), END]], [0]) == [([0, 1, 2, 128, 129, 130], 131)]
  # a store does not count against vmcnt, only vscnt; nothing outstanding: no stall
  assert issues([[Op("VMEM_STORE"), wait(vm=0), wait(vs=0), END]], [0]) == [([0, 1, 2, 64], 65)]
  # LDS (16) and SMEM (32) share lgkmcnt: lgkmcnt(1) after both waits for the LDS op to finish
  assert issues([[Op("SMEM"), Op("LDS"), wait(lgkm=1), END]], [0], start=100) == [([100, 101, 102, 117], 118)]


def test_two_waves_share_a_simd_oldest_first() -> None:
  # w0: trans at 0 (busy to 4); w1 trans at 1 (busy to 5); at 4 w0 goes, at 5 both ready: the oldest (w0) issues
  assert issues([[T4, V, END], [T4, V, END]], [0, 0]) == [([0, 4, 5], 6), ([1, 6, 7], 8)]
  # on different SIMDs they do not wait for each other
  assert issues([[T4, V, END], [T4, V, END]], [0, 1]) == [([0, 4, 5], 6), ([0, 4, 5], 6)]


def test_barrier_releases_after_the_last_arrival() -> None:
  assert issues([[V, BAR, V, END], [T4, T4, BAR, V, END]], [0, 1]) == [([0, 1, 9, 10], 11), ([0, 4, 8, 9, 10], 11)]
  # a wave that already ended does not hold the others
  assert issues([[END], [V, BAR, V, END]], [0, 1]) == [([0], 1), ([0, 1, 2, 3], 4)]


def _inst(words: str):
  return decode_one(b"".join(struct.pack("<I", int(w, 16)) for w in words.split()) + bytes(8), 0)


@pytest.mark.parametrize("words, op", [
  ("BF8903F7", Op("WAIT", limits=(0, NO_LIMIT, 63))),         # s_waitcnt vmcnt(0)
  ("BF89FC07", Op("WAIT", limits=(63, NO_LIMIT, 0))),         # s_waitcnt lgkmcnt(0)
  ("BF800003", Op("OTHER", 4)),                               # s_nop 3
  ("F4000080 F8000018", Op("SMEM")),                          # s_load_b32
  ("DC520000 047C0001", Op("VMEM_LOAD")),                     # global_load_b32
  ("DC6A0000 007C0600", Op("VMEM_STORE")),                    # global_store_b32
  ("D73C0001 00020082", Op("VALU", 2)),                       # v_lshlrev_b64
  ("560C0F04", Op("VALU")),                                   # v_fmac_f32
  ("7E024B00", Op("VALU", 4)),                                # v_exp_f32
  ("BFA1FFEB", Op("SALU")),                                   # s_cbranch_scc0
  ("BFBD0000", Op("BARRIER")), ("BFB00000", Op("END")),
])
def test_classify_real_encodings(words: str, op: Op) -> None:
  assert classify(_inst(words)) == op


# ---------------------------------------------------------------- end to end on compiled kernels

pytestmark_tools = pytest.mark.skipif(not HAVE_TOOLS, reason="needs clang-19, ld.lld-19 and llvm-objdump-19 (make sysdeps)")

ELEMENTWISE = """
__kernel void ew(__global float* out, __global const float* a, int n) {
  int i = GID_X * 64 + LID_X;
  if (i >= n) return;
  out[i] = __builtin_expf(a[i]) * 2.0f + __builtin_sqrtf(__builtin_fabsf(a[i]));
}
"""
REDUCE = reduce_source(128, 4)
MATMUL = """
__kernel void mm(__global float* c, __global const float* a, __global const float* b, int n) {
  int r = GID_Y * 8 + LID_Y, col = GID_X * 8 + LID_X;
  float acc = 0.0f;
  for (int k = 0; k < n; k++) acc += a[r * n + k] * b[k * n + col];
  c[r * n + col] = acc;
}
"""


@pytest.fixture(autouse=True)
def _installed():
  rdna3.install()
  yield
  mock_dispatch.set_executor(None)


class Recorder:
  """Every instruction the emulator executes, per wave in execution order: compile_inst is wrapped so each compiled
  instruction notes (wave, PC) before it runs (independent of the emulator's own PC log)."""
  def __init__(self, monkeypatch) -> None:
    self.waves: dict[int, tuple[object, list[int]]] = {}
    real = emulator.compile_inst
    def wrapped(inst, name):
      fn, pc = real(inst, name), inst.addr
      def run(w):
        self.waves.setdefault(id(w), (w, []))[1].append(pc)
        return fn(w)
      return run
    monkeypatch.setattr(emulator, "compile_inst", wrapped)
    monkeypatch.setattr(emulator, "_PROGRAMS", {})

  def groups(self) -> list[list[list[int]]]:
    out: list[list[list[int]]] = []
    for w, pcs in self.waves.values():
      if w.wave_id == 0: out.append([])
      out[-1].append(pcs)
    return out


def objdump_lines(so, kernel: str) -> dict[int, str]:
  """PC -> text of llvm-objdump's lines of `kernel` (parsed here, separately from sqtt.code_listing)."""
  text = objdump(so)
  body = text[text.index(f"<{kernel}>:"):]
  base = int(re.search(rf"([0-9a-f]+) <{kernel}>:", text).group(1), 16)
  out = {}
  for m in re.finditer(r"^\t(.+?)\s*// ([0-9A-F]+): ", body, re.M):
    out[int(m.group(2), 16) - base] = m.group(1)
  return out


def dispatch(mem, co, name, args, fmt, grid, block, targets=(), shader_engines=1):
  execute(mem, Dispatch(co.kernel(name), kernargs(mem, *args, fmt=fmt), grid, block, 0, 0, "gfx1100", tuple(targets), shader_engines))


def target(se=0, exclude=0, sel=(0, 0, 0)):
  buf = bytearray()
  return TraceTarget(se, *sel, exclude, buf.extend), buf


def run_traced(monkeypatch, src, name, make_args, fmt, grid, block, shader_engines=1, sel=(0, 0, 0)):
  """Run once untraced and once traced; returns (so, outputs off, outputs on, recorder, trace bytes)."""
  so = build(src)
  outs, rec, buf = [], None, None
  for traced in (False, True):
    mem = TestMemory()
    co = load(mem, so)
    args, read = make_args(mem)
    if traced:
      rec = Recorder(monkeypatch)
      tt, buf = target(sel=sel)
      dispatch(mem, co, name, args, fmt, grid, block, [tt], shader_engines)
    else: dispatch(mem, co, name, args, fmt, grid, block)
    outs.append(read())
  return so, outs[0], outs[1], rec, bytes(buf)


def traced_waves(groups, shader_engines, sel=(0, 0, 0)):
  """Executed PCs of the waves the trace must carry instructions for: placement restated from trace.py's docstring."""
  out = []
  for g, waves in enumerate(groups):
    j = (g // shader_engines) % 8
    if g % shader_engines == 0 and (j % 2, j // 2) == sel[:2]: out += [w for i, w in enumerate(waves) if i % 4 == sel[2]]
  return out


def check_trace(so, kernel, rec, data, shader_engines=1, sel=(0, 0, 0)) -> list:
  lines = objdump_lines(so, kernel)
  waves = sqtt.wave_traces(data, sqtt.code_listing(objdump(so), kernel), selected=sel)
  with_insts = sorted((w for w in waves if w.insts), key=lambda w: (w.start, w.slot))
  expect = [[pc for pc in pcs if not lines[pc].startswith(("s_delay_alu", "s_endpgm"))] for pcs in traced_waves(rec.groups(), shader_engines, sel)]
  assert [[i.pc for i in w.insts] for w in with_insts] == expect
  on_se0 = sum(len(ws) for g, ws in enumerate(rec.groups()) if g % shader_engines == 0)
  assert len(waves) == on_se0
  for w in with_insts:
    assert all(i.text == lines[i.pc] for i in w.insts)
    cycles = [i.cycle for i in w.insts]
    assert w.start <= cycles[0] and all(a < b for a, b in zip(cycles, cycles[1:])) and cycles[-1] < w.end
    assert all(i.duration > 0 for i in w.insts) and sum(i.duration for i in w.insts) == w.end - cycles[0]
  return waves


@pytestmark_tools
def test_elementwise_trace(monkeypatch) -> None:
  n = 1000
  x = np.random.default_rng(0).uniform(-3, 3, n).astype(np.float32)
  def args(mem):
    po = mem.alloc(4 * n)
    return (po, mem.put(x), n), lambda: mem.get(po, np.float32, n)
  so, off, on, rec, data = run_traced(monkeypatch, ELEMENTWISE, "ew", args, "QQi", (1024, 1, 1), (64, 1, 1))
  np.testing.assert_array_equal(off, on)
  np.testing.assert_allclose(on, np.exp(x.astype(np.float64)) * 2 + np.sqrt(np.abs(x)), rtol=3e-6)
  assert len(data) % 32 == 0
  waves = check_trace(so, "ew", rec, data)
  kinds = {i.kind for w in waves for i in w.insts}
  assert {"SMEM", "WAIT", "VALU", "VMEM"} <= kinds


@pytestmark_tools
def test_reduction_with_lds_and_barriers_trace(monkeypatch) -> None:
  n = 3000
  x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
  def args(mem):
    po = mem.alloc(16)
    return (po, mem.put(x), n), lambda: mem.get(po, np.float32, 4)
  so, off, on, rec, data = run_traced(monkeypatch, REDUCE, "reduce", args, "QQi", (512, 1, 1), (128, 1, 1), sel=(0, 0, 1))
  np.testing.assert_array_equal(off, on)
  ref = [sum(float(x[i]) for i in range(g * 128 + l, n, 512)) for g in range(4) for l in range(128)]
  np.testing.assert_allclose(on, np.array(ref).reshape(4, 128).sum(1), rtol=1e-5, atol=1e-4)
  waves = check_trace(so, "reduce", rec, data, sel=(0, 0, 1))
  kinds = [i.kind for w in waves for i in w.insts]
  assert "BARRIER" in kinds and "LDS" in kinds and "BRANCH" in kinds


@pytestmark_tools
@pytest.mark.parametrize("shader_engines", [1, 2])
def test_matmul_loop_trace(monkeypatch, shader_engines) -> None:
  n = 32
  rng = np.random.default_rng(2)
  a, b = rng.random((n, n), np.float32), rng.random((n, n), np.float32)
  def args(mem):
    pc = mem.alloc(4 * n * n)
    return (pc, mem.put(a), mem.put(b), n), lambda: mem.get(pc, np.float32, n * n).reshape(n, n)
  so, off, on, rec, data = run_traced(monkeypatch, MATMUL, "mm", args, "QQQi", (n, n, 1), (8, 8, 1), shader_engines)
  np.testing.assert_array_equal(off, on)
  np.testing.assert_allclose(on, a.astype(np.float64) @ b, rtol=1e-5)
  waves = check_trace(so, "mm", rec, data, shader_engines)
  branches = [i for w in waves for i in w.insts if i.kind == "BRANCH"]
  assert len(branches) > n  # the loop's backward branch, taken n-1 times per wave
  # one workgroup per WGP at a time: with one shader engine the 16 workgroups take each WGP twice, and the second
  # workgroup on WGP 0 starts when the first one's last wave ended
  starts = sorted({(w.start, w.end) for w in waves if w.cu == 0 and w.simd == 0})
  assert len(starts) == 16 // 8 // shader_engines
  if shader_engines == 1: assert starts[1][0] == max(w.end for w in waves if w.cu == 0 and w.start == starts[0][0])


@pytestmark_tools
def test_token_exclude_and_shader_engines(monkeypatch) -> None:
  so = build(MATMUL)
  mem = TestMemory()
  co = load(mem, so)
  n = 16
  pc = mem.alloc(4 * n * n)
  ts = [target(se, exclude=(1 << 8) | (1 << 2) | (1 << 5)) for se in range(3)]
  dispatch(mem, co, "mm", (pc, mem.put(np.ones((n, n), np.float32)), mem.put(np.ones((n, n), np.float32)), n), "QQQi",
           (n, n, 1), (8, 8, 1), [t for t, _ in ts], shader_engines=3)
  code = sqtt.code_listing(objdump(so), "mm")
  per_se = [sqtt.wave_traces(bytes(buf), code) for _, buf in ts]
  assert [len(ws) for ws in per_se] == [4, 2, 2]  # 4 workgroups of 2 waves over 3 shader engines: 0 and 3 on SE 0
  assert all(not w.insts for ws in per_se for w in ws)
  _, buf = target()
  only_header, buf = target(exclude=(1 << 4) | (1 << 8) | (1 << 2) | (1 << 5))
  dispatch(mem, co, "mm", (pc, mem.put(np.ones((n, n), np.float32)), mem.put(np.ones((n, n), np.float32)), n), "QQQi",
           (n, n, 1), (8, 8, 1), [only_header])
  assert [p.name for p in sqtt.decode(bytes(buf))] == ["LAYOUT_HEADER"] and sqtt.wave_traces(bytes(buf), code) == []
  assert trace.placement(5, 3) == (2, 1, 0)


@pytestmark_tools
def test_bad_shader_engine_count_is_a_clear_error() -> None:
  so = build(MATMUL)
  mem = TestMemory()
  co = load(mem, so)
  pc = mem.alloc(4 * 64)
  with pytest.raises(rdna3.EmulatorError, match="on 0 shader engines"):
    dispatch(mem, co, "mm", (pc, mem.put(np.ones(64, np.float32)), mem.put(np.ones(64, np.float32)), 8), "QQQi", (8, 8, 1), (8, 8, 1),
             [target()[0]], shader_engines=0)
