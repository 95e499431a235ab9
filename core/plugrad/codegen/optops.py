"""The optimization kinds: one registry every part of codegen reads (the heuristics, `apply_opts`, BEAM).

An `Opt(kind, rid, amount, arg)` asks for the optimization registered as `kind` on range `rid`. Each `OptKind` declares
what it applies to (global and/or reduce ranges; none: the whole kernel, as TC), which renderers BEAM proposes it for
(None: every renderer, "cpu": renderers without GPU launch dims, "gpu": with them), the smallest amount it takes, the
amounts BEAM tries on a range of constant size, and the function that rewrites the kernel AST. `apply_opt` is the one
entry point: it checks the range (exists, right kind, not a vector lane range) and the amount, then calls the kind.

Adding an optimization kind is one `register(OptKind(...))` next to its rewrite (codegen/opt.py holds the CPU/common
kinds, codegen/gpuopt.py the GPU ones): `apply_opts`, `get_program` with explicit opts and BEAM's search pick it up
from here (tests/codegen/test_optops.py registers one in the test itself to show it). A kind that adds a kernel
(PACK) is refused here: codegen/pack.py's `split_packs` applies it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from plugrad.runtime.renderer import Capabilities
from plugrad.uop.ops import Ops, UOp

AMOUNTS = (2, 4, 8, 16, 32, 64, 128, 256)  # the split amounts BEAM tries
UPCASTS = ("UPCAST", "UPCAST_OVERLAP")  # the kinds that copy a global range k times per iteration (an output tile's rows)


@dataclass(frozen=True)
class Opt:
  """One optimization: `kind` names a registered `OptKind` (UPCAST, SPLIT, UNROLL, VECTOR, OUTER, BLOCK, PACK on every
  renderer; LOCAL, GROUP, GROUPTOP, GROUPOUT, TC on GPU renderers), `rid` the range id, `amount` the split, `arg` extra
  parameters of a kind that needs more than one amount (TC's tile)."""
  kind: str
  rid: int
  amount: int
  arg: tuple[int, ...] = ()


Apply = Callable[[UOp, "UOp | None", Opt, "Capabilities | None"], UOp]


@dataclass(frozen=True)
class OptKind:
  """A registered optimization kind (see the module docstring). `apply(ast, rng, opt, caps)` gets the checked range
  (None for a kernel-wide kind) and returns the rewritten AST, raising ValueError when the kernel doesn't fit it."""
  name: str
  apply: Apply | None
  targets: frozenset[str]
  device: str | None = None
  min_amount: int = 0
  beam: Callable[[int], Iterable[int]] | None = None
  adds_kernel: bool = False


OPT_KINDS: dict[str, OptKind] = {}
GLOBAL, REDUCE, ANY_RANGE, KERNEL = frozenset({"global"}), frozenset({"reduce"}), frozenset({"global", "reduce"}), frozenset()


def register(kind: OptKind) -> OptKind:
  """Add `kind` to the registry (a second kind of the same name is an error: names are what Opts and caches hold)."""
  if kind.name in OPT_KINDS: raise ValueError(f"optimization kind {kind.name!r} is already registered")
  OPT_KINDS[kind.name] = kind
  return kind


def is_vector_range(r: UOp) -> bool: return r.op is Ops.RANGE and len(r.arg) > 2 and r.arg[2] == "vector"
def is_tc_range(r: UOp) -> bool: return r.op is Ops.RANGE and len(r.arg) > 2 and r.arg[2] == "tc"


def apply_opt(ast: UOp, opt: Opt, caps: Capabilities | None = None) -> UOp:
  """`ast` with one optimization applied (ValueError naming the problem if it doesn't fit the kernel)."""
  kind = OPT_KINDS.get(opt.kind)
  if kind is None: raise ValueError(f"{opt}: unknown optimization {opt.kind!r} (registered: {', '.join(OPT_KINDS)})")
  if kind.adds_kernel or kind.apply is None: raise ValueError(f"{opt}: {opt.kind} adds a kernel; apply it with codegen.pack.split_packs")
  if any(map(is_tc_range, ast.toposort())): raise ValueError(f"{opt}: TC must be the last optimization (the kernel's matmul is marked for it)")
  rng = None
  if kind.targets:
    rng = next((n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[0] == opt.rid), None)
    if rng is None: raise ValueError(f"{opt}: the kernel has no range {opt.rid}")
    if rng.arg[1] not in kind.targets:
      raise ValueError(f"{opt}: range {opt.rid} is a {rng.arg[1]} range, {opt.kind} needs a {' or '.join(sorted(kind.targets))} range")
    if len(rng.arg) > 2:   # a range an earlier optimization made (vector lanes, copies: codegen/expand.py)
      raise ValueError(f"{opt}: range {opt.rid} is {'a vector lane' if rng.arg[2] == 'vector' else f'an {rng.arg[2]} copy'} range")
  if opt.amount < kind.min_amount: raise ValueError(f"{opt}: {opt.kind} needs an amount of at least {kind.min_amount}")
  return kind.apply(ast, rng, opt, caps)


def beam_actions(ast: UOp, gpu: bool) -> list[Opt]:
  """Every one-step extension BEAM tries on `ast`: each registered kind with a `beam` rule, on each range of constant
  size it targets, for the renderer kind (`gpu`)."""
  acts = []
  for r in sorted((n for n in ast.toposort() if n.op is Ops.RANGE), key=lambda n: n.arg[0]):
    if len(r.arg) > 2 or r.src[0].op is not Ops.CONST: continue
    for k in OPT_KINDS.values():
      if k.beam is None or r.arg[1] not in k.targets or k.device not in (None, "gpu" if gpu else "cpu"): continue
      acts += [Opt(k.name, r.arg[0], a) for a in k.beam(r.src[0].arg)]
  return acts


def split_amounts(n: int) -> tuple[int, ...]:
  """BEAM's amounts for a split that must divide the range: 2, 4, 8, 16."""
  return tuple(a for a in AMOUNTS[:4] if a <= n and n % a == 0)


def thread_amounts(n: int) -> tuple[int, ...]:
  """BEAM's amounts for threads over a range (the last workgroup may be partial): every amount up to its size."""
  return tuple(a for a in AMOUNTS if a <= n)
