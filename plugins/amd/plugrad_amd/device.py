"""AMD runtime on /dev/kfd, built on core's HCQ layer (plugrad.runtime.hcq).

- GPUs come from the KFD topology in sysfs (`AMD:1` is the second GPU node; `AMD::gfx942` the first gfx942 one).
- Memory: KFD allocations (VRAM, GTT, or host memory as USERPTR) at virtual addresses we reserve with mmap, mapped
  to the GPU with MAP_MEMORY_TO_GPU and, when the CPU needs them, mmapped through the render node.
- Compute queue: a PM4 ring (KFD_IOC_QUEUE_TYPE_COMPUTE), not AQL. PM4 gives the queue itself everything HCQ needs:
  RELEASE_MEM writes a signal's 64-bit value and the GPU timestamp after all prior work, WAIT_REG_MEM stalls on a
  signal reaching a value (HCQ signals only grow; AQL barrier packets wait for a decrementing signal to reach 0),
  ACQUIRE_MEM invalidates caches, and a dispatch is SET_SH_REG writes of the kernel descriptor's registers plus
  DISPATCH_DIRECT. Values patched at submit are dword positions in the encoded packets.
- Copy queue: an SDMA ring with COPY_LINEAR, FENCE (signal values), TIMESTAMP and POLL_REGMEM (waits).
- Signals: 16 bytes in uncached GTT (value, timestamp), polled by the host; timestamps tick at 100 MHz.
The OS layer (open/ioctl/mmap/sysfs/doorbells) is `plugrad_amd.kfd.OSInterface`; `DEV=MOCK+AMD` swaps in the
in-process mock KFD (plugrad_amd.mock), which is imported only then.
PM4 encodings follow nvd.h (gfx10-gfx12); gfx9 (CDNA) GPUs are refused by this runtime for now (they compile).
"""
from __future__ import annotations

import ctypes
import importlib
import struct
import warnings
from typing import Any

from plugrad.device import BufferOptions, parse_device
from plugrad.helpers import getenv
from plugrad.viz import capture
from plugrad.runtime.hcq import Command, HCQAllocator, HCQArgsState, HCQBuffer, HCQCompiled, HCQProgram, HWQueue, Signal, Var
from plugrad_amd import GC_SEGMENTS, TOPOLOGY, gfx_arch, read_properties
from plugrad_amd.autogen import amd_hsa, amdhsa_kd, kfd, pm4_nv, sdma_gfx11
from plugrad_amd.compiler import AMDGPUCompiler, elf_symbols, unpack
from plugrad_amd.kfd import MAP_ANONYMOUS, MAP_FIXED, MAP_NORESERVE, MAP_PRIVATE, MAP_SHARED, PROT_NONE, PROT_READ, PROT_WRITE, OSInterface
from plugrad_amd.renderer import ARCHS, AMDGPURenderer
from plugrad_amd.thread_trace import Tracer, TraceSettings

TIMESTAMP_HZ = 100_000_000
PAGE = 0x1000
RING_SIZE = 1 << 16
SDMA_MAX_COPY = 1 << 22


def gc_regs(arch: str) -> Any:
  """The generated GC register module of `arch` (offsets relative to segment 0)."""
  return importlib.import_module("plugrad_amd.autogen." + ("gc_12_0_0" if arch.startswith("gfx12") else "gc_11_0_0"))


def sh_reg(regs: Any, name: str, family: str) -> int:
  """SET_SH_REG offset of register `name` (its absolute dword address minus the SH window start)."""
  return GC_SEGMENTS[family][0] + getattr(regs, f"reg{name}") - pm4_nv.PACKET3_SET_SH_REG_START


def sdma_field(pkt: str, dw: str, field: str, v: int) -> int:
  """Value `v` placed into field `field` of dword `dw` of SDMA packet `pkt` (from the generated sdma_v6 bindings)."""
  mask, shift = getattr(sdma_gfx11, f"SDMA_PKT_{pkt}_{dw}_{field}_mask"), getattr(sdma_gfx11, f"SDMA_PKT_{pkt}_{dw}_{field}_shift")
  return (v & mask) << shift


# ---------------------------------------------------------------------------- signals

class AMDSignal(Signal):
  ticks_per_second = TIMESTAMP_HZ

  def __init__(self, dev: AMDDevice | None = None, value: int = 0) -> None:
    assert dev is not None
    self.addr = dev.signal_slot()
    self._mem = (ctypes.c_uint64 * 2).from_address(self.addr)
    self._mem[1] = 0
    super().__init__(dev, value)

  @property
  def value_addr(self) -> int: return self.addr
  @property
  def timestamp_addr(self) -> int: return self.addr + 8
  def _read_value(self) -> int: return self._mem[0]
  def _write_value(self, v: int) -> None: self._mem[0] = v
  def _read_timestamp(self) -> int: return self._mem[1]


# ---------------------------------------------------------------------------- queues

