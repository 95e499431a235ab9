"""Multi-device tensors: the MULTI node and `pm_multi`, the rules that lower each tensor-level op over it per device.

A tensor on several devices is `MULTI(x_0, ..., x_{k-1}, arg=axis)` where x_d is an ordinary single-device graph on
device d. With `axis=None` every x_d is a full replica; with `axis=a` x_d holds rows [b_d, e_d) of the logical tensor
along `a`, and the bounds follow from the shards' shapes (so uneven splits need nothing extra). The logical shape is
the shards' shape with their sizes along `a` added up (uop/shape.py); the device is the tuple of the shards' devices.

Lowering is eager, one node at a time: when Tensor builds a node that has a MULTI source (or a DEVICE source naming
several devices), `lower_multi` applies `pm_multi` to that node, which returns a MULTI of per-device nodes. MULTI
therefore only appears at the top of a tensor's graph: the scheduler, codegen, the JIT and autograd's per-op rules see
single-device graphs, and every movement of data between devices is a COPY node (device to device where the
allocators can, host-staged otherwise: `Buffer.copy_from`). The rules:

- elementwise ops (ALU, CAST, BITCAST, CONTIGUOUS, DETACH, ASSIGN, CONTIGUOUS_BACKWARD, CUSTOM_GRAD): per device, after resharding the sources to one
  layout (the first sharded source's; an ASSIGN keeps its target's);
- movement: PERMUTE moves the axis; EXPAND keeps it; RESHAPE keeps the shards when the shard axis maps onto one new
  axis whose shard bounds are whole (else it allgathers to replicas first); PAD along the shard axis grows the first
  and last shards; SHRINK along it cuts each shard (allgather when a shard would be empty); FLIP along it allgathers;
- REDUCE_AXIS over the shard axis reduces each shard, then `allreduce`s the partial results (replicated result);
- COPY to one device gathers the shards; COPY of one tensor to several devices replicates it; `shard_uop` splits it.

`allreduce` is naive (every device copies every other device's partial and reduces) for buffers below
RING_ALLREDUCE_BYTES (default 256 KiB) and a ring otherwise (reduce-scatter then allgather of k chunks: each device
sends and receives 2(k-1)/k of the buffer instead of k-1 buffers); the allgather writes each chunk into its range of a
new buffer (ASSIGNs into views, then AFTER): 1.5-1.8x faster than concatenating by padding and adding.
"""
from __future__ import annotations

from typing import Sequence

from plugrad.dtype import dtypes
from plugrad.helpers import getenv
from plugrad.uop.buffers import buffer_of, new_buffer
from plugrad.uop.shape import device_of
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.symbolic import prod, ssimplify
from plugrad.uop.upat import PatternMatcher, UPat


class MultiDeviceError(RuntimeError):
  """An operation on multi-device tensors that can't be done: mixed device sets, bad shard axes or splits."""


RING_ALLREDUCE_BYTES = 256 * 1024


# ***** layout helpers *****
def multi(srcs: Sequence[UOp], axis: int | None) -> UOp:
  """MULTI over per-device nodes `srcs` (one per device, in device order)."""
  return UOp(Ops.MULTI, srcs[0].dtype, tuple(srcs), axis)


def devices_of(m: UOp) -> tuple[str, ...]: return tuple(device_of(s) for s in m.src)


def bounds_of(m: UOp) -> tuple[tuple[int, int], ...] | None:
  """Per shard (start, end) along the shard axis; None for replicas."""
  if m.arg is None: return None
  out, off = [], 0
  for s in m.src:
    n = s.shape[m.arg]
    out.append((off, off + n))
    off += n
  return tuple(out)


def even_bounds(n: int, k: int) -> tuple[tuple[int, int], ...]:
  """k shards of n rows as equal as can be: n // k each, the first n % k one row more; an empty shard is an error."""
  if n < k:
    raise MultiDeviceError(f"can't shard an axis of size {n} over {k} devices: some device would get no rows "
                           f"(shard another axis, or use fewer devices)")
  sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
  return tuple((sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(k))


def splits_to_bounds(splits: Sequence[int], n: int, k: int) -> tuple[tuple[int, int], ...]:
  """Bounds from explicit per-device sizes (uneven shards); they must be positive and add up to n."""
  if len(splits) != k or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in splits) or sum(splits) != n:
    raise MultiDeviceError(f"splits {tuple(splits)} must be {k} positive ints adding up to the axis size {n}")
  out, off = [], 0
  for s in splits:
    out.append((off, off + s))
    off += s
  return tuple(out)


