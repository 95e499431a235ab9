"""The scheduler: split a lazy tensor graph into kernels and build each kernel's AST.

Everything fuses by default: a kernel computes its output by indexing straight through elementwise and movement
ops and into reductions (see indexing.py). A node is realized into its own buffer (ends a kernel) only when it
must be: a tensor being realized, CONTIGUOUS, COPY, ASSIGN, and a REDUCE_AXIS whose result is broadcast by an
EXPAND (inlining it there would recompute the reduction once per broadcast element) -- except, on GPU renderers with
shared memory, a reduction broadcast back over its own trailing axis into consumers that keep the row (softmax,
log_softmax): one workgroup per row reduces and writes it (`_row_kernel`); and, on renderers with `pad_windows`
(CPU), a convolution's zero-padded input, written padded once so its taps load without bounds tests (`padded_windows`).
"""
from __future__ import annotations

from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.errors import TensorError
from plugrad.schedule.indexing import TRUE, KernelContext, pm_index, same_size
from plugrad.schedule.item import ScheduleItem, base_size, range_view
from plugrad.schedule.optimize import optimize_items
from plugrad.uop.buffers import buffer_of, contiguous_range, is_buffer_view, new_buffer
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.helpers import getenv
from plugrad.uop.rewrite import graph_rewrite, graph_rewrite_map, pm_substitute
from plugrad.uop.upat import PatternMatcher, UPat
from plugrad.uop.shape import device_of
from plugrad.uop.symbolic import pm_symbolic, prod, sint, ssimplify
from plugrad.viz import capture

def is_storage(device: str) -> bool:
  """True for devices that hold buffers but run no kernels (DISK): everything on them must become a copy."""
  return bool(getattr(Device[device], "storage", False))


ROW_MIN, ROW_MAX = 64, 4096  # row lengths a GPU workgroup reduces and then writes in one kernel


def _row_kernel(expand: UOp, red: UOp, users: dict[UOp, list[UOp]], realize: set[UOp]) -> bool:
  """Whether reduction `red`, broadcast back over its own reduced axis by `expand` (softmax's max and sum, layernorm's
  mean and variance), stays in the kernel that consumes it: on GPU renderers with shared memory (`has_shared`,
  `local_max_threads`) one workgroup per row reduces the row across its threads and writes the row's outputs from
  the same registers, so the row is read once (codegen/gpuopt.py: GROUP, GROUPOUT). Only a trailing (contiguous)
  reduced axis of a constant length in [ROW_MIN, ROW_MAX], and only when everything between the broadcast and the
  kernel's output keeps the row: elementwise ops and further reductions over the same axis (another reduction, or a
  movement op, would run the row's reduction inside its own loop)."""
  shape, axes = red.src[0].shape, tuple(red.arg[1])
  if len(axes) != 1 or expand.shape != shape or axes != (len(shape) - 1,): return False
  if any(a != b and d not in axes for d, (a, b) in enumerate(zip(expand.src[0].shape, shape))): return False
  if not isinstance(shape[-1], int) or not ROW_MIN <= shape[-1] <= ROW_MAX: return False
  if not isinstance(dev := device_of(red), str): return False  # (multi-device graphs are split per device before this)
  caps = Device[dev].renderer.caps
  if not (caps.has_shared and caps.local_max_threads): return False
  # the row's elements must be cheap: a reduction inside them (attention's scores) would be recomputed per row element
  inner = red.src[0].toposort(gate=lambda y: y is red.src[0] or (y not in realize and y.op is not Ops.REDUCE_AXIS and not is_buffer_view(y)))
  if any(x.op is Ops.REDUCE_AXIS and x not in realize and (tuple(x.arg[1]) != axes or x.src[0].shape != shape) for x in inner): return False
  todo, seen = list(users.get(expand, [])), set()
  while todo:
    u = todo.pop()
    if u in seen: continue
    seen.add(u)
    if u.op is Ops.REDUCE_AXIS: ok = tuple(u.arg[1]) == axes and u.src[0].shape == shape
    elif u.op is Ops.EXPAND: ok = u.shape == shape
    else: ok = u.op in GroupOp.ALU or u.op in (Ops.CAST, Ops.DETACH, Ops.CONTIGUOUS)
    if not ok: return False
    if u not in realize: todo.extend(users.get(u, []))
  return True


