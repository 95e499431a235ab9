"""PROFILE=1: timed launches, copies and JIT replays (called by the engine only when `capture.PROFILE` is on), and the
profile as Chrome/Perfetto trace-event JSON.

Every launch runs with wait=True so its end time is when the device finished; the bar spans host perf_counter time
from submit to completion, and `device_s` keeps the device-measured time when the backend's Program returns one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from plugrad.uop.ops import Ops
from plugrad.uop.symbolic import sym_infer
from plugrad.viz.capture import TRACE, ProfileEvent, Trace, now


def kernel_flops(spec: Any, var_vals: dict[str, int]) -> int:
  """The kernel's estimated flops with its variables' values (by name; a variable not given takes its maximum). The
  estimate's variables are matched by name, not identity: for GPU-style renderers it is over the launch size, whose
  variables are the index-typed ones, while the kernel's parameters (`spec.vars`) are int32 (identity lookup raised
  KeyError "no value for variable 'n'" under PROFILE=1 and DEBUG>=2)."""
  if isinstance(spec.flops, int): return spec.flops
  names = {n.arg[0]: var_vals.get(n.arg[0], n.vmax) for n in spec.flops.toposort() if n.op is Ops.DEFINE_VAR}
  return int(sym_infer(spec.flops, names))



def run_item(ei: Any, var_vals: dict[str, int] | None) -> float | None:
  """Run ExecItem `ei` to completion and record it (a kernel launch, or a copy when it has no runner)."""
  st = now()
  et = ei._run(var_vals, wait=True)
  en = now()
  if ei.runner is None:
    dst, src = ei.bufs[0], ei.bufs[1]
    TRACE.event(ProfileEvent("copy", f"copy {src.device} -> {dst.device}", dst.device, st, en, dst.nbytes))
  else:
    spec, vv = ei.runner.spec, ei.var_vals if var_vals is None else var_vals
    TRACE.event(ProfileEvent("kernel", spec.name, ei.runner.device, st, en, spec.mem_bytes, kernel_flops(spec, vv), et))
  return et


def run_batch(batch: Callable, items: list[Any], var_vals: dict[str, int], slots: list) -> None:
  """A JIT batch runner call (several kernels in one call). A batch that times its kernels in place (a `profile`
  method returning (seconds, cores) per kernel) gives one bar per kernel; otherwise one bar named after its kernels."""
  st = now()
  if (timed := getattr(batch, "profile", None)) is None:
    batch(var_vals, slots)
    names = [ei.runner.spec.name for ei in items]
    TRACE.event(ProfileEvent("kernel", f"batch of {len(items)}: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}",
                             items[0].runner.device, st, now(), sum(ei.runner.spec.mem_bytes for ei in items),
                             sum(kernel_flops(ei.runner.spec, var_vals) for ei in items)))
    return
  for ei, (secs, _) in zip(items, timed(var_vals, slots)):
    en = st + int(secs * 1e9)
    TRACE.event(ProfileEvent("kernel", ei.runner.spec.name, ei.runner.device, st, en, ei.runner.spec.mem_bytes,
                             kernel_flops(ei.runner.spec, var_vals), secs))
    st = en


def jit_replay(name: str, device: str, st: int) -> None:
  TRACE.event(ProfileEvent("jit", f"jit {name}", device, st, now()))


TRACKS = {"kernel": 1, "copy": 2, "jit": 3}
WAVE_TID0 = 100  # wave slots' threads follow the kind-of-work threads


def _wave_threads(trace: Trace) -> dict[tuple[str, int, int, int, int], int]:
  """A thread id per (device, SE, CU, SIMD, wave slot) that a traced launch used, numbered in that order per device."""
  keys = sorted({(kt.device, w.se, w.cu, w.simd, w.slot) for kt in trace.kernel_traces for w in kt.waves})
  tids: dict[tuple[str, int, int, int, int], int] = {}
  used: dict[str, int] = {}
  for k in keys:
    tids[k] = WAVE_TID0 + used.get(k[0], 0)
    used[k[0]] = used.get(k[0], 0) + 1
  return tids


def _wave_events(trace: Trace, pid: dict[str, int], tids: dict, us: Callable[[int], float]) -> list[dict]:
  """Each traced wave as a bar ("wave": the kernel's name over the wave's life) on its slot's thread, with its
  instructions as bars inside it ("inst": the instruction's text from its issue to the wave's next issue)."""
  out: list[dict] = []
  for kt in trace.kernel_traces:
    base, per_cycle = us(kt.st), 1e6 / kt.clock_hz
    for w in kt.waves:
      p, t = pid[kt.device], tids[(kt.device, w.se, w.cu, w.simd, w.slot)]
      end = max([w.end, *(i.cycle + i.duration for i in w.insts)])
      out.append({"name": kt.kernel, "cat": "wave", "ph": "X", "pid": p, "tid": t, "ts": base + w.start * per_cycle,
                  "dur": max(end - w.start, 0) * per_cycle, "args": {"start": w.start, "end": w.end, "instructions": len(w.insts)}})
      out += [{"name": i.text, "cat": "inst", "ph": "X", "pid": p, "tid": t, "ts": base + i.cycle * per_cycle, "dur": i.duration * per_cycle,
               "args": {"pc": i.pc, "cycle": i.cycle, "duration": i.duration, "kind": i.kind}} for i in w.insts]
  return out


def chrome_trace(trace: Trace = TRACE, waves: bool = True) -> dict:
  """The profile in the Trace Event Format that Perfetto and chrome://tracing open: one process per device, a thread
  per kind of work ("X" complete events, microseconds), a "memory" counter, and for launches with a device instruction
  trace a thread per wave slot ("SE0 CU1 SIMD0 wave 3") holding each wave and its instructions at launch time +
  cycle / clock (left out with waves=False: the saved VIZ trace keeps them compact in its `waves` instead)."""
  devices = sorted({e.device for e in trace.events} | {d for _, d, _ in trace.mem} | {kt.device for kt in trace.kernel_traces if waves})
  pid = {d: i + 1 for i, d in enumerate(devices)}
  tids = _wave_threads(trace) if waves else {}
  out: list[dict] = []
  for d in devices:
    out.append({"name": "process_name", "ph": "M", "pid": pid[d], "tid": 0, "args": {"name": d}})
    for kind, tid in TRACKS.items(): out.append({"name": "thread_name", "ph": "M", "pid": pid[d], "tid": tid, "args": {"name": kind}})
  for (d, se, cu, simd, slot), tid in tids.items():
    out.append({"name": "thread_name", "ph": "M", "pid": pid[d], "tid": tid, "args": {"name": f"SE{se} CU{cu} SIMD{simd} wave {slot}"}})
    out.append({"name": "thread_sort_index", "ph": "M", "pid": pid[d], "tid": tid, "args": {"sort_index": tid}})
  def us(t: int) -> float: return (t - trace.t0) / 1e3
  timed: list[dict] = []
  for e in trace.events:
    args: dict[str, Any] = {"bytes": e.nbytes, "flops": e.flops}
    if e.device_s is not None: args["device_us"] = e.device_s * 1e6
    timed.append({"name": e.name, "cat": e.kind, "ph": "X", "pid": pid[e.device], "tid": TRACKS[e.kind], "ts": us(e.st),
                  "dur": max(us(e.en) - us(e.st), 0.0), "args": args})
  timed += [{"name": "memory", "ph": "C", "pid": pid[d], "tid": 0, "ts": us(t), "args": {"bytes": b}} for t, d, b in trace.mem]
  if waves: timed += _wave_events(trace, pid, tids, us)
  out += sorted(timed, key=lambda e: e["ts"])  # one time-ordered stream: viewers and the tests read it in order
  meta: dict[str, Any] = {"clock": "host perf_counter", "truncated": trace.profile_truncated}
  return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": meta}


def write_chrome_trace(path: str | Path, trace: Trace = TRACE) -> Path:
  p = Path(path)
  p.write_text(json.dumps(chrome_trace(trace)))
  return p
