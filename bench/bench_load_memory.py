"""Resident memory of loading a GGUF model and answering one prompt, against llama.cpp (the xllamacpp wheel, bench-only:
pip install xllamacpp), on the embedded SmolLM2-135M Q4_1 and the synthetic qwen2-0.5B-shaped and gemma-3-270m-shaped
GGUFs in the Q4_K_M mix (bench/llm_peer.py writes them into ~/.cache/plugrad-bench on first use).

Each engine runs in a fresh process per model (VmHWM is per process): it loads the model (`max_context` 1024) and
greedily decodes --tokens tokens (64 by default, end-of-sequence ignored) after a short chat prompt. Reported, from
/proc/self/status: the peak while loading (VmHWM after the load), the resident memory once loaded, the peak over the
whole run and the resident memory at the end (the steady state), all including the interpreter (and, for ours,
plugrad's import). llama.cpp maps the weights: their pages count as resident once read.

  .venv/bin/python bench/bench_load_memory.py [--models smollm2,qwen2,gemma3] [--tokens 64] [--threads 2] [--skip-llamacpp]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_peer import load_avg, status_mb, synthetic_gemma3, synthetic_qwen2

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def child_ours(path: str, ids: list[int], n: int) -> dict:
  base = status_mb("VmRSS")
  from plugrad.apps.llm.generate import LLM, SamplingParams
  t0 = time.perf_counter()
  llm = LLM.load(path, max_context=1024)
  load_s, hwm_load, rss_load = time.perf_counter() - t0, status_mb("VmHWM"), status_mb("VmRSS")
  got = list(llm.gen.generate(ids, SamplingParams(max_tokens=n, temperature=0.0)))   # no stop ids: all n tokens
  return {"base": base, "load_s": load_s, "hwm_load": hwm_load, "rss_load": rss_load, "hwm_end": status_mb("VmHWM"),
          "rss_end": status_mb("VmRSS"), "tokens": len(got)}


def child_llamacpp(path: str, ids: list[int], n: int, threads: int) -> dict:
  from llm_peer import LlamaCpp
  base = status_mb("VmRSS")
  t0 = time.perf_counter()
  engine = LlamaCpp(path, threads=threads, ctx=1024)
  load_s, hwm_load, rss_load = time.perf_counter() - t0, status_mb("VmHWM"), status_mb("VmRSS")
  r = engine.complete(ids, n)
  return {"base": base, "load_s": load_s, "hwm_load": hwm_load, "rss_load": rss_load, "hwm_end": status_mb("VmHWM"),
          "rss_end": status_mb("VmRSS"), "tokens": r["timings"]["predicted_n"]}


def run_child(engine: str, path: str, ids: list[int], n: int, threads: int) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--child", engine, path, json.dumps(ids), str(n), str(threads)]
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  if r.returncode != 0: raise RuntimeError(f"{engine} on {path} failed:\n{r.stderr[-2000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])


def model_paths(names: list[str]) -> dict[str, str]:
  from plugrad.apps.llm.registry import resolve_model
  make = {"smollm2": lambda: resolve_model("smollm2-135m")[1], "qwen2": lambda: str(synthetic_qwen2()), "gemma3": lambda: str(synthetic_gemma3())}
  return {n: make[n]() for n in names}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--models", default="smollm2,qwen2,gemma3")
  ap.add_argument("--tokens", type=int, default=64)
  ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
  ap.add_argument("--skip-llamacpp", action="store_true")
  args = ap.parse_args()
  from plugrad.apps.llm.generate import LLM
  from plugrad.nn.state import gguf_load
  print(f"load average {load_avg()}; {args.tokens} greedy tokens after a chat prompt; max_context 1024")
  print(f"{'model':<10} {'file MB':>8} {'engine':<10} {'load s':>7} {'peak@load':>10} {'rss@load':>9} {'peak':>7} {'steady':>7} {'peak/steady':>12}")
  for name, path in model_paths(args.models.split(",")).items():
    meta, tensors = gguf_load(path)
    ids = LLM.from_metadata(meta, {k: t.shape for k, t in tensors.items()}).chat_prompt(PROMPT)
    del tensors
    for engine in ["plugrad"] + ([] if args.skip_llamacpp else ["llama.cpp"]):
      r = run_child(engine, path, ids, args.tokens, args.threads)
      print(f"{name:<10} {os.path.getsize(path) / 1e6:8.1f} {engine:<10} {r['load_s']:7.1f} {r['hwm_load']:10.0f} {r['rss_load']:9.0f} "
            f"{r['hwm_end']:7.0f} {r['rss_end']:7.0f} {r['hwm_end'] / r['rss_end']:12.2f}   (process before loading: {r['base']:.0f} MB; "
            f"{r['tokens']} tokens)", flush=True)
  print(f"load average {load_avg()}")


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1] == "--child":
    engine, path, ids, n, threads = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    out = child_ours(path, ids, n) if engine == "plugrad" else child_llamacpp(path, ids, n, threads)
    print(json.dumps(out))
  else: main()
