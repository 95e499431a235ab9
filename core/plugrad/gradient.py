"""Autograd: one derivative rule per tensor-level op, applied in reverse topological order, on UOps.

`pm_gradient` maps a node `ret` and the gradient flowing into it (`ctx`, a UOp of ret's shape) to one gradient UOp per
source (None where a source gets none). Every composite Tensor op is built from these primitives, so this is the whole
of autograd. Rules use the op mixins UOp shares with Tensor (plugrad/mixin: movement, arithmetic, `_reduce`) and
`full_like` for constants, so gradients are lazy graphs that fuse like any other computation; this module imports no
Tensor (Tensor.gradient wraps the results).
"""
from __future__ import annotations

import math

from plugrad.dtype import dtypes, sum_acc_dtype
from plugrad.schedule.multi import after_grads, src_grads, target_grad
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.upat import PatternMatcher, UPat


def _unexpand(g: UOp, shape: tuple) -> UOp:
  """Sum g over the axes where `shape` has 1 and g does not (the adjoint of EXPAND)."""
  axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a == 1 and b != 1)
  if not axes: return g
  acc = sum_acc_dtype(g.dtype)  # float16 gradients (a half matmul's backward) accumulate in float32, as the forward does
  return g.cast(acc)._reduce(Ops.ADD, axes, keepdim=True).cast(g.dtype) if acc != g.dtype else g._reduce(Ops.ADD, axes, keepdim=True)


def _where(c: UOp, x: UOp, y: UOp) -> UOp: return UOp(Ops.WHERE, x.dtype, (c, x, y))


def _max_grad(g: UOp, a: UOp, b: UOp) -> UOp:
  """d max(a, b) / da: 1 where a wins, 0.5 on ties, 0 where b wins."""
  return g * _where(a > b, g.full_like(1.0), _where(a.eq(b), g.full_like(0.5), g.full_like(0.0)))


def _reduce_max_grad(g: UOp, ret: UOp) -> UOp:
  x = ret.src[0]
  mask = x.eq(ret._expand_to(x.shape)).cast(g.dtype)
  count = mask._reduce(Ops.ADD, ret.arg[1], keepdim=True)
  return mask * (g / count)._expand_to(x.shape)  # ties share the gradient evenly


def _reduce_grad(g: UOp, ret: UOp) -> UOp | None:
  op, x = ret.arg[0], ret.src[0]
  if op is Ops.ADD: return g._expand_to(x.shape)
  if op is Ops.MAX: return _reduce_max_grad(g, ret)
  if op is Ops.MUL:  # product of the other elements: exact with zeros (one zero: only it gets a gradient; two: none do)
    axes = ret.arg[1]
    nz, one, zero = x.eq(x.full_like(0)), x.full_like(1.0), x.full_like(0.0)
    p = _where(nz, one, x)._reduce(Ops.MUL, axes, keepdim=True)._expand_to(x.shape)
    c = nz.cast(g.dtype)._reduce(Ops.ADD, axes, keepdim=True)._expand_to(x.shape)
    ge = g._expand_to(x.shape)
    return ge * _where(nz, _where(c.eq(c.full_like(1)), p, zero), _where(c.eq(c.full_like(0)), p / _where(nz, one, x), zero))
  return None


def _pad_grad(g: UOp, ret: UOp) -> UOp:
  return g.shrink(tuple((b, b + s) for (b, _), s in zip(ret.arg, ret.src[0].shape)))


def _shrink_grad(g: UOp, ret: UOp) -> UOp:
  return g._pad(tuple((b, s - e) for (b, e), s in zip(ret.arg, ret.src[0].shape)))


def _permute_grad(g: UOp, ret: UOp) -> UOp:
  inv = [0] * len(ret.arg)
  for i, o in enumerate(ret.arg): inv[o] = i
  return g.permute(tuple(inv))


def _cos(x: UOp) -> UOp:
  """cos(x) = 1 - 2 sin(x/2)^2, as Tensor.cos computes it (halving is exact)."""
  s = (x * x.full_like(0.5))._alu(Ops.SIN)
  return x.full_like(1) - x.full_like(2) * s * s


def _to(g: UOp, device: str) -> UOp: return g if g.device == device else UOp(Ops.COPY, g.dtype, (g, UOp(Ops.DEVICE, arg=device)))


def _pow_grads(ctx: UOp, ret: UOp) -> tuple[UOp, UOp]:
  b, e = ret.src
  return ctx * e * ret / b, ctx * ret * (b.log2() * b.full_like(math.log(2)))


