"""The KFD runtime against the mock KFD (DEV=MOCK+AMD): allocation, copies both ways and between devices, signals and
timestamps, queue values patched at submit, dispatch decoding through the executor hook, JIT replay of copy graphs and
of batched kernels, and the errors a fake GPU must raise (malformed packets, page faults, no executor, no VRAM)."""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amd_helpers import ReferenceExecutor
from test_amd_renderer import elementwise_ast
from plugrad.codegen import get_program
from plugrad.device import Buffer, Device
from plugrad.dtype import dtypes
from plugrad.engine.jit import TinyJit
from plugrad.runtime.hcq import Var
from plugrad import Variable
from plugrad.tensor import Tensor
from plugrad_amd.compiler import AMDGPUCompiler
from plugrad_amd.device import AMDComputeQueue, AMDCopyQueue, AMDDevice, AMDProgram
from plugrad_amd.mock import dispatch
from plugrad_amd.mock.kfd import MockKFD
from plugrad_amd.renderer import AMDGPURenderer

pytestmark = pytest.mark.skipif(shutil.which("clang-19") is None, reason="clang-19 not installed (make sysdeps)")
D0, D1 = "MOCK+AMD", "MOCK+AMD:1"


@pytest.fixture
def executor():
  ex = ReferenceExecutor()
  prev = dispatch.set_executor(ex)
  yield ex
  dispatch.set_executor(prev)


def fresh(vram_mb: int = 64, n: int = 1) -> AMDDevice:
  """A device on its own mock (faults and VRAM limits must not leak into the shared MOCK+AMD)."""
  return AMDDevice("MOCK+AMD", os_iface=MockKFD(n, vram_mb << 20))


def test_open_reports_gfx1100_topology():
  d = Device[D0]
  assert isinstance(d, AMDDevice) and d.arch == "gfx1100" and d.renderer.arch == "gfx1100" and d.props["simd_count"] == 96
  assert Device[D1].gpu_id != d.gpu_id
  with pytest.raises(Exception, match="gfx942"): AMDDevice("MOCK+AMD::gfx942")
  with pytest.raises(Exception, match="there are 2 matching GPU"): AMDDevice("MOCK+AMD:5")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5 << 20), seed=st.integers(0, 2**31))
def test_copies_both_ways(n: int, seed: int):
  data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
  b = Buffer(D0, n, dtypes.uint8).copyin(data)
  assert np.array_equal(b.numpy(), data)


def test_device_to_device_transfer():
  x = np.random.default_rng(1).standard_normal(300_001).astype(np.float32)
  a = Buffer(D0, x.size, dtypes.float32).copyin(x)
  b = Buffer(D1, x.size, dtypes.float32).allocate()
  b.copy_from(a)
  assert np.array_equal(b.numpy(), x)
  c = Buffer(D0, x.size, dtypes.float32).allocate()
  c.copy_from(b)  # and back
  assert np.array_equal(c.numpy(), x)


def test_allocation_accounting_and_out_of_memory():
  d = fresh(vram_mb=16)
  mock = d.os
  used = mock.vram_used[d.gpu_id]
  buf = d.allocator.alloc(8 << 20)
  assert mock.vram_used[d.gpu_id] == used + (8 << 20)
  with pytest.raises(MemoryError, match="out of VRAM"): d.alloc_gpu(32 << 20, "vram")
  d.allocator.free(buf, 8 << 20)
  d.allocator.free_cache()
  assert mock.vram_used[d.gpu_id] == used


@pytest.mark.parametrize("queue", ["compute", "copy"])
def test_signals_and_timestamps(queue: str):
  d = Device[D0]
  q_t = AMDComputeQueue if queue == "compute" else AMDCopyQueue
  s1, s2 = d.signal_t(d, 0), d.signal_t(d, 0)
  q_t().timestamp(s1).signal(s2, 7).submit(d)
  s2.wait(7, 2000)
  assert s2.value == 7 and 0 < s1.timestamp < s2.timestamp
  # a queue waiting on a signal stalls until the host writes it
  gate, done = d.signal_t(d, 0), d.signal_t(d, 0)
  q_t().wait(gate, 3).signal(done, 1).submit(d)
  d.check_fault()
  assert done.value == 0
  gate.value = 3
  done.wait(1, 2000)
  with pytest.raises(TimeoutError, match="did not reach 5"): done.wait(5, 50)


def test_queue_values_patched_at_submit():
  d = Device[D0]
  sig = d.signal_t(d, 0)
  q = AMDComputeQueue().signal(sig, Var("v")).signal(sig, Var("v") + 2)
  for v in (5, 40, 2**33 + 1):
    q.submit(d, {"v": v})
    sig.wait(v + 2, 2000)
    assert sig.value == v + 2
  with pytest.raises(ValueError, match=r"no value for queue variable\(s\) \['v'\]"): q.submit(d)
  # a copy whose addresses and size are Vars
  a, b = Buffer(D0, 1024, dtypes.uint8).copyin(np.arange(1024, dtype=np.uint8)), Buffer(D0, 1024, dtypes.uint8).copyin(np.zeros(1024, np.uint8))
  cq = AMDCopyQueue().copy(Var("dst"), Var("src"), Var("n")).signal(sig, Var("v"))
  cq.submit(d, {"dst": b._buf.va_addr + 10, "src": a._buf.va_addr, "n": 100, "v": 2**34})
  sig.wait(2**34, 2000)
  got = b.numpy()  # b starts zeroed on purpose: fresh VRAM holds whatever an earlier allocation left (as on hardware)
  assert np.array_equal(got[10:110], np.arange(100, dtype=np.uint8)) and not got[:10].any() and not got[110:].any()


