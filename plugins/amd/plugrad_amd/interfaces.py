"""The AMD device factory: the DEV interface picks the lowest layer under the shared HCQ runtime.

`AMD`, `KFD+AMD`, `MOCK+AMD`: plugrad_amd.device.AMDDevice (the kernel's KFD, or the mock KFD); `PCI+AMD`,
`MOCK+PCI+AMD`: plugrad_amd.am.runtime.AMDPCIDevice (the userspace AM driver, on a real or a mock PCI GPU).
"""
from __future__ import annotations

from plugrad.device import parse_device
from plugrad_amd.am.runtime import PCI_INTERFACES, AMDPCIDevice
from plugrad_amd.device import AMDDevice


def open_device(name: str) -> AMDDevice:
  return AMDPCIDevice(name) if parse_device(name).iface in PCI_INTERFACES else AMDDevice(name)
