"""plugrad-disk: the DISK storage device (`DISK:/path/to/file`). Always available, never the default, cannot compute."""
from __future__ import annotations
from plugrad.plugins import PLUGIN_API_VERSION, Availability, DeviceSpec, hookimpl

@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  return [DeviceSpec("DISK", -50, PLUGIN_API_VERSION, lambda: Availability.yes("storage only"), "plugrad_disk.device:DiskDevice", storage=True,
                     description="files as buffers, memory-mapped: DISK:/path/to/file")]
