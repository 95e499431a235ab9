"""SQTT on the runtime side against the mock command processor: what the PM4 programming writes (registers, events,
waits, copies), what a dispatch sees while tracing, the write pointer and overflow accounting read back, and that with
SQTT off no thread-trace register is written at all. The executor here writes known bytes through the dispatch's trace
targets, so these tests pin the command processor and the runtime independently of the emulator's trace writer."""
from __future__ import annotations

import gc as garbage
import os
import shutil
import struct
import subprocess
import sys

import pytest

from test_amd_renderer import elementwise_ast
from plugrad.codegen import get_program
from plugrad.viz import capture
from plugrad_amd import thread_trace
from plugrad_amd.autogen import gc_11_0_0 as gc
from plugrad_amd.autogen import pm4_nv
from plugrad_amd.am.runtime import AMDPCIDevice
from plugrad_amd.device import AMDDevice
from plugrad_amd.mock import dispatch
from plugrad_amd.mock.engines import Engines, PacketError
from plugrad_amd.mock.kfd import MockKFD
from plugrad_amd.mock.pci import MockPlatform
from plugrad_amd.renderer import AMDGPURenderer

pytestmark = pytest.mark.skipif(shutil.which("clang-19") is None, reason="clang-19 not installed (make sysdeps)")
TRACE_REGS = {thread_trace.reg_addr(gc, n, "gfx11") for n in ("SQ_THREAD_TRACE_BUF0_BASE", "SQ_THREAD_TRACE_BUF0_SIZE", "SQ_THREAD_TRACE_CTRL",
              "SQ_THREAD_TRACE_MASK", "SQ_THREAD_TRACE_TOKEN_MASK", "GRBM_GFX_INDEX", "SPI_CONFIG_CNTL")}
TT_ENABLE = 0x1260 + gc.regCOMPUTE_THREAD_TRACE_ENABLE


class TokenWriter:
  """An executor that runs nothing and writes `payload(se)` through each trace target of each dispatch."""
  def __init__(self, payload=lambda se: bytes([0x10 + se]) * 40) -> None:
    self.payload, self.dispatches = payload, []
  def __call__(self, mem, d) -> None:
    self.dispatches.append(d)
    for t in d.sqtt: t.write(self.payload(t.se))


@pytest.fixture
def recording():
  was = (capture.VIZ, capture.PROFILE)
  capture.TRACE.clear()
  capture.enable(profile=True)
  yield capture.TRACE
  capture.enable(*was)
  capture.TRACE.clear()


def launch(dev: AMDDevice):
  spec = get_program(elementwise_ast(), AMDGPURenderer("gfx1100"))
  prg = dev.load(spec.name, dev.compiler.compile_cached(spec.src))
  a, b = dev.allocator.alloc(64), dev.allocator.alloc(64)
  glb, lcl = spec.launch_dims()
  prg(a, b, global_size=glb, local_size=lcl, wait=True)
  return prg


def device(monkeypatch, sqtt: bool, iface: str = "KFD", **env: str) -> tuple[AMDDevice, Engines]:
  """A fresh MOCK+AMD (iface "KFD") or MOCK+PCI+AMD ("PCI") device and its mock command processor."""
  if sqtt: monkeypatch.setenv("SQTT", "1")
  else: monkeypatch.delenv("SQTT", raising=False)
  for k, v in env.items(): monkeypatch.setenv(k, v)
  if iface == "PCI":
    plat = MockPlatform(1, 256 << 20)
    pdev = AMDPCIDevice("MOCK+PCI+AMD", plat)
    return pdev, plat.devices[0].engines
  kfd = MockKFD(1, 256 << 20)
  dev = AMDDevice("MOCK+AMD", os_iface=kfd)
  return dev, kfd.engines[dev.gpu_id]


