"""Generation: decode after prefill, multi-turn cache reuse and divergence under the JIT against a cache-free
reference, sampling, stop strings and context limits."""
import mmap

import numpy as np
import pytest
from llm_helpers import np_forward, tiny_model

import plugrad.apps.llm.generate as G
from plugrad.apps.llm.generate import BatchGenerator, ContextLengthExceeded, Generator, SamplingParams, StopMatcher, sample
from plugrad.apps.llm.model import Transformer
from plugrad.engine.realize import buffer_for
from plugrad.helpers import resident_bytes
from plugrad.tensor import Tensor
from plugrad.uop.buffers import buffer_of

TOKS = [3, 7, 1, 60, 22, 9, 41, 5, 17, 33, 2, 8]


@pytest.fixture(scope="module")
def llama():
  return tiny_model("llama", max_context=48, seed=3)


def greedy_reference(cfg, w, prompt, n, stop=()):
  seq, out = list(prompt), []
  for _ in range(n):
    t = int(np_forward(cfg, w, seq)[-1].argmax())
    if t in stop: break
    out.append(t)
    seq.append(t)
  return out


def test_prefill_then_decode_equals_sequential(llama):
  m, _ = llama
  g = Generator(m)
  seq = [g.forward([t], i) for i, t in enumerate(TOKS)]
  g2 = Generator(m)
  got = [g2.forward(TOKS[:6], 0)] + [g2.forward([t], i) for i, t in enumerate(TOKS[6:], 6)]
  for a, b in zip(got, seq[5:]): np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_three_turns_under_jit_equal_reference(llama):
  m, w = llama
  g = Generator(m)
  history: list[int] = []
  for turn, user in enumerate(([3, 7, 1], [22, 9, 41, 5], [17])):
    prompt = history + user
    got = list(g.generate(prompt, SamplingParams(max_tokens=5)))
    assert got == greedy_reference(m.cfg, w, prompt, 5), f"turn {turn}"
    assert g.finish_reason == "length" and g.cached[:len(prompt)] == prompt
    history = prompt + got
  # a diverged history rewrites the cache from the first difference
  prompt = [3, 8, 1, 60]
  assert list(g.generate(prompt, SamplingParams(max_tokens=4))) == greedy_reference(m.cfg, w, prompt, 4)


def test_steps_share_one_arena_and_stay_exact(llama):
  m, w = llama
  g = Generator(m)
  assert g.prefill_jit.arena is g.arena and g.short_jit.arena is g.arena and g.decode_jit.arena is g.arena
  for prompt in ([3, 7, 1, 60, 22], [9, 41], [5, 17, 33, 2, 8, 1]):   # prefill and decode captures alternate
    assert list(g.generate(prompt, SamplingParams(max_tokens=4))) == greedy_reference(m.cfg, w, prompt, 4)
  assert g.short_jit.cnt == 2 and g.decode_jit.cnt == 2 and g.arena.nbytes > 0


def test_stop_ids_and_context_end(llama):
  m, w = llama
  g = Generator(m)
  ref = greedy_reference(m.cfg, w, TOKS[:4], 6)
  got = list(g.generate(TOKS[:4], SamplingParams(max_tokens=6), stop_ids={ref[2]}))
  assert got == ref[:ref.index(ref[2])] and g.finish_reason == "stop"
  got = list(g.generate(TOKS[:4] * 11, SamplingParams(max_tokens=20)))   # 44 tokens: 4 more fit in 48
  assert len(got) == 4 and g.finish_reason == "length"
  with pytest.raises(ContextLengthExceeded, match="48 tokens, but max_context is 48"): list(g.generate(TOKS[:4] * 12))
  with pytest.raises(ValueError, match="empty"): list(g.generate([]))


def test_sampling():
  logits = np.array([1.0, 3.0, 2.0, -1.0, 2.5])
  assert sample(logits) == 1 and sample(logits, 0.7, top_k=1, rng=np.random.default_rng(0)) == 1
  assert sample(logits, 1.0, top_p=0.01, rng=np.random.default_rng(0)) == 1
  draws = [sample(logits, 1.0, top_k=2, rng=np.random.default_rng(i)) for i in range(200)]
  assert set(draws) == {1, 4}
  rng = np.random.default_rng(1)
  counts = np.bincount([sample(logits, 1.0, rng=rng) for _ in range(4000)], minlength=5) / 4000
  p = np.exp(logits - logits.max())
  np.testing.assert_allclose(counts, p / p.sum(), atol=0.03)
  a = [sample(logits, 1.5, rng=np.random.default_rng(7)) for _ in range(5)]
  assert a == [sample(logits, 1.5, rng=np.random.default_rng(7)) for _ in range(5)]
  for bad in (dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(seed="x"), dict(stop="a")):
    with pytest.raises(ValueError): SamplingParams(**bad).check()


