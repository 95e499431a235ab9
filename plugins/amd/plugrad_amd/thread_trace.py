"""SQTT on the runtime side: the PM4 that programs the shader processor's thread trace (SQ_THREAD_TRACE_*) around a
kernel on gfx11, and reading each shader engine's trace back.

Start (`start_words`), once per traced launch: SPI_CONFIG_CNTL turns the SQG events on; for each shader engine
(GRBM_GFX_INDEX selects it) the 4 KiB-aligned buffer (BUF0_BASE/BUF0_SIZE), which SIMD of which WGP and shader array
gets instruction tokens and that only compute waves are traced (MASK), the token kinds (TOKEN_MASK), then CTRL with
MODE=ON; GRBM_GFX_INDEX back to broadcast, COMPUTE_THREAD_TRACE_ENABLE=1 and the THREAD_TRACE_START event.
Stop (`stop_words`): THREAD_TRACE_STOP and THREAD_TRACE_FINISH events, COMPUTE_THREAD_TRACE_ENABLE=0; per shader engine
wait for STATUS.FINISH_PENDING to clear, CTRL MODE=OFF, wait for STATUS.BUSY to clear, and COPY_DATA of WPTR, STATUS
and DROPPED_CNTR into a 16-byte info slot in memory; broadcast and SPI_CONFIG_CNTL back.
The sequence follows Mesa's ac_sqtt.c (gfx11) and tinygrad's AMD runtime; every register and field is taken from the
generated gc_11_0_0 / soc21_enum / nvd.h bindings. With SQTT off none of this is emitted (tests/amd check that no
thread-trace register is written).
"""
from __future__ import annotations

import functools
import struct
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

from plugrad.viz import capture
from plugrad_amd import GC_SEGMENTS, sqtt
from plugrad_amd.am.regs import IPRegs
from plugrad_amd.autogen import pm4_nv, soc21_enum

# the UCONFIG window reaches 0x10000 dwords on gfx10+ (Mesa's CIK_UCONFIG_REG_END, 0x40000 bytes); nvd.h's
# PACKET3_SET_UCONFIG_REG_END (0xc400) is the older, smaller window and would exclude SQ_THREAD_TRACE_* (0xd9e8..)
UCONFIG_END = 0x10000
INFO_BYTES = 16                 # per shader engine: WPTR, STATUS, DROPPED_CNTR, pad
COPY_SRC_PERF, COPY_DST_MEM, COPY_WR_CONFIRM = 4, 2, 1 << 20  # COPY_DATA control: read a register, write memory, confirm
WAIT_EQ = 3


@functools.lru_cache(None)
def gc_registers(regs: Any, family: str) -> IPRegs:
  """The GC registers of the generated module `regs` at the family's segment bases (GC_SEGMENTS): addresses and field
  encoding for building packets (am.regs; no MMIO behind them)."""
  return IPRegs("GC", regs, GC_SEGMENTS[family], None)


def fields(regs: Any, reg: str, family: str = "gfx11", **vals: int) -> int:
  """The value of GC register `reg` with the named fields set (am.regs: masks and shifts from the bindings; a value
  that does not fit its field is a RegisterError, a ValueError)."""
  return getattr(gc_registers(regs, family), reg).encode(**vals)


def reg_addr(regs: Any, name: str, family: str) -> int:
  """Absolute dword address of GC register `name` (segment bases from am.regs.GC_SEGMENTS)."""
  return getattr(gc_registers(regs, family), name).addr


@dataclass(frozen=True)
class TraceSettings:
  """What to trace: the SIMD/WGP/shader array that gets instruction tokens, and which shader engines trace
  instructions at all (the others record only wave starts and ends)."""
  simd_sel: int = 0
  wgp_sel: int = 0
  sa_sel: int = 0
  itrace_se_mask: int = 0xFFFF


INST_TOKENS = (soc21_enum.SQ_TT_TOKEN_EXCLUDE_VMEMEXEC_SHIFT, soc21_enum.SQ_TT_TOKEN_EXCLUDE_ALUEXEC_SHIFT,
               soc21_enum.SQ_TT_TOKEN_EXCLUDE_VALUINST_SHIFT, soc21_enum.SQ_TT_TOKEN_EXCLUDE_IMMEDIATE_SHIFT,
               soc21_enum.SQ_TT_TOKEN_EXCLUDE_INST_SHIFT)


