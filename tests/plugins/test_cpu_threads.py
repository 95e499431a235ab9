"""The threaded CPU launcher: kernels split their outer loop across the C thread pool (CPU_THREADS cores)."""
from __future__ import annotations

import gc
import multiprocessing as mp
import threading

import numpy as np
import pytest

from plugrad.device import Device
from plugrad.engine.realize import buffer_for, runner_of
from plugrad.tensor import Tensor

RNG = np.random.default_rng(1)


@pytest.fixture(autouse=True)
def _collect_before_registry_load():
  """Free earlier tests' Buffers now: a Buffer.__del__ that runs inside the registry's first load re-enters its
  non-reentrant lock and deadlocks (core bug, reported; plugins/loader.py get_registry + device.Buffer.allocator)."""
  gc.collect()
  Device["CPU"]


def run(t: Tensor, threads: int) -> tuple[np.ndarray, int]:
  """Run `t`'s single kernel with `threads` cores allowed: (result, cores the launcher picked)."""
  dev = Device["CPU"]
  (it,) = t.schedule()
  prg = runner_of(it).prg
  bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
  old, dev.threads = dev.threads, threads
  try:
    prg(*bufs, vals=tuple(it.var_vals.values()))
    return bufs[0].copy(), prg.threads_for(tuple(it.var_vals.values()))
  finally: dev.threads = old


def test_threads_give_identical_results():
  a, b = RNG.standard_normal((64, 96)).astype(np.float32), RNG.standard_normal((96, 80)).astype(np.float32)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  x = Tensor(RNG.standard_normal(1 << 18).astype(np.float32)).realize()
  c = Tensor(RNG.standard_normal((512, 384)).astype(np.float32)).realize()
  for t in ((ta.reshape(64, 96, 1) * tb.reshape(1, 96, 80)).sum(1), (x * 2 + 1).exp2(), c.sum(1), c.max(0)):
    one, n1 = run(t, 1)
    two, n2 = run(t, 2)
    three, _ = run(t, 3)  # more cores than the machine has: still a partition of the outer loop
    assert n1 == 1 and n2 == 2
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, three)
  np.testing.assert_allclose(run(ta.sum(1), 2)[0].view(np.float32), a.sum(1), rtol=1e-5, atol=1e-5)


def test_small_and_scalar_kernels_use_one_thread():
  x = Tensor(np.arange(5, dtype=np.float32)).realize()
  out, n = run(x + 1, 8)
  assert n == 1 and out.view(np.float32).tolist() == [1, 2, 3, 4, 5]
  out, n = run(Tensor(np.full(1, 3, np.float32)).realize() * 2, 8)  # 1 element: no global range at all
  assert n == 1 and out.view(np.float32).tolist() == [6]
  y = Tensor(RNG.standard_normal(1 << 12).astype(np.float32)).realize()
  out, n = run(y.sum(), 8)  # a small full reduction: one kernel, nothing to split
  assert n == 1 and abs(out.view(np.float32)[0] - y.numpy().sum(dtype=np.float64)) < 1e-3


def test_large_full_reduction_runs_on_all_cores():
  """A full reduction of 2**18 elements is two kernels: 256 partial sums (spread over the cores), then their sum."""
  y = Tensor(RNG.standard_normal(1 << 18).astype(np.float32)).realize()
  items = y.sum().schedule()
  assert len(items) == 2
  part = runner_of(items[0]).prg
  old, Device["CPU"].threads = Device["CPU"].threads, 8
  try: assert part.threads_for(()) > 1
  finally: Device["CPU"].threads = old
  assert abs(y.sum().item() - y.numpy().sum(dtype=np.float64)) < 1e-2 and y.max().item() == y.numpy().max()


def test_outer_loop_smaller_than_thread_count():
  x = RNG.standard_normal((2, 1 << 17)).astype(np.float32)
  out, n = run(Tensor(x).realize().sum(1), 8)
  assert n == 2  # the outer loop has 2 iterations: never more cores than that
  np.testing.assert_allclose(out.view(np.float32), x.sum(1), rtol=1e-4)


def test_concurrent_launches_from_python_threads():
  x = Tensor(RNG.standard_normal(1 << 18).astype(np.float32)).realize()
  want = run(x * 3, 2)[0]
  errs: list[BaseException] = []
  def worker():
    try:
      for _ in range(20): np.testing.assert_array_equal(run(x * 3, 2)[0], want)
    except BaseException as e: errs.append(e)
  ths = [threading.Thread(target=worker) for _ in range(3)]
  for t in ths: t.start()
  for t in ths: t.join(60)
  assert not errs and not any(t.is_alive() for t in ths)


