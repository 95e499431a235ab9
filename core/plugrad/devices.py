"""`python -m plugrad.devices` / `plugrad-devices`: installed plugins, their devices, availability, and a smoke test.

Exit status is non-zero when any smoke test fails, when the device requested with DEV (or --device) is unusable, or
when the plugin set itself cannot load (conflicting plugins, strict mode). Storage devices (DISK) are smoke-tested on a
temporary file, never on a file named in DEV. Unavailable devices are reported, not failed. A device that can't be
selected is one line (`one_line`: the error's first line and its did-you-mean), never a traceback; library callers get
the exception itself (DeviceError, or ValueError for a malformed device string).
"""
from __future__ import annotations
import argparse
import os
import platform
import sys
import tempfile
from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
from plugrad.device import PATH_DEVICES, Buffer, Device, DeviceError, canonicalize, parse_device
from plugrad.plugins.loader import PluginError, PluginRegistry, get_registry
from plugrad.plugins.spec import PLUGIN_API_VERSION

def one_line(e: BaseException) -> str:
  """A device-selection error as one line for a command line: its first line, plus the did-you-mean hint if it has one
  (the list of installed devices that follows in the message is what plugrad-devices prints anyway)."""
  lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
  if not lines: return type(e).__name__
  hint = next((ln for ln in lines[1:] if ln.startswith("did you mean")), None)
  return lines[0] + (f"; {hint}" if hint else "")

def _tensor_smoke(name: str) -> tuple[bool, str] | None:
  try: out = (Tensor([1, 2, 3], device=name) * 2).tolist()
  except NotImplementedError: return None  # the device's renderer can't render kernels yet: use its hand-written kernel
  return out == [2, 4, 6], f"Tensor([1,2,3])*2 -> {out}"

def smoke(name: str) -> tuple[bool, str]:
  """Run `[1,2,3]*2` on device `name` (via Tensor when it exists, else a hand-written kernel or an alloc round trip)."""
  import numpy as np
  try:
    dev = Device[name]
    if getattr(dev, "fake", False):
      Buffer(name, 3, dtypes.int32).copyin(np.array([1, 2, 3], np.int32))
      return True, "fake device: alloc/copy/launch accepted, no data kept, no compute"
    if dev.compute and (res := _tensor_smoke(name)) is not None: return res
    buf = Buffer(name, 3, dtypes.int32).copyin(np.array([1, 2, 3], np.int32))
    if dev.compute and dev.smoke_kernel is not None:
      dev.load("smoke", dev.compiler.compile_cached(dev.smoke_kernel))(buf._buf, wait=True)
      out = buf.numpy().tolist()
      return out == [2, 4, 6], f"[1,2,3]*2 -> {out} (hand-written kernel)"
    out = buf.numpy().tolist()
    return out == [1, 2, 3], f"alloc round-trip -> {out}; {'no compute' if not dev.compute else 'no smoke kernel'}"
  except Exception as e:
    return False, f"{type(e).__name__}: {str(e).splitlines()[0]}"

def _smoke_name(name: str, tmp: str) -> str:
  """The device to smoke-test for `name`: a path device (DISK) always on a fresh file in `tmp`, never on the user's file."""
  d = parse_device(name)
  return f"{d.device}:{os.path.join(tmp, 'smoke.bin')}" if d.device in PATH_DEVICES else name

def report(reg: PluginRegistry, run_smoke: bool, tmp: str) -> bool:
  """Print every plugin distribution with its devices; False when some available device failed its smoke test."""
  all_ok = True
  for dist in reg.plugin_dists():
    eps = ", ".join(dist.entry_points) or "-"
    print(f"{dist.name} {dist.version} (entry points: {eps})" + ("" if dist.status == "loaded" else f": {dist.status.upper()}"
          + (f" ({dist.error})" if dist.error else " by PLUGRAD_DISABLE_PLUGINS")))
    for e in sorted((e for e in reg.devices.values() if e.dist is dist), key=lambda e: -e.spec.priority):
      a = e.availability()
      state = f"available ({a.reason})" if a.ok and a.reason else "available" if a.ok else f"UNAVAILABLE: {a.reason}"
      print(f"  {e.name:<8} priority {e.spec.priority:>4}  api {'.'.join(map(str, e.spec.api_version))}  "
            f"renderers: {', '.join(e.spec.renderers) or '-'}  {state}")
      for iface, probe in e.spec.interfaces.items():  # the other interfaces (PCI+AMD, MOCK+AMD, ...) and why each is (un)usable
        if probe is e.spec.probe: continue
        ia = e.availability(iface)
        print(f"  {'':<8} {iface}+{e.name}: " + (f"available ({ia.reason})" if ia.ok else f"UNAVAILABLE: {ia.reason}"))
      if run_smoke and a.ok:
        ok, msg = smoke(_smoke_name(e.name, tmp))
        print(f"  {'':<8} smoke: {'PASS' if ok else 'FAIL'} ({msg})")
        all_ok &= ok
  return all_ok

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="plugrad-devices", description=__doc__.splitlines()[0] if __doc__ else None)
  ap.add_argument("--no-smoke", action="store_true", help="skip the per-device smoke tests")
  ap.add_argument("--device", default=os.environ.get("DEV", "").strip(), help="device whose failure sets the exit status (default: $DEV)")
  args = ap.parse_args(argv)
  try: import importlib.metadata as md; core_ver = md.version("plugrad")
  except Exception: core_ver = "?"
  print(f"plugrad {core_ver}, plugin API {PLUGIN_API_VERSION[0]}.{PLUGIN_API_VERSION[1]}, python {platform.python_version()}")
  try: reg = get_registry()
  except PluginError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  with tempfile.TemporaryDirectory(prefix="plugrad-devices-") as tmp:
    smoke_ok = report(reg, not args.no_smoke, tmp)
    print(f"default device: {_default()}")
    rc = 0 if smoke_ok else 1
    if not smoke_ok: print("error: a device failed its smoke test (see FAIL above)", file=sys.stderr)
    if args.device: rc |= _check_requested(args.device, tmp)
    return rc

def _default() -> str:
  try: return Device.DEFAULT
  except (DeviceError, ValueError) as e: return f"none ({one_line(e)})"

def _check_requested(name: str, tmp: str) -> int:
  try:
    Device.entry(name)
    name = _smoke_name(canonicalize(name), tmp)
  except (DeviceError, ValueError) as e:
    print(f"requested device {name}: FAIL: {one_line(e)}", file=sys.stderr)
    return 1
  ok, msg = smoke(name)
  print(f"requested device {name}: {'PASS' if ok else 'FAIL'} ({msg})")
  return 0 if ok else 1

if __name__ == "__main__": sys.exit(main())
