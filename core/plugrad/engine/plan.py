"""Realize plans: the fast path of a warm `realize()` (a cached kernel on the same structure, any buffers).

The schedule cache (schedule/kernelize.py) is keyed by the normalized graph, and computing that key means rewriting
the whole graph into placeholders on every realize. Here each tensor-level node gets a *structure id* once, memoized
on the node (`_cache["plan"]`): an interned int standing for (op, dtype, arg, the sources' ids, and how the sources'
leaves map into this node's leaves), together with the node's *leaves* in first-appearance order (buffers, bound
variables, user constants). Two graphs with the same id compute the same function of their leaves, so they have the
same normalized graph and the same schedule; only the leaves differ.

A `Plan` is kept per structure id once a realize of that structure was scheduled the normal way: the normalized
schedule items with their compiled runners, which leaf fills each buffer slot, the fresh output each item writes, and
how each target views its output. A warm realize then costs: the ids of the nodes built since the last realize, one
dict lookup, allocating the outputs, and the launches. No scheduling, no normalization, no walk over the live tensors.

A plan serves only simple structures: every schedule item's buffers are whole leaf buffers or fresh outputs, every
realized node is a target (no intermediate buffers: the memory planner's reuse, which depends on what other tensors
keep, never applies), no ASSIGN. Anything else (and VIZ=1, and graphs whose movement args hold symbolic sizes) takes
the normal path. A plan is only used while the schedule cache and the compiled-kernel cache still hold the very
entries it was built from, so clearing or replacing those caches (as tests do) sends realizes back to the normal path.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

from plugrad.device import Buffer
from plugrad.engine import realize
from plugrad.engine.realize import CompiledRunner, ExecItem, buffer_for, run_exec_items
from plugrad.helpers import getenv
from plugrad.schedule import kernelize
from plugrad.schedule.kernelize import SCHEDULE_STATS, ScheduleItem
from plugrad.uop.buffers import new_buffer
from plugrad.uop.ops import GroupOp, Ops, UOp, elementwise
from plugrad.viz import capture

MAX_LEAVES = 64        # a node with more leaves than this is not planned (leaf lists are merged per node)
MAX_INTERNED = 1 << 20  # structure ids kept before the table (and every plan) is dropped and ids start over
MAX_PLANS = 4096        # plans kept (the oldest is dropped first)
REUSE_MAX_BYTES = 1 << 20  # outputs up to this size are kept by their plan for the next run (allocation matters for small ones)
PLAN_STATS = {"hits": 0, "built": 0, "reused": 0}
_getrefcount = getattr(sys, "getrefcount", None)

_ids: dict[tuple, int] = {}   # structure -> id
_ids_get = _ids.get
_gen = [0]                    # bumped when _ids is dropped: ids memoized on nodes under an older generation are stale
_PLANS: dict[int, Plan | None] = {}  # structure id of the targets' SINK -> plan (None: this structure can't be planned)
_LEAF_OPS = frozenset({Ops.BUFFER, Ops.BIND, Ops.UNIQUE})
_BUFFER, _CALL, _MULTI = Ops.BUFFER, Ops.CALL, Ops.MULTI


def _intern(key: tuple) -> int:
  if (i := _ids_get(key)) is None:
    if len(_ids) >= MAX_INTERNED:
      _ids.clear(); _PLANS.clear(); _gen[0] += 1
    i = _ids[key] = len(_ids)
  return i


def _has_uop(arg: Any) -> bool:
  """Whether a movement arg holds a UOp (a symbolic size) anywhere in its nested tuples."""
  if type(arg) is not tuple: return isinstance(arg, UOp)
  for a in arg:
    if type(a) is not int and _has_uop(a): return True
  return False


def _arg_key(arg: Any) -> Any:
  """The arg as a dict key that keeps apart what compares equal in Python but isn't the same constant (-0.0 and 0.0;
  nan is made equal to itself)."""
  if type(arg) is float and (arg == 0.0 or arg != arg): return ("nan",) if arg != arg else ("-0.0",) if math.copysign(1.0, arg) < 0 else 0.0
  return arg


_IDENT = [tuple(range(i)) for i in range(MAX_LEAVES + 1)]  # leaf positions of a source whose leaves are the node's own
_MOVEMENT = GroupOp.Movement


def _node_sig(n: UOp, kids: list) -> tuple | None:
  """(generation, structure id, leaves) of `n` from its sources' signatures (None: not plannable). Dtypes enter the
  structure keys as their `_key` tuples (hashing a DType is a Python call; equal dtypes have equal tuples)."""
  op = n.op
  if op in _LEAF_OPS:
    if op is _BUFFER: key: tuple = ("B", n.dtype._key, n.arg, n.src[1].arg)
    elif op is Ops.BIND: key = ("V", n.src[0])  # the variable; its value is the leaf's data
    else: key = ("U", n.dtype._key)
    return (_gen[0], _intern(key), None)  # None: the leaves are (n,) (not stored: a node in its own cache is a cycle)
  arg = n.arg
  if op is _CALL or op is _MULTI or (op in _MOVEMENT and _has_uop(arg)): return None
  if type(arg) is float and (arg == 0.0 or arg != arg): arg = _arg_key(arg)
  if not kids: return (_gen[0], _intern((op, n.dtype._key, arg, n.tag)), ())
  if len(kids) == 1:
    if (k := kids[0]) is None: return None
    key = (op, n.dtype._key, arg, n.tag, k[1])
    return (_gen[0], i if (i := _ids_get(key)) is not None else _intern(key), k[2] if k[2] is not None else (n.src[0],))
  # several sources. Usually every source that has leaves has the same ones (elementwise ops over one tensor; the
  # constants have none): the node's leaves are those, no merging
  if len(kids) == 2:  # (the common binary op, spelled out)
    k0, k1 = kids
    if k0 is None or k1 is None: return None
    if (l0 := k0[2]) is None: l0 = (n.src[0],)
    if (l1 := k1[2]) is None: l1 = (n.src[1],)
    if not l1 or l1 is l0 or l1 == l0: leaves, parts = l0, ((k0[1], _IDENT[len(l0)]), (k1[1], _IDENT[len(l1)]))
    elif not l0: leaves, parts = l1, ((k0[1], ()), (k1[1], _IDENT[len(l1)]))
    elif (l0[0] is not l1[0] if len(l0) == 1 == len(l1) else set(l0).isdisjoint(l1)) and len(l0) + len(l1) <= MAX_LEAVES:
      leaves, parts = l0 + l1, ((k0[1], _IDENT[len(l0)]), (k1[1], tuple(range(len(l0), len(l0) + len(l1)))))
    else: leaves = None
    if leaves is not None:
      key = (op, n.dtype._key, arg, n.tag, parts)
      return (_gen[0], i if (i := _ids_get(key)) is not None else _intern(key), leaves)
  same: Any = None
  for k, s in zip(kids, n.src):
    if k is None: return None
    if same is False or not (kl := k[2] if k[2] is not None else (s,)): continue
    if same is None: same = kl
    elif kl is not same and kl != same: same = False
  if same is not False:
    ident = _IDENT[len(same)] if same else ()
    parts: Any = tuple([(k[1], ident if k[2] is None or k[2] else ()) for k in kids])
    return (_gen[0], _intern((op, n.dtype._key, arg, n.tag, parts)), same or ())
  pos: dict[UOp, int] = {}
  leaves: list[UOp] = []
  parts = []
  for k, s in zip(kids, n.src):
    kl = k[2] if k[2] is not None else (s,)
    for x in kl:
      if x not in pos: pos[x] = len(leaves); leaves.append(x)
    parts.append((k[1], tuple([pos[x] for x in kl])))
  if len(leaves) > MAX_LEAVES: return None
  return (_gen[0], _intern((op, n.dtype._key, arg, n.tag, tuple(parts))), tuple(leaves))


def _stored(n: UOp, gen: int) -> tuple | None:
  """The signature memoized on `n` for generation `gen` (structure id -1: not plannable), or None if there is none."""
  if (c := n._cache) is not None and (s := c.get("plan")) is not None and s[0] == gen: return s
  return None


def _public(u: UOp, s: tuple) -> tuple | None:
  return None if s[1] < 0 else s if s[2] is not None else (s[0], s[1], (u,))


def signature(u: UOp) -> tuple | None:
  """(generation, structure id, leaves) of the graph under `u`, memoized on every node (None: not plannable).
  A node found unplannable is memoized too (as id -1), so a shared unplannable subgraph is walked once."""
  gen = _gen[0]
  if (c := u._cache) is not None and (s := c.get("plan")) is not None and s[0] == gen: return _public(u, s)
  stack: list[UOp] = [u]
  while stack:  # post-order: a node is computed once every source is (it stays on the stack until then)
    n = stack[-1]
    if (c := n._cache) is not None and (s := c.get("plan")) is not None and s[0] == gen: stack.pop(); continue
    kids: list = []
    if n.op not in _LEAF_OPS:
      ready = True
      for x in n.src:
        if (c := x._cache) is not None and (s := c.get("plan")) is not None and s[0] == gen: kids.append(None if s[1] < 0 else s)
        else: stack.append(x); ready = False
      if not ready: continue
    stack.pop()
    sig = _node_sig(n, kids)
    if gen != _gen[0]: return None  # the id table was dropped meanwhile: ids computed so far are stale
    n._cached()["plan"] = (gen, -1, ()) if sig is None else sig
  return _public(u, u._cache["plan"])


def seed(u: UOp, cache: dict | None = None) -> None:
  """Memoize the signature of a node that is being built, when its sources' are memoized already (one step, no walk:
  Tensor calls this for every node it makes, so the warm realize of a graph finds every structure id computed).
  `cache`: u's cache dict when the caller just made it."""
  gen, kids = _gen[0], []
  if u.op not in _LEAF_OPS:  # (a leaf's signature needs none of its sources': a new buffer is seeded too)
    for x in u.src:
      if (c := x._cache) is None or (s := c.get("plan")) is None or s[0] != gen: return
      kids.append(None if s[1] < 0 else s)
  sig = _node_sig(u, kids)
  if gen == _gen[0]: (u._cached() if cache is None else cache)["plan"] = (gen, -1, ()) if sig is None else sig


