"""The program the SQTT browser test runs under DEV=MOCK+AMD SQTT=1 VIZ=1 PROFILE=1: a float32 matmul on the mock GPU,
whose launch the amd plugin traces (thread-trace registers programmed through PM4, the RDNA3 emulator writing the
packets, the plugin decoding them onto llvm-objdump's listing). Prints one JSON line (the traced kernels, their
waves and instructions, a few instructions to look for), then exits (the VIZ exit hook serves the viewer)."""
import json

import numpy as np

from plugrad import Tensor
from plugrad.viz import capture

a = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
b = np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32)
out = (Tensor(a) @ Tensor(b)).numpy()
assert np.allclose(out, a @ b, atol=1e-4), "the traced matmul computed a wrong result"
traces = capture.TRACE.kernel_traces
print(json.dumps({"traced": [kt.kernel for kt in traces], "waves": [len(kt.waves) for kt in traces],
                  "insts": [sum(len(w.insts) for w in kt.waves) for kt in traces],
                  "first": [[i.pc, i.text] for i in next(w for w in traces[-1].waves if w.insts).insts[:8]]}), flush=True)
