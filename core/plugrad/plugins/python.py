"""The PYTHON device: a pure-Python interpreter of linearized kernels (docs/kernel_ir.md). Slow and obviously correct.

It is the reference every backend is checked against, and the first backend to read when writing one:
- memory is host bytearrays (`PythonAllocator`, handles are byte memoryviews; offset views are slices);
- the renderer's "source" is a readable listing of the uops (what DEBUG=4 prints) followed by the pickled list;
- the compiler decodes the pickle; `PythonProgram` executes the list one uop at a time: RANGE/END are loops (END
  jumps back to the instruction after its RANGE), DEFINE_REG accumulators are Python lists, INDEX/LOAD/STORE go
  through `TypedView` (bounds-checked, gated), and every ALU result is truncated to its dtype exactly as
  `plugrad.uop.ops.exec_alu` does (ints wrap, float32/float16 round, bfloat16/fp8 round through their codes).

GPU emulation (`EMULATE=CUDA | CUDA_SM80 | AMD | AMD_RDNA4 | AMD_CDNA3 | AMD_CDNA2`): the renderer takes that target's
capabilities from `plugrad.codegen.targets`, so codegen optimizes for it and emits SPECIAL ids, DEFINE_LOCAL,
BARRIER and WMMA, and `PythonProgram` runs the kernel like the GPU (`interpret_gpu`): every workgroup of the launch,
its threads in warps of `warp_size` lanes that execute each instruction in lockstep (values are per-lane lists;
IF/ENDIF mask lanes off), shared memory per workgroup, and warps that run one after the other up to each BARRIER (so a
missing barrier shows up as a wrong result, as on hardware; a barrier that only part of the workgroup reaches raises
`BarrierError`). WMMA gathers each lane's fragment through the tensor core's layout (`plugrad.codegen.tc`). The launch
is checked against the SPECIAL sizes. `GPU_COUNTERS` counts what the hardware would do: 32-byte global memory sectors
loaded/stored per warp instruction, barriers, warp instructions and active lanes, WMMAs.
"""
from __future__ import annotations

import base64
import ctypes
import functools
import pickle
import struct
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from plugrad.codegen.targets import GPUTarget, get_target
from plugrad.device import BufferOptions, Compiled, CompileError, Compiler, LRUAllocator, Program, Renderer
from plugrad.dtype import FP8S, DType, PtrDType, bf16_to_f32, dtypes, f32_to_bf16, f32_to_fp8, fp8_to_f32, truncate
from plugrad.helpers import getenv
from plugrad.uop.ops import GroupOp, Ops, UOp, python_alu


class PythonAllocator(LRUAllocator):
  """Host memory: the opaque handle is a byte memoryview of a bytearray (offset views are slices of it)."""
  external_memory = True
  def _alloc(self, size: int, options: BufferOptions) -> memoryview:
    if options.external_ptr is not None: return memoryview((ctypes.c_uint8 * size).from_address(options.external_ptr)).cast("B")
    return memoryview(bytearray(size))
  def _copyin(self, dest: memoryview, src: memoryview) -> None: dest[:] = src
  def _copyout(self, dest: memoryview, src: memoryview) -> None: dest[:] = src
  def _offset(self, opaque: memoryview, size: int, offset: int) -> memoryview: return opaque[offset:offset + size]
  def _transfer(self, dest: memoryview, src: memoryview, nbytes: int, src_dev: Compiled, dest_dev: Compiled) -> None:
    dest[:nbytes] = src[:nbytes]


# ***** source: a readable listing plus the pickled uops *****
PAYLOAD_MARK = "#@uops "


def listing(uops: list[UOp]) -> list[str]:
  """One line per uop: position, op, dtype, sources (by position) and arg."""
  pos = {u: i for i, u in enumerate(uops)}
  return [f"{i:4d} {u.op.name:<13s} {u.dtype!r:<48s} {[pos.get(s, '?') for s in u.src]!s:<12s} {u.arg!r}" for i, u in enumerate(uops)]


