"""Convolution gradients (the CUSTOM_GRAD rule of Tensor.conv2d: input gradient as stride-1 convolutions of the output
gradient, one per stride phase, and the weight gradient as a window correlation) against torch float64, on hypothesis
shapes over every stride/padding/dilation/groups combination, 1-D and 2-D; and the kernels they lower to."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrad import Device
from plugrad.codegen import get_program
from plugrad.codegen.heuristic import conv_opts
from plugrad.codegen.optops import Opt
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the oracle of these tests)")
F = torch.nn.functional


@st.composite
def conv_case(draw):
  nd = draw(st.sampled_from([1, 2]))
  groups = draw(st.integers(1, 3))
  cin, rc, bs = groups * draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
  ks = [draw(st.integers(1, 4)) for _ in range(nd)]
  stride = [draw(st.integers(1, 3)) for _ in range(nd)]
  dil = [draw(st.integers(1, 3)) for _ in range(nd)]
  pads = [(draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd)]
  ins = [draw(st.integers(max(1, d * (k - 1) + 1 - pb - pa), d * (k - 1) + 8)) for k, d, (pb, pa) in zip(ks, dil, pads)]
  return nd, groups, cin, rc * groups, bs, ks, stride, dil, pads, ins


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_case(), st.integers(0, 2**31 - 1))
def test_conv_grads_match_torch(case, seed):
  nd, groups, cin, cout, bs, ks, stride, dil, pads, ins = case
  rng = np.random.default_rng(seed)
  x, w = rng.standard_normal((bs, cin, *ins)), rng.standard_normal((cout, cin // groups, *ks))
  flat = [v for pb, pa in pads[::-1] for v in (pb, pa)]  # torch's F.pad order: last dim first
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  conv = F.conv1d if nd == 1 else F.conv2d
  ty = conv(F.pad(tx, flat), tw, stride=stride, dilation=dil, groups=groups)
  gy = rng.standard_normal(tuple(ty.shape))
  ty.backward(torch.tensor(gy))
  px, pw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  py = px.conv2d(pw, groups=groups, stride=stride, dilation=dil, padding=flat)
  (py * Tensor(gy)).sum().backward()
  np.testing.assert_allclose(py.numpy(), ty.detach().numpy(), rtol=1e-9, atol=1e-9)
  np.testing.assert_allclose(px.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-9)
  np.testing.assert_allclose(pw.grad.numpy(), tw.grad.numpy(), rtol=1e-9, atol=1e-9)


def _grad_asts(stride: int = 1, size: int = 4):
  x = Tensor(np.zeros((8, 16, size, size), np.float32), requires_grad=True)
  w = Tensor(np.zeros((32, 16, 3, 3), np.float32), requires_grad=True)
  y = x.conv2d(w, padding=1, stride=stride)
  (y * Tensor(np.ones(y.shape, np.float32))).sum().backward()
  def sinks(t): return [si.ast for si in t.schedule(optimize=False) if si.ast.op is Ops.SINK and any(n.op is Ops.REDUCE for n in si.ast.toposort())]
  return sinks(y), sinks(x.grad), sinks(w.grad)


def _reduce_trips(ast) -> int:
  return max(int(np.prod([r.src[0].arg for r in n.src[1:]])) for n in ast.toposort() if n.op is Ops.REDUCE)


def test_input_grad_is_a_convolution():
  """Regression: the input gradient was the adjoint of the window view, a reduce over a 4x4 masked window (512 trips
  for 32 channels x 3x3) instead of a convolution's 32 x 3 x 3 = 288."""
  _, dx, dw = _grad_asts()
  assert [_reduce_trips(a) for a in dx] == [32 * 9]
  assert [_reduce_trips(a) for a in dw] == [8 * 16]
  _, dx2, _ = _grad_asts(stride=2)  # four phase kernels (taps 2x2, 2x1, 1x2, 1x1, every multiply-add useful)
  trips = sorted(int(np.prod([r.src[0].arg for r in n.src[1:]])) for a in dx2 for n in a.toposort() if n.op is Ops.REDUCE)
  assert trips == [32, 64, 64, 128]