@pytest.mark.parametrize("iface", ["KFD", "PCI"])
def test_sqtt_off_writes_no_trace_register(monkeypatch, recording, iface):
  dev, eng = device(monkeypatch, sqtt=False, iface=iface)
  ex = TokenWriter()
  prev = dispatch.set_executor(ex)
  try: launch(dev)
  finally: dispatch.set_executor(prev)
  assert dev.tracer is None and len(ex.dispatches) == 1 and ex.dispatches[0].sqtt == ()
  written = {a for (space, a) in eng.written if space == "uconfig"} | {a for (space, a) in eng.written if space == "sh" and a == TT_ENABLE}
  assert not written & (TRACE_REGS | {TT_ENABLE}), sorted(hex(a) for a in written)
  assert not recording.kernel_traces


@pytest.mark.parametrize("iface", ["KFD", "PCI"])
def test_traced_launch_programs_every_shader_engine(monkeypatch, recording, iface):
  dev, eng = device(monkeypatch, sqtt=True, iface=iface, SQTT_SIMD_SEL="2", SQTT_WGP_SEL="3", SQTT_SA_SEL="1", SQTT_ITRACE_SE_MASK="5",
                    SQTT_BUFFER_SIZE="1")
  assert dev.tracer is not None and dev.tracer.n_se == 6 and dev.tracer.clock_hz == 2.5e9
  ex = TokenWriter()
  prev = dispatch.set_executor(ex)
  try:
    dev.tracer.record = lambda prg, st, ses: setattr(dev.tracer, "last", ses)  # the decoder is tested elsewhere: keep the raw read-back
    launch(dev)
  finally: dispatch.set_executor(prev)
  (d,) = ex.dispatches
  assert [t.se for t in d.sqtt] == list(range(6)) and d.shader_engines == 6
  assert {(t.sa_sel, t.wgp_sel, t.simd_sel) for t in d.sqtt} == {(1, 3, 2)}
  inst_bits = sum(1 << b for b in thread_trace.INST_TOKENS)
  assert [bool(t.token_exclude & inst_bits) for t in d.sqtt] == [se not in (0, 2) for se in range(6)]  # SQTT_ITRACE_SE_MASK=0b101
  for se, r in enumerate(dev.tracer.last):  # 40 bytes written -> two 32-byte lines, the tail zero-filled
    assert r.data == bytes([0x10 + se]) * 40 + bytes(24) and not r.full and r.dropped == 0
  assert all(not t.on and not t.armed for t in eng.tt) and eng.grbm_se is None and not eng.sh_reg("COMPUTE_THREAD_TRACE_ENABLE")
  addrs = {b.va_addr for b in dev.tracer.buffers}
  assert len(addrs) == 6 and all(eng.trace_buffer(t) == (b.va_addr, 1 << 20) for t, b in zip(eng.tt, dev.tracer.buffers))


def test_overflow_is_counted_and_warned(monkeypatch, recording):
  dev, eng = device(monkeypatch, sqtt=True, SQTT_BUFFER_SIZE="1")
  ex = TokenWriter(lambda se: bytes([0x10]) * ((1 << 20) + 100 if se == 4 else 32))
  prev = dispatch.set_executor(ex)
  try:
    seen = []
    dev.tracer.record = lambda prg, st, ses: seen.append(ses)
    launch(dev)
  finally: dispatch.set_executor(prev)
  ses = seen[0]
  assert ses[4].full and ses[4].dropped == 100 and len(ses[4].data) == 1 << 20
  assert not ses[0].full and len(ses[0].data) == 32


