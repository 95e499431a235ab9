"""Train a small llama-architecture language model from scratch on the Python standard library's own source files.

Offline end to end: the corpus is this interpreter's stdlib (`sysconfig`'s "stdlib" path, every *.py file, sorted,
as bytes), each file a document; the tokenizer is bytes (vocabulary 256). A batch row is a window of one document
(mlperf-style samples): a document shorter than the window is padded, and its padding targets carry no loss (the
cross entropy's ignore_index). The model is llama's: token embedding, pre-norm blocks of RMSNorm -> causal multi-head
attention with rotary position embeddings (neox pairing; Q, K and V from one fused projection whose rows are grouped
by head) -> residual, RMSNorm -> SwiGLU MLP -> residual, a final RMSNorm and an untied output head. Training: AdamW
(decoupled weight decay on matrices only), linear warm-up then cosine decay of the learning rate, global gradient-norm
clipping, gradient accumulation over micro-batches, the whole step (forward, backward, clipping, update) one TinyJit
capture. Checkpoints are safetensors files (`ckpt_<step>.safetensors` under --out: the weights, AdamW's moments and
the config and step in the metadata; `--resume` continues from one on any layout), the loss curve a PNG written with
the standard library only (`loss.png`), the history a JSON file (`history.json`).

Layouts (docs/training.md, docs/multi.md): one device; `--mode dp --devices CPU:0,CPU:1` (data parallel: weights
replicated, every batch split by rows; each weight's gradient is the allreduced sum of its replicas' uses);
`--mode tp --devices ...` (tensor parallel: the fused QKV and MLP up/gate projections split by output rows, the
attention output and MLP down projections by input columns, the embedding and the output head by vocabulary, so the
loss is computed over vocabulary shards; norms replicated); `--distributed` under `mpirun -np N` (data parallel across
processes and hosts: each rank takes its rows of the global batch, the gradients are summed with MPI before the
clipped AdamW step). Every layout computes the same step, so its loss curve is the one-device curve.

Precision: float32 throughout. bfloat16 parameters or activations don't pay on this CPU backend today (its kernels
convert 16-bit values lane by lane and accumulate in float32 anyway), so mixed precision is left out rather than made slower.

With --compare-steps N (default 10), PyTorch CPU (if installed) trains the same model from the same initial weights
on the same batches, steps alternating with plugrad's, with the same thread count; tokens/s of both and the ratio
are reported, and the first step's losses must agree (the same weights and batch give the same loss).

  python examples/train_llama.py                         # ~10M parameters (--preset 10m), 300 steps
  python examples/train_llama.py --preset tiny --steps 5 # seconds: the smoke test's configuration
  python examples/train_llama.py --mode tp --devices CPU:0,CPU:1 --accum 2
  mpirun -np 2 python examples/train_llama.py --distributed --preset tiny --steps 20
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import struct
import sysconfig
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from plugrad import Tensor, TinyJit, distributed
from plugrad.apps.llm.model import apply_rope, rms_norm
from plugrad.device import Device
from plugrad.nn.optim import AdamW, OptimizerGroup, clip_grad_norm_
from plugrad.nn.state import get_state_dict, safe_load, safe_load_metadata, safe_save


@dataclass(frozen=True)
class Config:
  vocab: int = 256
  dim: int = 384
  layers: int = 6
  heads: int = 6
  hidden: int = 1024
  seq: int = 128
  rope_theta: float = 10000.0
  eps: float = 1e-5


PRESETS = {"10m": Config(), "tiny": Config(dim=32, layers=2, heads=2, hidden=64, seq=32)}
PAD = -1   # the target of a padding position: sparse_categorical_crossentropy's ignore_index


def param_count(cfg: Config) -> int:
  per_layer = 4 * cfg.dim * cfg.dim + 3 * cfg.dim * cfg.hidden + 2 * cfg.dim
  return cfg.layers * per_layer + 2 * cfg.vocab * cfg.dim + cfg.dim


# ---------------------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Corpus:
  """Documents as one uint8 array and each one's [start, end) in it."""
  data: np.ndarray
  starts: np.ndarray
  ends: np.ndarray

  def split(self, frac: float) -> tuple[Corpus, Corpus]:
    """The first `frac` of the documents, and the rest (at least one each)."""
    k = min(max(1, int(len(self.starts) * frac)), len(self.starts) - 1)
    return Corpus(self.data, self.starts[:k], self.ends[:k]), Corpus(self.data, self.starts[k:], self.ends[k:])


