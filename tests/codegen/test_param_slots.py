"""Kernels keep every buffer slot as a parameter, also one whose loads the optimizer folded away: runtimes pass buffers
by slot, so a dropped parameter shifted the ones after it (found through a Householder QR step on CPU)."""
from __future__ import annotations

import numpy as np

from plugrad.codegen import get_program
from plugrad.device import Device
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops


def _reflect_then_pick() -> tuple[Tensor, float]:
  a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
  rows = Tensor.arange(2)
  x = Tensor(a)
  alpha = (rows == 0).where(x[:, 0], 0.0).sum(-1, keepdim=True)
  v = (rows == 0).where(alpha - 1.0, x[:, 0]).unsqueeze(-1)
  r = x - v @ (v.transpose(-2, -1) @ x)
  # an unrolled 2-step reduce whose where() never reads alpha at the step it keeps: alpha's slot has no load left
  out = (rows == 1).where(r[:, 1], 0.0).sum()
  an = a[:, 0].copy()
  an[0] -= 1.0
  want = (a - an[:, None] @ (an[None, :] @ a))[1, 1]
  return out, float(want)


def test_folded_away_buffer_keeps_its_slot():
  out, want = _reflect_then_pick()
  assert out.item() == want  # was 4.0 instead of -32.0 on CPU: the third buffer was passed where the fourth belonged


def test_programs_list_every_slot_of_the_ast():
  out, _ = _reflect_then_pick()
  renderer = Device[Device.DEFAULT].renderer
  for item in out.schedule():
    if item.ast.op is not Ops.SINK: continue
    slots = sorted({u.arg for u in item.ast.toposort() if u.op is Ops.DEFINE_GLOBAL})
    assert [g.arg for g in get_program(item.ast, renderer).globals] == slots
