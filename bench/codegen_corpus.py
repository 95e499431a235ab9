"""Codegen corpus: a fixed, representative set of kernels rendered for every renderer, so that a change to codegen can
be checked against the kernels it generated before (source text, kernel names included) without running anything.

The cases are tensor programs (matmuls of many shapes, transposed and expression operands, convolutions and both
their gradients, reductions, softmax/layernorm/cumsum/elementwise kernels, a tiny llama's decode step, its batched
4-slot decode step and its symbolic prefill, the quantized products of every GGUF type through apps/llm/quant.py, half
and bfloat16 matmuls for tensor cores). Each group of renderers runs in a process of its own, where the cases are
scheduled on that group's device (the schedule reads the renderer's capabilities too) and every kernel is rendered:

  cpu_avx2, cpu_avx512   the CPU ClangRenderer with the capability record of an AVX2 / AVX-512 VNNI host
                         (plugrad_cpu.device.simd_caps(HOST_KINDS[...]); caches pinned by CACHE_L1/L2/L3)
  python                 the PYTHON device without emulation
  emu_<TARGET>           DEV=PYTHON EMULATE=<TARGET> (CUDA, CUDA_SM80, AMD, AMD_RDNA4, AMD_CDNA3), and the same ASTs
                         through the real renderer of that target: plugins/nv's CUDARenderer, plugins/amd's AMDGPURenderer

For every kernel the engine would compile (operand-packing kernels included, in run order; BEAM never consulted) it
writes the source under <out>/<renderer>/ and one sha256 digest per (renderer, kernel) with the chosen optimizations
to <out>/<renderer>/digests.json.

  .venv/bin/python bench/codegen_corpus.py --out /work/notes/codegen_before      # all groups (a few minutes)
  .venv/bin/python bench/codegen_corpus.py --out DIR --groups cpu_avx2,emu_AMD      # some of them
  .venv/bin/python bench/codegen_corpus.py --compare /work/notes/codegen_before DIR  # per renderer: compared, identical
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

GROUPS = {
  "cpu_avx2": {"DEV": "CPU"}, "cpu_avx512": {"DEV": "CPU"}, "python": {"DEV": "PYTHON"},
  **{f"emu_{t}": {"DEV": "PYTHON", "EMULATE": t} for t in ("CUDA", "CUDA_SM80", "AMD", "AMD_RDNA4", "AMD_CDNA3")},
}
# pinned so the CPU heuristic's cache blocking doesn't follow the machine the corpus runs on
PINNED_ENV = {"CACHE_L1": str(48 << 10), "CACHE_L2": str(1 << 20), "CACHE_L3": str(32 << 20), "BEAM": "0", "BEAM_REUSE": "0",
              "NOOPT": "0", "PACK": "1"}


# ---------------------------------------------------------------------------- cases

def cases(dev: str) -> list[tuple[str, Callable[[], list]]]:
  """(name, builder) of every case; a builder returns the lazy tensors whose schedule is the case's kernels."""
  from plugrad import Tensor, Variable
  from plugrad.dtype import dtypes

  def e(*shape, dtype=dtypes.float32): return Tensor.empty(*shape, dtype=dtype, device=dev)
  out: list[tuple[str, Callable[[], list]]] = []
  def case(name: str): return lambda fn: out.append((name, fn))

  for m, k, n in ((64, 64, 64), (256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096), (1, 4096, 4096), (1, 576, 49152),
                  (4, 576, 1536), (8, 4096, 4096), (512, 64, 512), (100, 300, 70), (33, 17, 65), (2048, 128, 2048)):
    case(f"matmul_{m}x{k}x{n}")(lambda m=m, k=k, n=n: [e(m, k) @ e(k, n)])
  for m, k, n in ((256, 256, 256), (1024, 1024, 1024), (1, 4096, 4096), (4, 576, 1536)):
    case(f"matmul_bT_{m}x{k}x{n}")(lambda m=m, k=k, n=n: [e(m, k) @ e(n, k).T])
    case(f"matmul_aT_{m}x{k}x{n}")(lambda m=m, k=k, n=n: [e(k, m).T @ e(k, n)])
  case("matmul_expr_operand")(lambda: [(e(512, 512) * 2 + 1).relu() @ e(512, 512)])
  case("matmul_expr_weight")(lambda: [e(256, 512) @ (e(512, 512).exp() * 0.5)])
  case("matmul_bias_relu")(lambda: [(e(128, 256) @ e(256, 384) + e(384)).relu()])
  case("matmul_batched")(lambda: [e(8, 64, 32) @ e(8, 32, 64)])
  case("matmul_symbolic_rows")(lambda: [e(64, 576)[:Variable("T", 1, 16).bind(5) * 4] @ e(576, 1536)])
  case("matmul_int32")(lambda: [e(64, 64, dtype=dtypes.int32) @ e(64, 64, dtype=dtypes.int32)])
  for dt in ("float16", "bfloat16"):
    d = getattr(dtypes, dt)
    for s in (64, 256):
      case(f"matmul_{dt}_{s}")(lambda d=d, s=s: [e(s, s, dtype=d) @ e(s, s, dtype=d)])
    case(f"matmul_{dt}_acc32")(lambda d=d: [(e(128, 64, dtype=d) @ e(64, 256, dtype=d)).float()])
    case(f"elementwise_{dt}")(lambda d=d: [(e(1000, dtype=d) * e(1000, dtype=d) + 1).exp()])

  def conv(bs, cin, cout, hw, k, stride=1, pad=1, groups=1, grads=False):
    def build():
      x, w = Tensor.empty(bs, cin, hw, hw, device=dev, requires_grad=True), Tensor.empty(cout, cin // groups, k, k, device=dev, requires_grad=True)
      y = x.conv2d(w, stride=stride, padding=pad, groups=groups)
      if not grads: return [y]
      y.sum().backward()
      return [x.grad, w.grad]
    return build
  for tag, kw in (("3x3", {}), ("3x3_s2", {"stride": 2}), ("grouped4", {"groups": 4}), ("1x1", {"k": 1, "pad": 0}),
                  ("depthwise", {"groups": 32, "cout": 32})):
    args = {"bs": 8, "cin": 32, "cout": 64, "hw": 28, "k": 3, **kw}
    case(f"conv_{tag}_fwd")(conv(**args))
    case(f"conv_{tag}_grads")(conv(**args, grads=True))
  case("conv_big_fwd")(conv(32, 64, 64, 56, 3))
  case("conv_small_grads")(conv(4, 16, 16, 14, 3, grads=True))

  case("sum_rows")(lambda: [e(512, 1024).sum(1)])
  case("sum_cols")(lambda: [e(512, 1024).sum(0)])
  case("sum_all")(lambda: [e(1 << 20).sum()])
  case("max_rows")(lambda: [e(256, 300).max(1)])
  case("mean_var")(lambda: [e(64, 4096).mean(1), e(64, 4096).var(1)])
  case("argmax")(lambda: [e(32, 1000).argmax(1)])
  case("softmax_512")(lambda: [e(64, 512).softmax(-1)])
  case("softmax_8192")(lambda: [e(16, 8192).softmax(-1)])
  case("log_softmax")(lambda: [e(128, 1000).log_softmax(-1)])
  case("layernorm")(lambda: [e(64, 768).layernorm()])
  case("rms_norm")(lambda: [e(32, 576) * (e(32, 576).square().mean(-1, keepdim=True) + 1e-5).rsqrt()])
  case("cumsum")(lambda: [e(64, 256).cumsum(1)])
  case("elementwise")(lambda: [(e(4096) * 2 + e(4096)).exp().sqrt(), (e(33, 65) > 0).where(e(33, 65), 0.0)])
  case("elementwise_ints")(lambda: [(e(4096, dtype=dtypes.int32) * 3 + 7) % 5, e(1024, dtype=dtypes.uint8).cast(dtypes.float32)])
  for dt in ("fp8e4m3", "fp8e5m2"):
    d = getattr(dtypes, dt)
    case(f"elementwise_{dt}")(lambda d=d: [(e(1000, dtype=d) * e(1000, dtype=d) + 1).cast(dtypes.float32), (e(1000) * 3).cast(d),
                                           e(256, dtype=d).cast(dtypes.bfloat16), e(256, dtype=d).max(0)])
  case("elementwise_f64")(lambda: [(e(512, dtype=dtypes.float64).sin() + e(512, dtype=dtypes.float64).exp2()).sqrt().log2()])
  case("elementwise_f16_math")(lambda: [e(512, dtype=dtypes.float16).sin(), e(512, dtype=dtypes.bfloat16).exp2() * 2,
                                        e(512, dtype=dtypes.bfloat16).cast(dtypes.float16)])
  case("gelu_silu")(lambda: [e(1000, 64).gelu(), e(1000, 64).silu()])
  case("pow")(lambda: [e(1024) ** e(1024), e(1024) ** 2.5])
  case("attention")(lambda: [e(1, 4, 64, 16).scaled_dot_product_attention(e(1, 4, 64, 16), e(1, 4, 64, 16), is_causal=True)])
  case("sum_symbolic")(lambda: [e(64, 256)[:Variable("n", 1, 16).bind(3) * 4].sum(0)])
  case("transpose_copy")(lambda: [e(256, 512).T.contiguous()])
  case("pad_cat")(lambda: [e(30, 30).pad(((1, 1), (2, 2))), e(10, 20).cat(e(5, 20))])

  out.extend(llm_cases(dev))
  out.extend(quant_cases(dev))
  return out


def llm_cases(dev: str) -> list[tuple[str, Callable[[], list]]]:
  """A tiny llama (tests/llm/llm_helpers.py's config): its decode step, the batched 4-slot decode step and a symbolic
  prefill (generate.py's graphs, scheduled instead of realized), float32 and Q8_0/Q4_0 weights."""
  import numpy as np

  from plugrad import Tensor
  from plugrad.apps.llm.generate import PREFILL_MULTIPLE, BatchGenerator, Generator
  from plugrad.apps.llm.model import Config, Transformer

  def config(dim: int) -> Config:
    return Config(arch="llama", dim=dim, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=dim // 4, ffn_dim=dim * 3 // 2,
                  vocab_size=64, norm_eps=1e-5, rope_theta=10000.0, rope_dim=dim // 4, rope_neox=False)

  def weights(cfg: Config, qtype: str | None) -> dict:
    rng = np.random.default_rng(0)
    def r(*shape, scale=0.3): return (rng.standard_normal(shape) * scale).astype(np.float32)
    hd, w = cfg.head_dim, {"token_embd.weight": r(cfg.vocab_size, cfg.dim, scale=1.0), "output_norm.weight": 1 + r(cfg.dim, scale=0.1)}
    for i in range(cfg.n_layers):
      p = f"blk.{i}."
      w.update({p + "attn_norm.weight": 1 + r(cfg.dim, scale=0.1), p + "ffn_norm.weight": 1 + r(cfg.dim, scale=0.1),
                p + "attn_q.weight": r(cfg.n_heads * hd, cfg.dim), p + "attn_k.weight": r(cfg.n_kv_heads * hd, cfg.dim),
                p + "attn_v.weight": r(cfg.n_kv_heads * hd, cfg.dim), p + "attn_output.weight": r(cfg.dim, cfg.n_heads * hd),
                p + "ffn_gate.weight": r(cfg.ffn_dim, cfg.dim), p + "ffn_up.weight": r(cfg.ffn_dim, cfg.dim),
                p + "ffn_down.weight": r(cfg.dim, cfg.ffn_dim)})
    out = {k: Tensor(v, device=dev) for k, v in w.items()}
    if qtype is not None:
      for k, v in w.items():
        if k.startswith("blk.") and v.ndim == 2: out[k] = quantized(dev, qtype, *v.shape, seed=len(k))
    return out

  def graphs(tag: str, dim: int, qtype: str | None) -> list[tuple[str, Callable[[], list]]]:
    state: dict = {}
    def model(batch: int) -> Transformer:
      if batch not in state: state[batch] = Transformer(config(dim), weights(config(dim), qtype), max_context=64, batch=batch)
      return state[batch]
    def decode() -> list:
      g = Generator(model(1))
      return [model(1).forward(g.inp1, g.v_start.bind(5), keys_len=g.v_keys.bind(2) * PREFILL_MULTIPLE)]
    def prefill() -> list:
      g, m = Generator(model(1)), PREFILL_MULTIPLE
      T, start, last, keys = g.v_len.bind(3), g.v_start.bind(0), g.v_last.bind(5), g.v_keys.bind(3)
      return [model(1).forward(g.inp[:, :T * m], start, last, keys * m, fused=model(1).fused_long_prefill())]
    def short_prefill() -> list:
      g, m = Generator(model(1)), PREFILL_MULTIPLE
      T, start, last, keys = g.v_short.bind(2), g.v_start.bind(0), g.v_last.bind(5), g.v_keys.bind(2)
      return [model(1).forward(g.inp[:, :T * m], start, last, keys * m, fused=True)]
    def batched() -> list:
      bg = BatchGenerator(model(4))
      keys, pos = bg.v_keys.bind(2), [v.bind(3 + i) for i, v in enumerate(bg.v_pos)]
      n = keys * PREFILL_MULTIPLE
      return [model(4).forward_slots(bg.inp_b, pos, (bg.cos_b, bg.sin_b, bg.cos_lb, bg.sin_lb), n,
                                     (bg.mask_b[:, :, :, :, 0:n], bg.mask_lb[:, :, :, :, 0:n]))]
    return [(f"llm_{tag}_decode", decode), (f"llm_{tag}_prefill", prefill), (f"llm_{tag}_short_prefill", short_prefill),
            (f"llm_{tag}_batched4", batched)]
  return graphs("f32", 32, None) + graphs("q8_0", 64, "Q8_0") + graphs("q4_0", 64, "Q4_0")


QTYPES = {"Q4_0": (32, 18, (0,)), "Q4_1": (32, 20, (0, 2)), "Q5_0": (32, 22, (0,)), "Q5_1": (32, 24, (0, 2)), "Q8_0": (32, 34, (0,)),
          "Q2_K": (256, 84, (80, 82)), "Q3_K": (256, 110, (108,)), "Q4_K": (256, 144, (0, 2)), "Q5_K": (256, 176, (0, 2)),
          "Q6_K": (256, 210, (208,))}


def quantized(dev: str, qtype: str, rows: int, cols: int, seed: int = 0):
  """A repacked (rows, cols) weight of random blocks with finite float16 scales (as tests/llm/test_repack.py builds them)."""
  import numpy as np

  from plugrad import Tensor
  from plugrad.apps.llm.quant import repack
  from plugrad.nn.serialize import dequantize
  elems, tsize, f16 = QTYPES[qtype]
  rng = np.random.default_rng(seed)
  b = rng.integers(0, 256, (rows * cols // elems, tsize), dtype=np.uint8)
  for off in f16: b[:, off:off + 2] = rng.uniform(-2, 2, len(b)).astype(np.float16).view(np.uint8).reshape(-1, 2)
  return Tensor(repack(dequantize(Tensor(b, device=dev).realize(), qtype).reshape(rows, -1).uop))


def quant_cases(dev: str) -> list[tuple[str, Callable[[], list]]]:
  """Every GGUF type's products through apps/llm/quant.py: the model's `linear` for one token, 4 rows (a batched step)
  and a symbolic prefill, and each of dot2_linear / dot4_linear / rows_linear / blockwise_linear where it applies."""
  from plugrad import Tensor, Variable
  from plugrad.apps.llm import quant
  from plugrad.apps.llm.model import linear
  out: list[tuple[str, Callable[[], list]]] = []
  rows, cols = 64, 512
  weights: dict = {}
  def w(q: str):
    if q not in weights: weights[q] = quantized(dev, q, rows, cols, seed=len(q) * 7 + ord(q[1]))
    return weights[q]
  def x(*shape): return Tensor.empty(*shape, device=dev)
  for q in QTYPES:
    out.append((f"quant_{q}_linear_1", lambda q=q: [linear(x(1, 1, cols), w(q))]))
    out.append((f"quant_{q}_linear_4", lambda q=q: [linear(x(4, 1, cols), w(q))]))
    out.append((f"quant_{q}_linear_prefill", lambda q=q: [linear(x(1, 32, cols)[:, :Variable("T", 1, 8).bind(3) * 4], w(q))]))
    def path(fn, q=q, R=1):
      def build() -> list:
        bw, lanes = quant.blockwise_of(w(q).uop), quant.vector_lanes(dev) or 8   # (a GPU: its kernels as the CPU shapes them)
        return [fn(x(R, 1, cols), bw, rows, lanes)]
      return build
    out.append((f"quant_{q}_blockwise", path(quant.blockwise_linear)))
    out.append((f"quant_{q}_dot2_1", path(quant.dot2_linear)))
    out.append((f"quant_{q}_dot2_4", path(quant.dot2_linear, R=4)))
    out.append((f"quant_{q}_dot4_1", path(quant.dot4_linear)))
    out.append((f"quant_{q}_dot4_4", path(quant.dot4_linear, R=4)))
    out.append((f"quant_{q}_rows_1", path(lambda xx, bw, r, lanes: quant.rows_linear(xx, bw, r))))
    out.append((f"quant_{q}_rows_4", path(lambda xx, bw, r, lanes: quant.rows_linear(xx, bw, r), R=4)))
  return out


# ---------------------------------------------------------------------------- rendering (one group, in its own process)

def set_cpu_record(kind: str) -> None:
  """The CPU renderer's capability record of host kind `kind` (what tests/conftest.py's cpu_host applies)."""
  from plugrad.device import Device
  from plugrad_cpu.device import HOST_KINDS, simd_caps
  ren = Device["CPU"].renderer
  caps = simd_caps(HOST_KINDS[kind])
  if hasattr(ren, "caps") and not callable(ren.caps):
    import dataclasses
    ren.caps = dataclasses.replace(ren.caps, **caps)
  else:
    for k, v in caps.items(): setattr(ren, k, v)


def _opts_of(spec_or_opts) -> list:
  return [[str(getattr(o.kind, "name", o.kind)), o.rid, o.amount, list(o.arg)] for o in (spec_or_opts or [])]


def programs(it, ren) -> list[tuple[str, str, list]]:
  """(name, source, optimizations) of the program the engine compiles for schedule item `it` on `ren`: the opts the
  scheduler chose for it (packing kernels are items of their own), else the pipeline's choice."""
  from plugrad.codegen import get_program
  opts = getattr(it, "opts", None)
  spec = get_program(it.ast, ren) if opts is None else get_program(it.ast, ren, list(opts))
  return [(spec.name, spec.src, _opts_of(opts))]


def render_group(group: str, out: Path, only: list[str]) -> None:
  from plugrad import tensor
  from plugrad.device import Device
  from plugrad.uop.ops import Ops
  dev = GROUPS[group]["DEV"]
  if group.startswith("cpu_"): set_cpu_record(group[4:])
  renderers = [(group if not group.startswith("emu_") else f"PYTHON_{group[4:]}", Device[dev].renderer)]
  if group.startswith("emu_CUDA"):
    from plugrad_nv.renderer import CUDARenderer
    renderers.append((f"CUDA_{'sm_80' if group.endswith('SM80') else 'sm_90'}", CUDARenderer("sm_80" if group.endswith("SM80") else "sm_90")))
  elif group.startswith("emu_AMD"):
    from plugrad_amd.renderer import AMDGPURenderer
    arch = {"emu_AMD": "gfx1100", "emu_AMD_RDNA4": "gfx1201", "emu_AMD_CDNA3": "gfx942"}[group]
    renderers.append((f"AMDGPU_{arch}", AMDGPURenderer(arch)))
  digests: dict[str, dict] = {name: {} for name, _ in renderers}
  skipped: list[str] = []
  st = time.perf_counter()
  for cname, build in cases(dev):
    if only and not any(o in cname for o in only): continue
    try:
      ts = build()
      items = [it for it in ts[0].schedule(*ts[1:]) if it.ast.op is Ops.SINK]
      tensor._pending_assigns.clear()   # the KV cache writes a scheduled (not realized) step leaves pending
    except (ValueError, NotImplementedError) as ex:   # a quant path that doesn't apply to this device's weights
      skipped.append(f"{cname}: {type(ex).__name__}: {str(ex)[:120]}")
      continue
    for rname, ren in renderers:
      progs, errors = [], []
      for it in items:
        try: progs += programs(it, ren)
        except (NotImplementedError, ValueError) as ex: errors.append(f"{type(ex).__name__}: {str(ex)[:200]}")
      d = out / rname
      d.mkdir(parents=True, exist_ok=True)
      for i, (name, src, opts) in enumerate(progs):
        key = f"{cname}/{i:02d}_{name}"
        (d / (key.replace("/", "__") + ".src")).write_text(src)
        digests[rname][key] = {"sha256": hashlib.sha256(src.encode()).hexdigest(), "opts": opts}
      for j, err in enumerate(errors): digests[rname][f"{cname}/error{j}"] = {"error": err}
  for rname, dg in digests.items():
    (out / rname).mkdir(parents=True, exist_ok=True)
    (out / rname / "digests.json").write_text(json.dumps(dg, indent=1, sort_keys=True))
  (out / f"{group}.skipped.txt").write_text("\n".join(skipped) + "\n")
  print(f"{group}: {', '.join(f'{r} {len(dg)} kernels' for r, dg in digests.items())}, {len(skipped)} cases skipped, "
        f"{time.perf_counter() - st:.0f} s", flush=True)


# ---------------------------------------------------------------------------- driver and comparison

def run_all(out: Path, groups: list[str], only: list[str]) -> None:
  out.mkdir(parents=True, exist_ok=True)
  for g in groups:
    cache = os.environ.get("CORPUS_CACHE_DIR", tempfile.gettempdir() + "/plugrad-corpus-cache")
    env = {**os.environ, **PINNED_ENV, **GROUPS[g], "PLUGRAD_CACHE_DIR": cache}
    if "EMULATE" not in GROUPS[g]: env.pop("EMULATE", None)
    subprocess.run([sys.executable, __file__, "--group", g, "--out", str(out), "--cases", ",".join(only)], env=env, check=True)


def compare(a: Path, b: Path) -> bool:
  ok = True
  for d in sorted(p for p in a.iterdir() if (p / "digests.json").exists()):
    da = json.loads((d / "digests.json").read_text())
    fb = b / d.name / "digests.json"
    db = json.loads(fb.read_text()) if fb.exists() else {}
    same = [k for k in da if k in db and da[k].get("sha256") == db[k].get("sha256") and da[k].get("error") == db[k].get("error")]
    diff = [k for k in da if k in db and k not in same]
    missing, extra = [k for k in da if k not in db], [k for k in db if k not in da]
    opts_diff = [k for k in same if da[k].get("opts") != db[k].get("opts")]
    print(f"{d.name:18s} compared {len(da):4d}  identical {len(same):4d}  different {len(diff):3d}  missing {len(missing):3d}  "
          f"extra {len(extra):3d}  (opts recorded differently: {len(opts_diff)})")
    for k in (diff + missing + extra)[:12]: print(f"    {k}")
    ok &= not (diff or missing or extra)
  return ok


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", type=Path)
  p.add_argument("--groups", default=",".join(GROUPS))
  p.add_argument("--group", help=argparse.SUPPRESS)
  p.add_argument("--cases", default="", help="only the cases whose name contains one of these (comma-separated)")
  p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
  a = p.parse_args()
  if a.compare: sys.exit(0 if compare(*a.compare) else 1)
  if a.out is None: p.error("--out is required")
  only = [c for c in a.cases.split(",") if c]
  if a.group: render_group(a.group, a.out, only)
  else: run_all(a.out, [g.strip() for g in a.groups.split(",") if g.strip()], only)