def test_seeded_generation_is_reproducible(llama):
  m, _ = llama
  g = Generator(m)
  p = SamplingParams(max_tokens=6, temperature=1.0, top_p=0.9, seed=123)
  assert list(g.generate(TOKS[:5], p)) == list(g.generate(TOKS[:5], p))


def test_stop_matcher():
  s = StopMatcher(["\nUser:", "###"])
  out = "".join(s.feed(x) for x in ["Hello", " wor", "ld\nUs", "er: more"])
  assert out == "Hello world" and s.stopped
  s = StopMatcher(["###"])
  assert s.feed("a#") == "a" and s.feed("b") == "#b" and s.flush() == ""
  s = StopMatcher(["###"])
  assert s.feed("x##") == "x" and s.flush() == "##"


def test_embedded_model_knows_paris(embedded_llm):
  llm = embedded_llm
  text = "".join(llm.stream(llm.chat_prompt([{"role": "user", "content": "What is the capital of France?"}]), SamplingParams(max_tokens=12)))
  assert "Paris" in text, text
  assert llm.finish_reason in ("stop", "length") and 0 < llm.last_usage["completion_tokens"] <= 12


def test_registry_and_cli(tiny_gguf, capsys):
  from plugrad.apps.llm.__main__ import main
  from plugrad.apps.llm.registry import resolve_model
  with pytest.raises(ValueError, match="path to its GGUF file"): resolve_model("no-such-model")
  with pytest.raises(FileNotFoundError, match="no such model file"): resolve_model("./missing.gguf")
  assert main(["-m", "no-such-model"]) == 2 and "unknown model" in capsys.readouterr().err
  assert main(["-m", tiny_gguf, "--prompt", "hello the world", "--max_tokens", "3", "--max_context", "40", "--seed", "1"]) == 0
  assert main(["-m", tiny_gguf, "--prompt", "the " * 60, "--max_context", "40"]) == 2
  assert "max_context is 40" in capsys.readouterr().err
  assert main(["-m", tiny_gguf, "--benchmark", "3", "--max_context", "40"]) == 0
  out = capsys.readouterr().out
  assert "prefill    16 tokens" in out and "decode 3 steps" in out and "M parameters" in out


def test_cli_dense_prefill_flag(tiny_gguf, capsys):
  from plugrad.apps.llm.__main__ import main
  assert main(["-m", tiny_gguf, "--prompt", "hello the world", "--max_tokens", "3", "--max_context", "40", "--dense_prefill_mb", "0"]) == 0
  with pytest.raises(SystemExit): main(["-m", tiny_gguf, "--dense_prefill_mb", "-1"])
  assert "--dense_prefill_mb must be >= 0" in capsys.readouterr().err


def test_negative_seed_is_a_value_error():
  # numpy's default_rng(-1) raises its own ValueError deep in generation; the check names the field first
  with pytest.raises(ValueError, match="seed must be a non-negative integer"): SamplingParams(seed=-1).check()
  assert SamplingParams(seed=2**64 - 1).check().seed == 2**64 - 1


def test_tiny_temperature_is_greedy_not_nan():
  # found by the server fuzzer: logits / 5e-324 overflow to inf and the softmax became NaN (a 500)
  logits = np.array([0.5, 3.0, -1.0, 2.9])
  for t in (5e-324, 1e-310):
    assert sample(logits, temperature=t, rng=np.random.default_rng(0)) == 1
  assert sample(logits, temperature=1e-3, top_p=5e-324, rng=np.random.default_rng(0)) == 1


def test_decode_projections_read_a_materialized_normalized_input(llama):
  """The RMS-normalized input of every projection is a buffer of its own (one small kernel), not recomputed inside
  the matrix-vector kernels for every block of output columns (which cost a batched decode step as many operations
  as dequantizing the weights, and prefill 16-26%)."""
  m, _ = llama
  g = Generator(m)
  for i, t in enumerate(TOKS[:4]): g.forward([t], i)
  srcs = {ei.runner.spec.name: ei.runner.spec.src for ei in g.decode_jit.captured if ei.runner is not None}
  dim = m.cfg.dim
  proj = [n for n in srcs if n.startswith("r_") and n.endswith(f"_{dim}") and n != f"r_1_{dim}"]   # reduce over dim
  assert proj, sorted(srcs)
  for n in proj: assert "sqrt" not in srcs[n], f"{n} recomputes the normalization:\n{srcs[n]}"