class PythonRenderer(Renderer):
  """Renders the uop listing. With EMULATE=<GPU target> it carries that target's capabilities (see the module docstring)."""
  name, device, suffix = "PYTHON", "PYTHON", "PYTHON"
  target: GPUTarget | None = None

  def __init__(self, arch: str | None = None) -> None:
    super().__init__(arch)
    if (emu := getenv("EMULATE", "")):
      self.target = get_target(emu)
      self.caps = self.target.caps()
      self.suffix = f"PYTHON_{self.target.name}"

  def render(self, name: str, uops: list[UOp]) -> str:
    payload = base64.b64encode(pickle.dumps((name, list(uops)), protocol=pickle.HIGHEST_PROTOCOL)).decode()
    return "\n".join([f"# PYTHON kernel {name}: {len(uops)} uops, run by plugrad.plugins.python.PythonProgram", *listing(uops),
                      PAYLOAD_MARK + payload]) + "\n"


class PythonCompiler(Compiler):
  """Extracts and checks the pickled uops. Nothing is cached on disk (unpickling is cheap; the listing is the source)."""
  def __init__(self) -> None: super().__init__(None)

  def compile(self, src: str) -> bytes:
    line = next((ln for ln in src.splitlines() if ln.startswith(PAYLOAD_MARK)), None)
    if line is None: raise CompileError("PYTHON kernel source has no '#@uops' payload line", "", src)
    try:
      lib = base64.b64decode(line[len(PAYLOAD_MARK):], validate=True)
      name, uops = pickle.loads(lib)
    except Exception as e: raise CompileError(f"PYTHON kernel payload is corrupt: {type(e).__name__}: {e}", "", src) from None
    if not isinstance(name, str) or not all(isinstance(u, UOp) for u in uops): raise CompileError("PYTHON payload is not (name, [UOp])", "", src)
    return lib


# ***** memory *****
class TypedView:
  """Element access to a byte memoryview as `dtype` values (Python bool/int/float), with bounds checks."""
  def __init__(self, mem: Any, dtype: DType, name: str) -> None:
    self.mem, self.dtype, self.name = mem, dtype, name
    self.size = len(mem) // dtype.itemsize
    if dtype == dtypes.bfloat16: self.fmt, self.decode, self.encode = "H", lambda b: float(bf16_to_f32(b)), lambda v: int(f32_to_bf16(v))
    elif dtype in FP8S:
      self.fmt = "B"
      self.decode, self.encode = lambda b: float(fp8_to_f32(b, dtype)), lambda v: int(f32_to_fp8(v, dtype))
    elif dtype.fmt is not None: self.fmt, self.decode, self.encode = dtype.fmt, None, None
    else: raise NotImplementedError(f"PYTHON device has no memory layout for {dtype}")

  @functools.cached_property
  def address(self) -> int:
    """The host address of element 0 (vector accesses check their alignment against it, as hardware does)."""
    return int(np.frombuffer(self.mem, np.uint8).ctypes.data) if len(self.mem) else 0

  def check(self, i: int) -> None:
    if not 0 <= i < self.size: raise IndexError(f"kernel accessed {self.name}[{i}], out of bounds for {self.size} {self.dtype.name} elements")

  def __getitem__(self, i: int):
    self.check(i)
    v = struct.unpack_from(self.fmt, self.mem, i * self.dtype.itemsize)[0]
    return v if self.decode is None else self.decode(v)

  def __setitem__(self, i: int, v) -> None:
    self.check(i)
    struct.pack_into(self.fmt, self.mem, i * self.dtype.itemsize, v if self.encode is None else self.encode(v))


def bitcast(v, src: DType, dst: DType):
  """Reinterpret the bits of scalar `v` of dtype `src` as `dst` (same size)."""
  if src.itemsize != dst.itemsize: raise NotImplementedError(f"PYTHON device can't bitcast {src} to {dst} of another size")
  raw = bytearray(src.itemsize)
  TypedView(memoryview(raw), src, "bitcast")[0] = v
  return TypedView(memoryview(raw), dst, "bitcast")[0]


# ***** the interpreter *****
class Instr(NamedTuple):
  """One decoded uop: `src` are positions of its sources in the program; `fn` computes ALU/CAST values; `jump` is
  the position after the matching END (for RANGE) or of the matching RANGE (for END)."""
  op: Ops
  dtype: DType
  src: tuple[int, ...]
  arg: Any
  fn: Callable | None = None
  jump: int = -1


UNSUPPORTED = {Ops.DEFINE_LOCAL, Ops.SPECIAL, Ops.IF, Ops.ENDIF, Ops.BARRIER, Ops.VECTORIZE, Ops.GEP, Ops.VCONST, Ops.CUSTOM, Ops.THREEFRY}
GPU_OPS = {Ops.DEFINE_LOCAL, Ops.SPECIAL, Ops.IF, Ops.ENDIF, Ops.BARRIER, Ops.VECTORIZE, Ops.GEP, Ops.WMMA}  # interpret_gpu only


