"""Inlining of `@function` CALL nodes: the scheduler and autograd see a CALL as its body applied to its inputs.

A CALL(body, *inputs) holds a body over PARAM placeholders (arg ("fn", index, shape)); `inline_calls` replaces every
(nested) CALL by its body with the placeholders substituted. Tensor uses this before scheduling and autograd; the
`@function` decorator that builds CALLs (engine/function.py) sits above Tensor.
"""
from __future__ import annotations

from plugrad.uop.ops import Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.upat import PatternMatcher, UPat


def _inline(call: UOp) -> UOp:
  """The body of a CALL with its PARAMs replaced by the call's inputs."""
  body, args = call.src[0], call.src[1:]
  # PARAM nodes are hash-consed, so a nested call's placeholder may be the very node of ours: mapping it is harmless,
  # because substitute does not enter the bodies of nested CALLs (only their inputs)
  params = {n: args[n.arg[1]] for n in body.toposort() if n.op is Ops.PARAM and n.arg[0] == "fn" and n.arg[1] < len(args)}
  return body.substitute(params, walk=True)


pm_inline = PatternMatcher([(UPat(Ops.CALL, name="call"), _inline)])


def inline_calls(u: UOp) -> UOp:
  """`u` with every (nested) CALL replaced by its inlined body."""
  if not any(n.op is Ops.CALL for n in u.toposort()): return u
  return graph_rewrite(u, pm_inline, name="inline calls")
