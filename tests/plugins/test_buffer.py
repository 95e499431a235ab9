"""Buffers, allocators (LRU caching, OOM retry, offsets, transfer) and the NULL device."""
from __future__ import annotations
import mmap
import os

import numpy as np
import pytest
from plugrad import Buffer, Device, dtypes
from plugrad.device import Allocator, BufferOptions, LRUAllocator
from plugrad.helpers import resident_bytes

class CountingAllocator(LRUAllocator):
  """Host allocator with a byte budget, counting real allocations and frees."""
  def __init__(self, budget: int = 1 << 30) -> None:
    super().__init__()
    self.budget, self.live, self.allocs, self.frees = budget, 0, 0, 0
  def _alloc(self, size, options):
    if self.live + size > self.budget: raise MemoryError(f"out of memory: {self.live}+{size} > {self.budget}")
    self.live += size; self.allocs += 1
    return bytearray(size)
  def _free(self, opaque, size, options): self.live -= size; self.frees += 1

def test_lru_reuses_same_size_and_options():
  a = CountingAllocator()
  x = a.alloc(64)
  a.free(x, 64)
  assert a.alloc(64) is x and a.allocs == 1
  a.free(x, 64)
  y = a.alloc(64, BufferOptions(host=True))
  assert y is not x and a.allocs == 2 and a.cached_bytes == 64

def test_lru_frees_cache_on_oom_and_retries():
  a = CountingAllocator(budget=100)
  x = a.alloc(60)
  a.free(x, 60)
  y = a.alloc(80)  # 60 cached + 80 > 100: cache is dropped, then it fits
  assert len(y) == 80 and a.frees == 1 and a.cached_bytes == 0
  with pytest.raises(MemoryError, match="out of memory"): a.alloc(50)

def test_lru_disabled_by_env_and_nolru(monkeypatch):
  a = CountingAllocator()
  a.free(a.alloc(8, BufferOptions(nolru=True)), 8, BufferOptions(nolru=True))
  monkeypatch.setenv("LRU", "0")
  a.free(a.alloc(8), 8)
  assert a.frees == 2 and a.cached_bytes == 0

def test_allocator_rejects_bad_sizes_and_missing_features():
  a = CountingAllocator()
  for bad in (-1, 1.5, "8"):
    with pytest.raises(ValueError, match="allocation size"): a.alloc(bad)
  with pytest.raises(NotImplementedError, match="offset views"): a.offset(a.alloc(8), 4, 0)
  with pytest.raises(NotImplementedError, match="device-to-device"): a.transfer(None, None, 0, None, None)
  assert not Allocator().supports_offset

def test_buffer_roundtrip_and_views_on_cpu():
  b = Buffer("cpu:0", 8, dtypes.float32)
  assert b.device == "CPU" and not b.is_allocated and b.nbytes == 32
  b.copyin(np.arange(8, dtype=np.float32))
  assert b._buf.ctypes.data % 64 == 0
  v = b.view(3, dtypes.float32, offset=8)
  assert v.numpy().tolist() == [2.0, 3.0, 4.0] and v.base is b
  v.copyin(np.array([7, 8, 9], np.float32))
  assert b.numpy().tolist() == [0, 1, 7, 8, 9, 5, 6, 7]
  vv = v.view(1, dtypes.int32, offset=4)  # view of a view flattens onto the base
  assert vv.base is b and vv.offset == 12
  assert "view@8" in repr(v)

def test_buffer_bad_input_is_clear():
  b = Buffer("CPU", 4, dtypes.int32)
  with pytest.raises(ValueError, match="copyin of 12 bytes into .* of 16 bytes"): b.copyin(b"x" * 12)
  with pytest.raises(TypeError, match="expected bytes"): b.copyin([1, 2, 3, 4])
  with pytest.raises(ValueError, match="does not fit"): b.view(4, dtypes.int32, offset=4)
  with pytest.raises(ValueError, match="non-negative int"): Buffer("CPU", -1, dtypes.int32)
  with pytest.raises(ValueError, match="read-only"): b.copyout(memoryview(bytes(16)))
  b.allocate()
  with pytest.raises(RuntimeError, match="already allocated"): b.allocate()

def test_buffer_returns_memory_to_lru_on_deallocate():
  alloc = Device["CPU"].allocator
  b = Buffer("CPU", 1000, dtypes.uint8).ensure_allocated()
  handle = b._buf
  b.deallocate()
  assert Buffer("CPU", 1000, dtypes.uint8).ensure_allocated()._buf is handle
  assert alloc.cached_bytes >= 0

def test_copy_from_between_devices(tmp_path):
  src = Buffer("CPU", 4, dtypes.int32).copyin(np.array([5, 6, 7, 8], np.int32))
  same = Buffer("CPU:1", 4, dtypes.int32).copy_from(src)  # CPU -> CPU uses transfer
  disk = Buffer(f"DISK:{tmp_path}/f.bin", 4, dtypes.int32).copy_from(same)  # via host
  assert same.numpy().tolist() == disk.numpy().tolist() == [5, 6, 7, 8]

