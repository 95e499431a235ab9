"""State of one RDNA3 wave32 (scalar and vector register files, EXEC/VCC/SCC, MODE) and the memory paths its
instructions use: global memory through the mock's GPUMemory (gathered per instruction with one view when all lanes
fall in one allocation, lane by lane otherwise, so a stray lane faults with its own address), the workgroup's LDS and
the wave's per-lane scratch."""
from __future__ import annotations

import numpy as np

from plugrad_amd.mock.dispatch import GPUMemory, PageFault

U8, U32, U64 = np.uint8, np.uint32, np.uint64
LANES = 32
LANE_IDS = np.arange(LANES, dtype=U32)
_ALL = (1 << LANES) - 1
_VIEW_MAX = 1 << 26  # gather through one view only when the lanes span at most 64 MiB


class EmulatorError(RuntimeError):
  """The emulated kernel did something the hardware would fault on (or the emulator cannot run)."""


_MASKS: dict[int, np.ndarray] = {}
_ACTIVE: dict[int, np.ndarray] = {}


def mask_to_lanes(x: int) -> np.ndarray:
  """Lane mask int -> read-only bool array of 32 lanes (cached: masks repeat a lot)."""
  x &= _ALL
  m = _MASKS.get(x)
  if m is None:
    if len(_MASKS) > 4096: _MASKS.clear()
    m = np.unpackbits(np.array([x], "<u4").view(U8), bitorder="little").astype(bool)
    m.flags.writeable = False
    _MASKS[x] = m
  return m


def active_lanes(x: int) -> np.ndarray:
  """Indices of the lanes set in mask x (cached, read-only)."""
  x &= _ALL
  a = _ACTIVE.get(x)
  if a is None:
    if len(_ACTIVE) > 4096: _ACTIVE.clear()
    a = np.flatnonzero(mask_to_lanes(x))
    a.flags.writeable = False
    _ACTIVE[x] = a
  return a


def lanes_to_mask(b: np.ndarray) -> int:
  return int(np.packbits(np.asarray(b, bool), bitorder="little").view("<u4")[0])


class Wave:
  """Registers of one wave. SGPRs are Python ints indexed by their operand code (106 vcc_lo, 125 m0, 126 exec_lo);
  VGPRs a (count, 32) uint32 array."""

  def __init__(self, nvgpr: int, mem: GPUMemory, lds: np.ndarray, scratch_size: int, kernel: str, wave_id: int):
    self.s = [0] * 128
    self.v = np.zeros((nvgpr, LANES), U32)
    self.dpp_tmp = np.zeros(LANES, U32)  # src0 of the DPP instruction being executed
    self.scc = 0
    self.mem, self.lds, self.kernel, self.wave_id = mem, lds, kernel, wave_id
    self.scratch = np.zeros((LANES, scratch_size), U8) if scratch_size else None
    self.ftz32 = self.ftz16 = False
    self.mode = 0
    self.pc = 0
    self.count = 0
    self.set_exec(_ALL)

  def set_exec(self, x: int) -> None:
    self.s[126], self.s[127] = x & 0xFFFFFFFF, 0
    self.em = mask_to_lanes(x)
    self.idx = active_lanes(x)
    self.full = (x & _ALL) == _ALL

  def set_mode(self, mode: int) -> None:
    """MODE register: [3:0] round modes (only round-to-nearest-even is emulated), [5:4] f32 denormals, [7:6] f16/f64."""
    if mode & 0xF: raise EmulatorError(f"{self.kernel}: rounding mode {mode & 0xF:#x} set in MODE; only round-to-nearest-even is emulated")
    self.mode = mode
    self.ftz32 = ((mode >> 4) & 3) != 3
    self.ftz16 = ((mode >> 6) & 3) != 3


def _active(addrs: np.ndarray, em: np.ndarray) -> np.ndarray:
  return np.flatnonzero(em)


def gather_global(mem: GPUMemory, addrs: np.ndarray, nbytes: int) -> np.ndarray:
  """Read `nbytes` at each 64-bit address: returns (len(addrs), nbytes) uint8."""
  if len(addrs) == 0: return np.zeros((0, nbytes), U8)
  lo, hi = int(addrs.min()), int(addrs.max()) + nbytes
  if hi - lo <= _VIEW_MAX:
    try:
      buf = np.frombuffer(mem.view(lo, hi - lo), U8)
    except PageFault:
      buf = None
    if buf is not None:
      idx = (addrs - U64(lo)).astype(np.int64)[:, None] + np.arange(nbytes)
      return buf[idx]
  return np.stack([np.frombuffer(mem.read(int(a), nbytes), U8) for a in addrs])


def scatter_global(mem: GPUMemory, addrs: np.ndarray, data: np.ndarray) -> None:
  if len(addrs) == 0: return
  nbytes = data.shape[1]
  lo, hi = int(addrs.min()), int(addrs.max()) + nbytes
  if hi - lo <= _VIEW_MAX:
    try:
      buf = np.frombuffer(mem.view(lo, hi - lo), U8)
    except PageFault:
      buf = None
    if buf is not None:
      if buf.flags.writeable:
        idx = (addrs - U64(lo)).astype(np.int64)[:, None] + np.arange(nbytes)
        buf[idx] = data
        return
  for a, row in zip(addrs, data): mem.write(int(a), row.tobytes())


def lds_index(w: Wave, addrs: np.ndarray, nbytes: int, what: str) -> np.ndarray:
  bad = addrs.astype(np.int64) + nbytes > len(w.lds)
  if np.any(bad):
    a = int(addrs[np.flatnonzero(bad)[0]])
    raise EmulatorError(f"{w.kernel}: {what} of {nbytes} bytes at LDS address {a:#x} is outside the workgroup's {len(w.lds)} bytes of LDS")
  return addrs.astype(np.int64)[:, None] + np.arange(nbytes)


def scratch_index(w: Wave, addrs: np.ndarray, nbytes: int, what: str) -> np.ndarray:
  size = 0 if w.scratch is None else w.scratch.shape[1]
  bad = (addrs.astype(np.int64) < 0) | (addrs.astype(np.int64) + nbytes > size)
  if np.any(bad):
    a = int(addrs[np.flatnonzero(bad)[0]])
    raise EmulatorError(f"{w.kernel}: {what} of {nbytes} bytes at scratch address {a:#x} is outside the {size} bytes of private memory per lane")
  return addrs.astype(np.int64)[:, None] + np.arange(nbytes)