def _storage_error(device: str, what: str) -> RuntimeError:
  return RuntimeError(f"{device} is a storage device and can't {what}; it only copies contiguous byte ranges. "
                      f"Move the data to a compute device first, e.g. t.to('CPU'), and compute there")


def _storage_assign_source(n: UOp) -> UOp | None:
  """For an ASSIGN into a storage device: the data to copy into the target's range (the value, or the source of its COPY)."""
  if n.op is not Ops.ASSIGN or not is_storage(device_of(n.src[0])): return None
  return n.src[1].src[0] if n.src[1].op is Ops.COPY else n.src[1]


def _must_realize(nodes: list[UOp], targets: list[UOp]) -> set[UOp]:
  realize = {t for t in targets if not is_buffer_view(t) and not (t.op is Ops.AFTER and is_buffer_view(t.src[0]))}
  skip: set[UOp] = set()  # COPYs into storage that an ASSIGN performs itself
  for n in nodes:
    if n.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN): realize.add(n)
    if n.op is Ops.COPY and not is_buffer_view(n.src[0]): realize.add(n.src[0])
    if n.op is Ops.COPY and is_storage(n.src[1].arg) and contiguous_range(n.src[0])[2] is not n.src[0]:
      realize.add(n.src[0])  # a storage device can't rearrange: make the data contiguous where it is
    if (v := _storage_assign_source(n)) is not None:
      if n.src[1].op is Ops.COPY: skip.add(n.src[1])
      if not is_buffer_view(v) or contiguous_range(v)[2] is not v: realize.add(v)
  users: dict[UOp, list[UOp]] = {}
  for n in nodes:
    for x in n.src: users.setdefault(x, []).append(n)
  realize = _expensive_broadcasts(nodes, realize, users) | padded_windows(nodes, realize)
  for n in nodes:
    if n.op is Ops.EXPAND:  # reductions broadcast by this expand must be computed once, into a buffer
      # (not through nodes realized anyway: a contiguous() after a matmul keeps the matmul's epilogue in its kernel)
      for x in n.src[0].toposort(gate=lambda y: y.op is not Ops.REDUCE_AXIS and y not in realize and not is_buffer_view(y)):
        if x.op is Ops.REDUCE_AXIS and not _row_kernel(n, x, users, realize): realize.add(x)
  return _shared_reduces(realize) - skip


# padded windows written first (padded_windows): at least PAD_MIN elements, PAD_GROWTH[0] to PAD_GROWTH[1] times the source
PAD_MIN, PAD_GROWTH = 4096, (1.05, 4.0)


def _pad_in_chain(u: UOp) -> UOp | None:
  """The first PAD down u's chain of movement ops, if its shapes are constant and it grows its source by a factor in
  PAD_GROWTH."""
  while u.op in GroupOp.Movement and u.op is not Ops.PAD: u = u.src[0]
  if u.op is not Ops.PAD or not all(isinstance(d, int) for d in (*u.shape, *u.src[0].shape)): return None
  n, src = prod(u.shape), prod(u.src[0].shape)
  return u if n >= PAD_MIN and PAD_GROWTH[0] * src <= n <= PAD_GROWTH[1] * src else None


def padded_windows(nodes: list[UOp], realize: set[UOp]) -> set[UOp]:
  """PAD views that a reduction reads through a broadcast (a convolution's zero-padded input, seen as windows and
  broadcast over the output channels), on renderers with `pad_windows`: written once into a buffer, so the kernel's
  inner loop loads every tap without testing it against the borders. Each padded element is read many times there
  (once per output channel tile and tap). Measured on the CPU (1 thread, batch 32, 3x3): 28x28 inputs gain 7-10% and
  14x14 12-22% in all three passes; 56x56 (a border of 7% of the loads) 30-45% forward and in the input gradient
  (stride 2 forward 43 -> 27 ms), the weight gradient unchanged. Hence PAD_GROWTH: borders of 5% of the input or more."""
  out: set[UOp] = set()
  for r in nodes:
    if r.op is not Ops.REDUCE_AXIS or not isinstance(dev := device_of(r), str): continue
    if not Device[dev].renderer.caps.pad_windows: continue
    region = r.src[0].toposort(gate=lambda y: y is r.src[0] or (y not in realize and y.op is not Ops.REDUCE_AXIS))
    for e in region:
      if e.op is Ops.EXPAND and (p := _pad_in_chain(e.src[0])) is not None: out.add(p)
  return out