def alu_fn(u: UOp) -> Callable:
  """The Python function computing uop `u` from its source values, result truncated to u.dtype (= exec_alu)."""
  return _alu_fn(u.op, u.dtype, u.src[0].dtype if u.src else u.dtype)


def _alu_fn(op: Ops, dt: DType, src_dt: DType) -> Callable:
  if dt.count > 1:  # a vector value (GPU emulation): element by element on tuples
    f1 = _alu_fn(op, dt.scalar(), src_dt.scalar())
    return lambda *vals: tuple(map(f1, *vals))
  trunc = truncate(dt)
  if op is Ops.CAST: return trunc
  if op is Ops.BITCAST: return lambda v: bitcast(v, src_dt, dt)
  f = python_alu[op]
  return lambda *vals: trunc(f(*vals))


def decode(uops: list[UOp], gpu: bool = False) -> list[Instr]:
  """Check the program and turn each uop into an Instr (positions instead of nodes, loops and IFs matched). `gpu`
  allows the GPU ops (SPECIAL, DEFINE_LOCAL, BARRIER, IF, WMMA, vectors) that only `interpret_gpu` runs."""
  pos: dict[UOp, int] = {}  # where each uop was last computed (a uop may appear twice, e.g. a CONST shared by two scopes)
  code: list[Instr] = []
  open_ranges: list[int] = []
  open_ifs: list[int] = []
  for i, u in enumerate(uops):
    if (u.op in UNSUPPORTED and not (gpu and u.op in GPU_OPS)) or (u.dtype.count > 1 and not isinstance(u.dtype, PtrDType) and not gpu):
      raise NotImplementedError(f"PYTHON device can't run {u.op} of dtype {u.dtype} (uop {i})" +
                                ("" if gpu else "; GPU kernels run with EMULATE=<target> (docs/env_vars.md)"))
    for s in u.src:
      if s not in pos: raise RuntimeError(f"uop {i} ({u.op}) uses a source that is not defined before it: {s.op} {s.arg!r}")
    src = tuple(pos[s] for s in u.src)
    pos[u] = i
    fn, jump = None, -1
    if u.op in GroupOp.ALU or u.op in (Ops.CAST, Ops.BITCAST):
      if u.op not in python_alu and u.op not in (Ops.CAST, Ops.BITCAST): raise NotImplementedError(f"PYTHON device can't run {u.op}")
      fn = alu_fn(u)
    elif u.op is Ops.RANGE: open_ranges.append(i)
    elif u.op is Ops.END:
      if not open_ranges or open_ranges[-1] != src[0]: raise RuntimeError(f"END at uop {i} does not close the innermost open RANGE")
      jump = open_ranges.pop()
      code[jump] = code[jump]._replace(jump=i + 1)
    elif u.op is Ops.STORE and len(src) != 2: raise NotImplementedError(f"PYTHON device can't run STORE with {len(src)} sources")
    elif u.op is Ops.IF: open_ifs.append(i)
    elif u.op is Ops.ENDIF:
      if not open_ifs or open_ifs[-1] != src[0]: raise RuntimeError(f"ENDIF at uop {i} does not close the innermost open IF")
      jump = open_ifs.pop()
      code[jump] = code[jump]._replace(jump=i)
    code.append(Instr(u.op, u.dtype, src, u.arg, fn, jump))
  if open_ranges: raise RuntimeError(f"RANGE at uop {open_ranges[-1]} is never closed by an END")
  if open_ifs: raise RuntimeError(f"IF at uop {open_ifs[-1]} is never closed by an ENDIF")
  return code