def _has_device(u: UOp) -> bool:
  try: device_of(u)
  except RuntimeError: return False
  return True


def _shrink_axis(x: UOp, axis: int, lo: int, hi: int) -> UOp:
  if lo == 0 and hi == x.shape[axis]: return x
  return UOp(Ops.SHRINK, x.dtype, (x,), tuple((lo, hi) if i == axis else (0, s) for i, s in enumerate(x.shape)))


def _pad_axis(x: UOp, axis: int, before: int, after: int) -> UOp:
  if before == 0 and after == 0: return x
  return UOp(Ops.PAD, x.dtype, (x,), tuple((before, after) if i == axis else (0, 0) for i in range(len(x.shape))))


def copy_to(x: UOp, device: str) -> UOp:
  """`x` on `device`: itself when it is there, else a COPY."""
  return x if device_of(x) == device else UOp(Ops.COPY, x.dtype, (x, UOp(Ops.DEVICE, arg=device)))


def _combine(a: UOp, b: UOp) -> UOp: return UOp(Ops.OR if a.dtype == dtypes.bool else Ops.ADD, a.dtype, (a, b))


def _concat(pieces: list[tuple[int, UOp]], axis: int, total: int) -> UOp:
  """Pieces (offset along axis, node) covering [0, total) without overlap, as one node (padded pieces added up)."""
  if len(pieces) == 1 and pieces[0][0] == 0 and pieces[0][1].shape[axis] == total: return pieces[0][1]
  ret = None
  for off, x in pieces:
    p = _pad_axis(x, axis, off, total - off - x.shape[axis])
    ret = p if ret is None else _combine(ret, p)
  assert ret is not None
  return ret


def zeros(shape: tuple, dtype, device: str) -> UOp:
  c = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), dtypes.as_const(0, dtype))
  if not shape: return c
  c = UOp(Ops.RESHAPE, dtype, (c,), (1,) * len(shape))
  return c if all(s == 1 for s in shape) else UOp(Ops.EXPAND, dtype, (c,), tuple(shape))


# ***** resharding *****
def _gather_range(m: UOp, device: str, axis: int | None, lo: int, hi: int) -> UOp:
  """The logical tensor of sharded `m`, restricted to [lo, hi) along `axis` (everything when axis is None), on `device`."""
  a, shape = m.arg, m.shape
  pieces = []
  for j, (b, e) in enumerate(bounds_of(m) or ()):
    plo, phi = (max(b, lo), min(e, hi)) if axis == a else (b, e)
    if plo >= phi: continue
    x = _shrink_axis(m.src[j], a, plo - b, phi - b)
    if axis is not None and axis != a: x = _shrink_axis(x, axis, lo, hi)
    pieces.append((plo - (lo if axis == a else 0), copy_to(x, device)))
  return _concat(pieces, a, (hi - lo) if axis == a else shape[a])


def reshard(m: UOp, axis: int | None, bounds: Sequence[tuple[int, int]] | None) -> UOp:
  """MULTI `m` laid out as (axis, bounds) on the same devices: replicas shrink locally, shards copy what they lack."""
  if m.arg == axis and bounds_of(m) == (tuple(bounds) if bounds is not None else None): return m
  devs = devices_of(m)
  if m.arg is None:
    assert axis is not None and bounds is not None
    return multi([_shrink_axis(m.src[d], axis, *bounds[d]) for d in range(len(devs))], axis)
  out = [_gather_range(m, dev, axis, *(bounds[d] if axis is not None and bounds is not None else (0, 0))) for d, dev in enumerate(devs)]
  return multi(out, axis)


def shard_uop(x: UOp, devices: Sequence[str], axis: int | None, bounds: Sequence[tuple[int, int]] | None = None) -> UOp:
  """Single-device `x` replicated (axis None) or split along `axis` over `devices`, each shard copied straight from
  its rows of x (a DISK tensor split on axis 0 loads each shard's byte range into its device)."""
  if axis is None: return multi([copy_to(x, d) for d in devices], None)
  bounds = bounds if bounds is not None else even_bounds(x.shape[axis], len(devices))
  return multi([copy_to(_shrink_axis(x, axis, b, e), d) for d, (b, e) in zip(devices, bounds)], axis)


def gather(m: UOp, device: str) -> UOp:
  """The whole of MULTI `m` on one device."""
  if m.arg is None:
    devs = devices_of(m)
    return m.src[devs.index(device)] if device in devs else copy_to(m.src[0], device)
  return _gather_range(m, device, None, 0, 0)


# ***** collectives *****
def _reduce2(op: Ops, a: UOp, b: UOp) -> UOp: return UOp(op, a.dtype, (a, b))