def _pad_chains(nodes: list[UOp], realize: set[UOp]) -> set[UOp]:
  """The movement nodes between the graph's buffer views (the top of each view chain, in `nodes`) and the PADs of
  them in `realize`: the schedule must walk into those chains to write the PADs."""
  above: set[UOp] = set()
  for n in nodes:
    if n.op in GroupOp.Movement and is_buffer_view(n):
      u, chain = n, []
      while u.op in GroupOp.Movement and u not in realize: chain.append(u); u = u.src[0]
      if u in realize: above.update(chain)
  return above


_EXPENSIVE = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.FDIV, Ops.IDIV, Ops.MOD}


def _expensive_broadcasts(nodes: list[UOp], realize: set[UOp], users: dict[UOp, list[UOp]]) -> set[UOp]:
  """`realize` plus the sources of broadcasts that a reduction reads, when they compute something expensive (e.g. the
  activation between two matmuls, `(x @ w1).silu() @ w2`): fused, it would be recomputed once per output column.
  Not a per-row value broadcast back over its row in a GPU row kernel (layernorm's mean: `_row_kernel`), which one
  workgroup computes once per row."""
  def below(u: UOp, stop: tuple = ()) -> dict[UOp, None]:
    return u.toposort(gate=lambda y: y is u or (y not in realize and y.op is not Ops.REDUCE_AXIS and y.op not in stop and not is_buffer_view(y)))
  out = set(realize)
  for r in nodes:
    if r.op is not Ops.REDUCE_AXIS: continue
    for e in below(r.src[0], stop=(Ops.EXPAND,)):   # the operands' broadcasts (not broadcasts nested inside them)
      if e.op is not Ops.EXPAND or e in realize: continue
      src = e.src[0]
      while src.op in GroupOp.Movement and src not in realize and not is_buffer_view(src): src = src.src[0]
      if src in realize or is_buffer_view(src) or src.op is Ops.REDUCE_AXIS: continue
      # only ops at src's full size count: a per-row scale like rms_norm's rsqrt is broadcast inside src and cheap
      if any(x.op in _EXPENSIVE and same_size(prod(x.shape), prod(src.shape)) for x in below(src)):
        if not any(x.op is Ops.REDUCE_AXIS and _row_kernel(e, x, users, out) for x in below(src)): out.add(src)
  return out


SHARED_WIDE_INPUTS = 4  # an elementwise node two kernels share is written once when it reads this many buffers


def _shared_reduces(realize: set[UOp]) -> set[UOp]:
  """`realize` plus every reduction that two kernels would otherwise both recompute (e.g. attention scores read by
  the softmax's max, sum and normalize kernels), until no kernel shares one; and every wide elementwise node (one
  reading SHARED_WIDE_INPUTS or more buffers) that two kernels share, outermost first (e.g. the gradient of a residual
  stream: a sum of every later layer's terms, which each consumer would otherwise recompute from all of them)."""
  while True:
    owner: dict[UOp, UOp] = {}
    shared: set[UOp] = set()
    wide: dict[UOp, None] = {}   # (insertion-ordered set)
    expands: list[UOp] = []
    for root in realize:
      if root.op is Ops.COPY: continue
      for x in _kernel_nodes(root, realize):
        if x.op is Ops.EXPAND: expands.append(x)
        if x in realize or owner.setdefault(x, root) is root: continue
        if x.op is Ops.REDUCE_AXIS: shared.add(x)
        elif x.op in GroupOp.ALU: wide.setdefault(x)
    if not shared and wide: shared = _outermost_wide(list(wide), realize, _broadcast_read(expands, realize))
    if not shared: return realize
    realize = realize | _outermost(shared, realize)


def _outermost(shared: set[UOp], realize: set[UOp]) -> set[UOp]:
  """The shared nodes no other shared node computes: realized, each is one kernel that computes the nodes inside it
  once, so those are no longer shared (a batched decode step's value projection, read by one cache write per slot:
  realizing its integer block dots as well made it two kernels, the dots' int32 partials written and read back, 6.6
  against 3.8 us for the same-sized key projection). A node still shared afterwards (attention's scores under the
  softmax's max, also read by its sum) is realized by the next round."""
  inner = {x for y in shared for x in _kernel_nodes(y, realize) if x is not y}
  return {y for y in shared if y not in inner}


def _kernel_nodes(root: UOp, realize: set[UOp]) -> dict[UOp, None]:
  """The nodes the kernel of `root` computes or reads: its graph down to realized nodes and buffers."""
  return root.toposort(gate=lambda y: y is root or (y not in realize and not is_buffer_view(y)))


