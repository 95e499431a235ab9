"""Explicit SIMD: turn the vector lane range of an optimized kernel AST (Opt VECTOR, codegen/opt.py) into vector values.

Renderers with vector types (`vector_lanes` > 0) run `vectorize` between codegen/opt.py and the linearizer. Every
node that depends on the lane range L (k lanes) becomes a value of dtype T.vec(k), or k scalars where that is better:
- a LOAD whose address is base + lane (checked symbolically, lane by lane) is one LOAD of dtype T.vec(k) from
  INDEX(buf, base): k contiguous elements; one whose address is the same for every lane stays a scalar LOAD; one
  whose address is base + lane % g (g = 2 or 4: a group dot's factor that doesn't move with the lanes, when the
  lanes run along an output axis) is one LOAD of T.vec(g) repeated across the lanes (x86: a vpbroadcastd);
  other loads (and loads whose gate depends on L) are done lane by lane; a contiguous float16 load is a vector where
  the renderer converts float16 vectors in hardware (`f16_vectors`), and its CAST to float32 a vector CAST;
- ALU ops the renderer has for vectors (`vector_ops`, not bool/index/16-bit float) become vector ops with scalar
  sources broadcast (VECTORIZE of one value k times); other ops run lane by lane on GEPs of their sources;
- index and bool values are never vectors: lane i is the expression with L replaced by i (then simplified);
- a REDUCE over L reduces a vector accumulator over its other ranges, then combines the lanes (a tree of GEPs); a
  REDUCE not over L (L is an output axis) has a vector accumulator and result;
- a group dot (renderers with integer dots, `Dots`): an int32 ADD-REDUCE over one range p of g = 2 or 4 whose body is
  a product of two values read at g*L + p (groups side by side in memory) is one `WMMA(a, b, 0, "DOT2" | "DOT4")`: a
  and b are computed as gk-lane vectors (the lanes of L and p together: contiguous loads, narrow unpacking) and lane i
  of the result is the sum over j < g of a[g*i+j]*b[g*i+j]. DOT2: both factors fit int16 (x86's pmaddwd: 2k
  multiply-adds an instruction); DOT4: a uint8 code up to the renderer's bound times an int8 (x86's vpdpbusd: 4k);
- a STORE to base + lane is one vector STORE; other stores are written lane by lane.
The result has no lane range, so the linearizer treats it like any kernel. Renderers without vector types never run
this: for them (and the PYTHON device) a lane range is a plain loop.

How: one graph_rewrite per lane range with two PatternMatchers and a `_LaneCtx`. The pre-order rules
(`pm_lanes_pre`) see a node as it came in, before its sources are rewritten: they decide what needs the lane range
itself (how a LOAD's or STORE's address moves across the lanes, a REDUCE over the lane, a group dot, index values lane
by lane). The post-order rules (`pm_lanes_post`) see a node over its rewritten sources and build the vector op or the
k lane ops. What stands for a lane-varying node of dtype T is a NOOP of T around its value (a T.vec(k) vector, a
VECTORIZE of its k lanes, or a scalar the same in every lane), so that the nodes above it keep their dtypes until
their own rule unwraps it. A STORE or a REDUCE over the lane decided pre-order is tagged and finished post-order,
once its value is expanded.
"""
from __future__ import annotations

import functools

from plugrad.codegen.facts import NO_DOTS, Dots, dot4_factors, fits, fits16, group_dot_range, group_lane, lane_pattern
from plugrad.codegen.expand import pm_flatten_stores, pm_opt_symbolic, store_group
from plugrad.dtype import DType, dtypes
from plugrad.runtime.renderer import DEFAULT_VECTOR_OPS
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.upat import PatternMatcher, UPat

_NO_VECTOR_DTYPES = (dtypes.bool, dtypes.index, dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2)

Lanes = tuple  # k scalar UOps, one per lane
_WIDEN_OPS = (Ops.SHR, Ops.AND, Ops.OR, Ops.XOR)


def _widen(x: UOp) -> UOp:
  """An unsigned 8/16-bit expression of SHR/AND/OR/XOR computed in int32 (zero extension commutes with these ops, and
  C computes them in int anyway)."""
  if x.op in _WIDEN_OPS: return UOp(x.op, dtypes.int32, (_widen(x.src[0]), _widen(x.src[1])))
  if x.op is Ops.CONST: return UOp.const(dtypes.int32, x.arg)
  return UOp(Ops.CAST, dtypes.int32, (x,))


