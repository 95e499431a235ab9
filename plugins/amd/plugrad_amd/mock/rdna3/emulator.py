"""Runs one AQL-style dispatch on the emulated RDNA3 (gfx1100, wave32) compute unit: reads the 64-byte amdhsa kernel
descriptor at `kernel_object`, fetches and decodes the code it points at (cached by address and bytes), sets the
initial wave state as the hardware's SPI does (user SGPRs: private segment buffer, dispatch ptr, queue ptr, kernarg
ptr, dispatch id, flat scratch init, private segment size, then workgroup ids and the scratch wave offset; work-item
ids packed in v0 as x | y<<10 | z<<20) and runs the waves of each workgroup round-robin between s_barriers. When the
dispatch asks for a thread trace (Dispatch.sqtt) it also records each wave's executed PCs and hands them to trace.py,
which writes the SQTT streams; the results are the same either way."""
from __future__ import annotations

import functools
import struct
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from plugrad_amd.mock.dispatch import Dispatch, GPUMemory, PageFault
from plugrad_amd.mock.rdna3 import trace
from plugrad_amd.mock.rdna3.compile import BARRIER, ENDPGM, Fn, compile_inst
from plugrad_amd.mock.rdna3.decode import DecodeError, Inst, decode_one
from plugrad_amd.mock.rdna3.wave import LANES, EmulatorError, Wave

SUPPORTED_ARCHS = ("gfx1100", "gfx1101", "gfx1102")


@dataclass(frozen=True)
class KernelDescriptor:
  """The fields of the amdhsa kernel descriptor the emulator uses (AMDGPUUsage "Kernel Descriptor" layout)."""
  group_segment_fixed_size: int
  private_segment_fixed_size: int
  kernarg_size: int
  entry_offset: int
  rsrc1: int
  rsrc2: int
  rsrc3: int
  code_properties: int

  @classmethod
  def parse(cls, raw: bytes) -> KernelDescriptor:
    if len(raw) != 64: raise EmulatorError(f"kernel descriptor must be 64 bytes, got {len(raw)}")
    g, p, ka = struct.unpack_from("<III", raw, 0)
    entry = struct.unpack_from("<q", raw, 16)[0]
    r3, r1, r2, props = struct.unpack_from("<IIIH", raw, 44)
    return cls(g, p, ka, entry, r1, r2, r3, props)

  @property
  def vgprs(self) -> int:  # granule of 8 VGPRs in wave32 on gfx10+
    return ((self.rsrc1 & 0x3F) + 1) * 8

  @property
  def user_sgpr_count(self) -> int:
    return (self.rsrc2 >> 1) & 0x1F

  @property
  def wave32(self) -> bool:
    return bool(self.code_properties & (1 << 10))

  @property
  def float_mode(self) -> int:
    """MODE register value at wave start: denormal modes from rsrc1 (round modes are required to be nearest-even)."""
    return ((self.rsrc1 >> 12) & 0xF) | (((self.rsrc1 >> 16) & 0xF) << 4)

  def enabled(self, bit: int) -> bool:
    return bool(self.code_properties >> bit & 1)


class Program:
  """Lazily decoded and compiled code of one kernel entry; keyed by the code bytes it has seen."""

  def __init__(self, mem: GPUMemory, entry: int, name: str):
    self.entry, self.name, self.mem = entry, name, mem
    self.ops: dict[int, tuple[Fn, int]] = {}
    self.insts: dict[int, Inst] = {}  # the decoded instructions, for the thread trace
    self.extent = 0
    self._code = b""

  def _fetch(self, pc: int) -> bytes:
    for n in (12, 8, 4):
      try:
        return self.mem.read(self.entry + pc, n)
      except PageFault:
        continue
    raise PageFault(self.entry + pc, 4)

  def at(self, pc: int) -> tuple[Fn, int]:
    hit = self.ops.get(pc)
    if hit is not None: return hit
    raw = self._fetch(pc)
    try:
      inst: Inst = decode_one(raw, 0)
    except DecodeError as e:
      raise EmulatorError(f"kernel {self.name}: {e} (code offset {pc:#x})") from None
    inst.addr = pc
    fn = compile_inst(inst, self.name)
    self.insts[pc] = inst
    STATS.decoded[(inst.enc, inst.name or "?")] += 1
    self.ops[pc] = (fn, pc + inst.size)
    self.extent = max(self.extent, pc + inst.size)
    return self.ops[pc]

  def still_valid(self) -> bool:
    return self.extent == 0 or self.mem.read(self.entry, self.extent) == self._code

  def snapshot(self) -> None:
    self._code = self.mem.read(self.entry, self.extent) if self.extent else b""


