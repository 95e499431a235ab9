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
"""
from __future__ import annotations

import functools

from plugrad.codegen.facts import NO_DOTS, Dots, dot4_factors, fits, fits16, group_dot_range, group_lane, lane_pattern
from plugrad.codegen.expand import pm_opt_symbolic
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


class _Expander:
  def __init__(self, lane: UOp, vector_ops: frozenset[Ops], dots: Dots = NO_DOTS, f16: bool = False):
    self.lane, self.k, self.vops, self.dots, self.f16 = lane, lane.src[0].arg, vector_ops, dots, f16
    self.consts = [UOp.const(dtypes.index, i) for i in range(self.k)]
    self.memo: dict[UOp, UOp | Lanes] = {}
    self.subs: dict[tuple[UOp, int], UOp] = {}
    self.patterns: dict[UOp, tuple[str, UOp]] = {}
    self.dep: dict[UOp, bool] = {lane: True}
    self.closers: set[UOp] = set()

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

  def vec_dtype_ok(self, dt: DType) -> bool: return dt.scalar() not in _NO_VECTOR_DTYPES and dt.count == 1
  def vec_load_ok(self, dt: DType) -> bool: return self.vec_dtype_ok(dt) or (self.f16 and dt == dtypes.float16)

  # ----- conversions between the three forms: scalar (lane-invariant), vector UOp, Lanes
  def vec(self, x: UOp | Lanes, dt: DType) -> UOp:
    if isinstance(x, tuple): return UOp(Ops.VECTORIZE, dt.vec(self.k), x)
    if x.dtype.count == self.k and x.dtype.count > 1: return x
    return UOp(Ops.VECTORIZE, dt.vec(self.k), (x,) * self.k)

  def gep(self, x: UOp | Lanes, i: int) -> UOp:
    if isinstance(x, tuple): return x[i]
    if x.dtype.count > 1: return x.src[i] if x.op is Ops.VECTORIZE else UOp(Ops.GEP, x.dtype.scalar(), (x,), (i,))
    return x

  # ----- expansion
  def ex(self, n: UOp) -> UOp | Lanes:
    if not self.depends(n): return n
    if (r := self.memo.get(n)) is not None: return r
    r = self.memo[n] = self._ex(n)
    return r

  def _ex(self, n: UOp) -> UOp | Lanes:
    if n.dtype.scalar() == dtypes.index or n.op not in GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.LOAD, Ops.REDUCE}:
      return tuple(self.at(n, i) for i in range(self.k))
    if n.op is Ops.LOAD: return self.load(n)
    if n.op is Ops.REDUCE: return self.reduce(n)
    if n.op is Ops.CAST and n.dtype.count == 1 and dtypes.is_float(n.dtype) and n.src[0].dtype in (dtypes.uint8, dtypes.uint16) \
       and n.src[0].op in _WIDEN_OPS:  # unpacking bits of bytes: the same values computed in int32 lanes (no byte shifts on x86)
      return self.ex(UOp(Ops.CAST, n.dtype, (_widen(n.src[0]),)))
    srcs = [self.ex(s) for s in n.src]
    if n.op is Ops.CAST and n.dtype == dtypes.float32 and n.src[0].dtype == dtypes.float16 and not isinstance(srcs[0], tuple) \
       and srcs[0].dtype.count == self.k:   # a float16 vector load (f16_vectors) converted as a whole
      return UOp(Ops.CAST, n.dtype.vec(self.k), (srcs[0],))
    if n.op in self.vops and self.vec_dtype_ok(n.dtype) and all(self.vec_dtype_ok(s.dtype) for s in n.src):
      return UOp(n.op, n.dtype.vec(self.k), tuple(self.vec(s, o.dtype) for s, o in zip(srcs, n.src)), n.arg)
    return tuple(UOp(n.op, n.dtype, tuple(self.gep(s, i) for s in srcs), n.arg) for i in range(self.k))

  def pattern(self, idx: UOp) -> tuple[str, UOp]:
    """("broadcast" | "contiguous" | "gather", the index of lane 0)."""
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

  def load(self, n: UOp) -> UOp | Lanes:
    ix = n.src[0]
    if len(n.src) == 1 and ix.op is Ops.INDEX and (gate := self.uniform_gate(ix)) is not None:
      kind, base = self.pattern(ix.src[1])
      if kind == "broadcast": return UOp(Ops.LOAD, n.dtype, (ix.replace(src=(ix.src[0], base, *gate)),))
      if kind == "contiguous" and self.vec_load_ok(n.dtype): return UOp(Ops.LOAD, n.dtype.vec(self.k), (ix.replace(src=(ix.src[0], base, *gate)),))
      if kind.startswith("tile") and self.vec_dtype_ok(n.dtype):   # one load of the group, repeated across the lanes
        g = int(kind[4:])
        v = UOp(Ops.LOAD, n.dtype.vec(g), (ix.replace(src=(ix.src[0], base, *gate)),))
        return UOp(Ops.VECTORIZE, n.dtype.vec(self.k), tuple(UOp(Ops.GEP, n.dtype, (v,), (i % g,)) for i in range(self.k)))
    return tuple(self.at(n, i) for i in range(self.k))

  def reduce(self, n: UOp) -> UOp | Lanes:
    x, rngs = self.ex(n.src[0]), n.src[1:]
    other = tuple(r for r in rngs if r is not self.lane)
    vector = n.arg in (Ops.ADD, Ops.MUL, Ops.MAX) and n.arg in self.vops and self.vec_dtype_ok(n.dtype)
    if self.lane not in rngs:
      if self.dots and (d := self.group_dot(n)) is not None: return d
      if vector: return UOp(Ops.REDUCE, n.dtype.vec(self.k), (self.vec(x, n.dtype), *rngs), n.arg)
      return tuple(UOp(Ops.REDUCE, n.dtype, (self.gep(x, i), *rngs), n.arg) for i in range(self.k))
    if (acc := self.reduce_vector(n)) is not None: return _horizontal(acc, n.arg)
    parts = [UOp(Ops.REDUCE, n.dtype, (self.gep(x, i), *other), n.arg) if other else self.gep(x, i) for i in range(self.k)]
    return functools.reduce(lambda a, b: UOp(n.arg, n.dtype, (a, b)), parts)

  def group_dot(self, n: UOp) -> UOp | None:
    """REDUCE(a*b, ..., p) as WMMA(a, b, acc, "DOT2" | "DOT4") on gk lanes of the group's types (module docstring),
    None where it doesn't fit."""
    if (p := group_dot_range(n, self.dots)) is None: return None
    g = p.src[0].arg
    wide = group_lane(self.lane, g)
    sub = {self.lane: wide // UOp.const(dtypes.index, g), p: wide % UOp.const(dtypes.index, g)}
    facs, dts = (n.src[0].src, (dtypes.int16, dtypes.int16)) if g == 2 else (dot4_factors(n.src[0], self.dots.quad), (dtypes.uint8, dtypes.int8))
    narrow = [graph_rewrite(s.substitute(sub, walk=True), pm_opt_symbolic, name="group lanes") for s in facs]  # type: ignore[union-attr]
    ops = [_narrow16(o) if g == 2 else _narrow8(o, dt) for o, dt in zip(narrow, dts)]
    if any(o is None or any(x.op is Ops.REDUCE for x in o.toposort()) for o in ops): return None
    ex = _Expander(wide, self.vops)
    vs = [ex.ex(o) for o in ops]  # type: ignore[arg-type]
    if any(isinstance(v, tuple) for v in vs) or all(v.dtype.count == 1 for v in vs): return None  # lane by lane: no gain
    a, b = (ex.vec(v, dt) for v, dt in zip(vs, dts))
    zero = self.vec(UOp.const(dtypes.int32, 0), dtypes.int32)
    dot = UOp(Ops.WMMA, zero.dtype, (a, b, zero), f"DOT{g}")
    return UOp(Ops.REDUCE, zero.dtype, (dot, *n.src[1:-1]), Ops.ADD) if len(n.src) > 2 else dot   # linearized as acc = WMMA(a, b, acc)

  def reduce_vector(self, n: UOp) -> UOp | None:
    """The vector accumulator of a REDUCE over the lane range (lane i holds lane i's partial result), also for an
    ADD/MUL tree of such REDUCEs with the same op (SPLIT's accumulators are combined before the horizontal step).
    None where the reduce isn't done on vectors."""
    if n.op in (Ops.ADD, Ops.MUL, Ops.MAX) and n not in self.closers:
      parts = [self.reduce_vector(s) if s.op is Ops.REDUCE and s.arg is n.op or s.op is n.op else None for s in n.src]
      return UOp(n.op, n.dtype.vec(self.k), tuple(parts)) if all(p is not None for p in parts) else None  # type: ignore[arg-type]
    if n not in self.closers or n.arg not in (Ops.ADD, Ops.MUL, Ops.MAX) or n.arg not in self.vops or not self.vec_dtype_ok(n.dtype): return None
    x, other = self.ex(n.src[0]), tuple(r for r in n.src[1:] if r is not self.lane)
    return UOp(Ops.REDUCE, n.dtype.vec(self.k), (self.vec(x, n.dtype), *other), n.arg) if other else self.vec(x, n.dtype)

  def store(self, st: UOp) -> list[UOp]:
    if not self.depends(st): return [st]
    ix, val = st.src[0], st.src[1]
    v = self.ex(val)
    if ix.op is Ops.INDEX and len(st.src) == 2 and (gate := self.uniform_gate(ix)) is not None:
      kind, base = self.pattern(ix.src[1])
      nix = ix.replace(src=(ix.src[0], base, *gate))
      if kind == "broadcast": return [st.replace(src=(nix, self.gep(v, self.k - 1)))]  # the last lane's write wins, as in the loop
      if kind == "contiguous" and self.vec_dtype_ok(val.dtype): return [st.replace(src=(nix, self.vec(v, val.dtype)))]
    return [st.replace(src=(self.at(ix, i), self.gep(v, i), *st.src[2:])) for i in range(self.k)]


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
  for lane in lanes: ast = _vectorize_lane(ast, lane, vector_ops, dots, f16)  # several lanes only in separate reduces (opt.py checks)
  return graph_rewrite(ast, pm_absorb_add, name="dot accumulators") if lanes and dots else ast


def _vectorize_lane(ast: UOp, lane: UOp, vector_ops: frozenset[Ops], dots: Dots, f16: bool) -> UOp:
  ex = _Expander(lane, vector_ops, dots, f16)
  ex.closers = {n for n in ast.toposort() if n.op is Ops.REDUCE and lane in n.src[1:]}  # lane-invariant results
  if lane.arg[1] == "reduce":  # the outermost ADD/MUL trees of vector accumulators first (substitute is pre-order)
    trees = {n: _horizontal(v, n.op) for n in ast.toposort() if n.op in (Ops.ADD, Ops.MUL, Ops.MAX) and (v := ex.reduce_vector(n)) is not None}
    return ast.substitute({**{c: ex.reduce(c) for c in ex.closers}, **trees}, walk=True)
  return UOp(Ops.SINK, dtypes.void, tuple(functools.reduce(lambda a, st: a + ex.store(st), ast.src, [])))
