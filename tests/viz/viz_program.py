"""The program the browser test runs under VIZ=1 PROFILE=1: a few kernels (a fused matmul+relu+sum, an elementwise
chain, a reduce, a copy to the PYTHON device and a kernel there) and a JIT'd step replayed twice. Prints one JSON
line with the kernels it ran, then exits (the VIZ exit hook serves the viewer).

VIZ_TEST_WAVES=1 also records the hand-built device instruction trace of viz_helpers.py for the first reduce kernel
(as a device plugin's traced launch would), and VIZ_TEST_WAVES_BIG=n a second one of about n instructions."""
import json
import os

import numpy as np

from plugrad import Tensor, TinyJit
from plugrad.engine.realize import GlobalCounters, _RUNNERS
from plugrad.viz import capture

from viz_helpers import big_kernel_trace, synthetic_kernel_trace

a = Tensor(np.arange(48, dtype=np.float32).reshape(6, 8) / 10)
b = Tensor(np.linspace(-1, 1, 40, dtype=np.float32).reshape(8, 5))
(a @ b).relu().sum(axis=1).numpy()
((a * 2 + 1).exp2() - a).numpy()
a.max(axis=0).numpy()
(a.to("PYTHON") - 1).abs().numpy()  # a copy to a second device and a kernel there


@TinyJit
def step(x: Tensor) -> Tensor: return (x * x + 3).contiguous()


for i in range(4): step(Tensor(np.full((3, 7), i, dtype=np.float32))).numpy()
if os.environ.get("VIZ_TEST_WAVES"):
  ev = next(e for e in capture.TRACE.events if e.kind == "kernel" and e.name.startswith("r_"))
  capture.TRACE.kernel_trace(synthetic_kernel_trace(ev.name, ev.device, ev.st))
  if (n := int(os.environ.get("VIZ_TEST_WAVES_BIG", "0"))): capture.TRACE.kernel_trace(big_kernel_trace(n, ev.name, ev.device, ev.st))
launches = sum(1 for e in capture.TRACE.events if e.kind == "kernel")
print(json.dumps({"kernels": sorted(r.spec.name for r in _RUNNERS.values()), "launches": launches,
                  "devices": sorted({r.device for r in _RUNNERS.values()}),
                  "counted": GlobalCounters["kernels"], "traced": [kt.kernel for kt in capture.TRACE.kernel_traces]}), flush=True)