def test_decode_matmuls_leave_the_activation_to_a_vector_kernel(llama):
  """No decode matrix-vector kernel computes the FFN activation: fused, it ran as one scalar exp per output inside
  the gate/up kernel (a third of that kernel's time with 4 rows); materialized, one elementwise kernel does it on
  vectors."""
  m, _ = llama
  g = Generator(m)
  for i, t in enumerate(TOKS[:4]): g.forward([t], i)
  srcs = {ei.runner.spec.name: ei.runner.spec.src for ei in g.decode_jit.captured if ei.runner is not None}
  dim = m.cfg.dim
  proj = [n for n in srcs if n.startswith("r_") and n.endswith(f"_{dim}") and n != f"r_1_{dim}"]
  assert proj, sorted(srcs)
  for n in proj: assert "pg_exp2f" not in srcs[n], f"{n} computes an activation per output:\n{srcs[n]}"
  assert any("pg_exp2f" in s for n, s in srcs.items() if n.startswith("E_")), sorted(srcs)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_decode_steps_embed_their_tokens_inside_the_jit(arch, monkeypatch):
  """The decode steps (batch-1, batched, and the batched engine's single-slot one) gather their tokens' embedding rows
  inside their JIT, the token ids bound Variables, scaled in the graph (gemma3's sqrt(dim)): no host round trip
  through the embedding JIT and a copy in (0.4-0.6 ms of a 5 ms SmolLM2 step). Out-of-vocabulary ids still raise."""
  m, w = tiny_model(arch, max_context=48, seed=5)
  mb = Transformer(m.cfg, {k: Tensor(v) for k, v in w.items()}, max_context=48, batch=2)
  g, b = Generator(m), BatchGenerator(mb)
  g.forward(TOKS[:4], 0)
  seqs = {0: TOKS[:4], 1: TOKS[5:8]}
  for s, t in seqs.items(): b.prefill(s, t, 0)
  for model in (m, mb): monkeypatch.setattr(model, "embed", lambda *a: pytest.fail("a decode step gathered its embedding on the host"))
  for i in range(4, 8):   # run, capture, replay twice
    np.testing.assert_allclose(g.forward([TOKS[i]], i), np_forward(m.cfg, w, TOKS[:i + 1])[-1], rtol=2e-4, atol=2e-4)
    active = {s: (TOKS[i + s], len(seqs[s])) for s in seqs if i != 6 or s == 1}   # step 6: slot 1 alone (the batch-1 graph)
    out = b.decode(active)
    for s, (t, _) in active.items():
      seqs[s] = seqs[s] + [t]
      np.testing.assert_allclose(out[s], np_forward(m.cfg, w, seqs[s])[-1], rtol=2e-4, atol=2e-4, err_msg=f"step {i} slot {s}")
  with pytest.raises(IndexError, match="token id out of range"): g.forward([m.cfg.vocab_size], 8)
  with pytest.raises(IndexError, match="token id out of range"): b.decode({0: (-1, 8)})


def _resident_pages(addr: int, nbytes: int) -> int: return resident_bytes(addr, nbytes) // mmap.PAGESIZE


def test_prefills_give_their_scratch_back(monkeypatch):
  """After a prefill (batch-1 and a batched slot's), its attention scores scratch and the JIT arena past what the
  decode steps use leave memory (mincore: at most the partial pages at their ends stay), and the next prefill and
  decode steps give the logits of generators that kept that memory, bit for bit."""
  m, w = tiny_model("llama", max_context=128, seed=4)
  long = [(5 * i) % 60 + 1 for i in range(90)]   # past SHORT_PREFILL: the long prefill graph with the scores scratch
  def run(g, batched: bool) -> list:
    out = []
    for _ in range(3):   # run, capture, replay
      out.append(g.prefill(1, long, 0) if batched else g.forward(long, 0))
      out.append(g.decode({1: (7, 90)})[1] if batched else g.forward([7], 90))
    return out
  for batched in (False, True):
    mk = (lambda: BatchGenerator(Transformer(m.cfg, {k: Tensor(v) for k, v in w.items()}, max_context=128, batch=2))) if batched else \
         (lambda: Generator(Transformer(m.cfg, {k: Tensor(v) for k, v in w.items()}, max_context=128)))
    g = mk()
    got = run(g, batched)
    scores = buffer_for(buffer_of(g.model.scores.buf.uop))
    decode = [c for jit in ((g.decode_jit, g.decode1_jit) if batched else (g.decode_jit,)) for c in jit.captures]
    decode_need = max(g.arena._users[c][1].need.get("CPU", 0) for c in decode)
    g.decode({1: (7, 90)}) if batched else g.forward([7], 90)
    for name, buf, start in (("scores", scores, 0), *(("arena", b, decode_need) for b in g.arena.bases.values())):
      assert buf.nbytes - start > 8 * 4096, (name, buf.nbytes, start)   # something to give back
      assert _resident_pages(buf._buf.ctypes.data + start, buf.nbytes - start) <= 2, name
    monkeypatch.setattr(G, "release_prefill_memory", lambda *a: None)
    want = run(mk(), batched)
    monkeypatch.undo()
    for a, b in zip(got, want): np.testing.assert_array_equal(a, b)