def interpret(code: list[Instr], bufs: list[Any], vals: tuple[int, ...]) -> None:
  """Run a decoded program. `bufs` are byte memoryviews in DEFINE_GLOBAL slot order, `vals` the DEFINE_VAR values."""
  v: list[Any] = [None] * len(code)  # the current value of each uop
  for i, ins in enumerate(code):  # constants first: one CONST may be shared by several scopes
    if ins.op is Ops.CONST: v[i] = ins.arg
  n_var, pc = 0, 0
  while pc < len(code):
    ins = code[pc]
    op, s = ins.op, ins.src
    if ins.fn is not None: v[pc] = ins.fn(*[v[j] for j in s])
    elif op is Ops.INDEX: v[pc] = (v[s[0]], v[s[1]], v[s[2]] if len(s) > 2 else True)  # (memory, index, gate)
    elif op is Ops.LOAD:
      mem, idx, gate = v[s[0]]
      v[pc] = mem[idx] if gate else dtypes.as_const(0, ins.dtype)
    elif op is Ops.STORE:
      mem, idx, gate = v[s[0]]
      if gate: mem[idx] = v[s[1]]
    elif op is Ops.RANGE:
      v[pc] = 0
      if v[s[0]] <= 0: pc = ins.jump; continue  # empty loop: skip past its END
    elif op is Ops.END:
      r = ins.jump  # the RANGE this END closes
      v[r] += 1
      if v[r] < v[code[r].src[0]]: pc = r + 1; continue
    elif op is Ops.DEFINE_REG: v[pc] = [dtypes.as_const(0, ins.dtype.base)] * max(ins.dtype.size, 1)
    elif op is Ops.AFTER: v[pc] = v[s[0]]
    elif op is Ops.DEFINE_GLOBAL: v[pc] = TypedView(bufs[ins.arg], ins.dtype.base, f"data{ins.arg}")
    elif op is Ops.DEFINE_VAR:
      v[pc] = vals[n_var]
      n_var += 1
    elif op is not Ops.CONST and op is not Ops.NOOP: raise NotImplementedError(f"PYTHON device can't run {op} (uop {pc})")
    pc += 1


# ***** the GPU emulator (EMULATE=<target>) *****
class BarrierError(RuntimeError):
  """A BARRIER that only part of a workgroup reaches (on hardware: a hang)."""


GPU_COUNTERS: dict[str, int] = {"launches": 0, "workgroups": 0, "warp_instructions": 0, "active_lanes": 0, "lane_slots": 0,
                                "global_load_sectors": 0, "global_store_sectors": 0, "global_load_bytes": 0, "global_store_bytes": 0,
                                "local_accesses": 0, "barriers": 0, "wmma": 0}


def reset_gpu_counters() -> None:
  for k in GPU_COUNTERS: GPU_COUNTERS[k] = 0


def _sectors(mem: TypedView, idxs: list[int], lanes: list[int], cnt: int = 1) -> int:
  """32-byte sectors a warp's access of `cnt` elements per lane touches (what a coalescing memory system transfers)."""
  isz = mem.dtype.itemsize
  if cnt == 1: return len({(idxs[ln] * isz) >> 5 for ln in lanes})
  return len({s for ln in lanes for s in range((idxs[ln] * isz) >> 5, ((idxs[ln] + cnt) * isz - 1 >> 5) + 1)})


def _check_vector(mem: TypedView, idx: int, cnt: int) -> None:
  """A vector access must be aligned to its size in bytes (hardware faults otherwise) and lie inside the buffer."""
  nbytes = cnt * mem.dtype.itemsize
  if nbytes & (nbytes - 1) or nbytes > 16:
    raise RuntimeError(f"{mem.name}: a {cnt}-element {mem.dtype.name} vector access ({nbytes} bytes) has no hardware form")
  if (mem.address + idx * mem.dtype.itemsize) % nbytes:
    raise RuntimeError(f"{mem.name}[{idx}]: {nbytes}-byte vector access at a misaligned address "
                       f"(buffer at {mem.address % 64} mod 64, + {idx} elements)")
  mem.check(idx + cnt - 1)


@functools.cache
def _coords(tc: Any, op: str, lanes: int, ept: int) -> tuple[np.ndarray, np.ndarray]:
  """(rows, cols) of element j of lane l, as [lanes, ept] arrays (the tensor core's layout table)."""
  lay = tc.layout(op)
  rc = np.array([[lay.coord(ln, j) for j in range(ept)] for ln in range(lanes)], dtype=np.int64).reshape(lanes, ept, 2)
  return rc[..., 0], rc[..., 1]