def test_no_start_event_traces_nothing():
  """MODE=ON alone does not trace: a dispatch before THREAD_TRACE_START (or after STOP) gets no trace targets."""
  eng = Engines()
  e = thread_trace.Emitter(gc, "gfx11")
  e.select_se(0)
  e.uconfig("SQ_THREAD_TRACE_BUF0_SIZE", thread_trace.fields(gc, "SQ_THREAD_TRACE_BUF0_SIZE", size=1))
  e.uconfig("SQ_THREAD_TRACE_MASK", thread_trace.fields(gc, "SQ_THREAD_TRACE_MASK", wtype_include=0x40))
  e.ctrl(True)
  e.select_se(None)
  e.sh("COMPUTE_THREAD_TRACE_ENABLE", 1)
  run(eng, e.words)
  assert eng.tt[0].on and not eng.tt[0].armed and eng.trace_targets(None) == ()
  run(eng, start_event())
  assert [t.se for t in eng.trace_targets(None)] == [0]


def start_event() -> list[int]:
  e = thread_trace.Emitter(gc, "gfx11")
  e.event(thread_trace.soc21_enum.THREAD_TRACE_START)
  return e.words


class Mem:
  def __init__(self) -> None: self.data: dict[int, bytes] = {}
  def write(self, addr: int, b: bytes) -> None: self.data[addr] = b
  def u32(self, addr: int) -> int: return struct.unpack("<I", self.data.get(addr, bytes(4))[:4])[0]


def run(eng: Engines, words: list[int], mem=None) -> int:
  """Execute PM4 words on the mock command processor; returns how many dwords it consumed."""
  mem = mem or Mem()
  i = 0
  while i < len(words):
    n = eng.pm4(mem, lambda k: words[i + k], len(words) - i)
    if n == 0: return i
    i += n
  return i


def test_register_waits_and_copies():
  eng, mem = Engines(), Mem()
  words = thread_trace.stop_words(gc, "gfx11", 2, 0x5000)
  assert run(eng, words, mem) == len(words)  # nothing traced: FINISH_PENDING and BUSY already read 0
  assert mem.u32(0x5000) == 0 and mem.u32(0x5010) == 0
  e = thread_trace.Emitter(gc, "gfx11")
  e.ctrl(True)
  e.wait_status("busy")
  stalled = run(eng, e.words)
  assert 0 < stalled < len(e.words)  # BUSY stays set while MODE=ON: the wait holds the queue there


@pytest.mark.parametrize("bad, match", [
  (lambda e: e.event(0x3F), "EVENT_WRITE event type 0x3f"),
  (lambda e: e.pkt3(pm4_nv.PACKET3_COPY_DATA, 7, 0, 0, 0x1000, 0), "COPY_DATA src_sel 7"),
  (lambda e: e.uconfig("GRBM_GFX_INDEX", thread_trace.fields(gc, "GRBM_GFX_INDEX", se_index=9)), "shader engine 9"),
  (lambda e: e.uconfig("SQ_THREAD_TRACE_CTRL", thread_trace.fields(gc, "SQ_THREAD_TRACE_CTRL", mode=3)), "MODE 3"),
])
def test_bad_programming_is_a_packet_error(bad, match):
  e = thread_trace.Emitter(gc, "gfx11")
  bad(e)
  with pytest.raises(PacketError, match=match): run(Engines(), e.words)


def test_programming_helpers_refuse_bad_values():
  with pytest.raises(ValueError, match="SQ_THREAD_TRACE_MASK.simd_sel = 0x4 does not fit"):
    thread_trace.fields(gc, "SQ_THREAD_TRACE_MASK", simd_sel=4)
  with pytest.raises(ValueError, match="not 4 KiB aligned"):
    thread_trace.start_words(gc, "gfx11", [(0x1800, 0x1000)], thread_trace.TraceSettings())
  with pytest.raises(NotImplementedError, match="gfx11"): thread_trace.Emitter(gc, "gfx12")
  info = struct.pack("<III", ((0x10000 >> 5) + 3), 0, 0)
  assert thread_trace.trace_bytes(gc, info, 0x10000, 0x1000) == (96, 0, 0)
  with pytest.raises(RuntimeError, match="outside the"): thread_trace.trace_bytes(gc, struct.pack("<III", 0, 0, 0), 0x10000, 0x1000)


