"""The optimization registry (codegen/optops.py): one `apply_opt` for every kind, its checks, BEAM's actions read from
the registry, and a new kind added from one place (this file) reaching apply_opts, get_program and BEAM."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.codegen import get_program
from plugrad.codegen.optops import AMOUNTS, OPT_KINDS, REDUCE, Opt, OptKind, apply_opt, beam_actions, register
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.codegen import search
from plugrad.engine.realize import buffer_for
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp

RNG = np.random.default_rng(0)


def reduce_ast(n: int, m: int) -> UOp:
  return (Tensor(RNG.standard_normal((n, m)).astype(np.float32)).realize().sum(axis=1)).schedule(optimize=False)[-1].ast


def _reverse(ast: UOp, rng: UOp | None, opt: Opt, caps) -> UOp:
  """A kind written only here: each REDUCE over `rng` reads its values backwards (r -> N-1-r); a sum is unchanged."""
  assert rng is not None
  if rng.src[0].op is not Ops.CONST: raise ValueError(f"{opt}: REVERSE needs a constant-size range")
  flip = {rng: UOp.const(dtypes.index, rng.src[0].arg - 1) - rng}
  reds = [n for n in ast.toposort() if n.op is Ops.REDUCE and rng in n.src[1:]]
  return ast.substitute({r: r.replace(src=(r.src[0].substitute(flip, walk=True), *r.src[1:])) for r in reds}, walk=True)


@pytest.fixture
def reverse_kind():
  kind = register(OptKind("REVERSE", _reverse, REDUCE, beam=lambda n: (0,)))
  yield kind
  del OPT_KINDS["REVERSE"]


def test_a_kind_registered_in_one_place_reaches_codegen_and_beam(reverse_kind):
  t = Tensor(a := RNG.standard_normal((8, 64)).astype(np.float32)).realize().sum(axis=1)
  (it,) = t.schedule(optimize=False)
  red = next(n for n in it.ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "reduce")
  dev = Device["CPU"]
  spec = get_program(it.ast, dev.renderer, [Opt("REVERSE", red.arg[0], 0)])
  assert spec.src != get_program(it.ast, dev.renderer, []).src and f"{red.src[0].arg - 1}" in spec.src  # the flipped index
  bufs = [buffer_for(u).ensure_allocated()._buf for u in it.bufs]
  dev.load(spec.name, dev.compiler.compile_cached(spec.src))(*bufs)
  np.testing.assert_allclose(bufs[0].view(np.float32), a.sum(axis=1), rtol=1e-5, atol=1e-5)
  assert Opt("REVERSE", red.arg[0], 0) in search._actions(it.ast, False) and Opt("REVERSE", red.arg[0], 0) in beam_actions(it.ast, True)


def test_registry_checks():
  ast = reduce_ast(16, 32)
  rngs = {n.arg[0]: n for n in ast.toposort() if n.op is Ops.RANGE}
  g = next(i for i, r in rngs.items() if r.arg[1] == "global")
  r = next(i for i, r in rngs.items() if r.arg[1] == "reduce")
  with pytest.raises(ValueError, match="already registered"): register(OptKind("UPCAST", None, REDUCE))
  with pytest.raises(ValueError, match="unknown optimization 'NOPE' .*registered: .*UPCAST"): apply_opt(ast, Opt("NOPE", g, 2))
  with pytest.raises(ValueError, match="PACK adds a kernel"): apply_opt(ast, Opt("PACK", g, 16))
  with pytest.raises(ValueError, match="no range 99"): apply_opt(ast, Opt("UPCAST", 99, 2))
  with pytest.raises(ValueError, match="is a reduce range, LOCAL needs a global range"): apply_opt(ast, Opt("LOCAL", r, 4))
  with pytest.raises(ValueError, match="GROUP needs an amount of at least 2"): apply_opt(ast, Opt("GROUP", r, 1))
  with pytest.raises(ValueError, match="needs a global or reduce range|vector lane"):
    apply_opt(apply_opt(ast, Opt("VECTOR", g, 8)), Opt("UPCAST", max(rngs) + 1, 2))
  assert set(OPT_KINDS) >= {"UPCAST", "SPLIT", "UNROLL", "VECTOR", "OUTER", "BLOCK", "PACK", "LOCAL", "GROUP", "GROUPTOP", "GROUPOUT", "TC"}


@pytest.mark.parametrize("gpu", [False, True])
def test_beam_actions_follow_each_kinds_rule(gpu: bool):
  """BEAM's one-step actions, computed independently from the rules the kinds declare: splits that divide (2-16),
  thread counts up to the size (GPU), whole unrolls of reduce ranges, OUTER, BLOCK and overlapping tiles of 3 or 6
  that don't divide on CPU only."""
  ast = reduce_ast(44, 24)
  want = set()
  for n in ast.toposort():
    if n.op is not Ops.RANGE: continue
    rid, size = n.arg[0], n.src[0].arg
    divs = [a for a in AMOUNTS[:4] if a <= size and size % a == 0]
    if n.arg[1] == "global":
      want |= {Opt("UPCAST", rid, a) for a in divs}
      want |= {Opt("LOCAL", rid, a) for a in AMOUNTS if a <= size} if gpu else {Opt("BLOCK", rid, a) for a in divs} | {Opt("OUTER", rid, 0)}
      if not gpu: want |= {Opt("UPCAST_OVERLAP", rid, a) for a in (3, 6) if size % a and size >= 4 * a}
    else:
      want |= {Opt("SPLIT", rid, a) for a in divs} | {Opt("UNROLL", rid, size)}
      if gpu: want |= {Opt(k, rid, a) for k in ("GROUP", "GROUPTOP") for a in AMOUNTS if a <= size}
  assert set(beam_actions(ast, gpu)) == want