class Encoded:
  """Packet dwords plus the places Vars go: (dword index, Var, part) with part "lo"/"hi" of 64 bits or "u32"."""
  def __init__(self) -> None:
    self.words: list[int] = []
    self.patches: list[tuple[int, Var, str]] = []

  def put(self, *ws: int) -> None: self.words += [w & 0xFFFFFFFF for w in ws]

  def value(self, v: int | Var, part: str = "u32", transform: Any = None) -> int:
    """A placeholder for `v` at the next dword (0 when it is a Var: patched at submit)."""
    if isinstance(v, Var):
      self.patches.append((len(self.words), v, part))
      return 0
    return (v >> 32) if part == "hi" else v

  def patched(self, var_vals: dict[str, int]) -> list[int]:
    out = list(self.words)
    for i, v, part in self.patches:
      x = v.resolve(var_vals)
      out[i] = (x >> 32) & 0xFFFFFFFF if part == "hi" else x & 0xFFFFFFFF if part == "lo" else (x - (1 if part == "m1" else 0)) & 0xFFFFFFFF
    return out


class AMDComputeQueue(HWQueue):
  """PM4 packets on the device's compute ring."""
  def _encode(self, cmds: list[Command]) -> Encoded:
    e = Encoded()
    for c in cmds: getattr(self, f"_pm4_{c.op}")(e, *c.args)
    return e

  @staticmethod
  def pkt3(e: Encoded, op: int, *body: int) -> None: e.put(pm4_nv.PACKET3(op, len(body) - 1), *body)

  def _release_mem(self, e: Encoded, addr: int, value: int | Var, data_sel: int) -> None:
    ev = pm4_nv.PACKET3_RELEASE_MEM_EVENT_TYPE(0x14) | pm4_nv.PACKET3_RELEASE_MEM_EVENT_INDEX(5)  # CACHE_FLUSH_AND_INV_TS_EVENT, EOP
    gcr = pm4_nv.PACKET3_RELEASE_MEM_GCR_GLM_WB | pm4_nv.PACKET3_RELEASE_MEM_GCR_GLM_INV | pm4_nv.PACKET3_RELEASE_MEM_GCR_GL2_WB | \
      pm4_nv.PACKET3_RELEASE_MEM_GCR_GLV_INV | pm4_nv.PACKET3_RELEASE_MEM_GCR_GL1_INV | pm4_nv.PACKET3_RELEASE_MEM_GCR_SEQ
    sel = pm4_nv.PACKET3_RELEASE_MEM_DATA_SEL(data_sel) | pm4_nv.PACKET3_RELEASE_MEM_INT_SEL(0) | pm4_nv.PACKET3_RELEASE_MEM_DST_SEL(0)
    e.put(pm4_nv.PACKET3(pm4_nv.PACKET3_RELEASE_MEM, 6), ev | gcr, sel, addr & 0xFFFFFFFF, addr >> 32)
    e.put(e.value(value, "lo") if isinstance(value, Var) else value & 0xFFFFFFFF)
    e.put(e.value(value, "hi") if isinstance(value, Var) else value >> 32, 0)

  def _pm4_signal(self, e: Encoded, sig: AMDSignal, value: int | Var) -> None:
    self._release_mem(e, sig.timestamp_addr, 0, 3)  # 3: the 64-bit GPU clock
    self._release_mem(e, sig.value_addr, value, 2)  # 2: 64-bit data

  def _pm4_timestamp(self, e: Encoded, sig: AMDSignal) -> None: self._release_mem(e, sig.timestamp_addr, 0, 3)

  def _pm4_wait(self, e: Encoded, sig: AMDSignal, value: int | Var) -> None:
    ctl = pm4_nv.WAIT_REG_MEM_MEM_SPACE(1) | pm4_nv.WAIT_REG_MEM_OPERATION(0) | pm4_nv.WAIT_REG_MEM_FUNCTION(5) | pm4_nv.WAIT_REG_MEM_ENGINE(0)
    e.put(pm4_nv.PACKET3(pm4_nv.PACKET3_WAIT_REG_MEM, 5), ctl, sig.value_addr & 0xFFFFFFFF, sig.value_addr >> 32)
    e.put(e.value(value, "lo") if isinstance(value, Var) else value & 0xFFFFFFFF, 0xFFFFFFFF, 0x4)

  def _pm4_memory_barrier(self, e: Encoded) -> None:
    a = pm4_nv
    gcr = a.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLI_INV(1) | a.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLK_INV(1) | a.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLM_INV(1) | \
      a.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLM_WB(1) | a.PACKET3_ACQUIRE_MEM_GCR_CNTL_GL1_INV(1) | a.PACKET3_ACQUIRE_MEM_GCR_CNTL_GLV_INV(1) | \
      a.PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_INV(1) | a.PACKET3_ACQUIRE_MEM_GCR_CNTL_GL2_WB(1)
    e.put(a.PACKET3(a.PACKET3_ACQUIRE_MEM, 6), 0, 0xFFFFFFFF, 0xFFFFFF, 0, 0, 0x0A, gcr)

  def _pm4_exec(self, e: Encoded, prg: AMDProgram, st: AMDArgsState, gsz: tuple, lsz: tuple) -> None:
    dev, regs, fam = prg.dev, prg.dev.regs, prg.dev.family
    gsz, lsz = (tuple(gsz) + (1, 1))[:3], (tuple(lsz) + (1, 1))[:3]
    if any(isinstance(x, Var) for x in lsz): raise ValueError(f"{prg.name}: workgroup size must be known when the queue is recorded")
    def set_sh(name: str, *vals: int) -> None: e.put(pm4_nv.PACKET3(pm4_nv.PACKET3_SET_SH_REG, len(vals)), sh_reg(regs, name, fam), *vals)
    set_sh("COMPUTE_PGM_LO", prg.entry >> 8, prg.entry >> 40)
    set_sh("COMPUTE_PGM_RSRC1", prg.rsrc1, prg.rsrc2)
    set_sh("COMPUTE_PGM_RSRC3", prg.rsrc3)
    set_sh("COMPUTE_TMPRING_SIZE", 0)
    set_sh("COMPUTE_RESOURCE_LIMITS", 0)
    set_sh("COMPUTE_START_X", 0, 0, 0)
    set_sh("COMPUTE_NUM_THREAD_X", *lsz)
    set_sh("COMPUTE_USER_DATA_0", st.kernarg & 0xFFFFFFFF, st.kernarg >> 32)
    initiator = 1 | (1 << 2) | ((1 << 15) if dev.wave == 32 else 0)  # COMPUTE_SHADER_EN, FORCE_START_AT_000, CS_W32_EN
    e.put(pm4_nv.PACKET3(pm4_nv.PACKET3_DISPATCH_DIRECT, 3))
    for g in gsz: e.put(e.value(g) if isinstance(g, Var) else g)
    e.put(initiator)

  def _pm4_copy(self, e: Encoded, *args: Any) -> None: raise NotImplementedError("copies go on the SDMA queue (AMDDevice.hw_copy_queue_t)")

  def raw(self, words: list[int]) -> AMDComputeQueue:
    """Already-encoded PM4 packets (the thread-trace programming of plugrad_amd.thread_trace)."""
    return self._add("raw", tuple(words))  # type: ignore[return-value]

  def _pm4_raw(self, e: Encoded, words: tuple[int, ...]) -> None: e.put(*words)

  def _submit(self, dev: AMDDevice, encoded: Encoded, var_vals: dict[str, int]) -> None:  # type: ignore[override]
    dev.compute_ring.submit(encoded.patched(var_vals))


