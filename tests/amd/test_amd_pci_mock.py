"""DEV=MOCK+PCI+AMD end to end: the AM driver brings the mock Navi 31 up (discovery -> NBIO/HDP -> GMC -> PSP and
firmware -> SMU -> GFX -> SDMA, every register named by the generated bindings) and the shared HCQ runtime runs Tensor
programs on it (clang's gfx1100 code on the RDNA3 emulator, through the driver's own page tables); and everything the
mock refuses as hardware would: an unmapped address, a register of a block not up, a doorbell no queue owns, missing
or bad firmware (then the next open resets the GPU and comes up), an IP version the driver doesn't know."""
from __future__ import annotations

import io
import os
import shutil
import tokenize
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrad.device import Device
from plugrad.engine.jit import TinyJit
from plugrad.tensor import Tensor
from plugrad_amd.am.amdev import BringUpError, UnsupportedGPU
from plugrad_amd.am.firmware import Firmware, FirmwareError
from plugrad_amd.am.runtime import AMDPCIDevice
from plugrad_amd.autogen import psp_gfx_if
from plugrad_amd.autogen import soc15_hw_ip as H
from plugrad_amd.device import AMDCopyQueue
from plugrad_amd.mock import pci_firmware
from plugrad_amd.mock.discovery import NAVI31
from plugrad_amd.mock.firmware import write_synthetic
from plugrad_amd.mock.pci import MockGPUError, MockPlatform

pytestmark = pytest.mark.skipif(shutil.which("clang-19") is None, reason="clang-19 not installed (make sysdeps)")
D = "MOCK+PCI+AMD"
AM = Path(__file__).resolve().parents[2] / "plugins" / "amd" / "plugrad_amd" / "am"
FUZZ = int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200"))
VERSIONS = {"MP0": (13, 0, 0), "MP1": (13, 0, 0), "GC": (11, 0, 0), "SDMA0": (6, 0, 0)}
RNG = np.random.default_rng(0)


def fresh(tmp_path: Path | None = None, **kw) -> tuple[MockPlatform, AMDPCIDevice]:
  """A private mock bus with one small GPU, brought up."""
  plat = MockPlatform(1, 256 << 20, **kw)
  return plat, AMDPCIDevice(D, plat)


def written(gpu) -> list[str]: return [n for rw, _, n, _ in gpu.trace if rw == "w"]


def works(d: AMDPCIDevice) -> bool:
  """A device object (not the registry's) copies through SDMA both ways and signals from its compute queue."""
  data = RNG.integers(0, 255, 10000, dtype=np.uint8)
  buf, out = d.allocator.alloc(len(data)), np.zeros_like(data)
  d.allocator._copyin(buf, memoryview(data))
  d.allocator._copyout(memoryview(out), buf)
  d.hw_compute_queue_t().signal(d.timeline_signal, d.next_timeline()).submit(d)
  d.synchronize()
  return bool((out == data).all())


def test_bring_up_follows_the_hardware_order():
  plat, d = fresh()
  gpu = plat.devices[0]
  w = written(gpu)
  milestones = ["RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN", "BIF_BX0_REMAP_HDP_MEM_FLUSH_CNTL", "MMVM_CONTEXT0_CNTL", "MP0_SMN_C2PMSG_35",
                "MP0_SMN_C2PMSG_64", "MP0_SMN_C2PMSG_67", "MP1_SMN_C2PMSG_66", "GCVM_CONTEXT0_CNTL", "CP_MEC_RS64_CNTL", "SDMA0_F32_CNTL",
                "CP_HQD_ACTIVE", "SDMA0_QUEUE0_RB_CNTL"]
  assert [w.index(m) for m in milestones] == sorted(w.index(m) for m in milestones), milestones
  assert d.arch == "gfx1100" and gpu.rlc_up and gpu.sdma_fw and gpu.smu.features and gpu.hdp_flushes > 0 and gpu.fault is None
  assert gpu.loaded == pci_firmware.AUTOLOAD_NEEDS | {psp_gfx_if.GFX_FW_TYPE_SMU} and not gpu.psp.log
  assert {q.kind for q in gpu.queues.values()} == {"PM4", "SDMA"} and works(d)
  assert gpu.get("MP1", "MP1_SMN_C2PMSG_90") == 1  # the SMU's last answer: PPSMC_Result_OK
  assert any(blk == "NBIO" and name == "RCC_DEV0_EPF2_STRAP2" for _, blk, name, _ in gpu.trace)  # beyond the BAR: RSMU index/data