def _custom_grads(ctx: UOp, ret: UOp) -> tuple[UOp | None, ...]:
  """CUSTOM_GRAD(value, x1, g1, ...): ctx * g_i to x_i; nothing through the value's own graph or into the g_i.
  With a callable arg, CUSTOM_GRAD(value, x1, x2, ...) takes its gradients from `arg(ctx, ret)` (a vector-Jacobian
  product: None for the value, then one gradient per x_i, e.g. a convolution's as convolutions)."""
  if callable(ret.arg): return tuple(ret.arg(ctx, ret))
  if len(ret.src) % 2 == 0: raise RuntimeError(f"CUSTOM_GRAD needs a value and (input, gradient) pairs, got {len(ret.src)} sources")
  out: list[UOp | None] = [None]
  for g in ret.src[2::2]: out += [ctx * g, None]
  return tuple(out)


def _float(ret: UOp) -> bool: return dtypes.is_float(ret.dtype)


pm_gradient = PatternMatcher([
  (UPat(Ops.ADD, name="ret"), lambda ctx, ret: (ctx, ctx)),
  (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ctx * ret.src[1], ctx * ret.src[0])),
  (UPat(Ops.NEG, name="ret"), lambda ctx, ret: (-ctx,)),
  (UPat(Ops.FDIV, name="ret"), lambda ctx, ret: (ctx / ret.src[1], -ctx * ret / ret.src[1])),
  (UPat(Ops.MAX, name="ret"), lambda ctx, ret: (_max_grad(ctx, ret.src[0], ret.src[1]), _max_grad(ctx, ret.src[1], ret.src[0]))
   if _float(ret) else None),
  (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ctx * ret * ctx.full_like(math.log(2)),)),
  (UPat(Ops.LOG2, name="ret"), lambda ctx, ret: (ctx / (ret.src[0] * ctx.full_like(math.log(2))),)),
  (UPat(Ops.SIN, name="ret"), lambda ctx, ret: (ctx * _cos(ret.src[0]),)),
  (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx / (ret * ret.full_like(2)),)),
  (UPat(Ops.RECIPROCAL, name="ret"), lambda ctx, ret: (-ctx * ret * ret,)),
  (UPat(Ops.POW, name="ret"), _pow_grads),
  (UPat(Ops.WHERE, name="ret"), lambda ctx, ret: (None, _where(ret.src[0], ctx, ctx.full_like(0.0)), _where(ret.src[0], ctx.full_like(0.0), ctx))),
  (UPat(Ops.MULACC, name="ret"), lambda ctx, ret: (ctx * ret.src[1], ctx * ret.src[0], ctx)),
  (UPat(Ops.CAST, name="ret"), lambda ctx, ret: (ctx.cast(ret.src[0].dtype),) if dtypes.is_float(ret.src[0].dtype) else (None,)),
  (UPat(Ops.TRUNC, name="ret"), lambda ctx, ret: (ctx * ctx.full_like(0),)),
  # movement
  (UPat(Ops.RESHAPE, name="ret"), lambda ctx, ret: (ctx.reshape(ret.src[0].shape),)),
  (UPat(Ops.EXPAND, name="ret"), lambda ctx, ret: (_unexpand(ctx, ret.src[0].shape),)),
  (UPat(Ops.PERMUTE, name="ret"), lambda ctx, ret: (_permute_grad(ctx, ret),)),
  (UPat(Ops.PAD, name="ret"), lambda ctx, ret: (_pad_grad(ctx, ret),)),
  (UPat(Ops.SHRINK, name="ret"), lambda ctx, ret: (_shrink_grad(ctx, ret),)),
  (UPat(Ops.FLIP, name="ret"), lambda ctx, ret: (ctx.flip(tuple(i for i, f in enumerate(ret.arg) if f)),)),
  (UPat(Ops.REDUCE_AXIS, name="ret"), lambda ctx, ret: (_reduce_grad(ctx, ret),)),
  # buffers and copies
  (UPat(Ops.CONTIGUOUS, name="ret"), lambda ctx, ret: (ctx,)),
  (UPat(Ops.CONTIGUOUS_BACKWARD, name="ret"), lambda ctx, ret: (ctx.contiguous(),)),
  (UPat(Ops.CUSTOM_GRAD, name="ret"), lambda ctx, ret: _custom_grads(ctx, ret)),
  (UPat(Ops.COPY, name="ret"), lambda ctx, ret: (_to(ctx, ret.src[0].device), None)),
  (UPat(Ops.ASSIGN, name="ret"), lambda ctx, ret: (None, ctx)),
  # multi-device tensors: the logical gradient split per device (schedule/multi.py)
  (UPat(Ops.MULTI, name="ret"), lambda ctx, ret: tuple(src_grads(ctx, ret))),
  (UPat(Ops.AFTER, name="ret"), lambda ctx, ret: after_grads(ctx, ret)),
])