def _wmma(tc: Any, a: list, b: list, c: list) -> list:
  """D = A @ B + C for one warp: each lane's fragments placed through the tensor core's layout (lanes holding the same
  element must agree), products summed exactly (float64) and rounded once to the output dtype, the result handed back
  in the layout of C."""
  n, m, k = tc.dims
  mats = {}
  for name, vals, shape in (("a", a, (m, k)), ("b", b, (k, n)), ("c", c, (m, n))):
    v = np.array(vals, dtype=np.float64)
    rows, cols = _coords(tc, name, *v.shape)
    mat = np.full(shape, np.nan)
    mat[rows, cols] = v
    if not np.array_equal(mat[rows, cols], v, equal_nan=True):
      raise RuntimeError(f"WMMA {tc.name}: lanes hold different values for the same element of {name}")
    if np.isnan(mat).any() and not np.isnan(v).any(): raise RuntimeError(f"WMMA {tc.name}: the lanes' fragments don't cover {name}")
    mats[name] = mat
  with np.errstate(all="ignore"): d = mats["a"] @ mats["b"] + mats["c"]
  rows, cols = _coords(tc, "c", len(c), len(c[0]))
  trunc = truncate(tc.dtype_out)
  return [tuple(trunc(float(x)) for x in row) for row in d[rows, cols]]


class _Warp:
  """One warp of a workgroup: runs the program on its lanes in lockstep as a generator that yields at each BARRIER."""
  def __init__(self, code: list[Instr], bufs: list[TypedView], local: dict[int, TypedView], vals: tuple[int, ...], specials: dict[str, list[int]],
               n_lanes: int, target: GPUTarget) -> None:
    self.code, self.bufs, self.local, self.vals, self.specials, self.n, self.target = code, bufs, local, vals, specials, n_lanes, target

  def run(self):
    code, W, C = self.code, self.n, GPU_COUNTERS
    lanes_all = list(range(W))
    v: list[Any] = [None] * len(code)
    for i, ins in enumerate(code):
      if ins.op is Ops.CONST: v[i] = [ins.arg] * W
    loop_end: dict[int, int] = {}
    masks: list[list[int]] = []
    active = lanes_all  # the lanes executing (IF masks lanes off)
    n_var, pc, ninstr, nact = 0, 0, 0, 0
    while pc < len(code):
      ins = code[pc]
      op, s = ins.op, ins.src
      ninstr += 1
      nact += len(active)
      if ins.fn is not None: v[pc] = list(map(ins.fn, *[v[j] for j in s]))
      elif op is Ops.INDEX: v[pc] = (v[s[0]], v[s[1]], v[s[2]] if len(s) > 2 else None)
      elif op is Ops.LOAD: v[pc] = self.load(ins, v[s[0]], active)
      elif op is Ops.STORE: self.store(v[s[0]], v[s[1]], active)
      elif op is Ops.RANGE:
        ends = {v[s[0]][ln] for ln in active}
        if len(ends) > 1: raise RuntimeError(f"RANGE at uop {pc}: lanes of a warp disagree on the loop bound ({sorted(ends)[:4]})")
        loop_end[pc] = ends.pop() if ends else 0
        v[pc] = [0] * W
        if loop_end[pc] <= 0: pc = ins.jump; continue
      elif op is Ops.END:
        r = ins.jump
        nxt = v[r][0] + 1
        if nxt < loop_end[r]:
          v[r] = [nxt] * W
          pc = r + 1
          continue
      elif op is Ops.IF:
        masks.append(active)
        active = [ln for ln in active if v[s[0]][ln]]
        if not active: pc = ins.jump; continue  # no lane takes the branch: skip to the ENDIF (which restores the mask)
      elif op is Ops.ENDIF: active = masks.pop()
      elif op is Ops.BARRIER:
        if len(active) != W:
          raise BarrierError(f"BARRIER at uop {pc} reached by only part of the workgroup: {len(active)} of the {W} lanes of a warp (a divergent IF)")
        C["barriers"] += 1
        yield pc
      elif op is Ops.SPECIAL: v[pc] = self.specials[ins.arg]
      elif op is Ops.DEFINE_GLOBAL: v[pc] = [self.bufs[ins.arg]] * W
      elif op is Ops.DEFINE_LOCAL: v[pc] = [self.local[pc]] * W
      elif op is Ops.DEFINE_REG:
        zero = _zero(ins.dtype.base)
        v[pc] = [[zero] * max(ins.dtype.size, 1) for _ in range(W)]
      elif op is Ops.AFTER: v[pc] = v[s[0]]
      elif op is Ops.DEFINE_VAR:
        v[pc] = [self.vals[n_var]] * W
        n_var += 1
      elif op is Ops.VECTORIZE: v[pc] = list(zip(*[v[j] for j in s]))
      elif op is Ops.GEP: v[pc] = [x[ins.arg[0]] for x in v[s[0]]]
      elif op is Ops.WMMA: v[pc] = self.wmma(ins, [v[j] for j in s], active)
      elif op is not Ops.CONST and op is not Ops.NOOP: raise NotImplementedError(f"PYTHON GPU emulation can't run {op} (uop {pc})")
      pc += 1
    C["warp_instructions"] += ninstr
    C["active_lanes"] += nact
    C["lane_slots"] += ninstr * W

  def load(self, ins: Instr, ix: tuple, active: list[int]) -> list:
    mems, idxs, gates = ix
    lanes = active if gates is None else [ln for ln in active if gates[ln]]
    zero = _zero(ins.dtype)
    out = [zero] * self.n
    mem0 = mems[0]
    if isinstance(mem0, list):  # registers: per lane
      for ln in lanes: out[ln] = mems[ln][idxs[ln]]
      return out
    if (cnt := ins.dtype.count) > 1:  # a vector load: cnt consecutive elements, aligned to the vector's size as hardware requires
      for ln in lanes:
        _check_vector(mem0, idxs[ln], cnt)
        out[ln] = tuple(mem0[idxs[ln] + e] for e in range(cnt))
    else:
      for ln in lanes: out[ln] = mem0[idxs[ln]]
    self.count(mem0, idxs, lanes, "load", cnt)
    return out

  def store(self, ix: tuple, val: list, active: list[int]) -> None:
    mems, idxs, gates = ix
    lanes = active if gates is None else [ln for ln in active if gates[ln]]
    mem0 = mems[0]
    if isinstance(mem0, list):
      for ln in lanes: mems[ln][idxs[ln]] = val[ln]
      return
    cnt = 1
    for ln in lanes:
      if isinstance(v := val[ln], tuple):  # a vector store
        cnt = len(v)
        _check_vector(mem0, idxs[ln], cnt)
        for e, x in enumerate(v): mem0[idxs[ln] + e] = x
      else: mem0[idxs[ln]] = v
    self.count(mem0, idxs, lanes, "store", cnt)

  def count(self, mem: TypedView, idxs: list[int], lanes: list[int], kind: str, cnt: int = 1) -> None:
    if not lanes: return
    if mem.name.startswith("local"): GPU_COUNTERS["local_accesses"] += 1
    else:
      GPU_COUNTERS[f"global_{kind}_sectors"] += _sectors(mem, idxs, lanes, cnt)
      GPU_COUNTERS[f"global_{kind}_bytes"] += len(lanes) * mem.dtype.itemsize * cnt

  def wmma(self, ins: Instr, srcs: list[list], active: list[int]) -> list:
    tc = next((t for t in self.target.tensor_cores if t.name == ins.arg), None)
    if tc is None: raise RuntimeError(f"WMMA {ins.arg!r} is not a tensor core of {self.target.name}")
    if len(active) != self.n or self.n != tc.threads:
      raise RuntimeError(f"WMMA {tc.name} needs all {tc.threads} lanes of the warp active, got {len(active)} of {self.n}")
    GPU_COUNTERS["wmma"] += 1
    return _wmma(tc, *srcs)