def allreduce(parts: Sequence[UOp], op: Ops) -> UOp:
  """Replicated MULTI of the elementwise `op` (ADD, MUL or MAX) over same-shaped per-device `parts`."""
  k, shape = len(parts), parts[0].shape
  devs = [device_of(p) for p in parts]
  n = prod(shape)
  if k == 1: return multi(parts, None)
  nbytes = n * parts[0].dtype.itemsize if isinstance(n, int) else 0
  if not isinstance(n, int) or n < k or nbytes < getenv("RING_ALLREDUCE_BYTES", RING_ALLREDUCE_BYTES):
    out = []
    for d, dev in enumerate(devs):
      acc = parts[d]
      for j in range(k):
        if j != d: acc = _reduce2(op, acc, copy_to(parts[j], dev))
      out.append(acc)
    return multi(out, None)
  # ring: chunk c ends up reduced on device (c - 1) % k after k-1 steps of passing partial sums to the next device
  flat = [UOp(Ops.RESHAPE, p.dtype, (p,), (n,)) if len(shape) != 1 else p for p in parts]
  cb = even_bounds(n, k)
  acc = [[_shrink_axis(flat[d], 0, b, e) for (b, e) in cb] for d in range(k)]
  for s in range(k - 1):
    sends = [((d - s) % k, d) for d in range(k)]
    new = [row[:] for row in acc]
    for c, d in sends:
      nd = (d + 1) % k
      new[nd][c] = _reduce2(op, acc[nd][c], copy_to(acc[d][c], devs[nd]))  # a COPY realizes what it sends first
    acc = new
  owned = [acc[(c - 1) % k][c] for c in range(k)]
  out = []
  for d, dev in enumerate(devs):  # allgather: each chunk written (or copied) straight into its range of a new buffer
    buf = new_buffer(dev, n, parts[0].dtype)
    deps = [UOp(Ops.ASSIGN, buf.dtype, (_shrink_axis(buf, 0, b, e), copy_to(owned[c], dev))) for c, (b, e) in enumerate(cb)]
    full = UOp(Ops.AFTER, buf.dtype, (buf, *deps))
    out.append(UOp(Ops.RESHAPE, full.dtype, (full,), tuple(shape)) if len(shape) != 1 else full)
  return multi(out, None)


# ***** the per-op rules *****
def _check_devices(u: UOp) -> tuple[str, ...]:
  """The one device set of u's multi-device sources; mixing sets, or a single-device tensor, is an error."""
  sets = {devices_of(s) for s in u.src if s.op is Ops.MULTI}
  singles = [device_of(s) for s in u.src if s.op is not Ops.MULTI and s.op is not Ops.DEVICE and _has_device(s)]
  if len(sets) > 1 or singles:
    names = sorted({str(d) for d in sets} | {repr(d) for d in singles})
    raise MultiDeviceError(f"{u.op} mixes tensors on different devices: {', '.join(names)}; move them to one device set first "
                           f"(t.to(devices) to replicate, t.shard(devices, axis) to split)")
  return next(iter(sets))


def _per_device(u: UOp) -> UOp:
  devs = _check_devices(u)
  ms = [s for s in u.src if s.op is Ops.MULTI]
  lead = u.src[0] if u.op is Ops.ASSIGN else next((m for m in ms if m.arg is not None), ms[0])
  axis, bounds = lead.arg, bounds_of(lead)
  srcs = [reshard(s, axis, bounds) if s.op is Ops.MULTI else s for s in u.src]
  return multi([u.replace(src=tuple(s.src[d] if s.op is Ops.MULTI else s for s in srcs)) for d in range(len(devs))], axis)


def _map_shape(m: UOp, shape: tuple, d: int) -> tuple:
  """A logical shape as shard d sees it (the shard axis at the shard's size)."""
  if m.arg is None: return tuple(shape)
  return tuple(m.src[d].shape[m.arg] if i == m.arg else s for i, s in enumerate(shape))


def _replicated(m: UOp) -> UOp: return reshard(m, None, None)


