"""BEAM search (engine/search.py): the winner is timed on the device, correct, and cached on disk keyed by AST+device+arch."""
from __future__ import annotations

import numpy as np

from plugrad import Tensor
from plugrad.codegen.opt import Opt
from plugrad.engine import search


def test_beam_on_cpu_finds_correct_opts_and_caches_them(monkeypatch, tmp_path):
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("BEAM", "1")
  monkeypatch.setenv("BEAM_ROUNDS", "1")
  monkeypatch.setenv("BEAM_CANDIDATES", "6")
  a = np.random.default_rng(0).standard_normal((12, 80)).astype(np.float32)
  np.testing.assert_allclose((Tensor(a, device="CPU") * 3).sum(1).numpy(), (a * 3).sum(1), rtol=1e-5)
  files = list((tmp_path / "beam").iterdir())
  assert len(files) == 1
  ast = (Tensor(a, device="CPU") * 3).sum(1).schedule()[-1].ast
  calls = []
  monkeypatch.setattr(search, "beam_search", lambda *args: calls.append(args) or [])
  opts = search.beam_opts(ast, "CPU")  # from the disk cache: no search
  assert not calls and all(isinstance(o, Opt) for o in opts)
  monkeypatch.delenv("BEAM")
  assert search.beam_opts(ast, "CPU") is None


def test_beam_cache_keeps_opt_args(monkeypatch, tmp_path):
  """A TC tile (Opt.arg) survives the disk cache; entries written before Opt had an arg still load."""
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("BEAM", "1")
  ast = (Tensor.empty(16, 32, device="CPU") * 2).sum(1).schedule()[-1].ast
  want = [Opt("TC", -1, 0, (4, 8, 2, 2, 2)), Opt("UPCAST", 0, 4)]
  monkeypatch.setattr(search, "beam_search", lambda *args: list(want))
  assert search.beam_opts(ast, "CPU") == want
  monkeypatch.setattr(search, "beam_search", lambda *args: [])
  assert search.beam_opts(ast, "CPU") == want  # from the cache file
  path = next((tmp_path / "beam").iterdir())
  path.write_text('[["UPCAST", 0, 4]]')
  assert search.beam_opts(ast, "CPU") == [Opt("UPCAST", 0, 4)]