def seed_binary(u: UOp, cache: dict) -> None:
  """`seed(u, cache)` for a new binary ALU node (no arg, no tag) whose sources' signatures are memoized and whose
  sources have the same leaves or one has none (an elementwise op over one tensor, or with a constant): the
  signature `_node_sig` gives, without its general cases. Anything else goes to `seed`."""
  gen = _gen[0]
  a, b = u.src
  if (ca := a._cache) is None or (cb := b._cache) is None or (sa := ca.get("plan")) is None or (sb := cb.get("plan")) is None or \
     sa[0] != gen or sb[0] != gen or sa[1] < 0 or sb[1] < 0:
    seed(u, cache)
    return
  if (la := sa[2]) is None: la = (a,)
  if (lb := sb[2]) is None: lb = (b,)
  if not lb or lb is la: leaves, parts = la, ((sa[1], _IDENT[len(la)]), (sb[1], _IDENT[len(lb)]))
  elif not la: leaves, parts = lb, ((sa[1], ()), (sb[1], _IDENT[len(lb)]))
  else:
    seed(u, cache)
    return
  key = (u.op, u.dtype._key, None, None, parts)
  if (i := _ids_get(key)) is None: i = _intern(key)
  if gen == _gen[0]: cache["plan"] = (gen, i, leaves)  # (not when interning dropped the table: ids of gen are stale)


