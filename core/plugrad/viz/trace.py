"""A recording (`capture.Trace`) as a self-contained JSON-able trace: what the viewer serves and what VIZ_SAVE writes.

Format (version 1):
- `nodes`: one row per distinct UOp, `[op, dtype, arg, [source ids], tag]` (op/dtype/arg/tag as their reprs); rows are
  hash-consed like UOps (equal rows share an id), so a rewrite replays on ids alone (viz/graph.py).
- `rules`: `{"name", "where", "code"}` per rule function that fired (its qualified name, file:line, first source line).
- `rewrites`: `{"name", "group", "walk", "enter_calls", "input", "output", "steps": [[rule, before, after], ...],
  "truncated"}` with node ids; `groups`: `{"kind", "name", "rewrites": [ids], "kernel": {...} | null}` in run order.
- a kernel's `built_by`: the ids of the scheduler's rewrites that built its AST (indexing, simplify kernel).
- `profile`: Chrome trace-event JSON (viz/profile.py) without the traced waves' events; `truncated`: a cap was hit
  while recording.
- `waves`: the device instruction traces of traced launches (SQTT on AMD), compact, as viz/waves.py documents; a
  trace saved before they existed has none (read as an empty list).
"""
from __future__ import annotations

import gzip
import json
import linecache
import os
from pathlib import Path
from typing import Any

from plugrad.uop.ops import UOp, pretty
from plugrad.viz.capture import TRACE, Trace
from plugrad.viz.profile import chrome_trace
from plugrad.viz.waves import encode as encode_waves

VERSION = 1
MAX_ARG_CHARS = 2000


class NodeTable:
  """Ids for UOps, one per distinct (op, dtype, arg, sources, tag)."""
  def __init__(self) -> None:
    self.rows: list[list] = []
    self.ids: dict[UOp, int] = {}
    self.by_key: dict[tuple, int] = {}

  def add(self, root: UOp) -> int:
    if (i := self.ids.get(root)) is not None: return i
    for n in root.toposort(gate=lambda u: u not in self.ids):
      if n in self.ids: continue
      arg = repr(n.arg)
      row = [n.op.name, repr(n.dtype), arg if len(arg) <= MAX_ARG_CHARS else arg[:MAX_ARG_CHARS] + "...", [self.ids[s] for s in n.src],
             None if n.tag is None else repr(n.tag)]
      key = (row[0], row[1], row[2], tuple(row[3]), row[4])
      if (j := self.by_key.get(key)) is None:
        j = self.by_key[key] = len(self.rows)
        self.rows.append(row)
      self.ids[n] = j
    return self.ids[root]


def _rule_info(fn: Any) -> dict[str, str]:
  if isinstance(fn, str): return {"name": fn, "where": "", "code": ""}
  code = getattr(fn, "__code__", None)
  where = f"{os.path.relpath(code.co_filename)}:{code.co_firstlineno}" if code is not None else ""
  line = linecache.getline(code.co_filename, code.co_firstlineno).strip() if code is not None else ""
  return {"name": getattr(fn, "__qualname__", repr(fn)), "where": where, "code": line[:300]}


def _linear_text(uops: list[UOp]) -> str:
  num = {u: i for i, u in enumerate(uops)}
  def src(u: UOp) -> str: return ", ".join(f"%{num[s]}" if s in num else s.op.name for s in u.src)
  return "\n".join(f"%{i:<4d} {u.op.name:14s} {u.dtype!r:32s} ({src(u)}){'' if u.arg is None else ' ' + repr(u.arg)}" for i, u in enumerate(uops))


def _kernel(info: dict, nodes: NodeTable) -> dict | None:
  if "spec" not in info: return None
  spec, ast = info["spec"], info["ast"]
  return {"name": spec.name, "device": info["device"], "ast": nodes.add(ast), "ast_text": pretty(ast, max_lines=1 << 30),
          "opts": [str(o) for o in info.get("opts", [])], "linear": _linear_text(spec.uops), "src": spec.src,
          "flops": str(spec.flops), "mem_bytes": spec.mem_bytes, "global_size": [str(s) for s in spec.global_size]}