def load_corpus(max_bytes: int, root: str | None = None) -> Corpus:
  """The *.py files under `root` (default: the stdlib; sorted by path, so the corpus is the same on every run), each
  a document of at least 2 bytes, up to `max_bytes` in all."""
  base = Path(root or sysconfig.get_paths()["stdlib"])
  if not base.is_dir(): raise FileNotFoundError(f"corpus directory {base} doesn't exist")
  docs, n = [], 0
  for p in sorted(base.rglob("*.py")):
    if "site-packages" in p.parts: continue
    try: b = p.read_bytes()[:max_bytes - n]
    except OSError: continue
    if len(b) < 2: continue
    docs.append(b)
    n += len(b)
    if n >= max_bytes: break
  if n < 1024 or len(docs) < 2: raise ValueError(f"corpus under {base} has only {n} bytes in {len(docs)} documents of Python source")
  ends = np.cumsum([len(d) for d in docs])
  return Corpus(np.frombuffer(b"".join(docs), np.uint8).copy(), ends - [len(d) for d in docs], ends)


def batch_at(corpus: Corpus, step: int, batch: int, seq: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Step `step`'s batch (a function of seed and step only, so a resumed run reads what an uninterrupted one does):
  `batch` rows, each a window of a random document from a random start; x the bytes, y the next bytes, int32
  (batch, seq); where the document ends first, x is 0 and y is PAD."""
  rng = np.random.default_rng([seed, step])
  x, y = np.zeros((batch, seq), np.int32), np.full((batch, seq), PAD, np.int32)
  for r, d in enumerate(rng.integers(0, len(corpus.starts), batch)):
    s, e = int(corpus.starts[d]), int(corpus.ends[d])
    off = s + int(rng.integers(0, max(1, e - s - seq)))
    w = corpus.data[off:min(e, off + seq + 1)]
    x[r, :len(w) - 1], y[r, :len(w) - 1] = w[:-1], w[1:]
  return x, y


# ---------------------------------------------------------------------------------------------------------- model
def weight_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
  """Every weight's name and shape, (out, in) for matrices. wqkv (3*dim, dim) holds, per head h, rows [q_h; k_h; v_h]
  (head_dim rows each): a split by rows keeps whole heads."""
  shapes = {"tok": (cfg.vocab, cfg.dim), "norm": (cfg.dim,), "out": (cfg.vocab, cfg.dim)}
  for i in range(cfg.layers):
    shapes |= {f"layers.{i}.attn_norm": (cfg.dim,), f"layers.{i}.ffn_norm": (cfg.dim,), f"layers.{i}.wqkv": (3 * cfg.dim, cfg.dim),
               f"layers.{i}.wo": (cfg.dim, cfg.dim), f"layers.{i}.w1": (cfg.hidden, cfg.dim), f"layers.{i}.w3": (cfg.hidden, cfg.dim),
               f"layers.{i}.w2": (cfg.dim, cfg.hidden)}
  return shapes


def init_weights(cfg: Config, seed: int) -> dict[str, np.ndarray]:
  """Initial weights (numpy float32): N(0, 0.02), residual output projections (wo, w2) N(0, 0.02/sqrt(2*layers)), norms 1."""
  rng = np.random.default_rng(seed)
  res = 0.02 / math.sqrt(2 * cfg.layers)
  def init(name: str, shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) == 1: return np.ones(shape, np.float32)
    return rng.normal(0, res if name.endswith(("wo", "w2")) else 0.02, shape).astype(np.float32)
  return {k: init(k, shape) for k, shape in weight_shapes(cfg).items()}


def rope(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
  hd = cfg.dim // cfg.heads
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
  ang = np.arange(cfg.seq, dtype=np.float64)[:, None] * inv[None, :]
  return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class Block:
  def __init__(self, w: dict[str, np.ndarray], i: int):
    for k in ("attn_norm", "ffn_norm", "wqkv", "wo", "w1", "w3", "w2"): setattr(self, k, Tensor(w[f"layers.{i}.{k}"]))


class Llama:
  """The model in plugrad; weights (out, in) like torch's Linear."""
  def __init__(self, cfg: Config, w: dict[str, np.ndarray]):
    self.cfg = cfg
    self.tok, self.norm, self.out = Tensor(w["tok"]), Tensor(w["norm"]), Tensor(w["out"])
    self.layers = [Block(w, i) for i in range(cfg.layers)]
    c, s = rope(cfg)
    self._cos, self._sin = Tensor(c).realize(), Tensor(s).realize()

  def __call__(self, tokens: Tensor) -> Tensor:
    cfg = self.cfg
    B, T = tokens.shape
    H, hd = cfg.heads, cfg.dim // cfg.heads
    x = tokens.one_hot(cfg.vocab).cast("float32") @ self.tok  # the embedding as a matmul: its gradient is one too
    cos, sin = self._cos[:T], self._sin[:T]
    for b in self.layers:
      # the normalized inputs are materialized (here and below): fused into the matmuls they would be recomputed per
      # column block, and the weight gradients (h.T @ dy) would read an expression instead of a packed operand
      h = rms_norm(x, b.attn_norm, cfg.eps).contiguous()
      qkv = (h @ b.wqkv.T).reshape(B, T, H, 3, hd)
      q = apply_rope(qkv[:, :, :, 0], cos, sin, neox=True).transpose(1, 2)
      k = apply_rope(qkv[:, :, :, 1], cos, sin, neox=True).transpose(1, 2)
      a = q.scaled_dot_product_attention(k, qkv[:, :, :, 2].transpose(1, 2), is_causal=True).transpose(1, 2).reshape(B, T, cfg.dim)
      x = x + a @ b.wo.T
      h = rms_norm(x, b.ffn_norm, cfg.eps).contiguous()
      x = x + ((h @ b.w1.T).silu() * (h @ b.w3.T)) @ b.w2.T
    return rms_norm(x, self.norm, cfg.eps).contiguous() @ self.out.T


def torch_model(torch, cfg: Config, w: dict[str, np.ndarray]):
  """The same model in PyTorch (same weights, same math, neox rotary pairs (x[i], x[i + d/2]), the head-grouped QKV)."""
  F = torch.nn.functional
  P = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in w.items()})
  c, s = (torch.from_numpy(t) for t in rope(cfg))
  def norm(x, g): return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.eps) * g
  def rot(x, T):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cc, ss = c[:T].reshape(1, T, 1, half), s[:T].reshape(1, T, 1, half)
    return torch.cat([x1 * cc - x2 * ss, x2 * cc + x1 * ss], -1)
  def forward(tokens):
    B, T = tokens.shape
    H, hd = cfg.heads, cfg.dim // cfg.heads
    x = P["tok"][tokens]
    for i in range(cfg.layers):
      g = lambda k: P[f"layers_{i}_{k}"]
      h = norm(x, g("attn_norm"))
      qkv = (h @ g("wqkv").T).reshape(B, T, H, 3, hd)
      q, k, v = (rot(qkv[:, :, :, 0], T), rot(qkv[:, :, :, 1], T), qkv[:, :, :, 2])
      a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
      x = x + a.transpose(1, 2).reshape(B, T, cfg.dim) @ g("wo").T
      h = norm(x, g("ffn_norm"))
      x = x + (F.silu(h @ g("w1").T) * (h @ g("w3").T)) @ g("w2").T
    return norm(x, P["norm"]) @ P["out"].T
  return P, forward