def _reshape(x: UOp, m: UOp) -> UOp:
  new = tuple(x.arg)
  if m.arg is None: return multi([s.replace(op=Ops.RESHAPE, src=(s,), arg=new) for s in m.src], None)
  a, old = m.arg, m.shape
  if all(isinstance(v, int) for v in (*old, *new)):
    pre, suf = prod(old[:a]), prod(old[a + 1:])
    for na in range(len(new)):
      if prod(new[:na]) != pre: continue
      q = prod(new[na + 1:])
      if q == 0 or any((b * suf) % q or (e * suf) % q for b, e in bounds_of(m) or ()): continue
      nb = [(b * suf // q, e * suf // q) for b, e in bounds_of(m) or ()]
      return multi([UOp(Ops.RESHAPE, s.dtype, (s,), tuple(e - b if i == na else v for i, v in enumerate(new)))
                    for s, (b, e) in zip(m.src, nb)], na)
  else:  # symbolic sizes: keep the shards when the shard axis survives whole, with equal sizes before and after it
    pre, suf = prod(old[:a]), prod(old[a + 1:])
    for na in range(len(new)):
      if _same(new[na], old[a]) and _same(prod(new[:na]), pre) and _same(prod(new[na + 1:]), suf):
        return multi([UOp(Ops.RESHAPE, s.dtype, (s,), tuple(s.shape[a] if i == na else v for i, v in enumerate(new))) for s in m.src], na)
  # the shard axis would be split across devices: allgather, then reshape each replica
  return _reshape(x, _replicated(m))


def _same(x, y) -> bool:
  """x == y for sizes that may be symbolic (decided by simplifying their difference)."""
  if isinstance(x, int) and isinstance(y, int): return x == y
  return ssimplify(x - y) == 0 if isinstance(x, UOp) else ssimplify(-(y - x)) == 0


def _expand(x: UOp, m: UOp) -> UOp:
  if m.arg is not None and x.arg[m.arg] != m.shape[m.arg]:
    raise MultiDeviceError(f"can't expand the shard axis {m.arg} of {m.shape} to {x.arg}")
  return multi([UOp(Ops.EXPAND, s.dtype, (s,), _map_shape(m, x.arg, d)) for d, s in enumerate(m.src)], m.arg)


def _permute(x: UOp, m: UOp) -> UOp:
  return multi([UOp(Ops.PERMUTE, s.dtype, (s,), x.arg) for s in m.src], None if m.arg is None else tuple(x.arg).index(m.arg))


def _pad(x: UOp, m: UOp) -> UOp:
  a, k = m.arg, len(m.src)
  if a is None or tuple(x.arg[a]) == (0, 0): return multi([UOp(Ops.PAD, s.dtype, (s,), x.arg) for s in m.src], a)
  if not all(isinstance(v, int) for v in x.arg[a]): return _pad(x, _replicated(m))
  before, after = x.arg[a]
  out = []
  for d, s in enumerate(m.src):  # the padding before goes to the first shard, the padding after to the last
    arg = tuple(((before if d == 0 else 0), (after if d == k - 1 else 0)) if i == a else p for i, p in enumerate(x.arg))
    out.append(UOp(Ops.PAD, s.dtype, (s,), arg) if any(p != (0, 0) for p in arg) else s)
  return multi(out, a)


def _shrink(x: UOp, m: UOp) -> UOp:
  a = m.arg
  if a is None: return multi([UOp(Ops.SHRINK, s.dtype, (s,), x.arg) for s in m.src], None)
  if tuple(x.arg[a]) == (0, m.shape[a]):
    return multi([UOp(Ops.SHRINK, s.dtype, (s,), tuple((0, s.shape[a]) if i == a else be for i, be in enumerate(x.arg))) for s in m.src], a)
  lo, hi = x.arg[a]
  if not (isinstance(lo, int) and isinstance(hi, int)): return _shrink(x, _replicated(m))
  parts = [(max(b, lo) - b, min(e, hi) - b) for b, e in bounds_of(m) or ()]
  if any(pl >= ph for pl, ph in parts): return _shrink(x, _replicated(m))  # a device would hold nothing: replicate
  return multi([UOp(Ops.SHRINK, s.dtype, (s,), tuple(p if i == a else be for i, be in enumerate(x.arg))) for s, p in zip(m.src, parts)], a)


def _flip(x: UOp, m: UOp) -> UOp:
  if m.arg is not None and x.arg[m.arg]: m = _replicated(m)
  return multi([UOp(Ops.FLIP, s.dtype, (s,), x.arg) for s in m.src], m.arg)


def _reduce(x: UOp, m: UOp) -> UOp:
  op, axes = x.arg
  parts = [UOp(Ops.REDUCE_AXIS, s.dtype, (s,), x.arg) for s in m.src]
  if m.arg is None or m.arg not in axes: return multi(parts, m.arg)
  return allreduce(parts, op)


def _copy(x: UOp, src: UOp, dev: UOp) -> UOp:
  target = dev.arg
  if isinstance(target, tuple):
    if src.op is not Ops.MULTI:
      if not _has_device(src): raise MultiDeviceError(f"COPY of a node without a device: {src.op}")
      return shard_uop(src, target, None)
    if devices_of(src) == target: return src
    if len(target) == len(src.src): return multi([copy_to(s, t) for s, t in zip(src.src, target)], src.arg)
    return shard_uop(gather(src, target[0]), target, None)
  if src.op is Ops.MULTI: return gather(src, target)
  return x


def _replicate_leaf(x: UOp) -> UOp | None:
  """A leaf (CONST, BUFFER) whose DEVICE source names several devices: one leaf per device, replicated."""
  devs = next((s.arg for s in x.src if s.op is Ops.DEVICE and isinstance(s.arg, tuple)), None)
  if devs is None: return None
  if x.op is Ops.BUFFER: return multi([new_buffer(d, x.arg, x.dtype) for d in devs], None)
  return multi([x.replace(src=tuple(UOp(Ops.DEVICE, arg=d) if s.op is Ops.DEVICE else s for s in x.src)) for d in devs], None)


def _movement(x: UOp) -> UOp | None:
  m = x.src[0]
  if m.op is not Ops.MULTI: return None
  return {Ops.RESHAPE: _reshape, Ops.EXPAND: _expand, Ops.PERMUTE: _permute, Ops.PAD: _pad, Ops.SHRINK: _shrink,
          Ops.FLIP: _flip, Ops.REDUCE_AXIS: _reduce}[x.op](x, m)


pm_multi = PatternMatcher([
  (UPat((Ops.CONST, Ops.BUFFER), name="x"), _replicate_leaf),
  (UPat(Ops.COPY, src=(UPat(name="src"), UPat(Ops.DEVICE, name="dev")), name="x"), _copy),
  (UPat(GroupOp.Movement | {Ops.REDUCE_AXIS}, name="x"), _movement),
  # (the autograd markers too: Tensor lowers each op when it is built, so gradients are taken per device)
  (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN, Ops.AFTER, Ops.CONTIGUOUS_BACKWARD, Ops.CUSTOM_GRAD},
        name="x"),
   lambda x: _per_device(x) if any(s.op is Ops.MULTI for s in x.src) else None),
])


