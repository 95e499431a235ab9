"""plugrad-amd: AMD GPUs through the amdgpu kernel driver's /dev/kfd or the userspace PCI driver, kernels as LLVM IR
compiled by clang-19 + lld-19.

Registration imports nothing heavy. The KFD probe reads /dev/kfd's permissions and the KFD topology in sysfs; it never
raises and never opens the device: without a usable GPU it says why ("no /dev/kfd: the amdgpu driver is not loaded",
"no AMD GPU in the KFD topology", "permission denied on /dev/kfd: ..."). The PCI probe (`PCI+AMD`) lists the AMD GPUs
in /sys/bus/pci/devices and says for each whether the userspace driver can take it (plugrad_amd.am.sysfs).
`DEV=MOCK+AMD` selects the in-process mock KFD, `DEV=MOCK+PCI+AMD` the mock PCI GPU (plugrad_amd.mock), available
wherever clang-19 is. The device (plugrad_amd.interfaces) is imported on first open.
"""
from __future__ import annotations

import functools
import os
import shutil

from plugrad.plugins import PLUGIN_API_VERSION, Availability, DeviceSpec, hookimpl
from plugrad_amd.am.sysfs import SYSFS, availability_reasons

KFD_PATH = "/dev/kfd"
TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology/nodes"
# GC register segment bases as IP discovery reports them, for the paths that read no discovery table (the KFD runtime):
# gfx11 (Navi 3x) has four segments; on gfx12 only segment 0 (the SH window of dispatches) is used so far
GC_SEGMENTS = {"gfx11": (0x1260, 0xA000, 0x1C000, 0x2402C00), "gfx12": (0x1260,)}


def gfx_arch(gfx_target_version: int) -> str:
  """KFD's gfx_target_version (major*10000 + minor*100 + stepping, decimal) as an LLVM processor name: 110000 -> gfx1100."""
  major, minor, step = gfx_target_version // 10000, gfx_target_version // 100 % 100, gfx_target_version % 100
  return f"gfx{major}{minor:x}{step:x}"


def read_properties(text: str) -> dict[str, int]:
  """A KFD topology `properties` file ("name value" lines) as a dict of ints; malformed lines are skipped."""
  out = {}
  for ln in text.splitlines():
    k, _, v = ln.strip().partition(" ")
    try: out[k] = int(v)
    except ValueError: continue
  return out


def topology_gpus(nodes_dir: str = TOPOLOGY) -> list[dict[str, int]]:
  """Properties of the GPU nodes in the KFD topology (CPU nodes have gfx_target_version 0), with their node number as
  "node" and gpu_id as "gpu_id", in node order."""
  out = []
  try: nodes = sorted(os.listdir(nodes_dir), key=lambda n: int(n) if n.isdigit() else 1 << 30)
  except OSError: return out
  for n in nodes:
    try:
      with open(os.path.join(nodes_dir, n, "properties")) as f: props = read_properties(f.read())
      with open(os.path.join(nodes_dir, n, "gpu_id")) as f: gpu_id = int(f.read().strip() or 0)
    except (OSError, ValueError): continue
    if props.get("gfx_target_version", 0) and gpu_id: out.append({**props, "node": int(n) if n.isdigit() else -1, "gpu_id": gpu_id})
  return out


def probe_kfd(kfd: str = KFD_PATH, nodes_dir: str = TOPOLOGY) -> Availability:
  """Availability of the KFD interface: /dev/kfd exists and is read-write for us, and the topology lists a GPU."""
  if not os.path.exists(kfd): return Availability.no(f"no {kfd}: the amdgpu driver is not loaded")
  if not os.access(kfd, os.R_OK | os.W_OK):
    return Availability.no(f"permission denied on {kfd}: add the user to the render and video groups (sudo usermod -aG render,video $USER)")
  gpus = topology_gpus(nodes_dir)
  if not gpus: return Availability.no("no AMD GPU in the KFD topology")
  render = [f"/dev/dri/renderD{g['drm_render_minor']}" for g in gpus if "drm_render_minor" in g]
  if render and not any(os.access(r, os.R_OK | os.W_OK) for r in render):
    return Availability.no(f"permission denied on {render[0]}: add the user to the render and video groups")
  if shutil.which("clang-19") is None: return Availability.no("clang-19 not found: apt-get install clang-19 lld-19")
  return Availability.yes(f"{len(gpus)} GPU(s): {', '.join(gfx_arch(g['gfx_target_version']) for g in gpus)}")


def compiler_missing() -> Availability | None:
  if shutil.which("clang-19") is None: return Availability.no("clang-19 not found: apt-get install clang-19 lld-19")
  if shutil.which("ld.lld-19") is None and shutil.which("ld.lld") is None: return Availability.no("ld.lld-19 not found: apt-get install lld-19")
  return None


def probe_mock() -> Availability:
  """The mock KFD needs only the compiler (kernels run only once an executor is registered, see plugrad_amd.mock)."""
  return compiler_missing() or Availability.yes("in-process mock KFD (gfx1100)")


def probe_pci(root: str = SYSFS, dev_root: str = "/dev") -> Availability:
  """The PCI interface: an AMD GPU the userspace driver can take (not bound to amdgpu; VFIO or root access)."""
  ok, reasons = availability_reasons(root, dev_root)
  if not reasons: return Availability.no(f"no AMD GPU on the PCI bus ({root} lists none)")
  if not ok: return Availability.no("; ".join(reasons))
  return compiler_missing() or Availability.yes("; ".join(reasons))


def probe_mock_pci() -> Availability:
  """The mock PCI GPU needs only the compiler; it brings itself up with synthetic firmware (plugrad_amd.mock.firmware)."""
  return compiler_missing() or Availability.yes("in-process mock PCI GPU (Navi 31, gfx1100, synthetic firmware)")


@functools.lru_cache(None)
def probe() -> Availability:
  try: return probe_kfd()
  except Exception as e: return Availability.no(f"KFD probe failed: {type(e).__name__}: {e}")


@functools.lru_cache(None)
def probe_pci_cached() -> Availability:
  try: return probe_pci()
  except Exception as e: return Availability.no(f"PCI probe failed: {type(e).__name__}: {e}")


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  return [DeviceSpec("AMD", 190, PLUGIN_API_VERSION, probe, "plugrad_amd.interfaces:open_device", renderers=("AMDGPU",),
                     description="AMD GPU: LLVM IR (amdgcn) compiled by clang-19, PM4/SDMA queues through /dev/kfd or the userspace PCI driver",
                     interfaces={"KFD": probe, "MOCK": probe_mock, "PCI": probe_pci_cached, "MOCK+PCI": probe_mock_pci})]
