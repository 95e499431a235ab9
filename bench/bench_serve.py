"""Serving benchmark (continuous batching, prefix cache) on the embedded SmolLM2-135M Q4_1, against llama.cpp's server
engine (the xllamacpp wheel, bench-only: pip install xllamacpp) with the same number of parallel slots.

  - single stream: greedy decode tok/s of one sequence (the `Generator` path of the CLI, batch 1) and of one active
    slot of the batched engine; N concurrent streams (N = --parallel, default 4): aggregate decode tok/s of one batched
    step per token for all N; the three timed in alternating blocks in one process;
  - prefix cache: time to first token (max_tokens 1 through the engine) of a request with a ~400-token system prompt,
    then of a second request sharing that prefix with a different question;
  - llama.cpp: n_parallel = N, the same N prompts sent at once, aggregate decode tok/s (sum of the per-request rates).

  .venv/bin/python bench/bench_serve.py [--parallel 4] [--decode 64] [--threads 2] [--skip-llamacpp] [--profile]

--profile: also the per-kernel times of one batched decode step of all N slots, timed in place inside the TinyJit
replay (best of 5 per kernel), as `bench_llm.py --profile` does for one stream.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_peer import LlamaCpp, load_avg, replay_profile

SYSTEM = ("You are a meticulous assistant for a company that builds compilers. Always answer in plain English, cite the "
          "relevant part of the question, prefer short sentences, and never invent facts. ") * 12
QUESTIONS = ["What is a register allocator?", "Explain loop tiling.", "Why do compilers inline functions?", "What is SSA form?",
             "What does a linker do?", "Describe constant folding.", "What is a basic block?", "Explain dead code elimination."]


def prompts(llm, n: int) -> list[list[int]]:
  return [llm.chat_prompt([{"role": "user", "content": q}]) for q in (QUESTIONS * 2)[:n]]


def decode_rates(path: str, ps: list[list[int]], n_decode: int, block: int = 8) -> dict:
  """Greedy decode tok/s of: the batch-1 Generator (what --prompt and bench_llm.py run), one active slot of the batched
  engine, all slots at once. Both models live in one process and are timed in alternating blocks of `block` tokens, so
  load from other processes hits all three alike."""
  from plugrad.apps.llm.generate import LLM
  one = LLM.load(path, max_context=1024, name="smollm2-135m")
  llm = LLM.load(path, max_context=1024, name="smollm2-135m", batch=len(ps))
  g, b = one.gen, llm.backend()
  g.forward(ps[0], 0)
  g.forward([5], len(ps[0])), g.forward([6], len(ps[0]) + 1)   # compile, capture
  nxt = {s: int(np.argmax(b.prefill(s, p, 0))) for s, p in enumerate(ps)}
  pos = {s: len(p) for s, p in enumerate(ps)}
  tok, gpos = int(np.argmax(g.forward(ps[0], 0))), len(ps[0])
  def batched(slots: list[int]) -> None:
    out = b.decode({s: (nxt[s], pos[s]) for s in slots})
    for s in slots: nxt[s], pos[s] = int(np.argmax(out[s])), pos[s] + 1
  batched(list(nxt)), batched(list(nxt)), batched([0])   # compile, capture, replay
  times: dict[str, list[float]] = {"single": [], "one_slot": [], "all_slots": []}
  for _ in range(n_decode // block):
    t0 = time.perf_counter()
    for _ in range(block):
      tok = int(np.argmax(g.forward([tok], gpos)))
      gpos += 1
    times["single"].append((time.perf_counter() - t0) / block)
    t0 = time.perf_counter()
    for _ in range(block): batched([0])
    times["one_slot"].append((time.perf_counter() - t0) / block)
    t0 = time.perf_counter()
    for _ in range(block): batched(list(nxt))
    times["all_slots"].append((time.perf_counter() - t0) / block)
  med = {k: float(np.median(v)) for k, v in times.items()}
  return {"single": 1 / med["single"], "one_slot": 1 / med["one_slot"], "aggregate": len(ps) / med["all_slots"], "llm": llm}


def batched_profile(llm, ps: list[list[int]], top: int = 16) -> None:
  """Per-kernel times of the batched decode step of every slot (see --profile)."""
  b = llm.backend()
  nxt = {s: int(np.argmax(b.prefill(s, p, 0))) for s, p in enumerate(ps)}
  pos = {s: len(p) for s, p in enumerate(ps)}
  for _ in range(3): b.decode({s: (nxt[s], pos[s]) for s in nxt})   # compile, capture, replay
  vv = {b.v_keys.arg[0]: -(-(max(pos.values()) + 1) // 8), **{v.arg[0]: pos[s] for s, v in enumerate(b.v_pos)},
        **{v.arg[0]: nxt.get(s, 0) for s, v in enumerate(b.v_tok)}}
  rows = replay_profile(b.decode_jit, vv, lambda: b.decode({s: (nxt[s], pos[s]) for s in nxt}))
  total = sum(r[1] for r in rows.values())
  print(f"batched step of {len(ps)} slots: {len(b.decode_jit.captured)} kernels timed in place in the replay (best of 5 per kernel): "
        f"{total * 1e3:.2f} ms")
  for name, (n, t, _, cores) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
    print(f"  {name:28s} x{n:<3d} {t * 1e3:8.3f} ms {t / total:6.1%}  cores {'/'.join(map(str, sorted(cores)))}  {t / n * 1e6:7.1f} us each")


def prefix_ttft(llm) -> dict:
  """Time to first token (max_tokens 1, through the engine) of a ~450-token prompt, cold, then of a second request that
  shares its system prompt; after the backend's warm_up, as the server serves (before it, the cold request captured the
  long prefill graph and the second one paid the collection that capture left owed: 166-317 ms instead of 76-84)."""
  from plugrad.apps.llm.engine import Engine, Finished, Job
  from plugrad.apps.llm.generate import SamplingParams
  backend = llm.backend()
  backend.warm_up()   # as the server does before it serves (every graph captured, the collection captures owe paid)
  engine = Engine(backend, llm.tok, prefill_chunk=512)
  async def ttft(q: str, system: str = SYSTEM) -> tuple[float, int, int]:
    ids = llm.chat_prompt([{"role": "system", "content": system}, {"role": "user", "content": q}])
    t0 = time.perf_counter()
    async for item in engine.run(Job(ids, SamplingParams(max_tokens=1, temperature=0.0), asyncio.get_running_loop())):
      if isinstance(item, Finished): return time.perf_counter() - t0, item.cached_tokens, len(ids)
    raise RuntimeError("no result")
  async def run() -> list:
    await ttft("warm-up", "a different system prompt " * 40)   # the prefill graphs are compiled and captured here:
    await ttft("warm-up 2", "a different system prompt " * 40)  # a cached prefix, then a short prefill twice
    await ttft("warm-up 3", "a different system prompt " * 40)
    for s in engine.slots: s.cached = []                        # forget every cached prefix: the next request is cold
    return [await ttft(QUESTIONS[0]), await ttft(QUESTIONS[1])]
  (t1, _, n1), (t2, c2, n2) = asyncio.run(run())
  engine.shutdown()
  return {"first": t1, "second": t2, "cached": c2, "tokens": n1, "tokens2": n2}


def llamacpp(path: str, ps: list[list[int]], n_decode: int, threads: int) -> dict:
  srv = LlamaCpp(path, threads, ctx=1024, n_parallel=len(ps))   # 1024 positions per slot, as ours
  def req(prompt: list[int]) -> dict: return srv.complete(prompt, n_decode)
  req(ps[0])
  one = req(ps[0])["timings"]["predicted_per_second"]
  out: list = [None] * len(ps)
  def worker(i: int) -> None: out[i] = req(ps[i])
  ts = [threading.Thread(target=worker, args=(i,)) for i in range(len(ps))]
  t0 = time.perf_counter()
  for t in ts: t.start()
  for t in ts: t.join()
  wall = time.perf_counter() - t0
  rates = [o["timings"]["predicted_per_second"] for o in out]
  return {"one": one, "aggregate": sum(rates), "wall_tok_s": len(ps) * n_decode / wall}


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--parallel", type=int, default=4)
  ap.add_argument("--decode", type=int, default=64)
  ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
  ap.add_argument("--skip-llamacpp", action="store_true")
  ap.add_argument("--profile", action="store_true", help="per-kernel times of one batched decode step")
  args = ap.parse_args()
  from plugrad.apps.llm.generate import LLM
  from plugrad.apps.llm.registry import resolve_model
  _, path = resolve_model("smollm2-135m")
  tok_llm = LLM.load(path, max_context=64, name="tokenizer", dense_prefill_mb=0)
  ps = prompts(tok_llm, args.parallel)
  del tok_llm
  print(f"load {load_avg()}")
  r = decode_rates(path, ps, args.decode)
  one = r["single"]
  print(f"plugrad single stream (batch-1 Generator): {one:.1f} tok/s")
  print(f"plugrad batched engine, 1 active slot of {args.parallel}: {r['one_slot']:.1f} tok/s")
  print(f"plugrad {args.parallel} concurrent streams: aggregate {r['aggregate']:.1f} tok/s = {r['aggregate'] / one:.2f}x the single stream")
  if args.profile: batched_profile(r["llm"], ps)
  p = prefix_ttft(r["llm"])
  print(f"prefix cache: {p['tokens']}-token prompt, time to first token {p['first'] * 1e3:.0f} ms cold; a second request sharing the "
        f"system prompt ({p['tokens2']} tokens, {p['cached']} cached): {p['second'] * 1e3:.0f} ms = {p['second'] / p['first']:.3f}x")
  if args.skip_llamacpp: return
  print(f"load {load_avg()}")
  ref = llamacpp(path, ps, args.decode, args.threads)
  print(f"llama.cpp n_parallel={args.parallel}: single stream {ref['one']:.1f} tok/s, {args.parallel} concurrent: aggregate "
        f"{ref['aggregate']:.1f} tok/s (sum of per-request rates; {ref['wall_tok_s']:.1f} tok/s over the wall time incl. prefill)")
  print(f"ratio plugrad / llama.cpp, {args.parallel} streams aggregate: {r['aggregate'] / ref['aggregate']:.2f}x; "
        f"single stream: {one / ref['one']:.2f}x")


if __name__ == "__main__":
  main()
