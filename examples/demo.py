"""plugrad demo: run a small program on the default device (DEV=... to choose one).

Until the Tensor front end lands this uses the device API directly: allocate buffers, copy data in, compile and launch
the device's hand-written smoke kernel (doubling three int32s) where it can compute, and copy the result out.
"""
from __future__ import annotations
import time
import numpy as np
from plugrad import Buffer, Device, dtypes

def main() -> None:
  name = Device.DEFAULT
  dev = Device[name]
  print(f"default device: {name} ({type(dev).__name__}, renderer {dev.renderer.name})")
  data = np.array([1, 2, 3], np.int32)
  buf = Buffer(name, 3, dtypes.int32).copyin(data)
  print(f"allocated {buf!r} and copied in {data.tolist()}")
  if dev.compute and dev.smoke_kernel is not None:
    st = time.perf_counter()
    lib = dev.compiler.compile_cached(dev.smoke_kernel)
    print(f"compiled the smoke kernel: {len(lib)} bytes in {(time.perf_counter() - st) * 1e3:.1f} ms (disk-cached)")
    elapsed = dev.load("smoke", lib)(buf._buf, wait=True)
    print(f"ran it in {elapsed * 1e6:.1f} us")
  else: print(f"{name} does not run kernels; showing the round trip only")
  print(f"result: {buf.numpy().tolist()}")

if __name__ == "__main__": main()