# ---------------------------------------------------------------------------------------------------------- layouts
MODES = ("single", "dp", "tp")
# tensor parallel: each weight's split axis ((out, in) layout); the norms (not listed) are replicated
TP_AXES = {"tok": 0, "out": 0, "wqkv": 0, "w1": 0, "w3": 0, "wo": 1, "w2": 1}


@dataclass(frozen=True)
class Layout:
  """Where the model and each batch live: `mode` single (`devices` None: the default device, or one device), dp
  (weights replicated, batches split by rows) or tp (weights split as TP_AXES, batches replicated)."""
  mode: str = "single"
  devices: tuple[str, ...] | None = None

  def check(self, cfg: Config, batch: int) -> None:
    if self.mode not in MODES: raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
    k = len(self.devices or ())
    if self.mode != "single" and k < 2: raise ValueError(f"--mode {self.mode} needs 2 or more --devices, got {self.devices}")
    if self.mode == "single" and k > 1: raise ValueError(f"{k} devices need --mode dp or tp")
    if self.mode == "dp" and batch < k: raise ValueError(f"data parallel over {k} devices needs a batch of >= {k} rows, got {batch}")
    for what, n in (("heads", cfg.heads), ("hidden", cfg.hidden), ("vocab", cfg.vocab)):
      if self.mode == "tp" and n % k: raise ValueError(f"tensor parallel over {k} devices needs {what} ({n}) divisible by {k}")

  def weight(self, name: str, t: Tensor) -> Tensor:
    """Weight `name` (a state-dict key) placed: realized on its device(s)."""
    if self.mode == "single": return (t.to(self.devices[0]) if self.devices else t).realize()
    axis = TP_AXES.get(name.rsplit(".", 1)[-1]) if self.mode == "tp" else None
    return (t.shard(self.devices, axis) if axis is not None else t.to(self.devices)).realize()

  def data(self, a: np.ndarray, rows_axis: int = 0) -> Tensor:
    """A batch array placed: split by rows (dp), replicated (tp), or on the one device."""
    if self.mode == "dp": return Tensor(a).shard(self.devices, rows_axis)
    if self.mode == "tp": return Tensor(a).to(self.devices)
    return Tensor(a, device=self.devices[0] if self.devices else None)

  @property
  def device_names(self) -> tuple[str, ...]: return self.devices or (Device.DEFAULT,)


