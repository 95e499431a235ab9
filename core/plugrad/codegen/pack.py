"""Operand packing for register-blocked matmul-like kernels on CPU targets (the PACK optimization).

A matmul tile reads the contiguous operand (B of A @ B) as a column panel: `P` consecutive columns (the vector lanes
times the tile's vector copies) of every row k. In B's own layout those `P` floats of row k and row k+1 are a whole
row apart (N floats), so the panel is spread over K lines of a power-of-two stride: it maps to a handful of cache sets
(4 KiB per L1 way, 128 KiB per L2 way on common parts) and is evicted long before the next row block of A reuses it.
PACK computes the operand once into a panel-major scratch buffer, `packed[.., n // P, k, n % P] = B[k, n]`, with a small
elementwise kernel that runs first; the matmul then reads each panel as one contiguous stream that stays in L2 for
every row block.

The operand may be an expression rather than a load (an activation, a normalization, a gradient's elementwise part
fused into the matmul): the kernel would evaluate it again for every output column block, the packing kernel evaluates
it once. The row operand (A) gets the same treatment along the tile's rows: `packed[.., m // R, k, m % R] = A[m, k]`, so the
R broadcasts of one k step read R consecutive floats instead of R rows a whole row apart.

`Opt("PACK", rid, P)` names the global range `rid` along which the reduce-loop load to pack moves (the vector-lane
range for B, the rows for A) and the panel width P.
`Opt("PACK", rid, P, arg=(chunks,))` packs and sums in that many chunks of the reduce range instead (`chunk_reduce`):
a packed copy bigger than the cache would otherwise go to DRAM and back.
It is not an AST rewrite like the other opts (it adds a kernel and a buffer): `split_packs(ast, opts)` returns the
main kernel reading the packed layout, the remaining opts, the packing kernels and how the main kernel's parameters map
to the original buffers and the scratch buffers. The scheduler (schedule/optimize.py) makes each packing kernel a
schedule item of its own before the main one, its scratch an intermediate buffer like any other.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from plugrad.codegen.facts import const_end, contiguous
from plugrad.codegen.optops import UPCASTS
from plugrad.dtype import DType, dtypes
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import pm_symbolic


@dataclass(frozen=True)
class PackKernel:
  """A packing kernel: parameter 0 is the scratch buffer (`size` elements of `dtype`), parameters 1.. the buffers in
  slots `srcs` of the main kernel's schedule item."""
  ast: UOp
  srcs: tuple[int, ...]
  size: int
  dtype: DType


@dataclass(frozen=True)
class PackPlan:
  """The main kernel after packing: `ast`, its remaining `opts`, the packing kernels, and for each parameter of `ast`
  where its buffer comes from: `slots[i] >= 0` is the schedule item's buffer of that slot, `-1 - j` the scratch of
  `packs[j]`. With `chunks` > 1 the packing kernels and `ast` cover one chunk of the reduce range and run `chunks`
  times in turn (pack, compute), the schedule item's buffer of slot s viewed `steps[s]` elements further each time, at
  most `sizes[s]` elements. `ast` stores the first chunk's sum; each later chunk runs `rest`, a plan of its own whose
  parameter of slot `sofar` (past the item's buffers) is the sum so far, stored by the chunk before into another
  buffer (see `chunk_reduce`). The scratch is one chunk's, written again by each."""
  ast: UOp
  opts: list
  packs: list[PackKernel]
  slots: list[int]
  chunks: int = 1
  steps: dict[int, int] = field(default_factory=dict)
  sizes: dict[int, int] = field(default_factory=dict)
  rest: PackPlan | None = None
  sofar: int = -1


class Chunked(NamedTuple):
  """A sum split into chunks of its reduce range (`chunk_reduce`): the kernels of the first and the later chunks, each
  moving parameter's step and view size, and the slot of `rest`'s sum-so-far parameter."""
  first: UOp
  rest: UOp
  steps: dict[int, int]
  sizes: dict[int, int]
  sofar: int




def _ranges(x: UOp) -> list[UOp]: return sorted((n for n in x.toposort() if n.op is Ops.RANGE), key=lambda r: r.arg[0])


TILE = 8  # rows of a packing kernel's transpose tile (a TILE x P block per panel; 4, 16, 32 measured no better)


