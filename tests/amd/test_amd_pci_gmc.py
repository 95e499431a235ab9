"""The PCI driver's page-table writer and VRAM allocator, checked against an independent walker written here from the
amdgpu page-table format (4 levels of 512 entries, bit 0 valid, bit 1 system, bit 54 a PDE0 that is a 2 MiB page,
address bits 12-47, fragment in bits 7-11), and a hypothesis model of mappings (PLUGRAD_FUZZ_EXAMPLES cases)."""
from __future__ import annotations

import ctypes
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrad_amd.am.gmc import PageTable, VRAMAllocator, fragments

FUZZ = int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200"))
VALID, SYSTEM, SNOOPED, PDE_PTE, ADDR = 1, 2, 4, 1 << 54, 0x0000FFFFFFFFF000
KB, MB = 1 << 10, 1 << 20


class FakeVRAM:
  """A few MiB of host memory standing for VRAM, and a bump allocator of zeroed 4 KiB table pages in it."""
  def __init__(self, size: int = 8 * MB) -> None:
    self.buf = ctypes.create_string_buffer(size)
    self.addr, self.next = ctypes.addressof(self.buf), 0

  def table(self) -> int:
    self.next += 4 * KB
    return self.next - 4 * KB

  def entry(self, table: int, idx: int) -> int: return struct.unpack_from("<Q", self.buf, table + 8 * idx)[0]


def walk(vram: FakeVRAM, root: int, va: int) -> tuple[int, int, int] | None:
  """(physical address, entry, page size) of `va`, walking the way the GPU does; None when unmapped."""
  t = root
  for level, shift in enumerate((39, 30, 21, 12)):
    e = vram.entry(t, (va >> shift) & 511)
    if not e & VALID: return None
    if level == 3 or (level == 2 and e & PDE_PTE):
      size = 1 << shift
      return (e & ADDR) + va % size, e, size
    assert not e & PDE_PTE, f"huge page at level {level}"
    t = e & ADDR
  return None


def test_4k_and_2m_pages():
  v = FakeVRAM()
  pt = PageTable(v.addr, v.table)
  va = 0x7F12_3400_0000  # 2 MiB aligned
  pt.map(va, [(64 * MB, 4 * MB)])                                   # two 2 MiB pages
  pt.map(va + 4 * MB + 12 * KB, [(200 * MB + 12 * KB, 8 * KB)])     # two 4 KiB pages
  pt.map(va + 8 * MB, [(1 << 40, 4 * KB)], system=True, snooped=True)
  pa, e, size = walk(v, pt.root, va + 3 * MB + 5)
  assert (pa, size) == (64 * MB + 3 * MB + 5, 2 * MB) and e & PDE_PTE and not e & SYSTEM
  assert (e >> 7) & 31 == 10  # one aligned 4 MiB block: fragment log2(4 MiB) - 12
  pa, e, size = walk(v, pt.root, va + 4 * MB + 16 * KB + 9)
  assert (pa, size) == (200 * MB + 16 * KB + 9, 4 * KB) and not e & PDE_PTE
  pa, e, _ = walk(v, pt.root, va + 8 * MB)
  assert pa == 1 << 40 and e & SYSTEM and e & SNOOPED
  assert walk(v, pt.root, va + 4 * MB) is None and walk(v, pt.root, va + 4 * MB + 20 * KB) is None
  assert pt.lookup(va + 4 * MB + 12 * KB)[0] == v.entry(walk_table(v, pt.root, va + 4 * MB + 12 * KB), ((va + 4 * MB + 12 * KB) >> 12) & 511)


def walk_table(v: FakeVRAM, root: int, va: int) -> int:
  t = root
  for shift in (39, 30, 21): t = v.entry(t, (va >> shift) & 511) & ADDR
  return t


