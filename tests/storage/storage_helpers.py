"""Shared helpers for the storage tests: random valid quantized blocks for every ggml type."""
from __future__ import annotations
import select
import subprocess
import sys
import numpy as np

# ggml type name -> (ggml id, block elements, block bytes, byte offsets of its float16 fields)
QTYPES = {"Q4_0": (2, 32, 18, (0,)), "Q4_1": (3, 32, 20, (0, 2)), "Q5_0": (6, 32, 22, (0,)), "Q5_1": (7, 32, 24, (0, 2)),
          "Q8_0": (8, 32, 34, (0,)), "Q2_K": (10, 256, 84, (80, 82)), "Q3_K": (11, 256, 110, (108,)),
          "Q4_K": (12, 256, 144, (0, 2)), "Q5_K": (13, 256, 176, (0, 2)), "Q6_K": (14, 256, 210, (208,))}

def random_blocks(qtype: str, n_blocks: int, seed: int = 0) -> np.ndarray:
  """uint8 (n_blocks, block bytes): random quant bits and finite random float16 scales."""
  _, _, tsize, f16s = QTYPES[qtype]
  rng = np.random.default_rng(seed)
  b = rng.integers(0, 256, (n_blocks, tsize), dtype=np.uint8)
  for off in f16s: b[:, off:off + 2] = rng.uniform(-2, 2, n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
  return b

def start_tinyfs(root, preexec_fn=None, args=()):
  """A tinyfs server process on a free loopback port (with extra command-line `args`): (Popen, "HOST:PORT")."""
  p = subprocess.Popen([sys.executable, "-m", "plugrad_tinyfs.server", "--host", "127.0.0.1", "--port", "0", "--root", str(root), *args],
                       stdout=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
  if not select.select([p.stdout], [], [], 20)[0]:
    p.kill()
    raise RuntimeError("tinyfs server did not start within 20 s")
  line = p.stdout.readline().strip()
  assert line.startswith("tinyfs listening on "), line
  return p, line.rsplit(" ", 1)[1]

def stop_tinyfs(p) -> None:
  p.kill()
  p.wait(10)
  p.stdout.close()
