"""The CPU device's cache sizes (`cache_sizes`, read from Linux sysfs at run time; codegen's matmul row blocking reads
them as the renderer's `cache_bytes`): parsed from a sysfs-shaped tree, instruction caches skipped, overrides, and an
unreadable or missing tree giving zeros (unknown: no blocking) rather than an error."""
import os

from plugrad.device import Device
from plugrad_cpu.device import cache_sizes


def _index(root, i: int, level: str, kind: str, size: str) -> None:
  d = root / f"index{i}"
  d.mkdir()
  for name, text in (("level", level), ("type", kind), ("size", size)): (d / name).write_text(text + "\n")


def test_sysfs_tree_parsed(tmp_path):
  _index(tmp_path, 0, "1", "Data", "48K")
  _index(tmp_path, 1, "1", "Instruction", "32K")
  _index(tmp_path, 2, "2", "Unified", "1024K")
  _index(tmp_path, 3, "3", "Unified", "32M")
  (tmp_path / "uevent").write_text("")
  assert cache_sizes(str(tmp_path)) == (48 << 10, 1 << 20, 32 << 20)


def test_missing_or_malformed_levels_are_zero(tmp_path, monkeypatch):
  _index(tmp_path, 0, "1", "Data", "32K")
  _index(tmp_path, 1, "2", "Unified", "lots")      # malformed: skipped
  (tmp_path / "index2").mkdir()                     # no files: skipped
  assert cache_sizes(str(tmp_path)) == (32 << 10, 0, 0)
  assert cache_sizes(str(tmp_path / "absent")) == (0, 0, 0)
  monkeypatch.setenv("CACHE_L3", str(8 << 20))
  assert cache_sizes(str(tmp_path)) == (32 << 10, 0, 8 << 20)


def test_device_renderer_carries_the_host_caches():
  l1, l2, l3 = Device["CPU"].renderer.caps.cache_bytes
  if os.path.isdir("/sys/devices/system/cpu/cpu0/cache"): assert l1 > 0 and l2 >= l1
  assert l3 >= 0