class Emitter:
  """PM4 words for the thread-trace registers of one GPU family."""
  def __init__(self, regs: Any, family: str) -> None:
    if family != "gfx11": raise NotImplementedError(f"SQTT is implemented for gfx11 (RDNA3) only, not {family}")
    self.regs, self.family, self.words = regs, family, []

  def pkt3(self, op: int, *body: int) -> None: self.words += [pm4_nv.PACKET3(op, len(body) - 1), *(w & 0xFFFFFFFF for w in body)]

  def window(self, name: str, start: int, end: int) -> int:
    """Register `name`'s offset in a SET_*_REG window [start, end): an error if it lies outside it."""
    if not start <= (addr := reg_addr(self.regs, name, self.family)) < end: raise ValueError(f"{name} ({addr:#x}) is not in [{start:#x}, {end:#x})")
    return addr - start

  def uconfig(self, name: str, value: int) -> None:
    self.pkt3(pm4_nv.PACKET3_SET_UCONFIG_REG, self.window(name, pm4_nv.PACKET3_SET_UCONFIG_REG_START, UCONFIG_END), value)

  def sh(self, name: str, value: int) -> None:
    self.pkt3(pm4_nv.PACKET3_SET_SH_REG, self.window(name, pm4_nv.PACKET3_SET_SH_REG_START, pm4_nv.PACKET3_SET_SH_REG_END), value)

  def event(self, event_type: int) -> None: self.pkt3(pm4_nv.PACKET3_EVENT_WRITE, pm4_nv.EVENT_TYPE(event_type) | pm4_nv.EVENT_INDEX(0))

  def select_se(self, se: int | None) -> None:
    """GRBM_GFX_INDEX: one shader engine (its every shader array and instance), or broadcast to all with None."""
    b = dict(sa_broadcast_writes=1, instance_broadcast_writes=1)
    self.uconfig("GRBM_GFX_INDEX", fields(self.regs, "GRBM_GFX_INDEX", **b, **({"se_broadcast_writes": 1} if se is None else {"se_index": se})))

  def spi_events(self, on: bool) -> None:
    self.uconfig("SPI_CONFIG_CNTL", fields(self.regs, "SPI_CONFIG_CNTL", gpr_write_priority=0x2C688, exp_priority_order=3,
                                           enable_sqg_top_events=int(on), enable_sqg_bop_events=int(on)))

  def ctrl(self, on: bool) -> None:
    self.uconfig("SQ_THREAD_TRACE_CTRL", fields(self.regs, "SQ_THREAD_TRACE_CTRL", mode=soc21_enum.SQ_TT_MODE_ON if on else soc21_enum.SQ_TT_MODE_OFF,
                                                hiwater=5, util_timer=1, rt_freq=soc21_enum.SQ_TT_RT_FREQ_4096_CLK, draw_event_en=1,
                                                spi_stall_en=1, sq_stall_en=1, reg_at_hwm=2, lowater_offset=4, auto_flush_mode=1))

  def wait_status(self, field: str) -> None:
    """WAIT_REG_MEM on SQ_THREAD_TRACE_STATUS until `field` reads 0 (a register wait: mem_space 0)."""
    mask = gc_registers(self.regs, self.family).SQ_THREAD_TRACE_STATUS.fields[field][1]
    ctl = pm4_nv.WAIT_REG_MEM_MEM_SPACE(0) | pm4_nv.WAIT_REG_MEM_OPERATION(0) | pm4_nv.WAIT_REG_MEM_FUNCTION(WAIT_EQ) | pm4_nv.WAIT_REG_MEM_ENGINE(0)
    self.pkt3(pm4_nv.PACKET3_WAIT_REG_MEM, ctl, reg_addr(self.regs, "SQ_THREAD_TRACE_STATUS", self.family), 0, 0, mask, 4)

  def copy_reg(self, name: str, dest: int) -> None:
    self.pkt3(pm4_nv.PACKET3_COPY_DATA, COPY_SRC_PERF | (COPY_DST_MEM << 8) | COPY_WR_CONFIRM, reg_addr(self.regs, name, self.family), 0,
              dest & 0xFFFFFFFF, dest >> 32)


