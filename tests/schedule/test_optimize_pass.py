"""The scheduler's last pass (schedule/optimize.py): each kernel's optimizations chosen once, carried by its item, and
operand packing made kernels of their own whose scratch is an intermediate like any other."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import Tensor, TinyJit
from plugrad.codegen import heuristic, search
from plugrad.device import Device
from plugrad.engine import realize
from plugrad.uop.ops import Ops

RNG = np.random.default_rng(3)


def rand(*shape: int) -> np.ndarray: return RNG.uniform(-1, 1, shape).astype(np.float32)


@pytest.fixture
def heuristic_calls(monkeypatch) -> list:
  """Every call of the CPU heuristic, wherever a module imported it from (the ASTs it was asked about)."""
  calls: list = []
  real = heuristic.heuristic_opts
  def spy(ast, caps):
    calls.append(ast)
    return real(ast, caps)
  for mod in (heuristic, search, realize):
    if hasattr(mod, "heuristic_opts"): monkeypatch.setattr(mod, "heuristic_opts", spy)
  return calls


def test_the_heuristic_runs_once_per_kernel(heuristic_calls: list):
  """Regression: the engine ran the heuristic on every CPU kernel to see whether it packs, then the codegen pipeline
  ran it again to optimize the kernel (twice per kernel; a packing kernel too). Now the scheduler chooses once and
  the pipeline applies what the item carries."""
  if not Device["CPU"].renderer.caps.vector_lanes: pytest.skip("the CPU renderer has no vector lanes here")
  a, b = rand(72, 40), rand(40, 264)          # shapes no other test uses: nothing cached
  ta, tb = Tensor(a, device="CPU").realize(), Tensor(b, device="CPU").realize()
  np.testing.assert_allclose(((ta @ tb + 1).relu()).numpy(), np.maximum(a @ b + 1, 0), rtol=1e-5, atol=1e-4)
  assert len(heuristic_calls) == 2   # the packing kernel and the matmul, once each (3 before: the pack twice)
  np.testing.assert_allclose(((ta @ tb + 1).relu()).numpy(), np.maximum(a @ b + 1, 0), rtol=1e-5, atol=1e-4)
  kernels = [it for it in (ta @ tb + 1).relu().schedule() if it.ast.op is Ops.SINK]
  assert len(heuristic_calls) == 2   # a second realize and a schedule of the same structure chose nothing again
  assert len(kernels) == 2 and all(it.opts is not None for it in kernels)


def test_packing_kernels_are_schedule_items_with_an_intermediate_scratch():
  """The packing kernel writes a scratch buffer only the matmul reads: an internal intermediate of the schedule
  (no tensor sees it), listed by Tensor.schedule(); optimize=False gives the one kernel as the scheduler built it."""
  if not Device["CPU"].renderer.caps.vector_lanes: pytest.skip("the CPU renderer has no vector lanes here")
  ta, tb = Tensor(rand(64, 56), device="CPU").realize(), Tensor(rand(56, 320), device="CPU").realize()
  pack, main = (ta @ tb).schedule()
  assert pack.bufs[0] in main.bufs[1:] and realize.buffer_for(pack.bufs[0]).internal
  assert not any(o.kind == "PACK" for o in main.opts) and main.opts
  (one,) = (ta @ tb).schedule(optimize=False)
  assert one.opts is None and set(one.bufs[1:]) == {main.bufs[1], pack.bufs[1]}


def test_jitted_pack_scratch_lives_in_the_arena():
  """Under TinyJit the scratch is placed in the capture's arena like every intermediate (before, the engine held a
  pool of its own per device, outside the arena)."""
  if not Device["CPU"].renderer.caps.vector_lanes: pytest.skip("the CPU renderer has no vector lanes here")
  w = Tensor(rand(56, 320), device="CPU").realize()
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x @ w).realize()
  for _ in range(3):
    a = rand(64, 56)
    np.testing.assert_allclose(f(Tensor(a, device="CPU")).numpy(), a @ w.numpy(), rtol=1e-5, atol=1e-4)
  (base,) = f.arena.bases.values()
  pack = f.captured[0]
  assert len(f.captured) == 2 and pack.bufs[0].base is base and base.nbytes >= 56 * 320 * 4


def test_the_beam_cache_is_looked_up_once_per_kernel(monkeypatch):
  """The BEAM disk-cache lookup hashes the whole kernel AST (~50 us a kernel): a kernel's choice is remembered on its
  AST (per device, capability record and BEAM settings), so scheduling it again, in another graph or after the
  schedule cache was cleared, doesn't look it up again; a changed setting (BEAM_REUSE=0 here) does."""
  from plugrad.schedule import kernelize
  calls: list = []
  real = search.beam_opts
  monkeypatch.setattr(search, "beam_opts", lambda ast, device: calls.append(ast) or real(ast, device))
  x = Tensor(rand(24, 40), device="CPU").realize()
  (x * 3 + 1).exp().schedule()
  assert len(calls) == 1
  monkeypatch.setattr(kernelize, "_SCHEDULE_CACHE", {})
  (x * 3 + 1).exp().schedule()
  assert len(calls) == 1
  monkeypatch.setenv("BEAM_REUSE", "0")
  kernelize._SCHEDULE_CACHE.clear()
  (x * 3 + 1).exp().schedule()
  assert len(calls) == 2


def test_weight_gradient_is_merged_before_its_pack_is_planned(cpu_host: str):
  """A 1x1 conv's weight gradient sums over batch x 28 x 28: the scheduler merges the 28x28 reduce into one 784 range
  and then plans PACK on that kernel, on an AVX2 and an AVX-512 host alike (before, the engine planned PACK on the
  unmerged kernel while kernels without PACK were merged in the pipeline). Values against numpy."""
  x, dy = rand(8, 64, 28, 28), rand(8, 32, 28, 28)
  w = Tensor(rand(32, 64, 1, 1), device="CPU", requires_grad=True)
  (Tensor(x, device="CPU").conv2d(w) * Tensor(dy, device="CPU")).sum().backward()
  *pre, main = [it for it in w.grad.schedule() if it.ast.op is Ops.SINK]
  reduces = [r.src[0].arg for r in main.ast.toposort() if r.op is Ops.RANGE and r.arg[1] == "reduce"]
  assert 784 in reduces and 28 not in reduces, (cpu_host, reduces)
  assert any(p.bufs[0] in main.bufs[1:] for p in pre) and not any(o.kind == "PACK" for o in main.opts), cpu_host   # packed
  np.testing.assert_allclose(w.grad.numpy().reshape(32, 64), np.einsum("bohw,bihw->oi", dy, x), rtol=1e-4, atol=1e-2)
