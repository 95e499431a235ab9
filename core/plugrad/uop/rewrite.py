"""`graph_rewrite`: the one engine that applies a PatternMatcher to a UOp graph.

Two drivers share the traversal:
- fixed point (default): every node is rewritten until no rule matches, and every replacement is processed again.
  `pm` runs post-order (children first); `bpm` runs pre-order (on a node before its children). A rule set that
  bounces (A -> B -> A) or grows a node inside its own replacement raises RuntimeError instead of hanging.
- walk (`walk=True`): one pass with MLIR walk-driver semantics: no fixed point and no traversal into replacements.
  `pm` post-order on the rebuilt node; `bpm` pre-order on the original node, and a `bpm` match short-circuits the
  subtree (its children are never visited, `pm` never sees it).
Shared subgraphs are rewritten once. The body of a CALL (its first source) is left alone unless `enter_calls=True`.
The traversal is iterative, so graph depth is not limited by Python's recursion limit.
"""
from __future__ import annotations

from typing import Any

from plugrad.uop.ops import Ops, UOp, register_rewriter
from plugrad.uop.upat import PatternMatcher, RuleError, UPat, _describe
from plugrad.viz import capture

REWRITE_LIMIT_PER_NODE = 1000  # a fixed-point rewrite doing more rewrites than this per visited node is runaway


class _Rewriter:
  def __init__(self, pm: PatternMatcher | None, bpm: PatternMatcher | None, ctx: Any, enter_calls: bool, name: str | None):
    self.pm, self.bpm, self.ctx, self.enter_calls, self.name = pm, bpm, ctx, enter_calls, name or "graph_rewrite"
    self.replace: dict[UOp, UOp] = {}

  def rebuild(self, n: UOp) -> UOp:
    """`n` with each source replaced by its rewrite (the same object when nothing changed)."""
    rep, kids = self.replace, (n.src[1:] if n.op is Ops.CALL and not self.enter_calls else n.src)
    new_src = tuple([rep[s] for s in kids])
    if new_src == kids: return n  # UOps compare by identity
    if len(kids) != len(n.src): new_src = (n.src[0],) + new_src
    return UOp(n.op, n.dtype, new_src, n.arg, n.tag)

  def _bounce(self, n: UOp, nxt: UOp) -> RuntimeError:
    return RuntimeError(f"{self.name}: rewrite rules bounce: a replacement of {n.op} leads back to a node still being rewritten "
                        f"({nxt.op}, dtype {nxt.dtype}, arg {nxt.arg!r}); the rule set has no fixed point")

  def fixed_point(self, root: UOp) -> UOp:
    replace, pm, bpm, ctx = self.replace, self.pm, self.bpm, self.ctx
    on_path: set[UOp] = set()
    stack: list[tuple[UOp, int, UOp]] = [(root, 0, root)]
    visited = rewrites = 0
    while stack:
      n, stage, cur = stack.pop()
      if stage == 0:
        if n in replace: continue
        if n in on_path: raise self._bounce(n, n)
        on_path.add(n)
        visited += 1
        if bpm is not None and (r := bpm.rewrite(n, ctx)) is not None:
          rewrites += 1
          stack.append((n, 2, r)); stack.append((r, 0, r))
          continue
        stack.append((n, 1, n))
        kids = n.src[1:] if n.op is Ops.CALL and not self.enter_calls else n.src
        stack.extend([(s, 0, s) for s in reversed(kids) if s not in replace])
      elif stage == 1:
        rebuilt = self.rebuild(n)
        if rebuilt is not n and bpm is not None: nxt = rebuilt  # the rebuilt node may now match a pre-order rule
        elif pm is not None and (r := pm.rewrite(rebuilt, ctx)) is not None: nxt = r
        else:
          replace[n] = rebuilt; on_path.discard(n)
          continue
        rewrites += 1
        if rewrites > REWRITE_LIMIT_PER_NODE * (visited + 100): raise RuntimeError(f"{self.name}: runaway rewrite ({rewrites} rewrites)")
        if nxt in on_path: raise self._bounce(n, nxt)
        stack.append((n, 2, nxt)); stack.append((nxt, 0, nxt))
      else:
        replace[n] = replace[cur]; on_path.discard(n)
    return replace[root]

  def walk(self, root: UOp) -> UOp:
    replace, pm, bpm, ctx = self.replace, self.pm, self.bpm, self.ctx
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
      n, post = stack.pop()
      if post:
        rebuilt = self.rebuild(n)
        replace[n] = r if pm is not None and (r := pm.rewrite(rebuilt, ctx)) is not None else rebuilt
        continue
      if n in replace: continue
      if bpm is not None and (r := bpm.rewrite(n, ctx)) is not None:
        replace[n] = r  # pre-order match: used as is, subtree not visited
        continue
      stack.append((n, True))
      kids = n.src[1:] if n.op is Ops.CALL and not self.enter_calls else n.src
      stack.extend([(s, False) for s in reversed(kids) if s not in replace])
    return replace[root]