def _child(q) -> None:
  x = np.arange(1 << 18, dtype=np.float32)
  out, n = run(Tensor(x).realize() + 1, 2)
  q.put((n, bool((out.view(np.float32) == x + 1).all())))


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_pool_works_after_fork():
  run(Tensor(np.ones(1 << 18, np.float32)).realize() + 1, 2)  # workers exist in the parent
  ctx = mp.get_context("fork")
  q = ctx.Queue()
  p = ctx.Process(target=_child, args=(q,))
  p.start()
  p.join(60)
  if p.is_alive(): p.kill()
  assert p.exitcode == 0 and q.get(timeout=5) == (2, True)


def test_cpu_threads_env_validated(monkeypatch: pytest.MonkeyPatch):
  from plugrad_cpu.device import CPUDevice
  monkeypatch.setenv("CPU_THREADS", "0")
  with pytest.raises(ValueError, match="CPU_THREADS must be >= 1"): CPUDevice("CPU")
  monkeypatch.setenv("CPU_THREADS", "3")
  assert CPUDevice("CPU").threads == 3


def test_spin_env(monkeypatch: pytest.MonkeyPatch):
  """CPU_SPIN_US: how long workers spin after a job (default 1 ms); a pool loaded under it runs with it (negative:
  refused by the device, clamped to 0 by the library)."""
  from plugrad.device import Device
  from plugrad_cpu import device as cpu_device
  from plugrad_cpu.device import spin_us
  monkeypatch.delenv("CPU_SPIN_US", raising=False)
  assert spin_us() == 1000
  monkeypatch.setenv("CPU_SPIN_US", "-1")
  with pytest.raises(ValueError, match="CPU_SPIN_US must be >= 0"): spin_us()
  monkeypatch.setenv("CPU_SPIN_US", "250")
  monkeypatch.setattr(cpu_device, "_POOLS", {})   # load the (process-wide) pool library again: it reads the setting
  lib = Device["CPU"]._pool_lib()
  try:
    assert lib.plugrad_pool_spin_ns() == 250_000
    lib.plugrad_pool_set_spin_ns(-5)
    assert lib.plugrad_pool_spin_ns() == 0
  finally:
    monkeypatch.undo()
    lib.plugrad_pool_set_spin_ns(spin_us() * 1000)


SUB = np.array([1e-38, 3e-39, -2e-39, 2e-38, 1.0], np.float32)   # float32's smallest normal is 1.18e-38


def ftz(a: np.ndarray) -> np.ndarray: return np.where(np.abs(a) < np.finfo(np.float32).tiny, np.float32(0), a)


@pytest.mark.parametrize("n", [4, 1 << 20], ids=["calling-thread", "pool"])
def test_flush_denormals_flushes_only_inside_kernels(n):
  """Device.flush_denormals: kernels (run on the calling thread or split across the pool, eager or replayed by
  TinyJit's batch runner) flush float32 subnormal inputs and results to zero; off (the default) they keep numpy's
  values, and the caller's own floating-point mode is untouched either way (numpy after a flushed kernel still
  produces subnormals)."""
  from plugrad.engine.jit import TinyJit
  dev = Device["CPU"]
  x = np.resize(SUB, n)
  assert not dev.flush_denormals
  np.testing.assert_array_equal((Tensor(x) * 0.5).numpy(), x * np.float32(0.5))
  step = TinyJit(lambda t: (t * 0.25).realize())
  dev.flush_denormals = True
  try:
    assert dev.flush_denormals
    for c in (0.5, 1e-3): np.testing.assert_array_equal((Tensor(x) * c).numpy(), ftz(ftz(x) * np.float32(c)))  # inputs and results
    for _ in range(3): out = step(Tensor(x)).numpy()   # capture, then batched replays
    np.testing.assert_array_equal(out, ftz(ftz(x) * np.float32(0.25)))
    assert np.float32(3e-39) * np.float32(0.5) != 0   # this thread's mode was restored after each kernel
  finally: dev.flush_denormals = False
  np.testing.assert_array_equal((Tensor(x) * 0.125).numpy(), x * np.float32(0.125))


def test_flush_switched_off_while_a_kernel_runs_leaves_no_thread_flushing():
  """The pool reads the flag once per kernel share: switched off while a long kernel runs on both cores (another
  thread's realize), no thread stays in flush mode afterwards. Before, a share that started flushing and saw the flag
  off at its end skipped restoring its mode, and that worker flushed every later kernel's share."""
  import time
  dev = Device["CPU"]
  big = Tensor(RNG.standard_normal(1 << 25).astype(np.float32)).realize()
  def work() -> None: ((big * 1.0001).exp() + 1).sqrt().realize()   # ~50 ms on 2 cores
  work()   # compiled and warm
  x = np.resize(SUB, 1 << 20)
  dev.flush_denormals = True
  try:
    th = threading.Thread(target=work)
    th.start()
    time.sleep(0.01)
  finally: dev.flush_denormals = False
  th.join()
  for _ in range(3): np.testing.assert_array_equal((Tensor(x) * 0.5).numpy(), x * np.float32(0.5))
