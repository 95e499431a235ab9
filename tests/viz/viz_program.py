"""The program the browser test runs under VIZ=1 PROFILE=1: a few kernels (a fused matmul+relu+sum, an elementwise
chain, a reduce, a copy to the PYTHON device and a kernel there) and a JIT'd step replayed twice. Prints one JSON
line with the kernels it ran, then exits (the VIZ exit hook serves the viewer)."""
import json

import numpy as np

from plugrad import Tensor, TinyJit
from plugrad.engine.realize import GlobalCounters, _RUNNERS
from plugrad.viz import capture

a = Tensor(np.arange(48, dtype=np.float32).reshape(6, 8) / 10)
b = Tensor(np.linspace(-1, 1, 40, dtype=np.float32).reshape(8, 5))
(a @ b).relu().sum(axis=1).numpy()
((a * 2 + 1).exp2() - a).numpy()
a.max(axis=0).numpy()
(a.to("PYTHON") - 1).abs().numpy()  # a copy to a second device and a kernel there


@TinyJit
def step(x: Tensor) -> Tensor: return (x * x + 3).contiguous()


for i in range(4): step(Tensor(np.full((3, 7), i, dtype=np.float32))).numpy()
launches = sum(1 for e in capture.TRACE.events if e.kind == "kernel")
print(json.dumps({"kernels": sorted(r.spec.name for r in _RUNNERS.values()), "launches": launches,
                  "devices": sorted({r.device for r in _RUNNERS.values()}),
                  "counted": GlobalCounters["kernels"]}), flush=True)