def targets_signature(targets: list[UOp]) -> tuple[int, tuple[UOp, ...]] | None:
  """(structure id, leaves) of the targets together (as the SINK the scheduler builds over them)."""
  if len(targets) == 1:  # keyed by the target's own id (no SINK id equals a node's: ids are unique per structure)
    return None if (s := signature(targets[0])) is None else (s[1], s[2])
  sigs = [signature(t) for t in targets]
  for s in sigs:
    if s is None: return None
  s = _node_sig(UOp.sink_of(*targets), sigs)
  return None if s is None else (s[1], s[2])


@dataclass
class _PlanItem:
  ast: UOp
  opts: tuple | None              # the optimizations the scheduler chose (the runner's key with device and ast)
  runner: CompiledRunner | None   # None: a COPY
  device: str                     # the device of slot 0 (the runner's key in the compiled-kernel cache)
  slots: tuple[tuple, ...]        # per buffer slot: (True, output index), (False, leaf index) or (False, leaf index, view args)
  var_names: tuple[tuple[str, int], ...]  # (variable name, leaf index of its BIND)


@dataclass(repr=False)
class Plan:
  nsink: UOp                      # the normalized graph: the schedule-cache key this plan was built from
  entry: Any                      # that cache's entry (identity-checked on every use)
  items: list[_PlanItem]
  outs: list[tuple[str, int, Any]]  # per fresh output: (device, size, dtype)
  internal: frozenset[int]         # the outputs no target views (a packing kernel's scratch): intermediates, as the scheduler marks them
  views: list[tuple[int, tuple[tuple[Ops, Any, Any], ...]]]  # per target: (output index, movement ops over it, bottom up)
  bind_leaves: tuple[int, ...]     # leaf indices of the BINDs (their values must agree per variable)
  allocators: dict[str, Any]       # per output device, its allocator
  direct: bool = False             # every item a loop-mapped kernel (CPU) without variables: launched directly
  last: list[UOp | None] = field(default_factory=list)  # per output, the BUFFER of the previous run (reused when unreachable)

  def valid(self) -> bool:
    if kernelize._SCHEDULE_CACHE.get(self.nsink) is not self.entry: return False
    runners = realize._RUNNERS
    for it in self.items:
      if it.runner is not None and runners.get((it.device, it.ast, it.opts)) is not it.runner: return False
    return True


