"""A pure-software HCQ device: the reference implementation of `plugrad.runtime.hcq`, used by tests.

"Device memory" is host memory, and the "GPU" is one worker thread per device that executes submitted queues in
order, like a hardware ring: signal writes a value and timestamp, wait polls (a wait that never completes within
`hang_timeout_ms` faults the device, like a GPU hang), copy is a memmove, exec calls the kernel, a Python function.
Kernel source is Python defining `def <name>(global_size, local_size, *bufs, *vals)`; bufs are byte memoryviews.
Nothing registers this device; construct `SoftDevice("SOFT")` directly.
"""
from __future__ import annotations
import ctypes
import queue
import threading
import time
from typing import Any
import numpy as np
from plugrad.device import BufferOptions
from plugrad.runtime.compiler import Compiler
from plugrad.runtime.hcq import Command, HCQAllocator, HCQBuffer, HCQCompiled, HCQProgram, HWQueue, Signal
from plugrad.runtime.renderer import Capabilities, Renderer

class SoftSignal(Signal):
  def __init__(self, dev: SoftDevice | None = None, value: int = 0) -> None:
    self._value, self._ts = 0, 0
    super().__init__(dev, value)
  def _read_value(self) -> int: return self._value
  def _write_value(self, v: int) -> None: self._value = v
  def _read_timestamp(self) -> int: return self._ts
  def stamp(self) -> None: self._ts = time.perf_counter_ns()

class SoftQueue(HWQueue):
  def _submit(self, dev: SoftDevice, encoded: Any, var_vals: dict[str, int]) -> None:  # type: ignore[override]
    dev.ring.put(self.resolved(var_vals))

class SoftAllocator(HCQAllocator):
  def _alloc(self, size: int, options: BufferOptions) -> HCQBuffer:
    raw = np.empty(size + 64, np.uint8)
    arr = raw[(-raw.ctypes.data) % 64:][:size]
    self.dev.live_bytes += size  # type: ignore[attr-defined]
    return HCQBuffer(arr.ctypes.data, size, memoryview(arr), meta=arr)
  def _free(self, opaque: HCQBuffer, size: int, options: BufferOptions) -> None:
    self.dev.live_bytes -= size  # type: ignore[attr-defined]

class SoftCompiler(Compiler):
  def __init__(self) -> None: super().__init__(None)
  def compile(self, src: str) -> bytes:
    import ast
    ast.parse(src)  # syntax errors surface at compile time
    return src.encode()

class SoftRenderer(Renderer):
  name = "PYTHON"
  caps = Capabilities(has_local=True, global_max=(1 << 31,) * 3, local_max=(1024,) * 3)

class SoftProgram(HCQProgram):
  def __init__(self, dev: SoftDevice, name: str, lib: bytes) -> None:
    super().__init__(dev, name, lib)
    ns: dict[str, Any] = {}
    exec(compile(lib.decode(), f"<soft kernel {name}>", "exec"), ns)
    if not callable(ns.get(name)): raise RuntimeError(f"soft kernel source defines no function {name!r}")
    self.fn = ns[name]

class SoftDevice(HCQCompiled):
  """Software HCQ device. `hang_timeout_ms`: how long a queue `wait` may stall before the device faults."""
  def __init__(self, device: str = "SOFT", hang_timeout_ms: int = 2000, timeout_ms: int = 5000) -> None:
    self.ring: queue.Queue[list[Command] | None] = queue.Queue()
    self.fault: str | None = None
    self.hang_timeout_ms, self.live_bytes, self.executed = hang_timeout_ms, 0, 0
    super().__init__(device, SoftAllocator, [SoftRenderer], SoftCompiler(), SoftProgram, SoftSignal, SoftQueue, timeout_ms=timeout_ms)
    self._worker = threading.Thread(target=self._run, name=f"softhcq-{device}", daemon=True)
    self._worker.start()

  def check_fault(self) -> None:
    if self.fault is not None: raise RuntimeError(f"device {self.device} faulted: {self.fault}")

  def finalize(self) -> None: self.ring.put(None)

  def _run(self) -> None:
    while (cmds := self.ring.get()) is not None:
      if self.fault is not None: continue  # a faulted device drops all further work
      try:
        for c in cmds: self._execute(c)
      except Exception as e: self.fault = f"{type(e).__name__}: {e}"

  def _execute(self, c: Command) -> None:
    if c.op == "signal":
      sig, v = c.args
      sig.stamp(); sig.value = v
    elif c.op == "wait":
      sig, v = c.args
      deadline = time.monotonic() + self.hang_timeout_ms / 1000
      while sig.value < v:
        if time.monotonic() > deadline: raise TimeoutError(f"queue wait for {sig!r} >= {v} hung for {self.hang_timeout_ms} ms")
        time.sleep(0.0001)
    elif c.op == "timestamp": c.args[0].stamp()
    elif c.op == "memory_barrier": pass
    elif c.op == "copy":
      dest, src, n = c.args
      ctypes.memmove(dest, src, n)
    elif c.op == "exec":
      prg, st, gsz, lsz = c.args
      prg.fn(gsz, lsz, *[b.view for b in st.bufs], *st.vals)
      self.executed += 1
    else: raise ValueError(f"unknown command {c.op}")
