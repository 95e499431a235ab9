"""Data-parallel work across processes and hosts on MPI (mpi4py over the system's Open MPI; extra `plugrad[mpi]`).

`init()` joins the MPI job the process was started in (`mpirun -np N python ...`; a plain `python ...` is a job of
one). `rank()` / `world_size()` say where this process is. The collectives take Tensors on any device, including
multi-device tensors (docs/distributed.md):

- `allreduce_(t, op)` reduces a realized tensor in place across all ranks; `allreduce(t, op)` returns the result in a
  new buffer on t's device. Host memory that MPI can read directly (CPU buffers) is handed to MPI as it is; other
  devices stage through a host buffer of at most PLUGRAD_MPI_CHUNK_BYTES (default 16 MiB) at a time, so a large
  tensor never needs a second full copy in host memory.
- `broadcast_(t, root)` / `broadcast(t, root)`: every rank gets root's values.
- `allgather(t)`: a tensor of shape (world_size, *t.shape) holding every rank's t, on t's device.

A sharded multi-device tensor reduces each shard independently (MPI between hosts, the shards stay where they are);
a replicated one reduces its first replica and copies the result to the others.

Every collective first meets the other ranks in a non-blocking barrier polled against PLUGRAD_MPI_TIMEOUT seconds
(default 300): a rank that died or stopped calling collectives makes the others raise `DistributedTimeoutError`
naming the operation, instead of hanging forever. Once all ranks are there the data moves with MPI's blocking
collective (its best algorithms; the non-blocking ones were 3x slower on 64 MB). A rank that dies during the transfer
itself is Open MPI's to handle: mpirun ends the whole job.
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from plugrad.engine.realize import buffer_for
from plugrad.uop.buffers import contiguous_range, is_buffer_view
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops

__all__ = ["init", "is_initialized", "rank", "world_size", "barrier", "allreduce", "allreduce_", "broadcast", "broadcast_",
           "allgather", "DistributedError", "DistributedTimeoutError"]

CHUNK_BYTES = 16 << 20
_OPS = ("sum", "max", "min", "prod")


class DistributedError(RuntimeError):
  """MPI is missing or not initialized, or a collective was given bad input."""


class DistributedTimeoutError(DistributedError):
  """A collective did not complete within PLUGRAD_MPI_TIMEOUT seconds (another rank died or stopped participating)."""


_state: dict[str, Any] = {}


def init() -> tuple[int, int]:
  """Initialize MPI from the environment mpirun set up (idempotent); returns (rank, world_size)."""
  if "comm" not in _state:
    try:
      from mpi4py import MPI  # optional dependency: pip install plugrad[mpi] (and Open MPI: apt install openmpi-bin)
    except ImportError as e:
      raise DistributedError(f"plugrad.distributed needs mpi4py over an MPI library: pip install 'plugrad[mpi]' and "
                             f"apt install openmpi-bin libopenmpi-dev ({e})") from None
    _state["MPI"], _state["comm"] = MPI, MPI.COMM_WORLD
  c = _state["comm"]
  return c.Get_rank(), c.Get_size()


def is_initialized() -> bool: return "comm" in _state


def _comm() -> Any:
  if "comm" not in _state: raise DistributedError("plugrad.distributed is not initialized: call plugrad.distributed.init() first")
  return _state["comm"]


def rank() -> int: return _comm().Get_rank()
def world_size() -> int: return _comm().Get_size()


def _timeout() -> float:
  v = os.environ.get("PLUGRAD_MPI_TIMEOUT", "300")
  try: t = float(v)
  except ValueError: raise DistributedError(f"PLUGRAD_MPI_TIMEOUT must be a number of seconds, got {v!r}") from None
  if t <= 0: raise DistributedError(f"PLUGRAD_MPI_TIMEOUT must be positive, got {v!r}")
  return t


def _chunk_bytes() -> int:
  v = int(os.environ.get("PLUGRAD_MPI_CHUNK_BYTES", CHUNK_BYTES))
  if v < 64: raise DistributedError(f"PLUGRAD_MPI_CHUNK_BYTES must be at least 64, got {v}")
  return v


def _wait(req: Any, what: str) -> None:
  """Poll a request until it completes, or raise after the timeout (the job is then unusable: abort it)."""
  deadline, n = time.monotonic() + _timeout(), 0
  while not req.Test():
    n += 1
    if n & 1023 == 0 and time.monotonic() > deadline:
      raise DistributedTimeoutError(f"rank {rank()}/{world_size()}: {what} did not complete within {_timeout():g} s "
                                    f"(PLUGRAD_MPI_TIMEOUT): another rank died or stopped calling collectives")


def barrier() -> None:
  """Wait until every rank gets here (with the timeout)."""
  _wait(_comm().Ibarrier(), "barrier")


def _mpi_op(op: str) -> Any:
  if op not in _OPS: raise DistributedError(f"allreduce op must be one of {_OPS}, got {op!r}")
  MPI = _state["MPI"]
  return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op]


def _mpi_type(t: Tensor) -> Any:
  if t.dtype.np is None: raise DistributedError(f"MPI collectives need a dtype numpy has, got {t.dtype}")
  typ = _state["MPI"]._typedict.get(np.dtype(t.dtype.np).char)  # a predefined MPI type (reductions need one)
  if typ is None: raise DistributedError(f"MPI has no predefined datatype for {t.dtype}")
  return typ


def _own_buffer(t: Tensor) -> Any:
  """The Buffer holding exactly t (realized, contiguous, whole): made so if needed (t then points at a new buffer)."""
  t.realize()
  if not (is_buffer_view(t.uop) and contiguous_range(t.uop)[2] is t.uop): t.replace(t.contiguous().realize())
  base, off, _ = contiguous_range(t.uop)
  buf = buffer_for(base)
  return buf if off == 0 and buf.size == t.numel() else buf.view(t.numel(), t.dtype, off * t.dtype.itemsize).ensure_allocated()


def _host_memory(buf: Any) -> memoryview | None:
  """The buffer's memory as a writable host memoryview when MPI can use it directly (CPU: numpy-backed memory)."""
  opaque = buf.ensure_allocated()._buf
  if isinstance(opaque, np.ndarray) and opaque.flags.c_contiguous and opaque.flags.writeable: return memoryview(opaque).cast("B")
  mv = buf.allocator.as_host(opaque)
  return mv if mv is not None and not mv.readonly else None