def _link_kernel_builders(groups: list[dict], rewrites: list[dict]) -> None:
  """Each kernel's `built_by`: the scheduler's rewrites that built its AST (from the nearest "indexing" before the
  rewrite whose output is the AST, in the same scheduling group), so the kernel view can step through them too."""
  made_by = {rw["output"]: i for i, rw in enumerate(rewrites) if rw["output"] is not None and rw["steps"]}
  for g in groups:
    if not (k := g["kernel"]) or (last := made_by.get(k["ast"])) is None: continue
    sched = groups[rewrites[last]["group"]]["rewrites"]
    first = sched.index(last)
    while first > 0 and rewrites[sched[first]]["name"] != "indexing": first -= 1
    k["built_by"] = [r for r in sched[first:sched.index(last) + 1] if rewrites[r]["steps"]]


def serialize(trace: Trace = TRACE) -> dict:
  """The recording as the JSON-able trace described in the module docstring."""
  nodes, rules, rule_ids = NodeTable(), [], {}
  def rule(fn: Any) -> int:
    key = fn if isinstance(fn, str) else id(fn)
    if key not in rule_ids:
      rule_ids[key] = len(rules)
      rules.append(_rule_info(fn))
    return rule_ids[key]
  groups, rewrites = [], []
  for gi, g in enumerate(trace.groups):
    rids = []
    for r in g.rewrites:
      rids.append(len(rewrites))
      steps = [[rule(fn), nodes.add(b), nodes.add(a)] for fn, b, a in r.steps]
      rewrites.append({"name": r.name, "group": gi, "walk": r.walk, "enter_calls": r.enter_calls, "input": nodes.add(r.sink),
                       "output": None if r.out is None else nodes.add(r.out), "steps": steps, "truncated": r.truncated})
    groups.append({"kind": g.kind, "name": g.name, "rewrites": rids, "kernel": _kernel(g.info, nodes) if g.kind == "kernel" else None})
  _link_kernel_builders(groups, rewrites)
  return {"version": VERSION, "nodes": nodes.rows, "rules": rules, "rewrites": rewrites, "groups": groups,
          "truncated": trace.truncated, "profile": chrome_trace(trace, waves=False),
          "waves": [encode_waves(kt, trace.t0) for kt in trace.kernel_traces]}


def save(data: dict, path: str | Path) -> Path:
  """Write a trace (gzip-compressed when the name ends in .gz)."""
  p = Path(path)
  raw = json.dumps(data).encode()
  p.write_bytes(gzip.compress(raw) if p.suffix == ".gz" else raw)
  return p


def load(path: str | Path) -> dict:
  """Read a trace written by `save`, or a Chrome trace-event file (PROFILE_PATH: opened as a profile-only trace)."""
  p = Path(path)
  try:
    raw = p.read_bytes()
    data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
  except FileNotFoundError: raise FileNotFoundError(f"no trace file at {p}") from None
  except (OSError, ValueError) as e: raise ValueError(f"{p} is not a plugrad trace (JSON): {e}") from None
  if isinstance(data, dict) and "traceEvents" in data and "version" not in data:
    data = {"version": VERSION, "nodes": [], "rules": [], "rewrites": [], "groups": [], "truncated": False, "profile": data}
  if not isinstance(data, dict) or data.get("version") != VERSION or not all(k in data for k in ("nodes", "rewrites", "groups")):
    raise ValueError(f"{p} is not a plugrad trace of version {VERSION} (keys: {sorted(data)[:8] if isinstance(data, dict) else type(data).__name__})")
  if not isinstance(waves := data.setdefault("waves", []), list):
    raise ValueError(f"{p}: `waves` is {type(waves).__name__}, not a list of traced launches")
  return data
