"""Run under mpirun by test_distributed.py: every collective on CPU, PYTHON (host-staged, chunked) and multi-device
tensors, checked against numpy on what each rank contributed. Prints 'rank R ok' at the end."""
import os
import sys

import numpy as np

from plugrad import Tensor, distributed

rank, world = distributed.init()
assert (distributed.rank(), distributed.world_size()) == (rank, world)
mode = sys.argv[1] if len(sys.argv) > 1 else "collectives"
if mode == "hang":  # rank 1 stops taking part: rank 0 must time out with a clear error, not hang
  if rank == 1:
    import time
    time.sleep(30)
    sys.exit(0)
  try: distributed.allreduce_(Tensor(np.ones(4, np.float32)).realize())
  except distributed.DistributedTimeoutError as e:
    print(f"timed out: {e}", flush=True)
    os._exit(3)
  sys.exit(0)
if mode == "die":  # rank 1 dies before the collective: mpirun must end the job (no rank left waiting forever)
  if rank == 1: os._exit(7)
  distributed.allreduce_(Tensor(np.ones(4, np.float32)).realize())
  print("rank 0 finished an allreduce without rank 1", flush=True)
  sys.exit(0)

def contrib(r: int, shape=(5, 7)) -> np.ndarray: return np.random.default_rng(r).standard_normal(shape).astype(np.float32)
everyone = [contrib(r) for r in range(world)]
for dev in ("CPU", "PYTHON"):
  t = Tensor(contrib(rank), device=dev).realize()
  assert distributed.allreduce_(t) is t and np.allclose(t.numpy(), sum(everyone), atol=1e-5), dev
  assert np.array_equal(distributed.allreduce(Tensor(contrib(rank), device=dev) * 1, "max").numpy(), np.maximum.reduce(everyone))
  assert np.array_equal(distributed.allreduce(Tensor(contrib(rank), device=dev), "min").numpy(), np.minimum.reduce(everyone))
  b = distributed.broadcast(Tensor(contrib(rank), device=dev), root=world - 1)
  assert np.array_equal(b.numpy(), everyone[-1]) and b.device == dev
  g = distributed.allgather(Tensor(contrib(rank), device=dev))
  assert g.shape == (world, 5, 7) and np.array_equal(g.numpy(), np.stack(everyone))
# a tensor bigger than the staging chunk: reduced piece by piece
os.environ["PLUGRAD_MPI_CHUNK_BYTES"] = "4096"
big = [contrib(r, (3000,)) for r in range(world)]
t = Tensor(big[rank], device="PYTHON").realize()
assert np.allclose(distributed.allreduce_(t).numpy(), sum(big), atol=1e-5)
# a view of a bigger buffer: only its rows are reduced, the rest of the buffer is untouched
base = Tensor(np.arange(12, dtype=np.int32).reshape(4, 3) + rank).realize()
v = distributed.allreduce(base[1:3])
assert np.array_equal(v.numpy(), sum(np.arange(12, dtype=np.int32).reshape(4, 3)[1:3] + r for r in range(world)))
assert np.array_equal(base.numpy(), np.arange(12, dtype=np.int32).reshape(4, 3) + rank)
# multi-device tensors: shards reduce independently, replicas stay equal
for axis in (None, 0, 1):
  m = Tensor(contrib(rank)).shard(("CPU:0", "CPU:1"), axis=axis).realize()
  distributed.allreduce_(m)
  assert m.device == ("CPU", "CPU:1") and m.shard_axis == axis and np.allclose(m.numpy(), sum(everyone), atol=1e-5), axis
  for s in m.shards: assert np.allclose(s.numpy(), sum(everyone) if axis is None else s.numpy(), atol=1e-5)
try:
  distributed.allreduce_(Tensor([1.0]).realize(), "mean")
  raise AssertionError("bad op accepted")
except distributed.DistributedError as e: assert "op must be one of" in str(e)
try:
  distributed.allgather(Tensor(np.zeros(rank + 1, np.float32)))
  raise AssertionError("mismatched shapes accepted")
except distributed.DistributedError as e: assert "same shape" in str(e)
distributed.barrier()
print(f"rank {rank} ok", flush=True)