def test_unmap_and_errors():
  v = FakeVRAM()
  pt = PageTable(v.addr, v.table)
  va = 1 << 40
  pt.map(va, [(0, 2 * MB), (8 * MB, 8 * KB)])
  with pytest.raises(ValueError, match="already mapped"): pt.map(va + 2 * MB, [(0, 4 * KB)])
  with pytest.raises(ValueError, match="not page aligned"): pt.map(va + 16 * MB + 1, [(0, 4 * KB)])
  with pytest.raises(ValueError, match="part of the 2 MiB page"): pt.unmap(va, 4 * KB)
  with pytest.raises(ValueError, match="can't also get a page table"): pt.map(va + 4 * KB, [(0, 4 * KB)])
  pt.unmap(va, 2 * MB + 8 * KB)
  assert walk(v, pt.root, va) is None and walk(v, pt.root, va + 2 * MB + 4 * KB) is None
  pt.map(va, [(16 * MB, 4 * KB)])  # the range is free again
  assert walk(v, pt.root, va)[0] == 16 * MB
  with pytest.raises(ValueError, match="not mapped"): pt.unmap(1 << 44, 4 * KB)


def test_fragments_are_aligned_power_of_two_blocks():
  assert fragments(0, 0, 6 * MB) == [(0, 0, 4 * MB), (4 * MB, 4 * MB, 2 * MB)]
  assert fragments(4 * KB, 1 * MB + 4 * KB, 12 * KB) == [(4 * KB, 1 * MB + 4 * KB, 4 * KB), (8 * KB, 1 * MB + 8 * KB, 8 * KB)]
  assert len(fragments(4 * KB, 1 * MB, 12 * KB)) == 3  # misaligned to each other: 4 KiB blocks only
  for va, pa, n in fragments(0x1234000, 0x5675000, 0x123000):
    assert n & (n - 1) == 0 and va % n == 0 and pa % n == 0


def test_vram_allocator():
  a = VRAMAllocator(0, 16 * MB)
  x, y = a.alloc(4 * KB), a.alloc(2 * MB, 2 * MB)
  assert x == 0 and y == 2 * MB and a.alloc(1) == 4 * KB
  with pytest.raises(MemoryError, match="out of VRAM: no free 16777216-byte range"): a.alloc(16 * MB)
  a.free(y)
  a.free(x)
  assert a.alloc(2 * MB, 2 * MB) == 2 * MB
  assert a.available() == 16 * MB - 2 * MB - 4 * KB


@settings(max_examples=FUZZ, deadline=None, derandomize=FUZZ <= 200, database=None)
@given(st.lists(st.tuples(st.integers(0, 255), st.integers(1, 96), st.integers(0, 4095), st.booleans()), min_size=1, max_size=8))
def test_mappings_match_a_model(ops: list[tuple[int, int, int, bool]]):
  """Random non-overlapping mappings (4 KiB-page slots in a 1 GiB window, some 2 MiB aligned): every page walks to where
  the model says, pages never mapped walk to nothing, and unmapping half of them leaves the rest."""
  v = FakeVRAM(16 * MB)
  pt = PageTable(v.addr, v.table)
  base, model, used = 0x7000_0000_0000, {}, set()
  for slot, pages, phys, huge in ops:
    va, pa = base + slot * 4 * MB, phys * 64 * KB
    if huge: pages, pa = 512 * (1 + pages % 2), (phys % 64) * 2 * MB
    if any(p in used for p in range(slot * 1024, slot * 1024 + pages)): continue
    pt.map(va, [(pa, pages * 4 * KB)])
    used.update(range(slot * 1024, slot * 1024 + pages))
    model[va] = (pa, pages)
  for va, (pa, pages) in model.items():
    for k in (0, pages // 2, pages - 1):
      assert walk(v, pt.root, va + k * 4 * KB + 7)[0] == pa + k * 4 * KB + 7
    assert walk(v, pt.root, va + pages * 4 * KB) is None or any(o != va and o <= va + pages * 4 * KB < o + m[1] * 4 * KB for o, m in model.items())
  for va, (_, pages) in list(model.items())[::2]:
    pt.unmap(va, pages * 4 * KB)
    assert walk(v, pt.root, va) is None
  for va, (pa, _) in list(model.items())[1::2]: assert walk(v, pt.root, va)[0] == pa