def start_words(regs: Any, family: str, buffers: list[tuple[int, int]], s: TraceSettings) -> list[int]:
  """PM4 that starts tracing into `buffers` ((address, size) per shader engine, 4 KiB aligned)."""
  e = Emitter(regs, family)
  e.spi_events(True)
  for se, (addr, size) in enumerate(buffers):
    if addr & 0xFFF or size & 0xFFF or not size: raise ValueError(f"SQTT buffer {se} at {addr:#x} of {size:#x} bytes is not 4 KiB aligned")
    e.select_se(se)
    e.uconfig("SQ_THREAD_TRACE_BUF0_SIZE", fields(regs, "SQ_THREAD_TRACE_BUF0_SIZE", base_hi=(addr >> 12) >> 32, size=size >> 12))
    e.uconfig("SQ_THREAD_TRACE_BUF0_BASE", fields(regs, "SQ_THREAD_TRACE_BUF0_BASE", base_lo=(addr >> 12) & 0xFFFFFFFF))
    e.uconfig("SQ_THREAD_TRACE_MASK", fields(regs, "SQ_THREAD_TRACE_MASK", wtype_include=soc21_enum.SQ_TT_WTYPE_INCLUDE_CS_BIT,
                                             simd_sel=s.simd_sel, wgp_sel=s.wgp_sel, sa_sel=s.sa_sel))
    # (soc21_enum names a PERF exclude bit 11, but gc 11.0.0's TOKEN_EXCLUDE field is bits 0-10: bit 11 is TTRACE_EXEC)
    exclude = 0 if (s.itrace_se_mask >> se) & 1 else sum(1 << b for b in INST_TOKENS)
    reg_include = (soc21_enum.SQ_TT_TOKEN_MASK_SQDEC_BIT | soc21_enum.SQ_TT_TOKEN_MASK_SHDEC_BIT | soc21_enum.SQ_TT_TOKEN_MASK_GFXUDEC_BIT |
                   soc21_enum.SQ_TT_TOKEN_MASK_COMP_BIT | soc21_enum.SQ_TT_TOKEN_MASK_CONTEXT_BIT)
    e.uconfig("SQ_THREAD_TRACE_TOKEN_MASK", fields(regs, "SQ_THREAD_TRACE_TOKEN_MASK", token_exclude=exclude, bop_events_token_include=1,
                                                   reg_include=reg_include))
    e.ctrl(True)
  e.select_se(None)
  e.sh("COMPUTE_THREAD_TRACE_ENABLE", 1)
  e.event(soc21_enum.THREAD_TRACE_START)
  return e.words


def stop_words(regs: Any, family: str, n_se: int, info_addr: int) -> list[int]:
  """PM4 that stops tracing and writes each shader engine's WPTR, STATUS and DROPPED_CNTR to `info_addr` + 16*se."""
  e = Emitter(regs, family)
  e.event(soc21_enum.THREAD_TRACE_STOP)
  e.event(soc21_enum.THREAD_TRACE_FINISH)
  e.sh("COMPUTE_THREAD_TRACE_ENABLE", 0)
  for se in range(n_se):
    e.select_se(se)
    e.wait_status("finish_pending")
    e.ctrl(False)
    e.wait_status("busy")
    for i, name in enumerate(("SQ_THREAD_TRACE_WPTR", "SQ_THREAD_TRACE_STATUS", "SQ_THREAD_TRACE_DROPPED_CNTR")):
      e.copy_reg(name, info_addr + INFO_BYTES * se + 4 * i)
  e.select_se(None)
  e.spi_events(False)
  return e.words


@dataclass(frozen=True)
class SEResult:
  """One shader engine's trace as read back: its bytes, whether the buffer filled up, and the status words."""
  data: bytes
  full: bool
  status: int
  dropped: int