_PROGRAMS: dict[tuple[int, bytes], Program] = {}
_NAMES: dict[int, str] = {}
_ELF_BASE: dict[int, int] = {}


def name_kernel(kernel_object: int, name: str) -> None:
  """Tell the emulator the symbol name of the kernel descriptor at `kernel_object` (used in its error messages);
  loaders call this when they place a code object, unnamed kernels are called by their descriptor address."""
  _NAMES[kernel_object] = name


@dataclass
class Stats:
  """Wave-instructions executed, seconds spent and dispatches run; `decoded` counts the code locations decoded per
  (encoding, mnemonic) (code is decoded when first executed: the mnemonics that ran), `kernels` the kernel names."""
  instructions: int = 0
  seconds: float = 0.0
  dispatches: int = 0
  decoded: Counter = field(default_factory=Counter)
  kernels: set = field(default_factory=set)

  def reset(self) -> None:
    self.instructions, self.seconds, self.dispatches = 0, 0.0, 0
    self.decoded, self.kernels = Counter(), set()

  @property
  def per_second(self) -> float:
    return self.instructions / self.seconds if self.seconds else 0.0


STATS = Stats()


def _elf_kernel_name(mem: GPUMemory, kd_addr: int) -> str | None:
  """The kernel's symbol name, when its code object is mapped the way loaders map it (PT_LOAD segments at their
  virtual addresses from a base, so the ELF header, program headers and .dynsym sit below the descriptor)."""
  try:
    base = _ELF_BASE.get(kd_addr)
    if base is None or mem.read(base, 4) != b"\x7fELF":
      base = kd_addr & ~0xFFF
      for _ in range(256):
        if mem.read(base, 4) == b"\x7fELF": break
        base -= 0x1000
      else: return None
      _ELF_BASE[kd_addr] = base
    phoff, = struct.unpack("<Q", mem.read(base + 0x20, 8))
    phentsize, phnum = struct.unpack("<HH", mem.read(base + 0x36, 4))
    dyn = next((struct.unpack_from("<Q", ph, 16)[0] for i in range(phnum)
                if struct.unpack_from("<I", ph := mem.read(base + phoff + i * phentsize, 56))[0] == 2), None)  # PT_DYNAMIC
    if dyn is None: return None
    tags: dict[int, int] = {}
    for i in range(64):
      tag, val = struct.unpack("<qQ", mem.read(base + dyn + 16 * i, 16))
      if tag == 0: break
      tags[tag] = val
    symtab, strtab, hashtab = tags.get(6), tags.get(5), tags.get(4)  # DT_SYMTAB, DT_STRTAB, DT_HASH
    if symtab is None or strtab is None or hashtab is None: return None
    nsyms, = struct.unpack("<I", mem.read(base + hashtab + 4, 4))
    for i in range(min(nsyms, 4096)):
      st_name, _, _, _, st_value, _ = struct.unpack("<IBBHQQ", mem.read(base + symtab + 24 * i, 24))
      if base + st_value != kd_addr: continue
      raw = mem.read(base + strtab + st_name, 256)
      name = raw[:raw.index(b"\0")].decode(errors="replace") if b"\0" in raw else raw.decode(errors="replace")
      if name.endswith(".kd"): return name[:-3]
  except (PageFault, struct.error, ValueError):
    return None
  return None


