"""`@function`: trace a Python function of Tensors into CALL nodes whose bodies use PARAM placeholders.

Calling a decorated function traces it on placeholder tensors (one PARAM per distinct input tensor, with its shape,
dtype and device) and returns tensors that are `CALL(body, *inputs, arg=qualname)`. Tensors the function uses
without taking them as arguments (closures, `self.w`) are captured in the body as they are, realized or not. The
scheduler and autograd inline calls (`inline_calls`), so equal bodies on new inputs hit the schedule cache, and
gradients flow to explicit and captured tensors alike. A multi-device input is traced as a MULTI of per-device PARAMs
(shard shapes), and a multi-device result is one CALL per device (schedule/multi.py).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from plugrad.engine.inline import inline_calls, pm_inline  # noqa: F401  (re-exported: their historical home)
from plugrad.tensor import Tensor
from plugrad.uop.shape import device_of
from plugrad.uop.ops import Ops, UOp

F = TypeVar("F", bound=Callable[..., Any])


def _param(i: int, u: UOp) -> UOp:
  return UOp(Ops.PARAM, u.dtype, (UOp(Ops.DEVICE, arg=device_of(u)),), arg=("fn", i, tuple(u.shape)))


def _per_device(u: UOp) -> tuple[UOp, ...]: return u.src if u.op is Ops.MULTI else (u,)


def _tensor_args(args: tuple, kwargs: dict) -> list:
  out: list = []
  def walk(x: Any) -> None:
    if isinstance(x, Tensor): out.append(x)
    elif isinstance(x, (list, tuple)):
      for v in x: walk(v)
    elif isinstance(x, dict):
      for v in x.values(): walk(v)
  walk(args)
  walk(kwargs)
  return out


def function(fn: F) -> F:
  """Decorate a function, method or callable of Tensors; see the module docstring."""
  if not callable(fn): raise TypeError(f"@function needs a callable, got {type(fn).__name__}")
  name = getattr(fn, "__qualname__", None) or f"{type(fn).__qualname__}.__call__"

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    inputs = _tensor_args(args, kwargs)
    distinct: dict[UOp, int] = {}
    for t in inputs:  # duplicate inputs share one PARAM; a multi-device input has one PARAM per device (its shard)
      for u in _per_device(t.uop): distinct.setdefault(u, len(distinct))
    placeholders = {t.uop: Tensor(_param(distinct[t.uop], t.uop)) if t.uop.op is not Ops.MULTI else
                    Tensor(t.uop.replace(src=tuple(_param(distinct[u], u) for u in t.uop.src))) for t in inputs}
    def swap(x: Any) -> Any:
      if isinstance(x, Tensor): return placeholders[x.uop]
      if isinstance(x, (list, tuple)): return type(x)(swap(v) for v in x)
      if isinstance(x, dict): return {k: swap(v) for k, v in x.items()}
      return x
    ret = fn(*swap(args), **swap(kwargs))
    srcs = tuple(distinct)
    def call(x: Any) -> Any:
      if isinstance(x, Tensor):  # a multi-device result: one CALL per device, over that device's part of the body
        if x.uop.op is Ops.MULTI: return Tensor(x.uop.replace(src=tuple(UOp(Ops.CALL, u.dtype, (u, *srcs), arg=name) for u in x.uop.src)))
        return Tensor(UOp(Ops.CALL, x.dtype, (x.uop, *srcs), arg=name))
      if isinstance(x, (list, tuple)): return type(x)(call(v) for v in x)
      if isinstance(x, dict): return {k: call(v) for k, v in x.items()}
      if x is None: return None
      raise TypeError(f"@function {name} must return Tensors (or lists/tuples/dicts of them), got {type(x).__name__}")
    return call(ret)

  wrapper.__plugrad_function__ = name  # type: ignore[attr-defined]
  return wrapper  # type: ignore[return-value]