def test_conv_kernels_get_the_channel_tile(cpu_host):
  """The CPU heuristic tiles the forward conv and both gradients with the channels in the vector lanes (PACK of the
  channel operand, VECTOR + UPCAST of the channel range, the innermost spatial/tap axes as the tile's rows), on an
  AVX2 host (8 lanes, 16 registers) and an AVX-512 one (16, 32) alike."""
  r = Device["CPU"].renderer.caps
  lanes, regs = r.vector_lanes, r.vector_regs
  assert (lanes, regs) == {"avx2": (8, 16), "avx512": (16, 32)}[cpu_host]
  for asts in _grad_asts():
    opts = conv_opts(asts[-1], lanes, regs)
    assert opts is not None and [o.kind for o in opts[:2]] == ["PACK", "VECTOR"] and any(o.kind == "UPCAST" for o in opts[2:])
  a = Tensor(np.zeros((64, 64), np.float32)); b = Tensor(np.zeros((64, 64), np.float32))
  assert conv_opts((a @ b).schedule(optimize=False)[-1].ast, lanes, regs) is None  # a matmul keeps the matmul tile


def test_wide_conv_gets_the_channel_tile_too(cpu_host):
  """Regression: an output row the vector lanes divide (32 wide) made the padded input window look vectorizable as it
  is, and the forward conv and the input gradient got a tile of one window vector against broadcast weights (a load
  per FMA: 64->64 channels at 56x56 on AVX2 code 57 GFLOPS, at 64x64 on AVX-512 61; the channel tile 193 and 168)."""
  r = Device["CPU"].renderer.caps
  fwd, dx, _ = _grad_asts(size=32)
  for ast in (fwd[-1], dx[-1]):
    opts = conv_opts(ast, r.vector_lanes, r.vector_regs)
    assert opts is not None and [o.kind for o in opts[:2]] == ["PACK", "VECTOR"], (cpu_host, opts)



def test_conv_window_taps_fold_into_the_channel_loop(cpu_host):
  """The innermost tap axis of a 3x3 window is FOLDed into the channel loop's body (the loop of 3 taps left rolled
  cost an AVX-512 stride-2 forward 22.0 against 20.4-20.7 ms; each tap's own accumulator, UNROLL, 62 ms): on an AVX2 and
  an AVX-512 host the forward conv and the input gradient carry FOLD of their last reduce range, and their kernels keep
  one accumulator per tile element (the tile's rows x channel vectors, no more)."""
  r = Device["CPU"].renderer
  x = Tensor(np.zeros((8, 16, 14, 14), np.float32), requires_grad=True)
  w = Tensor(np.zeros((32, 16, 3, 3), np.float32), requires_grad=True)
  y = x.conv2d(w, padding=1)
  (y * Tensor(np.ones(y.shape, np.float32))).sum().backward()
  for t in (y, x.grad):
    (si,) = [si for si in t.schedule() if si.ast.op is Ops.SINK and any(n.op is Ops.REDUCE for n in si.ast.toposort())]
    inner = max((n for n in si.ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "reduce"), key=lambda n: n.arg[0])
    assert Opt("FOLD", inner.arg[0], 3) in si.opts, (cpu_host, si.opts)
    tile = int(np.prod([o.amount for o in si.opts if o.kind == "UPCAST"]))
    spec = get_program(si.ast, r, list(si.opts))
    assert sum(u.op is Ops.DEFINE_REG for u in spec.uops) == tile, (cpu_host, si.opts)