def test_dispatch_goes_to_the_executor(executor: ReferenceExecutor):
  x = np.arange(10, dtype=np.float32)
  out = (Tensor(x, device=D0) * 2 + 1).numpy()
  assert np.array_equal(out, x * 2 + 1)
  d = executor.dispatches[-1]
  mem = Device[D0].os
  # kernel_object is the descriptor as loaded, and its code entry offset points into the loaded code
  runner = next(p for p in executor.programs().values() if p.prg.kd_addr == d.kernel_object)
  prg, (groups, block) = runner.prg, runner.spec.launch_dims()  # the launch codegen planned
  assert d.arch == "gfx1100" and d.workgroup_size == block and d.private_segment_size == 0 and block[0] > 1
  assert d.grid_size == tuple(g * b for g, b in zip(groups, block))  # the AQL convention: the grid in work-items
  assert isinstance(prg, AMDProgram) and ctypes.string_at(d.kernel_object, 64) == ctypes.string_at(prg.kd_addr, 64) and prg.entry > d.kernel_object
  assert mem.find(d.kernarg_address, 16, "mapped") is not None


def test_no_executor_is_a_device_fault():
  d = fresh()
  prev = dispatch.set_executor(None)
  try:
    spec = get_program(elementwise_ast(), AMDGPURenderer("gfx1100"))
    prg = d.load(spec.name, d.compiler.compile_cached(spec.src))
    a, b = d.allocator.alloc(64), d.allocator.alloc(64)
    glb, lcl = spec.launch_dims()
    with pytest.raises(RuntimeError, match="no kernel executor for gfx1100"): prg(a, b, global_size=glb, local_size=lcl, wait=True)
  finally: dispatch.set_executor(prev)


def test_malformed_packets_fault_naming_the_packet():
  d = fresh()
  d.compute_ring.submit([0x12345678])
  with pytest.raises(RuntimeError, match="PM4 queue .* is not a type-3 packet"): d.synchronize()
  d = fresh()
  d.sdma_ring.submit([0x000000EE])
  with pytest.raises(RuntimeError, match="SDMA op 0xee"): d.synchronize()
  d = fresh()
  AMDCopyQueue().copy(0x1000, 0x2000, 64).submit(d)  # addresses nothing is mapped at
  with pytest.raises(RuntimeError, match="page fault: access of 64 byte.* at 0x2000"): d.synchronize()


def test_jit_replays_copy_graphs():
  @TinyJit
  def move(x: Tensor) -> Tensor: return x.to(D1).realize()
  for i in range(4):
    x = np.full(1000, i, np.float32) + np.arange(1000, dtype=np.float32)
    y = move(Tensor(x, device=D0).realize())
    assert y.device == D1 and np.array_equal(y.numpy(), x)
  assert move.cnt == 2 and any(ei.runner is None for ei in move.captured), "the copy was captured and replayed"


def test_jit_replays_kernels_as_one_batched_submission(executor: ReferenceExecutor):
  @TinyJit
  def f(x: Tensor) -> Tensor: return ((x * 2).contiguous() + 1).contiguous() * 3
  d = Device[D0]
  for i in range(4):
    x = np.arange(16, dtype=np.float32) + i
    before = d.compute_ring.wptr
    out = f(Tensor(x, device=D0).realize()).numpy()
    assert np.allclose(out, (x * 2 + 1) * 3)
  assert f.plan and any(b is not None for b, _, _ in f.plan), "the replay should use AMDDevice.batch_runner"
  assert d.compute_ring.wptr > before


def test_jit_batches_symbolic_launch_sizes(executor: ReferenceExecutor):
  """Kernels over a symbolic length replay as one batched submission, each DISPATCH_DIRECT's workgroup count patched
  from ProgramSpec.launch_dims with the replay's value (the reference executor asserts every dispatched grid is the
  planned one, and computes the values from the linear IR)."""
  v = Variable("n", 1, 3000)
  x = np.arange(3000, dtype=np.float32) / 7
  xt = Tensor(x, device=D0).realize()
  @TinyJit
  def f(n) -> Tensor: return (((xt[:n] * 2).contiguous() + 1).contiguous() * 3).realize()
  replay_grids = set()
  for i, n in enumerate((5, 300, 2999, 1, 1500, 3000)):
    start = len(executor.dispatches)
    np.testing.assert_allclose(f(v.bind(n)).numpy(), (x[:n] * 2 + 1) * 3, rtol=1e-6)
    if i >= 2: replay_grids |= {d.grid_size for d in executor.dispatches[start:]}
  batches = [b for b, _, _ in f.plan if b is not None]
  assert batches and batches[0].symbolic, "the symbolic kernels should replay through AMDBatch with patched grids"
  assert len(replay_grids) >= 3, replay_grids  # different n launched different grids from the same recorded queue


def test_launch_sizes_are_required_and_the_arch_must_match():
  d = fresh()
  spec = get_program(elementwise_ast(), AMDGPURenderer("gfx1100"))
  prg = d.load(spec.name, d.compiler.compile_cached(spec.src))
  a, b = d.allocator.alloc(64), d.allocator.alloc(64)
  with pytest.raises(ValueError, match="global_size and local_size not given"): prg(a, b)
  with pytest.raises(ValueError, match="local_size not given"): prg(a, b, global_size=(1, 1, 1))
  other = AMDGPUCompiler("gfx1201").compile(get_program(elementwise_ast(), AMDGPURenderer("gfx1201")).src)
  with pytest.raises(ValueError, match="compiled for gfx1201, the device is gfx1100"): d.load(spec.name, other)