def _program(mem: GPUMemory, d: Dispatch, kd: KernelDescriptor, kd_raw: bytes) -> Program:
  entry = d.kernel_object + kd.entry_offset
  key = (entry, kd_raw)
  prog = _PROGRAMS.get(key)
  name = _NAMES.get(d.kernel_object) or _elf_kernel_name(mem, d.kernel_object) or f"at {d.kernel_object:#x}"
  if prog is not None and prog.name == name:
    prog.mem = mem  # the mock hands a fresh GPUMemory view per queue run: the code bytes decide whether the cache holds
    if prog.still_valid(): return prog
  prog = Program(mem, entry, name)
  _PROGRAMS[key] = prog
  if len(_PROGRAMS) > 256: _PROGRAMS.pop(next(iter(_PROGRAMS)))
  return prog


def _initial_sgprs(w: Wave, kd: KernelDescriptor, d: Dispatch, group: tuple[int, int, int], wave_in_group: int, scratch_off: int) -> None:
  if kd.enabled(1) or kd.enabled(2):
    raise EmulatorError("kernel uses the dispatch/queue pointer user SGPRs, which the emulator does not provide")
  s = 0
  def put(vals: list[int]) -> None:
    nonlocal s
    for v in vals:
      if s < 106: w.s[s] = v & 0xFFFFFFFF
      s += 1
  if kd.enabled(0): put([0, 0, 0, 0])                             # private segment buffer (unused with architected flat scratch)
  if kd.enabled(3): put([d.kernarg_address & 0xFFFFFFFF, d.kernarg_address >> 32])
  if kd.enabled(4): put([0, 0])                                    # dispatch id
  if kd.enabled(5): put([0, 0])                                    # flat scratch init (architected on gfx11)
  if kd.enabled(6): put([d.private_segment_size])
  s = max(s, kd.user_sgpr_count)
  for dim in range(3):
    if kd.rsrc2 >> (7 + dim) & 1: put([group[dim]])
  if kd.rsrc2 >> 10 & 1: put([wave_in_group])                      # workgroup info
  if kd.rsrc2 & 1: put([scratch_off])                               # private segment wave offset


def _run_wave(w: Wave, prog: Program, budget: list[int], pcs: list[int] | None = None) -> int:
  """Run until s_endpgm or s_barrier; returns ENDPGM or BARRIER. With `pcs` (a traced dispatch) each executed
  instruction's PC is appended to it."""
  pc = w.pc
  ops = prog.ops
  n = 0
  try:
    while True:
      hit = ops.get(pc)
      fn, nxt = hit if hit is not None else prog.at(pc)
      if pcs is not None: pcs.append(pc)
      r = fn(w)
      n += 1
      if r is None: pc = nxt
      elif r >= 0: pc = r
      else:
        w.pc = nxt
        return r
      if n > budget[0]: raise EmulatorError(f"kernel {prog.name}: wave exceeded {budget[0]} instructions (infinite loop?)")
  except IndexError:
    raise EmulatorError(f"kernel {prog.name}: the instruction at offset {pc:#x} uses a register beyond the {len(w.v)} VGPRs "
                        "the kernel descriptor grants") from None
  finally:
    w.count += n
    budget[0] -= n


