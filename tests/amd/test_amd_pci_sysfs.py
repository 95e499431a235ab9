"""Finding AMD GPUs on the PCI bus and the PCI interface's error paths, against fake sysfs and /dev trees in tmp_path:
only AMD display functions are looked at, each GPU's state gives one reason saying what to do (bound to amdgpu, to
another driver, vfio-pci without its devices or permissions, no driver with a translating IOMMU or without root), the
probe is one line, and a fake GPU opened through its sysfs resource files stops with a clear error before anything
is written when its firmware never initialized it or its BAR hides part of VRAM."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

import plugrad_amd
from plugrad.device import Device, DeviceUnavailableError
from plugrad_amd.am.amdev import AMDev, BringUpError
from plugrad_amd.am.pci import PCIError, SysfsDevice, open_function
from plugrad_amd.am.sysfs import scan, usable
from plugrad_amd.autogen import amdgpu_defs

MB = 1 << 20


def make_fn(root: Path, bdf: str, vendor: int = 0x1002, device: int = 0x744C, cls: int = 0x030000, driver: str | None = None,
            group: str | None = None, group_type: str = "DMA", bars: dict[int, int] | None = None) -> Path:
  """A PCI function under root/devices the way sysfs shows it (driver and iommu_group are symlinks)."""
  d = root / "devices" / bdf
  d.mkdir(parents=True)
  for f, v in (("vendor", vendor), ("device", device)): (d / f).write_text(f"0x{v:04x}\n")
  (d / "class").write_text(f"0x{cls:06x}\n")
  if driver:
    (root / "drivers" / driver).mkdir(parents=True, exist_ok=True)
    os.symlink(root / "drivers" / driver, d / "driver")
  if group:
    (g := root / "iommu_groups" / group).mkdir(parents=True, exist_ok=True)
    (g / "type").write_text(group_type + "\n")
    os.symlink(g, d / "iommu_group")
  if bars:
    lines = []
    for i in range(6):
      size = bars.get(i, 0)
      lines.append(f"0x{(i + 1) << 32:016x} 0x{((i + 1) << 32) + size - 1 if size else 0:016x} 0x{0x200 if size else 0:016x}")
      if size: (d / f"resource{i}").write_bytes(bytes(size))
    (d / "resource").write_text("\n".join(lines) + "\n")
    (d / "config").write_bytes(bytes(256))
  return d


def test_scan_sees_only_amd_display_functions(tmp_path: Path):
  make_fn(tmp_path, "0000:05:00.0")
  make_fn(tmp_path, "0000:05:00.1", cls=0x040300)                # the GPU's HDMI audio function: not a GPU
  make_fn(tmp_path, "0000:01:00.0", vendor=0x8086, device=0x1533, cls=0x020000)  # a NIC
  make_fn(tmp_path, "0000:03:00.0", cls=0x038000)                # display controller, not VGA
  (tmp_path / "devices" / "0000:07:00.0").mkdir()                # unreadable entry: skipped
  fns = scan(str(tmp_path / "devices"))
  assert [f.bdf for f in fns] == ["0000:03:00.0", "0000:05:00.0"]
  assert fns[1].name == "0000:05:00.0 (1002:744c)" and fns[1].driver is None
  assert scan(str(tmp_path / "nope")) == []


def test_reasons(tmp_path: Path):
  dev = tmp_path / "dev"
  cases = {
    "0000:01:00.0": dict(driver="amdgpu", group="1"),
    "0000:02:00.0": dict(driver="radeon"),
    "0000:03:00.0": dict(driver="vfio-pci"),
    "0000:04:00.0": dict(driver="vfio-pci", group="4"),
    "0000:05:00.0": dict(group="5", group_type="DMA-FQ"),
    "0000:06:00.0": dict(group="6", group_type="identity"),
    "0000:07:00.0": dict(),
  }
  for bdf, kw in cases.items(): make_fn(tmp_path, bdf, **kw)
  fns = {f.bdf: f for f in scan(str(tmp_path / "devices"))}
  why = lambda bdf, **kw: usable(fns[bdf], str(dev), **kw)
  assert why("0000:01:00.0") == (False, "0000:01:00.0 (1002:744c) is bound to amdgpu, which owns it (DEV=AMD uses it through the kernel); "
         "for PCI+AMD unbind it: echo 0000:01:00.0 | sudo tee /sys/bus/pci/drivers/amdgpu/unbind, then bind vfio-pci (docs/amd.md)")
  assert why("0000:02:00.0") == (False, "0000:02:00.0 (1002:744c) is bound to radeon; unbind it and bind vfio-pci (docs/amd.md)")
  assert "has no IOMMU group (is the IOMMU enabled?" in why("0000:03:00.0")[1]
  assert why("0000:04:00.0") == (False, f"0000:04:00.0 (1002:744c): no {dev}/vfio/vfio (modprobe vfio-pci)")
  (dev / "vfio").mkdir(parents=True)
  (dev / "vfio" / "vfio").write_text("")
  assert why("0000:04:00.0") == (False, f"0000:04:00.0 (1002:744c): no {dev}/vfio/4 (is its IOMMU group bound to vfio-pci?)")
  (dev / "vfio" / "4").write_text("")
  assert why("0000:04:00.0") == (True, "0000:04:00.0 (1002:744c) through VFIO (IOMMU group 4)")
  assert "the IOMMU translates its DMA (group type DMA-FQ): bind it to vfio-pci" in why("0000:05:00.0")[1]
  assert why("0000:06:00.0", root_user=True) == (True, "0000:06:00.0 (1002:744c) through sysfs (no driver, no IOMMU translation)")
  assert why("0000:07:00.0", root_user=False) == (False, "0000:07:00.0 (1002:744c) has no driver: reaching it through sysfs needs root; "
                                                          "or bind it to vfio-pci (docs/amd.md)")
  with pytest.raises(PCIError, match="bound to amdgpu, which owns it"): open_function(fns["0000:01:00.0"], str(dev))


@pytest.mark.skipif(os.geteuid() == 0, reason="root can open any file")
def test_vfio_permission_denied(tmp_path: Path):
  make_fn(tmp_path, "0000:04:00.0", driver="vfio-pci", group="4")
  (tmp_path / "dev" / "vfio").mkdir(parents=True)
  for f in ("vfio", "4"): (tmp_path / "dev" / "vfio" / f).write_text("")
  (tmp_path / "dev" / "vfio" / "4").chmod(0)
  fn = scan(str(tmp_path / "devices"))[0]
  assert usable(fn, str(tmp_path / "dev"))[1].startswith(f"0000:04:00.0 (1002:744c): permission denied on {tmp_path}/dev/vfio/4: sudo chown")


def test_probe_is_one_line(tmp_path: Path):
  a = plugrad_amd.probe_pci(str(tmp_path / "devices"), str(tmp_path / "dev"))
  assert not a.ok and a.reason == f"no AMD GPU on the PCI bus ({tmp_path / 'devices'} lists none)"
  make_fn(tmp_path, "0000:01:00.0", driver="amdgpu")
  make_fn(tmp_path, "0000:02:00.0", driver="radeon")
  a = plugrad_amd.probe_pci(str(tmp_path / "devices"), str(tmp_path / "dev"))
  assert not a.ok and "\n" not in a.reason and a.reason.count(";") >= 2 and "bound to amdgpu" in a.reason and "bound to radeon" in a.reason


def test_dev_pci_amd_without_a_gpu_is_one_clear_line():
  if scan(): pytest.skip("this machine has an AMD GPU on its PCI bus")
  with pytest.raises(DeviceUnavailableError) as ei: Device.entry("PCI+AMD")
  assert str(ei.value).splitlines()[0] == "device 'PCI+AMD' is unavailable: no AMD GPU on the PCI bus (/sys/bus/pci/devices lists none)"


@pytest.mark.skipif(os.geteuid() != 0, reason="the sysfs path needs root (physical addresses from /proc/self/pagemap)")
@pytest.mark.parametrize("memsize_mb,match", [
  (0, "RCC_CONFIG_MEMSIZE reads 0: the GPU's firmware has not initialized its memory"),
  (1024, "BAR 0 shows 8 MiB of the 1024 MiB of VRAM: enable Resizable BAR"),
])
def test_sysfs_device_stops_before_writing(tmp_path: Path, memsize_mb: int, match: str):
  """A fake unbound GPU whose BARs are plain files: the driver maps them, reads the VRAM size at the fixed offset, and
  stops with the reason before writing any register (the register BAR file is unchanged but for what the test put)."""
  d = make_fn(tmp_path, "0000:09:00.0", group="9", group_type="identity", bars={0: 8 * MB, 2: 2 * MB, 5: 1 * MB})
  regs = bytearray(1 * MB)
  struct.pack_into("<I", regs, amdgpu_defs.mmRCC_CONFIG_MEMSIZE * 4, memsize_mb)
  (d / "resource5").write_bytes(bytes(regs))
  fn = scan(str(tmp_path / "devices"))[0]
  pci = open_function(fn, str(tmp_path / "dev"))
  assert isinstance(pci, SysfsDevice) and pci.vram.size == 8 * MB and pci.mmio.size == 1 * MB
  assert int.from_bytes((d / "config").read_bytes()[4:6], "little") & 6 == 6  # memory decoding and bus mastering enabled
  addr, pages = pci.alloc_dma(8192)
  assert len(pages) == 2 and all(p % 4096 == 0 and p for p in pages)
  with pytest.raises(BringUpError, match=match): AMDev(pci)
  pci.close()
  assert (d / "resource5").read_bytes() == bytes(regs)


def test_vfio_ioctl_numbers_and_a_device_that_is_no_vfio(tmp_path: Path):
  """The VFIO ioctl numbers come from the generated vfio.h macros (_IO(';', 100 + n)); opening a "container" that is a
  plain file fails at the first ioctl with the ioctl's name."""
  from plugrad_amd.am.pci import VFIODevice, _vfio_ioctls
  n = _vfio_ioctls()
  assert (n["VFIO_GET_API_VERSION"], n["VFIO_GROUP_GET_DEVICE_FD"], n["VFIO_DEVICE_GET_REGION_INFO"], n["VFIO_IOMMU_MAP_DMA"]) == \
    (0x3B64, 0x3B6A, 0x3B6C, 0x3B71)
  make_fn(tmp_path, "0000:04:00.0", driver="vfio-pci", group="4")
  (tmp_path / "dev" / "vfio").mkdir(parents=True)
  for f in ("vfio", "4"): (tmp_path / "dev" / "vfio" / f).write_text("")
  fn = scan(str(tmp_path / "devices"))[0]
  with pytest.raises(PCIError, match=r"0000:04:00.0 \(1002:744c\): VFIO_GET_API_VERSION failed: Inappropriate ioctl for device"):
    VFIODevice(fn, str(tmp_path / "dev"))
