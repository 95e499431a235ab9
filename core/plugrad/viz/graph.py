"""Rewrite steps replayed on a saved trace's node table, and graphs drawn with graphviz's `dot`.

`replay(graph, rewrite, k)` rebuilds the graph after the first k recorded rule applications of one graph_rewrite call
from its input alone, the way the engine does: a node is replaced by its rule's result (and that result resolved in
turn), or else rebuilt from its rewritten sources and looked up again; in walk mode replacements are final. After
all steps this gives the call's recorded output (tests/viz check it), so stepping the viewer shows true states.
"""
from __future__ import annotations

from typing import Any

MAX_DRAW = 400  # nodes drawn at most; a larger graph is cut to the neighbourhood of the changed nodes

OP_COLORS = {"CONST": "#e8f0fe", "DEFINE_GLOBAL": "#fce8b2", "PARAM": "#fce8b2", "BUFFER": "#fce8b2", "LOAD": "#d2e3fc", "STORE": "#f6aea9",
             "INDEX": "#ceead6", "AT": "#ceead6", "RANGE": "#e6d3f7", "END": "#e6d3f7", "REDUCE": "#fdd663", "REDUCE_AXIS": "#fdd663",
             "SINK": "#dadce0", "DEFINE_VAR": "#e6d3f7", "SPECIAL": "#e6d3f7"}


class NodeGraph:
  """A trace's node rows with hash-consing: `make` returns the id of an equal row, adding one if there is none."""
  def __init__(self, rows: list[list]):
    self.rows = list(rows)
    self.by_key: dict[tuple, int] = {}
    for i, r in enumerate(self.rows): self.by_key.setdefault(self.key(r), i)

  @staticmethod
  def key(r: list) -> tuple: return (r[0], r[1], r[2], tuple(r[3]), r[4])

  def make(self, like: int, srcs: list[int]) -> int:
    r = self.rows[like]
    row = [r[0], r[1], r[2], srcs, r[4]]
    if (i := self.by_key.get(self.key(row))) is None:
      i = self.by_key[self.key(row)] = len(self.rows)
      self.rows.append(row)
    return i

  def toposort(self, root: int) -> list[int]:
    out: dict[int, None] = {}
    stack = [(root, False)]
    while stack:
      n, done = stack.pop()
      if n in out: continue
      if done: out[n] = None; continue
      stack.append((n, True))
      stack.extend((s, False) for s in reversed(self.rows[n][3]) if s not in out)
    return list(out)


def replay(g: NodeGraph, rw: dict, k: int | None = None) -> int:
  """The root id after the first `k` steps (all when None) of recorded rewrite `rw`, replayed from its input."""
  steps = rw["steps"] if k is None else rw["steps"][:k]
  rep = {b: a for _, b, a in steps}
  enter, walk = rw.get("enter_calls", False), rw.get("walk", False)
  memo: dict[int, int] = {}
  stack, budget = [rw["input"]], 100 * (len(g.rows) + len(steps) + 10)
  while stack:
    if (budget := budget - 1) < 0: raise RuntimeError(f"replay of rewrite {rw['name']!r} does not terminate: the trace is inconsistent")
    n = stack[-1]
    if n in memo: stack.pop(); continue
    if n in rep:
      if walk: memo[n] = rep[n]
      elif rep[n] in memo: memo[n] = memo[rep[n]]
      else: stack.append(rep[n])
      continue
    srcs = g.rows[n][3]
    kids = srcs[1:] if g.rows[n][0] == "CALL" and not enter else srcs
    if missing := [s for s in kids if s not in memo]:
      stack.extend(reversed(missing))
      continue
    new = [memo[s] for s in kids]
    m = n if new == kids else g.make(n, (srcs[:1] + new) if len(kids) != len(srcs) else new)
    if m == n or m not in rep: memo[n] = m
    elif walk: memo[n] = rep[m]
    elif rep[m] in memo: memo[n] = memo[rep[m]]
    else: stack.append(rep[m])
  return memo[rw["input"]]


def _label(r: list) -> str:
  arg = r[2] if len(r[2]) <= 40 else r[2][:37] + "..."
  dt = r[1].replace("dtypes.", "")
  return "\n".join(x for x in (r[0], dt if dt != "void" else "", "" if arg == "None" else arg) if x)


def _cut(g: NodeGraph, ids: list[int], focus: set[int]) -> list[int]:
  """At most MAX_DRAW of `ids`: those nearest (along edges either way) to the focus nodes, or to the root."""
  inside = set(ids)
  users: dict[int, list[int]] = {}
  for i in ids:
    for s in g.rows[i][3]: users.setdefault(s, []).append(i)
  frontier = [i for i in ids if i in focus] or [ids[-1]]
  keep = dict.fromkeys(frontier)
  while frontier and len(keep) < MAX_DRAW:
    nxt = []
    for n in frontier:
      for m in list(g.rows[n][3]) + users.get(n, []):
        if m in inside and m not in keep and len(keep) < MAX_DRAW: keep[m] = None; nxt.append(m)
    frontier = nxt
  return [i for i in ids if i in keep]


def draw(g: NodeGraph, root: int, changed: set[int] = frozenset(), engine: str = "dot") -> tuple[str, dict[str, Any]]:
  """SVG of the graph under `root` (sources above users), `changed` nodes highlighted; and facts about the drawing."""
  import graphviz  # the `viz` extra; only drawing needs it
  ids = g.toposort(root)
  drawn = ids if len(ids) <= MAX_DRAW else _cut(g, ids, changed)
  shown = set(drawn)
  d = graphviz.Digraph(engine=engine, graph_attr={"rankdir": "TB", "bgcolor": "transparent", "nodesep": "0.15", "ranksep": "0.3"},
                       node_attr={"shape": "box", "style": "rounded,filled", "fontname": "Helvetica", "fontsize": "10", "margin": "0.06,0.03"},
                       edge_attr={"color": "#5f6368", "arrowsize": "0.6"})
  for i in drawn:
    r = g.rows[i]
    hot = i in changed
    d.node(f"n{i}", _label(r), id=f"node{i}", fillcolor="#fbbc04" if hot else OP_COLORS.get(r[0], "#ffffff"),
           color="#d93025" if hot else "#9aa0a6", penwidth="2.5" if hot else "1", tooltip=f"%{i} {r[0]} {r[1]} {r[2][:200]}")
    for s in r[3]:
      if s in shown: d.edge(f"n{s}", f"n{i}")
  svg = d.pipe(format="svg").decode()
  return svg[svg.index("<svg"):], {"nodes": len(ids), "drawn": len(drawn)}