def test_matmul_softmax_gradients_equal_numpy():
  a, b = RNG.standard_normal((24, 40), np.float32), RNG.standard_normal((40, 16), np.float32)
  np.testing.assert_allclose((Tensor(a, device=D) @ Tensor(b, device=D)).numpy(), a @ b, rtol=1e-5, atol=1e-5)
  s = Tensor(a, device=D).softmax(-1).numpy()
  e = np.exp(a - a.max(-1, keepdims=True))
  np.testing.assert_allclose(s, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
  x, w = Tensor(a, device=D, requires_grad=True), Tensor(b, device=D, requires_grad=True)
  ((x @ w).relu() * 2).sum().backward()
  mask = ((a @ b) > 0).astype(np.float32) * 2
  np.testing.assert_allclose(x.grad.numpy(), mask @ b.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w.grad.numpy(), a.T @ mask, rtol=1e-4, atol=1e-4)
  assert type(Device[D]).__name__ == "AMDPCIDevice" and Device[D].pci.gpu.fault is None


def test_copies_between_gpus_and_interfaces():
  a = RNG.standard_normal(1000).astype(np.float32)
  t = Tensor(a, device=D)
  for other in (f"{D}:1", "MOCK+AMD"):
    u = t.to(other) * 2
    np.testing.assert_array_equal(u.numpy(), a * 2)
    np.testing.assert_array_equal(u.to(D).numpy(), a * 2)


def test_tinyjit_replays():
  @TinyJit
  def f(x: Tensor, y: Tensor) -> Tensor: return (x * y + 1).realize()
  for i in range(4):
    x, y = RNG.standard_normal(64).astype(np.float32), RNG.standard_normal(64).astype(np.float32)
    np.testing.assert_allclose(f(Tensor(x, device=D), Tensor(y, device=D)).numpy(), x * y + 1, rtol=1e-6)


def test_unmapped_address_is_a_page_fault():
  plat, d = fresh()
  src = d.alloc_gpu(4096, "vram")
  AMDCopyQueue().copy(1 << 45, src.va_addr, 64).signal(d.timeline_signal, d.next_timeline()).submit(d)
  with pytest.raises(RuntimeError, match=r"faulted: SDMA queue \(doorbell 512\): SDMA at ring offset 0x0: PageFault: GPU page fault: access of 64"):
    d.synchronize()


def test_freed_memory_is_unmapped_for_the_gpu():
  """Freeing unmaps and invalidates: the GPU's next access to the address is a page fault (without the invalidation
  the mock's TLB would still hold the translation and says so)."""
  plat, d = fresh()
  buf, src = d.alloc_gpu(8192, "gtt"), d.alloc_gpu(4096, "vram")
  AMDCopyQueue().copy(buf.va_addr, src.va_addr, 64).signal(d.timeline_signal, d.next_timeline()).submit(d)
  d.synchronize()
  d.free_gpu(buf)
  AMDCopyQueue().copy(buf.va_addr, src.va_addr, 64).signal(d.timeline_signal, d.next_timeline()).submit(d)
  with pytest.raises(RuntimeError, match=f"faulted: SDMA queue .*PageFault: GPU page fault: access of 64 byte.* at {buf.va_addr:#x}"): d.synchronize()


def test_register_of_a_block_that_is_not_up():
  gpu = MockPlatform(1, 256 << 20).devices[0]
  with pytest.raises(MockGPUError, match="GC register SDMA0_F32_CNTL written before the PSP loaded the SDMA firmware"):
    gpu.write32(gpu.addr("GC", "SDMA0_F32_CNTL"), 0)
  with pytest.raises(MockGPUError, match="GC register CP_MEC_RS64_CNTL written before the MEC firmware was loaded"):
    gpu.write32(gpu.addr("GC", "CP_MEC_RS64_CNTL"), 0)
  with pytest.raises(MockGPUError, match="GC register SH_MEM_CONFIG written before the RLC autoload"):
    gpu.write32(gpu.addr("GC", "SH_MEM_CONFIG"), 0)
  with pytest.raises(MockGPUError, match="no register of GC/MMHUB/NBIO/MP0/MP1 there"): gpu.read32(7)
  assert gpu.fault.startswith("GC register SDMA0_F32_CNTL written before")


def test_doorbell_no_queue_owns():
  plat, d = fresh()
  with pytest.raises(MockGPUError, match=r"doorbell write at BAR2 offset 0x808 \(dword 514\): no queue has this doorbell"):
    d.pci.write_doorbell(d.pci.doorbells.addr + 0x808, 1)
  with pytest.raises(RuntimeError, match="faulted: doorbell write at BAR2 offset 0x808"): d.synchronize()


def test_missing_firmware_is_clear_and_touches_nothing(tmp_path: Path):
  plat = MockPlatform(1, 256 << 20, firmware_dir=str(tmp_path))
  with pytest.raises(FirmwareError, match=f"firmware {tmp_path}/psp_13_0_0_sos.bin not found: install the GPU firmware"):
    AMDPCIDevice(D, plat)
  assert not written(plat.devices[0]) and not plat.devices[0].opened  # closed again
  with pytest.raises(FirmwareError, match="firmware folder /nonexistent not found"): Firmware.load(VERSIONS, "/nonexistent")


def test_bad_firmware_fails_at_psp_then_the_next_open_resets(tmp_path: Path):
  write_synthetic(str(tmp_path))
  mec = tmp_path / "gc_11_0_0_mec.bin"
  blob = bytearray(mec.read_bytes())
  blob[-1] ^= 1  # the MEC stack image's last byte: its CRC (the "signature") no longer holds
  mec.write_bytes(bytes(blob))
  plat = MockPlatform(1, 256 << 20, firmware_dir=str(tmp_path))
  with pytest.raises(BringUpError) as ei: AMDPCIDevice(D, plat)
  msg = str(ei.value)
  assert "bring-up failed at PSP: PSPError: the PSP failed command GFX_CMD_ID_LOAD_IP_FW with status 0xffff000a" in msg
  assert "The GPU is left as it is: the next open resets it (SMU mode-1 reset)" in msg
  gpu = plat.devices[0]
  assert "LOAD_IP_FW: firmware type 94: the image is not that firmware (image CRC mismatch" in gpu.psp.log[-1]
  assert gpu.psp.alive() and gpu.smu.running() and not gpu.opened
  write_synthetic(str(tmp_path))
  d = AMDPCIDevice(D, plat)  # the sOS and SMU run: the driver resets the GPU (mode 1) before bringing it up again
  assert gpu.power_cycles == 2 and gpu.rlc_up and not gpu.psp.log and works(d)


def test_psp_refuses_autoload_without_every_firmware(monkeypatch):
  real = Firmware.load
  def without_sdma(*a, **kw):
    fw = real(*a, **kw)
    fw.ips = [(t, b) for t, b in fw.ips if psp_gfx_if.GFX_FW_TYPE_SDMA_UCODE_TH0 not in t]
    return fw
  monkeypatch.setattr(Firmware, "load", without_sdma)
  plat = MockPlatform(1, 256 << 20)
  with pytest.raises(BringUpError, match="bring-up failed at PSP: PSPError: the PSP failed command GFX_CMD_ID_AUTOLOAD_RLC"):
    AMDPCIDevice(D, plat)
  assert "autoload without firmware types ['GFX_FW_TYPE_SDMA_UCODE_TH0']" in plat.devices[0].psp.log[-1]


def test_reopen_resets_a_running_gpu():
  plat, d = fresh()
  d.pci.close()
  d2 = AMDPCIDevice(D, plat)
  gpu = plat.devices[0]
  assert gpu.power_cycles == 2 and gpu.rlc_up and len(gpu.queues) == 2 and d2.adev.psp.sos_alive() and works(d2)


def test_unsupported_ip_version():
  ips = [(h, i, (10, 3, 0) if h == H.GC_HWID else v, b) for h, i, v, b in NAVI31]
  with pytest.raises(UnsupportedGPU, match=r"GC 10.3.0 is not supported by the PCI driver \(it knows GC 11.0.0: Navi 31 / gfx1100\); use DEV=AMD"):
    AMDPCIDevice(D, MockPlatform(1, 256 << 20, ips=ips))


def test_device_selection_errors():
  with pytest.raises(ValueError, match="there are 2 usable AMD GPU"): AMDPCIDevice(f"{D}:5")
  with pytest.raises(ValueError, match="the PCI driver serves PCI, MOCK\\+PCI, not MOCK"): AMDPCIDevice("MOCK+AMD")
  plat = MockPlatform(1, 256 << 20)
  with pytest.raises(ValueError, match="is gfx1100, not gfx942"): AMDPCIDevice(f"{D}:0::gfx942", plat)


def hex_literals(path: Path) -> list[str]:
  return [f"{path.name}:{t.start[0]}: {t.string}" for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
          if t.type == tokenize.NUMBER and t.string.lower().startswith("0x")]


def test_driver_has_no_hex_offsets():
  """Registers, fields, PTE bits, doorbells and protocol constants come from the generated bindings: the driver's code
  holds no hex literal at all (comments may quote the kernel)."""
  files = sorted(AM.glob("*.py"))
  assert len(files) >= 12 and not [h for f in files for h in hex_literals(f)]
  assert hex_literals(AM.parent / "kfd.py")  # the check does find hex literals where there are some


@settings(max_examples=max(FUZZ // 4, 20), deadline=None, derandomize=FUZZ <= 200, database=None)
@given(st.sampled_from(["psp_13_0_0_sos.bin", "smu_13_0_0.bin", "sdma_6_0_0.bin", "gc_11_0_0_mec.bin", "gc_11_0_0_imu.bin", "gc_11_0_0_rlc.bin"]),
       st.integers(0, 200), st.binary(min_size=1, max_size=8), st.booleans())
def test_fuzz_firmware_containers(name: str, pos: int, data: bytes, truncate: bool):
  """A firmware file with bytes overwritten in its headers, or truncated, loads or is a FirmwareError naming the file."""
  import tempfile
  with tempfile.TemporaryDirectory() as d:
    write_synthetic(d)
    p = Path(d) / name
    blob = bytearray(p.read_bytes())
    blob[pos:pos + len(data)] = data
    p.write_bytes(bytes(blob[:pos]) if truncate else bytes(blob[:len(p.read_bytes())]))
    try: fw = Firmware.load(VERSIONS, d)
    except FirmwareError as e:
      assert name in str(e) or "firmware" in str(e)
      return
    assert all(isinstance(b, bytes) and b for _, b in fw.ips) and fw.sos and fw.smu[1]
