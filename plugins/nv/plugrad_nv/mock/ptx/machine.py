"""Executing compiled PTX: a launch's blocks run in chunks whose threads are the lanes of numpy arrays, in lockstep.

Lanes are laid out block-major (block b's threads are lanes b*T .. b*T+T-1, thread x fastest); when the kernel uses
warp-collective instructions (shfl, vote, redux, mma) each block is padded to whole warps of 32 with lanes that never
run, so a warp is 32 consecutive lanes. A function's basic blocks are scheduled by the lowest program counter among
the groups of lanes waiting to run: a group is (block index, lane mask); a divergent branch splits a group, groups that
reach the same block merge again (reconvergence), and lanes that leave a loop wait at the exit until the others do.
`bar.sync` parks lanes until every live thread of their block arrives; a thread that exits while others wait at a
barrier is an error, as is a barrier inside a called function. Memory: global (and const) addresses go to the mock
GPU's `Arena` (checked, vectorized), shared memory is one buffer per block of the chunk, local memory one per lane,
generic addresses are routed by window (plugrad_nv.mock.ptx.program.SHARED_WINDOW / LOCAL_WINDOW).

Faults become `KernelFault` naming the kernel, the thread (block and thread ids) and the PTX line.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from plugrad_nv.mock.memory import AccessFault, Arena
from plugrad_nv.mock.ptx import numerics as N
from plugrad_nv.mock.ptx import ops
from plugrad_nv.mock.ptx.program import (LOCAL_WINDOW, NP, SHARED_LIMIT, SHARED_WINDOW, WINDOW_SIZE, CFunc, Program,
                                         Symbol, Unimplemented, compile_module)

CHUNK_LANES = 16384
MAX_BLOCK_STEPS = 20_000_000
MAX_THREADS, MAX_BLOCK_DIM, MAX_GRID = 1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535)


class KernelFault(RuntimeError):
  """A kernel did what a GPU faults (or hangs) on. `kind`: illegal address, misaligned address, barrier, trap,
  timeout, invalid launch, unimplemented; the message names the kernel, the thread and the PTX line."""
  def __init__(self, kind: str, msg: str) -> None:
    super().__init__(msg)
    self.kind = kind


class LaneError(RuntimeError):
  """Raised inside an instruction about one lane (chunk-relative index); the scheduler turns it into a KernelFault."""
  def __init__(self, kind: str, lane: int, msg: str) -> None:
    super().__init__(msg)
    self.kind, self.lane = kind, lane


# ---------------------------------------------------------------------------- modules

_CACHE: OrderedDict[str, Program] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def compile_ptx(src: str) -> Program:
  """The compiled program of a PTX text, cached (parse and closure building happen once per text)."""
  with _CACHE_LOCK:
    if (p := _CACHE.get(src)) is not None:
      _CACHE.move_to_end(src)
      return p
  p = compile_module(src, ops.build)
  with _CACHE_LOCK:
    _CACHE[src] = p
    while len(_CACHE) > 512: _CACHE.popitem(last=False)
  return p


class LoadedModule:
  """A program loaded on one mock GPU: its global/const variables allocated (and initialized) in the arena."""
  def __init__(self, prog: Program, arena: Arena, device: int, arch: tuple[int, int] = (9, 0)) -> None:
    self.prog, self.arena, self.device, self.arch = prog, arena, device, arch
    self.gaddr: list[int] = []
    for sym in prog.globals:
      if sym.extern: raise Unimplemented(f"PTX line {sym.line}: extern .{sym.space} variable {sym.name} can't be resolved")
      a = arena.alloc(max(sym.size, 1), "global", device)
      arena.host_view(a, sym.size)[:] = 0
      self.gaddr.append(a)
    for sym, a in zip(prog.globals, self.gaddr):
      if sym.init: arena.host_view(a, sym.size)[:] = np.frombuffer(self._init_bytes(sym), dtype=np.uint8)
    for name, f in prog.functions.items():
      if f.kind == "entry" and (need := self.static_shared(f)) > SHARED_LIMIT:
        big = max((prog.shared[i] for i in f.shared), key=lambda s: s.size)
        raise KernelFault("invalid launch", f"kernel {name}: {need} bytes of static shared memory, more than the {SHARED_LIMIT} "
                          f"a block may use on sm_{arch[0]}{arch[1]} (largest: {big.name}[{big.size}] at PTX line {big.line})")

  def _init_bytes(self, sym: Symbol) -> bytes:
    dt = NP[sym.ptype] if sym.ptype in NP else np.dtype(np.uint8)
    vals = []
    for v in sym.init:
      if isinstance(v, ops.P.Sym):
        k = next((i for i, g in enumerate(self.prog.globals) if g.name == v.name), None)
        if k is None: raise Unimplemented(f"PTX line {sym.line}: initializer names {v.name}, which is not a global variable")
        vals.append(self.gaddr[k])
      else: vals.append(ops.imm_value(v, sym.ptype if sym.ptype in NP else "b8"))
    raw = np.array(vals).astype(dt).tobytes() if vals else b""
    return (raw + bytes(sym.size))[:sym.size]

  def static_shared(self, f: CFunc) -> int:
    return sum(-(-self.prog.shared[i].size // 16) * 16 for i in sorted(f.shared) if not self.prog.shared[i].extern)

  def shared_layout(self, f: CFunc, dynamic: int) -> tuple[list[int], int]:
    """Offsets of the shared symbols a kernel uses (by symbol index; others -1) and the block's shared bytes."""
    saddr, off = [-1] * len(self.prog.shared), 0
    ext = []
    for i in sorted(f.shared):
      s = self.prog.shared[i]
      if s.extern:
        ext.append(i)
        continue
      off = -(-off // max(s.align, 1)) * max(s.align, 1)
      saddr[i] = off
      off += s.size
    off = -(-off // 16) * 16
    for i in ext: saddr[i] = off
    return saddr, -(-(off + dynamic) // 16) * 16

  def free(self) -> None:
    for a in self.gaddr: self.arena.free(a)
    self.gaddr = []

  def launch(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int], params: bytes, dynamic_shared: int = 0,
             shared_limit: int = SHARED_LIMIT) -> None:
    """Run kernel `name` to completion; KernelFault on any fault."""
    f = self.prog.functions.get(name)
    if f is None or f.kind != "entry": raise KernelFault("invalid launch", f"no kernel {name} in the module")
    check_launch(f, grid, block, len(params))
    saddr, S = self.shared_layout(f, dynamic_shared)
    if S > max(shared_limit, SHARED_LIMIT) or self.static_shared(f) > SHARED_LIMIT:
      raise KernelFault("invalid launch", f"kernel {name}: {S} bytes of shared memory per block, more than the {shared_limit} allowed")
    local = frame_bytes(self.prog, f)
    T = block[0] * block[1] * block[2]
    Tp = -(-T // 32) * 32 if f.warp_ops else T
    nblocks = grid[0] * grid[1] * grid[2]
    per = max(1, CHUNK_LANES // Tp)
    cache: dict = {}
    with np.errstate(all="ignore"):
      for first in range(0, nblocks, per):
        lanes = Lanes(self, f, grid, block, T, Tp, first, min(per, nblocks - first), params, saddr, S, local, dynamic_shared, cache)
        lanes.run()


def check_launch(f: CFunc, grid: tuple, block: tuple, nparams: int) -> None:
  if len(grid) != 3 or len(block) != 3 or any(int(g) < 1 for g in (*grid, *block)):
    raise KernelFault("invalid launch", f"kernel {f.name}: grid {grid} and block {block} must be three positive sizes")
  if any(b > m for b, m in zip(block, MAX_BLOCK_DIM)) or block[0] * block[1] * block[2] > MAX_THREADS:
    raise KernelFault("invalid launch", f"kernel {f.name}: block {block} exceeds the limits {MAX_BLOCK_DIM}, {MAX_THREADS} threads")
  if any(g > m for g, m in zip(grid, MAX_GRID)): raise KernelFault("invalid launch", f"kernel {f.name}: grid {grid} exceeds {MAX_GRID}")
  T = block[0] * block[1] * block[2]
  if (mx := f.directives.get("maxntid")) and T > int(np.prod(mx)):
    raise KernelFault("invalid launch", f"kernel {f.name}: {T} threads per block, more than its .maxntid {mx}")
  if (rq := f.directives.get("reqntid")) and tuple(block[:len(rq)]) != tuple(rq):
    raise KernelFault("invalid launch", f"kernel {f.name}: block {block} differs from its .reqntid {rq}")
  if nparams != f.param_size:
    raise KernelFault("invalid launch", f"kernel {f.name}: {nparams} bytes of parameters given, it takes {f.param_size}")


def frame_bytes(prog: Program, f: CFunc, seen: tuple[str, ...] = ()) -> int:
  """Local memory per thread: the function's frame plus the deepest chain of frames it calls."""
  if f.name in seen: raise Unimplemented(f"recursive call of {f.name} (PTX line {f.line}) is not supported")
  return f.local_size + max((frame_bytes(prog, prog.functions[c], seen + (f.name,)) for c in f.calls), default=0)


# ---------------------------------------------------------------------------- execution state

class Frame:
  """One function invocation over the lanes of a chunk: its registers, carry flag, .param storage, local frame base."""
  __slots__ = ("R", "CC", "P", "lbase", "L", "fn")

  def __init__(self, L: Lanes, fn: CFunc, lbase: int) -> None:
    self.L, self.fn, self.lbase = L, fn, lbase
    self.R = [L.zeros(dt) for dt in fn.reg_types]
    self.CC = L.zeros(np.dtype(np.bool_))
    self.P: dict[int, np.ndarray] = {}

  def param(self, key: int, size: int) -> np.ndarray:
    """Per-lane storage of a .param variable (N x size bytes)."""
    b = self.P.get(key)
    if b is None: b = self.P[key] = np.zeros((self.L.N, size), dtype=np.uint8)
    return b


class Lanes:
  """A chunk of a launch: `nb` consecutive blocks starting at block `first`, as lanes."""
  def __init__(self, mod: LoadedModule, f: CFunc, grid, block, T, Tp, first, nb, params, saddr, S, local, dynamic,
               launch_cache: dict | None = None) -> None:
    self.mod, self.f, self.grid, self.block, self.T, self.Tp, self.first, self.nb = mod, f, grid, block, T, Tp, first, nb
    self.N = nb * Tp
    self.shape = (self.N,)
    self.kparams, self.saddr, self.S, self.local_bytes, self.dynamic = params, saddr, S, local, dynamic
    self.arena, self.device, self.gaddr = mod.arena, mod.device, mod.gaddr
    self.lane = np.arange(self.N, dtype=np.int64)
    self.cta = self.lane // Tp
    self.thread = self.lane % Tp
    self.valid = self.thread < T if Tp != T else None
    self.exited = np.zeros(self.N, dtype=bool)
    self.shared = np.zeros(nb * S, dtype=np.uint8) if S else np.zeros(16, dtype=np.uint8)
    self.local = np.zeros(self.N * local, dtype=np.uint8) if local else None
    self._sregs: dict[str, Any] = {}
    self.launch_cache = {} if launch_cache is None else launch_cache  # per-thread values shared by a launch's chunks
    self._zeros: dict[np.dtype, np.ndarray] = {}
    self.steps = 0
    self.barrier_line: Any = None

  def zeros(self, dt: np.dtype) -> np.ndarray:
    z = self._zeros.get(dt)
    if z is None:
      z = self._zeros[dt] = np.zeros(self.N, dtype=dt)
      z.flags.writeable = False
    return z

  # ---- ids
  def thread_ids(self, lane: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(block id, thread id) of a chunk lane."""
    bx, by, _ = self.block
    gx, gy, _ = self.grid
    b, t = self.first + lane // self.Tp, lane % self.Tp
    return (b % gx, b // gx % gy, b // (gx * gy)), (t % bx, t // bx % by, t // (bx * by))

  def describe(self, lane: int) -> str:
    b, t = self.thread_ids(lane)
    return f"thread ({t[0]}, {t[1]}, {t[2]}) of block ({b[0]}, {b[1]}, {b[2]})"

  def sreg(self, name: str) -> Any:
    v = self._sregs.get(name)
    if v is None:
      per_thread = name.startswith(("%tid.", "%laneid", "%warpid", "%lanemask_"))
      if per_thread and (v := self.launch_cache.get((name, self.N))) is not None: self._sregs[name] = v
      else:
        v = self._sregs[name] = self._special(name)
        if per_thread: self.launch_cache[(name, self.N)] = v
    if name in ("%clock", "%clock64", "%clock_hi", "%globaltimer", "%globaltimer_lo", "%globaltimer_hi"):
      self._sregs.pop(name)
    return v

  def _special(self, name: str) -> Any:
    u = np.uint32
    bx, by, bz = self.block
    gx, gy, gz = self.grid
    full = lambda v: np.broadcast_to(np.asarray(v, dtype=u), self.shape)
    t, b = self.thread, self.first + self.cta
    comp = {"x": 0, "y": 1, "z": 2}
    if name.startswith("%tid."): return [(t % bx), (t // bx % by), (t // (bx * by))][comp[name[-1]]].astype(u)
    if name.startswith("%ntid."): return full(self.block[comp[name[-1]]])
    if name.startswith("%ctaid."): return [(b % gx), (b // gx % gy), (b // (gx * gy))][comp[name[-1]]].astype(u)
    if name.startswith("%nctaid."): return full(self.grid[comp[name[-1]]])
    if name == "%laneid": return (t % 32).astype(u)
    if name == "%warpid": return (t // 32).astype(u)
    if name == "%nwarpid": return full(-(-self.T // 32))
    if name == "%smid": return (b % 108).astype(u)
    if name == "%nsmid": return full(108)
    if name == "%gridid": return full(0)
    if name.startswith("%lanemask_"):
        lid = (t % 32).astype(np.uint64)
        one = np.uint64(1)
        eq = one << lid
        m = {"eq": eq, "lt": eq - one, "le": (eq << one) - one, "gt": ~((eq << one) - one), "ge": ~(eq - one)}[name[10:]]
        return (m & np.uint64(0xFFFFFFFF)).astype(u)
    if name == "%dynamic_smem_size": return full(self.dynamic)
    if name in ("%total_smem_size", "%aggr_smem_size"): return full(self.S)
    if name in ("%clock", "%clock64", "%clock_hi"):
      c = self.steps * 16
      v = c >> 32 if name == "%clock_hi" else c
      return np.broadcast_to(np.asarray(v, dtype=np.uint64 if name == "%clock64" else u), self.shape)
    if name.startswith("%globaltimer"):
      ns = time.perf_counter_ns()
      v = ns if name == "%globaltimer" else (ns & 0xFFFFFFFF if name.endswith("lo") else ns >> 32)
      return np.broadcast_to(np.asarray(v, dtype=np.uint64 if name == "%globaltimer" else u), self.shape)
    raise Unimplemented(f"special register {name}")

  # ---- running
  def run(self) -> None:
    mask = None if self.valid is None else self.valid.copy()
    fr = Frame(self, self.f, 0)
    run_function(self, fr, mask, kernel=True)

  def call(self, st: Frame, name: str, rets: list[Symbol], args: list[Symbol], m: Any) -> None:
    g = self.mod.prog.functions[name]
    if len(args) != len(g.params) or len(rets) != len(g.rets):
      raise LaneError("invalid", 0, f"call of {name} with {len(args)} argument(s) and {len(rets)} result(s); "
                      f"it takes {len(g.params)} and {len(g.rets)}")
    fr = Frame(self, g, st.lbase + st.fn.local_size)
    for formal, actual in zip(g.params + g.rets, args + rets):
      fr.P[id(formal)] = st.param(id(actual), max(actual.size, formal.size))
    run_function(self, fr, m, kernel=False)

  # ---- memory (`lanes`: the chunk lanes of the addresses, None for all of them in order)
  def _lanes_of(self, m: Any) -> np.ndarray | None: return None if m is None else np.flatnonzero(m)

  @staticmethod
  def _lane(lanes: np.ndarray | None, i: int) -> int: return int(i if lanes is None else lanes[i])

  @staticmethod
  def _sub(lanes: np.ndarray | None, sel: np.ndarray) -> np.ndarray: return np.flatnonzero(sel) if lanes is None else lanes[sel]

  def _fault(self, e: AccessFault, lanes: np.ndarray | None, space: str) -> LaneError:
    return LaneError(e.kind, self._lane(lanes, e.index), f"{space} {e}")

  def _split(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sh = (a >= np.uint64(SHARED_WINDOW)) & (a < np.uint64(SHARED_WINDOW + WINDOW_SIZE))
    lo = (a >= np.uint64(LOCAL_WINDOW)) & (a < np.uint64(LOCAL_WINDOW + WINDOW_SIZE))
    return sh, lo

  def _addresses(self, a: Any) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != np.uint64: a = a.astype(np.uint64)
    return np.broadcast_to(a, self.shape) if a.ndim == 0 else a

  def load(self, space: str, m: Any, a: Any, dt: np.dtype, nvec: int) -> np.ndarray:
    a = self._addresses(a)
    if m is None: return self._load_lanes(space, None, a, dt, nvec)
    vals = self._load_lanes(space, np.flatnonzero(m), a[m], dt, nvec)
    out = np.zeros((self.N,) if nvec == 1 else (self.N, nvec), dtype=dt)
    out[m] = vals
    return out

  def _load_lanes(self, space: str, lanes: np.ndarray | None, aa: np.ndarray, dt: np.dtype, nvec: int) -> np.ndarray:
    if space == "generic":
      sh, lo = self._split(aa)
      if not (sh.any() or lo.any()): space = "global"
      else:
        out = np.zeros((len(aa),) if nvec == 1 else (len(aa), nvec), dtype=dt)
        for sel, sp, base in ((sh, "shared", SHARED_WINDOW), (lo, "local", LOCAL_WINDOW), (~(sh | lo), "global", 0)):
          if sel.any(): out[sel] = self._load_lanes(sp, self._sub(lanes, sel), aa[sel] - np.uint64(base), dt, nvec)
        return out
    if space in ("global", "const"):
      try: return self.arena.load(aa, dt, nvec, self.device)
      except AccessFault as e: raise self._fault(e, lanes, space) from None
    buf, idx = self._window(space, lanes, aa, np.dtype(dt).itemsize * nvec)
    v = buf.view(dt)
    idx = idx // np.uint64(np.dtype(dt).itemsize)
    return v[idx] if nvec == 1 else v[idx[:, None] + np.arange(nvec, dtype=np.uint64)]

  def _owner(self, space: str) -> np.ndarray:
    """Byte offset of each lane's window: its block's shared memory or its own local memory."""
    key = "_own_" + space
    own = self.__dict__.get(key)
    if own is None:
      own = (self.cta * self.S if space == "shared" else self.lane * self.local_bytes).astype(np.uint64)
      self.__dict__[key] = own
    return own

  def _window(self, space: str, lanes: np.ndarray | None, aa: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(byte buffer, byte index per lane) of a shared/local access, checked against the block's/lane's window."""
    if space not in ("shared", "local"): raise LaneError("invalid", self._lane(lanes, 0), f"unsupported state space .{space}")
    limit = self.S if space == "shared" else self.local_bytes
    buf = self.shared if space == "shared" else self.local
    if aa.size and int(aa.max()) + size > limit:
      i = int(np.flatnonzero(aa + np.uint64(size) > np.uint64(limit))[0])
      raise LaneError("illegal address", self._lane(lanes, i), f"{space} address {int(aa[i]):#x} ({size} bytes) is outside the "
                      f"{limit} bytes of {'shared memory of the block' if space == 'shared' else 'local memory of the thread'}")
    if size > 1 and (aa & np.uint64(size - 1)).any():
      i = int(np.flatnonzero(aa & np.uint64(size - 1))[0])
      raise LaneError("misaligned address", self._lane(lanes, i), f"{space} address {int(aa[i]):#x} is not aligned to the {size}-byte access")
    own = self._owner(space)
    return buf, (own if lanes is None else own[lanes]) + aa

  def store(self, space: str, m: Any, a: Any, dt: np.dtype, nvec: int, v: Any) -> None:
    a = self._addresses(a)
    v = np.asarray(v)
    if v.dtype != dt: v = v.astype(dt)
    if v.ndim == 0 or (nvec > 1 and v.ndim == 1): v = np.broadcast_to(v, self.shape if nvec == 1 else (self.N, nvec))
    if m is None: self._store_lanes(space, None, a, dt, nvec, v)
    else: self._store_lanes(space, np.flatnonzero(m), a[m], dt, nvec, v[m])

  def _store_lanes(self, space: str, lanes: np.ndarray | None, aa: np.ndarray, dt: np.dtype, nvec: int, v: np.ndarray) -> None:
    if space == "generic":
      sh, lo = self._split(aa)
      if not (sh.any() or lo.any()): space = "global"
      else:
        for sel, sp, base in ((sh, "shared", SHARED_WINDOW), (lo, "local", LOCAL_WINDOW), (~(sh | lo), "global", 0)):
          if sel.any(): self._store_lanes(sp, self._sub(lanes, sel), aa[sel] - np.uint64(base), dt, nvec, v[sel])
        return
    if space in ("global", "const"):
      if space == "const": raise LaneError("illegal address", self._lane(lanes, 0), "store to the .const space")
      try: return self.arena.store(aa, v, dt, nvec, self.device)
      except AccessFault as e: raise self._fault(e, lanes, space) from None
    buf, idx = self._window(space, lanes, aa, np.dtype(dt).itemsize * nvec)
    view = buf.view(dt)
    idx = idx // np.uint64(np.dtype(dt).itemsize)
    if nvec == 1: view[idx] = v
    else: view[idx[:, None] + np.arange(nvec, dtype=np.uint64)] = v

  def atomic(self, space: str, m: Any, a: Any, dt: np.dtype, t: str, op: str, b: Any, c: Any) -> np.ndarray:
    a = np.broadcast_to(np.asarray(a, dtype=np.uint64), self.shape)
    b = np.broadcast_to(np.asarray(b, dtype=dt), self.shape)
    c = np.broadcast_to(np.asarray(c, dtype=dt), self.shape) if c is not None else None
    lanes = self.lane if m is None else np.flatnonzero(m)
    aa = a if m is None else a[m]
    size = np.dtype(dt).itemsize
    if space == "generic":
      sh, lo = self._split(aa)
      if lo.any(): raise LaneError("illegal address", int(lanes[np.flatnonzero(lo)[0]]), "atomic on a local address")
      if sh.all(): space, aa = "shared", aa - np.uint64(SHARED_WINDOW)
      elif not sh.any(): space = "global"
      else: raise LaneError("invalid", int(lanes[0]), "one atomic instruction on both shared and global addresses")
    if space == "global":
      try: idx = self.arena.indices(aa, dt, self.device)
      except AccessFault as e: raise self._fault(e, lanes, space) from None
      view = self.arena.view(dt)
    else:
      buf, bidx = self._window(space, lanes, aa, size)
      view, idx = buf.view(dt), bidx // np.uint64(size)
    old = np.zeros(self.N, dtype=dt)
    bl, cl = b[lanes], (c[lanes] if c is not None else None)
    olds = np.empty(len(lanes), dtype=dt)
    for k in range(len(lanes)):  # lane order: duplicates see each other's updates, as serialized atomics do
      i = int(idx[k])
      o = view[i]
      olds[k] = o
      view[i] = _atomic_value(op, t, o, bl[k], cl[k] if cl is not None else None)
    old[lanes] = olds
    return old

  # ---- warps
  def _warps(self, x: Any, dt: Any = None) -> np.ndarray:
    return np.broadcast_to(np.asarray(x) if dt is None else np.asarray(x, dtype=dt), self.shape).reshape(-1, 32)

  def _active(self, m: Any) -> np.ndarray:
    act = np.ones(self.N, bool) if m is None else np.asarray(m)
    return act.reshape(-1, 32)

  def _members(self, m: Any, membermask: Any, what: str, ins: Any) -> np.ndarray:
    """The warp's member bits per lane; a member lane not executing the instruction is an error (it would hang)."""
    act = self._active(m)
    bits = np.uint32(1) << np.arange(32, dtype=np.uint32)
    ballot = np.bitwise_or.reduce(np.where(act, bits, np.uint32(0)), axis=1)
    mm = self._warps(membermask, np.uint32)
    missing = np.where(act, mm & ~ballot[:, None], np.uint32(0))
    if missing.any():
      w, l = np.argwhere(missing)[0]
      other = int(np.flatnonzero((int(missing[w, l]) >> np.arange(32)) & 1)[0])
      raise LaneError("barrier", int(w * 32 + l), f"{what}: its member mask names lane {other}, which is not executing it "
                      f"(diverged or exited; a GPU would hang)")
    return mm

  def shfl(self, st: Frame, m: Any, mode: str, a: Any, b: Any, c: Any, membermask: Any, w: Any, wp: Any, ins: Any) -> None:
    self._members(m, membermask, "shfl.sync", ins)
    lane = np.arange(32, dtype=np.int64)[None, :]
    bv = self._warps(b, np.uint32).astype(np.int64) & 31
    cv = self._warps(c, np.uint32).astype(np.int64)
    clamp, seg = cv & 31, (cv >> 8) & 31
    max_lane = (lane & seg) | (clamp & ~seg)
    min_lane = lane & seg
    if mode == "up": j, ok = lane - bv, (lane - bv) >= max_lane
    elif mode == "down": j, ok = lane + bv, (lane + bv) <= max_lane
    elif mode == "bfly": j, ok = lane ^ bv, (lane ^ bv) <= max_lane
    else: j, ok = min_lane | (bv & ~seg), (min_lane | (bv & ~seg)) <= max_lane
    j = np.where(ok, j, lane)
    av = self._warps(a, np.uint32)
    d = np.take_along_axis(av, j, axis=1).reshape(-1)
    w(st, m, d)
    if wp is not None: wp(st, m, ok.reshape(-1))

  def vote(self, st: Frame, m: Any, mode: str, p: Any, membermask: Any, ins: Any) -> np.ndarray:
    mm = self._members(m, membermask, "vote.sync", ins)
    pv = self._warps(p, bool) & self._active(m)
    bits = np.uint32(1) << np.arange(32, dtype=np.uint32)
    ballot = np.bitwise_or.reduce(np.where(pv, bits, np.uint32(0)), axis=1)[:, None] & mm
    if mode == "ballot": return ballot.reshape(-1)
    if mode == "any": return (ballot != 0).reshape(-1)
    if mode == "all": return (ballot == mm).reshape(-1)
    return ((ballot == 0) | (ballot == mm)).reshape(-1)

  def ballot(self, m: Any, p: Any) -> np.ndarray:
    pv = self._warps(p, bool) & self._active(m)
    bits = np.uint32(1) << np.arange(32, dtype=np.uint32)
    return np.repeat(np.bitwise_or.reduce(np.where(pv, bits, np.uint32(0)), axis=1), 32)

  def redux(self, st: Frame, m: Any, op: str, dt: np.dtype, a: Any, membermask: Any, ins: Any) -> np.ndarray:
    mm = self._members(m, membermask, "redux.sync", ins)
    av = self._warps(a, dt)
    bits = np.uint32(1) << np.arange(32, dtype=np.uint32)
    out = np.zeros(av.shape, dtype=dt)
    for w in range(av.shape[0]):
      for l in range(32):
        sel = (int(mm[w, l]) & bits.astype(np.int64)) != 0
        x = av[w][sel]
        if op == "add": r = x.astype(np.int64).sum()
        elif op == "min": r = x.min() if x.size else 0
        elif op == "max": r = x.max() if x.size else 0
        else: r = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op].reduce(x) if x.size else 0
        out[w, l] = np.asarray(r).astype(np.int64).astype(dt) if op == "add" else r
    return out.reshape(-1)

  def mma(self, st: Frame, m: Any, k: int, tin: str, td: str, tc: str, a: list, b: list, c: list, wd: list, ins: Any) -> None:
    act = self._active(m)
    partial = act.any(axis=1) & ~act.all(axis=1)
    if partial.any():
      w = int(np.flatnonzero(partial)[0])
      lane = int(np.flatnonzero(~act[w])[0])
      raise LaneError("barrier", w * 32 + lane, "mma.sync.aligned: every lane of the warp must execute it together (this lane "
                      "diverged or exited; a GPU would hang or compute garbage)")
    run = act.all(axis=1)
    dec = N.f16_to_f64 if tin == "f16" else N.bf16_to_f64
    W = act.shape[0]
    g, t = np.arange(32) >> 2, np.arange(32) & 3

    def halves(regs):  # (W, 32, 2 * len(regs)) float64 elements, element 2r+h of register r
      out = np.empty((W, 32, 2 * len(regs)))
      for r, v in enumerate(regs):
        v = self._warps(v, np.uint32)
        out[:, :, 2 * r] = dec((v & np.uint32(0xFFFF)).astype(np.uint16))
        out[:, :, 2 * r + 1] = dec((v >> np.uint32(16)).astype(np.uint16))
      return out
    A, B = np.zeros((W, 16, k)), np.zeros((W, k, 8))
    av, bv = halves(a), halves(b)
    for i in range(av.shape[2]):
      A[:, g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)] = av[:, :, i]
    for i in range(bv.shape[2]):
      B[:, 2 * t + (i & 1) + 8 * (i >> 1), g] = bv[:, :, i]
    if tc == "f32": cv = np.stack([self._warps(x, np.float32).astype(np.float64) for x in c], axis=2)
    else: cv = halves(c)
    C = np.zeros((W, 16, 8))
    for i in range(4): C[:, g + 8 * (i >> 1), 2 * t + (i & 1)] = cv[:, :, i]
    D = np.einsum("wmk,wkn->wmn", A, B) + C
    dv = np.stack([D[:, g + 8 * (i >> 1), 2 * t + (i & 1)] for i in range(4)], axis=2)  # (W, 32, 4)
    mask = np.repeat(run, 32) if m is None else np.asarray(m)
    if td == "f32":
      for i, w in enumerate(wd): w(st, mask, N.round_to(dv[:, :, i].reshape(-1), None, N.F32).astype(np.float32))
    else:
      enc = N.encode(N.round_to(dv.reshape(-1, 4), None, N.F16), N.F16).astype(np.uint32)
      for r, w in enumerate(wd): w(st, mask, enc[:, 2 * r] | (enc[:, 2 * r + 1] << np.uint32(16)))


def _atomic_value(op: str, t: str, old: Any, b: Any, c: Any) -> Any:
  dt = NP[t]
  if op == "exch": return b
  if op == "cas": return c if old == b else old
  if op in ("and", "or", "xor"):
    u = np.dtype(f"u{dt.itemsize}")
    ob, bb = np.asarray(old).view(u), np.asarray(b).view(u)
    r = ob & bb if op == "and" else ob | bb if op == "or" else ob ^ bb
    return np.asarray(r).view(dt)
  if t in ("f32", "f64", "f16", "bf16"):
    fmt = ops.FLOAT[t]
    x, y = ops.fdecode(t)(np.asarray([old])), ops.fdecode(t)(np.asarray([b]))
    if op == "add":
      if t == "f32": x, y = N.ftz(x), N.ftz(y)
      r = N.add_exact(x, y, fmt, "rn")
      if t == "f32": r = N.ftz(r)
    elif op in ("min", "max"): r = ops._fminmax(op == "max", False)(x, y)
    else: raise Unimplemented(f"atom.{op}.{t}")
    return ops.fencode(t)(r)[0]
  if op == "add": return (np.asarray(old) + np.asarray(b)).astype(dt)
  if op == "min": return min(old, b)
  if op == "max": return max(old, b)
  if op == "inc": return dt.type(0) if old >= b else dt.type(old + 1)
  if op == "dec": return b if (old == 0 or old > b) else dt.type(old - 1)
  raise Unimplemented(f"atom.{op}.{t}")


# ---------------------------------------------------------------------------- the scheduler

def _merge(a: Any, b: Any) -> Any:
  if a is None or b is None: return None
  r = a | b
  return None if r.all() else r


def run_function(L: Lanes, st: Frame, mask: Any, kernel: bool) -> None:
  """Run `st.fn` for the lanes of `mask` (None: all) until every one of them returns."""
  fn = st.fn
  blocks = fn.blocks
  nblk = len(blocks)
  groups: dict[int, Any] = {0: mask}
  waiting: dict[int, Any] = {}

  def add(k: int, m: Any) -> None:
    if k >= nblk:  # falling off the end returns
      if kernel: L.exited[slice(None) if m is None else m] = True
      return
    groups[k] = _merge(groups[k], m) if k in groups else m

  while True:
    if not groups:
      if not waiting: return
      _release(L, fn, waiting, groups, kernel)
      continue
    b = min(groups) if len(groups) > 1 else next(iter(groups))
    m = groups.pop(b)
    blk = blocks[b]
    L.steps += 1
    if L.steps > MAX_BLOCK_STEPS:
      raise KernelFault("timeout", f"kernel {L.f.name}: still running after {MAX_BLOCK_STEPS} basic blocks (an endless loop? "
                        f"a GPU would hang); last at PTX line {(blk.instrs or [blk.term_instr])[0].line if (blk.instrs or blk.term_instr) else '?'}")
    i = 0
    try:
      for i, f in enumerate(blk.ops): f(st, m)
    except (KernelFault, Unimplemented): raise
    except LaneError as e: raise _fault(L, e.kind, e.lane, blk.instrs[i], str(e)) from None
    except Exception as e:
      lane = 0 if m is None else int(np.flatnonzero(m)[0]) if np.any(m) else 0
      raise _fault(L, "internal", lane, blk.instrs[i], f"{type(e).__name__}: {e}") from e
    term = blk.term
    kind = term[0]
    if kind == "fall": add(b + 1, m)
    elif kind == "bra": add(term[1], m)
    elif kind == "cbra":
      p = st.R[term[2]]
      if term[3]: p = ~p
      if m is None:
        if p.all(): add(term[1], None)
        elif not p.any(): add(b + 1, None)
        else:
          add(term[1], p.copy())
          add(b + 1, ~p)
      else:
        t = m & p
        nt = m & ~p
        if not nt.any(): add(term[1], m)
        elif not t.any(): add(b + 1, m)
        else:
          add(term[1], t)
          add(b + 1, nt)
    elif kind in ("ret", "cret"):
      if kind == "cret":
        p = st.R[term[1]]
        if term[2]: p = ~p
        going = p if m is None else (m & p)
        stay = ~p if m is None else (m & ~p)
        if stay.any(): add(b + 1, stay)
        m = going
      if kernel: L.exited[slice(None) if m is None else m] = True
    elif kind == "bar":
      if not kernel:
        raise _fault(L, "barrier", 0 if m is None else int(np.flatnonzero(m)[0]), blk.term_instr,
                     f"bar.sync inside the called function {fn.name} is not supported")
      waiting[b + 1] = _merge(waiting[b + 1], m) if b + 1 in waiting else m
      L.barrier_line = blk.term_instr
    elif kind == "trap":
      raise _fault(L, "trap", 0 if m is None else int(np.flatnonzero(m)[0]), blk.term_instr, "trap executed")


def _release(L: Lanes, fn: CFunc, waiting: dict[int, Any], groups: dict[int, Any], kernel: bool) -> None:
  """Every live lane waits at a barrier: release them, unless a block has threads that exited without arriving."""
  dead = L.exited if L.valid is None else (L.exited & L.valid)
  if dead.any():
    W = np.zeros(L.N, dtype=bool)
    for m in waiting.values(): W |= True if m is None else m
    bad = (W.reshape(L.nb, L.Tp).any(axis=1)) & (dead.reshape(L.nb, L.Tp).any(axis=1))
  else: bad = np.zeros(1, dtype=bool)
  if bad.any():
    blk = int(np.flatnonzero(bad)[0])
    waiter = blk * L.Tp + int(np.flatnonzero(W.reshape(L.nb, L.Tp)[blk])[0])
    gone = blk * L.Tp + int(np.flatnonzero(dead.reshape(L.nb, L.Tp)[blk])[0])
    ins = L.barrier_line
    raise KernelFault("barrier", f"kernel {L.f.name}: barrier not reached by all threads of the block: {L.describe(waiter)} waits "
                      f"at PTX line {ins.line} ({ins.text}) but {L.describe(gone)} exited without reaching it (a GPU would hang)")
  for k, m in waiting.items(): groups[k] = _merge(groups[k], m) if k in groups else m
  waiting.clear()


def _fault(L: Lanes, kind: str, lane: int, ins: Any, msg: str) -> KernelFault:
  where = f"PTX line {ins.line} ({ins.text})" if ins is not None else "?"
  return KernelFault(kind, f"kernel {L.f.name}: {kind} in {L.describe(lane)} at {where}: {msg}")
