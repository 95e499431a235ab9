"""The command processor and SDMA engine of the mock GPUs, shared by the mock KFD (mock.kfd) and the mock PCI GPU (mock.pci).

`run_ring` executes a ring's packets between two byte positions the way the CP / SDMA engine would, decoding them with
the generated bindings' opcodes and field masks (PM4 of nvd.h: SET_SH_REG, RELEASE_MEM, WAIT_REG_MEM, ACQUIRE_MEM,
DISPATCH_DIRECT, NOP; SDMA of sdma_v6_0_0_pkt_open.h: COPY_LINEAR, FENCE, TIMESTAMP, POLL_REGMEM, NOP) against a
`GPUMemory` (the mock's view of what the GPU may touch). A wait that isn't satisfied stops the ring there (it resumes on
the next run); anything the hardware would reject raises `RingFault` naming the packet's ring offset. A dispatch is
decoded from the SET_SH_REG state into a `Dispatch` and handed to the registered executor (mock.dispatch).
"""
from __future__ import annotations

import struct
import time
from typing import Any, Callable

import numpy as np

from plugrad_amd.autogen import amd_hsa, amdhsa_kd, pm4_nv, sdma_gfx11
from plugrad_amd.device import GC_BASE, gc_regs
from plugrad_amd.mock.dispatch import Dispatch, GPUMemory, PageFault, execute

DESCRIPTOR_SEARCH = 1 << 20  # how far below a kernel's entry the engine looks for its descriptor


class PacketError(RuntimeError):
  """A queue held a packet the hardware would reject."""


class RingFault(RuntimeError):
  """A packet failed: `offset` is its ring offset, `kind` PM4 or SDMA, `cause` the error."""
  def __init__(self, kind: str, offset: int, cause: BaseException) -> None:
    super().__init__(f"{kind} at ring offset {offset:#x}: {type(cause).__name__}: {cause}")
    self.kind, self.offset, self.cause = kind, offset, cause


