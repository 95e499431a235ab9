"""Shared by the LLM benchmarks: llama.cpp (the xllamacpp wheel, bench-only: pip install xllamacpp) as the peer, the
synthetic qwen2-0.5B-shaped and gemma-3-270m-shaped GGUFs they also run, and the machine's load and memory figures.

The synthetic model has Qwen2.5-0.5B's shapes (24 layers, dim 896, ffn 4864, 14/2 heads of 64, vocab 151936, tied
embeddings, q/k/v biases) and the tensor types llama.cpp's Q4_K_M recipe gives it (rows of 896 aren't a multiple of
256, so most K types fall back: Q5_0 for attention and gate/up, Q8_0 for the embeddings and half the attn_v, Q6_K or
Q4_K for ffn_down, whose rows are 4864 long), with random quantized blocks and sane scales (speed does not depend on
the values). Its tokenizer is SmolLM2's, padded with unused tokens up to 151936. It is written on first use into the
bench cache directory, never committed.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

CACHE = Path(os.environ.get("PLUGRAD_BENCH_CACHE", Path.home() / ".cache" / "plugrad-bench"))

QWEN2 = {"layers": 24, "dim": 896, "ffn": 4864, "heads": 14, "kv_heads": 2, "vocab": 151936}


def load_avg() -> str:
  """`uptime`'s three load averages."""
  return " ".join(f"{x:.2f}" for x in os.getloadavg())


def status_mb(key: str = "VmRSS") -> float:
  """A memory figure of this process from /proc/self/status in MB (VmRSS: resident now, VmHWM: the peak so far)."""
  for line in Path("/proc/self/status").read_text().splitlines():
    if line.startswith(key + ":"): return int(line.split()[1]) / 1024
  return float("nan")


def rss_mb() -> float:
  """This process's resident memory (VmRSS) in MB."""
  return status_mb("VmRSS")


