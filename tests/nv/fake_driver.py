"""A small fake of plugrad_nv.driver.CUDADriver for testing the NV runtime without a GPU.

Memory is host memory (ctypes buffers; device addresses are their host addresses, like UVA). Streams queue their
operations and a pump runs them in order whenever something is enqueued or queried; `wait_value64` blocks its stream
until the 64-bit value at the address is >= the target, so cross-stream ordering behaves like the real thing. Events
take the time of a fake clock that advances 1 us per executed operation. Kernels are Python functions registered in
`kernels` under their name; a "module image" is b"FAKE" + the kernel names it contains.
"""
from __future__ import annotations

import ctypes
from collections import deque
from typing import Any, Callable

from plugrad_nv.driver import CUDAError


class Stream:
  def __init__(self, sid: int) -> None: self.sid, self.ops, self.error = sid, deque(), None
  def __repr__(self) -> str: return f"<FakeStream {self.sid}>"


class Event:
  def __init__(self) -> None: self.t: float | None = None


class FakeDriver:
  NOT_READY = 600

  def __init__(self, n_devices: int = 1, cc: tuple[int, int] = (9, 0)) -> None:
    self.n_devices, self.cc = n_devices, cc
    self.mem: dict[int, Any] = {}
    self.host: set[int] = set()
    self.streams: list[Stream] = []
    self.kernels: dict[str, Callable[..., None]] = {}
    self.launches: list[tuple[str, tuple, tuple, tuple]] = []
    self.log: list[str] = []
    self.clock = 0.0
    self.current_ctx: Any = None

  # devices
  def device_count(self) -> int: return self.n_devices
  def device(self, i: int) -> int: return i
  def device_name(self, d: int) -> str: return f"Fake GPU {d}"
  def compute_capability(self, d: int) -> tuple[int, int]: return self.cc
  def primary_context(self, d: int) -> str: return f"ctx{d}"
  def set_context(self, ctx: Any) -> None: self.current_ctx = ctx

  # memory
  def _new(self, n: int) -> int:
    buf = ctypes.create_string_buffer(max(n, 1))
    self.mem[ctypes.addressof(buf)] = buf
    return ctypes.addressof(buf)
  def mem_alloc(self, n: int) -> int: return self._new(n)
  def mem_free(self, p: int) -> None:
    if p not in self.mem or p in self.host: raise CUDAError(f"cuMemFree: {p:#x} is not a device allocation", 1)
    del self.mem[p]
  def host_alloc(self, n: int) -> tuple[int, int]:
    p = self._new(n)
    self.host.add(p)
    return p, p
  def host_free(self, p: int) -> None:
    if p not in self.host: raise CUDAError(f"cuMemFreeHost: {p:#x} is not a host allocation", 1)
    self.host.discard(p); del self.mem[p]
  def live_bytes(self) -> int: return sum(len(b) for p, b in self.mem.items() if p not in self.host)
  def _check_range(self, addr: int, n: int) -> None:
    if not any(p <= addr and addr + n <= p + len(b) for p, b in self.mem.items()): raise CUDAError(f"illegal address {addr:#x} (+{n})", 700)

  # streams and events
  def stream_create(self) -> Stream:
    self.streams.append(Stream(len(self.streams)))
    return self.streams[-1]
  def event_create(self) -> Event: return Event()
  def _enqueue(self, s: Stream, *op: Any) -> None:
    if not isinstance(s, Stream): raise CUDAError(f"invalid stream {s!r}", 400)
    s.ops.append(op)
    self.pump()
  def event_record(self, ev: Event, s: Stream) -> None: self._enqueue(s, "record", ev)
  def write_value64(self, s: Stream, addr: int, v: int) -> None: self._enqueue(s, "write", addr, v)
  def wait_value64(self, s: Stream, addr: int, v: int) -> None: self._enqueue(s, "wait", addr, v)
  def memcpy_async(self, dst: int, src: int, n: int, s: Stream) -> None: self._enqueue(s, "copy", dst, src, n)
  def event_elapsed_ms(self, a: Event, b: Event) -> float | None:
    self.pump()
    return None if a.t is None or b.t is None else (b.t - a.t) * 1e3
  def stream_query(self, s: Stream) -> bool:
    self.pump()
    if s.error is not None: raise CUDAError(f"cuStreamQuery failed: {s.error}", 700)
    return not s.ops
  def stream_sync(self, s: Stream) -> None:
    if not self.stream_query(s): raise CUDAError("cuStreamSynchronize would hang: the stream waits on a value nobody writes", 600)

  # modules
  def module_load(self, image: bytes) -> list[str]:
    if not image.startswith(b"FAKE"): raise CUDAError("cuModuleLoadData: not a fake image (CUDA_ERROR_INVALID_IMAGE)", 200)
    return image[4:].decode().split(",")
  def module_function(self, module: list[str], name: str) -> str:
    if name not in module: raise CUDAError(f"cuModuleGetFunction({name}): CUDA_ERROR_NOT_FOUND", 500)
    return name
  def module_unload(self, module: Any) -> None: pass
  def launch(self, fn: str, grid, block, s: Stream, params: Any, shared: int = 0) -> None:
    self._enqueue(s, "launch", fn, tuple(grid), tuple(block), params)

  # execution
  def _step(self, s: Stream) -> bool:
    op = s.ops[0]
    if op[0] == "wait" and ctypes.c_uint64.from_address(op[1]).value < op[2]: return False
    s.ops.popleft()
    self.clock += 1e-6
    self.log.append(f"s{s.sid}:{op[0]}")
    try:
      if op[0] == "record": op[1].t = self.clock
      elif op[0] == "write": self._check_range(op[1], 8); ctypes.c_uint64.from_address(op[1]).value = op[2]
      elif op[0] == "copy": self._check_range(op[1], op[3]); self._check_range(op[2], op[3]); ctypes.memmove(op[1], op[2], op[3])
      elif op[0] == "launch":
        _, fn, grid, block, params = op
        self.launches.append((fn, grid, block, params))
        self.kernels[fn](grid, block, params)
    except Exception as e:
      s.error = f"{type(e).__name__}: {e}"
      s.ops.clear()
    return True

  def pump(self) -> None:
    progress = True
    while progress:
      progress = False
      for s in self.streams:
        while s.ops and s.error is None and self._step(s): progress = True