def _broadcast_read(expands: list[UOp], realize: set[UOp]) -> set[UOp]:
  """The unrealized nodes under the broadcasts `expands` (down to buffers, realized nodes and reductions): a kernel
  reading one evaluates it once per broadcast copy (a query rotated by RoPE, read once per key by the scores)."""
  out: set[UOp] = set()
  stack = [e.src[0] for e in expands]
  while stack:
    n = stack.pop()
    if n in out or n in realize or is_buffer_view(n) or n.op is Ops.REDUCE_AXIS: continue
    out.add(n)
    stack.extend(n.src)
  return out


def _smaller(y: UOp, n: sint) -> bool:
  """Whether the data behind `y` (a realized node, or a view of a buffer) is provably fewer than `n` elements."""
  size = base_size(buffer_of(y)) if is_buffer_view(y) else prod(y.shape)
  return isinstance(size, int) and isinstance(n, int) and size < n


def _outermost_wide(cands: list[UOp], realize: set[UOp], broadcast: set[UOp]) -> set[UOp]:
  """Of the shared elementwise nodes `cands`, those reading at least SHARED_WIDE_INPUTS buffers and not inside
  another such one. For a node no kernel reads through a broadcast (`broadcast`: `_broadcast_read`), a smaller buffer
  broadcast into it (a BatchNorm's per-channel mean, scale and shift) doesn't count: each reader reads each of its
  elements once, re-reading such buffers from cache, so computing it there costs no more than reading it written
  (BatchNorm + ReLU forward and backward wrote 7 full-size tensors, 5 of them for this)."""
  def inputs(x: UOp) -> int:
    return sum(1 for y in x.toposort(gate=lambda y: y is x or (y not in realize and not is_buffer_view(y)))
               if y is not x and (y in realize or is_buffer_view(y)) and (x in broadcast or not _smaller(y, prod(x.shape))))
  big = [x for x in cands if inputs(x) >= SHARED_WIDE_INPUTS]
  inner = {y for x in big for y in x.toposort(gate=lambda y, x=x: y is x or (y not in realize and not is_buffer_view(y))) if y is not x}
  return {x for x in big if x not in inner}


_KERNEL_CACHE: dict[UOp, tuple[UOp, list[UOp]]] = {}   # kernel inputs with canonical PARAMs -> (AST, canonical bufs)


def _kernel_ast(value: UOp, out: UOp, ctx: KernelContext, store_target: UOp | None = None) -> UOp:
  """`_build_kernel_ast`, cached by structure: the PARAM placeholders are renamed in order of first appearance, so
  the repeated layers of a model (same graph, other buffers) are indexed and simplified once."""
  parts = (value, out) if store_target is None else (value, out, store_target)
  topo = (sink := UOp.sink_of(*parts)).toposort(memo=False)  # (a temporary root: no memo, no reference cycle holding value)
  params = [n for n in topo if n.op is Ops.PARAM]
  canon = {p: UOp(Ops.PARAM, p.dtype, arg=("k", i, *p.arg[2:])) for i, p in enumerate(params)}
  uniques = [n for n in topo if n.op is Ops.UNIQUE and isinstance(n.arg, tuple) and n.arg[0] == "const"]  # user constants: never in the AST
  key = sink.substitute(canon | {u: UOp(Ops.UNIQUE, u.dtype, arg=("k", i)) for i, u in enumerate(uniques)})
  if (hit := _KERNEL_CACHE.get(key)) is None:
    kctx = KernelContext()
    hit = _KERNEL_CACHE[key] = (_build_kernel_ast(*key.src[:2], kctx, key.src[2] if len(key.src) > 2 else None), kctx.bufs)
    if len(_KERNEL_CACHE) > 8192: _KERNEL_CACHE.pop(next(iter(_KERNEL_CACHE)))
  inv = {c: p for p, c in canon.items()}
  ctx.bufs[:] = [inv[b] if b in inv else b.substitute(inv) if b.src else b for b in hit[1]]
  return hit[0]