def _zero(dt: DType):
  z = dtypes.as_const(0, dt.scalar())
  return tuple([z] * dt.count) if dt.count > 1 else z


def _lane_ids(local_size: tuple[int, ...], t0: int, n: int) -> dict[str, list[int]]:
  """lidx0..2 of threads t0..t0+n-1 of a workgroup (dim 0 fastest)."""
  l0, l1 = local_size[0], local_size[1]
  ts = range(t0, t0 + n)
  return {"lidx0": [t % l0 for t in ts], "lidx1": [t // l0 % l1 for t in ts], "lidx2": [t // (l0 * l1) for t in ts]}


def interpret_gpu(code: list[Instr], bufs: list[Any], vals: tuple[int, ...], global_size: tuple[int, ...], local_size: tuple[int, ...],
                  target: GPUTarget) -> None:
  """Run a decoded GPU program for a whole launch (see the module docstring)."""
  gs = (tuple(global_size) + (1, 1, 1))[:3]
  ls = (tuple(local_size) + (1, 1, 1))[:3]
  for ins in code:  # the kernel's ids must match the launch
    if ins.op is Ops.SPECIAL:
      dim = int(ins.arg[4:])
      want = (gs if ins.arg.startswith("g") else ls)[dim]
      if (n := _const_size(code, ins)) is not None and n != want:
        raise RuntimeError(f"kernel's {ins.arg} has size {n} but the launch has {want} along dim {dim}")
  views = [TypedView(b, code[i].dtype.base, f"data{code[i].arg}") for i, b in _globals(code, bufs)]
  gviews: list[Any] = [None] * (1 + max((code[i].arg for i, _ in _globals(code, bufs)), default=-1))
  for (i, _), tv in zip(_globals(code, bufs), views): gviews[code[i].arg] = tv
  W, threads = target.warp_size, ls[0] * ls[1] * ls[2]
  GPU_COUNTERS["launches"] += 1
  for gz in range(gs[2]):
    for gy in range(gs[1]):
      for gx in range(gs[0]):
        GPU_COUNTERS["workgroups"] += 1
        local = {i: TypedView(memoryview(bytearray(ins.dtype.size * ins.dtype.base.itemsize)), ins.dtype.base, f"local{i}")
                 for i, ins in enumerate(code) if ins.op is Ops.DEFINE_LOCAL}
        warps = []
        for t0 in range(0, threads, W):
          n = min(W, threads - t0)
          sp = {**_lane_ids(ls, t0, n), "gidx0": [gx] * n, "gidx1": [gy] * n, "gidx2": [gz] * n}
          warps.append(_Warp(code, gviews, local, vals, sp, n, target).run())
        _run_group(warps)


def _run_group(warps: list) -> None:
  """Run the warps of a workgroup one after the other up to each barrier; all must reach the same barrier."""
  live = warps
  while live:
    at: list[int | None] = []
    for w in live:
      try: at.append(next(w))
      except StopIteration: at.append(None)
    if all(a is None for a in at): return
    if any(a is None for a in at) or len(set(at)) > 1:
      raise BarrierError(f"barrier reached by only part of the workgroup: warps stopped at {['exit' if a is None else f'uop {a}' for a in at]}")


def _globals(code: list[Instr], bufs: list[Any]) -> list[tuple[int, Any]]:
  return [(i, bufs[ins.arg]) for i, ins in enumerate(code) if ins.op is Ops.DEFINE_GLOBAL]


def _const_size(code: list[Instr], ins: Instr) -> int | None:
  src = code[ins.src[0]]
  return src.arg if src.op is Ops.CONST else None


class PythonProgram(Program):
  def __init__(self, dev: Compiled, name: str, lib: bytes) -> None:
    super().__init__(dev, name, lib)
    _, self.uops = pickle.loads(lib)
    self.target: GPUTarget | None = dev.renderer.target if isinstance(dev.renderer, PythonRenderer) else None
    self.gpu = any(u.op in GPU_OPS for u in self.uops)
    if self.gpu and self.target is None: raise RuntimeError(f"kernel {name} uses GPU ops; the PYTHON device runs them with EMULATE=<target>")
    self.code = decode(self.uops, gpu=self.gpu)
    self.n_globals = 1 + max((u.arg for u in self.uops if u.op is Ops.DEFINE_GLOBAL), default=-1)  # buffers are passed by slot
    self.n_vars = sum(1 for u in self.uops if u.op is Ops.DEFINE_VAR)

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    self.check_launch(global_size, local_size)
    if len(bufs) < self.n_globals or len(vals) != self.n_vars:  # extra buffers (slots the kernel no longer reads) are ignored
      raise TypeError(f"kernel {self.name} takes {self.n_globals} buffers and {self.n_vars} values, got {len(bufs)} and {len(vals)}")
    st = time.perf_counter()
    if self.gpu or local_size is not None:
      if self.target is None: raise RuntimeError(f"kernel {self.name}: a launch with local_size needs EMULATE=<target>")
      interpret_gpu(self.code, list(bufs), tuple(vals), global_size, local_size or (1, 1, 1), self.target)
    else: interpret(self.code, list(bufs), tuple(vals))
    return time.perf_counter() - st if wait else None


class PythonDevice(Compiled):
  smoke_kernel = None

  def __init__(self, device: str) -> None:
    super().__init__(device, PythonAllocator(), [PythonRenderer], PythonCompiler(), PythonProgram)

