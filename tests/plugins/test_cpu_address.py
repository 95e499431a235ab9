"""The CPU renderer's addressing: an index `base + constant` is rendered `(buf+base)[constant]`, so the unrolled loads
of a register tile share one base pointer and differ by an address displacement (rendered `buf[base + c]`, every load
paid an integer add and a sign extension of its own: 14 integer ops per 14 FMAs in a conv tile)."""
from __future__ import annotations

import re

import numpy as np

from plugrad import Tensor
from plugrad.engine.realize import runner_of

RNG = np.random.default_rng(5)


def _conv_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """3x3 convolution, padding 1, stride 1, in float64."""
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  H, W = x.shape[2:]
  win = np.stack([xp[:, :, i:i + H, j:j + W] for i in range(3) for j in range(3)], axis=2)   # (n, c, 9, H, W)
  return np.einsum("nckhw,ock->nohw", win, w.reshape(w.shape[0], w.shape[1], 9).astype(np.float64))


def _offset_indices(src: str) -> list[str]:
  """Loads and stores that index a buffer with a variable defined as another variable plus a constant."""
  sums = set(re.findall(r"int (alu\d+) = \(alu\d+\+-?\d+\);", src))
  return [m for m in re.findall(r"data\d+\[(alu\d+)\]", src) if m in sums]


def test_conv_tile_loads_share_a_base_pointer():
  x, w = RNG.standard_normal((2, 16, 14, 14)).astype(np.float32), RNG.standard_normal((32, 16, 3, 3)).astype(np.float32)
  t = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU"), padding=1)
  srcs = [runner_of(it).spec.src for it in t.schedule() if it.ast.op.name == "SINK"]
  conv = [s for s in srcs if "pg_fma" in s]
  assert conv, "no vectorized conv kernel"
  for s in conv:
    assert re.search(r"\(data\d+\+alu\d+\)\[\d+\]", s), "the tile's loads are not displacements of a base pointer"
    assert not _offset_indices(s), _offset_indices(s)[:5]
  np.testing.assert_allclose(t.numpy(), _conv_ref(x, w), rtol=1e-4, atol=1e-4)


def test_displaced_addresses_in_a_gated_load_and_a_negative_offset():
  """A padded shift reads x[i - 1] behind a bounds test: rendered with a negative displacement, values unchanged."""
  x = RNG.standard_normal((3, 37)).astype(np.float32)
  t = Tensor(x, device="CPU").pad(((0, 0), (1, 0)))[:, :37] * 2.0 + Tensor(x, device="CPU")
  expect = np.concatenate([np.zeros((3, 1), np.float32), x[:, :36]], axis=1) * 2.0 + x
  np.testing.assert_allclose(t.numpy(), expect, rtol=1e-6)


def test_gated_copy_indexes_by_its_loop_variable():
  """A one-sided pad (14 -> 15 wide, the gate on the innermost axis): the load and store are (buf+base)[gidx], so the
  access is consecutive in the loop to clang's vectorizer. As buf[base + gidx] the sign-extended int sum hid that, and
  clang gathered and scattered lane by lane (4.2 ms instead of 0.34 ms at 32x256x14x15)."""
  x = RNG.standard_normal((4, 8, 14, 14)).astype(np.float32)
  t = Tensor(x, device="CPU").pad(((0, 0), (0, 0), (0, 0), (0, 1))).contiguous()
  (item,) = t.schedule()
  src = runner_of(item).spec.src
  assert re.search(r"\(data1\+alu\d+\)\[gidx\d+\]", src) and re.search(r"\(data0\+alu\d+\)\[gidx\d+\] =", src), src
  np.testing.assert_array_equal(t.numpy(), np.pad(x, ((0, 0), (0, 0), (0, 0), (0, 1))))