def place_model(model: Llama, layout: Layout) -> None:
  """Every weight (and the rotary tables, replicated) where `layout` puts it."""
  for name, t in params_of(model).items(): t.replace(layout.weight(name, t))
  model._cos, model._sin = (layout.weight("rope", t) for t in (model._cos, model._sin))


# ---------------------------------------------------------------------------------------------------------- training
def lr_at(step: int, steps: int, lr: float, warmup: int, min_lr: float) -> float:
  """Linear warm-up over `warmup` steps, then cosine decay from lr to min_lr at the last step."""
  if step < warmup: return lr * (step + 1) / warmup
  t = (step - warmup) / max(1, steps - warmup - 1)
  return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def make_optimizer(model: Llama, lr: float, wd: float) -> OptimizerGroup:
  """AdamW with weight decay on the matrices, none on the norms' gains (the usual llama recipe)."""
  ps = params_of(model)
  mats = [t for t in ps.values() if t.ndim == 2]
  gains = [t for t in ps.values() if t.ndim == 1]
  return OptimizerGroup(AdamW(mats, lr=lr, b1=0.9, b2=0.95, weight_decay=wd), AdamW(gains, lr=lr, b1=0.9, b2=0.95, weight_decay=0.0))


def params_of(model: Llama) -> dict[str, Tensor]:
  return {k: t for k, t in get_state_dict(model).items() if not k.startswith("_") and k != "cfg"}


def optimizer_state(model: Llama, opt: OptimizerGroup) -> dict[str, Tensor]:
  """AdamW's state by parameter name: `opt.m.<name>`, `opt.v.<name>`, and each group's bias-correction powers."""
  names = {id(t): k for k, t in params_of(model).items()}
  out: dict[str, Tensor] = {}
  for i, o in enumerate(opt.optimizers):
    out |= {f"opt.{i}.b1_t": o.b1_t, f"opt.{i}.b2_t": o.b2_t}
    for p, m, v in zip(o.params, o.m, o.v): out |= {f"opt.m.{names[id(p)]}": m, f"opt.v.{names[id(p)]}": v}
  return out


def accumulate(model: Llama, params: list[Tensor], x: Tensor, y: Tensor, n_valid: Tensor) -> Tensor:
  """Forward and backward over the micro-batches x[i], y[i] (x, y: (accum, rows, seq)), the gradients summed in the
  params' .grad (realized after each micro-batch, so only one micro-batch's activations live at a time). Each loss is
  its targets' summed cross entropy over `n_valid`, the whole batch's count of non-padding targets: the sum over
  micro-batches is the batch's mean loss, and its gradient the whole batch's."""
  total = None
  for i in range(x.shape[0]):
    loss = model(x[i]).sparse_categorical_crossentropy(y[i], ignore_index=PAD, reduction="sum") / n_valid
    loss.backward()
    if x.shape[0] > 1: Tensor.realize_all(loss, *(p.grad for p in params))
    total = loss if total is None else total + loss
  assert total is not None
  return total


