"""The AMD GPUs on the PCI bus as sysfs shows them, and whether the PCI driver can take each (cheap: no device is opened).

`scan(root)` lists the AMD display functions (vendor PCI_VENDOR_ID_ATI, base class PCI_BASE_CLASS_DISPLAY) under
/sys/bus/pci/devices; nothing else on the bus is looked at further. `usable(fn)` says whether the driver can take a
GPU and, if not, what to do: a GPU bound to amdgpu belongs to the kernel (DEV=AMD uses it), one bound to vfio-pci is
reached through VFIO (its group device must be accessible), an unbound one through the sysfs resource files (root, and
no IOMMU translating its DMA). The plugin's probe uses this at registration time, so it imports nothing heavy.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from plugrad_amd.autogen import pci_ids

SYSFS = "/sys/bus/pci/devices"
TRANSLATING_IOMMU = ("DMA", "DMA-FQ")       # iommu_group/type values under which physical addresses are not bus addresses


@dataclass(frozen=True)
class PCIFunction:
  bdf: str
  vendor: int
  device: int
  pci_class: int
  driver: str | None
  iommu_group: str | None
  iommu_type: str | None
  path: str

  @property
  def name(self) -> str: return f"{self.bdf} ({self.vendor:04x}:{self.device:04x})"


def read_text(path: str) -> str | None:
  try:
    with open(path) as f: return f.read().strip()
  except OSError: return None


def _link(path: str) -> str | None:
  try: return os.path.basename(os.readlink(path))
  except OSError: return None


def scan(root: str = SYSFS) -> list[PCIFunction]:
  """The AMD GPUs under `root` (a sysfs pci devices folder), in bus order."""
  out = []
  try: entries = sorted(os.listdir(root))
  except OSError: return out
  for bdf in entries:
    p = os.path.join(root, bdf)
    try: vendor, device, cls = (int(read_text(os.path.join(p, f)) or "", 16) for f in ("vendor", "device", "class"))
    except ValueError: continue
    if vendor != pci_ids.PCI_VENDOR_ID_ATI or cls >> 16 != pci_ids.PCI_BASE_CLASS_DISPLAY: continue
    group = _link(os.path.join(p, "iommu_group"))
    out.append(PCIFunction(bdf, vendor, device, cls, _link(os.path.join(p, "driver")), group, read_text(os.path.join(p, "iommu_group", "type")), p))
  return out


def usable(fn: PCIFunction, dev_root: str = "/dev", root_user: bool | None = None) -> tuple[bool, str]:
  """(usable, reason) for one GPU: how the driver would reach it, or why it can't and what to do."""
  is_root = os.geteuid() == 0 if root_user is None else root_user
  if fn.driver == "amdgpu":
    return False, (f"{fn.name} is bound to amdgpu, which owns it (DEV=AMD uses it through the kernel); for PCI+AMD unbind it: "
                   f"echo {fn.bdf} | sudo tee /sys/bus/pci/drivers/amdgpu/unbind, then bind vfio-pci (docs/amd.md)")
  if fn.driver == "vfio-pci":
    if fn.iommu_group is None:
      return False, f"{fn.name} is bound to vfio-pci but has no IOMMU group (is the IOMMU enabled? amd_iommu=on / intel_iommu=on)"
    grp, ctl = os.path.join(dev_root, "vfio", fn.iommu_group), os.path.join(dev_root, "vfio", "vfio")
    if not os.path.exists(ctl): return False, f"{fn.name}: no {ctl} (modprobe vfio-pci)"
    if not os.path.exists(grp): return False, f"{fn.name}: no {grp} (is its IOMMU group bound to vfio-pci?)"
    if not os.access(grp, os.R_OK | os.W_OK) or not os.access(ctl, os.R_OK | os.W_OK):
      return False, f"{fn.name}: permission denied on {grp}: sudo chown $USER {grp} (or run as root)"
    return True, f"{fn.name} through VFIO (IOMMU group {fn.iommu_group})"
  if fn.driver is not None:
    return False, f"{fn.name} is bound to {fn.driver}; unbind it and bind vfio-pci (docs/amd.md)"
  if fn.iommu_type in TRANSLATING_IOMMU:
    return False, f"{fn.name} has no driver and the IOMMU translates its DMA (group type {fn.iommu_type}): bind it to vfio-pci (docs/amd.md)"
  if not is_root: return False, f"{fn.name} has no driver: reaching it through sysfs needs root; or bind it to vfio-pci (docs/amd.md)"
  return True, f"{fn.name} through sysfs (no driver, no IOMMU translation)"


def availability_reasons(root: str = SYSFS, dev_root: str = "/dev", root_user: bool | None = None) -> tuple[list[PCIFunction], list[str]]:
  """(usable GPUs, a reason per GPU) for the probe and plugrad-devices."""
  ok, reasons = [], []
  for fn in scan(root):
    good, why = usable(fn, dev_root, root_user)
    reasons.append(("usable: " if good else "") + why)
    if good: ok.append(fn)
  return ok, reasons
