"""plugrad.distributed under `mpirun -np 2` on loopback (skipped without mpirun and mpi4py): the collectives on every
device kind, a rank that stops taking part (the other times out with a clear error), and data-parallel training of
examples/train_digits.py giving one process's final weights; plus data parallelism over CPU:0/CPU:1 in one process."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("train_digits_dp", ROOT / "examples" / "train_digits.py")
train_digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_digits)

MPIRUN = shutil.which("mpirun")
try:
  import mpi4py  # noqa: F401
  HAVE_MPI4PY = True
except ImportError: HAVE_MPI4PY = False
needs_mpi = pytest.mark.skipif(MPIRUN is None or not HAVE_MPI4PY,
                               reason="needs Open MPI (mpirun) and mpi4py: make sysdeps; pip install 'plugrad[mpi]'")
# mpirun refuses root unless told; --oversubscribe: 2 ranks on a machine that may report fewer slots
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader,tcp",
       "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}


def mpirun(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
  return subprocess.run([MPIRUN, "-np", "2", "--oversubscribe", sys.executable, *args], capture_output=True, text=True,
                        timeout=timeout, env={**ENV, **(env or {})}, cwd=ROOT)


@needs_mpi
def test_collectives_on_two_ranks():
  r = mpirun(str(ROOT / "tests/multi/mpi_collectives.py"))
  assert r.returncode == 0, r.stdout + r.stderr
  assert "rank 0 ok" in r.stdout and "rank 1 ok" in r.stdout


@needs_mpi
def test_a_rank_that_stops_makes_the_other_time_out():
  r = mpirun(str(ROOT / "tests/multi/mpi_collectives.py"), "hang", env={"PLUGRAD_MPI_TIMEOUT": "2"}, timeout=120)
  assert "timed out: rank 0/2: allreduce(sum) of (4,) float" in r.stdout and "did not complete within 2 s" in r.stdout, r.stdout + r.stderr
  assert r.returncode != 0


@needs_mpi
def test_a_rank_that_dies_ends_the_job():
  r = mpirun(str(ROOT / "tests/multi/mpi_collectives.py"), "die", env={"PLUGRAD_MPI_TIMEOUT": "20"}, timeout=120)
  assert r.returncode != 0 and "without rank 1" not in r.stdout, r.stdout + r.stderr


@needs_mpi
def test_distributed_training_matches_one_process(tmp_path):
  common = ["--no-bn", "--steps", "4", "--batch", "16", "--seed", "3"]
  r = mpirun(str(ROOT / "examples/train_digits.py"), "--distributed", *common, "--save", str(tmp_path / "dist.npz"))
  assert r.returncode == 0, r.stdout + r.stderr
  one = subprocess.run([sys.executable, str(ROOT / "examples/train_digits.py"), *common, "--save", str(tmp_path / "one.npz")],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
  assert one.returncode == 0, one.stderr
  a, b = np.load(tmp_path / "dist.npz"), np.load(tmp_path / "one.npz")
  assert sorted(a) == sorted(b)
  for k in a: np.testing.assert_allclose(a[k], b[k], atol=1e-6, err_msg=k)


def test_data_parallel_on_two_devices_has_the_one_device_loss_curve():
  one, two = [], []
  train_digits.train(steps=3, batch=16, seed=1, progress=False, losses=one)
  model, _ = train_digits.train(steps=3, batch=16, seed=1, progress=False, devices=("CPU:0", "CPU:1"), losses=two)
  np.testing.assert_allclose(two, one, rtol=1e-5)
  assert model.l1.weight.device == ("CPU", "CPU:1") and model.bn1.running_mean.device == ("CPU", "CPU:1")