def _mul_operands(ast: UOp) -> list[UOp]:
  """The operands of the products that REDUCEs sum (through CASTs and sums of products, as in a gradient flowing
  through two matmuls): a matmul's A and B values, loads or expressions."""
  out: list[UOp] = []
  def walk(x: UOp) -> None:
    while x.op is Ops.CAST: x = x.src[0]
    if x.op is Ops.ADD:
      for s in x.src: walk(s)
    elif x.op is Ops.MUL: out.extend(o for o in x.src if o not in out)
  for red in (x for x in ast.toposort() if x.op is Ops.REDUCE and x.arg is Ops.ADD): walk(red.src[0])
  return out


def pack_candidate(ast: UOp, n: UOp, P: int, rows: list[UOp], skip: int | None = None, pad: bool = False) -> UOp | None:
  """The operand of a reduce's product that PACK of global range `n` by `P` materializes in the packed layout: a
  value (a load, or an elementwise expression of loads the kernel would otherwise recompute for every output column)
  moving with `n` and a reduce range, independent of the `rows` ranges (the other axes of the register tile), with no
  reduce inside, over ranges of constant size (None when there is none). Any layout along `n` packs (a transposed
  operand becomes contiguous). Operands reading a parameter numbered `skip` or above (scratch buffers already packed)
  are left alone. P must divide the range's size, unless `pad` (the last panel is then padded, `_pack_one`)."""
  if (size := const_end(n)) is None or (size % P and not pad): return None
  red_rngs = {r for x in ast.toposort() if x.op is Ops.REDUCE for r in x.src[1:]}
  for x in _mul_operands(ast):
    topo = x.toposort()
    if any(t.op in (Ops.REDUCE, Ops.DEFINE_VAR, Ops.DEFINE_REG, Ops.DEFINE_LOCAL) for t in topo): continue
    if not any(t.op is Ops.LOAD for t in topo): continue
    if skip is not None and any(t.op is Ops.DEFINE_GLOBAL and t.arg >= skip for t in topo): continue
    rs = _ranges(x)
    if n not in rs or not any(r in red_rngs for r in rs) or any(r in rs for r in rows): continue
    if any(const_end(r) is None for r in rs): continue
    return x
  return None