class AMDCopyQueue(HWQueue):
  """SDMA packets on the device's copy ring."""
  def _encode(self, cmds: list[Command]) -> Encoded:
    e = Encoded()
    for c in cmds: getattr(self, f"_sdma_{c.op}")(e, *c.args)
    return e

  def _fence(self, e: Encoded, addr: int, value: int | Var, part: str) -> None:
    hdr = sdma_field("FENCE", "HEADER", "op", sdma_gfx11.SDMA_OP_FENCE)
    e.put(hdr, addr & 0xFFFFFFFF, addr >> 32)
    e.put(e.value(value, part) if isinstance(value, Var) else (value >> 32 if part == "hi" else value) & 0xFFFFFFFF)

  def _sdma_signal(self, e: Encoded, sig: AMDSignal, value: int | Var) -> None:
    self._sdma_timestamp(e, sig)
    self._fence(e, sig.value_addr + 4, value, "hi")
    self._fence(e, sig.value_addr, value, "lo")

  def _sdma_timestamp(self, e: Encoded, sig: AMDSignal) -> None:
    e.put(sdma_field("TIMESTAMP_GET_GLOBAL", "HEADER", "op", sdma_gfx11.SDMA_OP_TIMESTAMP) |
          sdma_field("TIMESTAMP_GET_GLOBAL", "HEADER", "sub_op", sdma_gfx11.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL),
          sig.timestamp_addr & 0xFFFFFFFF, sig.timestamp_addr >> 32)

  def _sdma_wait(self, e: Encoded, sig: AMDSignal, value: int | Var) -> None:
    hdr = sdma_field("POLL_REGMEM", "HEADER", "op", sdma_gfx11.SDMA_OP_POLL_REGMEM) | sdma_field("POLL_REGMEM", "HEADER", "mem_poll", 1) | \
      sdma_field("POLL_REGMEM", "HEADER", "func", 5)
    e.put(hdr, sig.value_addr & 0xFFFFFFFF, sig.value_addr >> 32)
    e.put(e.value(value, "lo") if isinstance(value, Var) else value & 0xFFFFFFFF, 0xFFFFFFFF)
    e.put(sdma_field("POLL_REGMEM", "DW5", "interval", 0x04) | sdma_field("POLL_REGMEM", "DW5", "retry_count", 0xFFF))

  def _sdma_memory_barrier(self, e: Encoded) -> None: pass  # SDMA writes go to memory in order

  def _sdma_copy(self, e: Encoded, dest: int | Var, src: int | Var, nbytes: int | Var) -> None:
    if isinstance(nbytes, Var) or isinstance(dest, Var) or isinstance(src, Var):
      if not isinstance(nbytes, Var) and nbytes > SDMA_MAX_COPY: raise ValueError("a copy with patched addresses must fit one SDMA packet")
      chunks = [(0, nbytes)]
    else: chunks = [(off, min(SDMA_MAX_COPY, nbytes - off)) for off in range(0, nbytes, SDMA_MAX_COPY)]
    for off, n in chunks:
      e.put(sdma_field("COPY_LINEAR", "HEADER", "op", sdma_gfx11.SDMA_OP_COPY) |
            sdma_field("COPY_LINEAR", "HEADER", "sub_op", sdma_gfx11.SDMA_SUBOP_COPY_LINEAR))
      e.put(e.value(n, "m1") if isinstance(n, Var) else n - 1, 0)
      for a in (src, dest):
        if isinstance(a, Var):
          e.put(e.value(a + off, "lo"))
          e.put(e.value(a + off, "hi"))
        else: e.put((a + off) & 0xFFFFFFFF, (a + off) >> 32)

  def _sdma_exec(self, e: Encoded, *args: Any) -> None: raise NotImplementedError("kernels go on the compute queue")

  def _submit(self, dev: AMDDevice, encoded: Encoded, var_vals: dict[str, int]) -> None:  # type: ignore[override]
    dev.sdma_ring.submit(encoded.patched(var_vals))