def _build_kernel_ast(value: UOp, out: UOp, ctx: KernelContext, store_target: UOp | None = None) -> UOp:
  """SINK(STORE(out[idx], value[idx])) over ranges of value's shape, with indexing pushed to loads and simplified."""
  shape = value.shape
  idxs = tuple(UOp.const(dtypes.index, 0) if s == 1 else ctx.new_range(s, "global") for s in shape)
  ctx.param(out)
  val = UOp(Ops.AT, value.dtype, (value, TRUE, *idxs))
  if store_target is not None:  # ASSIGN: store through the target's view of its buffer
    dest = UOp(Ops.AT, store_target.dtype, (store_target, TRUE, *idxs))
  else: dest = UOp(Ops.AT, out.dtype, (view_as(out, shape), TRUE, *idxs))
  sink = UOp.sink_of(dest, val)
  sink = graph_rewrite(sink, pm_index, ctx=ctx, bottom_up=True, name="indexing")
  dest, val = sink.src
  if dest.op is not Ops.LOAD: raise RuntimeError(f"can't store into a {store_target.op if store_target is not None else out.op} view")
  ast = UOp.sink_of(UOp(Ops.STORE, dtypes.void, (dest.src[0], val)))
  return _drop_unused_params(graph_rewrite(ast, pm_symbolic + pm_reduce_unused_ranges, name="simplify kernel"), ctx)


def _reduce_unused_ranges(red: UOp) -> UOp | None:
  """A REDUCE over ranges its value doesn't depend on: ADD multiplies by their trip count, MAX drops them (a float
  loop adding a constant 2**38 times saturates its accumulators; 2**38 * 1.0 is exact, as tinygrad folds it). The
  count is a Python int (any size), or the symbolic end cast to the dtype."""
  if red.arg not in (Ops.ADD, Ops.MAX) or red.dtype.count != 1: return None
  val, rngs = red.src[0], red.src[1:]
  used = set(val.toposort())
  unused = [r for r in rngs if r not in used]
  if not unused: return None
  keep = tuple(r for r in rngs if r in used)
  ret = UOp(Ops.REDUCE, red.dtype, (val, *keep), red.arg) if keep else val
  if red.arg is Ops.MAX: return ret
  ends = [r.src[0] for r in unused]
  n = prod([e.arg for e in ends if e.op is Ops.CONST])
  if val.op is Ops.CONST and not keep and all(e.op is Ops.CONST for e in ends):
    return UOp.const(red.dtype, val.arg * n)  # as_const rounds (floats) or wraps (ints) like the loop's dtype
  for e in ends:
    if e.op is not Ops.CONST: ret = UOp(Ops.MUL, red.dtype, (ret, e.cast(red.dtype)))
  return UOp(Ops.MUL, red.dtype, (ret, UOp.const(red.dtype, n))) if n != 1 else ret


pm_reduce_unused_ranges = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _reduce_unused_ranges)])


def _drop_unused_params(ast: UOp, ctx: KernelContext) -> UOp:
  """Buffers whose loads simplified away (e.g. `a.where(b, b)`) are not kernel parameters: renumber the rest."""
  used = {n.arg: n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL}
  if len(used) == len(ctx.bufs): return ast
  keep = sorted(used)
  ctx.bufs[:] = [ctx.bufs[i] for i in keep]
  # walk=True: one simultaneous renumbering (slot 4 -> 3 must not then be renumbered again by the 3 -> 2 entry)
  return ast.substitute({used[old]: UOp(Ops.DEFINE_GLOBAL, used[old].dtype, arg=new) for new, old in enumerate(keep) if new != old}, walk=True)


def _reads_other_elements_of_output(ast: UOp) -> bool:
  """True if the kernel loads from its output buffer (slot 0) at an index other than the one it stores to."""
  dest = ast.src[0].src[0]
  return any(u.op is Ops.LOAD and u.src[0].src[0].arg == 0 and u.src[0].src[0].op is Ops.DEFINE_GLOBAL and u.src[0] is not dest
             for u in ast.toposort())


def _placeholder(kind: str, i: int, size: int, device: str, dtype) -> UOp:
  return UOp(Ops.PARAM, dtype, arg=(kind, i, size, device))


