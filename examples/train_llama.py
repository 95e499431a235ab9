"""Train a small llama-architecture language model from scratch on the Python standard library's own source files.

Offline end to end: the corpus is this interpreter's stdlib (`sysconfig`'s "stdlib" path, every *.py file, sorted,
as bytes), the tokenizer is bytes (vocabulary 256). The model is llama's: token embedding, pre-norm blocks of RMSNorm
-> causal multi-head attention with rotary position embeddings (neox pairing) -> residual, RMSNorm -> SwiGLU MLP ->
residual, a final RMSNorm and an untied output head. Training: AdamW (decoupled weight decay on matrices only), linear
warm-up then cosine decay of the learning rate, global gradient-norm clipping, the whole step (forward, backward,
clipping, update) one TinyJit capture. Checkpoints are safetensors files (`ckpt_<step>.safetensors` under --out, the
config and step in the metadata), the loss curve a PNG written with the standard library only (`loss.png`), the
history a JSON file (`history.json`).

Precision: float32 throughout. bfloat16 parameters or activations don't pay on this CPU backend today (its kernels
convert 16-bit values lane by lane and accumulate in float32 anyway), so mixed precision is left out rather than made slower.

With --compare-steps N (default 10), PyTorch CPU (if installed) trains the same model from the same initial weights
on the same batches, steps alternating with plugrad's, with the same thread count; tokens/s of both and the ratio
are reported, and the first step's losses must agree (the same weights and batch give the same loss).

  python examples/train_llama.py                         # ~10M parameters (--preset 10m), 300 steps
  python examples/train_llama.py --preset tiny --steps 5 # seconds: the smoke test's configuration
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

import numpy as np

from plugrad import Tensor, TinyJit
from plugrad.apps.llm.model import apply_rope, rms_norm
from plugrad.device import Device
from plugrad.nn.optim import AdamW, OptimizerGroup, clip_grad_norm_
from plugrad.nn.state import get_state_dict, safe_save


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


def param_count(cfg: Config) -> int:
  per_layer = 4 * cfg.dim * cfg.dim + 3 * cfg.dim * cfg.hidden + 2 * cfg.dim
  return cfg.layers * per_layer + 2 * cfg.vocab * cfg.dim + cfg.dim


# ---------------------------------------------------------------------------------------------------------- data
def load_corpus(max_bytes: int, root: str | None = None) -> np.ndarray:
  """The stdlib's *.py files (sorted by path, so the corpus is the same on every run) as one uint8 array."""
  base = Path(root or sysconfig.get_paths()["stdlib"])
  if not base.is_dir(): raise FileNotFoundError(f"corpus directory {base} doesn't exist")
  out, n = [], 0
  for p in sorted(base.rglob("*.py")):
    if "site-packages" in p.parts: continue
    try: b = p.read_bytes()
    except OSError: continue
    out.append(b + b"\n")
    n += len(b) + 1
    if n >= max_bytes: break
  if n < 1024: raise ValueError(f"corpus under {base} has only {n} bytes of Python source")
  return np.frombuffer(b"".join(out)[:max_bytes], np.uint8).copy()