class Ring:
  """A KFD user-mode queue: ring buffer, read/write pointers in host memory, doorbell. `wptr_unit` is 4 (PM4 counts
  dwords) or 1 (SDMA counts bytes)."""
  def __init__(self, dev: AMDDevice, queue_type: int, wptr_unit: int) -> None:
    self.dev, self.unit = dev, wptr_unit
    self.ring = dev.alloc_gpu(RING_SIZE, "gtt", uncached=True)
    self.ptrs = dev.alloc_gpu(PAGE, "gtt", uncached=True)
    self.rptr_addr, self.wptr_addr = self.ptrs.va_addr, self.ptrs.va_addr + 8
    ctypes.memset(self.ptrs.va_addr, 0, 16)
    extra: dict[str, int] = {}
    if queue_type == kfd.KFD_IOC_QUEUE_TYPE_COMPUTE:
      self.eop = dev.alloc_gpu(PAGE, "vram")
      extra = {"eop_buffer_address": self.eop.va_addr, "eop_buffer_size": PAGE}
      if (cwsr := dev.props.get("cwsr_size", 0)):
        self.cwsr = dev.alloc_gpu(cwsr, "gtt")
        extra.update(ctx_save_restore_address=self.cwsr.va_addr, ctx_save_restore_size=cwsr, ctl_stack_size=dev.props.get("ctl_stack_size", 0))
    q = dev.os.ioctl(dev.kfd_fd, "CREATE_QUEUE", ring_base_address=self.ring.va_addr, ring_size=RING_SIZE, gpu_id=dev.gpu_id,
                     queue_type=queue_type, queue_percentage=100, queue_priority=7, write_pointer_address=self.wptr_addr,
                     read_pointer_address=self.rptr_addr, **extra)
    self.queue_id = q.queue_id
    page = q.doorbell_offset & ~(0x2000 - 1)
    self.doorbell = dev.os.mmap(0, 0x2000, PROT_READ | PROT_WRITE, MAP_SHARED, dev.kfd_fd, page) + (q.doorbell_offset - page)
    self.wptr = 0  # bytes written so far (monotonic)

  def submit(self, words: list[int]) -> None:
    data = struct.pack(f"<{len(words)}I", *words)
    if len(data) > RING_SIZE - 64: raise ValueError(f"submission of {len(data)} bytes exceeds the {RING_SIZE}-byte ring")
    rptr = ctypes.c_uint64.from_address(self.rptr_addr)
    while self.wptr + len(data) - rptr.value * self.unit > RING_SIZE:  # wait for the GPU to consume old packets
      self.dev.check_fault()
    for i in range(0, len(data), 4):
      ctypes.c_uint32.from_address(self.ring.va_addr + (self.wptr + i) % RING_SIZE).value = words[i // 4]
    self.wptr += len(data)
    ctypes.c_uint64.from_address(self.wptr_addr).value = self.wptr // self.unit
    self.dev.os.ring_doorbell(self.doorbell, self.wptr // self.unit)


# ---------------------------------------------------------------------------- memory and programs

class AMDAllocator(HCQAllocator):
  dev: AMDDevice

  def _alloc(self, size: int, options: BufferOptions) -> HCQBuffer:
    if options.external_ptr is not None: return HCQBuffer(options.external_ptr, size, meta=None)
    kind = "gtt" if options.host else "vram"
    return self.dev.alloc_gpu(max(size, 1), kind, cpu_access=options.cpu_access, uncached=options.uncached)

  def _free(self, opaque: HCQBuffer, size: int, options: BufferOptions) -> None:
    if opaque.meta is None: return
    self.dev.synchronize()
    self.dev.free_gpu(opaque)

  def _transfer(self, dest: HCQBuffer, src: HCQBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
    """The source GPU's SDMA writes the destination buffer, so that buffer and both timelines' signal pages are mapped
    into both GPUs first (once per buffer / device pair). GPUs behind different interfaces copy through the host."""
    if type(src_dev) is not type(dest_dev): return host_transfer(dest, src, nbytes, src_dev, dest_dev)
    if dest_dev.gpu_id not in src_dev.mapped_peers:
      for a, b in ((src_dev, dest_dev), (dest_dev, src_dev)):
        for page in a.signal_pages: b.map_into(page)
      src_dev.mapped_peers.add(dest_dev.gpu_id)
    src_dev.map_into(dest)
    super()._transfer(dest, src, nbytes, src_dev, dest_dev)


def host_transfer(dest: HCQBuffer, src: HCQBuffer, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
  """Device-to-device copy through host memory (each side's own staging copies)."""
  tmp = memoryview(bytearray(nbytes))
  src_dev.allocator._copyout(tmp, src)
  dest_dev.allocator._copyin(dest, tmp)


class AMDArgsState(HCQArgsState):
  """Kernel arguments written into the device's kernarg ring: buffer addresses (8 bytes) then int32 variables."""
  def __init__(self, prg: AMDProgram, bufs: tuple[HCQBuffer, ...], vals: tuple[int, ...]) -> None:
    super().__init__(prg, bufs, vals)
    blob = struct.pack(f"<{len(bufs)}Q{len(vals)}i", *[b.va_addr for b in bufs], *vals)
    self.kernarg = prg.dev.kernarg_slot(max(len(blob), prg.kernarg_size, 8))
    ctypes.memmove(self.kernarg, blob, len(blob))


class AMDProgram(HCQProgram):
  """A code object loaded into GPU memory: `prg(*bufs, global_size=workgroups, local_size=work-items per workgroup,
  vals=..., wait=...)`. Both sizes are required (the engine takes them from `ProgramSpec.launch_dims`): the code object
  doesn't know its launch, and a guessed workgroup size would run the kernel with the wrong ids."""
  dev: AMDDevice

  def __init__(self, dev: AMDDevice, name: str, lib: bytes) -> None:
    super().__init__(dev, name, lib)
    self.meta, elf = unpack(lib)
    if self.meta.get("arch") != dev.arch: raise ValueError(f"{name} was compiled for {self.meta.get('arch')}, the device is {dev.arch}")
    syms = elf_symbols(elf)
    if f"{name}.kd" not in syms: raise ValueError(f"code object has no kernel descriptor {name}.kd (symbols: {sorted(syms)})")
    image = load_image(elf)
    self.image = dev.alloc_gpu(len(image), "vram", cpu_access=True)
    ctypes.memmove(self.image.va_addr, image, len(image))
    self.kd_addr = self.image.va_addr + syms[f"{name}.kd"][0]
    kd = amdhsa_kd.struct_kernel_descriptor_t.from_buffer_copy(image, syms[f"{name}.kd"][0])
    self.entry = self.kd_addr + kd.kernel_code_entry_byte_offset
    self.rsrc1, self.rsrc2, self.rsrc3 = kd.compute_pgm_rsrc1, kd.compute_pgm_rsrc2, kd.compute_pgm_rsrc3
    self.kernarg_size, self.lds, self.scratch = kd.kernarg_size, kd.group_segment_fixed_size, kd.private_segment_fixed_size
    props = kd.kernel_code_properties
    if props & ~(amd_hsa.AMD_KERNEL_CODE_PROPERTIES_ENABLE_SGPR_KERNARG_SEGMENT_PTR | (0xFFFF << 10)):
      raise NotImplementedError(f"{name}: kernel needs user SGPRs other than the kernarg pointer (properties {props:#x})")
    if self.scratch: raise NotImplementedError(f"{name}: kernel uses {self.scratch} bytes of scratch per work-item; scratch is not set up")
    if self.lds > dev.renderer.caps.shared_max: raise ValueError(f"{name}: {self.lds} bytes of LDS exceed {dev.renderer.caps.shared_max}")

  def fill_kernargs(self, bufs: tuple[HCQBuffer, ...], vals: tuple[int, ...]) -> AMDArgsState:
    if any(not isinstance(b, HCQBuffer) for b in bufs):
      raise TypeError(f"{self.name}: AMD kernels take AMD buffers, got {[type(b).__name__ for b in bufs]}")
    return AMDArgsState(self, bufs, vals)

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] | None = None, local_size: tuple[int, ...] | None = None,  # type: ignore[override]
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    if global_size is None or local_size is None:
      missing = " and ".join(n for n, v in (("global_size", global_size), ("local_size", local_size)) if v is None)
      raise ValueError(f"{self.name}: an AMD kernel launch needs global_size (workgroups) and local_size (work-items per workgroup); "
                       f"{missing} not given (a rendered kernel's sizes are ProgramSpec.launch_dims(var_vals))")
    if (tracer := self.dev.tracer) is not None and (capture.PROFILE or capture.VIZ):
      return tracer.launch(self, lambda: super(AMDProgram, self).__call__(*bufs, global_size=global_size, local_size=local_size,
                                                                          vals=tuple(vals), wait=True))
    return super().__call__(*bufs, global_size=global_size, local_size=local_size, vals=tuple(vals), wait=wait)

  def disassembly(self) -> str:
    """llvm-objdump's disassembly of this code object."""
    return AMDGPUCompiler(self.dev.arch).disassemble(self.lib)


def load_image(elf: bytes) -> bytes:
  """The code object's PT_LOAD segments laid out at their virtual addresses (relative to a load base of 0)."""
  phoff, phentsize, phnum = struct.unpack_from("<Q", elf, 0x20)[0], *struct.unpack_from("<HH", elf, 0x36)
  segs = [struct.unpack_from("<IIQQQQQQ", elf, phoff + i * phentsize) for i in range(phnum)]
  loads = [s for s in segs if s[0] == 1]
  size = max(s[3] + s[6] for s in loads)
  img = bytearray(size)
  for s in loads: img[s[3]:s[3] + s[5]] = elf[s[2]:s[2] + s[5]]
  return bytes(img)


class AMDBatch:
  """TinyJit replay of a stretch of kernels as one compute-queue submission: every launch is recorded once with its
  kernel arguments, and each replay rewrites the argument slots of the JIT's input buffers and submits the queue with
  the new variable values. Patched at submit: the timeline value, and each symbolic workgroup count (a Var in the
  DISPATCH_DIRECT packet, recomputed from the item's `ProgramSpec.launch_dims` with the replay's variable values)."""
  def __init__(self, dev: AMDDevice, items: list) -> None:
    self.dev, self.items, self.last = dev, items, 0
    self.states: list[AMDArgsState] = []
    self.symbolic: list[tuple[int, int, str]] = []  # (item, dim, queue Var name) of each workgroup count that depends on variables
    q = AMDComputeQueue().wait(dev.timeline_signal, Var("timeline") - 1).memory_barrier()
    for i, ei in enumerate(items):
      prg: AMDProgram = ei.runner.prg
      spec = ei.runner.spec
      vals = tuple(ei.var_vals.get(v.arg[0], 0) for v in spec.vars)
      st = prg.fill_kernargs(tuple(b._buf for b in ei.bufs), vals)
      self.states.append(st)
      lsz = spec.local_size
      gsz: list[int | Var] = [1, 1, 1]
      for d, g in enumerate(spec.global_size):
        if isinstance(g, int): gsz[d] = g
        else:
          self.symbolic.append((i, d, f"grid.{i}.{d}"))  # not an identifier: can't meet a user Variable's name
          gsz[d] = Var(f"grid.{i}.{d}")
      q.exec(prg, st, gsz, lsz).memory_barrier()
    self.queue = q.signal(dev.timeline_signal, Var("timeline"))
    self.var_names = sorted({v.arg[0] for ei in items for v in ei.runner.spec.vars})

  def grid_values(self, var_vals: dict[str, int]) -> dict[str, int]:
    """The symbolic workgroup counts of this replay (each launch must have at least one workgroup)."""
    out: dict[str, int] = {}
    dims: dict[int, tuple[int, ...]] = {}
    for i, d, name in self.symbolic:
      if i not in dims: dims[i] = self.items[i].runner.spec.launch_dims(var_vals)[0]
      if (n := dims[i][d]) < 1:
        raise ValueError(f"{self.items[i].runner.spec.name}: {n} workgroups in dim {d} with {var_vals} (a launch needs at least one)")
      out[name] = n
    return out

  def __call__(self, var_vals: dict[str, int], slots: list[tuple[int, int]] = ()) -> None:
    grid = self.grid_values(var_vals)  # before anything is written: a bad size leaves the device untouched
    if self.last: self.dev.timeline_signal.wait(self.last, self.dev.timeout_ms)  # the previous replay still reads these kernargs
    for i, ei in enumerate(self.items):
      names = [v.arg[0] for v in ei.runner.spec.vars]
      bufs = [b._buf.va_addr for b in ei.bufs]
      vals = [var_vals[n] for n in names]
      blob = struct.pack(f"<{len(bufs)}Q{len(vals)}i", *bufs, *vals)
      ctypes.memmove(self.states[i].kernarg, blob, len(blob))
    self.last = self.dev.next_timeline()
    self.queue.submit(self.dev, {"timeline": self.last, **grid})


class AMDDevice(HCQCompiled):
  """An AMD GPU through /dev/kfd (`AMD`, `AMD:1`, `AMD::gfx942`), or the mock KFD (`MOCK+AMD`)."""
  def __init__(self, device: str, os_iface: Any = None) -> None:
    """`os_iface` replaces the OS layer (tests pass their own MockKFD); by default the interface part of `device` picks it."""
    dn = parse_device(device)
    if os_iface is not None: self.os = os_iface
    elif dn.iface == "MOCK": self.os = importlib.import_module("plugrad_amd.mock.kfd").MockKFD.instance()
    elif dn.iface in (None, "KFD"): self.os = OSInterface()
    else: raise ValueError(f"device {device}: unknown interface {dn.iface} (AMD has KFD, the default, and MOCK)")
    want_arch = dn.arch or (dn.renderer.lower() if dn.renderer and dn.renderer.lower() in ARCHS else None)
    gpus = self.topology()
    if want_arch: gpus = [g for g in gpus if gfx_arch(g["gfx_target_version"]) == want_arch]
    if not 0 <= dn.index < len(gpus):
      have = ", ".join(gfx_arch(g["gfx_target_version"]) for g in self.topology()) or "none"
      raise ValueError(f"device {device}: there are {len(gpus)} matching GPU(s) in the KFD topology (GPUs: {have})")
    self.props = gpus[dn.index]
    self.gpu_id, self.arch = self.props["gpu_id"], gfx_arch(self.props["gfx_target_version"])
    if self.arch not in ARCHS: raise ValueError(f"device {device}: {self.arch} is not a supported arch ({', '.join(ARCHS)})")
    self.family = "gfx12" if self.arch.startswith("gfx12") else "gfx11" if self.arch.startswith("gfx11") else "gfx9"
    if self.family not in GC_SEGMENTS:
      raise NotImplementedError(f"device {device}: the KFD runtime supports gfx11/gfx12 queues; {self.arch} is not done yet")
    self.wave, self.regs = ARCHS[self.arch]["wave"], gc_regs(self.arch)
    self.kfd_fd = self.os.open("/dev/kfd")
    ver = self.os.ioctl(self.kfd_fd, "GET_VERSION")
    if ver.major_version != kfd.KFD_IOCTL_MAJOR_VERSION: raise RuntimeError(f"KFD ioctl version {ver.major_version}.{ver.minor_version} is not 1.x")
    self.drm_fd = self.os.open(f"/dev/dri/renderD{self.props['drm_render_minor']}")
    self.os.ioctl(self.kfd_fd, "ACQUIRE_VM", drm_fd=self.drm_fd, gpu_id=self.gpu_id)
    self.init_runtime(device)

  def init_runtime(self, device: str, allocator: type[AMDAllocator] | None = None) -> None:
    """What every interface shares once memory can be allocated and queues made (`make_rings`): signals, kernargs,
    rings, renderer, compiler and the HCQ base."""
    self.mapped_peers: set[int] = set()
    self._sig_page: HCQBuffer | None = None
    self.signal_pages: list[HCQBuffer] = []
    self._sig_next = 0
    self._kernargs = self.alloc_gpu(1 << 20, "gtt")
    self._kernarg_next = 0
    self.compute_ring, self.sdma_ring = self.make_rings()
    self.tracer = self.make_tracer() if getenv("SQTT", 0) else None
    renderer = type("AMDGPURenderer", (AMDGPURenderer,), {"default_arch": self.arch})
    super().__init__(device, allocator or AMDAllocator, [renderer], lambda r: AMDGPUCompiler(r.arch), AMDProgram, AMDSignal, AMDComputeQueue,
                     AMDCopyQueue, timeout_ms=getenv("AMD_TIMEOUT_MS", 30000))

  def make_tracer(self) -> Tracer:
    """SQTT=1: the thread tracer (SQTT_SIMD_SEL / SQTT_WGP_SEL / SQTT_SA_SEL pick the SIMD whose instructions are
    traced, SQTT_ITRACE_SE_MASK the shader engines that trace instructions, SQTT_BUFFER_SIZE the MiB per shader engine)."""
    if not (capture.PROFILE or capture.VIZ):
      warnings.warn("SQTT=1 records traces only with PROFILE=1 or VIZ=1 (neither is set)", RuntimeWarning, stacklevel=2)
    settings = TraceSettings(getenv("SQTT_SIMD_SEL", 0), getenv("SQTT_WGP_SEL", 0), getenv("SQTT_SA_SEL", 0), getenv("SQTT_ITRACE_SE_MASK", 0xFFFF))
    return Tracer(self, self.shader_engines(), self.engine_clock_hz(), settings, getenv("SQTT_BUFFER_SIZE", 16))

  def shader_engines(self) -> int:
    """How many shader engines the GPU has (KFD topology: shader arrays / arrays per engine)."""
    return max(1, self.props.get("array_count", 1) // max(1, self.props.get("simd_arrays_per_engine", 1)))

  def engine_clock_hz(self) -> float:
    """The shader clock SQTT cycles count (KFD topology's max_engine_clk_fcompute, MHz)."""
    return self.props.get("max_engine_clk_fcompute", 0) * 1e6 or 2.5e9

  def make_rings(self) -> tuple[Ring, Ring]:
    """The compute (PM4) and copy (SDMA) rings: KFD user-mode queues."""
    return Ring(self, kfd.KFD_IOC_QUEUE_TYPE_COMPUTE, 4), Ring(self, kfd.KFD_IOC_QUEUE_TYPE_SDMA, 1)

  def topology(self) -> list[dict[str, int]]:
    out = []
    for n in sorted(self.os.listdir(TOPOLOGY), key=lambda n: int(n) if n.isdigit() else 1 << 30):
      props = read_properties(self.os.read_text(f"{TOPOLOGY}/{n}/properties"))
      gpu_id = int(self.os.read_text(f"{TOPOLOGY}/{n}/gpu_id").strip() or 0)
      if props.get("gfx_target_version", 0) and gpu_id: out.append({**props, "gpu_id": gpu_id})
    return out

  # ---- memory
  def alloc_gpu(self, size: int, kind: str, cpu_access: bool = True, uncached: bool = False) -> HCQBuffer:
    """Allocate `size` bytes of "vram" or "gtt" memory mapped to this GPU (and to the CPU when `cpu_access` or GTT)."""
    f = kfd
    req = (size + PAGE - 1) // PAGE * PAGE
    flags = f.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE | f.KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE | f.KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE
    if kind == "vram": flags |= f.KFD_IOC_ALLOC_MEM_FLAGS_VRAM | (f.KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC if cpu_access else 0)
    else: flags |= f.KFD_IOC_ALLOC_MEM_FLAGS_GTT | (f.KFD_IOC_ALLOC_MEM_FLAGS_COHERENT | f.KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED if uncached else 0)
    va = self.os.mmap(0, req, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
    try: m = self.os.ioctl(self.kfd_fd, "ALLOC_MEMORY_OF_GPU", va_addr=va, size=req, gpu_id=self.gpu_id, flags=flags, mmap_offset=0)
    except OSError as e:
      self.os.munmap(va, req)
      if e.errno == 12: raise MemoryError(f"{self.device}: out of {kind.upper()} allocating {size} bytes") from None
      raise
    if kind == "gtt" or cpu_access: self.os.mmap(va, req, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self.drm_fd, m.mmap_offset)
    ids = (ctypes.c_uint32 * 1)(self.gpu_id)
    self.os.ioctl(self.kfd_fd, "MAP_MEMORY_TO_GPU", handle=m.handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1)
    view = memoryview((ctypes.c_uint8 * req).from_address(va)).cast("B")[:size] if (kind == "gtt" or cpu_access) else None
    return HCQBuffer(va, size, view, meta=(m.handle, req, [self.gpu_id]))

  def free_gpu(self, buf: HCQBuffer) -> None:
    handle, req, gpus = buf.meta
    ids = (ctypes.c_uint32 * len(gpus))(*gpus)
    self.os.ioctl(self.kfd_fd, "UNMAP_MEMORY_FROM_GPU", handle=handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=len(gpus))
    self.os.ioctl(self.kfd_fd, "FREE_MEMORY_OF_GPU", handle=handle)
    self.os.munmap(buf.va_addr, req)

  def map_into(self, buf: HCQBuffer) -> None:
    """Map `buf` (allocated by any AMD device of this process) into this GPU's address space too."""
    handle, req, gpus = buf.meta
    if self.gpu_id in gpus: return
    gpus.append(self.gpu_id)
    ids = (ctypes.c_uint32 * len(gpus))(*gpus)
    self.os.ioctl(self.kfd_fd, "MAP_MEMORY_TO_GPU", handle=handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=len(gpus))

  def signal_slot(self) -> int:
    if self._sig_page is None or self._sig_next + 16 > PAGE:
      self._sig_page, self._sig_next = self.alloc_gpu(PAGE, "gtt", uncached=True), 0
      self.signal_pages.append(self._sig_page)
    self._sig_next += 16
    return self._sig_page.va_addr + self._sig_next - 16

  def kernarg_slot(self, size: int) -> int:
    """`size` bytes of kernarg memory (a ring: slots are reused after 1 MiB; the timeline keeps earlier launches done)."""
    size = (size + 63) // 64 * 64
    if self._kernarg_next + size > self._kernargs.size:
      self.synchronize()
      self._kernarg_next = 0
    self._kernarg_next += size
    return self._kernargs.va_addr + self._kernarg_next - size

  def batch_runner(self, items: list) -> AMDBatch | None:
    if self.tracer is not None: return None  # traced launches run one by one, each between its own start and stop
    if not items or any(ei.runner is None or not isinstance(ei.runner.prg, AMDProgram) or ei.runner.prg.dev is not self or
                        ei.runner.spec.local_size is None for ei in items): return None
    return AMDBatch(self, items)

  def synchronize(self) -> None:
    super().synchronize()
    self.check_fault()  # work that signals nothing (or a malformed packet) still faults here

  def check_fault(self) -> None:
    self.os.poll()
    if (f := getattr(self.os, "fault", None)) is not None: raise RuntimeError(f"device {self.device} faulted: {f}")