def graph_rewrite(sink: UOp, pm: PatternMatcher | None, ctx: Any = None, bottom_up: bool = False, bpm: PatternMatcher | None = None,
                  walk: bool = False, name: str | None = None, enter_calls: bool = False) -> UOp:
  """Rewrite the graph under `sink` with `pm` (post-order) and `bpm` (pre-order); `bottom_up=True` applies `pm`
  pre-order too. Rules get `ctx` if they take a `ctx` parameter. See the module docstring for the two drivers."""
  if not isinstance(sink, UOp): raise TypeError(f"graph_rewrite needs a UOp, got {type(sink).__name__}")
  for m in (pm, bpm):
    if m is not None and not isinstance(m, PatternMatcher): raise TypeError(f"graph_rewrite needs PatternMatchers, got {type(m).__name__}")
  if bottom_up: pm, bpm = None, (pm if bpm is None else bpm if pm is None else bpm + pm)
  rw = _Rewriter(pm, bpm, ctx, enter_calls, name)
  if capture.VIZ: return _traced(rw, sink, walk)
  return rw.walk(sink) if walk else rw.fixed_point(sink)


def graph_rewrite_map(sink: UOp, pm: PatternMatcher | None, ctx: Any = None, bottom_up: bool = False, bpm: PatternMatcher | None = None,
                      walk: bool = False, name: str | None = None, enter_calls: bool = False) -> dict[UOp, UOp]:
  """Like graph_rewrite, but returns the mapping from every original node under `sink` to its rewrite."""
  if bottom_up: pm, bpm = None, (pm if bpm is None else bpm if pm is None else bpm + pm)
  rw = _Rewriter(pm, bpm, ctx, enter_calls, name)
  if capture.VIZ: _traced(rw, sink, walk)
  else: rw.walk(sink) if walk else rw.fixed_point(sink)
  return {n: rw.replace[n] for n in sink.toposort(memo=False) if n in rw.replace}  # (sink is usually a temporary SINK)


# ***** VIZ=1: record each rule application (plugrad/viz/capture.py); nothing here runs when VIZ is off *****

class _TracedMatcher:
  """Wraps a PatternMatcher for one recorded rewrite: same matching, and each rule that fires is recorded."""
  def __init__(self, pm: PatternMatcher, rec: capture.RewriteRecord): self.pm, self.rec = pm, rec

  def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
    if type(self.pm).rewrite is not PatternMatcher.rewrite:  # a matcher with its own dispatch (pm_substitute)
      if (r := self.pm.rewrite(uop, ctx)) is not None: capture.TRACE.step(self.rec, type(self.pm).rewrite, uop, r)
      return r
    for pat, fn, takes_ctx in self.pm.pdict.get(uop.op, ()):
      for captures in pat.match(uop, {}):
        ret = fn(ctx=ctx, **captures) if takes_ctx else fn(**captures)
        if ret is None or ret is uop: continue
        if not isinstance(ret, UOp): raise RuleError(f"rule {_describe(fn)} for {pat} returned {type(ret).__name__} {ret!r}, not a UOp")
        capture.TRACE.step(self.rec, fn, uop, ret)
        return ret
    return None


def _traced(rw: _Rewriter, sink: UOp, walk: bool) -> UOp:
  if (rec := capture.TRACE.begin_rewrite(rw.name, sink, walk, rw.enter_calls)) is None: return rw.walk(sink) if walk else rw.fixed_point(sink)
  rw.pm, rw.bpm = (None if rw.pm is None else _TracedMatcher(rw.pm, rec)), (None if rw.bpm is None else _TracedMatcher(rw.bpm, rec))  # type: ignore[assignment]
  rec.out = rw.walk(sink) if walk else rw.fixed_point(sink)
  return rec.out


class _SubstituteMatcher(PatternMatcher):
  """`ctx.get(x)` for any node: the rule below, with the generic matching skipped (substitution is on every realize)."""
  def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
    if (r := ctx.get(uop)) is None or r is uop: return None
    if not isinstance(r, UOp): raise RuleError(f"pm_substitute: the mapping gives {type(r).__name__} {r!r} for a node, not a UOp")
    return r


pm_substitute = _SubstituteMatcher([(UPat(name="x"), lambda ctx, x: ctx.get(x))])


def _substitute(u: UOp, mapping: dict[UOp, UOp], walk: bool, name: str) -> UOp:
  return graph_rewrite(u, pm_substitute, ctx=mapping, bottom_up=True, walk=walk, name=name)


register_rewriter("substitute", _substitute)
