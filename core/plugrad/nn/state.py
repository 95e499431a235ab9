"""State dicts: find a model's tensors by walking its attributes, and load named tensors back into them in place.

`get_state_dict` walks objects (their `__dict__`), namedtuples, dicts, lists and tuples and names each Tensor by its
dotted path ("layers.0.weight"), like tinygrad and torch. `load_state_dict` writes the values into the model's existing
tensors (realized ones are assigned in place), so an optimizer that holds those tensors keeps working.
"""
from __future__ import annotations

import types
from typing import Any, NamedTuple

import numpy as np

from plugrad.uop.buffers import is_buffer_view
from plugrad.uop.shape import device_of
from plugrad.schedule.multi import bounds_of, devices_of, multi
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
  """{dotted name: tensor} for every tensor reachable from obj through attributes, dicts, lists and tuples."""
  out: dict[str, Tensor] = {}
  _walk(obj, prefix, tensor_type, out, set())
  return out


def _walk(obj: Any, prefix: str, tensor_type: type, out: dict, path: set[int]) -> None:
  if isinstance(obj, tensor_type):
    out[prefix.strip(".")] = obj
    return
  if obj is None or isinstance(obj, (str, bytes, int, float, complex, types.ModuleType, type, np.ndarray)): return
  if id(obj) in path: return  # a reference cycle
  path.add(oid := id(obj))
  if hasattr(obj, "_asdict"): obj = obj._asdict()  # namedtuple
  elif not isinstance(obj, (dict, list, tuple)) and hasattr(obj, "__dict__"): obj = vars(obj)
  if isinstance(obj, dict):
    for k, v in obj.items(): _walk(v, f"{prefix}{k}.", tensor_type, out, path)
  elif isinstance(obj, (list, tuple)):
    for i, v in enumerate(obj): _walk(v, f"{prefix}{i}.", tensor_type, out, path)
  path.discard(oid)


def get_parameters(obj: Any) -> list[Tensor]:
  """Every distinct tensor reachable from obj (a tensor shared by several attributes is listed once), in walk order."""
  return list({id(t): t for t in get_state_dict(obj).values()}.values())


class LoadResult(NamedTuple):
  missing_keys: list[str]
  unexpected_keys: list[str]


def _load_multi(v: Tensor, src: Tensor) -> None:
  """Write `src` into multi-device `v` shard by shard: src is split like v first, so each device copies only its rows."""
  m = v.uop
  bounds = bounds_of(m)
  val = src.shard(devices_of(m), m.arg, None if bounds is None else [e - b for b, e in bounds]) if src.uop.op is not Ops.MULTI else src
  if not all(is_buffer_view(s) or s.op is Ops.ASSIGN for s in m.src):  # lazy shards: fresh buffers of the shard shapes
    v.uop = multi([Tensor.empty(*s.shape, dtype=v.dtype, device=device_of(s)).uop for s in m.src], m.arg)
  v.assign(val)


def load_state_dict(model: Any, state_dict: dict[str, Any], strict: bool = True, consume: bool = False, verbose: bool = False,
                    realize: bool = True) -> LoadResult:
  """Copy state_dict's tensors into model's tensors of the same name. strict: every model key must be present and no
  extra key allowed (RuntimeError listing them). Shapes (ValueError) and dtypes (TypeError) must match exactly; all
  checks run before anything is written. consume: delete loaded keys from state_dict. Returns the missing/unexpected keys."""
  model_sd = get_state_dict(model)
  missing = [k for k in model_sd if k not in state_dict]
  unexpected = [k for k in state_dict if k not in model_sd]
  if strict and (missing or unexpected):
    msg = [f"Missing key(s): {', '.join(missing)}."] if missing else []
    msg += [f"Unexpected key(s): {', '.join(unexpected)}."] if unexpected else []
    raise RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__}: " + " ".join(msg))
  plan: list[tuple[str, Tensor, Tensor]] = []
  for k, v in model_sd.items():
    if k not in state_dict: continue
    src = state_dict[k] if isinstance(state_dict[k], Tensor) else Tensor(state_dict[k], device=v.device)
    if tuple(src.shape) != tuple(v.shape):
      raise ValueError(f"load_state_dict: shape mismatch for {k!r}: the model has {tuple(v.shape)}, the state dict {tuple(src.shape)}")
    if src.dtype != v.dtype:
      raise TypeError(f"load_state_dict: dtype mismatch for {k!r}: the model has {v.dtype}, the state dict {src.dtype}")
    plan.append((k, v, src))
  written: list[Tensor] = []
  for k, v, src in plan:
    if src is not v and src.uop is not v.uop:
      if v.uop.op is Ops.MULTI:  # sharded weights: each device loads only its shard (from DISK: its byte range)
        _load_multi(v, src)
        written.append(v)
        if consume: del state_dict[k]
        continue
      if not is_buffer_view(v.uop) and v.uop.op is not Ops.ASSIGN:  # lazy (e.g. random init): give it its own buffer first
        v.uop = Tensor.empty(*v.shape, dtype=v.dtype, device=v.device).uop
      v.assign(src.to(v.device))
      written.append(v)
    if consume: del state_dict[k]
  if realize: Tensor.realize_all(*written)
  if verbose: print(f"load_state_dict: loaded {len(plan)} tensors, {len(missing)} missing, {len(unexpected)} unexpected")
  return LoadResult(missing, unexpected)

from plugrad.nn.serialize import gguf_load, safe_load, safe_load_metadata, safe_save  # noqa: F401  (file formats live in serialize.py)
