"""A simple cycle model of one workgroup on one RDNA3 WGP, for the emulator's thread trace (SQTT). It is a model with
round numbers, not a measurement of the hardware; the trace only needs cycles that follow these rules:

- Every wave of the workgroup starts at the same cycle (`start`); wave i sits on the SIMD its caller names.
- Each SIMD issues at most one instruction per cycle, from the oldest ready wave (the lowest wave number).
- After an instruction the wave may issue again `busy` cycles later: VALU 1 (a wave32 instruction), transcendentals
  (v_exp/log/rcp/rsq/sqrt/sin/cos) 4, 64-bit shifts 2, v_mad_u64/i64 4, other f64 16; SALU, branches and the rest 1;
  s_nop N waits N+1, s_sleep N 64*N.
- Memory instructions take 1 issue cycle and complete LATENCY cycles later: SMEM 32 and LDS 16 (lgkmcnt), VMEM loads
  128 (vmcnt), VMEM stores 64 (vscnt); flat/global/scratch atomics count as stores.
- s_waitcnt (vmcnt, lgkmcnt fields of its simm16) and s_waitcnt_vmcnt/vscnt/lgkmcnt (their simm16; the SGPR operand is
  taken to be null) issue, then the wave waits until at most that many of its own operations of the counter are
  still outstanding (expcnt is not modelled).
- s_barrier issues, then the wave waits until every wave of the workgroup that has not ended reached it; all of them
  go on the cycle after the last arrival.
- s_endpgm issues and the wave ends the cycle after.
- Instructions that give no trace token (s_delay_alu) still take an issue cycle, like any other SOPP.
- Nothing is shared between WGPs (no memory bandwidth or cache model): each workgroup is timed on its own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from plugrad_amd.mock.rdna3.decode import Inst
from plugrad_amd.mock.rdna3.wave import EmulatorError

LATENCY = {"SMEM": 32, "LDS": 16, "VMEM_LOAD": 128, "VMEM_STORE": 64}
COUNTER = {"VMEM_LOAD": 0, "VMEM_STORE": 1, "SMEM": 2, "LDS": 2}  # vmcnt, vscnt, lgkmcnt
NO_LIMIT = 1 << 30
TRANSCENDENTAL = re.compile(r"^v_(exp|log|rcp|rsq|sqrt|sin|cos)_")
_SHIFT64 = re.compile(r"^v_(lshlrev|lshrrev|ashrrev)_[bi]64")


@dataclass(frozen=True)
class Op:
  """An instruction as the model sees it: its unit ("VALU", "SALU", "SMEM", "LDS", "VMEM_LOAD", "VMEM_STORE", "WAIT",
  "BARRIER", "END", "OTHER"), the cycles until its wave may issue again, and for WAIT the outstanding operations
  allowed per counter (vmcnt, vscnt, lgkmcnt)."""
  unit: str
  busy: int = 1
  limits: tuple[int, int, int] = (NO_LIMIT, NO_LIMIT, NO_LIMIT)


def valu_busy(name: str) -> int:
  """Cycles before a wave may issue again after the VALU instruction `name`."""
  if TRANSCENDENTAL.match(name): return 4
  if _SHIFT64.match(name): return 2
  if name.startswith(("v_mad_u64", "v_mad_i64")): return 4
  return 16 if name.endswith("_f64") else 1


def _sopp(inst: Inst, name: str) -> Op:
  k = inst.simm16
  if name == "s_waitcnt": return Op("WAIT", limits=((k >> 10) & 0x3F, NO_LIMIT, (k >> 4) & 0x3F))
  if name == "s_barrier": return Op("BARRIER")
  if name == "s_endpgm": return Op("END")
  if name == "s_nop": return Op("OTHER", (k & 0xF) + 1)
  if name == "s_sleep": return Op("OTHER", 64 * (k & 0x7F))
  return Op("SALU" if "branch" in name else "OTHER")


_SOPK_WAIT = {"s_waitcnt_vmcnt": 0, "s_waitcnt_vscnt": 1, "s_waitcnt_lgkmcnt": 2}


def classify(inst: Inst) -> Op:
  """The model's view of one decoded instruction."""
  name, enc = inst.name or "", inst.enc
  if enc == "SOPP": return _sopp(inst, name)
  if name in _SOPK_WAIT:
    limits = [NO_LIMIT] * 3
    limits[_SOPK_WAIT[name]] = inst.simm16
    return Op("WAIT", limits=(limits[0], limits[1], limits[2]))
  if enc.startswith("SOP"): return Op("SALU")
  if enc == "SMEM": return Op("SMEM")
  if enc == "DS": return Op("LDS")
  if enc in ("FLAT", "GLOBAL", "SCRATCH"): return Op("VMEM_STORE" if "store" in name or "atomic" in name else "VMEM_LOAD")
  if enc.startswith("VOP"): return Op("VALU", valu_busy(name))
  return Op("OTHER")


