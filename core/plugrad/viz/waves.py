"""Device instruction traces (`capture.KernelTrace`, SQTT on AMD) in the saved trace and the viewer's waves API.

Saved form, one entry of the trace's `waves` list per traced launch:
`{"device", "kernel", "st" (ns after the recording's start, the profile's clock), "clock_hz", "truncated",
"texts": [disassembly, ...], "waves": [[se, cu, simd, slot, start, end, [[pc, cycle, duration, kind, text id], ...]], ...]}`
with `kind` an index into `KINDS`; each distinct instruction text is stored once per launch.
"""
from __future__ import annotations

from typing import Any

from plugrad.viz.capture import KernelTrace, WaveInst, WaveTrace

KINDS = ("VALU", "SALU", "SMEM", "VMEM", "LDS", "BRANCH", "WAIT", "BARRIER", "OTHER")
_KIND_ID = {k: i for i, k in enumerate(KINDS)}


def encode(kt: KernelTrace, t0: int) -> dict:
  """`kt` in the compact saved form; `t0` is the recording's start (perf_counter ns)."""
  texts: dict[str, int] = {}
  def inst(i: WaveInst) -> list:
    tid = texts.setdefault(i.text, len(texts))
    return [i.pc, i.cycle, i.duration, _KIND_ID.get(i.kind, _KIND_ID["OTHER"]), tid]
  waves = [[w.se, w.cu, w.simd, w.slot, w.start, w.end, [inst(i) for i in w.insts]] for w in kt.waves]
  return {"device": kt.device, "kernel": kt.kernel, "st": kt.st - t0, "clock_hz": kt.clock_hz, "truncated": kt.truncated,
          "texts": list(texts), "waves": waves}


def _int(x: Any, what: str) -> int:
  if type(x) is not int: raise ValueError(f"{what} is {x!r}, not an integer")
  return x


def _inst(row: Any, texts: list, where: str) -> WaveInst:
  if not isinstance(row, list) or len(row) != 5: raise ValueError(f"{where} is {row!r}, not [pc, cycle, duration, kind, text]")
  pc, cycle, dur, kind, tid = (_int(x, f"{where}[{j}]") for j, x in enumerate(row))
  if not 0 <= kind < len(KINDS): raise ValueError(f"{where}: kind {kind} is not one of 0..{len(KINDS) - 1}")
  if not 0 <= tid < len(texts): raise ValueError(f"{where}: text {tid} is not one of the launch's {len(texts)} texts")
  return WaveInst(pc, texts[tid], cycle, dur, KINDS[kind])


def _wave(row: Any, texts: list, where: str) -> WaveTrace:
  if not isinstance(row, list) or len(row) != 7 or not isinstance(row[6], list):
    raise ValueError(f"{where} is not [se, cu, simd, slot, start, end, [instructions]]")
  se, cu, simd, slot, start, end = (_int(x, f"{where}[{j}]") for j, x in enumerate(row[:6]))
  return WaveTrace(se, cu, simd, slot, start, end, [_inst(r, texts, f"{where} instruction {j}") for j, r in enumerate(row[6])])


def decode(d: Any, where: str = "traced launch") -> KernelTrace:
  """A saved entry back as a `KernelTrace` (its `st` stays relative to the recording's start); ValueError naming the
  bad field for anything malformed."""
  if not isinstance(d, dict) or not {"device", "kernel", "st", "clock_hz", "texts", "waves"} <= set(d):
    raise ValueError(f"{where} is not a saved instruction trace (keys: {sorted(d)[:8] if isinstance(d, dict) else type(d).__name__})")
  texts, clock = d["texts"], d["clock_hz"]
  if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts): raise ValueError(f"{where}: texts is not a list of strings")
  if not isinstance(clock, (int, float)) or isinstance(clock, bool) or not 0 < clock < float("inf"):
    raise ValueError(f"{where}: clock_hz {clock!r} is not a positive number")
  if not isinstance(d["waves"], list): raise ValueError(f"{where}: waves is not a list")
  if not isinstance(d["device"], str) or not isinstance(d["kernel"], str): raise ValueError(f"{where}: device and kernel must be strings")
  waves = [_wave(w, texts, f"{where} wave {j}") for j, w in enumerate(d["waves"])]
  return KernelTrace(d["device"], d["kernel"], _int(d["st"], f"{where} st"), float(clock), waves, bool(d.get("truncated", False)))


def cycle_span(kt: KernelTrace) -> tuple[int, int]:
  """The first and last cycle any wave or instruction of the launch covers ((0, 0) without waves)."""
  lo = min((w.start for w in kt.waves), default=0)
  hi = max((max([w.end, *(i.cycle + i.duration for i in w.insts)]) for w in kt.waves), default=0)
  lo = min([lo, *(w.insts[0].cycle for w in kt.waves if w.insts)])
  return lo, hi


def launch_summary(index: int, kt: KernelTrace) -> dict:
  """One line of `/api/waves`: index, kernel, device, number of waves and instructions, cycles covered, and when it
  was launched (`st_us`, on the profile's clock)."""
  lo, hi = cycle_span(kt)
  return {"index": index, "kernel": kt.kernel, "device": kt.device, "waves": len(kt.waves), "instructions": sum(len(w.insts) for w in kt.waves),
          "cycles": hi - lo, "st_us": kt.st / 1e3, "clock_hz": kt.clock_hz, "truncated": kt.truncated}


def hot_instructions(kt: KernelTrace) -> list[dict]:
  """Per PC over all waves: its text, times issued, total and mean duration (cycles until the wave's next issue, the
  stall included), most total cycles first (then by PC)."""
  acc: dict[int, list] = {}
  for w in kt.waves:
    for i in w.insts:
      a = acc.setdefault(i.pc, [i.text, i.kind, 0, 0])
      a[2] += 1
      a[3] += i.duration
  rows = [{"pc": pc, "text": t, "kind": k, "count": n, "total": tot, "mean": tot / n} for pc, (t, k, n, tot) in acc.items()]
  return sorted(rows, key=lambda r: (-r["total"], r["pc"]))


def launch_detail(index: int, kt: KernelTrace, saved: dict) -> dict:
  """`/api/waves/{k}`: the launch's summary, its cycle span, its waves with their instructions kept in the saved
  compact form ([pc, cycle, duration, kind, text id] into `texts`, kinds named by `kinds`) and its hot instructions."""
  waves = [{"se": w[0], "cu": w[1], "simd": w[2], "slot": w[3], "start": w[4], "end": w[5], "insts": w[6]} for w in saved["waves"]]
  return {"launch": launch_summary(index, kt), "span": list(cycle_span(kt)), "kinds": list(KINDS), "texts": saved["texts"],
          "waves": waves, "hot": hot_instructions(kt)}