def make_steps(model: Llama, opt: OptimizerGroup, clip: float, dist: bool) -> tuple[Callable, Callable | None]:
  """One process: a jitted step(x, y, n_valid) -> (loss, grad norm) doing everything. Under MPI (`dist`): a jitted
  grads(x, y, n_valid) -> (loss, *grads) on this rank's rows and a jitted apply(*grads) -> grad norm (clipping and
  AdamW); between them the caller sums the losses and gradients over the ranks."""
  params = opt.params
  @TinyJit
  @Tensor.train()
  def step(x: Tensor, y: Tensor, n_valid: Tensor) -> tuple[Tensor, Tensor]:
    opt.zero_grad()
    loss = accumulate(model, params, x, y, n_valid)
    gnorm = clip_grad_norm_(params, clip)
    loss.realize(gnorm, *opt.schedule_step())
    return loss, gnorm
  if not dist: return step, None
  @TinyJit
  @Tensor.train()
  def grads(x: Tensor, y: Tensor, n_valid: Tensor) -> list[Tensor]:
    opt.zero_grad()
    out = [accumulate(model, params, x, y, n_valid), *(p.grad for p in params)]
    Tensor.realize_all(*out)
    return out
  @TinyJit
  @Tensor.train()
  def apply(*gs: Tensor) -> Tensor:
    for p, g in zip(params, gs): p.grad = g
    gnorm = clip_grad_norm_(params, clip)
    gnorm.realize(*opt.schedule_step())
    return gnorm
  return grads, apply


def write_png(path: Path, series: list[tuple[list[float], list[float], tuple[int, int, int]]], w: int = 640, h: int = 400) -> None:
  """A line plot (x, y, rgb) per series on a white canvas with a frame and a tick at each y integer, as an RGB PNG
  written with zlib and struct (no plotting library)."""
  img = np.full((h, w, 3), 255, np.uint8)
  xs = [x for s in series for x in s[0]] or [0.0]
  ys = [y for s in series for y in s[1] if math.isfinite(y)] or [0.0]
  x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
  if x1 == x0: x1 = x0 + 1
  if y1 == y0: y1 = y0 + 1
  m = 30
  def px(x, y): return int(m + (x - x0) / (x1 - x0) * (w - 2 * m)), int(h - m - (y - y0) / (y1 - y0) * (h - 2 * m))
  img[m:h - m, m] = img[m:h - m, w - m] = img[m, m:w - m] = img[h - m, m:w - m + 1] = 0
  for t in range(math.ceil(y0), math.floor(y1) + 1): img[px(x0, t)[1], m - 6:m] = 0
  for xs_, ys_, rgb in series:
    pts = [px(x, y) for x, y in zip(xs_, ys_) if math.isfinite(y)]
    for (ax, ay), (bx, by) in zip(pts, pts[1:] or pts):
      n = max(abs(bx - ax), abs(by - ay), 1)
      for i in range(n + 1):
        cx, cy = round(ax + (bx - ax) * i / n), round(ay + (by - ay) * i / n)
        img[max(0, cy - 1):cy + 1, max(0, cx - 1):cx + 1] = rgb
  raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))
  def chunk(tag: bytes, data: bytes) -> bytes: return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
  path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                   chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


