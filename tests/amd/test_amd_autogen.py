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


def _generate_module():
  import importlib.util
  spec = importlib.util.spec_from_file_location("_amd_generate", ROOT / "autogen" / "generate.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_defines_extraction():
  """`"kinds": "defines"` targets: object- and function-like #defines and enums read from C text (suffixes and integer
  casts dropped, continued lines joined, earlier names usable), anything else skipped or refused by name."""
  g = _generate_module()
  text = """
#define A_ONE (1ULL << 3)   /* a comment */
#define A_TWO   (A_ONE | 0x10u)
#define A_F(x)  ((uint64_t)(x) << 48)
#define A_G(f, m) (((f) & ~A_ONE) | \\
                   A_F(m))
#define A_STR "text"
#define A_DIV (8 / 2)
#define B_OTHER 5
enum e { E_A, E_B = 0x10, E_C, E_D = E_B + 4 };
"""
  lines = g.extract_defines([text], {"prefixes": ["A_"], "names": ["B_OTHER"], "enums": ["e"]})
  ns: dict = {}
  exec("\n".join(lines), ns)
  assert ns["A_ONE"] == 8 and ns["A_TWO"] == 24 and ns["A_F"](3) == 3 << 48 and ns["A_G"](0xFF, 1) == (0xFF & ~8) | (1 << 48)
  assert ns["B_OTHER"] == 5 and (ns["E_A"], ns["E_B"], ns["E_C"], ns["E_D"]) == (0, 16, 17, 20)
  assert "A_STR" not in ns and "A_DIV" not in ns  # not integer expressions: skipped (only listed names are required)
  with pytest.raises(g.GenerateError, match="#define A_DIV '\\(8 / 2\\)' is no integer expression"): g.extract_defines([text], {"names": ["A_DIV"]})
  with pytest.raises(g.GenerateError, match=r"\['NOPE', 'nope_enum'\] not found"):
    g.extract_defines([text], {"names": ["NOPE"], "enums": ["nope_enum"]})
  assert g.extract_defines(["#define P (PAGE_SIZE - 1)"], {"names": ["P"], "assume": {"PAGE_SIZE": 4096}})[-1] == "P = 0xfff"


KERNEL_STRUCTS = {  # generated module -> (kernel headers, [(C type, bindings name, fields)])
  "discovery": (["drivers/gpu/drm/amd/include/discovery.h"], [
    ("binary_header", "struct_binary_header", ["binary_checksum", "binary_size", "table_list"]),
    ("struct ip_discovery_header", "struct_ip_discovery_header", ["num_dies", "die_info"]),
    ("struct ip_v4", "struct_ip_v4", ["hw_id", "num_base_address", "revision"]),
    ("struct gc_info_v1_0", "struct_gc_info_v1_0", ["gc_num_se", "gc_wave_size", "gc_num_gl2a"])]),
  "psp_gfx_if": (["drivers/gpu/drm/amd/amdgpu/psp_gfx_if.h"], [
    ("struct psp_gfx_cmd_resp", "struct_psp_gfx_cmd_resp", ["cmd_id", "cmd", "resp"]),
    ("struct psp_gfx_rb_frame", "struct_psp_gfx_rb_frame", ["cmd_buf_addr_lo", "fence_addr_hi", "fence_value"]),
    ("struct psp_gfx_cmd_setup_tmr", "struct_psp_gfx_cmd_setup_tmr", ["buf_size", "system_phy_addr_lo"])]),
  "amdgpu_ucode": (["drivers/gpu/drm/amd/amdgpu/amdgpu_socbb.h", "drivers/gpu/drm/amd/amdgpu/amdgpu_ucode.h"], [
    ("struct psp_firmware_header_v2_0", "struct_psp_firmware_header_v2_0", ["psp_fw_bin_count", "psp_fw_bin"]),
    ("struct gfx_firmware_header_v2_0", "struct_gfx_firmware_header_v2_0", ["data_offset_bytes", "ucode_start_addr_hi"]),
    ("struct rlc_firmware_header_v2_3", "struct_rlc_firmware_header_v2_3", ["rlcp_ucode_offset_bytes", "rlcv_ucode_size_bytes"]),
    ("struct sdma_firmware_header_v2_0", "struct_sdma_firmware_header_v2_0", ["ctl_ucode_offset", "ctl_ucode_size_bytes"]),
    ("struct imu_firmware_header_v1_0", "struct_imu_firmware_header_v1_0", ["imu_dram_ucode_size_bytes"])]),
  "v11_structs": (["drivers/gpu/drm/amd/include/v11_structs.h"], [
    ("struct v11_compute_mqd", "struct_v11_compute_mqd", ["cp_mqd_base_addr_lo", "cp_hqd_pq_control", "cp_hqd_active"])]),
}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")
def test_kernel_struct_layouts_match_gcc(tmp_path: Path):
  """The structs generated from kernel-internal headers (with the manifest's prelude) against gcc compiling the same
  headers with the same prelude."""
  if not os.path.exists(MANIFEST["tarball"]["path"]): pytest.skip(f"{MANIFEST['tarball']['path']} not installed (apt-get install linux-source-6.12)")
  import importlib
  g = _generate_module()
  members = sorted({h for hs, _ in KERNEL_STRUCTS.values() for h in hs})
  extracted = g.extract_tarball(MANIFEST["tarball"], members, str(tmp_path))
  (tmp_path / "prelude.h").write_text("\n".join(MANIFEST["preludes"]["kernel"]) + "\n")
  lines = ["#include <stdio.h>", "#include <stddef.h>", *[f'#include "{extracted[h]}"' for h in members], "int main(void) {"]
  got = {}
  for mod, (_, structs) in KERNEL_STRUCTS.items():
    m = importlib.import_module(f"plugrad_amd.autogen.{mod}")
    for c, py, fields in structs:
      t = getattr(m, py)
      lines.append(f'  printf("{c} size %zu\\n", sizeof({c}));')
      lines += [f'  printf("{c}.{f} %zu\\n", offsetof({c}, {f}));' for f in fields]
      got[f"{c} size"] = str(ctypes.sizeof(t))
      got.update({f"{c}.{f}": str(getattr(t, f).offset) for f in fields})
  (tmp_path / "probe.c").write_text("\n".join(lines + ["  return 0;", "}"]) + "\n")
  p = subprocess.run(["gcc", "-include", str(tmp_path / "prelude.h"), str(tmp_path / "probe.c"), "-o", str(tmp_path / "probe")],
                     capture_output=True, text=True)
  assert p.returncode == 0, p.stderr[-3000:]
  want = dict(ln.rsplit(" ", 1) for ln in subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True).stdout.splitlines())
  assert got == want