def batches(data: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
  """Endless random (inputs, targets) windows of `seq` bytes, int32 (batch, seq) each."""
  while True:
    i = rng.integers(0, len(data) - seq - 1, batch)
    w = np.stack([data[j:j + seq + 1] for j in i]).astype(np.int32)
    yield w[:, :-1], w[:, 1:]


# ---------------------------------------------------------------------------------------------------------- model
def init_weights(cfg: Config, seed: int) -> dict[str, np.ndarray]:
  """Initial weights (numpy float32): N(0, 0.02), residual output projections N(0, 0.02/sqrt(2*layers)), norms 1."""
  rng = np.random.default_rng(seed)
  def n(*shape: int, std: float = 0.02) -> np.ndarray: return rng.normal(0, std, shape).astype(np.float32)
  res = 0.02 / math.sqrt(2 * cfg.layers)
  w = {"tok": n(cfg.vocab, cfg.dim), "norm": np.ones(cfg.dim, np.float32), "out": n(cfg.vocab, cfg.dim)}
  for i in range(cfg.layers):
    w |= {f"layers.{i}.attn_norm": np.ones(cfg.dim, np.float32), f"layers.{i}.ffn_norm": np.ones(cfg.dim, np.float32),
          f"layers.{i}.wq": n(cfg.dim, cfg.dim), f"layers.{i}.wk": n(cfg.dim, cfg.dim), f"layers.{i}.wv": n(cfg.dim, cfg.dim),
          f"layers.{i}.wo": n(cfg.dim, cfg.dim, std=res), f"layers.{i}.w1": n(cfg.hidden, cfg.dim),
          f"layers.{i}.w3": n(cfg.hidden, cfg.dim), f"layers.{i}.w2": n(cfg.dim, cfg.hidden, std=res)}
  return w


def rope(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
  hd = cfg.dim // cfg.heads
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
  ang = np.arange(cfg.seq, dtype=np.float64)[:, None] * inv[None, :]
  return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class Block:
  def __init__(self, w: dict[str, np.ndarray], i: int):
    for k in ("attn_norm", "ffn_norm", "wq", "wk", "wv", "wo", "w1", "w3", "w2"): setattr(self, k, Tensor(w[f"layers.{i}.{k}"]))


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
      q = apply_rope((h @ b.wq.T).reshape(B, T, H, hd), cos, sin, neox=True).transpose(1, 2)
      k = apply_rope((h @ b.wk.T).reshape(B, T, H, hd), cos, sin, neox=True).transpose(1, 2)
      v = (h @ b.wv.T).reshape(B, T, H, hd).transpose(1, 2)
      a = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, cfg.dim)
      x = x + a @ b.wo.T
      h = rms_norm(x, b.ffn_norm, cfg.eps).contiguous()
      x = x + ((h @ b.w1.T).silu() * (h @ b.w3.T)) @ b.w2.T
    return rms_norm(x, self.norm, cfg.eps).contiguous() @ self.out.T


def torch_model(torch, cfg: Config, w: dict[str, np.ndarray]):
  """The same model in PyTorch (same weights, same math, neox rotary pairs (x[i], x[i + d/2]))."""
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
      q = rot((h @ g("wq").T).reshape(B, T, H, hd), T).transpose(1, 2)
      k = rot((h @ g("wk").T).reshape(B, T, H, hd), T).transpose(1, 2)
      v = (h @ g("wv").T).reshape(B, T, H, hd).transpose(1, 2)
      a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, cfg.dim)
      x = x + a @ g("wo").T
      h = norm(x, g("ffn_norm"))
      x = x + (F.silu(h @ g("w1").T) * (h @ g("w3").T)) @ g("w2").T
    return norm(x, P["norm"]) @ P["out"].T
  return P, forward


# ---------------------------------------------------------------------------------------------------------- training
def lr_at(step: int, steps: int, lr: float, warmup: int, min_lr: float) -> float:
  """Linear warm-up over `warmup` steps, then cosine decay from lr to min_lr at the last step."""
  if step < warmup: return lr * (step + 1) / warmup
  t = (step - warmup) / max(1, steps - warmup - 1)
  return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def make_optimizer(model: Llama, lr: float, wd: float) -> OptimizerGroup:
  """AdamW with weight decay on the matrices, none on the norms' gains (the usual llama recipe)."""
  sd = get_state_dict(model)
  mats = [t for k, t in sd.items() if t.ndim == 2 and not k.startswith("_")]
  gains = [t for k, t in sd.items() if t.ndim == 1 and not k.startswith("_")]
  return OptimizerGroup(AdamW(mats, lr=lr, b1=0.9, b2=0.95, weight_decay=wd), AdamW(gains, lr=lr, b1=0.9, b2=0.95, weight_decay=0.0))


def params_of(model: Llama) -> dict[str, Tensor]:
  return {k: t for k, t in get_state_dict(model).items() if not k.startswith("_") and k != "cfg"}


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