class Clock:
  """The GPU timestamp counter: 100 MHz, strictly increasing."""
  def __init__(self) -> None: self.last = 0
  def __call__(self) -> int:
    self.last = max(self.last + 1, time.perf_counter_ns() // 10)
    return self.last


def compare(func: int, v: int, ref: int) -> bool:
  """WAIT_REG_MEM / POLL_REGMEM compare functions."""
  ops: dict[int, Callable[[int, int], bool]] = {0: lambda a, b: True, 1: lambda a, b: a < b, 2: lambda a, b: a <= b, 3: lambda a, b: a == b,
                                                 4: lambda a, b: a != b, 5: lambda a, b: a >= b, 6: lambda a, b: a > b}
  if func not in ops: raise PacketError(f"wait function {func} is invalid")
  return ops[func](v, ref)


class Engines:
  """One GPU's command processor state (SET_SH_REG registers), clock and dispatch log."""
  def __init__(self, arch: str = "gfx1100") -> None:
    self.arch, self.sh, self.clock = arch, {}, Clock()
    self.dispatches: list[Dispatch] = []
    self._kd_cache: dict[int, int] = {}

  def run_ring(self, kind: str, mem: GPUMemory, ring: int, ring_size: int, start: int, end: int) -> int:
    """Execute `kind` ("PM4"/"SDMA") packets from byte `start` to `end` (monotonic counters, wrapping at ring_size);
    returns how far it got (short of `end` when a wait stalls)."""
    pos = start
    while pos < end:
      def dw(i: int) -> int: return mem.u32(ring + (pos + 4 * i) % ring_size)
      try: n = self.pm4(mem, dw, (end - pos) // 4) if kind == "PM4" else self.sdma(mem, dw, (end - pos) // 4)
      except Exception as e: raise RingFault(kind, pos % ring_size, e) from e
      if n == 0: break
      pos += 4 * n
    return pos

  # PM4 (nvd.h): type-3 header = 3<<30 | count-1 of body dwords <<16 | opcode<<8
  def pm4(self, mem: GPUMemory, dw: Any, avail: int) -> int:
    h = dw(0)
    if h >> 30 != 3: raise PacketError(f"PM4 header {h:#010x} is not a type-3 packet")
    op, n = (h >> 8) & 0xFF, ((h >> 16) & 0x3FFF) + 1
    if n + 1 > avail: raise PacketError(f"PM4 packet {op:#x} of {n + 1} dwords runs past the write pointer")
    body = [dw(1 + i) for i in range(n)]
    P = pm4_nv
    def need(name: str, k: int) -> None:
      if n != k: raise PacketError(f"{name} has {n} body dwords, expected {k}")
    if op == P.PACKET3_NOP: pass
    elif op == P.PACKET3_SET_SH_REG:
      if n < 2: raise PacketError(f"SET_SH_REG with {n} body dwords")
      for i, v in enumerate(body[1:]): self.sh[P.PACKET3_SET_SH_REG_START + body[0] + i] = v
    elif op == P.PACKET3_RELEASE_MEM:
      need("RELEASE_MEM", 7)
      data_sel, dst_sel = body[1] >> 29, (body[1] >> 16) & 3
      addr, data = body[2] | (body[3] << 32), body[4] | (body[5] << 32)
      if dst_sel != 0: raise PacketError(f"RELEASE_MEM dst_sel {dst_sel}: only memory destinations are supported")
      if data_sel == 1: mem.write(addr, struct.pack("<I", data & 0xFFFFFFFF))
      elif data_sel == 2: mem.write(addr, struct.pack("<Q", data))
      elif data_sel == 3: mem.write(addr, struct.pack("<Q", self.clock()))
      elif data_sel != 0: raise PacketError(f"RELEASE_MEM data_sel {data_sel} is not supported")
    elif op == P.PACKET3_WAIT_REG_MEM:
      need("WAIT_REG_MEM", 6)
      if not body[0] & P.WAIT_REG_MEM_MEM_SPACE(1): raise PacketError("WAIT_REG_MEM on a register: only memory waits are supported")
      if not compare(body[0] & 7, mem.u32(body[1] | (body[2] << 32)) & body[4], body[3] & body[4]): return 0
    elif op == P.PACKET3_ACQUIRE_MEM: need("ACQUIRE_MEM", 7)
    elif op == P.PACKET3_DISPATCH_DIRECT:
      need("DISPATCH_DIRECT", 4)
      self.dispatch(mem, tuple(body[:3]), body[3])
    else: raise PacketError(f"PM4 opcode {op:#x} is not supported by the mock command processor")
    return n + 1

  def sh_reg(self, name: str) -> int:
    return self.sh.get(GC_BASE["gfx11"] + getattr(gc_regs(self.arch), f"reg{name}"), 0)

  def dispatch(self, mem: GPUMemory, groups: tuple[int, ...], initiator: int) -> None:
    if not initiator & 1: raise PacketError(f"DISPATCH_DIRECT initiator {initiator:#x} lacks COMPUTE_SHADER_EN")
    if not initiator & (1 << 15): raise PacketError("DISPATCH_DIRECT without CS_W32_EN: gfx1100 kernels from this runtime are wave32")
    entry = (self.sh_reg("COMPUTE_PGM_LO") << 8) | (self.sh_reg("COMPUTE_PGM_HI") << 40)
    kd_addr = self.find_descriptor(mem, entry)
    kd = amdhsa_kd.struct_kernel_descriptor_t.from_buffer_copy(mem.read(kd_addr, 64))
    threads = tuple(self.sh_reg(f"COMPUTE_NUM_THREAD_{a}") & 0x3FF for a in "XYZ")
    if 0 in threads or 0 in groups: raise PacketError(f"DISPATCH_DIRECT with {groups} workgroups of {threads} threads")
    for reg, want in (("COMPUTE_PGM_RSRC1", kd.compute_pgm_rsrc1), ("COMPUTE_PGM_RSRC2", kd.compute_pgm_rsrc2)):
      if self.sh_reg(reg) != want: raise PacketError(f"{reg} = {self.sh_reg(reg):#x} disagrees with the kernel descriptor's {want:#x}")
    if kd.kernel_code_properties & amd_hsa.AMD_KERNEL_CODE_PROPERTIES_ENABLE_SGPR_KERNARG_SEGMENT_PTR:
      kernarg = self.sh_reg("COMPUTE_USER_DATA_0") | (self.sh_reg("COMPUTE_USER_DATA_1") << 32)
    else: kernarg = 0
    d = Dispatch(kd_addr, kernarg, (groups[0] * threads[0], groups[1] * threads[1], groups[2] * threads[2]), threads,
                 kd.group_segment_fixed_size, kd.private_segment_fixed_size, self.arch)
    self.dispatches.append(d)
    execute(mem, d)

  def find_descriptor(self, mem: GPUMemory, entry: int) -> int:
    """The kernel descriptor whose code entry is `entry` (COMPUTE_PGM_LO/HI): descriptors are 64-byte aligned in the same
    code object below the code, with kernel_code_entry_byte_offset relative to themselves."""
    mem.read(entry, 4)  # the program address itself must be mapped (a PageFault otherwise)
    if (kd := self._kd_cache.get(entry)) is not None and struct.unpack("<q", mem.read(kd + 16, 8))[0] == entry - kd: return kd
    page = entry & ~0xFFF
    for base in range(page, max(page - DESCRIPTOR_SEARCH, 0), -0x1000):
      try: raw = np.frombuffer(mem.read(base, 0x1000), "<i8").reshape(-1, 8)[:, 2]  # offset 16 of each 64-byte slot
      except PageFault: break
      hits = np.flatnonzero(raw == entry - (base + np.arange(64, dtype=np.int64) * 64))
      if len(hits):
        self._kd_cache[entry] = kd = base + int(hits[-1]) * 64
        return kd
    raise PacketError(f"no kernel descriptor points at the program address {entry:#x} (COMPUTE_PGM_LO/HI)")

  # SDMA (sdma_v6_0_0_pkt_open.h): op in bits 0-7, sub_op in bits 8-15 of the header
  def sdma(self, mem: GPUMemory, dw: Any, avail: int) -> int:
    S = sdma_gfx11
    h = dw(0)
    def f(pkt: str, dwn: str, fld: str, v: int) -> int:
      return (v >> getattr(S, f"SDMA_PKT_{pkt}_{dwn}_{fld}_shift")) & getattr(S, f"SDMA_PKT_{pkt}_{dwn}_{fld}_mask")
    op, sub = h & 0xFF, (h >> 8) & 0xFF
    def need(name: str, k: int) -> None:
      if k > avail: raise PacketError(f"SDMA {name} packet of {k} dwords runs past the write pointer")
    if op == S.SDMA_OP_NOP: return 1
    if op == S.SDMA_OP_COPY and sub == S.SDMA_SUBOP_COPY_LINEAR:
      need("COPY_LINEAR", 7)
      n = f("COPY_LINEAR", "COUNT", "count", dw(1)) + 1
      src, dst = dw(3) | (dw(4) << 32), dw(5) | (dw(6) << 32)
      mem.write(dst, mem.read(src, n))
      return 7
    if op == S.SDMA_OP_FENCE:
      need("FENCE", 4)
      mem.write(dw(1) | (dw(2) << 32), struct.pack("<I", dw(3)))
      return 4
    if op == S.SDMA_OP_TIMESTAMP and sub == S.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL:
      need("TIMESTAMP", 3)
      mem.write(dw(1) | (dw(2) << 32), struct.pack("<Q", self.clock()))
      return 3
    if op == S.SDMA_OP_POLL_REGMEM:
      need("POLL_REGMEM", 6)
      if not f("POLL_REGMEM", "HEADER", "mem_poll", h): raise PacketError("POLL_REGMEM on a register: only memory polls are supported")
      v = mem.u32(dw(1) | (dw(2) << 32)) & dw(4)
      return 6 if compare(f("POLL_REGMEM", "HEADER", "func", h), v, dw(3) & dw(4)) else 0
    raise PacketError(f"SDMA op {op:#x} sub_op {sub:#x} (header {h:#010x}) is not supported by the mock SDMA engine")
