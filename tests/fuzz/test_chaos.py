"""Chaos: kill -9 a process in the middle of safe_save at random moments; the file must always load as the old or the new
tensors, bit for bit, and the next save must leave no temporary files. PLUGRAD_CHAOS_ROUNDS sets the number of kills
(default 4; `make fuzz` runs 40). The tinyfs kill -9 tests are in tests/storage/test_tinyfs_reliability.py."""
from __future__ import annotations
import os
import random
import subprocess
import sys
import time
import numpy as np
from plugrad.nn.serialize import safe_load, safe_save
from plugrad.tensor import Tensor

ROUNDS = int(os.environ.get("PLUGRAD_CHAOS_ROUNDS", "4"))
N = 1 << 20  # 4 MiB of float32 per save: long enough to be killed mid-way

SAVER = """
import sys, numpy as np
from plugrad.nn.serialize import safe_save
from plugrad.tensor import Tensor
N = int(sys.argv[2])
for i in range(1000):  # alternate two contents, forever, until killed
  v = float(i % 2 + 1)
  safe_save({"w": Tensor(np.full(N, v, np.float32)), "i": Tensor(np.array([i % 2], np.int32))}, sys.argv[1])
  print(i, flush=True)
"""

def _content(path) -> float:
  """Which save's content the file holds (0 = the original), checking every byte."""
  ts = safe_load(path)
  w = ts["w"].to("CPU").numpy()
  if w.size == 4: assert (w == 0).all() and "i" not in ts; return 0.0
  v = float(w[0])
  assert w.size == N and (w == v).all() and v in (1.0, 2.0) and ts["i"].to("CPU").numpy().tolist() == [int(v) - 1]
  return v

def test_kill_9_during_safe_save(tmp_path):
  p = tmp_path / "m.safetensors"
  safe_save({"w": Tensor(np.zeros(4, np.float32))}, p)
  rng, seen, killed_mid_save = random.Random(0 if ROUNDS <= 4 else None), set(), 0
  for _ in range(ROUNDS):
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(p), str(N)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdout.readline()  # one save done: the interpreter and kernels are warm
    time.sleep(rng.uniform(0, 0.3))
    proc.kill()
    proc.wait(30)
    proc.stdout.close()
    seen.add(_content(p))
    killed_mid_save += any(f.endswith(".tmp") for f in os.listdir(tmp_path))
  assert seen <= {1.0, 2.0}
  print(f"{killed_mid_save} of {ROUNDS} kills landed mid-save")
  safe_save({"w": Tensor(np.zeros(4, np.float32))}, p)
  assert os.listdir(tmp_path) == ["m.safetensors"] and _content(p) == 0.0