def _schedule_normalized(sink: UOp, optimize: bool = True) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """Schedule a graph whose buffers are PARAM placeholders; outputs get ("out", j) placeholders. The last pass
  (`optimize`) chooses each kernel's optimizations and splits off packing kernels (schedule/optimize.py)."""
  targets = list(sink.src)
  nodes = list(sink.toposort(gate=lambda u: not is_buffer_view(u)))
  realize = _must_realize(nodes, targets)
  if above := _pad_chains(nodes, realize):  # PADs of buffers to write (padded_windows): walk down to them too
    nodes = list(sink.toposort(gate=lambda u: not is_buffer_view(u) or u in above))
  becomes: dict[UOp, UOp] = {}
  items: list[ScheduleItem] = []
  n_out = 0
  def new_out(device: str, size: int, dtype) -> UOp:
    nonlocal n_out
    n_out += 1
    return _placeholder("out", n_out - 1, size, device, dtype)
  for n in nodes:
    if n.op is Ops.AFTER and is_buffer_view(n.src[0]) and all(d in becomes for d in n.src[1:]):
      becomes[n] = n.src[0]  # a buffer view waiting for assigns into its buffer: they have run now
      continue
    if n not in realize: continue
    src = n.substitute(becomes, walk=True) if becomes else n  # earlier kernels' outputs are buffers now
    if src.op is Ops.COPY:  # copy the smallest row-major range that holds the view, then view the copy the same way
      base, off, top = contiguous_range(src.src[0])
      out = new_out(src.src[1].arg, max_size(top.numel()), src.dtype)
      items.append(ScheduleItem(src, [out, range_view(base, off, max_size(top.numel()))]))
      becomes[n] = view_as(out, n.shape) if top is src.src[0] else view_as(src.src[0].substitute({top: view_as(out, top.shape)}), n.shape)
      continue
    if (v := _storage_assign_source(src)) is not None:  # ASSIGN into storage: a copy into the target's byte range
      target = src.src[0]
      tbase, toff, ttop = contiguous_range(target)
      if ttop is not target: raise _storage_error(device_of(target), f"write a non-contiguous view (shape {target.shape})")
      vbase, voff, _ = contiguous_range(v)
      items.append(ScheduleItem(UOp(Ops.COPY, target.dtype, (v, UOp(Ops.DEVICE, arg=device_of(target)))),
                                [range_view(tbase, toff, target.numel()), range_view(vbase, voff, v.numel())]))
      becomes[n] = target
      continue
    if is_storage(dev := device_of(src)): raise _storage_error(dev, f"run kernels ({src.op.name} of shape {src.shape})")
    ctx = KernelContext()
    if src.op is Ops.ASSIGN:
      target, value = src.src
      out = buffer_of(target)
      ast = _kernel_ast(value, out, ctx, store_target=target)
      if _reads_other_elements_of_output(ast):  # e.g. x.assign(x.flip(0)): compute the value into a temporary first
        tmp = new_out(device_of(src), max_size(value.numel()), value.dtype)
        tctx = KernelContext()
        items.append(ScheduleItem(_kernel_ast(value, tmp, tctx), list(tctx.bufs), {v: -1 for v in value.toposort() if v.op is Ops.DEFINE_VAR}))
        ctx = KernelContext()
        ast = _kernel_ast(view_as(tmp, value.shape), out, ctx, store_target=target)
      becomes[n] = target
    else:
      value = src.src[0] if src.op is Ops.CONTIGUOUS else src
      out = new_out(device_of(src), max_size(value.numel()), src.dtype)
      ast = _kernel_ast(value, out, ctx)
      becomes[n] = view_as(out, n.shape)
    _check_one_device(src, ctx.bufs)
    items.append(ScheduleItem(ast, list(ctx.bufs), {v: -1 for v in ast.toposort() if v.op is Ops.DEFINE_VAR}))
  return (optimize_items(items, new_out) if optimize else items), becomes


def _check_one_device(node: UOp, bufs: list[UOp]) -> None:
  """A kernel runs on its output's device and reads every buffer there: inputs on other devices are an error (tinygrad's
  "all buffers must be on the same device"), never a foreign buffer handed to the kernel."""
  devs = list(dict.fromkeys(device_of(b) for b in bufs))
  if len(devs) > 1:
    raise TensorError(f"{node.op.name} of shape {node.shape} combines tensors on different devices: its kernel runs on {devs[0]} and "
                      f"reads tensors on {', '.join(map(str, devs[1:]))}; move them to one device first (t.to({devs[0]!r}))")