def trace_bytes(regs: Any, info: bytes, addr: int, size: int) -> tuple[int, int, int]:
  """(bytes written, STATUS, DROPPED_CNTR) from one shader engine's info slot. On gfx11.0 WPTR.OFFSET counts 32-byte
  lines from address 0, so the buffer's own line address is subtracted."""
  wptr, status, dropped = struct.unpack_from("<III", info)
  n = (wptr & regs.SQ_THREAD_TRACE_WPTR__OFFSET_MASK) * 32 - ((addr >> 5) & regs.SQ_THREAD_TRACE_WPTR__OFFSET_MASK) * 32
  if not 0 <= n <= size: raise RuntimeError(f"SQTT write pointer {wptr:#x} is outside the {size:#x}-byte buffer at {addr:#x}")
  return n, status, dropped


class Tracer:
  """SQTT=1 on one device: every launch made while PROFILE or VIZ records is bracketed by start/stop queues, and its
  shader engines' traces are decoded into a `KernelTrace` for the profile and the viewer. Buffers (SQTT_BUFFER_SIZE MiB
  per shader engine, VRAM) are allocated at the first traced launch."""
  def __init__(self, dev: Any, n_se: int, clock_hz: float, settings: TraceSettings, buffer_mib: int) -> None:
    if buffer_mib < 1: raise ValueError(f"SQTT_BUFFER_SIZE={buffer_mib}: the trace buffer needs at least 1 MiB per shader engine")
    self.dev, self.n_se, self.clock_hz, self.settings, self.size = dev, n_se, clock_hz, settings, buffer_mib << 20
    self.buffers: list[Any] = []
    self.info: Any = None
    self.listings: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # program -> its code listing, as long as it lives

  def ensure_buffers(self) -> None:
    if self.buffers: return
    self.buffers = [self.dev.alloc_gpu(self.size, "vram", cpu_access=True) for _ in range(self.n_se)]
    self.info = self.dev.alloc_gpu(max(INFO_BYTES * self.n_se, 0x1000), "gtt", uncached=True)

  def submit(self, words: list[int]) -> None:
    d = self.dev
    d.hw_compute_queue_t().wait(d.timeline_signal, d.timeline_value - 1).memory_barrier().raw(words).memory_barrier() \
      .signal(d.timeline_signal, d.next_timeline()).submit(d)

  def read(self) -> list[SEResult]:
    out = []
    for se, buf in enumerate(self.buffers):
      n, status, dropped = trace_bytes(self.dev.regs, bytes(self.info.view[INFO_BYTES * se:INFO_BYTES * (se + 1)]), buf.va_addr, buf.size)
      out.append(SEResult(bytes(buf.view[:n]), n >= buf.size - 32 or dropped > 0, status, dropped))
    return out

  def launch(self, prg: Any, run: Any) -> Any:
    """Run `run()` (the launch, waited for) between start and stop; returns its result after recording the trace."""
    d = self.dev
    self.ensure_buffers()
    self.info.view[:] = bytes(len(self.info.view))
    st = capture.now()  # the launch's profile bar starts about here too: the waves are placed from it
    self.submit(start_words(d.regs, d.family, [(b.va_addr, b.size) for b in self.buffers], self.settings))
    result = run()
    self.submit(stop_words(d.regs, d.family, self.n_se, self.info.va_addr))
    d.synchronize()
    self.record(prg, st, self.read())
    return result

  def record(self, prg: Any, st: int, ses: list[SEResult]) -> None:
    listing = self.listings.get(prg)
    if listing is None: listing = self.listings[prg] = sqtt.code_listing(prg.disassembly(), prg.name)
    s, waves = self.settings, []
    for se, r in enumerate(ses):
      for w in sqtt.wave_traces(r.data, listing, strict=not r.full, selected=(s.sa_sel, s.wgp_sel, s.simd_sel)):
        w.se = se
        waves.append(w)
    full = [se for se, r in enumerate(ses) if r.full]
    if full: warnings.warn(f"{self.dev.device}: SQTT buffer full on shader engine(s) {full} while tracing {prg.name}: the trace is cut "
                           f"short; raise SQTT_BUFFER_SIZE (MiB per shader engine, now {self.size >> 20})", RuntimeWarning, stacklevel=3)
    capture.TRACE.kernel_trace(capture.KernelTrace(self.dev.device, prg.name, st, self.clock_hz, waves, truncated=bool(full)))