def _meet(what: str) -> None:
  """All ranks reach the collective `what` (or DistributedTimeoutError)."""
  _wait(_comm().Ibarrier(), what)


def _in_place(t: Tensor, what: str, run) -> None:
  """Run a per-chunk in-place blocking collective `run(memoryview, count, mpi_type)` over t's bytes."""
  buf, typ = _own_buffer(t), _mpi_type(t)
  item = t.dtype.itemsize
  _meet(what)
  if (mv := _host_memory(buf)) is not None:
    run(mv, buf.size, typ)
    return
  step = max(1, _chunk_bytes() // item)
  stage = np.empty(min(step, buf.size) * item, np.uint8)
  for lo in range(0, buf.size, step):  # one chunk of host memory at a time: no second full copy
    n = min(step, buf.size - lo)
    part = buf.view(n, t.dtype, lo * item)
    mv = memoryview(stage)[:n * item]
    part.copyout(mv)
    run(mv, n, typ)
    part.copyin(mv)


def _for_each_shard(t: Tensor, fn) -> None:
  """fn(single-device tensor) on each shard of a sharded tensor, on the first replica of a replicated one (the others
  take its result), or on t itself."""
  if t.uop.op is not Ops.MULTI:
    fn(t)
    return
  shards = t.shards
  if t.uop.arg is not None:
    for s in shards: fn(s)
  else:
    fn(shards[0])
    for s in shards[1:]: s.assign(shards[0].to(s.device)).realize()
  t.uop = t.uop.replace(src=tuple(s.uop for s in shards))


def allreduce_(t: Tensor, op: str = "sum") -> Tensor:
  """Reduce `t` across all ranks in place (sum, max, min or prod) and return it."""
  comm, mop = _comm(), _mpi_op(op)
  IN_PLACE = _state["MPI"].IN_PLACE
  _for_each_shard(t, lambda s: _in_place(s, f"allreduce({op}) of {s.shape} {s.dtype.name}",
                                         lambda mv, n, typ: comm.Allreduce(IN_PLACE, [mv, n, typ], mop)))
  return t


def allreduce(t: Tensor, op: str = "sum") -> Tensor:
  """`t` reduced across all ranks, in a new buffer on t's device(s)."""
  return allreduce_(t.contiguous() if t.uop.op is not Ops.MULTI else Tensor(t.uop.replace(src=tuple(s.contiguous().uop for s in t.shards))), op)


def broadcast_(t: Tensor, root: int = 0) -> Tensor:
  """Overwrite `t` on every rank with root's values, in place, and return it."""
  comm = _comm()
  if not isinstance(root, int) or not 0 <= root < comm.Get_size():
    raise DistributedError(f"broadcast root {root!r} is not a rank of {comm.Get_size()}")
  _for_each_shard(t, lambda s: _in_place(s, f"broadcast from rank {root} of {s.shape} {s.dtype.name}",
                                         lambda mv, n, typ: comm.Bcast([mv, n, typ], root)))
  return t


def broadcast(t: Tensor, root: int = 0) -> Tensor:
  """Root's `t` on every rank, in a new buffer on t's device."""
  return broadcast_(t.contiguous(), root)


def allgather(t: Tensor) -> Tensor:
  """Every rank's `t` stacked on a new leading axis (rank order), on t's device. Shapes and dtypes must match."""
  comm = _comm()
  if t.uop.op is Ops.MULTI: t = t.to(t.device[0])
  _meet(f"allgather of {t.shape} {t.dtype.name}")
  shapes = comm.allgather((tuple(t.shape), t.dtype.name))  # small metadata exchange, then the data
  if any(s != shapes[0] for s in shapes):
    raise DistributedError(f"allgather needs the same shape and dtype on every rank, got {dict(enumerate(shapes))}")
  buf, typ = _own_buffer(t), _mpi_type(t)
  host = _host_memory(buf)
  src = host if host is not None else buf.copyout()
  out = np.empty((comm.Get_size(), *t.shape), t.dtype.np)
  comm.Allgather([src, buf.size, typ], [memoryview(out).cast("B"), buf.size, typ])
  return Tensor(out, device=t.device)
