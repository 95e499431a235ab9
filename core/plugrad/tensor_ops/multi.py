"""Tensor ops mixin: multi-device tensors (tinygrad's API). `shard` splits or replicates a tensor over several devices,
`.to(devices)` replicates it; every other op works on the result as on one tensor (schedule/multi.py lowers it).

`t.device` of a multi-device tensor is the tuple of its devices; `t.shard_axis` is the split axis (None: replicated)
and `t.shard_bounds` the (start, end) rows of each device along it.
"""
from __future__ import annotations

from typing import Any, Sequence

from plugrad.device import canonicalize
from plugrad.schedule.multi import (MultiDeviceError, bounds_of, devices_of, even_bounds, multi, reshard, shard_uop,
                                    splits_to_bounds)
from plugrad.uop.ops import Ops


class MultiMixin:
  """Sharding methods of Tensor."""
  uop: Any

  def shard(self, devices: Sequence[str], axis: int | None = None, splits: Sequence[int] | None = None) -> Any:
    """This tensor over `devices`: replicated on each (axis=None), or split along `axis` into one shard per device,
    ceil(n/k) rows each (the last shards smaller when k doesn't divide n), or `splits` rows each (uneven)."""
    if isinstance(devices, str) or not isinstance(devices, (tuple, list)) or not devices:
      raise MultiDeviceError(f"shard needs a non-empty tuple of devices, got {devices!r}")
    devs = tuple(canonicalize(d) for d in devices)
    if len(set(devs)) != len(devs): raise MultiDeviceError(f"shard: devices {devs} repeat a device")
    ax = None if axis is None else self._axis(axis)  # type: ignore[attr-defined]
    if ax is None and splits is not None: raise MultiDeviceError("shard: splits= needs an axis")
    if ax is not None:
      n = self.shape[ax]  # type: ignore[attr-defined]
      if not isinstance(n, int): raise MultiDeviceError(f"shard: axis {axis} has a symbolic size {n}")
      bounds = splits_to_bounds(splits, n, len(devs)) if splits is not None else even_bounds(n, len(devs))
    else: bounds = None
    u = self.uop
    if u.op is Ops.MULTI:
      if devices_of(u) != devs: u = shard_uop(self.to(devs[0]).uop, devs, None)  # type: ignore[attr-defined]
      return type(self)(reshard(u, ax, bounds))
    return type(self)(shard_uop(u, devs, ax, bounds))

  def shard_(self, devices: Sequence[str], axis: int | None = None, splits: Sequence[int] | None = None) -> Any:
    """Shard this tensor in place (see shard)."""
    self.uop = self.shard(devices, axis, splits).uop
    return self

  @property
  def shard_axis(self) -> int | None:
    """The axis a multi-device tensor is split along (None when replicated); an error for a one-device tensor."""
    if self.uop.op is not Ops.MULTI: raise MultiDeviceError("shard_axis: this tensor is on one device")
    return self.uop.arg

  @property
  def shard_bounds(self) -> tuple[tuple[int, int], ...] | None:
    if self.uop.op is not Ops.MULTI: raise MultiDeviceError("shard_bounds: this tensor is on one device")
    return bounds_of(self.uop)

  @property
  def shards(self) -> list[Any]:
    """The per-device tensors of a multi-device tensor (a one-device tensor is its own only shard)."""
    return [type(self)(s) for s in self.uop.src] if self.uop.op is Ops.MULTI else [self]

  def _assign_multi(self, x: Any) -> Any:
    """assign for multi-device tensors: the value laid out like the target, then one assign per device."""
    u = self.uop
    if u.op is not Ops.MULTI: raise MultiDeviceError(f"assign: a value on {x.device} into a tensor on {self.device}")  # type: ignore[attr-defined]
    if x.shape != self.shape: x = x._expand_to(self.shape) if len(x.shape) <= len(self.shape) else x  # type: ignore[attr-defined]
    if x.dtype != self.dtype: raise TypeError(f"assign: value dtype {x.dtype} doesn't match the target dtype {self.dtype}")  # type: ignore[attr-defined]
    if x.shape != self.shape: raise MultiDeviceError(f"assign: value of shape {x.shape} doesn't match the target shape {self.shape}")  # type: ignore[attr-defined]
    v = x.uop if x.uop.op is Ops.MULTI else shard_uop(x.uop, devices_of(u), u.arg, bounds_of(u))
    if devices_of(v) != devices_of(u): raise MultiDeviceError(f"assign: value on {devices_of(v)} into a tensor on {devices_of(u)}")
    v = reshard(v, u.arg, bounds_of(u))
    T = type(self)
    self.uop = multi([T(t).assign(T(s)).uop for t, s in zip(u.src, v.src)], u.arg)
    return self