@dataclass
class WaveTimes:
  """When one wave started, issued each of its instructions and ended."""
  start: int
  issue: list[int]
  end: int


def _wait_until(pending: list[list[int]], limits: tuple[int, int, int], t: int) -> int:
  """The cycle at which each counter has at most its limit of operations outstanding (completing after cycle t)."""
  until = t
  for c, limit in enumerate(limits):
    outstanding = sorted(x for x in pending[c] if x > t)
    pending[c] = outstanding
    if len(outstanding) > limit: until = max(until, outstanding[len(outstanding) - limit - 1])
  return until


class _Workgroup:
  def __init__(self, waves: list[list[Op]], simds: list[int], start: int) -> None:
    self.ops, self.start = waves, start
    self.idx, self.ready = [0] * len(waves), [start] * len(waves)
    self.issue: list[list[int]] = [[] for _ in waves]
    self.end: list[int | None] = [None] * len(waves)
    self.pending = [[[], [], []] for _ in waves]
    self.barrier: dict[int, int] = {}
    self.by_simd: dict[int, list[int]] = {}
    for w, s in enumerate(simds): self.by_simd.setdefault(s, []).append(w)

  def runnable(self, w: int, t: int) -> bool:
    return self.end[w] is None and w not in self.barrier and self.ready[w] <= t

  def issue_one(self, w: int, t: int) -> None:
    op = self.ops[w][self.idx[w]]
    self.issue[w].append(t)
    self.idx[w] += 1
    self.ready[w] = t + op.busy
    if op.unit in LATENCY: self.pending[w][COUNTER[op.unit]].append(t + LATENCY[op.unit])
    elif op.unit == "WAIT": self.ready[w] = max(self.ready[w], _wait_until(self.pending[w], op.limits, t))
    elif op.unit == "BARRIER": self.barrier[w] = t
    if op.unit == "END": self.end[w] = t + 1
    elif self.idx[w] == len(self.ops[w]):  # a stream without s_endpgm ends when its last instruction is done
      self.end[w] = self.ready[w]
      self.barrier.pop(w, None)

  def cycle(self, t: int) -> None:
    for waves in self.by_simd.values():
      w = next((w for w in waves if self.runnable(w, t)), None)
      if w is not None: self.issue_one(w, t)
    if self.barrier and len(self.barrier) == sum(e is None for e in self.end):
      go = max(self.barrier.values()) + 1
      for w in self.barrier: self.ready[w] = go
      self.barrier.clear()

  def next_cycle(self, t: int) -> int:
    waiting = [self.ready[w] for w in range(len(self.ops)) if self.end[w] is None and w not in self.barrier]
    if not waiting: raise EmulatorError("timing model: every live wave waits at an s_barrier that cannot release")
    return max(t + 1, min(waiting))


def schedule(waves: list[list[Op]], simds: list[int], start: int = 0) -> list[WaveTimes]:
  """Issue cycles of each wave's instruction stream (its ops in executed order) under the rules above."""
  wg = _Workgroup(waves, simds, start)
  for w, ops in enumerate(waves):
    if not ops: wg.end[w] = start
  t = start
  while any(e is None for e in wg.end):
    wg.cycle(t)
    if all(e is not None for e in wg.end): break
    t = wg.next_cycle(t)
  return [WaveTimes(start, wg.issue[w], e if e is not None else start) for w, e in enumerate(wg.end)]