def test_null_device_fakes_everything():
  dev = Device["NULL"]
  b = Buffer("NULL", 4, dtypes.int32).copyin(np.arange(4, dtype=np.int32))
  assert b.numpy().tolist() == [0, 0, 0, 0]  # documented: copyout gives zeros
  v = b.view(2, dtypes.int32, offset=8).ensure_allocated()
  assert v._buf.offset == 8 and v._buf.nbytes == 8
  assert dev.compiler.compile_cached("anything at all") == b""
  prg = dev.load("k", b"")
  assert prg(b._buf, global_size=(4, 1, 1), local_size=(1, 1, 1), wait=True) == 0.0 and prg(b._buf) is None
  with pytest.raises(ValueError, match="global_size must be 1 to 3 positive ints"): prg(global_size=(0,))
  assert dev.renderer.name == "NULL" and "NULL kernel" in dev.renderer.render("k", [])

def test_zeroed_is_never_served_from_the_lru_cache():
  a = CountingAllocator()
  x = a.alloc(64, BufferOptions(zeroed=True))
  a.free(x, 64, BufferOptions(zeroed=True))
  assert a.frees == 1 and a.cached_bytes == 0   # a freed buffer may have been written: it is no longer zero
  y = a.alloc(64)
  a.free(y, 64)
  assert a.alloc(64, BufferOptions(zeroed=True)) is not y and a.allocs == 3

class GarbageAllocator(CountingAllocator):
  """Memory that starts dirty, as a device's reused memory does."""
  def _alloc(self, size, options):
    super()._alloc(size, options)
    return bytearray(b"\xab" * size)
  def _copyin(self, dest, src): dest[:] = src
  def _copyout(self, dest, src): dest[:] = src

@pytest.mark.parametrize("device", ["CPU", "PYTHON", "garbage"])
def test_zeroed_buffers_read_zero(device, monkeypatch):
  """BufferOptions(zeroed=True): zeros from the start on every allocator, zero-filled where it can't promise them."""
  if device == "garbage": monkeypatch.setattr(Device["CPU"], "allocator", GarbageAllocator()); device = "CPU"
  dirty = Buffer(device, 1000, dtypes.float32).ensure_allocated()
  dirty.copyin(memoryview(np.full(1000, 7, np.float32).tobytes()))
  dirty.deallocate()   # into the LRU cache: a plain request of this size would get it back
  b = Buffer(device, 1000, dtypes.float32, BufferOptions(zeroed=True)).ensure_allocated()
  assert not np.frombuffer(b.copyout(), np.float32).any()
  b.copyin(memoryview(np.arange(1000, dtype=np.float32).tobytes()))
  np.testing.assert_array_equal(np.frombuffer(b.copyout(), np.float32), np.arange(1000, dtype=np.float32))

def _rss() -> int:
  return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS:")).split()[1]) * 1024

@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS")
def test_cpu_zeroed_pages_are_resident_only_once_written():
  """A zeroed CPU buffer is a fresh anonymous mapping: reading it maps the zero page, writing a quarter makes only that
  resident (a KV cache reserved for the whole context costs what the tokens wrote)."""
  n = 64 << 20
  before = _rss()
  b = Buffer("CPU", n, dtypes.uint8, BufferOptions(zeroed=True)).ensure_allocated()
  assert not b._buf.any() and _rss() - before < (8 << 20)
  b._buf[:n // 4] = 1
  assert (n // 4) - (4 << 20) < _rss() - before < (n // 4) + (8 << 20)


def _resident_pages(addr: int, nbytes: int) -> int: return resident_bytes(addr, nbytes) // mmap.PAGESIZE


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="mincore page residency is read on Linux")
def test_cpu_discard_gives_whole_pages_back():
  """`Buffer.discard` on the CPU: the whole pages inside the bytes leave memory (mincore) and read as zero when next
  read; the bytes of partial pages at either end and outside the range keep their values; a view discards its part of
  the base; a range outside the buffer is a ValueError naming it; an unallocated buffer has nothing to give back. A
  device without the means (the base Allocator) keeps the memory."""
  n = 64 * mmap.PAGESIZE
  b = Buffer("CPU", n, dtypes.uint8).ensure_allocated()
  b.copyin(np.full(n, 7, np.uint8))
  addr = b._buf.ctypes.data
  assert _resident_pages(addr, n) >= 63
  b.discard(100, n // 2)   # from byte 100: the first partial page kept, then 31 whole pages
  got = np.frombuffer(b.copyout(), np.uint8)
  lo, hi = -(-(addr + 100) // mmap.PAGESIZE) * mmap.PAGESIZE - addr, (addr + 100 + n // 2) // mmap.PAGESIZE * mmap.PAGESIZE - addr
  assert (got[:lo] == 7).all() and (got[lo:hi] == 0).all() and (got[hi:] == 7).all() and hi - lo >= 30 * mmap.PAGESIZE
  b.copyin(np.full(n, 7, np.uint8))
  v = b.view(8 * mmap.PAGESIZE, dtypes.uint8, 16 * mmap.PAGESIZE).ensure_allocated()
  before = _resident_pages(addr, n)
  v.discard()
  assert before - _resident_pages(addr, n) >= 7 and (np.frombuffer(b.copyout(), np.uint8)[:16 * mmap.PAGESIZE] == 7).all()
  b.discard()
  assert _resident_pages(addr, n) <= 2
  with pytest.raises(ValueError, match=r"discard of bytes \[10, 20\)"): Buffer("CPU", 16, dtypes.uint8).ensure_allocated().discard(10, 10)
  Buffer("CPU", 1 << 20, dtypes.uint8).discard()   # never allocated: nothing happens
  kept = bytearray(b"\x07" * 64)
  CountingAllocator().discard(kept, 64)
  assert kept == bytearray(b"\x07" * 64)