class _Normalize:
  """Replaces BUFFERs by ("in", i) placeholders and BINDs by their variables, so equal programs on different data
  have the same graph (the schedule cache key)."""
  def __init__(self): self.inputs: list[UOp] = []; self.var_vals: dict[UOp, int] = {}; self.uniques: list[UOp] = []
  def unique(self, u: UOp) -> UOp:
    """Distinct user constants stay distinct, numbered by first appearance (not by their global ids)."""
    if u not in self.uniques: self.uniques.append(u)
    return UOp(Ops.UNIQUE, arg=("const", self.uniques.index(u)))
  def buffer(self, b: UOp) -> UOp:
    self.inputs.append(b)
    return _placeholder("in", len(self.inputs) - 1, b.arg, b.src[1].arg, b.dtype)
  def bind(self, b: UOp) -> UOp:
    var, val = b.unbind()
    if self.var_vals.setdefault(var, val) != val: raise RuntimeError(f"bind mismatch on {var.arg[0]}: {self.var_vals[var]} != {val}")
    return var
  def unbind_arg(self, x: UOp) -> UOp | None:
    """A movement op whose arg holds symbolic sizes with BINDs, rebuilt with the bare variables."""
    new = _map_arg(x.arg, lambda u: u.substitute({n: self.bind(n) for n in u.toposort() if n.op is Ops.BIND}))
    return None if new == x.arg else x.replace(arg=new)


def _map_arg(arg, fn):
  if isinstance(arg, tuple): return tuple(_map_arg(a, fn) for a in arg)
  return fn(arg) if isinstance(arg, UOp) else arg


def _has_uop(arg) -> bool: return isinstance(arg, UOp) or (isinstance(arg, tuple) and any(_has_uop(a) for a in arg))


pm_normalize = PatternMatcher([(UPat(Ops.BUFFER, name="b"), lambda ctx, b: ctx.buffer(b)),
                               (UPat(Ops.BIND, name="b"), lambda ctx, b: ctx.bind(b)),
                               (UPat(Ops.UNIQUE, name="u"), lambda ctx, u: ctx.unique(u))])
def rebind_view(u: UOp, vals: dict[str, int]) -> UOp:
  """A (small) view graph with its bound variables rebound to `vals` (by name), in sources and in movement args."""
  memo: dict[UOp, UOp] = {}
  def fix(x: UOp) -> UOp:
    if x in memo: return memo[x]
    if x.op is Ops.BIND and x.src[0].arg[0] in vals: ret = x.src[0].bind(vals[x.src[0].arg[0]])
    else:
      arg = _map_arg(x.arg, fix) if x.op in GroupOp.Movement and _has_uop(x.arg) else x.arg
      ret = x.replace(src=tuple(fix(s) for s in x.src), arg=arg)
    memo[x] = ret
    return ret
  return fix(u)


pm_rebind_args = PatternMatcher([(UPat(GroupOp.Movement, name="x"),
  lambda ctx, x: x.replace(arg=_map_arg(x.arg, lambda u: u.substitute(ctx, walk=True))) if _has_uop(x.arg) else None)])
pm_unbind_args = PatternMatcher([(UPat(GroupOp.Movement, name="x"), lambda ctx, x: ctx.unbind_arg(x) if _has_uop(x.arg) else None)])
_SCHEDULE_CACHE: dict[UOp, tuple[list[ScheduleItem], dict[UOp, UOp]]] = {}
SCHEDULES_USED: list[set[UOp]] = []   # a TinyJit capture pushes a set here: the cache keys its realizes used


def forget_schedules(keys: set[UOp]) -> None:
  """Drop these schedule-cache entries (a capture that replays without scheduling doesn't need them; realizing the same
  graphs outside it schedules them again)."""
  for k in keys: _SCHEDULE_CACHE.pop(k, None)
SCHEDULE_STATS = {"hits": 0, "misses": 0}


def create_schedule(targets: list[UOp], keep: set[UOp] | None = None, info: dict | None = None,
                    optimize: bool = True) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """Kernels (in run order) that realize `targets`, and the map from each realized node to its buffer view.
  Schedules are cached by the structure of the graph (buffers and bound values abstracted), so running the same
  program on new data skips scheduling and codegen. Intermediate buffers not in `keep` (or targets) may share memory.
  `info`, when given, receives the normalization ("nsink": the cache key, "mapping": node -> normalized node, "norm")
  from which engine/plan.py builds its realize plans. `optimize=False`: the kernels as built, without the last pass
  (schedule/optimize.py: each kernel's optimizations and the packing kernels they add), for inspection; not cached."""
  with capture.group("schedule", lambda: f"schedule {', '.join(str(t.shape) for t in targets[:3])}{' ...' if len(targets) > 3 else ''}"):
    return _create_schedule(targets, keep, info, optimize)


