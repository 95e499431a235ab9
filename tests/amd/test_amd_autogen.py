"""Generated amd bindings: import without any library, expected symbols, macro functions, ioctl numbers, struct
layouts against a gcc/g++-compiled probe of the headers, and regeneration (`autogen/generate.py amd --check --skip-slow`;
the register headers take minutes and are checked by `make autogen-check` only)."""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AUTOGEN = ROOT / "plugins" / "amd" / "plugrad_amd" / "autogen"
MANIFEST = json.loads((ROOT / "autogen" / "manifests" / "amd.json").read_text())


def test_bindings_import_and_export_expected_symbols():
  import importlib
  for name, t in MANIFEST["targets"].items():
    if t.get("slow") and not (AUTOGEN / f"{name}.py").exists(): pytest.fail(f"{name}.py is not committed")
    mod = importlib.import_module(f"plugrad_amd.autogen.{name}")
    missing = [s for s in t["expect"] if not hasattr(mod, s)]
    assert not missing, f"{name} bindings lack {missing}"


def test_macro_functions_and_values():
  from plugrad_amd.autogen import kfd, pm4_nv, sdma_gfx11
  assert pm4_nv.PACKET3(pm4_nv.PACKET3_RELEASE_MEM, 6) == (3 << 30) | (0x49 << 8) | (6 << 16)
  assert pm4_nv.PACKET3_RELEASE_MEM_DATA_SEL(3) == 3 << 29 and pm4_nv.WAIT_REG_MEM_FUNCTION(5) == 5
  assert sdma_gfx11.SDMA_OP_COPY == 1 and sdma_gfx11.SDMA_OP_FENCE == 5 and sdma_gfx11.SDMA_PKT_COPY_LINEAR_COUNT_count_offset == 1
  assert kfd.KFD_IOC_QUEUE_TYPE_COMPUTE == 0 and kfd.KFD_IOC_QUEUE_TYPE_SDMA == 1 and kfd.KFD_IOC_ALLOC_MEM_FLAGS_VRAM == 1


def test_ioctl_numbers():
  from plugrad_amd.kfd import IOCTLS, ioctl_number
  assert {"GET_VERSION", "CREATE_QUEUE", "ALLOC_MEMORY_OF_GPU", "MAP_MEMORY_TO_GPU", "ACQUIRE_VM"} <= IOCTLS.keys()
  assert ioctl_number("GET_VERSION") == 0x80084B01  # _IOR('K', 1, 8-byte struct)
  assert ioctl_number("CREATE_QUEUE") == 0xC0584B02  # _IOWR('K', 2, 88-byte struct)


def test_no_absolute_paths_and_no_libraries():
  for f in AUTOGEN.glob("*.py"):
    with open(f) as fh: head = fh.read(200_000)
    assert not re.search(r"CDLL\(|/usr/|/home/|/work/|site-packages|FIXME_STUB", head), f"{f.name} bakes in a path or a library"


STRUCTS = {  # (header, C type) -> (module, bindings name, fields whose offsets are compared)
  ("linux/kfd_ioctl.h", "struct kfd_ioctl_create_queue_args"): ("kfd", "struct_kfd_ioctl_create_queue_args",
    ["ring_base_address", "write_pointer_address", "read_pointer_address", "doorbell_offset", "ring_size", "gpu_id", "queue_type",
     "eop_buffer_address", "ctx_save_restore_address", "ctl_stack_size"]),
  ("linux/kfd_ioctl.h", "struct kfd_ioctl_alloc_memory_of_gpu_args"): ("kfd", "struct_kfd_ioctl_alloc_memory_of_gpu_args",
    ["va_addr", "size", "handle", "mmap_offset", "gpu_id", "flags"]),
  ("linux/kfd_ioctl.h", "struct kfd_ioctl_map_memory_to_gpu_args"): ("kfd", "struct_kfd_ioctl_map_memory_to_gpu_args",
    ["handle", "device_ids_array_ptr", "n_devices", "n_success"]),
  ("linux/kfd_ioctl.h", "struct kfd_ioctl_acquire_vm_args"): ("kfd", "struct_kfd_ioctl_acquire_vm_args", ["drm_fd", "gpu_id"]),
  ("linux/kfd_ioctl.h", "struct kfd_event_data"): ("kfd", "struct_kfd_event_data", ["event_id"]),
  ("libdrm/amdgpu_drm.h", "struct drm_amdgpu_info_device"): ("amdgpu_drm", "struct_drm_amdgpu_info_device",
    ["device_id", "family", "num_shader_engines", "vram_type", "gc_double_offchip_lds_buf"]),
  ("hsa/hsa.h", "hsa_kernel_dispatch_packet_t"): ("hsa", "hsa_kernel_dispatch_packet_t",
    ["header", "setup", "workgroup_size_x", "grid_size_x", "private_segment_size", "group_segment_size", "kernel_object",
     "kernarg_address", "completion_signal"]),
  ("hsa/amd_hsa_kernel_code.h", "amd_kernel_code_t"): ("amd_hsa", "amd_kernel_code_t",
    ["kernel_code_entry_byte_offset", "compute_pgm_rsrc1", "kernel_code_properties", "workitem_private_segment_byte_size", "wavefront_size"]),
  ("hsa/amd_hsa_signal.h", "amd_signal_t"): ("amd_hsa", "amd_signal_t", ["kind", "value", "event_mailbox_ptr", "event_id", "start_ts", "end_ts"]),
  ("hsa/amd_hsa_queue.h", "amd_queue_t"): ("amd_hsa", "amd_queue_t", ["hsa_queue", "write_dispatch_id", "read_dispatch_id", "queue_properties"]),
}