NO_GRADIENT = GroupOp.Comparison | {Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.BITCAST, Ops.THREEFRY, Ops.DETACH}


LEAVES = frozenset({Ops.BUFFER, Ops.BUFFER_VIEW, Ops.CONST, Ops.DEVICE, Ops.UNIQUE, Ops.BIND, Ops.DEFINE_VAR, Ops.PARAM})


def _backward(topo: list[UOp], root: UOp, root_grad: UOp, on_path: dict[UOp, bool], stops: frozenset[UOp] = frozenset()) -> dict[UOp, UOp]:
  """Reverse-mode sweep over `topo` (root last): each node's gradient, the sum over its consumers' rules. A node in
  `stops` keeps its gradient and passes none on (it is treated as a leaf)."""
  grads: dict[UOp, UOp] = {root: root_grad}
  for n in reversed(topo):
    if (g := grads.get(n)) is None or not on_path[n] or not n.src or n in stops: continue
    if n.op in NO_GRADIENT or n.op in LEAVES: continue
    src_grads = pm_gradient.apply(n, g)
    if src_grads is None: raise RuntimeError(f"no gradient rule for {n.op} (dtype {n.dtype}, shape {n.shape})")
    for s, sg in zip(n.src, src_grads):
      if sg is None or not on_path.get(s, False): continue
      if sg.shape != s.shape: raise RuntimeError(f"gradient rule for {n.op} gave shape {sg.shape} for a source of shape {s.shape}")
      grads[s] = sg if s not in grads else grads[s] + sg
  return grads


def _above(parts: tuple[UOp, ...], nodes: frozenset[UOp]) -> bool:
  """Whether any of `nodes` (other than `parts` themselves) is computed from one of `parts`."""
  return any(p is not n and p in n.toposort() for n in nodes for p in parts)


def _own_grads(topo: list[UOp], root: UOp, root_grad: UOp, on_path: dict[UOp, bool], multis: list[UOp],
               grads: dict[UOp, UOp]) -> dict[UOp, UOp | None]:
  """The gradient of each multi-device target's per-device parts counting only that part's own uses: where one part
  is made from another (`x.to(devices)` copies the replica on the first device to the others), the full sweep's
  `grads` of the first also holds the copy's gradient, so a sweep that stops at the parts gives theirs. One sweep
  serves every target whose parts nothing else stopped at is computed from; the others get one each."""
  chained = [m for m in multis if _above(m.src, frozenset(m.src))]
  stops = frozenset(s for m in chained for s in m.src)
  alone = [m for m in chained if _above(m.src, stops - set(m.src))]
  shared = _backward(topo, root, root_grad, on_path, stops - {s for m in alone for s in m.src}) if len(alone) < len(chained) else {}
  own: dict[UOp, UOp | None] = dict(grads)
  for m in chained:
    swept = _backward(topo, root, root_grad, on_path, frozenset(m.src)) if m in alone else shared
    own.update({s: swept[s] for s in m.src if s in swept})
    own.update({s: None for s in m.src if s not in swept})
  return own


def compute_gradient(root: UOp, root_grad: UOp, targets: list[UOp]) -> dict[UOp, UOp]:
  """Gradients of `root` (seeded with `root_grad`) with respect to each node in `targets` that `root` depends on.
  A multi-device target's gradient is assembled from those of its per-device parts (the graph uses those), each part
  counted for its own uses (`_own_grads`): a replicated tensor's gradient is then the sum of every use once."""
  multis = [t for t in targets if t.op is Ops.MULTI]
  targets = list(dict.fromkeys([s for t in targets for s in (t.src if t.op is Ops.MULTI else (t,))]))
  tset = set(targets)
  topo = list(root.toposort(gate=lambda u: u.op not in NO_GRADIENT))
  on_path: dict[UOp, bool] = {}
  for n in topo: on_path[n] = n in tset or (n.op not in NO_GRADIENT and any(on_path.get(s, False) for s in n.src))
  grads = _backward(topo, root, root_grad, on_path)
  out = {t: grads[t] for t in targets if t in grads}
  own = _own_grads(topo, root, root_grad, on_path, multis, grads)
  for m in multis:
    if any(own.get(s) is not None for s in m.src): out[m] = target_grad(m, [own.get(s) for s in m.src])
  return out
