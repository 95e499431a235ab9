"""Autograd: one derivative rule per tensor-level op, applied in reverse topological order.

`pm_gradient` maps a node `ret` and the gradient flowing into it (`ctx`, a Tensor of ret's shape) to one
gradient per source (None where a source gets none). Every composite Tensor op is built from these primitives,
so this is the whole of autograd. Rules are written with Tensor ops, so gradients are lazy graphs that fuse
like any other computation.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from plugrad.dtype import dtypes, sum_acc_dtype
from plugrad.schedule.multi import src_grads, target_grad
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.upat import PatternMatcher, UPat

if TYPE_CHECKING:
  from plugrad.tensor import Tensor


def _T(u: UOp) -> Tensor:
  from plugrad.tensor import Tensor
  return Tensor(u)


def _src(ret: UOp, i: int = 0) -> Tensor: return _T(ret.src[i])


def _unexpand(g: Tensor, shape: tuple) -> Tensor:
  """Sum g over the axes where `shape` has 1 and g does not (the adjoint of EXPAND)."""
  axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a == 1 and b != 1)
  if not axes: return g
  acc = sum_acc_dtype(g.dtype)  # float16 gradients (a half matmul's backward) accumulate in float32, as the forward does
  return g.cast(acc)._reduce(Ops.ADD, axes, keepdim=True).cast(g.dtype) if acc != g.dtype else g._reduce(Ops.ADD, axes, keepdim=True)


def _max_grad(g: Tensor, a: Tensor, b: Tensor) -> Tensor:
  """d max(a, b) / da: 1 where a wins, 0.5 on ties, 0 where b wins."""
  return g * (a > b).where(1.0, (a == b).where(0.5, 0.0)).cast(g.dtype)


def _reduce_max_grad(g: Tensor, ret: UOp) -> Tensor:
  x, m = _src(ret), _T(ret)
  mask = (x == m._expand_to(x.shape)).cast(g.dtype)
  count = mask._reduce(Ops.ADD, ret.arg[1], keepdim=True)
  return mask * (g / count)._expand_to(x.shape)  # ties share the gradient evenly


def _reduce_grad(g: Tensor, ret: UOp) -> Tensor | None:
  op, x = ret.arg[0], _src(ret)
  if op is Ops.ADD: return g._expand_to(x.shape)
  if op is Ops.MAX: return _reduce_max_grad(g, ret)
  if op is Ops.MUL:  # product of the other elements: exact with zeros (one zero: only it gets a gradient; two: none do)
    axes = ret.arg[1]
    nz = x == 0
    p = nz.where(1.0, x)._reduce(Ops.MUL, axes, keepdim=True)._expand_to(x.shape)
    c = nz.cast(g.dtype)._reduce(Ops.ADD, axes, keepdim=True)._expand_to(x.shape)
    ge = g._expand_to(x.shape)
    return ge * nz.where((c == 1).where(p, 0.0), (c == 0).where(p / nz.where(1.0, x), 0.0))
  return None


def _pad_grad(g: Tensor, ret: UOp) -> Tensor:
  return g.shrink(tuple((b, b + s) for (b, _), s in zip(ret.arg, ret.src[0].shape)))


def _shrink_grad(g: Tensor, ret: UOp) -> Tensor:
  return g._pad(tuple((b, s - e) for (b, e), s in zip(ret.arg, ret.src[0].shape)))


def _permute_grad(g: Tensor, ret: UOp) -> Tensor:
  inv = [0] * len(ret.arg)
  for i, o in enumerate(ret.arg): inv[o] = i
  return g.permute(tuple(inv))


def _float(ret: UOp) -> bool: return dtypes.is_float(ret.dtype)


pm_gradient = PatternMatcher([
  (UPat(Ops.ADD, name="ret"), lambda ctx, ret: (ctx, ctx)),
  (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ctx * _src(ret, 1), ctx * _src(ret, 0))),
  (UPat(Ops.NEG, name="ret"), lambda ctx, ret: (-ctx,)),
  (UPat(Ops.FDIV, name="ret"), lambda ctx, ret: (ctx / _src(ret, 1), -ctx * _T(ret) / _src(ret, 1))),
  (UPat(Ops.MAX, name="ret"), lambda ctx, ret: (_max_grad(ctx, _src(ret, 0), _src(ret, 1)), _max_grad(ctx, _src(ret, 1), _src(ret, 0)))
   if _float(ret) else None),
  (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ctx * _T(ret) * math.log(2),)),
  (UPat(Ops.LOG2, name="ret"), lambda ctx, ret: (ctx / (_src(ret) * math.log(2)),)),
  (UPat(Ops.SIN, name="ret"), lambda ctx, ret: (ctx * _src(ret).cos(),)),
  (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx / (_T(ret) * 2),)),
  (UPat(Ops.RECIPROCAL, name="ret"), lambda ctx, ret: (-ctx * _T(ret) * _T(ret),)),
  (UPat(Ops.POW, name="ret"), lambda ctx, ret: (ctx * _src(ret, 1) * _T(ret) / _src(ret, 0), ctx * _T(ret) * _src(ret, 0).log())),
  (UPat(Ops.WHERE, name="ret"), lambda ctx, ret: (None, _src(ret, 0).where(ctx, 0.0), _src(ret, 0).where(0.0, ctx))),
  (UPat(Ops.MULACC, name="ret"), lambda ctx, ret: (ctx * _src(ret, 1), ctx * _src(ret, 0), ctx)),
  (UPat(Ops.CAST, name="ret"), lambda ctx, ret: (ctx.cast(ret.src[0].dtype),) if dtypes.is_float(ret.src[0].dtype) else (None,)),
  (UPat(Ops.TRUNC, name="ret"), lambda ctx, ret: (ctx * 0,)),
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
  (UPat(Ops.COPY, name="ret"), lambda ctx, ret: (ctx.to(_src(ret).device), None)),
  (UPat(Ops.ASSIGN, name="ret"), lambda ctx, ret: (None, ctx)),
  # multi-device tensors: the logical gradient split per device (schedule/multi.py)
  (UPat(Ops.MULTI, name="ret"), lambda ctx, ret: tuple(None if g is None else _T(g) for g in src_grads(ctx.uop, ret))),
])

NO_GRADIENT = GroupOp.Comparison | {Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.BITCAST, Ops.THREEFRY, Ops.DETACH}


LEAVES = frozenset({Ops.BUFFER, Ops.BUFFER_VIEW, Ops.CONST, Ops.DEVICE, Ops.UNIQUE, Ops.BIND, Ops.DEFINE_VAR, Ops.PARAM})


def compute_gradient(root: UOp, root_grad: Tensor, targets: list[UOp]) -> dict[UOp, Tensor]:
  """Gradients of `root` (seeded with `root_grad`) with respect to each node in `targets` that `root` depends on.
  A multi-device target's gradient is assembled from those of its per-device nodes (the graph uses those)."""
  multis = [t for t in targets if t.op is Ops.MULTI]
  targets = list(dict.fromkeys([s for t in targets for s in (t.src if t.op is Ops.MULTI else (t,))]))
  tset = set(targets)
  topo = list(root.toposort(gate=lambda u: u.op not in NO_GRADIENT))
  on_path: dict[UOp, bool] = {}
  for n in topo: on_path[n] = n in tset or (n.op not in NO_GRADIENT and any(on_path.get(s, False) for s in n.src))
  grads: dict[UOp, Tensor] = {root: root_grad}
  for n in reversed(topo):
    if (g := grads.get(n)) is None or not on_path[n] or not n.src: continue
    if n.op in NO_GRADIENT or n.op in LEAVES: continue
    src_grads = pm_gradient.apply(n, g)
    if src_grads is None: raise RuntimeError(f"no gradient rule for {n.op} (dtype {n.dtype}, shape {n.shape})")
    for s, sg in zip(n.src, src_grads):
      if sg is None or not on_path.get(s, False): continue
      if sg.shape != s.shape: raise RuntimeError(f"gradient rule for {n.op} gave shape {sg.shape} for a source of shape {s.shape}")
      grads[s] = sg if s not in grads else grads[s] + sg
  out = {t: grads[t] for t in targets if t in grads}
  for m in multis:
    if any(s in out for s in m.src): out[m] = _T(target_grad(m, [out[s].uop if s in out else None for s in m.src]))
  return out