def probe_layouts(tmp_path: Path) -> dict[str, str]:
  shim = tmp_path / "inc"
  shim.mkdir()
  os.symlink("/usr/include/libdrm", shim / "drm")
  lines = ["#include <stdio.h>", "#include <stddef.h>", *sorted({f"#include <{h}>" for h, _ in STRUCTS}), "int main(void) {"]
  for (_, c), (_, _, fields) in STRUCTS.items():
    lines.append(f'  printf("{c} size %zu\\n", sizeof({c}));')
    lines += [f'  printf("{c}.{f} %zu\\n", offsetof({c}, {f}));' for f in fields]
  (tmp_path / "probe.c").write_text("\n".join(lines + ["  return 0;", "}"]) + "\n")
  cmd = ["gcc", f"-I{shim}", "-I/usr/include/hsa", str(tmp_path / "probe.c"), "-o", str(tmp_path / "probe")]
  p = subprocess.run(cmd, capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  return dict(ln.rsplit(" ", 1) for ln in subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True).stdout.splitlines())


HEADERS = ["/usr/include/linux/kfd_ioctl.h", "/usr/include/libdrm/amdgpu_drm.h", "/usr/include/hsa/hsa.h"]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")
def test_struct_layouts_match_gcc(tmp_path: Path):
  if (missing := [h for h in HEADERS if not os.path.exists(h)]):
    pytest.skip(f"headers {missing} not installed (apt-get install linux-libc-dev libdrm-dev libhsa-runtime-dev, or make autogen)")
  import importlib
  want = probe_layouts(tmp_path)
  got = {}
  for (_, c), (mod, py, fields) in STRUCTS.items():
    t = getattr(importlib.import_module(f"plugrad_amd.autogen.{mod}"), py)
    got[f"{c} size"] = str(ctypes.sizeof(t))
    got.update({f"{c}.{f}": str(getattr(t, f).offset) for f in fields})
  assert got == want


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_kernel_descriptor_layout_matches_llvm(tmp_path: Path):
  hdr = "/usr/include/llvm-19/llvm/Support/AMDHSAKernelDescriptor.h"
  if not os.path.exists(hdr): pytest.skip("llvm-19-dev not installed (make autogen installs it)")
  from plugrad_amd.autogen.amdhsa_kd import struct_kernel_descriptor_t as KD
  fields = [f[0] for f in KD._fields_]
  src = ["#include <cstdio>", "#include <cstddef>", f"#include <{hdr}>", "using llvm::amdhsa::kernel_descriptor_t;", "int main() {",
         '  printf("size %zu\\n", sizeof(kernel_descriptor_t));', *[f'  printf("{f} %zu\\n", offsetof(kernel_descriptor_t, {f}));' for f in fields],
         "}"]
  (tmp_path / "kd.cpp").write_text("\n".join(src) + "\n")
  p = subprocess.run(["g++", "-std=c++17", str(tmp_path / "kd.cpp"), "-o", str(tmp_path / "kd")], capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  want = dict(ln.split(" ") for ln in subprocess.run([str(tmp_path / "kd")], capture_output=True, text=True).stdout.splitlines())
  got = {"size": str(ctypes.sizeof(KD)), **{f: str(getattr(KD, f).offset) for f in fields}}
  assert got == want and got["size"] == "64" and got["kernel_code_entry_byte_offset"] == "16"


def generator_ready() -> str | None:
  try:
    import clang.cindex  # noqa: F401
    import ctypeslib  # noqa: F401
  except ImportError as e: return f"autogen needs ctypeslib2 and clang==19.* ({e}): pip install -e 'plugins/amd[autogen]'"
  if not any(Path(d).glob("libclang-19.so*") for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu")):
    return "libclang-19 not installed (apt-get install libclang1-19)"
  if not os.path.exists(MANIFEST["tarball"]["path"]): return f"{MANIFEST['tarball']['path']} not installed (apt-get install linux-source-6.12)"
  if (missing := [h for h in HEADERS if not os.path.exists(h)]): return f"headers {missing} not installed"
  return None


@pytest.mark.slow
def test_regenerated_bindings_match_committed():
  if (why := generator_ready()): pytest.skip(why)
  cmd = [sys.executable, str(ROOT / "autogen" / "generate.py"), "amd", "--check", "--skip-slow"]
  p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
  assert "committed bindings match" in p.stdout