def _horizontal(v: UOp, op: Ops) -> UOp:
  """The lanes of vector `v` combined with `op`: halves added as vectors (the compiler makes shuffles), then a scalar."""
  while (k := v.dtype.count) > 1:
    lo, hi = (UOp(Ops.VECTORIZE, v.dtype.scalar().vec(k // 2), tuple(UOp(Ops.GEP, v.dtype.scalar(), (v,), (i,)) for i in rng))
              for rng in (range(k // 2), range(k // 2, k)))
    v = UOp(op, lo.dtype, (lo, hi)) if k > 2 else UOp(op, v.dtype.scalar(), (lo, hi))
  return v


_NARROW_OPS = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR)


def _narrow16(x: UOp) -> UOp | None:
  """An integer expression computed in int16, where it and every intermediate value fit (range analysis), so the
  int16 ops give the same values; None otherwise."""
  if not fits16(x) or x.dtype.count != 1: return None
  if x.dtype == dtypes.int16: return x
  if x.op is Ops.CONST: return UOp.const(dtypes.int16, x.arg)
  if x.op is Ops.CAST and (dtypes.is_int(x.src[0].dtype) or x.src[0].dtype == dtypes.bool):
    return x.src[0] if x.src[0].dtype == dtypes.int16 else UOp(Ops.CAST, dtypes.int16, (x.src[0],))
  if x.op is Ops.WHERE:
    a, b = _narrow16(x.src[1]), _narrow16(x.src[2])
    return None if a is None or b is None else UOp(Ops.WHERE, dtypes.int16, (x.src[0], a, b))
  if x.op not in _NARROW_OPS: return None
  srcs = [_narrow16(s) for s in x.src]
  return None if any(s is None for s in srcs) else UOp(x.op, dtypes.int16, tuple(srcs))  # type: ignore[arg-type]


_RING_OPS = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.AND, Ops.OR, Ops.XOR)
_BYTE_RANGE = {dtypes.uint8: (0, 255), dtypes.int8: (-128, 127)}


def _narrow8(x: UOp, dt: DType) -> UOp | None:
  """An integer expression whose value fits byte type `dt` (range analysis) computed in `dt`, else None. Its ops
  compute modulo 256 (ring ops and shifts left wrap, so an intermediate may leave the byte's range, e.g. an int8 code
  plus 128); a right shift needs its operand exact (in [0, 255]). The final value fits, so it is exact."""
  return _wrap8(x, dt) if x.dtype.count == 1 and fits(x, *_BYTE_RANGE[dt]) else None


def _wrap8(x: UOp, dt: DType) -> UOp | None:
  """`x` modulo 256 computed in byte type `dt` (see `_narrow8`), None where an op doesn't wrap."""
  if x.dtype == dt: return x
  if x.op not in (Ops.CONST, Ops.CAST) and fits(x, *_BYTE_RANGE[dt]) and not any(n.op is Ops.LOAD for n in x.toposort()):
    return UOp(Ops.CAST, dt, (x,))   # index arithmetic (a shift amount): computed as it is, then narrowed
  if x.op is Ops.CONST and dtypes.is_int(x.dtype): return UOp.const(dt, (int(x.arg) + 128) % 256 - 128 if dt == dtypes.int8 else int(x.arg) % 256)
  if x.op is Ops.CAST and ((src := x.src[0]).dtype in (dtypes.bool, dtypes.index) or dtypes.is_int(src.dtype)):
    if src.dtype == dt: return src
    if src.dtype.itemsize == 1 or fits(src, *_BYTE_RANGE[dt]): return UOp(Ops.CAST, dt, (src,))   # (index: a shift amount)
    return _wrap8(src, dt) if dtypes.is_int(src.dtype) else None
  if x.op is Ops.SHL and fits(x.src[1], 0, 7): srcs = [_wrap8(x.src[0], dt), _wrap8(x.src[1], dt)]
  elif x.op is Ops.SHR and fits(x.src[0], 0, 255) and fits(x.src[1], 0, 7):
    a, sh = _wrap8(x.src[0], dtypes.uint8), _wrap8(x.src[1], dtypes.uint8)
    if a is None or sh is None: return None
    r = UOp(Ops.SHR, dtypes.uint8, (a, sh))
    return r if dt == dtypes.uint8 else UOp(Ops.CAST, dt, (r,))
  elif x.op is Ops.WHERE: srcs = [x.src[0], _wrap8(x.src[1], dt), _wrap8(x.src[2], dt)]
  elif x.op in _RING_OPS and dtypes.is_int(x.dtype): srcs = [_wrap8(s, dt) for s in x.src]
  else: return None
  return None if any(s is None for s in srcs) else UOp(x.op, dt, tuple(srcs))  # type: ignore[arg-type]


class _LaneCtx:
  """What the vectorize rules share for one lane range: the lane, its width, the target's vector ops and dots, and
  memos (a node in one lane, how an index moves across the lanes, which nodes vary with the lane)."""
  def __init__(self, lane: UOp, vector_ops: frozenset[Ops], dots: Dots = NO_DOTS, f16: bool = False):
    self.lane, self.k, self.vops, self.dots, self.f16 = lane, lane.src[0].arg, vector_ops, dots, f16
    self.consts = [UOp.const(dtypes.index, i) for i in range(self.k)]
    self.subs: dict[tuple[UOp, int], UOp] = {}
    self.patterns: dict[UOp, tuple[str, UOp]] = {}
    self.dep: dict[UOp, bool] = {lane: True}
    self.closers: set[UOp] = set()   # REDUCEs over the lane: their results don't vary with it
    self.siblings: dict[UOp, tuple[UOp, ...]] = {}   # closer -> the closers whose lanes are combined with its (`_reduce`)
    self.joint: dict[tuple[UOp, ...], UOp] = {}

  def find_siblings(self, ast: UOp) -> None:
    """Group the closers that reduce the same op over the same ranges, each on its own (no ADD/MUL/MAX of such
    REDUCEs combines it first, `_tree`), in groups of a power of two up to the lane count: their lanes are combined
    together (`_joint_horizontal`)."""
    inner = {s for n in ast.toposort() if n.op in (Ops.ADD, Ops.MUL, Ops.MAX) for s in n.src if s.op is Ops.REDUCE and s.arg is n.op}
    groups: dict[tuple, list[UOp]] = {}
    for n in sorted(self.closers, key=lambda x: x.seq):
      if n not in inner and n.arg in (Ops.ADD, Ops.MUL, Ops.MAX) and self.vec_dtype_ok(n.dtype):
        groups.setdefault((n.arg, n.dtype, n.src[1:]), []).append(n)
    for g in groups.values():
      while len(g) >= 2:
        m = 1 << min(len(g).bit_length() - 1, self.k.bit_length() - 1)
        if m >= 2:
          for n in (t := tuple(g[:m])): self.siblings[n] = t
        g = g[m:]

  def depends(self, n: UOp) -> bool:
    """Whether `n` varies with the lane (a REDUCE over the lane range doesn't)."""
    if (d := self.dep.get(n)) is not None: return d
    for x in n.toposort(gate=lambda y: y not in self.dep):
      if x not in self.dep: self.dep[x] = x not in self.closers and any(self.dep[s] for s in x.src)
    return self.dep[n]

  def at(self, n: UOp, i: int) -> UOp:
    """`n` in lane i: the lane range replaced by the constant i, simplified."""
    if not self.depends(n): return n
    if (r := self.subs.get((n, i))) is None:
      r = self.subs[(n, i)] = graph_rewrite(n.substitute({self.lane: self.consts[i]}, walk=True), pm_opt_symbolic, name="lane")
    return r

  def lanes(self, n: UOp) -> UOp:
    """`n` lane by lane: VECTORIZE of its k lanes (the lanes form), wrapped."""
    return _wrap(UOp(Ops.VECTORIZE, n.dtype.vec(self.k), tuple(self.at(n, i) for i in range(self.k))), n.dtype)

  def vec_dtype_ok(self, dt: DType) -> bool: return dt.scalar() not in _NO_VECTOR_DTYPES and dt.count == 1
  def vec_load_ok(self, dt: DType) -> bool: return self.vec_dtype_ok(dt) or (self.f16 and dt == dtypes.float16)

  def vec(self, x: UOp, dt: DType) -> UOp:
    """`x` as a k-vector: itself when it is one (vector or lanes form), else broadcast."""
    x = _form(x)
    return x if x.dtype.count == self.k and x.dtype.count > 1 else UOp(Ops.VECTORIZE, dt.vec(self.k), (x,) * self.k)

  def pattern(self, idx: UOp) -> tuple[str, UOp]:
    """("broadcast" | "contiguous" | "tile2" | "tile4" | "gather", the index of lane 0)."""
    if (r := self.patterns.get(idx)) is not None: return r
    r = self.patterns[idx] = self._pattern(idx)
    return r

  def _pattern(self, idx: UOp) -> tuple[str, UOp]:
    if (guess := lane_pattern(idx, self.lane)) == "gather" or (guess != "broadcast" and idx.dtype != dtypes.index):
      return "gather", self.at(idx, 0)  # sampled: no need to prove
    d = graph_rewrite(idx - self.lane if guess == "contiguous" else idx, pm_opt_symbolic, name="lane stride")
    if self.lane not in d.toposort():  # idx is (something without the lane) + lane, or without it
      return ("contiguous" if guess == "contiguous" else "broadcast"), self.at(idx, 0)
    base = self.at(idx, 0)  # e.g. (16*r+lane)//32: lane by lane
    diffs = [graph_rewrite(self.at(idx, i) - base, pm_opt_symbolic, name="lane stride") for i in range(1, self.k)]
    if all(d.op is Ops.CONST and d.arg == 0 for d in diffs): return "broadcast", base
    if all(d.op is Ops.CONST and d.arg == i for i, d in enumerate(diffs, 1)): return "contiguous", base
    if guess.startswith("tile") and all(d.op is Ops.CONST and d.arg == i % int(guess[4:]) for i, d in enumerate(diffs, 1)): return guess, base
    return "gather", base

  def uniform_gate(self, ix: UOp) -> tuple[UOp, ...] | None:
    """The gate of INDEX `ix` as a lane-invariant source tuple (empty without a gate), None if it varies by lane."""
    if len(ix.src) < 3 or not self.depends(ix.src[2]): return tuple(ix.src[2:])
    kind, g = self.pattern(ix.src[2])
    return (g,) if kind == "broadcast" else None

  def reduce_vector(self, n: UOp) -> UOp | None:
    """The vector accumulator of a REDUCE over the lane range (lane i holds lane i's partial result), also for an
    ADD/MUL tree of such REDUCEs with the same op (SPLIT's accumulators are combined before the horizontal step):
    built over the REDUCE's body as it is, tagged for `_reduce_post` to vectorize once the body is expanded. None where
    the reduce isn't done on vectors."""
    if n.op in (Ops.ADD, Ops.MUL, Ops.MAX) and n not in self.closers:
      parts = [self.reduce_vector(s) if s.op is Ops.REDUCE and s.arg is n.op or s.op is n.op else None for s in n.src]
      return UOp(n.op, n.dtype.vec(self.k), tuple(parts)) if all(p is not None for p in parts) else None  # type: ignore[arg-type]
    if n not in self.closers or n.arg not in (Ops.ADD, Ops.MUL, Ops.MAX) or n.arg not in self.vops or not self.vec_dtype_ok(n.dtype): return None
    return self.deferred(n, n.dtype.vec(self.k), _VECTOR_ACC)

  def deferred(self, n: UOp, dt: DType, tag: str) -> UOp:
    """REDUCE `n` without the lane range, of dtype `dt`, tagged for a post-order rule (`tag`); it doesn't vary with the
    lane, so the rules leave what uses it alone."""
    r = UOp(Ops.REDUCE, dt, (n.src[0], *(x for x in n.src[1:] if x is not self.lane)), n.arg, tag)
    self.closers.add(r); self.dep[r] = False
    return r


# the tags of the pass's own nodes: what stands for a lane-varying node; deferred reduces and stores, decided on the node
# as it came in and finished once their sources are expanded; lane i of a node
_MADE, _VECTOR_ACC, _LANE_PARTS, _VECTOR_STORE, _LANE = "lanes", "vector acc", "lane parts", "vector store", "lane"


def _wrap(x: UOp, dt: DType) -> UOp:
  """What the rules make for a node of dtype `dt` that varies with the lane: its value `x` (a k-vector, VECTORIZE of its
  k lanes, or a scalar the same in every lane) in a NOOP of `dt`, so that the node's consumers, rebuilt over it, keep
  their dtypes until their own rules unwrap it."""
  return UOp(Ops.NOOP, dt, (x,), None, _MADE)


def _form(x: UOp) -> UOp: return x.src[0] if x.op is Ops.NOOP and x.tag == _MADE else x
def _expanded(n: UOp) -> bool: return any(s.op is Ops.NOOP and s.tag == _MADE for s in n.src)


def _gep(x: UOp, i: int) -> UOp:
  """Lane i of `x` (wrapped or not: a vector or lanes form, or a scalar)."""
  x = _form(x)
  if x.dtype.count > 1: return x.src[i] if x.op is Ops.VECTORIZE else UOp(Ops.GEP, x.dtype.scalar(), (x,), (i,))
  return x


def _lane_of(x: UOp, i: int) -> UOp:
  """A placeholder for lane i of lane-varying node `x`, resolved by `_resolve_lane` once `x` is expanded."""
  return UOp(Ops.GEP, x.dtype, (x,), (i,), _LANE)


# ----- pre-order rules: they see a node as it came in (its index expressions, its REDUCE's body) -----

def _load(ctx: _LaneCtx, n: UOp) -> UOp | None:
  """A LOAD: one vector load (contiguous), a scalar one (the same address in every lane), one group repeated across
  the lanes (tile), or lane by lane."""
  if not ctx.depends(n): return None
  ix = n.src[0]
  if len(n.src) == 1 and ix.op is Ops.INDEX and (gate := ctx.uniform_gate(ix)) is not None:
    kind, base = ctx.pattern(ix.src[1])
    nix = ix.replace(src=(ix.src[0], base, *gate))
    if kind == "broadcast": return _wrap(UOp(Ops.LOAD, n.dtype, (nix,)), n.dtype)
    if kind == "contiguous" and ctx.vec_load_ok(n.dtype): return _wrap(UOp(Ops.LOAD, n.dtype.vec(ctx.k), (nix,)), n.dtype)
    if kind.startswith("tile") and ctx.vec_dtype_ok(n.dtype):   # one load of the group, repeated across the lanes
      g = int(kind[4:])
      v = UOp(Ops.LOAD, n.dtype.vec(g), (nix,))
      return _wrap(UOp(Ops.VECTORIZE, n.dtype.vec(ctx.k), tuple(UOp(Ops.GEP, n.dtype, (v,), (i % g,)) for i in range(ctx.k))), n.dtype)
  return ctx.lanes(n)


def _store(ctx: _LaneCtx, st: UOp) -> UOp | None:
  """A STORE of a lane-varying value or address: one vector store (contiguous), the last lane's value (one address,
  as the loop would leave it), or lane by lane (a GROUP of k stores, flattened into the SINK)."""
  if st.tag is not None or not ctx.depends(st): return None
  ix, val = st.src[0], st.src[1]
  if ix.op is Ops.INDEX and len(st.src) == 2 and (gate := ctx.uniform_gate(ix)) is not None:
    kind, base = ctx.pattern(ix.src[1])
    nix = ix.replace(src=(ix.src[0], base, *gate))
    if kind == "broadcast": return st.replace(src=(nix, _lane_of(val, ctx.k - 1)), tag=_LANE)
    if kind == "contiguous" and ctx.vec_dtype_ok(val.dtype): return st.replace(src=(nix, val), tag=_VECTOR_STORE)
  return store_group(st.replace(src=(ctx.at(ix, i), _lane_of(val, i), *st.src[2:]), tag=_LANE) for i in range(ctx.k))


def _fold_halves(vs: list[UOp], g: int, op: Ops) -> UOp:
  """`op` of the lower and upper halves of each of g groups of lanes in vectors `vs` (one, or two of the same width):
  a vector of half their lanes, the groups kept in order."""
  w, sc = vs[0].dtype.count, vs[0].dtype.scalar()
  p, out = w // g, sc.vec(len(vs) * w // 2)
  def half(off: int) -> UOp:
    return UOp(Ops.VECTORIZE, out, tuple(UOp(Ops.GEP, sc, (v,), (j * p + off + i,)) for v in vs for j in range(g) for i in range(p // 2)))
  return UOp(op, out, (half(0), half(p // 2)))


def _joint_horizontal(accs: list[UOp], op: Ops) -> UOp:
  """The lanes of each of g vector accumulators (g a power of two, at most their width W) combined with `op`, all at
  once: a W-wide vector of lanes from two accumulators' lower halves meets one of their upper halves, so each op folds
  two accumulators at a time; once one vector holds all g, its groups fold in place. Lane i of the result is
  accumulator i's. 16 lanes and 8 accumulators take 8 ops (7 pairings, 1 fold) against 32 in separate trees."""
  items = [(a, 1) for a in accs]   # (vector, number of accumulators in it); each holds W // g partials of each
  while len(items) > 1: items = [(_fold_halves([a, b], g, op), 2 * g) for (a, g), (b, _) in zip(items[0::2], items[1::2])]
  v, g = items[0]
  while v.dtype.count > g: v = _fold_halves([v], g, op)
  return v


def _reduce(ctx: _LaneCtx, n: UOp) -> UOp | None:
  """A REDUCE over the lane: its vector accumulator's lanes combined (with its siblings', `_LaneCtx.siblings`: the
  copies of an upcast output axis), or its lanes' partial results added up; a group dot (not over the lane) as a
  WMMA DOT2/DOT4."""
  if n.tag is not None: return None
  if n in ctx.closers:
    if (sib := ctx.siblings.get(n)) is not None:
      if (j := ctx.joint.get(sib)) is None:
        accs = [ctx.reduce_vector(m) for m in sib]
        if any(a is None for a in accs): ctx.siblings = {k: v for k, v in ctx.siblings.items() if v is not sib}
        else: j = ctx.joint[sib] = _joint_horizontal(accs, n.arg)   # type: ignore[arg-type]
      if j is not None: return UOp(Ops.GEP, n.dtype, (j,), (sib.index(n),))
    if (acc := ctx.reduce_vector(n)) is not None: return _horizontal(acc, n.arg)
    return ctx.deferred(n, n.dtype, _LANE_PARTS)
  return _group_dot(ctx, n) if ctx.dots and ctx.depends(n) else None


def _tree(ctx: _LaneCtx, n: UOp) -> UOp | None:
  """An ADD/MUL/MAX tree of REDUCEs over a reduce lane (SPLIT's accumulators): combined as vectors, then one
  horizontal step."""
  if ctx.lane.arg[1] != "reduce" or (acc := ctx.reduce_vector(n)) is None: return None
  return _horizontal(acc, n.op)


def _widened(ctx: _LaneCtx, n: UOp) -> UOp | None:
  """Unpacking bits of bytes (a float CAST of SHR/AND/OR/XOR on uint8/16): the same values computed in int32 lanes
  (x86 has no byte shifts)."""
  if n.dtype.count != 1 or not dtypes.is_float(n.dtype) or n.src[0].dtype not in (dtypes.uint8, dtypes.uint16) \
     or n.src[0].op not in _WIDEN_OPS or not ctx.depends(n): return None
  return UOp(Ops.CAST, n.dtype, (_widen(n.src[0]),))


def _lane_by_lane(ctx: _LaneCtx, n: UOp) -> UOp | None:
  """Index values (never vectors) and ops the rules don't vectorize: lane i is `n` with the lane replaced by i,
  simplified (index arithmetic folds per lane)."""
  if n.op in _KEEP or not (n.dtype.scalar() == dtypes.index or n.op not in _VALUE_OPS) or not ctx.depends(n): return None
  return ctx.lanes(n)


_VALUE_OPS = GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.LOAD, Ops.REDUCE}
_KEEP = frozenset({Ops.STORE, Ops.SINK, Ops.GROUP, Ops.GEP, Ops.VECTORIZE})

pm_lanes_pre = PatternMatcher([
  (UPat(Ops.LOAD, name="n"), _load),
  (UPat(Ops.STORE, name="st"), _store),
  (UPat(Ops.REDUCE, name="n"), _reduce),
  (UPat((Ops.ADD, Ops.MUL, Ops.MAX), name="n"), _tree),
  (UPat(Ops.CAST, name="n"), _widened),
  (UPat(name="n"), _lane_by_lane),
])


# ----- post-order rules: a node's sources are expanded (vector or lanes form) -----

_MASK_LANES = (dtypes.float32, dtypes.int32, dtypes.uint32)  # 32-bit lanes: their comparisons give 32-bit masks


def _mask_op(ctx: _LaneCtx, n: UOp) -> UOp | None:
  """A comparison of 32-bit lanes, a bool AND/OR/XOR, a WHERE selecting 32-bit or bool lanes, or a CAST between bool
  and float32/int32, as one vector op over masks (a bool vector is a mask of 32-bit lanes), where the renderer has
  vector comparisons and selects (CMPLT, CMPNE, CMPEQ and WHERE in its `vector_ops`). None otherwise."""
  if n.op not in ctx.vops: return None
  src = [s.dtype.scalar() for s in n.src]
  if n.op in GroupOp.Comparison: ok = src[0] in _MASK_LANES and src[1] == src[0]
  elif n.op in (Ops.AND, Ops.OR, Ops.XOR): ok = n.dtype == dtypes.bool
  elif n.op is Ops.WHERE: ok = src[0] == dtypes.bool and (n.dtype in _MASK_LANES or n.dtype == dtypes.bool)
  elif n.op is Ops.CAST:
    ok = (src[0] == dtypes.bool and n.dtype in (dtypes.float32, dtypes.int32)) or (src[0] in _MASK_LANES and n.dtype == dtypes.bool)
  else: ok = False
  if not ok: return None
  return _wrap(UOp(n.op, n.dtype.vec(ctx.k), tuple(ctx.vec(s, s.dtype.scalar()) for s in n.src), n.arg), n.dtype)


def _alu(ctx: _LaneCtx, n: UOp) -> UOp | None:
  """An ALU op, CAST or BITCAST over expanded sources: one vector op where the target has it for these dtypes
  (lane-invariant sources broadcast; bools as masks, `_mask_op`), else lane by lane."""
  if n.dtype.count != 1 or not _expanded(n): return None
  if (m := _mask_op(ctx, n)) is not None: return m
  s0 = _form(n.src[0])
  if n.op is Ops.CAST and n.dtype == dtypes.float32 and s0.dtype == dtypes.float16.vec(ctx.k) and s0.op is not Ops.VECTORIZE:
    return _wrap(UOp(Ops.CAST, n.dtype.vec(ctx.k), (s0,)), n.dtype)   # a float16 vector load (f16_vectors) converted as a whole
  if n.op in ctx.vops and ctx.vec_dtype_ok(n.dtype) and all(s.dtype.scalar() not in _NO_VECTOR_DTYPES for s in n.src):
    return _wrap(UOp(n.op, n.dtype.vec(ctx.k), tuple(ctx.vec(s, s.dtype.scalar()) for s in n.src), n.arg), n.dtype)
  lanes = tuple(UOp(n.op, n.dtype, tuple(_gep(s, i) for s in n.src), n.arg) for i in range(ctx.k))
  return _wrap(UOp(Ops.VECTORIZE, n.dtype.vec(ctx.k), lanes), n.dtype)


def _reduce_post(ctx: _LaneCtx, n: UOp) -> UOp | None:
  """A REDUCE over expanded values: a deferred accumulator of a reduce over the lane (`reduce_vector`, `_reduce`), or
  a reduce not over the lane (the lane is an output axis): a vector accumulator, else one per lane."""
  x, rngs = n.src[0], n.src[1:]
  if n.tag == _VECTOR_ACC: return UOp(Ops.REDUCE, n.dtype, (ctx.vec(x, n.dtype.scalar()), *rngs), n.arg) if rngs else ctx.vec(x, n.dtype.scalar())
  if n.tag == _LANE_PARTS:
    parts = [UOp(Ops.REDUCE, n.dtype, (_gep(x, i), *rngs), n.arg) if rngs else _gep(x, i) for i in range(ctx.k)]
    return functools.reduce(lambda a, b: UOp(n.arg, n.dtype, (a, b)), parts)
  if n.dtype.count != 1 or not _expanded(n): return None
  if n.arg in (Ops.ADD, Ops.MUL, Ops.MAX) and n.arg in ctx.vops and ctx.vec_dtype_ok(n.dtype):
    return _wrap(UOp(Ops.REDUCE, n.dtype.vec(ctx.k), (ctx.vec(x, n.dtype), *rngs), n.arg), n.dtype)
  lanes = tuple(UOp(Ops.REDUCE, n.dtype, (_gep(x, i), *rngs), n.arg) for i in range(ctx.k))
  return _wrap(UOp(Ops.VECTORIZE, n.dtype.vec(ctx.k), lanes), n.dtype)


def _resolve_lane(g: UOp) -> UOp | None:
  """A `_lane_of` placeholder whose node is expanded: that lane of it."""
  return _gep(g.src[0], g.arg[0]) if g.tag == _LANE else None


def _store_post(ctx: _LaneCtx, st: UOp) -> UOp | None:
  """A STORE the pre-order rule decided: the vector store gets its value as a vector; the others lose their tag."""
  if st.tag == _VECTOR_STORE: return st.replace(src=(st.src[0], ctx.vec(st.src[1], st.src[1].dtype.scalar())), tag=None)
  return st.replace(tag=None) if st.tag == _LANE else None


pm_lanes_post = PatternMatcher([
  (UPat(Ops.GEP, name="g"), _resolve_lane),
  (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}, name="n"), _alu),
  (UPat(Ops.REDUCE, name="n"), _reduce_post),
  (UPat(Ops.STORE, name="st"), _store_post),
]) + pm_flatten_stores


def _expand_lane(ast: UOp, ctx: _LaneCtx) -> UOp:
  """`ast` with `ctx`'s lane range expanded: the pre-order rules decide loads, stores and reduces on the node as it
  came in, the post-order rules build vector ops over expanded sources."""
  return graph_rewrite(ast, pm_lanes_post, ctx=ctx, bpm=pm_lanes_pre, name="vectorize lane")


def _group_dot(ctx: _LaneCtx, n: UOp) -> UOp | None:
  """REDUCE(a*b, ..., p) as WMMA(a, b, acc, "DOT2" | "DOT4") on gk lanes of the group's types (module docstring),
  None where it doesn't fit."""
  if (p := group_dot_range(n, ctx.dots)) is None: return None
  g = p.src[0].arg
  wide = group_lane(ctx.lane, g)
  sub = {ctx.lane: wide // UOp.const(dtypes.index, g), p: wide % UOp.const(dtypes.index, g)}
  facs, dts = (n.src[0].src, (dtypes.int16, dtypes.int16)) if g == 2 else (dot4_factors(n.src[0], ctx.dots.quad), (dtypes.uint8, dtypes.int8))
  narrow = [graph_rewrite(s.substitute(sub, walk=True), pm_opt_symbolic, name="group lanes") for s in facs]  # type: ignore[union-attr]
  ops = [_narrow16(o) if g == 2 else _narrow8(o, dt) for o, dt in zip(narrow, dts)]
  if any(o is None or any(x.op is Ops.REDUCE for x in o.toposort()) for o in ops): return None
  wctx = _LaneCtx(wide, ctx.vops)
  vs = [_form(_expand_lane(o, wctx)) for o in ops]  # type: ignore[arg-type]
  if any(_is_lanes(v) for v in vs) or all(v.dtype.count == 1 for v in vs): return None  # lane by lane: no gain
  a, b = (wctx.vec(v, dt) for v, dt in zip(vs, dts))
  zero = ctx.vec(UOp.const(dtypes.int32, 0), dtypes.int32)
  dot = UOp(Ops.WMMA, zero.dtype, (a, b, zero), f"DOT{g}")
  return _wrap(UOp(Ops.REDUCE, zero.dtype, (dot, *n.src[1:-1]), Ops.ADD) if len(n.src) > 2 else dot, n.dtype)   # linearized as acc = WMMA(a, b, acc)


def _is_lanes(v: UOp) -> bool:
  """Whether an expanded value is computed lane by lane (a VECTORIZE of k scalars; not a group load repeated across
  the lanes, a VECTORIZE of GEPs of one vector)."""
  return v.op is Ops.VECTORIZE and v.dtype.count > 1 and not (all(s.op is Ops.GEP for s in v.src) and len({s.src[0] for s in v.src}) == 1)


def _zero(v: UOp) -> bool:
  """A vector of integer zeros (a group dot's fresh accumulator)."""
  return v.op is Ops.VECTORIZE and all(s.op is Ops.CONST and s.arg == 0 for s in v.src)


def _absorb_add(add: UOp) -> UOp | None:
  """ADD(WMMA(a, b, 0), x) -> WMMA(a, b, x): a group dot added to a value takes it as its accumulator (one vpdpbusd
  instead of zeroing, the dot and an add)."""
  for i, w in enumerate(add.src):
    if w.op is Ops.WMMA and w.arg in ("DOT2", "DOT4") and _zero(w.src[2]) and w.dtype == (x := add.src[1 - i]).dtype:
      return w.replace(src=(w.src[0], w.src[1], x))
  return None


pm_absorb_add = PatternMatcher([(UPat(Ops.ADD, name="add"), _absorb_add)])


def vectorize(ast: UOp, vector_ops: frozenset[Ops] = DEFAULT_VECTOR_OPS, dots: Dots = NO_DOTS, f16: bool = False) -> UOp:
  """`ast` with its vector lane range (if any) turned into vector values (see the module docstring); `dots`: the
  renderer's integer dot products (WMMA "DOT2" / "DOT4"); `f16`: float16 loads may be vectors (`f16_vectors`)."""
  lanes = sorted((n for n in ast.toposort() if n.op is Ops.RANGE and len(n.arg) > 2 and n.arg[2] == "vector"), key=lambda r: r.arg[0])
  for lane in lanes:  # several lanes only in separate reduces (opt.py checks)
    ctx = _LaneCtx(lane, vector_ops, dots, f16)
    ctx.closers = {n for n in ast.toposort() if n.op is Ops.REDUCE and lane in n.src[1:]}  # lane-invariant results
    ctx.find_siblings(ast)
    ast = _expand_lane(ast, ctx)
  return graph_rewrite(ast, pm_absorb_add, name="dot accumulators") if lanes and dots else ast