def _pack_one(ast: UOp, val: UOp, n: UOp, P: int, scratch_slot: int) -> tuple[UOp, PackKernel]:
  """The main AST reading the operand `val` from the packed scratch (parameter `scratch_slot`) and the kernel that
  computes it into that layout."""
  rs = _ranges(val)
  red = [r for r in rs if r.arg[1] != "global"]
  other = [r for r in rs if r.arg[1] == "global" and r is not n]
  nsize = const_end(n)
  panels = -(-nsize // P)   # a size P doesn't divide: the last panel is padded (the kernel never reads past nsize)
  # packed layout: [other global ranges..., n // P, reduce ranges..., n % P]
  def layout(p: UOp, j: UOp, sub: dict[UOp, UOp]) -> UOp:
    out: UOp = UOp.const(dtypes.index, 0)
    for r in other: out = out * const_end(r) + sub.get(r, r)
    out = out * panels + p
    for r in red: out = out * const_end(r) + sub.get(r, r)
    return out * P + j
  total = P * panels
  for r in other + red: total *= const_end(r)
  g = UOp(Ops.DEFINE_GLOBAL, val.dtype.ptr(size=total), (), scratch_slot)
  new_ast = ast.substitute({val: UOp(Ops.LOAD, val.dtype, (UOp(Ops.INDEX, g.dtype, (g, layout(n // P, n % P, {}))),))}, walk=True)
  new_ast = graph_rewrite(new_ast, pm_symbolic, name="pack main index")
  # the packing kernel: one global range per layout axis (the first one is split across cores), in layout order. When
  # the operand is contiguous along `n` (a row-major B, an A.T) that order reads P floats per row, a row apart (often
  # a page apart: no hardware prefetch), so it is tiled like a transpose instead: TILE rows of the innermost reduce
  # axis at a time, each panel's TILE x P block written whole, the rows read in order.
  # The buffers the operand reads become its parameters 1.. (0 is the scratch).
  def rng(i: int, size: int) -> UOp: return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, size),), (i, "global"))
  contig = any(contiguous(x.src[0].src[1], n) for x in val.toposort() if x.op is Ops.LOAD and x.src[0].op is Ops.INDEX)
  if contig and red and (last := const_end(red[-1])) % TILE == 0 and last > TILE:
    order = [*other, *red[:-1], "ro", "p", "ri", "j"]
    pk_rngs = {r: rng(order.index(r), const_end(r)) for r in other + red[:-1]}
    pk_rngs[red[-1]] = rng(order.index("ro"), last // TILE) * TILE + rng(order.index("ri"), TILE)
  else:
    order = [*other, "p", *red, "j"]
    pk_rngs = {r: rng(order.index(r), const_end(r)) for r in other + red}
  p, j = rng(order.index("p"), panels), rng(order.index("j"), P)
  src_n = p * P + j if nsize % P == 0 else (p * P + j < nsize).where(p * P + j, nsize - 1)  # padding repeats the last row
  srcs = sorted({t for t in val.toposort() if t.op is Ops.DEFINE_GLOBAL}, key=lambda t: t.arg)
  # two steps (to negative placeholders, then to 1..) so a parameter renumbered onto another's old number stays distinct
  tmp = {t: t.replace(arg=-1 - i) for i, t in enumerate(srcs)}
  body = val.substitute({**pk_rngs, n: src_n, **tmp}, walk=True)
  body = body.substitute({t.replace(arg=-1 - i): t.replace(arg=1 + i) for i, t in enumerate(srcs)}, walk=True)
  dst = UOp(Ops.DEFINE_GLOBAL, g.dtype, (), 0)
  st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, dst.dtype, (dst, layout(p, j, pk_rngs))), body))
  pack_ast = graph_rewrite(UOp(Ops.SINK, dtypes.void, (st,)), pm_symbolic, name="pack kernel")
  return new_ast, PackKernel(pack_ast, tuple(t.arg for t in srcs), total, val.dtype)


def affine_step(idx: UOp, n: UOp) -> int | None:
  """`c` when index `idx` is `n * c` plus terms that don't read `n` (None otherwise: `n` divided, taken modulo,
  compared, or in a gather's index)."""
  if idx is n: return 1
  if idx.op is Ops.MUL and n in idx.src and (c := next((s for s in idx.src if s is not n), None)) is not None and c.op is Ops.CONST:
    return int(c.arg)
  if idx.op is Ops.ADD:
    moving = [s for s in idx.src if n in s.toposort()]
    return affine_step(moving[0], n) if len(moving) == 1 else None
  return None


def chunk_reduce(ast: UOp, chunks: int) -> Chunked | None:
  """`ast`, a sum over one reduce range stored as it is, split into `chunks` equal chunks of that range run one after
  another. `first` stores the first chunk's sum; `rest` stores a chunk's sum plus the sum so far, read from a parameter
  of its own (slot `sofar`, numbered after the others: a buffer other than the output, so a row tile that computes
  some outputs twice stays right). Every chunk runs the same kernel with each parameter that moves
  with the range viewed `steps[p]` elements further a chunk (`sizes[p]` elements long). None when that isn't so: more
  than one reduce range, a store of anything but the sum (an epilogue must see the whole sum), or a use of the range
  other than a load index moving `c` elements per step (a gate, a division, a value computed from the position)."""
  stores = [x for x in ast.src if x.op is Ops.STORE]
  if not stores or len(stores) != len(ast.src) or any(st.src[1].op is not Ops.REDUCE or st.src[1].arg is not Ops.ADD for st in stores): return None
  rngs = {r for st in stores for r in st.src[1].src[1:]}
  if len(rngs) != 1 or (size := const_end(rng := rngs.pop())) is None or size % chunks: return None
  steps: dict[int, int] = {}
  zeroed: dict[UOp, UOp] = {}   # each index moving with it, with the range taken as 0: nothing else may read it
  indexes = [x for x in ast.toposort() if x.op is Ops.INDEX and x.src[0].op is Ops.DEFINE_GLOBAL]
  for x in indexes:
    if rng not in x.toposort(): continue
    if len(x.src) != 2 or (c := affine_step(x.src[1], rng)) is None or steps.setdefault(x.src[0].arg, c) != c: return None
    zeroed[x] = x.replace(src=(x.src[0], x.src[1].substitute({rng: UOp.const(dtypes.index, 0)})))
  if not steps or any(rng in x.src[1].src[0].toposort() for x in ast.substitute(zeroed).src): return None
  if any(x.src[0].arg in steps and x not in zeroed for x in indexes): return None  # a viewed buffer also read in place
  kc = size // chunks
  first = ast.substitute({rng: rng.replace(src=(UOp.const(dtypes.index, kc),))}, walk=True)
  globs = {g.arg: g for g in first.toposort() if g.op is Ops.DEFINE_GLOBAL}
  steps = {a: c * kc for a, c in steps.items()}
  sizes = {a: globs[a].dtype.size - s * (chunks - 1) for a, s in steps.items()}
  if any(v <= 0 for v in sizes.values()): return None
  first = first.substitute({globs[a]: globs[a].replace(dtype=globs[a].dtype.base.ptr(size=sizes[a])) for a in steps}, walk=True)
  prev = UOp(Ops.DEFINE_GLOBAL, globs[0].dtype, (), max(globs) + 1)
  def acc(st: UOp) -> UOp:
    sofar = UOp(Ops.LOAD, st.src[1].dtype, (st.src[0].replace(src=(prev, *st.src[0].src[1:])),))
    return st.replace(src=(st.src[0], UOp(Ops.ADD, st.src[1].dtype, (sofar, st.src[1]))))
  rest = first.replace(src=tuple(acc(st) for st in first.src))
  return Chunked(first, rest, steps, sizes, prev.arg)


def split_packs(ast: UOp, opts: list) -> PackPlan:
  """Apply the PACK opts of `opts` (see the module docstring); the other opts are returned unchanged. A PACK with
  `arg=(chunks,)` splits the reduce range into that many chunks first (`chunk_reduce`): packed and summed chunk by
  chunk, each chunk's packed operand stays in cache for the kernel that reads it instead of a round trip through DRAM,
  and it is read from consecutive rows of the operand (whole rows of a row-major B)."""
  packs = [o for o in opts if o.kind == "PACK"]
  rest = [o for o in opts if o.kind != "PACK"]
  if not packs: return PackPlan(ast, rest, [], [g.arg for g in _globals(ast)])
  if (chunked := [o for o in packs if o.arg and o.arg[0] > 1]):
    if len(chunked) != 1 or (cc := chunk_reduce(ast, chunked[0].arg[0])) is None:
      raise ValueError(f"{chunked[0]}: the kernel can't sum its reduce range chunk by chunk")
    unchunked = [replace(o, arg=()) for o in packs] + rest
    plan, rest_plan = (split_packs(a, unchunked) for a in (cc.first, cc.rest))
    return replace(plan, chunks=chunked[0].arg[0], steps=cc.steps, sizes=cc.sizes, rest=rest_plan, sofar=cc.sofar)
  nslots = max(g.arg for g in _globals(ast)) + 1
  kernels: list[PackKernel] = []
  for o in packs:
    rngs = {r.arg[0]: r for r in ast.toposort() if r.op is Ops.RANGE}
    if (n := rngs.get(o.rid)) is None or n.arg[1] != "global": raise ValueError(f"{o}: PACK needs a global range")
    rows = [rngs[u.rid] for u in rest if u.kind in UPCASTS and u.rid != o.rid and u.rid in rngs]
    # the operand that doesn't move with the tile's other axes; else any operand moving with range rid (packing any
    # of them keeps the kernel's values: only the layout an operand is read from changes)
    if (val := pack_candidate(ast, n, o.amount, rows, nslots, pad=True) or pack_candidate(ast, n, o.amount, [], nslots, pad=True)) is None:
      raise ValueError(f"{o}: no reduce-loop operand to pack along range {o.rid}")
    ast, pk = _pack_one(ast, val, n, o.amount, nslots + len(kernels))
    kernels.append(pk)
  # parameters renumbered 0..m-1 in slot order (a buffer read only through the packed load is no longer one)
  gl = _globals(ast)
  ren = {g: g.replace(arg=i) for i, g in enumerate(gl) if g.arg != i}
  slots = [g.arg if g.arg < nslots else -1 - (g.arg - nslots) for g in gl]
  return PackPlan(ast.substitute(ren, walk=True) if ren else ast, rest, kernels, slots)


def _globals(ast: UOp) -> list[UOp]:
  return sorted({n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL}, key=lambda n: n.arg)