def _create_schedule(targets: list[UOp], keep: set[UOp] | None, info: dict | None = None,
                     optimize: bool = True) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  norm = _Normalize()
  mapping = graph_rewrite_map(UOp.sink_of(*targets), pm_unbind_args, ctx=norm, bpm=pm_normalize, walk=True, name="normalize")
  nsink = mapping[UOp.sink_of(*targets)]
  if info is not None: info.update(nsink=nsink, mapping=mapping, norm=norm)
  if SCHEDULES_USED: SCHEDULES_USED[-1].add(nsink)
  if not optimize: cached = _schedule_normalized(nsink, optimize=False)
  elif (cached := _SCHEDULE_CACHE.get(nsink)) is None:
    cached = _SCHEDULE_CACHE[nsink] = _schedule_normalized(nsink)
    SCHEDULE_STATS["misses"] += 1
    if getenv("DEBUG", 0) >= 1: print(f"schedule cache miss: {len(cached[0])} items")
  else:
    SCHEDULE_STATS["hits"] += 1
    if getenv("DEBUG", 0) >= 1: print(f"schedule cache hit: {len(cached[0])} items")
  items_t, becomes_t = cached
  kept_outs = {buffer_of(becomes_t[mapping[n]]) for n in (*targets, *(keep or ())) if n in mapping and mapping[n] in becomes_t}
  outs = plan_buffers(items_t, kept_outs)
  def real(p: UOp) -> UOp: return norm.inputs[p.arg[1]] if p.arg[0] == "in" else outs[p]
  sub_map = {p: real(p) for it in items_t for b in it.bufs for p in b.toposort() if p.op is Ops.PARAM}
  items = [ScheduleItem(it.ast, [sub_map[b] if b.op is Ops.PARAM else b.substitute(sub_map) for b in it.bufs],
                        {v: norm.var_vals[v] for v in it.var_vals}, it.opts) for it in items_t]
  rebind = {**sub_map, **{v: v.bind(val) for v, val in norm.var_vals.items()}}  # realized views keep their bound sizes
  becomes = {n: graph_rewrite(becomes_t[m], pm_rebind_args, ctx=rebind, bpm=pm_substitute, walk=True, name="rebind")
             for n, m in mapping.items() if m in becomes_t}
  return items, becomes


def mark_internal(u: UOp) -> UOp:
  """Mark BUFFER `u` as an intermediate no tensor sees after its schedule ran (its Buffer's `internal`)."""
  u._cached()["internal"] = True
  return u


def plan_buffers(items: list[ScheduleItem], kept: set[UOp]) -> dict[UOp, UOp]:
  """Real BUFFERs for the ("out", j) placeholders: an intermediate that is not kept reuses the memory of an earlier
  intermediate of the same device, dtype and size whose last reader has run (marked internal: see `mark_internal`)."""
  last_use: dict[UOp, int] = {}
  for i, it in enumerate(items):
    for b in it.bufs:
      for p in b.toposort():
        if p.op is Ops.PARAM: last_use[p] = i
  free: dict[tuple, list[UOp]] = {}
  outs: dict[UOp, UOp] = {}
  for i, it in enumerate(items):
    params = [p for b in it.bufs for p in b.toposort() if p.op is Ops.PARAM and p.arg[0] == "out"]  # views' bases too
    for p in params:
      if p in outs: continue
      key = (p.arg[3], p.dtype, p.arg[2])
      if p in kept: outs[p] = new_buffer(p.arg[3], p.arg[2], p.dtype)
      elif free.get(key): outs[p] = free[key].pop()
      else: outs[p] = mark_internal(new_buffer(p.arg[3], p.arg[2], p.dtype))
    for p in dict.fromkeys(params):
      if last_use[p] == i and p not in kept:
        free.setdefault((p.arg[3], p.dtype, p.arg[2]), []).append(outs[p])
  return outs


def view_as(u: UOp, shape: tuple) -> UOp:
  """Flat buffer `u` seen as `shape` (itself if it has that shape). A symbolic shape uses the first numel elements
  of a buffer sized for the largest value of its variables."""
  shape = tuple(shape)
  if u.shape == shape: return u
  numel = ssimplify(prod(shape))
  if not isinstance(numel, int) or numel != u.shape[0]: u = UOp(Ops.SHRINK, u.dtype, (u,), ((0, numel),))
  return u if u.shape == shape else UOp(Ops.RESHAPE, u.dtype, (u,), shape)


def max_size(n) -> int:
  """The largest value a (possibly symbolic) element count can take: buffers are allocated at that size."""
  return n if isinstance(n, int) else int(n.vmax)
