"""LLM benchmark: plugrad vs llama.cpp (the xllamacpp wheel, bench-only: pip install xllamacpp) on the embedded
SmolLM2-135M Q4_1, the same ~450-token prompt and 64 greedy decode tokens, plus the machine's read bandwidth.

  .venv/bin/python bench/bench_llm.py [--tokens 450] [--decode 64] [--threads 2] [--skip-llamacpp]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

TEXT = ("The history of computing is a story of abstractions layered on abstractions. Early machines were programmed by "
        "rewiring panels; later, stored programs let the same hardware run many tasks. Compilers turned human-readable "
        "formulas into machine code, operating systems shared one computer among many users, and networks joined "
        "computers into systems that span the planet. Each layer hides details of the one below while exposing a simpler "
        "model to the one above, and performance work is the art of knowing when to look beneath the abstraction. ")


def read_bandwidth(mb: int = 512) -> tuple[float, float]:
  """(numpy single-thread GB/s, plugrad GB/s using the device's threads) for summing a `mb` MB float32 array."""
  from plugrad import Tensor
  a = np.ones(mb * (1 << 20) // 4, np.float32)
  a.sum()
  t0 = time.perf_counter()
  for _ in range(3): a.sum()
  np_bw = 3 * a.nbytes / (time.perf_counter() - t0) / 1e9
  t = Tensor(a).realize()
  t.sum().realize()
  best = float("inf")
  for _ in range(3):
    t0 = time.perf_counter()
    t.sum().realize()
    best = min(best, time.perf_counter() - t0)
  return np_bw, a.nbytes / best / 1e9


def bench_plugrad(path: str, prompt: list[int], n_decode: int) -> dict:
  from plugrad.apps.llm.__main__ import weight_bytes
  from plugrad.apps.llm.generate import LLM
  t0 = time.perf_counter()
  llm = LLM.load(path, max_context=1024, name="smollm2-135m")
  load_s = time.perf_counter() - t0
  g = llm.gen
  t0 = time.perf_counter()
  short = llm.chat_prompt([{"role": "user", "content": "Hi!"}])
  g.forward(short, 0)
  ttft = time.perf_counter() - t0 + load_s
  g.forward(prompt[:7], 0)                       # second prefill call: JIT capture
  g.forward([prompt[7]], 7), g.forward([prompt[8]], 8), g.forward([prompt[9]], 9)   # decode: run, capture, replay
  best_pre = float("inf")
  for _ in range(2):
    t0 = time.perf_counter()
    logits = g.forward(prompt, 0)
    best_pre = min(best_pre, time.perf_counter() - t0)
  toks, t0 = [], time.perf_counter()
  for i in range(n_decode):
    toks.append(int(np.argmax(logits)))
    logits = g.forward([toks[-1]], len(prompt) + i)
  dec = time.perf_counter() - t0
  wb = weight_bytes(llm.model)
  return {"load_s": load_s, "ttft_cold_s": ttft, "prefill_tok_s": len(prompt) / best_pre, "decode_tok_s": n_decode / dec,
          "decode_gb_s": wb * n_decode / dec / 1e9, "weight_mb": wb / 1e6, "tokens": toks}


def bench_llamacpp(path: str, prompt: list[int], n_decode: int, threads: int) -> dict:
  import xllamacpp as xl
  p = xl.CommonParams()
  p.model.path = path
  p.n_ctx, p.n_batch, p.n_ubatch, p.n_parallel = 1024, 512, 512, 1
  p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
  p.warmup = True
  srv = xl.Server(p)
  def run() -> dict:
    req = {"prompt": prompt, "n_predict": n_decode, "temperature": 0.0, "top_k": 1, "cache_prompt": False, "ignore_eos": True}
    r = srv.handle_completions(req)
    return json.loads(r) if isinstance(r, str) else r
  run()
  best: dict = {}
  for _ in range(2):
    t = run()["timings"]
    if not best or t["prompt_per_second"] > best["prompt_per_second"]: best["prompt_per_second"] = t["prompt_per_second"]
    best["predicted_per_second"] = max(best.get("predicted_per_second", 0), t["predicted_per_second"])
  return {"prefill_tok_s": best["prompt_per_second"], "decode_tok_s": best["predicted_per_second"]}


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--tokens", type=int, default=450)
  ap.add_argument("--decode", type=int, default=64)
  ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
  ap.add_argument("--skip-llamacpp", action="store_true")
  args = ap.parse_args()
  from plugrad.apps.llm.registry import resolve_model
  from plugrad.apps.llm.tokenizer import Tokenizer
  from plugrad.nn.state import gguf_load
  _, path = resolve_model("smollm2-135m")
  tok = Tokenizer.from_gguf_metadata(gguf_load(path)[0])
  ids = tok.encode(TEXT * 8)
  if len(ids) < args.tokens: raise SystemExit(f"the benchmark text has only {len(ids)} tokens")
  prompt = ids[:args.tokens]
  np_bw, pg_bw = read_bandwidth()
  print(f"read bandwidth: numpy 1 thread {np_bw:.1f} GB/s, plugrad sum {pg_bw:.1f} GB/s")
  ours = bench_plugrad(path, prompt, args.decode)
  print(f"plugrad: load {ours['load_s']:.2f} s, cold time to first token (load + compile + short prefill) {ours['ttft_cold_s']:.1f} s")
  print(f"plugrad: prefill {len(prompt)} tok {ours['prefill_tok_s']:.1f} tok/s, decode {args.decode} tok {ours['decode_tok_s']:.1f} tok/s,",
        f"{ours['decode_gb_s']:.2f} GB/s of weights ({ours['weight_mb']:.1f} MB/token, {ours['decode_gb_s'] / max(np_bw, pg_bw):.0%} of read bw)")
  if args.skip_llamacpp: return
  ref = bench_llamacpp(path, prompt, args.decode, args.threads)
  print(f"llama.cpp: prefill {ref['prefill_tok_s']:.1f} tok/s, decode {ref['decode_tok_s']:.1f} tok/s "
        f"({ref['decode_tok_s'] * ours['weight_mb'] / 1e3:.2f} GB/s of weights)")
  pre, dec = ours["prefill_tok_s"] / ref["prefill_tok_s"], ours["decode_tok_s"] / ref["decode_tok_s"]
  print(f"ratio plugrad / llama.cpp: prefill {pre:.2f}x, decode {dec:.2f}x")


if __name__ == "__main__":
  main()