class TorchRun:
  """The same training in PyTorch CPU (same initial weights, batches, AdamW, clipping and learning rates), a step at a
  time alongside plugrad's: the oracle of the loss curve and the tokens/s peer."""
  def __init__(self, torch, cfg: Config, w0: dict[str, np.ndarray], lr: float, wd: float, clip: float, threads: int):
    self.torch, self.cfg, self.clip = torch, cfg, clip
    torch.set_num_threads(threads)
    self.P, self.fwd = torch_model(torch, cfg, w0)
    mats = [p for p in self.P.values() if p.ndim == 2]
    gains = [p for p in self.P.values() if p.ndim == 1]
    self.opt = torch.optim.AdamW([{"params": mats, "weight_decay": wd}, {"params": gains, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=1e-8)

  def step(self, x: np.ndarray, y: np.ndarray, lr_now: float) -> float:
    torch, F = self.torch, self.torch.nn.functional
    for g in self.opt.param_groups: g["lr"] = lr_now
    self.opt.zero_grad()
    logits = self.fwd(torch.from_numpy(x).long()).reshape(-1, self.cfg.vocab)
    loss = F.cross_entropy(logits, torch.from_numpy(y).long().reshape(-1), ignore_index=PAD, reduction="sum") / int((y != PAD).sum())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.P.values(), self.clip)
    self.opt.step()
    return float(loss.detach())


def _torch_run(cfg: Config, w0: dict[str, np.ndarray], lr: float, wd: float, clip: float, threads: int, restore: contextlib.ExitStack,
               flush_denormals: bool, log) -> TorchRun | None:
  try: import torch
  except ImportError:
    log("torch not installed: no comparison")
    return None
  torch.set_flush_denormal(flush_denormals)
  restore.callback(torch.set_flush_denormal, False)
  return TorchRun(torch, cfg, w0, lr, wd, clip, threads)


def _flush_denormals(layout: Layout, on: bool, restore: contextlib.ExitStack) -> None:
  """Flush float32 subnormals in every device of the layout that can (a CPU device's `flush_denormals`); restored on exit."""
  for name in dict.fromkeys(layout.device_names):
    dev = Device[name]
    if (was := getattr(dev, "flush_denormals", None)) is not None:
      dev.flush_denormals = on
      restore.callback(setattr, dev, "flush_denormals", was)


def _start(cfg: Config, seed: int, resume: str | Path | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
  """(initial weights, optimizer state to load, first step): fresh from the seed, or a checkpoint's."""
  if resume is None: return init_weights(cfg, seed), {}, 0
  _, _, meta = safe_load_metadata(str(resume))
  saved = json.loads((meta or {}).get("config", "null"))
  if saved != asdict(cfg): raise ValueError(f"checkpoint {resume} is of the model {saved}, not {asdict(cfg)}")
  arrays = {k: t.numpy() for k, t in safe_load(str(resume)).items()}
  w = {k: v for k, v in arrays.items() if not k.startswith("opt.")}
  if {k: v.shape for k, v in w.items()} != weight_shapes(cfg): raise ValueError(f"checkpoint {resume} doesn't hold this model's weights")
  return w, {k: v for k, v in arrays.items() if k.startswith("opt.")}, int((meta or {}).get("step", "0"))


def _load_optimizer(model: Llama, opt: OptimizerGroup, state: dict[str, np.ndarray]) -> None:
  """Write a checkpoint's AdamW state into the optimizer's buffers (each laid out as its parameter is)."""
  for k, t in optimizer_state(model, opt).items():
    if k not in state: raise ValueError(f"checkpoint has no optimizer state {k!r}")
    t.assign(Tensor(state[k].reshape(t.shape))).realize()


def train(cfg: Config, steps: int, batch: int, lr: float = 3e-3, min_lr: float = 3e-4, warmup: int = 20, wd: float = 0.1,
          clip: float = 1.0, seed: int = 0, corpus_bytes: int = 8 << 20, out: str | Path = "runs/llama", eval_every: int = 50,
          ckpt_every: int = 0, compare_steps: int = 10, flush_denormals: bool = True, log=print, layout: Layout = Layout(),
          accum: int = 1, dist: bool = False, resume: str | Path | None = None, corpus_root: str | None = None) -> dict:
  """Train; returns the history (losses, lrs, grad norms, val losses, tokens/s of plugrad and torch). A step reads
  `batch` rows as `accum` micro-batches. `layout` places the model and batches on devices; `dist` makes this process
  one rank of an MPI data-parallel job (run under mpirun), which takes its rows of every global batch; `resume` starts
  from a checkpoint (any layout, any rank count) at the step it was saved after. With `flush_denormals` (the default
  of TensorFlow's CPU kernels) float32 subnormals are flushed to zero in both plugrad's kernels and torch's: the
  backward pass's products of tiny gradients otherwise take the CPU's microcode path (a weight-gradient matmul 4x
  slower). Both modes are restored on return (torch's is the calling thread's, which numpy shares)."""
  rank, world = distributed.init() if dist else (0, 1)
  if batch % (accum * world): raise ValueError(f"batch {batch} must split into {accum} micro-batches on each of {world} ranks")
  layout.check(cfg, batch // accum // world)
  with contextlib.ExitStack() as restore:   # the floating-point modes the run switches, put back on return
    _flush_denormals(layout, flush_denormals, restore)
    out = Path(out)
    if rank == 0: out.mkdir(parents=True, exist_ok=True)
    train_docs, val_docs = load_corpus(corpus_bytes, corpus_root).split(0.95)
    vx, vy = batch_at(val_docs, 0, batch, cfg.seq, seed + 1)
    w0, opt_state, first = _start(cfg, seed, resume)
    model = Llama(cfg, w0)
    place_model(model, layout)
    opt = make_optimizer(model, lr, wd)
    if opt_state: _load_optimizer(model, opt, opt_state)
    step, apply = make_steps(model, opt, clip, dist)
    if rank == 0:
      log(f"llama: {param_count(cfg) / 1e6:.2f}M parameters {asdict(cfg)}; {len(train_docs.starts)} training documents "
          f"({len(train_docs.data) / 1e6:.1f} MB of stdlib source); batch {batch} x {cfg.seq} tokens in {accum} micro-batches; "
          f"{layout.mode} on {', '.join(layout.device_names)}{f', {world} MPI ranks' if dist else ''}; from step {first}")

    def val_loss() -> float:
      with Tensor.train(False):
        logits = model(layout.data(vx))
        return float(logits.sparse_categorical_crossentropy(layout.data(vy), ignore_index=PAD).item())

    threads = getattr(Device[layout.device_names[0]], "threads", os.cpu_count() or 1)
    ref = _torch_run(cfg, w0, lr, wd, clip, threads, restore, flush_denormals, log) if compare_steps and not dist and not first else None
    hist: dict = {"config": asdict(cfg), "layout": asdict(layout), "accum": accum, "world": world, "steps": [], "loss": [], "lr": [],
                  "grad_norm": [], "valid": [], "val_step": [], "val_loss": [], "step_s": [], "torch": {}}
    t_pg, t_torch, torch_losses = [], [], []
    st0 = time.perf_counter()
    for i in range(first, steps):
      x, y = batch_at(train_docs, i, batch, cfg.seq, seed)
      n_valid = int((y != PAD).sum())
      lr_now = lr_at(i, steps, lr, warmup, min_lr)
      opt.set_lr(lr_now)
      st = time.perf_counter()
      loss, gn = _one_step(step, apply, layout, x, y, n_valid, accum, rank, world)
      dt = time.perf_counter() - st
      if not math.isfinite(loss): raise FloatingPointError(f"loss is {loss} at step {i}")
      for k, v in (("steps", i), ("loss", loss), ("lr", lr_now), ("grad_norm", gn), ("valid", n_valid), ("step_s", dt)): hist[k].append(v)
      if ref is not None and i < compare_steps:  # the same batch and learning rate, right after plugrad's step
        st = time.perf_counter()
        torch_losses.append(ref.step(x, y, lr_now))
        ts = time.perf_counter() - st
        if i >= 2: t_pg.append(dt); t_torch.append(ts)  # steps 0 and 1 are plugrad's compile and capture
      if i == first and rank == 0: log(f"step {i}: loss {loss:.4f} (ln 256 = {math.log(256):.4f}); first step (schedule + compile) {dt:.1f} s")
      if eval_every and (i % eval_every == eval_every - 1 or i == steps - 1):
        hist["val_step"].append(i); hist["val_loss"].append(val_loss())
        if rank == 0:
          log(f"step {i + 1}/{steps}: loss {loss:.4f} val {hist['val_loss'][-1]:.4f} lr {lr_now:.2e} |g| {gn:.3f} "
              f"{batch * cfg.seq / dt:,.0f} tok/s ({time.perf_counter() - st0:.0f} s)")
      if ckpt_every and (i + 1) % ckpt_every == 0 and rank == 0: save_checkpoint(model, opt, out / f"ckpt_{i + 1}.safetensors", cfg, i + 1)
    return _finish(hist, model, opt, out, cfg, steps, batch, rank, t_pg, t_torch, torch_losses, ref, st0, log)


def _one_step(step: Callable, apply: Callable | None, layout: Layout, x: np.ndarray, y: np.ndarray, n_valid: int, accum: int,
              rank: int, world: int) -> tuple[float, float]:
  """Run one training step on the global batch (x, y); returns (loss, gradient norm) of the whole batch."""
  rows = len(x) // world
  x, y = (a[rank * rows:(rank + 1) * rows].reshape(accum, rows // accum, -1) for a in (x, y))
  n = Tensor(np.array(n_valid, np.float32), device=layout.devices[0] if layout.mode == "single" and layout.devices else None)
  n = n.to(layout.devices) if layout.mode != "single" else n
  if apply is None:
    loss_t, gn_t = step(layout.data(x, 1), layout.data(y, 1), n)
    return float(loss_t.item()), float(gn_t.item())
  loss_t, *gs = step(layout.data(x, 1), layout.data(y, 1), n)
  for g in (loss_t, *gs): distributed.allreduce_(g)  # in place: the buffers the jitted grads step wrote
  return float(loss_t.item()), float(apply(*gs).item())


def _finish(hist: dict, model: Llama, opt: OptimizerGroup, out: Path, cfg: Config, steps: int, batch: int, rank: int,
            t_pg: list[float], t_torch: list[float], torch_losses: list[float], ref: TorchRun | None, st0: float, log) -> dict:
  """The final checkpoint, loss curve and history (rank 0), the tokens/s figures; returns the history with the model."""
  tok = batch * cfg.seq
  steady = hist["step_s"][2:] or hist["step_s"]
  hist["plugrad_tok_s"] = tok / statistics.median(steady) if steady else 0.0
  if t_pg and ref is not None:
    hist["torch"] = {"losses": torch_losses, "tok_s": tok / statistics.median(t_torch), "plugrad_tok_s_same_steps": tok / statistics.median(t_pg),
                     "ratio": statistics.median(t_torch) / statistics.median(t_pg), "version": ref.torch.__version__}
    log(f"tokens/s over {len(t_pg)} alternating steps: plugrad {hist['torch']['plugrad_tok_s_same_steps']:,.0f}, torch "
        f"{hist['torch']['tok_s']:,.0f} ({ref.torch.__version__}): plugrad/torch {hist['torch']['ratio']:.2f}x; first-step loss "
        f"plugrad {hist['loss'][0]:.6f} torch {torch_losses[0]:.6f}")
  if rank == 0:
    save_checkpoint(model, opt, out / "ckpt_final.safetensors", cfg, steps)
    write_png(out / "loss.png", [(hist["steps"], hist["loss"], (31, 119, 180)), (hist["val_step"], hist["val_loss"], (214, 39, 40))])
    (out / "history.json").write_text(json.dumps(hist))
    final = hist["loss"][-1] if hist["loss"] else float("nan")
    log(f"done: {len(hist['steps'])} steps in {time.perf_counter() - st0:.0f} s, final loss {final:.4f}, "
        f"{hist['plugrad_tok_s']:,.0f} tok/s; {out / 'loss.png'}, {out / 'ckpt_final.safetensors'}")
  return hist | {"model": model}


def save_checkpoint(model: Llama, opt: OptimizerGroup, path: Path, cfg: Config, step: int) -> None:
  """The weights and AdamW's state, gathered to host memory whatever their layout, with the config and the number of
  steps done in the metadata: `--resume` continues from it on any layout."""
  state = params_of(model) | optimizer_state(model, opt)
  safe_save({k: Tensor(t.numpy()) for k, t in state.items()}, path, metadata={"config": json.dumps(asdict(cfg)), "step": str(step)})


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--preset", choices=sorted(PRESETS), default="10m")
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--accum", type=int, default=1, help="micro-batches a step's batch is split into (gradient accumulation)")
  ap.add_argument("--seq", type=int, default=None, help="context length (default: the preset's)")
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--min-lr", type=float, default=3e-4)
  ap.add_argument("--warmup", type=int, default=20)
  ap.add_argument("--wd", type=float, default=0.1)
  ap.add_argument("--clip", type=float, default=1.0)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--corpus-mb", type=float, default=8.0)
  ap.add_argument("--corpus-dir", default=None, help="read the *.py files under this directory instead of the stdlib's")
  ap.add_argument("--out", default="runs/llama")
  ap.add_argument("--eval-every", type=int, default=50)
  ap.add_argument("--ckpt-every", type=int, default=0)
  ap.add_argument("--resume", default=None, help="a checkpoint to continue from (saved on any layout)")
  ap.add_argument("--mode", choices=MODES, default="single", help="single device, data parallel or tensor parallel over --devices")
  ap.add_argument("--devices", default=None, help="comma-separated devices, e.g. CPU:0,CPU:1 or MOCK+AMD:0,MOCK+AMD:1")
  ap.add_argument("--distributed", action="store_true", help="data parallel over MPI ranks (run under mpirun)")
  ap.add_argument("--compare-steps", type=int, default=10, help="steps alternating with PyTorch for tokens/s (0: none)")
  ap.add_argument("--keep-denormals", action="store_true", help="don't flush float32 subnormals to zero (in both frameworks)")
  a = ap.parse_args()
  cfg = PRESETS[a.preset]
  if a.seq is not None: cfg = Config(**(asdict(cfg) | {"seq": a.seq}))
  if cfg.dim % cfg.heads or (cfg.dim // cfg.heads) % 2: raise SystemExit(f"dim {cfg.dim} must split into {cfg.heads} heads of even size")
  layout = Layout(a.mode, tuple(d.strip() for d in a.devices.split(",")) if a.devices else None)
  try:
    train(cfg, a.steps, a.batch, a.lr, a.min_lr, a.warmup, a.wd, a.clip, a.seed, int(a.corpus_mb * (1 << 20)), a.out,
          a.eval_every, a.ckpt_every, a.compare_steps, not a.keep_denormals, layout=layout, accum=a.accum, dist=a.distributed,
          resume=a.resume, corpus_root=a.corpus_dir)
  except ValueError as e: raise SystemExit(f"train_llama: {e}") from None


if __name__ == "__main__":
  main()
