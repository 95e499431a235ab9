"""The emulator's thread trace (SQTT): turns the instruction sequences the waves of a dispatch executed into each traced
shader engine's packet stream (plugrad_amd.sqtt's RDNA3 layout), with cycles from the timing model (timing.py).

Placement: workgroup g (in dispatch order, x fastest) runs on shader engine g % shader_engines; the k-th workgroup of a
shader engine (k = g // shader_engines) goes to WGP slot j = k % 8 of it, shader array j % 2, WGP j // 2; a WGP runs
one workgroup at a time, the next starting when every wave of the previous one ended. Wave i of a workgroup runs on
SIMD i % 4 of its WGP in wave slot i // 4.

Each TraceTarget gets: LAYOUT_HEADER (layout 3, simd = the selected SIMD) at cycle 0; WAVESTART and WAVEEND (sa,
wgp, simd, wave slot; id7 0) for every wave on its shader engine; for the waves on the selected shader array, WGP and
SIMD one token per executed instruction at its issue cycle (`token`): VALUINST for plain VALU, IMMEDIATE for the
immediate-class SOPP and the s_waitcnt family, INST with its op for the rest, JUMP / JUMP_NO for branches by whether
the wave took them; s_delay_alu and s_endpgm give none. token_exclude drops the kinds it names. The stream is padded
with filler to a whole number of 32-byte lines."""
from __future__ import annotations

from dataclasses import dataclass

from plugrad_amd import sqtt
from plugrad_amd.mock.dispatch import Dispatch, TraceTarget
from plugrad_amd.mock.rdna3 import timing
from plugrad_amd.mock.rdna3.decode import Inst
from plugrad_amd.mock.rdna3.wave import EmulatorError

T, OP = sqtt.T, sqtt.INST_OP
WGPS_PER_SE, SIMDS_PER_WGP = 8, 4
EXCLUDE_BIT = {T["VALUINST"]: 2, T["WAVESTART"]: 4, T["WAVEEND"]: 4, T["IMMEDIATE"]: 5, T["INST"]: 8}
IMMEDIATE = ("s_nop", "s_clause", "s_sleep", "s_set_inst_prefetch_distance", "s_wait_idle", "s_wait_event")
NULL_SADDR = 0x7C
LINE = 32


