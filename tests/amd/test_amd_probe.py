"""The AMD probe never raises and never opens the device: it reports why KFD is unusable (fake /dev/kfd files and sysfs
topologies in tmp_path), MOCK+AMD has its own probe, and plugrad-devices lists AMD cleanly on this machine."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import plugrad_amd
import plugrad_amd.am.sysfs
from plugrad_amd import gfx_arch, probe_kfd, read_properties, topology_gpus


def make_topology(root: Path, nodes: list[tuple[int, int]]) -> str:
  """nodes: (gfx_target_version, gpu_id) per node; a CPU node has (0, 0)."""
  d = root / "nodes"
  for i, (ver, gpu_id) in enumerate(nodes):
    (d / str(i)).mkdir(parents=True)
    (d / str(i) / "properties").write_text(f"cpu_cores_count 0\nsimd_count 96\ngfx_target_version {ver}\ndrm_render_minor {128 + i}\n")
    (d / str(i) / "gpu_id").write_text(f"{gpu_id}\n")
  return str(d)


def test_no_kfd(tmp_path: Path):
  a = probe_kfd(str(tmp_path / "kfd"), str(tmp_path))
  assert not a.ok and a.reason == f"no {tmp_path / 'kfd'}: the amdgpu driver is not loaded"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can open any file")
def test_permission_denied(tmp_path: Path):
  kfd = tmp_path / "kfd"
  kfd.write_text("")
  kfd.chmod(0)
  a = probe_kfd(str(kfd), str(tmp_path))
  assert not a.ok and a.reason.startswith(f"permission denied on {kfd}: add the user to the render and video groups")


def test_no_gpu_in_topology(tmp_path: Path):
  kfd = tmp_path / "kfd"
  kfd.write_text("")
  a = probe_kfd(str(kfd), make_topology(tmp_path, [(0, 0)]))
  assert not a.ok and a.reason == "no AMD GPU in the KFD topology"


def test_gpus_in_topology(tmp_path: Path):
  kfd = tmp_path / "kfd"
  kfd.write_text("")
  nodes = make_topology(tmp_path, [(0, 0), (110000, 4242), (90402, 777)])
  assert [g["gpu_id"] for g in topology_gpus(nodes)] == [4242, 777]
  a = probe_kfd(str(kfd), nodes)
  if a.ok: assert a.reason == "2 GPU(s): gfx1100, gfx942"
  else: assert "renderD" in a.reason or "clang-19" in a.reason  # this machine has no render nodes / compiler


def test_gfx_arch_names():
  assert [gfx_arch(v) for v in (110000, 110001, 120001, 90402, 90010, 90008)] == ["gfx1100", "gfx1101", "gfx1201", "gfx942", "gfx90a", "gfx908"]
  assert read_properties("a 1\nbad\nb x\nc 3\n") == {"a": 1, "c": 3}


def test_probe_and_mock_on_this_machine():
  from plugrad.device import Device, DeviceUnavailableError
  a = plugrad_amd.probe()
  if not os.path.exists("/dev/kfd"):
    assert not a.ok and a.reason == "no /dev/kfd: the amdgpu driver is not loaded"
    with pytest.raises(DeviceUnavailableError, match="device 'AMD' is unavailable: no /dev/kfd"): Device.entry("AMD")
  assert Device.registry.devices["AMD"].availability("MOCK").ok == plugrad_amd.probe_mock().ok
  if not plugrad_amd.am.sysfs.scan():  # no AMD GPU on this machine's PCI bus: one clear line
    with pytest.raises(DeviceUnavailableError, match=r"device 'PCI\+AMD' is unavailable: no AMD GPU on the PCI bus"): Device.entry("PCI+AMD")
  assert Device.registry.devices["AMD"].availability("MOCK+PCI").ok == plugrad_amd.probe_mock().ok


def test_plugrad_devices_lists_amd_cleanly():
  env = {k: v for k, v in os.environ.items() if k != "DEV"}
  p = subprocess.run([sys.executable, "-m", "plugrad.devices", "--no-smoke"], capture_output=True, text=True, env=env, timeout=120)
  assert p.returncode == 0, p.stderr
  line = next(ln for ln in p.stdout.splitlines() if ln.strip().startswith("AMD "))
  assert ("UNAVAILABLE: " in line or "available" in line) and "Traceback" not in p.stdout + p.stderr
  if not os.path.exists("/dev/kfd"): assert "UNAVAILABLE: no /dev/kfd: the amdgpu driver is not loaded" in line
  ifaces = {ln.split(":")[0].strip(): ln.split(":", 1)[1].strip() for ln in p.stdout.splitlines() if ln.strip().split(":")[0].endswith("+AMD")}
  assert set(ifaces) == {"MOCK+AMD", "PCI+AMD", "MOCK+PCI+AMD"}, p.stdout  # every interface with why it is (un)available
  if not plugrad_amd.am.sysfs.scan(): assert ifaces["PCI+AMD"] == "UNAVAILABLE: no AMD GPU on the PCI bus (/sys/bus/pci/devices lists none)"


def test_registration_imports_nothing_heavy():
  """Registering (and probing) imports the plugin and the stdlib-only sysfs scan of the PCI probe, nothing more."""
  code = ("import sys, plugrad_amd; from plugrad.device import Device; Device.registry; Device.registry.devices['AMD'].availability('PCI'); "
          "print(sorted(m for m in sys.modules if m.startswith('plugrad_amd')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
  assert out.strip() == "['plugrad_amd', 'plugrad_amd.am', 'plugrad_amd.am.sysfs', 'plugrad_amd.autogen', 'plugrad_amd.autogen.pci_ids']", out


def test_dev_mock_selects_the_mock_interface():
  code = "from plugrad.device import Device; d = Device.default(); print(type(d).__name__, type(d.os).__name__, d.arch)"
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, "DEV": "MOCK+AMD"})
  assert p.stdout.strip() == "AMDDevice MockKFD gfx1100", p.stderr[-2000:]
