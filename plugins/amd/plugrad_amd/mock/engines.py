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
from collections import Counter
from typing import Any, Callable

import numpy as np

from plugrad_amd.autogen import amd_hsa, amdhsa_kd, pm4_nv, sdma_gfx11, soc21_enum
from plugrad_amd.device import gc_regs
from plugrad_amd.mock.dispatch import Dispatch, GPUMemory, PageFault, TraceTarget, execute
from plugrad_amd.thread_trace import gc_registers

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


class ThreadTrace:
  """One shader engine's thread-trace unit: its SQ_THREAD_TRACE_* registers (GC segment-1 dword address -> value) and
  the trace it is writing. MODE=ON in CTRL starts a fresh trace (write pointer 0); THREAD_TRACE_START arms it,
  THREAD_TRACE_STOP stops tokens, THREAD_TRACE_FINISH clears STATUS.FINISH_PENDING, MODE=OFF pads the trace to whole
  32-byte lines and clears STATUS.BUSY. Bytes past the buffer's end are dropped and counted in DROPPED_CNTR."""
  def __init__(self) -> None:
    self.regs: dict[int, int] = {}
    self.on = self.armed = self.finished = False
    self.written = self.dropped = 0


class Engines:
  """One GPU's command processor state (SET_SH_REG registers, per-shader-engine thread-trace units), clock and
  dispatch log. `written` counts the register writes per (space, dword address): the tests check what a queue
  programmed."""
  def __init__(self, arch: str = "gfx1100", shader_engines: int = 6) -> None:
    self.arch, self.sh, self.clock = arch, {}, Clock()
    self.gc = gc_registers(gc_regs(arch), "gfx11")  # register addresses and fields (am.regs)
    self.dispatches: list[Dispatch] = []
    self._kd_cache: dict[int, int] = {}
    self.shader_engines = shader_engines
    self.tt = [ThreadTrace() for _ in range(shader_engines)]
    self.grbm_se: int | None = None  # GRBM_GFX_INDEX: the shader engine register writes go to (None: all)
    self.written: Counter = Counter()

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
      for i, v in enumerate(body[1:]):
        self.sh[P.PACKET3_SET_SH_REG_START + body[0] + i] = v
        self.written["sh", P.PACKET3_SET_SH_REG_START + body[0] + i] += 1
    elif op == P.PACKET3_SET_UCONFIG_REG:
      if n < 2: raise PacketError(f"SET_UCONFIG_REG with {n} body dwords")
      for i, v in enumerate(body[1:]): self.write_uconfig(P.PACKET3_SET_UCONFIG_REG_START + body[0] + i, v)
    elif op == P.PACKET3_EVENT_WRITE:
      need("EVENT_WRITE", 1)
      self.event(body[0] & 0x3F)
    elif op == P.PACKET3_COPY_DATA:
      need("COPY_DATA", 5)
      self.copy_data(mem, body)
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
      v = mem.u32(body[1] | (body[2] << 32)) if body[0] & P.WAIT_REG_MEM_MEM_SPACE(1) else self.read_reg(body[1])
      if not compare(body[0] & 7, v & body[4], body[3] & body[4]): return 0
    elif op == P.PACKET3_ACQUIRE_MEM: need("ACQUIRE_MEM", 7)
    elif op == P.PACKET3_DISPATCH_DIRECT:
      need("DISPATCH_DIRECT", 4)
      self.dispatch(mem, tuple(body[:3]), body[3])
    else: raise PacketError(f"PM4 opcode {op:#x} is not supported by the mock command processor")
    return n + 1

  def sh_reg(self, name: str) -> int:
    return self.sh.get(self.reg(name), 0)

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
                 kd.group_segment_fixed_size, kd.private_segment_fixed_size, self.arch, self.trace_targets(mem), self.shader_engines)
    self.dispatches.append(d)
    execute(mem, d)

  # ---- registers outside the SH window and the thread trace (SQTT)
  def reg(self, name: str) -> int:
    """Absolute dword address of GC register `name`."""
    return getattr(self.gc, name).addr

  def field(self, value: int, reg: str, name: str) -> int:
    shift, mask = getattr(self.gc, reg).fields[name.lower()]
    return (value & mask) >> shift

  def selected(self) -> list[ThreadTrace]: return self.tt if self.grbm_se is None else [self.tt[self.grbm_se]]

  def write_uconfig(self, addr: int, v: int) -> None:
    self.written["uconfig", addr] += 1
    if addr == self.reg("GRBM_GFX_INDEX"):
      se = self.field(v, "GRBM_GFX_INDEX", "SE_INDEX")
      if not self.field(v, "GRBM_GFX_INDEX", "SE_BROADCAST_WRITES") and se >= self.shader_engines:
        raise PacketError(f"GRBM_GFX_INDEX selects shader engine {se}; the GPU has {self.shader_engines}")
      self.grbm_se = None if self.field(v, "GRBM_GFX_INDEX", "SE_BROADCAST_WRITES") else se
      return
    for t in self.selected():
      t.regs[addr] = v
      if addr == self.reg("SQ_THREAD_TRACE_CTRL"): self.trace_mode(t, self.field(v, "SQ_THREAD_TRACE_CTRL", "MODE"))

  def trace_mode(self, t: ThreadTrace, mode: int) -> None:
    if mode == soc21_enum.SQ_TT_MODE_ON and not t.on:
      t.on, t.armed, t.finished, t.written, t.dropped = True, False, False, 0, 0
    elif mode == soc21_enum.SQ_TT_MODE_OFF and t.on:
      t.on = t.armed = False
      t.written = min(-(-t.written // 32) * 32, self.trace_buffer(t)[1])  # the tail line's rest is already zero (trace_write)
    elif mode not in (soc21_enum.SQ_TT_MODE_ON, soc21_enum.SQ_TT_MODE_OFF):
      raise PacketError(f"SQ_THREAD_TRACE_CTRL.MODE {mode}: the mock traces compute waves with MODE_ON only")

  def event(self, kind: int) -> None:
    E = soc21_enum
    if kind == E.THREAD_TRACE_START:
      for t in self.tt: t.armed = t.on
    elif kind == E.THREAD_TRACE_STOP:
      for t in self.tt: t.armed = False
    elif kind == E.THREAD_TRACE_FINISH:
      for t in self.tt: t.finished = True
    elif kind not in (E.THREAD_TRACE_MARKER, E.CS_PARTIAL_FLUSH):
      raise PacketError(f"EVENT_WRITE event type {kind:#x} is not supported by the mock command processor")

  def read_reg(self, addr: int) -> int:
    """A register read (WAIT_REG_MEM, COPY_DATA) from the selected shader engine (shader engine 0 under broadcast)."""
    t = self.tt[self.grbm_se or 0]
    r = gc_regs(self.arch)
    if addr == self.reg("SQ_THREAD_TRACE_STATUS"):
      pending = t.on and not t.finished
      return (int(pending) << r.SQ_THREAD_TRACE_STATUS__FINISH_PENDING__SHIFT) | (int(t.finished) << r.SQ_THREAD_TRACE_STATUS__FINISH_DONE__SHIFT) | \
        (int(t.on) << r.SQ_THREAD_TRACE_STATUS__BUSY__SHIFT)
    if addr == self.reg("SQ_THREAD_TRACE_WPTR"):  # 32-byte lines counted from address 0 (gfx11.0)
      return ((self.trace_buffer(t)[0] >> 5) + t.written // 32) & r.SQ_THREAD_TRACE_WPTR__OFFSET_MASK
    if addr == self.reg("SQ_THREAD_TRACE_DROPPED_CNTR"): return t.dropped & 0xFFFFFFFF
    return t.regs.get(addr, 0)

  def copy_data(self, mem: GPUMemory, body: list[int]) -> None:
    src_sel, dst_sel, wide = body[0] & 0xF, (body[0] >> 8) & 0xF, bool(body[0] >> 16 & 1)
    if src_sel in (0, 4): v = self.read_reg(body[1])
    elif src_sel == 5: v = body[1] | (body[2] << 32)
    else: raise PacketError(f"COPY_DATA src_sel {src_sel} is not supported by the mock (register 0/4 or immediate 5)")
    if dst_sel not in (2, 5): raise PacketError(f"COPY_DATA dst_sel {dst_sel} is not supported by the mock (memory 2/5)")
    mem.write(body[3] | (body[4] << 32), struct.pack("<Q" if wide else "<I", v if wide else v & 0xFFFFFFFF))

  def trace_buffer(self, t: ThreadTrace) -> tuple[int, int]:
    """(address, size) of a shader engine's trace buffer from BUF0_BASE / BUF0_SIZE (4 KiB units)."""
    size_reg = t.regs.get(self.reg("SQ_THREAD_TRACE_BUF0_SIZE"), 0)
    lo = self.field(t.regs.get(self.reg("SQ_THREAD_TRACE_BUF0_BASE"), 0), "SQ_THREAD_TRACE_BUF0_BASE", "BASE_LO")
    hi = self.field(size_reg, "SQ_THREAD_TRACE_BUF0_SIZE", "BASE_HI")
    return ((hi << 32) | lo) << 12, self.field(size_reg, "SQ_THREAD_TRACE_BUF0_SIZE", "SIZE") << 12

  def trace_write(self, mem: GPUMemory, t: ThreadTrace, data: bytes) -> None:
    addr, size = self.trace_buffer(t)
    keep = max(0, min(len(data), size - t.written))
    pad = min((-(t.written + keep)) % 32, size - t.written - keep)  # zero filler to the end of the line: a whole trace at MODE=OFF
    if keep: mem.write(addr + t.written, data[:keep] + bytes(pad))
    t.written += keep
    t.dropped += len(data) - keep

  def trace_targets(self, mem: GPUMemory) -> tuple[TraceTarget, ...]:
    """The shader engines tracing a dispatch that starts now: MODE=ON and armed, COMPUTE_THREAD_TRACE_ENABLE set, and
    compute waves included by SQ_THREAD_TRACE_MASK.WTYPE_INCLUDE."""
    if not self.sh_reg("COMPUTE_THREAD_TRACE_ENABLE") & 1: return ()
    out = []
    for se, t in enumerate(self.tt):
      mask = t.regs.get(self.reg("SQ_THREAD_TRACE_MASK"), 0)
      if not (t.on and t.armed) or not self.field(mask, "SQ_THREAD_TRACE_MASK", "WTYPE_INCLUDE") & soc21_enum.SQ_TT_WTYPE_INCLUDE_CS_BIT: continue
      if not self.trace_buffer(t)[1]: raise PacketError(f"thread trace on shader engine {se} has no buffer (SQ_THREAD_TRACE_BUF0_SIZE is 0)")
      tok = t.regs.get(self.reg("SQ_THREAD_TRACE_TOKEN_MASK"), 0)
      out.append(TraceTarget(se, self.field(mask, "SQ_THREAD_TRACE_MASK", "SA_SEL"), self.field(mask, "SQ_THREAD_TRACE_MASK", "WGP_SEL"),
                             self.field(mask, "SQ_THREAD_TRACE_MASK", "SIMD_SEL"), self.field(tok, "SQ_THREAD_TRACE_TOKEN_MASK", "TOKEN_EXCLUDE"),
                             lambda data, t=t: self.trace_write(mem, t, data)))
    return tuple(out)

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
