"""examples/train_llama.py on several devices and processes: data parallel and tensor parallel over CPU:0/CPU:1, with
and without gradient accumulation, data parallel over two emulated AMD GPUs (MOCK+AMD), and data parallel over two MPI
ranks, each reproducing the one-device loss curve (itself checked step by step against PyTorch); a checkpoint saved
by rank 0 of the MPI job resumes on a different device count and continues that curve. The corpus has short
documents, so batches hold padding whose targets carry no loss."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("train_llama", ROOT / "examples" / "train_llama.py")
tl = importlib.util.module_from_spec(_spec)
sys.modules["train_llama"] = tl  # dataclasses look their module up while the file executes
_spec.loader.exec_module(tl)

CFG = tl.Config(dim=32, layers=1, heads=2, hidden=64, seq=16)
D2 = ("CPU:0", "CPU:1")
STEPS, BATCH = 20, 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
  """Python-ish documents of 3 to 400 bytes: a window of 17 bytes overruns a fifth of them (padding)."""
  root = tmp_path_factory.mktemp("corpus")
  rng = np.random.default_rng(0)
  words = [b"def ", b"return ", b"self", b"(x)", b": ", b"\n", b"    ", b"import os", b"1", b" + ", b"# note"]
  for i in range(60):
    n = int(rng.choice([3, 8, 12, 40, 120, 400]))
    (root / f"m{i:02d}.py").write_bytes(b"".join(words[j] for j in rng.integers(0, len(words), n))[:n])
  return root


def run(corpus: Path, out: Path, layout=None, accum: int = 1, steps: int = STEPS, compare: int = 0, **kw) -> dict:
  return tl.train(CFG, steps=steps, batch=BATCH, lr=3e-3, warmup=3, corpus_bytes=1 << 20, out=out, eval_every=steps,
                  compare_steps=compare, log=lambda *_: None, layout=layout or tl.Layout(), accum=accum, corpus_root=str(corpus), **kw)


@pytest.fixture(scope="module")
def one(corpus, tmp_path_factory) -> dict:
  """The one-device run, with PyTorch stepping alongside (the oracle of the curve)."""
  pytest.importorskip("torch")
  return run(corpus, tmp_path_factory.mktemp("one"), compare=STEPS)


def test_one_device_curve_is_torchs_and_has_padding(one):
  np.testing.assert_allclose(one["loss"], one["torch"]["losses"], rtol=2e-5)
  assert min(one["valid"]) < BATCH * CFG.seq and max(one["valid"]) <= BATCH * CFG.seq   # padded targets were left out
  assert one["loss"][-1] < one["loss"][0]


@pytest.mark.parametrize("mode,accum", [("dp", 1), ("tp", 1), ("dp", 2), ("tp", 2), ("single", 2)])
def test_layouts_reproduce_the_one_device_curve(mode, accum, one, corpus, tmp_path):
  """Data parallel (weights replicated, rows split), tensor parallel (megatron splits, vocabulary-parallel embedding
  and loss) and gradient accumulation over 2 micro-batches: the first 20 steps' losses and gradient norms equal the
  one-device run's to float32 tolerance."""
  h = run(corpus, tmp_path, tl.Layout(mode, D2 if mode != "single" else None), accum)
  np.testing.assert_allclose(h["loss"], one["loss"], rtol=2e-5)
  np.testing.assert_allclose(h["grad_norm"], one["grad_norm"], rtol=2e-4)
  assert h["valid"] == one["valid"]
  model = h["model"]
  if mode == "tp":   # what each weight is split by: whole heads, vocabulary rows, MLP columns
    assert model.layers[0].wqkv.shard_axis == 0 and model.layers[0].wo.shard_axis == 1 and model.tok.shard_axis == 0
    assert model.out.shard_axis == 0 and model.layers[0].w2.shard_axis == 1 and model.norm.shard_axis is None
  if mode == "dp": assert model.layers[0].wqkv.shard_axis is None and model.tok.device == ("CPU", "CPU:1")