def placement(g: int, shader_engines: int) -> tuple[int, int, int]:
  """(shader engine, shader array, WGP) of workgroup g."""
  j = (g // shader_engines) % WGPS_PER_SE
  return g % shader_engines, j % 2, j // 2


def _dwords(name: str) -> int:
  for suffix, n in (("b64", 2), ("b96", 3), ("b128", 4)):
    if name.endswith(suffix): return n
  return 1


def _memory_op(inst: Inst, name: str) -> int:
  store = "store" in name or "atomic" in name
  if inst.enc == "DS": return OP["LDS_WR_2"] if store else OP["LDS_RD"]
  if inst.enc == "GLOBAL":
    null = inst.saddr == NULL_SADDR
    if not store: return OP["SGMEM_RD_2"] if null else OP["SGMEM_RD_1"]
    return 0x24 + int(null) + _dwords(name) - 1
  return OP["FLAT_WR_3"] if store else OP["FLAT_RD_2"]


def _valu_op(name: str) -> int | None:
  if name.startswith("v_cmpx_"): return OP["VALU1_WR_EXEC"]
  busy = timing.valu_busy(name)
  return {1: None, 2: OP["VALUB_2"], 4: OP["VALUT_4"] if timing.TRANSCENDENTAL.match(name) else OP["VALUB_4"], 16: OP["VALUB_16"]}[busy]


def token(inst: Inst, taken: bool) -> tuple[int, int | None] | None:
  """(packet type, INST op or None) of the token an executed instruction produces; None for no token."""
  name, enc = inst.name or "", inst.enc
  if name in ("s_delay_alu", "s_endpgm"): return None
  if name.startswith("s_waitcnt") or name in IMMEDIATE: return T["IMMEDIATE"], None
  if enc == "SOPP":
    if name == "s_branch" or name.startswith("s_cbranch_"): return T["INST"], OP["JUMP"] if taken else OP["JUMP_NO"]
    return T["INST"], {"s_barrier": OP["BARRIER"], "s_sendmsg": OP["MESSAGE"]}.get(name, OP["SALU"])
  if enc.startswith("SOP"): return T["INST"], OP["SALU_WR_EXEC"] if "saveexec" in name else OP["SALU"]
  if enc == "SMEM": return T["INST"], OP["SMEM_RD"]
  if enc in ("DS", "GLOBAL", "FLAT", "SCRATCH"): return T["INST"], _memory_op(inst, name)
  if enc.startswith("VOP"):
    op = _valu_op(name)
    return (T["VALUINST"], None) if op is None else (T["INST"], op)
  return T["INST"], OP["SGMEM_RD_2"]  # MUBUF cache invalidations


@dataclass
class TimedWave:
  """One executed wave: where it ran, and its instructions (decoded, branch taken) with the cycles from the model."""
  se: int
  sa: int
  wgp: int
  simd: int
  slot: int
  insts: list[tuple[Inst, bool]]
  times: timing.WaveTimes


def _executed(pcs: list[int], insts: dict[int, Inst]) -> list[tuple[Inst, bool]]:
  """(instruction, whether the next executed PC is not the next in memory) for a wave's executed PCs."""
  return [(insts[pc], i + 1 < len(pcs) and pcs[i + 1] != pc + insts[pc].size) for i, pc in enumerate(pcs)]


def time_waves(groups: list[list[list[int]]], insts: dict[int, Inst], shader_engines: int, traced_se: set[int]) -> list[TimedWave]:
  """The timed waves of the workgroups (each a list of its waves' executed PCs) on the traced shader engines."""
  free_at: dict[tuple[int, int, int], int] = {}
  ops = {pc: timing.classify(inst) for pc, inst in insts.items()}
  out = []
  for g, pcs in enumerate(groups):
    where = placement(g, shader_engines)
    if where[0] not in traced_se: continue
    executed = [_executed(p, insts) for p in pcs]
    times = timing.schedule([[ops[pc] for pc in p] for p in pcs], [i % SIMDS_PER_WGP for i in range(len(pcs))], free_at.get(where, 0))
    free_at[where] = max((t.end for t in times), default=free_at.get(where, 0))
    out += [TimedWave(*where, i % SIMDS_PER_WGP, i // SIMDS_PER_WGP, ex, t) for i, (ex, t) in enumerate(zip(executed, times))]
  return out


def _events(target: TraceTarget, waves: list[TimedWave]) -> list[tuple[int, int, int, int, dict[str, int]]]:
  """(cycle, rank, order, packet type, fields) of one shader engine's trace; rank puts a WAVEEND before a WAVESTART
  and both before instruction tokens of the same cycle."""
  ev: list[tuple[int, int, int, int, dict[str, int]]] = []
  for w in (w for w in waves if w.se == target.se):
    where = dict(sa=w.sa, wgp=w.wgp, simd=w.simd, wave=w.slot)
    ev.append((w.times.start, 1, len(ev), T["WAVESTART"], dict(where, id7=0)))
    ev.append((w.times.end, 0, len(ev), T["WAVEEND"], where))
    if (w.sa, w.wgp, w.simd) != (target.sa_sel, target.wgp_sel, target.simd_sel): continue
    for (inst, taken), cycle in zip(w.insts, w.times.issue):
      tok = token(inst, taken)
      if tok is not None:
        ev.append((cycle, 2, len(ev), tok[0], dict(wave=w.slot) if tok[1] is None else dict(wave=w.slot, op=tok[1])))
  return [e for e in ev if not target.token_exclude >> EXCLUDE_BIT[e[3]] & 1]


def stream(target: TraceTarget, waves: list[TimedWave]) -> bytes:
  """One shader engine's trace bytes, a whole number of 32-byte lines."""
  header = (0, T["LAYOUT_HEADER"], dict(layout=sqtt.LAYOUT_RDNA3, simd=target.simd_sel))
  ev = [header] + [(c, t, f) for c, _, _, t, f in sorted(_events(target, waves), key=lambda e: e[:3])]
  data = sqtt.encode(sqtt.pack_timed(ev))
  return data + bytes(-len(data) % LINE)


def write(d: Dispatch, groups: list[list[list[int]]], insts: dict[int, Inst]) -> None:
  """Write the dispatch's trace to each of its TraceTargets."""
  if d.shader_engines < 1: raise EmulatorError(f"thread trace of a dispatch on {d.shader_engines} shader engines")
  waves = time_waves(groups, insts, d.shader_engines, {t.se for t in d.sqtt})
  for target in d.sqtt: target.write(stream(target, waves))