def _blocks(rng: np.random.Generator, qtype: Any, rows: int, cols: int) -> np.ndarray:
  """Random uint8 blocks (rows, cols // block * bytes) of `qtype` whose float16 scales are small and finite."""
  import gguf
  elems, tsize = gguf.GGML_QUANT_SIZES[qtype]
  b = rng.integers(0, 256, (rows * cols // elems, tsize), dtype=np.uint8)
  T = gguf.GGMLQuantizationType
  f16_cols = {T.Q8_0: (0,), T.Q5_0: (0,), T.Q4_K: (0, 2), T.Q6_K: (208,)}[qtype]
  for c in f16_cols: b[:, c:c + 2] = rng.uniform(-0.02, 0.02, len(b)).astype(np.float16).view(np.uint8).reshape(-1, 2)
  if qtype == T.Q6_K: b[:, 192:208] = rng.integers(-8, 8, (len(b), 16)).astype(np.int8).view(np.uint8)
  if qtype == T.Q4_K: b[:, 2:4] = np.float16(0.001).reshape(1, 1).view(np.uint8)
  return b.reshape(rows, -1)


def _adders(w: Any) -> tuple[Callable[[str, Any, int, int], None], Callable[[str, np.ndarray], None], np.random.Generator]:
  """A GGUF writer's two ways of adding a weight: random blocks of a quantized type, a float32 array; and their seeded
  generator (other random values drawn from it keep the file the same from run to run)."""
  rng = np.random.default_rng(0)
  def q(name: str, qtype: Any, rows: int, cols: int) -> None: w.add_tensor(name, _blocks(rng, qtype, rows, cols), raw_dtype=qtype)
  def f32(name: str, v: np.ndarray) -> None: w.add_tensor(name, v.astype(np.float32))
  return q, f32, rng


def _finish(w: Any, tmp: Path, path: Path) -> Path:
  """Write the file out and move it into place (a half-written file never has the final name)."""
  w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
  w.close()
  tmp.rename(path)
  return path


def _written_apart(write: Callable[[Path], Any], path: Path) -> Path:
  """`path`, written by `write(path)` in a child process the first time: written here, the writer's freed arrays stay
  in this process's heap and count against the resident memory the benchmark measures next (qwen2's read 0.67x file
  + KV on a new machine)."""
  if not path.exists():
    proc = multiprocessing.get_context("spawn").Process(target=write, args=(path,))
    proc.start(); proc.join()
    if proc.exitcode != 0 or not path.exists(): raise RuntimeError(f"writing {path} failed (exit code {proc.exitcode})")
  return path


def synthetic_qwen2(path: Path | None = None) -> Path:
  """The synthetic qwen2-0.5B-shaped Q4_K_M-mix GGUF (see the module docstring), written once; its path."""
  return _written_apart(_write_qwen2, path or CACHE / "qwen2-0.5b-shaped-q4_k_m-mix.gguf")


def _write_qwen2(path: Path) -> None:
  import gguf
  from plugrad.apps.llm.registry import resolve_model
  path.parent.mkdir(parents=True, exist_ok=True)
  c, T = QWEN2, gguf.GGMLQuantizationType
  src = gguf.GGUFReader(resolve_model("smollm2-135m")[1])
  def field(k: str) -> Any: return src.fields[k].contents()
  tokens, types = list(field("tokenizer.ggml.tokens")), list(field("tokenizer.ggml.token_type"))
  pad = c["vocab"] - len(tokens)
  tmp = path.with_suffix(".tmp")
  w = gguf.GGUFWriter(str(tmp), "qwen2")
  w.add_name("synthetic qwen2-0.5B-shaped (random weights)")
  w.add_context_length(32768), w.add_embedding_length(c["dim"]), w.add_feed_forward_length(c["ffn"])
  w.add_block_count(c["layers"]), w.add_head_count(c["heads"]), w.add_head_count_kv(c["kv_heads"])
  w.add_rope_freq_base(1e6), w.add_layer_norm_rms_eps(1e-6), w.add_file_type(15)   # MOSTLY_Q4_K_M
  w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
  w.add_token_list(tokens + [f"<|unused_{i}|>" for i in range(pad)]), w.add_token_types(types + [1] * pad)
  w.add_token_merges(list(field("tokenizer.ggml.merges")))
  w.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id"))), w.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
  w.add_chat_template(field("tokenizer.chat_template"))
  q, f32, rng = _adders(w)
  d, f = c["dim"], c["ffn"]
  kv = c["kv_heads"] * d // c["heads"]
  q("token_embd.weight", T.Q8_0, c["vocab"], d)
  f32("output_norm.weight", np.ones(d))
  for i in range(c["layers"]):
    p = f"blk.{i}."
    f32(p + "attn_norm.weight", np.ones(d)), f32(p + "ffn_norm.weight", np.ones(d))
    q(p + "attn_q.weight", T.Q5_0, d, d), q(p + "attn_k.weight", T.Q5_0, kv, d), q(p + "attn_output.weight", T.Q5_0, d, d)
    q(p + "attn_v.weight", T.Q8_0 if i % 2 == 0 else T.Q5_0, kv, d)
    for b, n in (("attn_q.bias", d), ("attn_k.bias", kv), ("attn_v.bias", kv)): f32(p + b, rng.uniform(-0.1, 0.1, n))
    q(p + "ffn_gate.weight", T.Q5_0, f, d), q(p + "ffn_up.weight", T.Q5_0, f, d)
    q(p + "ffn_down.weight", T.Q6_K if i % 2 == 0 else T.Q4_K, d, f)
  return _finish(w, tmp, path)


GEMMA3 = {"layers": 18, "dim": 640, "ffn": 2048, "heads": 4, "kv_heads": 1, "head_dim": 256, "vocab": 262144, "window": 512}


def synthetic_gemma3(path: Path | None = None) -> Path:
  """A synthetic gemma-3-270m-shaped GGUF, written once; its path. gemma-3-270m's shapes (18 layers, dim 640, ffn 2048,
  4/1 heads of 256, vocab 262144, tied embeddings, q/k norms, post-attention and post-FFN norms, a 512-token sliding
  window) in the tensor types llama.cpp's Q4_K_M recipe gives it: rows of 640 can't hold 256-blocks, so Q8_0 for the
  embeddings and half the attn_v, Q5_0 for attn_q/k/output and ffn_gate/up, ffn_down (rows of 2048) alternating Q6_K
  and Q4_K; random blocks with small scales. Its SentencePiece vocabulary: gemma's controls, `</s>` at id 212 as a
  user-defined token (as in gemma 3), byte tokens, a few pieces and unused tokens up to 262144."""
  return _written_apart(_write_gemma3, path or CACHE / "gemma3-270m-shaped-q4_k_m-mix.gguf")


def _write_gemma3(path: Path) -> None:
  import gguf
  path.parent.mkdir(parents=True, exist_ok=True)
  c, T = GEMMA3, gguf.GGMLQuantizationType
  specials = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<unused{i}>" for i in range(101)] + ["<start_of_turn>", "<end_of_turn>"]
  specials += [f"<unused{i}>" for i in range(101, 206)]
  tokens = specials + ["</s>"] + [f"<0x{b:02X}>" for b in range(256)]
  types = [3, 3, 3, 2] + [5] * 101 + [3, 3] + [5] * 105 + [4] + [6] * 256
  pieces = [chr(ch) for ch in range(0x61, 0x7B)] + ["\u2581" + chr(ch) for ch in range(0x61, 0x7B)] + ["\u2581"]
  tokens, types = tokens + pieces, types + [1] * len(pieces)
  pad = c["vocab"] - len(tokens)
  tokens, types = tokens + [f"<unused_pad{i}>" for i in range(pad)], types + [5] * pad
  scores = [0.0] * (c["vocab"] - len(pieces) - pad) + [-float(i) for i in range(len(pieces))] + [-1e9] * pad
  tmp = path.with_suffix(".tmp")
  w = gguf.GGUFWriter(str(tmp), "gemma3")
  w.add_name("synthetic gemma-3-270m-shaped (random weights)")
  w.add_context_length(32768), w.add_embedding_length(c["dim"]), w.add_feed_forward_length(c["ffn"])
  w.add_block_count(c["layers"]), w.add_head_count(c["heads"]), w.add_head_count_kv(c["kv_heads"])
  w.add_key_length(c["head_dim"]), w.add_value_length(c["head_dim"]), w.add_sliding_window(c["window"])
  w.add_rope_freq_base(1e6), w.add_layer_norm_rms_eps(1e-6), w.add_file_type(15)   # MOSTLY_Q4_K_M
  w.add_tokenizer_model("llama"), w.add_token_list(tokens), w.add_token_types(types), w.add_token_scores(scores)
  w.add_bos_token_id(2), w.add_eos_token_id(1), w.add_unk_token_id(3), w.add_pad_token_id(0)
  w.add_add_bos_token(True), w.add_add_space_prefix(False)
  w.add_chat_template("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
                      "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
  q, f32, _ = _adders(w)
  d, f, hd = c["dim"], c["ffn"], c["head_dim"]
  q_rows, kv_rows = c["heads"] * hd, c["kv_heads"] * hd
  q("token_embd.weight", T.Q8_0, c["vocab"], d)
  f32("output_norm.weight", np.ones(d))
  for i in range(c["layers"]):
    p = f"blk.{i}."
    for n in ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm"): f32(p + n + ".weight", np.ones(d))
    f32(p + "attn_q_norm.weight", np.ones(hd)), f32(p + "attn_k_norm.weight", np.ones(hd))
    q(p + "attn_q.weight", T.Q5_0, q_rows, d), q(p + "attn_k.weight", T.Q5_0, kv_rows, d), q(p + "attn_output.weight", T.Q5_0, d, q_rows)
    q(p + "attn_v.weight", T.Q8_0 if i % 2 == 0 else T.Q5_0, kv_rows, d)
    q(p + "ffn_gate.weight", T.Q5_0, f, d), q(p + "ffn_up.weight", T.Q5_0, f, d)
    q(p + "ffn_down.weight", T.Q6_K if i % 2 == 0 else T.Q4_K, d, f)
  return _finish(w, tmp, path)


class LlamaCpp:
  """A llama.cpp server engine in this process (`xllamacpp.Server`) with `threads` threads and `n_parallel` slots of
  `ctx` positions each (`poll`: how much its idle threads spin, 0-100); `complete` runs one greedy completion of token
  ids and returns its result (with `timings`)."""

  def __init__(self, path: str | Path, threads: int, ctx: int = 1024, n_parallel: int = 1, poll: int | None = None):
    import xllamacpp as xl
    p = xl.CommonParams()
    if poll is not None: p.cpuparams.poll = p.cpuparams_batch.poll = poll   # llama.cpp's default: 50 (its threads spin-wait)
    p.model.path = str(path)
    p.n_parallel = n_parallel
    p.n_ctx = ctx * n_parallel
    p.n_batch = p.n_ubatch = 512
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
    p.warmup = True
    self.srv = xl.Server(p)

  def complete(self, prompt: list[int], n_predict: int) -> dict:
    r = self.srv.handle_completions({"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
                                     "cache_prompt": False, "ignore_eos": True})
    return json.loads(r) if isinstance(r, str) else r

  def rates(self, prompt: list[int], n_predict: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of one completion, from llama.cpp's own timings."""
    t = self.complete(prompt, n_predict)["timings"]
    return t["prompt_per_second"], t["predicted_per_second"]


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


def timed(f) -> float:
  t0 = time.perf_counter()
  f()
  return time.perf_counter() - t0


def replay_profile(jit: Any, vv: dict[str, int], step: Any, runs: int = 5) -> dict[str, list]:
  """Per-kernel times of the step a TinyJit captured, timed in place inside its batched replay (best of `runs` per
  kernel; `step()` runs the whole step first each time, so inputs and caches are as a step leaves them): {kernel
  name: [count, seconds, bytes it touches, set of core counts]}."""
  times_of = []
  for _ in range(runs):
    step()
    times = []
    for batch, its, slots in jit.plan:
      if batch is not None and hasattr(batch, "profile"): times += batch.profile(vv, slots)
      else: times += [(timed(lambda: ei.run(vv if ei.runner is not None and ei.runner.spec.vars else None)), 1) for ei in its]
    times_of.append(times)
  rows: dict[str, list] = {}
  for i, ei in enumerate(jit.captured):
    r = rows.setdefault(ei.runner.spec.name if ei.runner is not None else "copy", [0, 0.0, 0, set()])
    r[0], r[1], r[2] = r[0] + 1, r[1] + min(t[i][0] for t in times_of), r[2] + (ei.runner.spec.mem_bytes if ei.runner is not None else 0)
    r[3].add(times_of[0][i][1])
  return rows
