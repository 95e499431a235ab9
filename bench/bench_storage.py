"""Storage benchmarks (issue 7), each against a peer measured in the same run:

  (a) safetensors: load a ~1 GB file written by the `safetensors` library (numpy API) with plugrad's `safe_load`, to the
      CPU device (`.to("CPU").realize()`) and to numpy (`.numpy()`), vs `safetensors.numpy.load_file`. The file was just
      written, so every reader gets it from the page cache; CPU buffers are really freed between repeats (no LRU reuse).
  (b) tinyfs on loopback: `Tensor.fs_store()` / `hash_tensor.fs_load(n)` of random bytes through a real server process,
      vs the hashlib root hash alone (the client and the server each hash everything once on a store; a load verifies).
  (c) Keccak-f[1600] in Tensor ops (`root_hash_device`, the whole tinyfs tree on the default device) vs hashlib's
      `root_hash_ref` on the same bytes, and where the device time goes (host block layout, kernel replay, per kernel).
  (d) Q4_K GEMV 8192x2048: gguf's dequantization fused into the one GEMV kernel (reads the quantized blocks), and the
      LLM's repacked layout (scales decoded at load), in GB/s vs the read bandwidth (numpy / plugrad sums, same run).

Run: .venv/bin/python bench/bench_storage.py [--gb 1.0] [--tinyfs-mib 64] [--keccak-mib 16 64] [--repeat 3] [--only a,b,c,d]
The last thing printed is one summary table.
"""
from __future__ import annotations

import argparse
import gc
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from plugrad.device import Device
from plugrad.tensor import Tensor

MB = 1e6


def timed(fn) -> tuple[float, object]:
  st = time.perf_counter()
  r = fn()
  return time.perf_counter() - st, r


def bench_safetensors(gb: float, repeat: int, tmp: str) -> list[tuple]:
  from safetensors.numpy import load_file, save_file
  from plugrad.nn.serialize import safe_load
  n32 = max(int(gb * 1e9 * 0.75 / 4 / 3), 1)  # three float32 tensors (75% of the bytes) and two float16 tensors
  n16 = max(int(gb * 1e9 * 0.25 / 2 / 2), 1)
  rng = np.random.default_rng(0)
  ts = {f"f32_{i}": np.frombuffer(rng.bytes(n32 * 4), np.float32) for i in range(3)}
  ts.update({f"f16_{i}": np.frombuffer(rng.bytes(n16 * 2), np.float16) for i in range(2)})
  path = os.path.join(tmp, "bench.safetensors")
  save_file(ts, path)
  size, nbytes = os.path.getsize(path), sum(v.nbytes for v in ts.values())
  print(f"(a) safetensors file: {size / 1e9:.3f} GB ({', '.join(f'{k} {v.dtype} {v.size}' for k, v in ts.items())})")
  cpu = Device["CPU"]

  def theirs(): return load_file(path)
  def ours_numpy(): return {k: v.numpy() for k, v in safe_load(path).items()}
  def ours_cpu():
    out = {k: v.to("CPU").realize() for k, v in safe_load(path).items()}
    cpu.synchronize()
    return out
  got = ours_numpy()  # correctness, bit for bit, once
  assert all(got[k].view(np.uint8).tobytes() == v.view(np.uint8).tobytes() for k, v in ts.items()), "safe_load bytes differ"
  assert ours_cpu()["f16_1"].numpy().view(np.uint8).tobytes() == ts["f16_1"].view(np.uint8).tobytes()
  del got, ts
  times: dict[str, list[float]] = {"safetensors.numpy.load_file": [], "plugrad safe_load -> .numpy()": [],
                                   "plugrad safe_load -> .to('CPU').realize()": []}
  for _ in range(repeat):  # interleaved, so the noise of this shared machine hits all three alike
    for name, fn in zip(times, (theirs, ours_numpy, ours_cpu)):
      gc.collect()
      cpu.allocator.free_cache()
      dt, r = timed(fn)
      times[name].append(dt)
      del r
  os.remove(path)
  peer = min(times["safetensors.numpy.load_file"])
  rows = []
  for name, ts_ in times.items():
    best, med = min(ts_), statistics.median(ts_)
    print(f"  {name:44s} best {nbytes / best / 1e9:6.2f} GB/s  median {nbytes / med / 1e9:6.2f} GB/s  ({best * 1e3:.0f} ms)")
    rows.append((f"safetensors {size / 1e9:.2f} GB load", name, f"{nbytes / best / 1e9:.2f} GB/s", "peer" if best == peer else f"{peer / best:.2f}x"))
  return rows