def build(key: tuple[int, tuple[UOp, ...]], targets: list[UOp], info: dict, items: list[ScheduleItem]) -> None:
  """Remember the plan of the schedule just made for `targets` (from `create_schedule`'s `info`), or that there is none."""
  while _PLANS and len(_PLANS) >= MAX_PLANS: _PLANS.pop(next(iter(_PLANS)))
  _PLANS[key[0]] = _make(key[1], targets, info, items)
  if _PLANS[key[0]] is not None: PLAN_STATS["built"] += 1


def _make(leaves: tuple[UOp, ...], targets: list[UOp], info: dict, items: list[ScheduleItem]) -> Plan | None:
  nsink, mapping, norm = info["nsink"], info["mapping"], info["norm"]
  entry = kernelize._SCHEDULE_CACHE.get(nsink)
  if entry is None: return None
  items_t, becomes_t = entry
  if len(items_t) != len(items): return None
  tnodes = [mapping.get(t) for t in targets]
  if any(n is None or n not in becomes_t for n in tnodes) or set(becomes_t) != set(tnodes): return None  # intermediates: no
  leaf_pos = {x: i for i, x in enumerate(leaves)}
  try: in_leaf = [leaf_pos[b] for b in norm.inputs]
  except KeyError: return None
  var_leaf = {x.src[0]: i for i, x in enumerate(leaves) if x.op is Ops.BIND}
  outs: dict[UOp, int] = {}
  out_specs: list[tuple[str, int, Any]] = []
  pitems = []
  for it_t, it in zip(items_t, items):
    if it_t.ast.op not in (Ops.SINK, Ops.COPY) or any(b.op is not Ops.PARAM and not _input_view(b) for b in it_t.bufs): return None
    slots = []
    for j, b in enumerate(it_t.bufs):
      if b.op is Ops.BUFFER_VIEW:  # a range of an input (a chunked PACK's chunk): (False, leaf, (elements, dtype, byte offset))
        slots.append((False, in_leaf[b.src[0].arg[1]], (b.arg[0], b.dtype, b.arg[1])))
        continue
      kind, idx = b.arg[0], b.arg[1]
      if kind == "in": slots.append((False, in_leaf[idx]))
      elif kind == "out":
        if b not in outs:
          if j != 0: return None  # an output read before it is written: not a fresh buffer's job
          outs[b] = len(out_specs); out_specs.append((b.arg[3], b.arg[2], b.dtype))
        slots.append((True, outs[b]))
      else: return None
    if any(v not in var_leaf for v in it_t.var_vals): return None
    dev, runner = buffer_for(it.bufs[0]).device, None
    if it_t.ast.op is not Ops.COPY and (runner := realize._RUNNERS.get((dev, it_t.ast, it_t.opts))) is None: return None
    pitems.append(_PlanItem(it_t.ast, it_t.opts, runner, dev, tuple(slots), tuple((v.arg[0], var_leaf[v]) for v in it_t.var_vals)))
  views = []
  for n in tnodes:
    v, chain = becomes_t[n], []
    while v.op in GroupOp.Movement:
      if _has_uop(v.arg): return None
      chain.append((v.op, v.dtype, v.arg)); v = v.src[0]
    if v not in outs: return None
    views.append((outs[v], tuple(reversed(chain))))
  allocators = {dev: buffer_for(it.bufs[0]).allocator for it in items for dev in (buffer_for(it.bufs[0]).device,)}
  if any(d not in allocators for d, _, _ in out_specs): return None
  direct = all(r is not None and not r.spec.vars and r.spec.local_size is None for r in (it.runner for it in pitems))
  internal = frozenset(range(len(out_specs))) - {oi for oi, _ in views}
  return Plan(nsink, entry, pitems, out_specs, internal, views, tuple(i for i, x in enumerate(leaves) if x.op is Ops.BIND), allocators,
              direct, [None] * len(out_specs))


