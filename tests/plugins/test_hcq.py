"""HCQ layer, exercised through the pure-software reference device: record once, submit many times with patched values."""
from __future__ import annotations
import time
import numpy as np
import pytest
from plugrad.device import BufferOptions
from plugrad.runtime.hcq import HWQueue, Var
from plugrad.runtime.softhcq import SoftDevice, SoftSignal

KERNEL = """
def add(global_size, local_size, out, a, k):
  o, x = out.cast('i'), a.cast('i')
  for i in range(global_size[0]): o[i] = x[i] + k
"""

@pytest.fixture
def dev():
  d = SoftDevice("SOFT", hang_timeout_ms=300, timeout_ms=2000)
  yield d
  d.finalize()

def host(dev, arr):
  b = dev.allocator.alloc(arr.nbytes, BufferOptions(host=True))
  dev.allocator.copyin(b, memoryview(arr).cast("B"))
  return b

def test_copy_roundtrip_through_staging(dev):
  dev.allocator.staging_size = 16  # force chunking
  b = dev.allocator.alloc(40)
  dev.allocator.copyin(b, memoryview(np.arange(10, dtype=np.int32)).cast("B"))
  out = bytearray(40)
  dev.allocator.copyout(memoryview(out), b)
  assert np.frombuffer(out, np.int32).tolist() == list(range(10))
  assert dev.timeline_signal.value == dev.timeline_value - 1

def test_program_launch_and_timing(dev):
  a, out = host(dev, np.arange(4, dtype=np.int32)), dev.allocator.alloc(16)
  prg = dev.load("add", dev.compiler.compile_cached(KERNEL))
  t = prg(out, a, global_size=(4, 1, 1), vals=(10,), wait=True)
  assert isinstance(t, float) and 0 <= t < 5
  assert np.frombuffer(out.view, np.int32).tolist() == [10, 11, 12, 13]
  assert prg(out, a, global_size=(4,), vals=(1,)) is None
  dev.synchronize()
  assert dev.executed == 2

def test_record_once_submit_many_with_patched_values(dev):
  a, out = host(dev, np.arange(4, dtype=np.int32)), dev.allocator.alloc(16)
  prg = dev.load("add", KERNEL.encode())
  gate, done = SoftSignal(dev), SoftSignal(dev)
  q = dev.hw_compute_queue_t().wait(gate, Var("t")).exec(prg, prg.fill_kernargs((out, a), (5,)), (Var("n"), 1, 1), (1, 1, 1)) \
    .timestamp(done).signal(done, Var("t") + 1)
  assert q.variables() == {"t", "n"}
  stamps = []
  for t in range(3):  # the same recorded queue, three submits with different signal values and grid sizes
    np.frombuffer(out.view, np.int32)[:] = -1
    gate.value = t
    q.submit(dev, {"t": t, "n": 2 + t})
    done.wait(t + 1, timeout_ms=2000)
    stamps.append(done.timestamp)
    assert np.frombuffer(out.view, np.int32).tolist() == [5 + i if i < 2 + t else -1 for i in range(4)]
  assert dev.executed == 3 and done.value == 3 and stamps == sorted(stamps) and stamps[0] > 0
  with pytest.raises(ValueError, match=r"no value for queue variable\(s\) \['n', 't'\]"): q.submit(dev)

def test_bind_defaults_and_copy_with_var_size(dev):
  src, dst = host(dev, np.arange(8, dtype=np.uint8)), dev.allocator.alloc(8)
  np.frombuffer(dst.view, np.uint8)[:] = 0
  done = SoftSignal(dev)
  q = dev.hw_copy_queue_t().copy(dst.va_addr, src.va_addr, Var("nbytes")).signal(done, Var("v")).bind(nbytes=3)
  q.submit(dev, {"v": 1}); done.wait(1)
  assert bytes(dst.view) == bytes([0, 1, 2, 0, 0, 0, 0, 0])
  q.submit(dev, {"v": 2, "nbytes": 6}); done.wait(2)
  assert bytes(dst.view) == bytes([0, 1, 2, 3, 4, 5, 0, 0])

def test_signal_wait_timeout_is_clear(dev):
  sig = SoftSignal(dev, 5)
  st = time.monotonic()
  with pytest.raises(TimeoutError, match=r"did not reach 6 within 50 ms \(current value 5\)"): sig.wait(6, timeout_ms=50)
  assert time.monotonic() - st < 1
  sig.wait(5, timeout_ms=0)  # already reached: no wait

def test_cross_queue_ordering(dev):
  gate, done = SoftSignal(dev), SoftSignal(dev)
  dev.hw_compute_queue_t().wait(gate, 1).signal(done, 7).submit(dev)
  time.sleep(0.02)
  assert done.value == 0  # blocked on the gate
  gate.value = 1
  done.wait(7, timeout_ms=2000)

def test_hung_queue_faults_device(dev):
  never = SoftSignal(dev)
  dev.hw_compute_queue_t().wait(never, 1).signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
  with pytest.raises(RuntimeError, match="device SOFT faulted: TimeoutError: queue wait .* hung for 300 ms"): dev.synchronize()

def test_kernel_exception_faults_device(dev):
  prg = dev.load("boom", b"def boom(g, l):\n  raise ValueError('bad access at 0x10')\n")
  with pytest.raises(RuntimeError, match="faulted: ValueError: bad access at 0x10"): prg(wait=True)

def test_queue_argument_validation(dev):
  q = dev.hw_compute_queue_t()
  with pytest.raises(TypeError, match="needs a Signal"): q.signal(3, 1)
  with pytest.raises(ValueError, match="signal value must be an int >= 0 or a Var"): q.signal(SoftSignal(dev), -1)
  with pytest.raises(ValueError, match="global_size must be 1 to 3 dims"): q.exec(None, None, (), (1,))
  with pytest.raises(ValueError, match="local_size entry must be an int >= 1"): q.exec(None, None, (1,), (0,))
  with pytest.raises(SyntaxError): dev.compiler.compile("def (")

def test_offset_views_and_transfer_between_devices(dev):
  other = SoftDevice("SOFT:1", hang_timeout_ms=300, timeout_ms=2000)
  try:
    src = host(dev, np.arange(8, dtype=np.int32))
    dst = other.allocator.alloc(16)
    dev.allocator.transfer(dst, dev.allocator.offset(src, 16, 16), 16, dev, other)
    other.synchronize()
    assert np.frombuffer(dst.view, np.int32).tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="outside buffer"): src.offset(30, 4)
  finally: other.finalize()

def test_base_queue_needs_backend(dev):
  with pytest.raises(NotImplementedError, match="_submit is not implemented"): HWQueue().memory_barrier().submit(dev)
