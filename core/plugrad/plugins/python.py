"""The PYTHON device: a pure-Python interpreter of linearized kernels (docs/kernel_ir.md). Slow and obviously correct.

It is the reference every backend is checked against, and the first backend to read when writing one:
- memory is host bytearrays (`PythonAllocator`, handles are byte memoryviews; offset views are slices);
- the renderer's "source" is a readable listing of the uops (what DEBUG=4 prints) followed by the pickled list;
- the compiler decodes the pickle; `PythonProgram` executes the list one uop at a time: RANGE/END are loops (END
  jumps back to the instruction after its RANGE), DEFINE_REG accumulators are Python lists, INDEX/LOAD/STORE go
  through `TypedView` (bounds-checked, gated), and every ALU result is truncated to its dtype exactly as
  `plugrad.uop.ops.exec_alu` does (ints wrap, float32/float16 round, bfloat16/fp8 round through their codes).
"""
from __future__ import annotations

import base64
import pickle
import struct
import time
from typing import Any, Callable, NamedTuple

from plugrad.device import BufferOptions, Compiled, CompileError, Compiler, LRUAllocator, Program, Renderer
from plugrad.dtype import FP8S, DType, PtrDType, bf16_to_f32, dtypes, f32_to_bf16, f32_to_fp8, fp8_to_f32, truncate
from plugrad.uop.ops import GroupOp, Ops, UOp, python_alu


class PythonAllocator(LRUAllocator):
  """Host memory: the opaque handle is a byte memoryview of a bytearray (offset views are slices of it)."""
  def _alloc(self, size: int, options: BufferOptions) -> memoryview: return memoryview(bytearray(size))
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
  name, device, suffix = "PYTHON", "PYTHON", "PYTHON"

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


def alu_fn(u: UOp) -> Callable:
  """The Python function computing uop `u` from its source values, result truncated to u.dtype (= exec_alu)."""
  trunc = truncate(u.dtype)
  if u.op is Ops.CAST: return trunc
  if u.op is Ops.BITCAST:
    src = u.src[0].dtype
    return lambda v: bitcast(v, src, u.dtype)
  f = python_alu[u.op]
  return lambda *vals: trunc(f(*vals))


def decode(uops: list[UOp]) -> list[Instr]:
  """Check the program and turn each uop into an Instr (positions instead of nodes, loops matched)."""
  pos: dict[UOp, int] = {}  # where each uop was last computed (a uop may appear twice, e.g. a CONST shared by two scopes)
  code: list[Instr] = []
  open_ranges: list[int] = []
  for i, u in enumerate(uops):
    if u.op in UNSUPPORTED or (u.dtype.count > 1 and not isinstance(u.dtype, PtrDType)):
      raise NotImplementedError(f"PYTHON device can't run {u.op} of dtype {u.dtype} (uop {i})")
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
    code.append(Instr(u.op, u.dtype, src, u.arg, fn, jump))
  if open_ranges: raise RuntimeError(f"RANGE at uop {open_ranges[-1]} is never closed by an END")
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


class PythonProgram(Program):
  def __init__(self, dev: Compiled, name: str, lib: bytes) -> None:
    super().__init__(dev, name, lib)
    _, self.uops = pickle.loads(lib)
    self.code = decode(self.uops)
    self.n_globals = 1 + max((u.arg for u in self.uops if u.op is Ops.DEFINE_GLOBAL), default=-1)  # buffers are passed by slot
    self.n_vars = sum(1 for u in self.uops if u.op is Ops.DEFINE_VAR)

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    self.check_launch(global_size, local_size)
    if len(bufs) < self.n_globals or len(vals) != self.n_vars:  # extra buffers (slots the kernel no longer reads) are ignored
      raise TypeError(f"kernel {self.name} takes {self.n_globals} buffers and {self.n_vars} values, got {len(bufs)} and {len(vals)}")
    st = time.perf_counter()
    interpret(self.code, list(bufs), tuple(vals))
    return time.perf_counter() - st if wait else None


class PythonDevice(Compiled):
  smoke_kernel = None

  def __init__(self, device: str) -> None:
    super().__init__(device, PythonAllocator(), [PythonRenderer], PythonCompiler(), PythonProgram)