def _input_view(b: UOp) -> bool:
  """Whether item buffer `b` is a view of an input placeholder (which plans hold as a leaf and a range of it)."""
  return b.op is Ops.BUFFER_VIEW and b.src[0].op is Ops.PARAM and b.src[0].arg[0] == "in"


def _slot_buffer(slot: tuple, out_bufs: list[Buffer], leaves: tuple[UOp, ...]) -> Buffer:
  """The Buffer of a plan item's slot: an output, a leaf's, or a view of a leaf's."""
  if slot[0]: return out_bufs[slot[1]]
  b = buffer_for(leaves[slot[1]]).ensure_allocated()
  return b if len(slot) == 2 else b.view(*slot[2]).ensure_allocated()


def _unreachable(u: UOp) -> bool:
  """Whether the plan's reference (`Plan.last`) is the only way to reach output BUFFER `u` and its Buffer: no tensor,
  graph, view, captured TinyJit item or caller holds either, so writing the next result into it is invisible (the
  same memory the allocator's cache would hand out again). Counts are CPython's reference counts: the list slot, the
  caller's variable, this function's parameter and getrefcount's argument for `u`; the uop's cache, this function's
  variable and getrefcount's argument for its Buffer. Where reference counts don't exist, outputs are never reused."""
  if _getrefcount is None or _getrefcount(u) != 4: return False
  c = u._cache
  if c is None or (b := c.get("buffer")) is None or _getrefcount(b) != 3: return False
  return b.is_allocated and b._base is None