def needs_lowering(u: UOp) -> bool:
  """True for a node that pm_multi must lower: a MULTI source, or a DEVICE source naming several devices."""
  if u.op is Ops.MULTI: return False
  for s in u.src:  # (a loop, not any() over a generator: this runs for every tensor op)
    if s.op is Ops.MULTI or (s.op is Ops.DEVICE and isinstance(s.arg, tuple)): return True
  return False


def lower_multi(u: UOp) -> UOp:
  """u (whose sources are already lowered) as a MULTI of per-device nodes."""
  if (ret := pm_multi.rewrite(u)) is None:
    raise MultiDeviceError(f"{u.op} is not supported on multi-device tensors (sources {[s.op for s in u.src]})")
  return ret


# ***** autograd *****
def src_grads(g: UOp, ret: UOp) -> list[UOp | None]:
  """Per-source gradients of MULTI `ret` from the logical gradient `g` (replicas: the first carries it, as the value
  of a replicated tensor is that of any one replica)."""
  devs = devices_of(ret)
  if g.op is not Ops.MULTI: g = shard_uop(g, devs, ret.arg, bounds_of(ret))
  elif devices_of(g) != devs: raise MultiDeviceError(f"gradient on {devices_of(g)} for a tensor on {devs}")
  g = reshard(g, ret.arg, bounds_of(ret))
  if ret.arg is None: return [g.src[0]] + [None] * (len(devs) - 1)
  return list(g.src)


def after_grads(g: UOp, ret: UOp) -> tuple[UOp | None, ...] | None:
  """Gradients through AFTER(buffer, *ASSIGN(view of buffer, value)) (the ring allreduce's allgather): each write's
  value gets g seen through its view. None (no rule) for any other AFTER."""
  base = ret.src[0]
  if base.op is not Ops.BUFFER or any(d.op is not Ops.ASSIGN or buffer_of(d.src[0]) is not base for d in ret.src[1:]): return None
  return (None, *(d.src[0].substitute({base: g}, walk=True) for d in ret.src[1:]))


def target_grad(t: UOp, grads: Sequence[UOp | None]) -> UOp:
  """The logical gradient of MULTI `t` from its sources' gradients: a replicated tensor's is their allreduced sum."""
  full = [g if g is not None else zeros(s.shape, s.dtype, device_of(s)) for s, g in zip(t.src, grads)]
  return allreduce(full, Ops.ADD) if t.arg is None else multi(full, t.arg)
