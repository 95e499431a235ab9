"""examples/train_llama.py: a few steps of the tiny preset on the stdlib corpus. Oracle: the same model, weights,
batches and AdamW/clipping/schedule in PyTorch (losses step by step); the checkpoint reloads to the trained weights;
the loss curve is a valid PNG; the schedule is warm-up then cosine."""
import importlib.util
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from plugrad.nn.state import safe_load

_path = Path(__file__).resolve().parents[2] / "examples" / "train_llama.py"
_spec = importlib.util.spec_from_file_location("train_llama", _path)
tl = importlib.util.module_from_spec(_spec)
sys.modules["train_llama"] = tl  # dataclasses look their module up while the file executes
_spec.loader.exec_module(tl)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  pytest.importorskip("torch")
  out = tmp_path_factory.mktemp("llama")
  cfg = tl.Config(dim=32, layers=1, heads=2, hidden=64, seq=16)
  hist = tl.train(cfg, steps=5, batch=2, lr=3e-3, warmup=2, corpus_bytes=1 << 20, out=out, eval_every=5, compare_steps=5, log=lambda *_: None)
  return out, hist


def test_losses_match_torch_step_by_step(run):
  _, hist = run
  assert abs(hist["loss"][0] - np.log(256)) < 0.05  # near-uniform predictions at init
  np.testing.assert_allclose(hist["loss"], hist["torch"]["losses"], rtol=2e-5)  # same weights, batches, AdamW, clipping, lr
  assert hist["loss"][-1] < hist["loss"][0] and len(hist["val_loss"]) == 1 and np.isfinite(hist["val_loss"][0])
  assert hist["torch"]["tok_s"] > 0 and hist["plugrad_tok_s"] > 0


def test_training_leaves_the_floating_point_mode_as_it_found_it(run):
  """train() flushes subnormals in both frameworks while it runs (torch's switch is the calling thread's mode, which
  numpy and hypothesis share): afterwards this thread represents subnormals again and the CPU device is back off."""
  from plugrad.device import Device
  assert np.float32(3e-39) * np.float32(0.5) != 0 and not Device["CPU"].flush_denormals


def test_checkpoint_reloads_the_trained_weights(run):
  out, hist = run
  sd = safe_load(str(out / "ckpt_final.safetensors"))
  params = tl.params_of(hist["model"])
  assert {k for k in sd if not k.startswith("opt.")} == set(params) and len(params) == 3 + 7
  assert {k for k in sd if k.startswith("opt.m.")} == {f"opt.m.{k}" for k in params} and "opt.0.b1_t" in sd
  for k, t in params.items(): np.testing.assert_array_equal(sd[k].numpy(), t.numpy())
  assert json.loads((out / "history.json").read_text())["loss"] == hist["loss"]


def test_loss_curve_is_a_png(run):
  data = (run[0] / "loss.png").read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
  w, h = struct.unpack(">II", data[16:24])
  n = struct.unpack(">I", data[33:37])[0]
  assert data[37:41] == b"IDAT" and len(zlib.decompress(data[41:41 + n])) == h * (1 + 3 * w)


def test_schedule_and_corpus():
  lrs = [tl.lr_at(i, 100, 1e-3, 10, 1e-4) for i in range(100)]
  assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)
  assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # cosine decay is monotone
  corpus = tl.load_corpus(1 << 16)
  assert len(corpus.data) == 1 << 16 and corpus.data.dtype == np.uint8 and corpus.ends[-1] == 1 << 16 and len(corpus.starts) > 1
  assert (corpus.starts < corpus.ends).all() and (corpus.starts[1:] == corpus.ends[:-1]).all()
  x, y = tl.batch_at(corpus, 3, 5, 64, seed=1)
  x2, _ = tl.batch_at(corpus, 3, 5, 64, seed=1)
  assert x.shape == y.shape == (5, 64) and (x == x2).all()   # a batch is a function of the seed and the step
  ok = y != tl.PAD
  assert (x[:, 1:][ok[:, :-1] & ok[:, 1:]] == y[:, :-1][ok[:, :-1] & ok[:, 1:]]).all()   # y is x shifted by one byte
  assert (ok[:, :-1] >= ok[:, 1:]).all()   # padding only at the end of a row
  with pytest.raises(FileNotFoundError, match="doesn't exist"): tl.load_corpus(10, root="/nonexistent/dir")
  assert tl.param_count(tl.PRESETS["10m"]) == pytest.approx(10.8e6, rel=0.05)