def lookup(key: tuple[int, tuple[UOp, ...]] | None) -> Plan | None:
  """The usable plan for these targets' structure (None: schedule them the normal way)."""
  if key is None or capture.VIZ or (p := _PLANS.get(key[0])) is None or not p.valid(): return None
  return p


def wants(key: tuple[int, tuple[UOp, ...]] | None) -> bool:
  """Whether a plan should be built for this structure after its normal schedule: not when it was found unplannable,
  nor when a valid plan exists already (VIZ=1 realizes take the normal path without replacing it)."""
  if key is None or (p := _PLANS.get(key[0], 0)) is None: return False
  return p == 0 or not p.valid()


def run(p: Plan, leaves: tuple[UOp, ...]) -> list[UOp] | None:
  """Run plan `p` on these leaves; the realized view of each target (None: the leaves' bound values disagree, which
  the normal path reports)."""
  if p.bind_leaves:
    vals: dict[UOp, int] = {}
    for i in p.bind_leaves:
      b = leaves[i]
      if vals.setdefault(b.src[0], b.src[1].arg) != b.src[1].arg: return None
  out_uops, out_bufs, last = [], [], p.last
  for k, (dev, size, dt) in enumerate(p.outs):
    if (u := last[k]) is not None and _unreachable(u):  # the previous output, which nothing else can reach any more
      out_uops.append(u); out_bufs.append(u._cache["buffer"])
      PLAN_STATS["reused"] += 1
      continue
    u = new_buffer(dev, size, dt)
    if size * dt.itemsize <= REUSE_MAX_BYTES: last[k] = u
    b = Buffer(dev, size, dt)
    if k in p.internal: b.internal = True   # (TinyJit's memory planner may place it in its arena: no tensor sees it)
    b.__dict__["_allocator"] = p.allocators[dev]  # (what Buffer.allocator would look up in the device registry)
    u._cached()["buffer"] = b  # (realize.set_buffer, without its checks: the plan made these to match)
    out_uops.append(u); out_bufs.append(b.allocate())
  debug = getenv("DEBUG", 0)
  if debug >= 1: print(f"schedule cache hit: {len(p.items)} items (plan)")
  SCHEDULE_STATS["hits"] += 1
  PLAN_STATS["hits"] += 1
  direct = p.direct and not debug and not realize.CAPTURING and not capture.PROFILE  # no hook wants ExecItems
  eis: list[ExecItem] = []
  for it in p.items:
    if direct:  # (what ExecItem.run does for loop-mapped kernels without variables)
      raw = []  # the allocator handles: a leaf's Buffer read from its uop's cache (buffer_for), allocated if it isn't
      for slot in it.slots:
        is_out, i = slot[0], slot[1]
        if is_out: raw.append(out_bufs[i]._buf)
        elif len(slot) == 2 and (c := leaves[i]._cache) is not None and (b := c.get("buffer")) is not None and (h := b._buf) is not None:
          raw.append(h)
        else: raw.append(_slot_buffer(slot, out_bufs, leaves)._buf)
      realize.GlobalCounters["kernels"] += 1
      it.runner.prg.launch(*raw)
    else:
      bufs = [_slot_buffer(slot, out_bufs, leaves) for slot in it.slots]
      eis.append(ExecItem(it.runner, bufs, {name: leaves[i].src[1].arg for name, i in it.var_names} if it.var_names else {}))
  if eis: run_exec_items(eis, debug)
  ret = []
  for oi, chain in p.views:
    v = out_uops[oi]
    for op, dt, arg in chain:  # (the plan made these views once: built without construction checks, shape memoized)
      v = elementwise(op, dt, (v,), arg if op is Ops.RESHAPE or op is Ops.EXPAND else None, p.outs[oi][0], arg)[0]
    ret.append(v)
  return ret
