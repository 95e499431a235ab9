"""The real server's first requests: start `python -m plugrad.apps.llm --serve PORT --parallel N` on the embedded
SmolLM2 (a fresh process, the compile cache as it is), time until it answers, then `--rounds` rounds of one chat request
followed by N concurrent ones (64 greedy tokens each), over HTTP as clients see it. Round 0 is what the first users
of a fresh server get: before the server warmed its steps up at start it paid schedule, compile and JIT capture there.

  .venv/bin/python bench/bench_server_start.py [--parallel 4] [--rounds 3] [--tokens 64]
  CPU_MARCH=x86-64-v3 .venv/bin/python bench/bench_server_start.py     # the server's kernels compiled for AVX2
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import QUESTIONS
from llm_peer import load_avg


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, port: int, timeout: float = 600) -> float:
  t0 = time.perf_counter()
  while time.perf_counter() - t0 < timeout:
    if proc.poll() is not None: raise SystemExit(f"the server exited: {proc.stdout.read() if proc.stdout else ''}")
    try:
      urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read()
      return time.perf_counter() - t0
    except OSError: time.sleep(0.2)
  raise SystemExit(f"the server did not answer within {timeout:.0f} s")


def chat(port: int, question: str, tokens: int) -> tuple[int, float]:
  """(completion tokens, seconds) of one greedy chat request."""
  body = json.dumps({"messages": [{"role": "user", "content": question}], "max_tokens": tokens, "temperature": 0}).encode()
  req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"})
  t0 = time.perf_counter()
  out = json.loads(urllib.request.urlopen(req, timeout=600).read())
  return out["usage"]["completion_tokens"], time.perf_counter() - t0


def concurrent(port: int, questions: list[str], tokens: int) -> tuple[int, float]:
  """(completion tokens of all, wall seconds) of the requests sent at once."""
  got: list[tuple[int, float]] = []
  threads = [threading.Thread(target=lambda q=q: got.append(chat(port, q, tokens))) for q in questions]
  t0 = time.perf_counter()
  for t in threads: t.start()
  for t in threads: t.join()
  return sum(n for n, _ in got), time.perf_counter() - t0


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--parallel", type=int, default=4)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--tokens", type=int, default=64)
  args = ap.parse_args()
  port = free_port()
  cmd = [sys.executable, "-m", "plugrad.apps.llm", "--serve", str(port), "--parallel", str(args.parallel)]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    print(f"load {load_avg()}; CPU_MARCH={os.environ.get('CPU_MARCH', '(host)')}; ready after {wait_ready(proc, port):.1f} s", flush=True)
    qs = (QUESTIONS * 2)[:args.parallel]
    for r in range(args.rounds):
      n1, t1 = chat(port, qs[0], args.tokens)
      n, t = concurrent(port, qs, args.tokens)
      print(f"round {r}: one request {n1 / t1:.1f} tok/s; {args.parallel} concurrent {n} tokens in {t:.2f} s = {n / t:.1f} tok/s "
            f"({n / t / (n1 / t1):.2f}x)", flush=True)
  finally:
    proc.terminate()
    proc.wait(30)


if __name__ == "__main__":
  main()