def q4k_blocks(n_blocks: int, seed: int = 0) -> np.ndarray:
  """Random valid Q4_K blocks (144 bytes per 256 weights): random quant and scale bits, finite float16 d and dmin."""
  rng = np.random.default_rng(seed)
  b = rng.integers(0, 256, (n_blocks, 144), dtype=np.uint8)
  for off in (0, 2): b[:, off:off + 2] = rng.uniform(-2, 2, n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
  return b


def bench_q4k_gemv(rows: int, cols: int, repeat: int) -> list[tuple]:
  """y = W @ x with W Q4_K-quantized (rows, cols), dequantization fused into the one GEMV kernel, against the read
  bandwidth of the same machine in the same run (numpy and plugrad summing 256 MiB)."""
  from plugrad.engine.realize import GlobalCounters
  from plugrad.nn.serialize import dequantize
  blocks = q4k_blocks(rows * cols // 256, seed=7)
  w = Tensor(blocks).realize()
  x = Tensor(np.random.default_rng(1).standard_normal(cols).astype(np.float32)).realize()
  def gemv(): return (dequantize(w, "Q4_K").reshape(rows, cols) @ x).realize()
  from plugrad.apps.llm.model import repack   # the LLM's layout: scales decoded once at load, nibbles kept
  wr = Tensor(repack(dequantize(w, "Q4_K").reshape(rows, cols).uop))
  wr_bytes = rows * cols // 2 + rows * cols // 32 * 8
  def gemv_repacked(): return (wr @ x).realize()
  np.testing.assert_allclose(gemv_repacked().numpy(), gemv().numpy(), rtol=1e-3, atol=1e-2)
  gemv()
  k0 = GlobalCounters["kernels"]
  gemv()
  n_kernels = GlobalCounters["kernels"] - k0
  big = np.ones(64 << 20, np.float32)
  tbig = Tensor(big).realize()
  t_gemv, t_rep, t_np, t_pg = [], [], [], []
  for _ in range(max(repeat, 5)):   # interleaved with the bandwidth peers
    t_gemv.append(timed(gemv)[0])
    t_rep.append(timed(gemv_repacked)[0])
    t_np.append(timed(big.sum)[0])
    t_pg.append(timed(lambda: tbig.sum().realize())[0])
  qbytes = blocks.nbytes + cols * 4 + rows * 4
  gbs, np_bw, pg_bw = qbytes / min(t_gemv) / 1e9, big.nbytes / min(t_np) / 1e9, big.nbytes / min(t_pg) / 1e9
  print(f"(d) Q4_K GEMV {rows}x{cols}: {n_kernels} kernel(s), {min(t_gemv) * 1e3:.2f} ms = {gbs:.2f} GB/s of quantized bytes "
        f"({blocks.nbytes / 1e6:.1f} MB); read bandwidth: numpy sum {np_bw:.1f} GB/s, plugrad sum {pg_bw:.1f} GB/s")
  rbs = (wr_bytes + cols * 4 + rows * 4) / min(t_rep) / 1e9
  print(f"    LLM repacked layout (nibbles + float32 scale/min per 32): {min(t_rep) * 1e3:.2f} ms = {rbs:.2f} GB/s of the "
        f"{wr_bytes / 1e6:.1f} MB it reads, {blocks.nbytes / min(t_rep) / 1e9:.2f} GB/s in Q4_K bytes")
  return [(f"Q4_K GEMV {rows}x{cols}", "plugrad (dequant fused)", f"{gbs:.2f} GB/s", f"{gbs / max(np_bw, pg_bw):.2f}x of read bw"),
          (f"Q4_K GEMV {rows}x{cols}", "plugrad (LLM repacked)", f"{rbs:.2f} GB/s", f"{rbs / max(np_bw, pg_bw):.2f}x of read bw"),
          ("read bandwidth (256 MiB sum)", "numpy / plugrad", f"{np_bw:.1f} / {pg_bw:.1f} GB/s", "peer")]


def start_server(root: str) -> tuple[subprocess.Popen, str]:
  p = subprocess.Popen([sys.executable, "-m", "plugrad_tinyfs.server", "--host", "127.0.0.1", "--port", "0", "--root", root],
                       stdout=subprocess.PIPE, text=True)
  if not select.select([p.stdout], [], [], 20)[0]:
    p.kill()
    raise RuntimeError("tinyfs server did not start within 20 s")
  line = p.stdout.readline().strip()
  if not line.startswith("tinyfs listening on "): raise RuntimeError(f"unexpected tinyfs server output: {line!r}")
  return p, line.rsplit(" ", 1)[1]


def bench_tinyfs(mib: int, repeat: int, tmp: str) -> list[tuple]:
  from plugrad_tinyfs.hashing import root_hash_ref
  data = np.frombuffer(np.random.default_rng(1).bytes(mib << 20), np.uint8)
  p, ep = start_server(os.path.join(tmp, "tinyfs"))
  os.environ["TINYFS_ENDPOINT"] = ep
  try:
    t = Tensor(data).realize()
    st, ld, hs = [], [], []
    for _ in range(repeat):
      dt, h = timed(lambda: t.fs_store())
      st.append(dt)
      dt, back = timed(lambda: h.fs_load(data.size))
      ld.append(dt)
      assert np.array_equal(back.numpy(), data), "tinyfs round trip differs"
      hs.append(timed(lambda: root_hash_ref(data.tobytes()))[0])
      assert h.numpy().tobytes() == root_hash_ref(data.tobytes())
  finally:
    p.terminate()
    p.wait(10)
  n = data.size
  print(f"(b) tinyfs on loopback, {mib} MiB of random bytes, server {ep}, median of {repeat}:")
  ref = n / statistics.median(hs) / MB
  rows = []
  for name, ts_ in (("Tensor.fs_store()", st), ("hash.fs_load(n)", ld)):
    v = n / statistics.median(ts_) / MB
    print(f"  {name:20s} {v:7.0f} MB/s  (best {n / min(ts_) / MB:.0f})")
    rows.append((f"tinyfs {mib} MiB loopback", name, f"{v:.0f} MB/s", f"{v / ref:.2f}x of hashlib"))
  print(f"  hashlib root_hash_ref {ref:6.0f} MB/s (a store hashes everything twice: client and server; a load once)")
  rows.append((f"tinyfs {mib} MiB loopback", "hashlib root_hash_ref alone", f"{ref:.0f} MB/s", "peer"))
  return rows


def kernel_breakdown(nb: int) -> str:
  """Per-kernel times (each run alone, waited for) of the captured permutation for `nb` rows, and its 64-bit op count."""
  from plugrad_tinyfs import hashing
  k = next(v for (_, n), v in hashing._keccaks.items() if n == nb)
  items = k.permute.captured
  per: dict[str, list[float]] = {}
  for _ in range(3):
    for i, ei in enumerate(items):
      kind = "theta" if i % 2 == 0 else "rho-pi-chi-iota"
      per.setdefault(kind, []).append(ei.run(wait=True) or 0.0)
  ops = sum(int(ei.runner.spec.flops) for ei in items)
  msgs = nb * hashing.W
  return (f"{len(items)} kernels per permutation; " + ", ".join(f"{kind} {statistics.median(v) * 1e6:.0f} us" for kind, v in per.items())
          + f"; {ops / msgs:.0f} uint64 ops per state per permutation (minimum ~{24 * 213 + 21})")


def bench_keccak(sizes: list[int], repeat: int) -> list[tuple]:
  from plugrad.engine.realize import GlobalCounters
  from plugrad_tinyfs import hashing
  from plugrad_tinyfs.hashing import root_hash_device, root_hash_ref
  rows, host = [], [0.0]
  blocks = hashing._blocks
  def timed_blocks(*a):  # host time spent laying out message blocks
    dt, r = timed(lambda: blocks(*a))
    host[0] += dt
    return r
  hashing._blocks = timed_blocks
  print(f"(c) Keccak-f[1600] in Tensor ops on {Device.DEFAULT} (W={hashing.W} states per row, batches of up to "
        f"NB_MAX={hashing.NB_MAX} rows), root hash of the whole tinyfs tree vs hashlib on the same bytes, median of {repeat}:")
  try:
    for mib in sizes:
      data = np.random.default_rng(mib).bytes(mib << 20)
      first, (root, _) = timed(lambda: root_hash_device(data))
      dev, ref, hosts = [], [], []
      for _ in range(repeat):
        host[0], k0 = 0.0, GlobalCounters["kernels"]
        dev.append(timed(lambda: root_hash_device(data))[0])
        hosts.append(host[0])
        launches = GlobalCounters["kernels"] - k0
        dt, want = timed(lambda: root_hash_ref(data))
        ref.append(dt)
      assert root == want, "device root hash differs from hashlib"
      n = len(data)
      d, r = n / statistics.median(dev) / MB, n / statistics.median(ref) / MB
      nb = min(hashing.NB_MAX, -(-n // hashing.PIECE_SIZE // hashing.W))
      print(f"  {mib} MiB: device {d:.1f} MB/s (first call in this process {n / first / MB:.1f} MB/s: capture, and compile if not cached), "
            f"hashlib {r:.0f} MB/s, ratio {d / r:.3f}")
      print(f"    {launches} kernel launches per root hash; host block layout {statistics.median(hosts) * 1e3:.0f} ms of "
            f"{statistics.median(dev) * 1e3:.0f} ms; {kernel_breakdown(nb)}")
      rows.append((f"Keccak root hash {mib} MiB", "device (Tensor ops, jit replay)", f"{d:.1f} MB/s", f"{d / r:.3f}x of hashlib"))
      rows.append((f"Keccak root hash {mib} MiB", "hashlib root_hash_ref", f"{r:.0f} MB/s", "peer"))
  finally: hashing._blocks = blocks
  return rows


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--gb", type=float, default=1.0, help="safetensors file size in GB")
  ap.add_argument("--tinyfs-mib", type=int, default=64)
  ap.add_argument("--keccak-mib", type=int, nargs="+", default=[16, 64])
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--only", default="a,b,c,d", help="which parts: a (safetensors), b (tinyfs), c (keccak), d (Q4_K GEMV)")
  ap.add_argument("--dir", default=None, help="where the temporary files go (default: the system temp dir)")
  args = ap.parse_args()
  parts = set(args.only.split(","))
  rows: list[tuple] = []
  with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
    if "a" in parts: rows += bench_safetensors(args.gb, args.repeat, tmp)
    if "b" in parts: rows += bench_tinyfs(args.tinyfs_mib, args.repeat, tmp)
  if "c" in parts: rows += bench_keccak(args.keccak_mib, args.repeat)
  if "d" in parts: rows += bench_q4k_gemv(8192, 2048, args.repeat)
  w = [max(len(str(r[i])) for r in rows + [("what", "who", "throughput", "vs peer")]) for i in range(4)]
  print("\n" + " | ".join(h.ljust(x) for h, x in zip(("what", "who", "throughput", "vs peer"), w)))
  print("-|-".join("-" * x for x in w))
  for r in rows: print(" | ".join(str(c).ljust(x) for c, x in zip(r, w)))


if __name__ == "__main__":
  main()