def train(cfg: Config, steps: int, batch: int, lr: float = 3e-3, min_lr: float = 3e-4, warmup: int = 20, wd: float = 0.1,
          clip: float = 1.0, seed: int = 0, corpus_bytes: int = 8 << 20, out: str | Path = "runs/llama", eval_every: int = 50,
          ckpt_every: int = 0, compare_steps: int = 10, flush_denormals: bool = True, log=print) -> dict:
  """Train; returns the history (losses, lrs, grad norms, val losses, tokens/s of plugrad and torch). With
  `flush_denormals` (the default of TensorFlow's CPU kernels) float32 subnormals are flushed to zero in both plugrad's
  kernels (a CPU device's `flush_denormals`) and torch's (`torch.set_flush_denormal`): the backward pass's products of
  tiny gradients otherwise take the CPU's microcode path (a weight-gradient matmul 4x slower). Both modes are
  restored on return (torch's is the calling thread's, which numpy shares)."""
  with contextlib.ExitStack() as restore:   # the floating-point modes the run switches, put back on return
    dev = Device[Device.DEFAULT]
    if (was := getattr(dev, "flush_denormals", None)) is not None:
      dev.flush_denormals = flush_denormals
      restore.callback(setattr, dev, "flush_denormals", was)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_corpus(corpus_bytes)
    split = int(len(data) * 0.95)
    train_data, val_data = data[:split], data[split:]
    rng = np.random.default_rng(seed)
    it = batches(train_data, batch, cfg.seq, rng)
    vx, vy = next(batches(val_data, batch, cfg.seq, np.random.default_rng(seed + 1)))
    w0 = init_weights(cfg, seed)
    model = Llama(cfg, w0)
    params = list(params_of(model).values())
    opt = make_optimizer(model, lr, wd)
    log(f"llama: {param_count(cfg) / 1e6:.2f}M parameters {asdict(cfg)}; corpus {len(data) / 1e6:.1f} MB of stdlib source "
        f"({len(train_data) / 1e6:.1f} MB train); batch {batch} x {cfg.seq} tokens; device {Device.DEFAULT}")

    @TinyJit
    @Tensor.train()
    def step(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      gnorm = clip_grad_norm_(params, clip)
      loss.realize(gnorm, *opt.schedule_step())
      return loss, gnorm

    def val_loss() -> float:
      with Tensor.train(False): return float(model(Tensor(vx)).sparse_categorical_crossentropy(Tensor(vy)).item())

    torch_ = None
    if compare_steps:
      try:
        import torch as torch_
        torch_.set_num_threads(getattr(Device[Device.DEFAULT], "threads", os.cpu_count() or 1))
        torch_.set_flush_denormal(flush_denormals)
        restore.callback(torch_.set_flush_denormal, False)
        tP, tfwd = torch_model(torch_, cfg, w0)
        mats = [p for k, p in tP.items() if p.ndim == 2]
        gains = [p for k, p in tP.items() if p.ndim == 1]
        topt = torch_.optim.AdamW([{"params": mats, "weight_decay": wd}, {"params": gains, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=1e-8)
      except ImportError: torch_ = None; log("torch not installed: no comparison")

    def torch_step(x: np.ndarray, y: np.ndarray, lr_now: float) -> float:
      for g in topt.param_groups: g["lr"] = lr_now
      topt.zero_grad()
      loss = torch_.nn.functional.cross_entropy(tfwd(torch_.from_numpy(x).long()).reshape(-1, cfg.vocab), torch_.from_numpy(y).long().reshape(-1))
      loss.backward()
      torch_.nn.utils.clip_grad_norm_(tP.values(), clip)
      topt.step()
      return float(loss.detach())

    hist: dict = {"config": asdict(cfg), "steps": [], "loss": [], "lr": [], "grad_norm": [], "val_step": [], "val_loss": [],
                  "step_s": [], "torch": {}}
    t_pg, t_torch, torch_losses = [], [], []
    st0 = time.perf_counter()
    for i in range(steps):
      x, y = next(it)
      lr_now = lr_at(i, steps, lr, warmup, min_lr)
      opt.set_lr(lr_now)
      st = time.perf_counter()
      loss_t, gn_t = step(Tensor(x), Tensor(y))
      loss, gn = float(loss_t.item()), float(gn_t.item())
      dt = time.perf_counter() - st
      if not math.isfinite(loss): raise FloatingPointError(f"loss is {loss} at step {i}")
      hist["steps"].append(i); hist["loss"].append(loss); hist["lr"].append(lr_now); hist["grad_norm"].append(gn); hist["step_s"].append(dt)
      if torch_ is not None and i < compare_steps:  # the same batch and learning rate, right after plugrad's step
        st = time.perf_counter()
        torch_losses.append(torch_step(x, y, lr_now))
        ts = time.perf_counter() - st
        if i >= 2: t_pg.append(dt); t_torch.append(ts)  # steps 0 and 1 are plugrad's compile and capture
      if i == 0: log(f"step 0: loss {loss:.4f} (ln 256 = {math.log(256):.4f}); first step (schedule + compile) {dt:.1f} s")
      if eval_every and (i % eval_every == eval_every - 1 or i == steps - 1):
        hist["val_step"].append(i); hist["val_loss"].append(val_loss())
        log(f"step {i + 1}/{steps}: loss {loss:.4f} val {hist['val_loss'][-1]:.4f} lr {lr_now:.2e} |g| {gn:.3f} "
            f"{batch * cfg.seq / dt:,.0f} tok/s ({time.perf_counter() - st0:.0f} s)")
      if ckpt_every and (i + 1) % ckpt_every == 0: save_checkpoint(model, out / f"ckpt_{i + 1}.safetensors", cfg, i + 1)
    save_checkpoint(model, out / "ckpt_final.safetensors", cfg, steps)
    tok = batch * cfg.seq
    steady = hist["step_s"][2:] or hist["step_s"]
    hist["plugrad_tok_s"] = tok / statistics.median(steady)
    if t_pg:
      hist["torch"] = {"losses": torch_losses, "tok_s": tok / statistics.median(t_torch), "plugrad_tok_s_same_steps": tok / statistics.median(t_pg),
                       "ratio": statistics.median(t_torch) / statistics.median(t_pg), "version": torch_.__version__}
      log(f"tokens/s over {len(t_pg)} alternating steps: plugrad {hist['torch']['plugrad_tok_s_same_steps']:,.0f}, torch "
          f"{hist['torch']['tok_s']:,.0f} ({torch_.__version__}): plugrad/torch {hist['torch']['ratio']:.2f}x; first-step loss "
          f"plugrad {hist['loss'][0]:.6f} torch {torch_losses[0]:.6f}")
    write_png(out / "loss.png", [(hist["steps"], hist["loss"], (31, 119, 180)), (hist["val_step"], hist["val_loss"], (214, 39, 40))])
    (out / "history.json").write_text(json.dumps(hist))
    log(f"done: {steps} steps in {time.perf_counter() - st0:.0f} s, final loss {hist['loss'][-1]:.4f}; {out / 'loss.png'}, "
        f"{out / 'ckpt_final.safetensors'}")
    return hist | {"model": model}


def save_checkpoint(model: Llama, path: Path, cfg: Config, step: int) -> None:
  safe_save(params_of(model), path, metadata={"config": json.dumps(asdict(cfg)), "step": str(step)})


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--preset", choices=sorted(PRESETS), default="10m")
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--seq", type=int, default=None, help="context length (default: the preset's)")
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--min-lr", type=float, default=3e-4)
  ap.add_argument("--warmup", type=int, default=20)
  ap.add_argument("--wd", type=float, default=0.1)
  ap.add_argument("--clip", type=float, default=1.0)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--corpus-mb", type=float, default=8.0)
  ap.add_argument("--out", default="runs/llama")
  ap.add_argument("--eval-every", type=int, default=50)
  ap.add_argument("--ckpt-every", type=int, default=0)
  ap.add_argument("--compare-steps", type=int, default=10, help="steps alternating with PyTorch for tokens/s (0: none)")
  ap.add_argument("--keep-denormals", action="store_true", help="don't flush float32 subnormals to zero (in both frameworks)")
  a = ap.parse_args()
  cfg = PRESETS[a.preset]
  if a.seq is not None: cfg = Config(**(asdict(cfg) | {"seq": a.seq}))
  if cfg.dim % cfg.heads or (cfg.dim // cfg.heads) % 2: raise SystemExit(f"dim {cfg.dim} must split into {cfg.heads} heads of even size")
  train(cfg, a.steps, a.batch, a.lr, a.min_lr, a.warmup, a.wd, a.clip, a.seed, int(a.corpus_mb * (1 << 20)), a.out,
        a.eval_every, a.ckpt_every, a.compare_steps, not a.keep_denormals)


if __name__ == "__main__":
  main()