def test_bad_layouts_are_refused(corpus, tmp_path):
  with pytest.raises(ValueError, match="needs 2 or more --devices"): run(corpus, tmp_path, tl.Layout("dp", ("CPU:0",)))
  with pytest.raises(ValueError, match="heads .* divisible by 3"): run(corpus, tmp_path, tl.Layout("tp", ("CPU:0", "CPU:1", "CPU:2")))
  with pytest.raises(ValueError, match="mode must be one of"): run(corpus, tmp_path, tl.Layout("pp", D2))
  with pytest.raises(ValueError, match="must split into 3 micro-batches"): run(corpus, tmp_path, accum=3)


needs_amd = pytest.mark.skipif(not all(shutil.which(t) for t in ("clang-19", "ld.lld-19")), reason="the amd plugin needs clang-19 and ld.lld-19")
LONG = os.environ.get("PLUGRAD_LONG_TESTS") == "1"


@needs_amd
def test_data_parallel_on_two_emulated_gpus(one, corpus, tmp_path):
  """The same training data parallel over MOCK+AMD:0/MOCK+AMD:1 (the amd runtime on the mock KFD, the RDNA3 emulator
  running clang's machine code): 2 steps in make test (~25 s a step), all 20 in make test-long."""
  n = STEPS if LONG else 2
  h = run(corpus, tmp_path, tl.Layout("dp", ("MOCK+AMD:0", "MOCK+AMD:1")), steps=n)
  np.testing.assert_allclose(h["loss"], one["loss"][:n], rtol=2e-5)


# ***** across processes: plugrad.distributed over MPI *****
MPIRUN = shutil.which("mpirun")
try:
  import mpi4py  # noqa: F401
  HAVE_MPI4PY = True
except ImportError: HAVE_MPI4PY = False
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader,tcp",
       "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo", "CPU_THREADS": "1"}


def cli(*args: str, corpus: Path, out: Path, mpi: bool = False) -> dict:
  """examples/train_llama.py as a user runs it (under `mpirun -np 2` with `mpi`), with the tiny test model; its history."""
  model = ["--preset", "tiny", "--seq", str(CFG.seq)]
  cmd = [sys.executable, str(ROOT / "examples" / "train_llama.py"), *model, "--steps", str(STEPS), "--batch", str(BATCH), "--warmup", "3",
         "--corpus-mb", "1", "--corpus-dir", str(corpus), "--compare-steps", "0", "--eval-every", str(STEPS), "--out", str(out), *args]
  p = subprocess.run([MPIRUN, "-np", "2", "--oversubscribe", *cmd] if mpi else cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
  return json.loads((out / "history.json").read_text())


@pytest.mark.skipif(MPIRUN is None or not HAVE_MPI4PY, reason="needs Open MPI (mpirun) and mpi4py: make sysdeps; pip install 'plugrad[mpi]'")
def test_mpi_data_parallel_curve_and_resume_on_another_layout(corpus, tmp_path):
  """Two MPI ranks, each on its half of every batch, gradients summed with MPI's allreduce: the one-process curve.
  Rank 0's checkpoint after step 10 (weights and AdamW state) resumes in one process tensor parallel over CPU:0/CPU:1
  (another device count) and continues the curve exactly."""
  single = cli(corpus=corpus, out=tmp_path / "one")
  dist = cli("--distributed", "--ckpt-every", "10", corpus=corpus, out=tmp_path / "mpi", mpi=True)
  assert dist["world"] == 2 and dist["config"]["layers"] == 2
  np.testing.assert_allclose(dist["loss"], single["loss"], rtol=2e-5)
  np.testing.assert_allclose(dist["grad_norm"], single["grad_norm"], rtol=2e-4)
  resumed = cli("--resume", str(tmp_path / "mpi" / "ckpt_10.safetensors"), "--mode", "tp", "--devices", "CPU:0,CPU:1",
                corpus=corpus, out=tmp_path / "resumed")
  assert resumed["steps"] == list(range(10, STEPS))
  np.testing.assert_allclose(resumed["loss"], single["loss"][10:], rtol=2e-5)


def test_resume_refuses_another_model(corpus, tmp_path):
  run(corpus, tmp_path / "a", steps=2, ckpt_every=1)
  other = tl.Config(**(tl.asdict(CFG) | {"hidden": 32}))
  with pytest.raises(ValueError, match="is of the model"):
    tl.train(other, steps=3, batch=BATCH, out=tmp_path / "b", corpus_root=str(corpus), corpus_bytes=1 << 20, compare_steps=0,
             log=lambda *_: None, resume=tmp_path / "a" / "ckpt_1.safetensors")