def test_sqtt_without_profile_or_viz_warns(monkeypatch):
  was = (capture.VIZ, capture.PROFILE)
  capture.enable(viz=False, profile=False)
  try:
    with pytest.warns(RuntimeWarning, match="SQTT=1 records traces only with PROFILE=1 or VIZ=1"): device(monkeypatch, sqtt=True)
  finally: capture.enable(*was)


@pytest.mark.parametrize("iface", ["KFD", "PCI"])
def test_traced_launch_on_the_emulator_records_the_kernels_waves(monkeypatch, recording, iface):
  """The whole path on the real emulator: programmed trace, emulator packets, read back, decoded onto the code object's
  disassembly, recorded as a KernelTrace; the kernel's results are the untraced ones."""
  dev, _ = device(monkeypatch, sqtt=True, iface=iface, SQTT_BUFFER_SIZE="1")
  spec = get_program(elementwise_ast(64), AMDGPURenderer("gfx1100"))
  prg = dev.load(spec.name, dev.compiler.compile_cached(spec.src))
  a, b = dev.allocator.alloc(256), dev.allocator.alloc(256)
  dev.allocator._copyin(b, memoryview(bytearray(struct.pack("<64f", *range(64)))))
  glb, lcl = spec.launch_dims()
  prg(a, b, global_size=glb, local_size=lcl)
  out = bytearray(256)
  dev.allocator._copyout(memoryview(out), a)
  assert struct.unpack("<64f", out) == tuple(2.0 * i + 1 for i in range(64))
  (kt,) = recording.kernel_traces
  assert kt.kernel == spec.name and kt.device == dev.device and kt.clock_hz > 0 and not kt.truncated
  traced = [w for w in kt.waves if w.insts]
  assert kt.waves and traced and all(w.start <= w.insts[0].cycle and w.insts[-1].cycle <= w.end for w in traced)
  listing = prg.disassembly()
  assert all(i.text in listing for w in traced for i in w.insts) and any(i.kind == "VMEM" for w in traced for i in w.insts)


JIT_PROGRAM = """
import numpy as np
from plugrad import Tensor, TinyJit
from plugrad.viz import capture
@TinyJit
def step(x): return (x * 2 + 1).contiguous()
for i in range(4): assert (step(Tensor(np.full(8, i, np.float32))).numpy() == 2 * i + 1).all()
print(len(capture.TRACE.kernel_traces), sum(1 for e in capture.TRACE.events if e.kind == "kernel"))
"""


def test_tinyjit_replays_are_traced_one_launch_at_a_time(tmp_path):
  """With SQTT on, TinyJit's batched replay gives way to single launches, each traced (and the results stay right)."""
  env = {**os.environ, "DEV": "MOCK+AMD", "SQTT": "1", "PROFILE": "1", "PROFILE_PATH": str(tmp_path / "p.json")}
  out = subprocess.run([sys.executable, "-c", JIT_PROGRAM], env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  traces, launches = map(int, out.stdout.split())
  assert traces == launches >= 4


def test_the_tracer_keeps_no_listing_of_a_freed_program(monkeypatch, recording):
  """A traced program's code listing is cached only while the program lives: the cache was keyed by id(), which a
  later program can reuse (then it would be decoded against the wrong kernel's code)."""
  dev, _ = device(monkeypatch, sqtt=True, SQTT_BUFFER_SIZE="1")
  spec = get_program(elementwise_ast(), AMDGPURenderer("gfx1100"))
  prg = dev.load(spec.name, dev.compiler.compile_cached(spec.src))
  a, b = dev.allocator.alloc(64), dev.allocator.alloc(64)
  glb, lcl = spec.launch_dims()
  prg(a, b, global_size=glb, local_size=lcl)
  assert len(dev.tracer.listings) == 1 and recording.kernel_traces
  del prg
  garbage.collect()
  assert len(dev.tracer.listings) == 0
