"""tensor._buffers_read (memoized per node) against a fresh post-order walk of each graph: same buffers, same order."""
import numpy as np

from plugrad import Tensor
from plugrad.uop.buffers import buffer_of, is_buffer_view
from plugrad.tensor import _buffers_read


def walk_oracle(u):
  return list(dict.fromkeys(buffer_of(n) for n in u.toposort(gate=lambda x: not is_buffer_view(x)) if is_buffer_view(n)))


def test_matches_a_fresh_walk_on_overlapping_graphs():
  rng = np.random.default_rng(0)
  bufs = [Tensor(rng.standard_normal((4, 4)).astype(np.float32)).realize() for _ in range(6)]
  nodes = list(bufs)
  for i in range(40):  # a random DAG whose nodes share subgraphs, reading buffers through views
    a, b = nodes[rng.integers(len(nodes))], nodes[rng.integers(len(nodes))]
    nodes.append([a + b.T, a * b[::-1], (a - b).exp(), a.where(a > 0, b) if i % 2 else b.permute(1, 0) + a][i % 4])
  order = rng.permutation(len(nodes))  # query in random order so memoized parts are reused in other contexts
  for j in order: assert _buffers_read(nodes[j].uop) == walk_oracle(nodes[j].uop), j
  assert max(len(walk_oracle(n.uop)) for n in nodes) >= 4  # the graphs do mix several buffers
  assert _buffers_read(bufs[2][1:].uop) == [buffer_of(bufs[2].uop)]  # a view of a buffer reads that buffer