@functools.lru_cache(maxsize=1024)
def _workitem_ids(wave_in_group: int, local: tuple[int, int, int]) -> tuple[np.ndarray, int]:
  """v0 of a wave (x | y<<10 | z<<20 per lane) and the mask of lanes inside the workgroup."""
  flat = wave_in_group * LANES + np.arange(LANES)
  x, y, z = flat % local[0], (flat // local[0]) % local[1], flat // (local[0] * local[1])
  valid = flat < local[0] * local[1] * local[2]
  return (x | (y << 10) | (z << 20)).astype(np.uint32), int(np.packbits(valid, bitorder="little").view("<u4")[0])


MAX_INSTRUCTIONS = 1 << 31


def execute(mem: GPUMemory, d: Dispatch) -> None:
  """Executor for plugrad_amd.mock.dispatch: run dispatch `d` to completion against `mem`."""
  if d.arch not in SUPPORTED_ARCHS: raise EmulatorError(f"the RDNA3 emulator runs {', '.join(SUPPORTED_ARCHS)}, not {d.arch}")
  kd_raw = mem.read(d.kernel_object, 64)
  kd = KernelDescriptor.parse(kd_raw)
  if not kd.wave32: raise EmulatorError("kernel descriptor is not wave32 (ENABLE_WAVEFRONT_SIZE32 clear); only wave32 is emulated")
  if any(g <= 0 for g in d.workgroup_size) or any(g < 0 for g in d.grid_size):
    raise EmulatorError(f"bad dispatch sizes grid={d.grid_size} workgroup={d.workgroup_size}")
  if any(x >= 1024 for x in d.workgroup_size): raise EmulatorError(f"workgroup size {d.workgroup_size} exceeds 1023 per dimension")
  prog = _program(mem, d, kd, kd_raw)
  groups = tuple(-(-g // l) for g, l in zip(d.grid_size, d.workgroup_size))
  threads = d.workgroup_size[0] * d.workgroup_size[1] * d.workgroup_size[2]
  nwaves = -(-threads // LANES)
  lds_size = max(d.group_segment_size, kd.group_segment_fixed_size)
  scratch = max(d.private_segment_size, kd.private_segment_fixed_size)
  budget = [MAX_INSTRUCTIONS]
  t0 = time.perf_counter()
  start = budget[0]
  logs: list[list[list[int]]] | None = [] if d.sqtt else None  # per workgroup, per wave: the executed PCs
  with np.errstate(all="ignore"):  # IEEE overflow/invalid are results here, not Python warnings
    for gz in range(groups[2]):
      for gy in range(groups[1]):
        for gx in range(groups[0]):
          _run_group(mem, d, kd, prog, (gx, gy, gz), nwaves, lds_size, scratch, budget, logs)
  prog.snapshot()
  if logs is not None: trace.write(d, logs, prog.insts)
  STATS.instructions += start - budget[0]
  STATS.seconds += time.perf_counter() - t0
  STATS.dispatches += 1
  STATS.kernels.add(prog.name)


def _run_group(mem: GPUMemory, d: Dispatch, kd: KernelDescriptor, prog: Program, group: tuple[int, int, int], nwaves: int,
               lds_size: int, scratch: int, budget: list[int], logs: list[list[list[int]]] | None = None) -> None:
  lds = np.zeros(lds_size, np.uint8)
  # partial workgroups at the grid edge: the hardware launches only the work-items inside the grid
  local = tuple(min(l, g - i * l) for l, g, i in zip(d.workgroup_size, d.grid_size, group))
  waves = []
  threads = local[0] * local[1] * local[2]
  for i in range(-(-threads // LANES)):
    w = Wave(kd.vgprs, mem, lds, scratch, prog.name, i)
    w.code_base = prog.entry
    w.set_mode(kd.float_mode)
    _initial_sgprs(w, kd, d, group, i, 0)
    ids, valid = _workitem_ids(i, local)
    w.v[0] = ids
    w.set_exec(valid)
    waves.append(w)
  live = list(waves)
  pcs: list[list[int]] = [[] for _ in waves]
  if logs is not None: logs.append(pcs)
  while live:
    states = [_run_wave(w, prog, budget, None if logs is None else pcs[w.wave_id]) for w in live]
    at_barrier = [w for w, s in zip(live, states) if s == BARRIER]
    if at_barrier and len(at_barrier) != len(live):
      ended = [w.wave_id for w, s in zip(live, states) if s == ENDPGM]
      raise EmulatorError(f"kernel {prog.name}: workgroup {group}: waves {ended} ended while waves "
                          f"{[w.wave_id for w in at_barrier]} wait at s_barrier (a barrier not all waves reach)")
    live = at_barrier