@pytest.mark.parametrize("stride,groups,size", [(1, 1, 4), (2, 1, 7), (1, 2, 5)])
def test_conv_grads_float32_kernels_match_torch(stride, groups, size):
  """The optimized float32 kernels (the tile above) give torch's values: the digits CNN's second conv, a stride-2 conv
  (four phase convolutions) and a grouped one."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((8, 16, size, size)).astype(np.float32)
  w = rng.standard_normal((32, 16 // groups, 3, 3)).astype(np.float32)
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  ty = F.conv2d(tx, tw, padding=1, stride=stride, groups=groups)
  gy = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
  ty.backward(torch.tensor(gy))
  px, pw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  py = px.conv2d(pw, padding=1, stride=stride, groups=groups)
  (py * Tensor(gy)).sum().backward()
  for a, b in ((py, ty), (px.grad, tx.grad), (pw.grad, tw.grad)): np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-4, atol=1e-4)


def _conv_items(size: int, device: str = "CPU", pad: int = 1):
  x = Tensor(np.zeros((4, 16, size, size), np.float32), device=device)
  w = Tensor(np.zeros((32, 16, 3, 3), np.float32), device=device)
  return x.conv2d(w, padding=pad).schedule(optimize=False)  # (the kernels as built: no packing kernels)


def _gates(ast) -> int: return sum(1 for n in ast.toposort() if n.op is Ops.WHERE)


def test_padded_input_is_written_once_on_cpu():
  """On renderers with `pad_windows` (CPU) a conv whose border is >= 5% of its input pads the input into a buffer
  first: the conv kernel then loads every tap without a bounds test (no WHERE left in its AST)."""
  items = _conv_items(14)  # 16x16 padded = 1.31x the input
  assert len(items) == 2 and items[0].bufs[0].arg == 4 * 16 * 16 * 16
  assert _gates(items[0].ast) > 0 and _gates(items[1].ast) == 0
  padded = _conv_items(56)  # a 7% border: padded too (forward and input gradient 30-45% faster on the CPU)
  assert len(padded) == 2 and _gates(padded[1].ast) == 0
  (one,) = _conv_items(112)  # a 3.6% border: the pass would cost what the tests save, the conv stays one kernel
  assert _gates(one.ast) > 0
  (unpadded,) = _conv_items(14, pad=0)
  assert _gates(unpadded.ast) == 0


def test_padded_windows_only_where_the_renderer_asks():
  assert not Device["PYTHON"].renderer.caps.pad_windows
  (item,) = _conv_items(14, device="PYTHON")
  assert _gates(item.ast) > 0


@pytest.mark.parametrize("stride,dilation,padding", [(1, 1, 1), (2, 1, 1), (1, 2, 2), (1, 1, (2, 0, 1, 3))])
def test_padded_windows_conv_grads_match_torch(stride, dilation, padding):
  """Forward and both gradients through the written-once padding (inputs large enough for PAD_MIN) against torch
  float64, including the stride-2 phase kernels, dilation and uneven pads."""
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal((2, 8, 15, 17)), rng.standard_normal((12, 8, 3, 3))
  flat = [padding] * 4 if isinstance(padding, int) else list(padding)
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  ty = F.conv2d(F.pad(tx, flat), tw, stride=stride, dilation=dilation)
  gy = rng.standard_normal(tuple(ty.shape))
  ty.backward(torch.tensor(gy))
  px, pw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  py = px.conv2d(pw, stride=stride, dilation=dilation, padding=flat)
  assert any(_gates(si.ast) for si in py.schedule()[:-1]), "the padding was not written first"
  (py * Tensor(gy)).sum().backward()
  for a, b in ((py, ty), (px.grad, tx.grad), (pw.grad, tw.grad)): np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-9, atol=1e-9)


def _copies(t: Tensor) -> int:
  """Kernels that only copy a buffer (every store a plain load of another buffer)."""
  return sum(1 for si in t.schedule(optimize=False) if si.ast.op is Ops.SINK and
             all(st.src[1].op is Ops.LOAD for st in si.ast.src) and not any(n.op is Ops.REDUCE for n in si.ast.toposort()))


@pytest.mark.parametrize("inject", ["backward", "sum"])
def test_output_gradient_in_a_buffer_is_not_copied(inject):
  """The convolution's gradients read an output gradient that is already a buffer (y.backward(dy), or the loss
  (y * dy).sum(), whose gradient is dy times a broadcast 1) in place: no kernel copies it first (it did, 0.4-1.4 ms
  of every ResNet input gradient in bench/bench_conv.py)."""
  rng = np.random.default_rng(2)
  x = Tensor(rng.standard_normal((2, 4, 6, 6)).astype(np.float32), requires_grad=True)
  w = Tensor(rng.standard_normal((5, 4, 3, 3)).astype(np.float32), requires_grad=True)
  dy_np = rng.standard_normal((2, 5, 6, 6)).astype(np.float32)
  dy = Tensor(dy_np).realize()
  y = x.conv2d(w, padding=1)
  if inject == "backward": y.backward(dy)
  else: (y * dy).sum().backward()
  assert _copies(x.grad) == 0 and _copies(w.grad) == 0
  tx, tw = torch.tensor(x.numpy(), requires_grad=True), torch.tensor(w.numpy(), requires_grad=True)
  F.conv2d(tx, tw, padding=1).backward(torch.tensor(dy_np))
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_output_gradient_expression_is_computed_once():
  """An output gradient that is an expression (a ReLU's backward, which reads the forward convolution) is still written
  once into a buffer that both gradients read: else each would recompute the forward convolution inside its own."""
  x = Tensor(np.ones((2, 4, 6, 6), np.float32), requires_grad=True)
  w = Tensor(np.ones((5, 4, 3, 3), np.float32), requires_grad=True)
  x.conv2d(w, padding=1).relu().sum().backward()
  items = [si for si in Tensor.schedule(x.grad, w.grad, optimize=False) if si.ast.op is Ops.SINK]
  assert [sum(n.op is Ops.REDUCE for n in si.ast.toposort()) for si in items] == [1, 1, 1]   # y and dy; dx; dw
