"""The CPU device: 64-byte-aligned host memory, C compiled to a shared object by clang/gcc, threaded ctypes launcher.

Rendered kernels (ClangRenderer) split their outermost global loop across cores: the library exports
`void name(void **bufs, const int *vals, int core_id, int core_n)` and `long long name_work(const int *vals,
long long *split)`, and the C thread pool (pool.py) launches them on up to CPU_THREADS cores (default: all), fewer
when the estimated work is small (MIN_WORK_PER_THREAD ops per core). Libraries without `name_work` (hand-written
C such as the smoke kernel) are called directly as `void name(T0 *buf0, ..., int val0, ...)` on one thread.
"""
from __future__ import annotations
import ctypes
import dataclasses
import functools
import hashlib
import math
import mmap
import os
import pathlib
import re
import subprocess
import tempfile
import time
import weakref
from typing import Any
import numpy as np
from plugrad.device import BufferOptions, Compiled, Compiler, CompileError, LRUAllocator, Program, parse_device
from plugrad.helpers import cache_dir, getenv
from plugrad.codegen.cstyle import CStyleRenderer, Stmt
from plugrad.codegen.facts import eval_index
from plugrad.dtype import DType, dtypes
from plugrad.runtime.renderer import DEFAULT_VECTOR_OPS, Capabilities
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.upat import PatternMatcher, UPat
from plugrad_cpu import find_cc
from plugrad_cpu.pool import POOL_SRC

MIN_WORK_PER_THREAD = 1 << 16  # estimated ops (loads, stores, ALU) one extra core must get to be worth waking

def spin_us() -> int:
  """How long the pool's workers spin after a job before they sleep (`CPU_SPIN_US`, microseconds; default 1000). A
  sleeping worker's wake-up cost ~1 ms on the 2-core VMs measured: with a 100 us spin, 512x512 matmuls realized back
  to back after an idle moment took a median 2.8 ms (the 80-160 us of Python between two realizes outlasted the spin,
  and the worker was asleep at the next launch), with 0.5-1 ms
  1.35-1.55 (numpy 1.4); a TinyJit step's kernels run back to back and never wait either way."""
  if (us := getenv("CPU_SPIN_US", 1000)) < 0: raise ValueError(f"CPU_SPIN_US must be >= 0 microseconds, got {us}")
  return us


# the C library's madvise (None where there is none: discard keeps the memory)
_MADVISE = getattr(ctypes.CDLL(None, use_errno=True), "madvise", None) if hasattr(mmap, "MADV_DONTNEED") else None
if _MADVISE is not None: _MADVISE.restype, _MADVISE.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class CPUAllocator(LRUAllocator):
  """Host memory as numpy uint8 arrays aligned to 64 bytes; the opaque handle is the array (views are slices). A zeroed
  buffer is an anonymous private mapping of its own: its pages read as zero and take no memory until written (a KV
  cache reserved for the whole context is resident only where tokens went), and go back to the system when it dies."""
  external_memory = zeroes_memory = True
  def _alloc(self, size: int, options: BufferOptions) -> np.ndarray:
    if options.external_ptr is not None: return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(options.external_ptr))
    if options.zeroed and size: return np.frombuffer(mmap.mmap(-1, size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)
    raw = np.empty(size + 64, np.uint8)
    return raw[(-raw.ctypes.data) % 64:][:size]
  def _free(self, opaque: np.ndarray, size: int, options: BufferOptions) -> None: pass
  def discard(self, opaque: np.ndarray, size: int, offset: int = 0) -> None:
    """madvise(MADV_DONTNEED) on the whole pages inside the bytes: the system takes them back now, and they return as
    zero pages when next written (the bytes of partial pages at either end stay as they are)."""
    lo, hi = -(-(opaque.ctypes.data + offset) // mmap.PAGESIZE) * mmap.PAGESIZE, (opaque.ctypes.data + offset + size) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo and _MADVISE is not None and _MADVISE(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), mmap.MADV_DONTNEED) != 0:
      raise OSError(ctypes.get_errno(), f"CPU: madvise(MADV_DONTNEED) of {hi - lo} bytes failed: {os.strerror(ctypes.get_errno())}")
  def _copyin(self, dest: np.ndarray, src: memoryview) -> None: dest[:] = np.frombuffer(src, np.uint8)
  def _copyout(self, dest: memoryview, src: np.ndarray) -> None: np.frombuffer(dest, np.uint8)[:] = src
  def _offset(self, opaque: np.ndarray, size: int, offset: int) -> np.ndarray: return opaque[offset:offset + size]
  def _transfer(self, dest: np.ndarray, src: np.ndarray, nbytes: int, src_dev: Compiled, dest_dev: Compiled) -> None:
    dest[:nbytes] = src[:nbytes]

def _exp2_poly() -> str:
  """2^f for |f| <= 1/2 in f: the degree-7 Taylor polynomial of e^(f ln 2) in Horner form (C source)."""
  c = [f"{math.log(2) ** k / math.factorial(k):.10e}f" for k in range(8)]
  horner = c[7]
  for k in range(6, -1, -1): horner = f"({horner}*f+{c[k]})"
  return horner

def _exp2f_src() -> str:
  """exp2 for float32 that clang/gcc can vectorize (libm's exp2f is a scalar call): 2^x = 2^n * 2^f with n = rint(x),
  |f| <= 1/2, 2^f = e^(f ln 2) by its degree-7 Taylor polynomial (truncation < 1e-8 relative), 2^n applied as two
  exact power-of-two factors so that results down to subnormals and up to inf round once. NaN stays NaN. x <= -150
  (2^x rounds to 0; -inf, a masked softmax score) returns 0 without computing it: the underflowing multiply would cost
  a microcode assist per lane (~150 cycles) when denormals are not flushed."""
  return ("static inline float pg_exp2f(float x) {\n"
          "  float xc = (x != x || x <= -150.0f) ? 0.0f : (x > 129.0f ? 129.0f : x);\n"
          "  float n = __builtin_rintf(xc), f = xc - n;\n"
          f"  float p = {_exp2_poly()};\n"
          "  int i = (int)n, i1 = i / 2, i2 = i - i1;\n"
          "  union { unsigned u; float f; } s1, s2;\n"
          "  s1.u = (unsigned)(i1 + 127) << 23; s2.u = (unsigned)(i2 + 127) << 23;\n"
          "  return (x != x) ? x : (x <= -150.0f ? 0.0f : (p * s1.f) * s2.f);\n}")

EXP2F_SRC = _exp2f_src()

# compiler macros naming the instruction sets the renderer and its preludes read, by their /proc/cpuinfo flag names
MACRO_FLAGS = {"__AVX512F__": "avx512f", "__AVX512VL__": "avx512vl", "__AVX512VNNI__": "avx512_vnni", "__AVXVNNI__": "avx_vnni",
               "__AVX2__": "avx2", "__AVX__": "avx", "__FMA__": "fma", "__F16C__": "f16c", "__SSSE3__": "ssse3", "__ARM_NEON": "asimd",
               "__AVX512BF16__": "avx512_bf16"}
# instruction sets the kernels are built without where the target has them, and the flag that turns each off: AVX512-BF16's
# float -> bfloat16 conversion (vcvtneps2bf16, which clang emits for a __bf16 cast) flushes subnormal inputs and results
# to zero, and a cast must round like IEEE (Zen 4: 9.18e-41 cast to bfloat16 read 0)
# AVX-512's scatters: clang's loop vectorizer turns strided stores into them, and they are microcoded (Zen 4: a stride-2
# input gradient's interleave kernel, 32x128x28x28, took 1.91 ms with vscatterqps, 0.84 without). A switch the compiler
# doesn't take is left out (gcc 12 has no -mno-scatter; clang has it from 18)
WITHOUT_FLAGS = {"avx512_bf16": "-mno-avx512bf16", "avx512f": "-mno-scatter"}

def cpu_march() -> str:
  """The -march CPU kernels are compiled for: `CPU_MARCH` (e.g. x86-64-v3, an AVX2 box's code and capabilities on an
  AVX-512 host), default native."""
  march = os.environ.get("CPU_MARCH", "").strip() or "native"
  if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", march):
    raise ValueError(f"CPU_MARCH must be a compiler -march name such as x86-64-v3 or native, got {march!r}")
  return march

@functools.cache
def host_flags() -> frozenset[str]:
  """The host CPU's feature flags from /proc/cpuinfo (x86 "flags", ARM "Features"); empty where it can't be read."""
  try: info = open("/proc/cpuinfo").read()
  except OSError: info = ""
  return frozenset(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith(("flags", "Features"))), []))

@functools.cache
def march_flags(march: str, cc: str) -> frozenset[str]:
  """The MACRO_FLAGS instruction sets `cc -march=<march>` enables, from its predefined macros; a ValueError naming the
  target when the compiler rejects it."""
  p = subprocess.run([*cc.split(), f"-march={march}", "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True)
  if p.returncode != 0:
    raise ValueError(f"CPU_MARCH={march}: {cc} rejects -march={march}: {(p.stderr.strip().splitlines() or ['?'])[0]}")
  macros = {ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("#define ")}
  return frozenset(flag for macro, flag in MACRO_FLAGS.items() if macro in macros)

def cpu_flags() -> frozenset[str]:
  """The feature flags kernels may use: the host's, or with CPU_MARCH those the compiler enables for that target. A
  target needing instructions the host lacks is a ValueError (its kernels would die of SIGILL)."""
  if (march := cpu_march()) == "native": return host_flags()
  target = march_flags(march, find_cc() or "cc")
  if host_flags() and (missing := sorted(f for f in target if f not in host_flags())):
    raise ValueError(f"CPU_MARCH={march} needs {', '.join(missing)}, which this CPU lacks (its kernels would crash)")
  return target

def simd_shape(flags: frozenset[str] | None = None) -> tuple[int, int]:
  """(float32 lanes of one vector register, vector registers) for `flags` (default: cpu_flags()): AVX-512 (16, 32),
  AVX2 (8, 16), NEON/SSE (4, 32/16). VECTOR_LANES overrides the lanes (0 turns explicit SIMD off)."""
  flags = cpu_flags() if flags is None else flags
  lanes, regs = (16, 32) if "avx512f" in flags else (8, 16) if "avx2" in flags else (4, 32) if "asimd" in flags else (4, 16)
  return getenv("VECTOR_LANES", lanes), regs

def dot4_max(flags: frozenset[str] | None = None) -> int:
  """`Renderer.dot4` for `flags` (default: cpu_flags()): the largest unsigned code WMMA "DOT4" multiplies exactly in
  one instruction: 255 with VNNI (vpdpbusd: AVX-512 VNNI with VL, or AVX-VNNI), 127 with pmaddubsw alone (its int16
  pair sums saturate beyond that; AVX2/SSSE3), 0 elsewhere (no DOT4: the portable form is slower than DOT2's). DOT4=0
  turns it off."""
  flags = cpu_flags() if flags is None else flags
  best = 255 if {"avx512_vnni", "avx512vl"} <= flags or "avx_vnni" in flags else 127 if flags & {"avx2", "ssse3"} else 0
  return best if getenv("DOT4", 1) else 0

# the feature flags (as /proc/cpuinfo names them) of the two x86 kinds of host plugrad is tuned and tested on; tests of
# host-dependent choices set the record of each (tests/conftest.py: cpu_host)
HOST_KINDS = {
  "avx2": frozenset({"sse2", "ssse3", "avx", "avx2", "fma", "f16c"}),   # Zen 2/3, Haswell..Skylake client: no AVX-512, no VNNI
  "avx512": frozenset({"sse2", "ssse3", "avx", "avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw", "avx512_vnni"}),  # Zen 4, Ice Lake
}

def simd_caps(flags: frozenset[str] | None = None) -> dict[str, int]:
  """The fields of the ClangRenderer's capability record that follow from a CPU's feature flags (default: cpu_flags(),
  the host or CPU_MARCH's target): vector_lanes, vector_regs, dot4. Tests of the heuristics apply it for a named host
  kind (tests/conftest.py: cpu_host)."""
  lanes, regs = simd_shape(flags)
  return {"vector_lanes": lanes, "vector_regs": regs, "dot4": dot4_max(flags)}

def host_caps(base: Capabilities, cc: str) -> Capabilities:
  """`base` (the ClangRenderer's record) completed for this host: its SIMD shape and byte dots (simd_caps), its caches
  (cache_sizes) and whether the compiler `cc` vectorizes reduce loops itself (clang does: see _loop)."""
  return dataclasses.replace(base, **simd_caps(), cache_bytes=cache_sizes(),
                             vectorizes_reductions="clang" in os.path.basename(cc.split()[0]))

def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> tuple[int, int, int]:
  """(L1 data, L2, L3) cache bytes of the host's first core, from Linux's sysfs cache description (0 for a level it
  doesn't list or that can't be read). CACHE_L1/CACHE_L2/CACHE_L3 (bytes) override a level."""
  sizes = {1: 0, 2: 0, 3: 0}
  try: entries = sorted(os.listdir(root))
  except OSError: entries = []
  for e in entries:
    if not e.startswith("index"): continue
    try:
      level, kind, size = (pathlib.Path(root, e, f).read_text().strip() for f in ("level", "type", "size"))
      mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
      if kind in ("Data", "Unified") and int(level) in sizes: sizes[int(level)] = int(size.rstrip("KMG")) * mult
    except (OSError, ValueError): continue
  return (getenv("CACHE_L1", sizes[1]), getenv("CACHE_L2", sizes[2]), getenv("CACHE_L3", sizes[3]))

def _vector_prelude(types: dict[str, tuple[str, int]], body: str, dot4: int = 255) -> str:
  """typedefs of the vector types (name -> scalar C type, bytes) and the helpers `body` uses: pg_fma_T (a*b+c rounded
  once), pg_max_T (NaN-propagating max, as the scalar MAX), pg_exp2f_T (the lane-wise pg_exp2f, bit for bit) and the
  integer dots pg_dot2_T / pg_dot4_T (`dot4`: the largest unsigned code DOT4s are emitted for, see `_dot4_src`)."""
  out = [f"typedef {c} {n} __attribute__((vector_size({b})));" for n, (c, b) in types.items()]
  for n, (c, b) in types.items():
    lanes = b // {"double": 8, "float": 4}.get(c, 1)
    mask = {"double": "long long", "float": "int"}.get(c)
    if f"pg_fma_{n}(" in body:
      sig = f"static inline {n} pg_fma_{n}({n} a, {n} b, {n} c)"
      out += ["#ifdef __clang__", sig + " {", "#pragma clang fp contract(fast)", "  return a * b + c;", "}", "#else",
              f"__attribute__((optimize(\"fp-contract=fast\"))) {sig} {{ return a * b + c; }}", "#endif"]
    if f"pg_max_{n}(" in body:
      if mask is None: out.append(f"static inline {n} pg_max_{n}({n} a, {n} b) {{ {n} m = (a > b); return (a & m) | (b & ~m); }}")
      else:
        mt = f"pg_mask_{n}"
        out += [f"typedef {mask} {mt} __attribute__((vector_size({b})));",
                f"static inline {n} pg_max_{n}({n} a, {n} b) {{ {mt} m = (a > b) | (a != a); return ({n})((({mt})a & m) | (({mt})b & ~m)); }}"]
    if f"pg_exp2f_{n}(" in body: out.append(_exp2f_vector_src(n, lanes))
    if f"pg_dot2_{n}(" in body: out.append(_dot2_src(n, b // 4))   # int32 lanes
    if f"pg_dot4_{n}(" in body: out.append(_dot4_src(n, b // 4, dot4))
  return "\n".join(out)

# int32 lanes -> the x86 register, its intrinsics' prefix, and the macros of pmaddwd's and pmaddubsw's widths
_X86_INT = {4: ("__m128i", "_mm", "__SSE2__", "__SSSE3__"), 8: ("__m256i", "_mm256", "__AVX2__", "__AVX2__"),
            16: ("__m512i", "_mm512", "__AVX512BW__", "__AVX512BW__")}

def _dot2_src(v: str, lanes: int) -> str:
  """pg_dot2_T(a, b, c) for int32 vector T of `lanes`: c[i] + a[2i]*b[2i] + a[2i+1]*b[2i+1] with int16 a, b of 2*lanes
  (WMMA "DOT2"). One pmaddwd where the target has it; else even/odd shuffles, widened, multiplied and added (exact:
  int16*int16 products fit int32; the sum of two wraps only for both -32768*-32768, as pmaddwd)."""
  s = f"pg_short{2 * lanes}"
  ev, od = (", ".join(str(2 * i + j) for i in range(lanes)) for j in (0, 1))
  def half(x: str, idx: str) -> str: return f"__builtin_convertvector(__builtin_shufflevector({x}, {x}, {idx}), {v})"
  generic = f"  return c + {half('a', ev)} * {half('b', ev)} + {half('a', od)} * {half('b', od)};"
  head = f"static inline {v} pg_dot2_{v}({s} a, {s} b, {v} c) {{"
  if (m := _X86_INT.get(lanes)) is None: return "\n".join([head, generic, "}"])
  reg, pre, guard, _ = m
  return "\n".join([f"#if defined({guard})", "#include <immintrin.h>", "#endif", head, f"#if defined({guard})",
                    f"  return c + ({v}){pre}_madd_epi16(({reg})a, ({reg})b);", "#else", generic, "#endif", "}"])

def _dot4_src(v: str, lanes: int, dot4: int = 255) -> str:
  """pg_dot4_T(a, b, c) for int32 vector T of `lanes`: c[i] + the sum over j < 4 of a[4i+j]*b[4i+j], uint8 a and int8 b
  of 4*lanes (WMMA "DOT4"). One vpdpbusd where the target has VNNI (AVX-512 VNNI; AVX-VNNI up to 256 bits); else, when
  the kernel's codes are at most 127 (`dot4`, the renderer's bound: int16 pair sums can't saturate), pmaddubsw then
  pmaddwd by ones; else widened even/odd shuffles, multiplied and added (exact: every sum fits int32)."""
  u, s = f"pg_unsigned_char{4 * lanes}", f"pg_signed_char{4 * lanes}"
  def part(x: str, j: int) -> str:
    return f"__builtin_convertvector(__builtin_shufflevector({x}, {x}, {', '.join(str(4 * i + j) for i in range(lanes))}), {v})"
  generic = "  return c + " + " + ".join(f"{part('a', j)} * {part('b', j)}" for j in range(4)) + ";"
  head = f"static inline {v} pg_dot4_{v}({u} a, {s} b, {v} c) {{"
  if (m := _X86_INT.get(lanes)) is None: return "\n".join([head, generic, "}"])
  reg, pre, _, guard = m
  args = f"(({reg})c, ({reg})a, ({reg})b)"
  vl = "defined(__AVX512VNNI__)" + ("" if lanes == 16 else " && defined(__AVX512VL__)")
  out = ["#if defined(__SSE2__)", "#include <immintrin.h>", "#endif", head, f"#if {vl}", f"  return ({v}){pre}_dpbusd_epi32{args};"]
  if lanes < 16: out += ["#elif defined(__AVXVNNI__)", f"  return ({v}){pre}_dpbusd_avx_epi32{args};"]
  pairs = f"{pre}_maddubs_epi16(({reg})a, ({reg})b)"   # int16 sums of 2 products: exact for codes <= 127
  if dot4 <= 127: out += [f"#elif defined({guard})", f"  return c + ({v}){pre}_madd_epi16({pairs}, {pre}_set1_epi16(1));"]
  return "\n".join(out + ["#else", generic, "#endif", "}"])

def _exp2f_vector_src(v: str, lanes: int) -> str:
  """pg_exp2f on a vector of float32 lanes, the same operations as the scalar one (selects by bit masks, rint by adding
  and subtracting 1.5*2^23, exact for the clamped |x| <= 150), so every lane gives the scalar's result bit for bit."""
  vi = f"pg_i_{v}"
  sel = f"#define PG_SEL_{v}(m, a, b) (({v})(((({vi})(a)) & (m)) | ((({vi})(b)) & ~(m))))"
  return "\n".join([f"typedef int {vi} __attribute__((vector_size({4 * lanes})));", sel,
    f"static inline {v} pg_exp2f_{v}({v} x) {{",
    f"  {vi} nan = (x != x), zero = (x <= -150.0f);",
    f"  {v} xc = PG_SEL_{v}(x > 129.0f, ({v}){{}} + 129.0f, x);",
    f"  xc = PG_SEL_{v}(nan | zero, ({v}){{}}, xc);",
    f"  {v} n = (xc + 12582912.0f) - 12582912.0f, f = xc - n;",
    f"  {v} p = {_exp2_poly()};",
    f"  {vi} i = __builtin_convertvector(n, {vi}), i1 = i / 2, i2 = i - i1;",
    f"  {v} s1 = ({v})((i1 + 127) << 23), s2 = ({v})((i2 + 127) << 23);",
    f"  return PG_SEL_{v}(nan, x, PG_SEL_{v}(zero, ({v}){{}}, (p * s1) * s2));", "}"])

def _loop(ctx: ClangRenderer, x: UOp) -> str | None:
  """The outermost global loop runs this core's share [lo, hi); reduce loops with one scalar accumulator get clang's
  vectorize pragma (clang may then reassociate the accumulator: a vectorized reduction)."""
  base = CStyleRenderer.string_rewrite.apply(x, ctx)
  if x in ctx._vec_loops: return Stmt("#pragma clang loop vectorize(enable) interleave_count(4)\n" + base)
  if x in ctx._sliding: return Stmt("#pragma clang loop unroll(disable)\n" + base)
  if x is not ctx._outer: return None
  t, name, end = ctx.ctype(x.dtype), ctx.r[x], ctx.r[x.src[0]]
  return Stmt(f"const {t} {name}_lo = ({t})(((long long)({end})*core_id)/core_n), {name}_hi = ({t})(((long long)({end})*(core_id+1))/core_n);\n"
              f"for ({t} {name} = {name}_lo; {name} < {name}_hi; {name}++) {{")


def _prefetched_load(ctx: ClangRenderer, x: UOp, idx: UOp) -> str | None:
  """Streamed loads (see `ClangRenderer.streamed_loads`) prefetch PREFETCH_BYTES ahead: the hardware prefetcher alone
  leaves a decode step's weight streams latency-bound. A prefetch past the end of a buffer is harmless (it never faults)."""
  if (dist := ctx._strided.get(x, ctx.prefetch_bytes if x in ctx._streamed else 0)) <= 0: return None
  return Stmt(CStyleRenderer.string_rewrite.apply(x, ctx) + f"\n__builtin_prefetch(((const char*)&{ctx.r[idx]}) + {dist});")


def _displaced_index(ctx: ClangRenderer, x: UOp) -> str | None:
  """buf[i + c] as (buf + i)[c], for a constant c or a loop variable c. A constant becomes the load's address
  displacement: as buf[i + c], each of a tile's unrolled loads (i + 1, i + 2, ...) sign-extended its own int sum (a
  conv tile: 14 integer ops per 14 FMAs); the shared base pointer is computed once. A loop variable keeps the access
  visibly consecutive: the sign-extended int sum hid that from clang's loop vectorizer, which then gathered and
  scattered a gated copy lane by lane (a pad of dy 14 -> 15 wide: 4.2 ms for 7 MB)."""
  if len(x.src) < 2 or (i := x.src[1]).op is not Ops.ADD: return None
  base, off = (i.src[1], i.src[0]) if i.src[0].op in (Ops.CONST, Ops.RANGE) and i.src[1].op not in (Ops.CONST, Ops.RANGE) else i.src
  if off.op not in (Ops.CONST, Ops.RANGE): return None
  return f"({ctx.r[x.src[0]]}+{ctx.r[base]})[{ctx.r[off]}]"


STEP_TRIPS = 16  # reduce_load_steps: a load's step in bytes is averaged over this many trips of its loop
SLIDE_MIN_TRIPS = 8  # sliding_loops: a shorter loop is unrolled whole by clang, so no loaded value crosses a trip
SLIDE_SHARE_TRIPS = 4  # sliding_loops: a value loaded again this many trips later at most (clang's partial unrolls: 2-4)


def _slides(r: UOp, n: int, loads: list[UOp]) -> bool:
  """Whether two of `loads` (inside loop `r` of n trips) read one buffer at addresses that move by the same step each
  trip of r and lie j steps apart, 1 <= j <= SLIDE_SHARE_TRIPS and j < n: what one reads, the other reads again j trips
  later."""
  seen: dict[tuple[UOp, int], list[int]] = {}
  for ld in loads:
    idx = ld.src[0].src[1]
    try: base = eval_index(idx, {})
    except (ValueError, ZeroDivisionError): continue   # an address loaded from memory
    if step := eval_index(idx, {r: 1}) - base: seen.setdefault((ld.src[0].src[0], step), []).append(base)
  return any((d := abs(a - b)) % step == 0 and 1 <= d // step <= min(SLIDE_SHARE_TRIPS, n - 1)
             for (_, step), bases in seen.items() for i, a in enumerate(bases) for b in bases[i + 1:])


def _vec(fn):  # a rule for vector values only
  return lambda ctx, x: fn(ctx, x, [ctx.r[s] for s in x.src]) if x.dtype.count > 1 else None


def _mask_rule(ctx, x: UOp) -> str | None:
  """Bool vectors are masks of 32-bit lanes (all ones: true), codegen/vectorize.py `_mask_op`: a WHERE over a mask
  selects bits, a CAST from one converts its negation (1 or 0 a lane), a CAST to one compares with 0, and a lane of
  one reads as a C truth value."""
  if x.op is Ops.GEP and x.src[0].dtype.scalar() == dtypes.bool and x.src[0].dtype.count > 1: return f"({ctx.r[x.src[0]]}[{x.arg[0]}]!=0)"
  if x.dtype.count == 1: return None
  a = [ctx.r[s] for s in x.src]
  if x.op in GroupOp.Comparison: return ctx.code_for_op[x.op](*a)   # C vector comparisons give -1/0 lanes
  if x.op is Ops.WHERE and x.src[0].dtype.count > 1:
    if x.dtype.scalar() == dtypes.bool: return f"(({a[1]}&{a[0]})|({a[2]}&~{a[0]}))"
    m, t = ctx.ctype(x.src[0].dtype), ctx.ctype(x.dtype)
    return f"(({t})(((({m}){a[1]})&{a[0]})|((({m}){a[2]})&~{a[0]})))"
  if x.op is Ops.CAST and x.src[0].dtype.scalar() == dtypes.bool: return f"__builtin_convertvector(-{a[0]}, {ctx.ctype(x.dtype)})"
  if x.op is Ops.CAST and x.dtype.scalar() == dtypes.bool: return f"({a[0]}!=0)"
  return None


pm_clang = PatternMatcher([
  (UPat(Ops.RANGE, name="x"), _loop),
  (UPat((Ops.GEP, Ops.WHERE, Ops.CAST, *GroupOp.Comparison), name="x"), _mask_rule),
  (UPat(Ops.INDEX, name="x"), _displaced_index),
  (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), allow_any_len=True, name="x"), _prefetched_load),
  # vector helpers of the prelude (_vector_prelude): fused multiply-add, NaN-propagating max, exp2 lane by lane
  (UPat(Ops.MULACC, name="x"), _vec(lambda ctx, x, a: f"pg_fma_{ctx.ctype(x.dtype)}({a[0]}, {a[1]}, {a[2]})" if dtypes.is_float(x.dtype) else None)),
  (UPat(Ops.MAX, name="x"), _vec(lambda ctx, x, a: None if x.dtype.scalar() in (dtypes.float16, dtypes.bfloat16) else
                                 f"pg_max_{ctx.ctype(x.dtype)}({a[0]}, {a[1]})")),
  (UPat(Ops.EXP2, dtypes.float32, name="x"), _vec(lambda ctx, x, a: f"pg_exp2f_{ctx.ctype(x.dtype)}({a[0]})")),
  (UPat(Ops.WMMA, dtypes.int32, name="x", arg="DOT2"), _vec(lambda ctx, x, a: f"pg_dot2_{ctx.ctype(x.dtype)}({a[0]}, {a[1]}, {a[2]})")),
  (UPat(Ops.WMMA, dtypes.int32, name="x", arg="DOT4"), _vec(lambda ctx, x, a: f"pg_dot4_{ctx.ctype(x.dtype)}({a[0]}, {a[1]}, {a[2]})")),
  # scalars: FMA builtins, the vectorizable exp2f
  (UPat(Ops.MULACC, (dtypes.float32, dtypes.float64), name="x"),
   lambda ctx, x: None if x.dtype.count > 1 else
   f"__builtin_fma{'f' if x.dtype == dtypes.float32 else ''}({ctx.r[x.src[0]]}, {ctx.r[x.src[1]]}, {ctx.r[x.src[2]]})"),
  (UPat(Ops.EXP2, dtypes.float32, name="x"), lambda ctx, x: None if x.dtype.count > 1 else f"pg_exp2f({ctx.r[x.src[0]]})"),
]) + CStyleRenderer.string_rewrite

class ClangRenderer(CStyleRenderer):
  """C for clang/gcc: the shared C-style renderer with host types, FMA for MULACC, the threaded kernel ABI, explicit SIMD
  through the compilers' vector extensions (`vector_size` types, codegen/vectorize.py) and software prefetch of the
  weight streams of matrix-vector products. Its rules (`pm_clang`) go in front of the base C rules."""
  name, device, suffix = "CLANG", "CPU", "CLANG"
  string_rewrite = pm_clang
  emulated = frozenset({dtypes.fp8e4m3, dtypes.fp8e5m2})  # C has no 8-bit floats; the device adds the 16-bit ones the compiler lacks
  # the capability record; CPUDevice completes it from the host (host_caps): the compiler, the SIMD shape, the caches
  caps = Capabilities(
    pad_windows=True,  # a conv's input padded once into a buffer: its taps then load without bounds tests (+12-30%)
    upcast_max=64,  # accumulators per loop iteration (32 AVX-512 or 16 AVX2 vector registers)
    dot2=True,  # WMMA "DOT2" (pairwise int16 multiply-add) on vectors: pg_dot2_T, pmaddwd on x86
    vector_ops=DEFAULT_VECTOR_OPS | {Ops.MAX, Ops.EXP2, Ops.SQRT, Ops.LOG2, Ops.SIN, Ops.TRUNC,   # the rest lane by lane in C
                                     Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE})  # comparisons give masks (see _mask_rule)
  prefetch_bytes = getenv("PREFETCH_BYTES", 4096)  # software prefetch distance of streamed loads (0: none), see _prefetched_load
  prefetch_trips = getenv("PREFETCH_TRIPS", 16)  # strided loads: prefetch this many reduce-loop trips ahead (0: none)
  unroll_sliding = getenv("UNROLL_SLIDING", 0)  # 1: let the compiler unroll the loops `sliding_loops` finds

  def vector_type(self, dt: DType) -> str:
    if dt.scalar() in self.emulated: return self.vector_type(dtypes.float32.vec(dt.count))   # emulated values are floats
    if dt.scalar() == dtypes.bool:   # a mask of 32-bit lanes (_mask_rule)
      self._vtypes[name := f"pg_mask{dt.count}"] = ("int", 4 * dt.count)
      return name
    if dt.itemsize & (dt.itemsize - 1): raise NotImplementedError(f"vector type {dt} is not a power-of-two number of bytes")
    name = f"pg_{self.ctype(dt.scalar()).replace(' ', '_')}{dt.count}"
    self._vtypes[name] = (self.ctype(dt.scalar()), dt.itemsize)
    return name

  def vector_literal(self, dt: DType, lanes: list[str]) -> str:
    if dt.scalar() == dtypes.bool: return f"(-{super().vector_literal(dt, lanes)})"   # truth values 1/0 -> masks -1/0
    return super().vector_literal(dt, lanes)

  def vector_from_storage(self, name: str, addr: str, dt: DType) -> str:
    """float16 lanes converted in hardware through clang's storage-only __fp16 vectors (vcvtph2ps with F16C; CPUDevice
    sets `f16_vectors` only then)."""
    if dt.scalar() != dtypes.float16: return super().vector_from_storage(name, addr, dt)
    h = f"pg_fp16_{dt.count}"
    self._vtypes[h] = ("__fp16", 2 * dt.count)
    f32 = self.ctype(dtypes.float32.vec(dt.count))
    return f"{{ {h} h_; __builtin_memcpy(&h_, &{addr}, sizeof(h_)); {name} = __builtin_convertvector(h_, {f32}); }}"

  def work_expr(self, uops: list[UOp]) -> str:
    """C expression (over the kernel's variables) estimating the ops the kernel executes: each op times its loop trips."""
    counts: dict[tuple, int] = {}  # ops per loop nest, so the sum stays short (a term per op nests past clang's limit)
    mult: list[int | UOp] = []
    for u in uops:
      if u.op is Ops.RANGE: mult.append(u.src[0].arg if u.src[0].op is Ops.CONST else u.src[0])
      elif u.op is Ops.END: mult.pop()
      elif u.op in GroupOp.ALU or u.op in (Ops.LOAD, Ops.STORE, Ops.CAST):  # a vector op counts once per lane
        counts[tuple(mult)] = counts.get(tuple(mult), 0) + (u.src[1] if u.op is Ops.STORE else u).dtype.count
    total: int | UOp = 0
    for ms, cnt in counts.items():
      p: int | UOp = cnt
      for m in ms: p = p * m
      total = total + p
    if isinstance(total, int): return f"{total}LL"
    def c(x: UOp) -> str:
      if x.op is Ops.CONST: return f"{int(x.arg)}LL"
      if x.op is Ops.DEFINE_VAR: return f"(long long){x.arg[0]}"
      if x.op in (Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX) and len(x.src) == 2: return self.code_for_op[x.op](c(x.src[0]), c(x.src[1]))
      raise NotImplementedError
    try: return c(total)
    except NotImplementedError: return f"{int(total.vmax)}LL"

  @staticmethod
  def reduce_load_steps(uops: list[UOp]) -> list[tuple[UOp, int]]:
    """(load, bytes its address moves per trip of the innermost reduce loop) for the vector loads of a buffer inside a
    reduce loop whose address moves with an output (global) range; loads whose address comes from memory are left out.
    A loop of one trip (a reduce range exactly one vector wide: its lanes' outer loop) is not the loop that streams."""
    out, stack = [], []   # the open loops of more than one trip
    for u in uops:
      if u.op is Ops.RANGE: stack.append(None if u.src[0].op is Ops.CONST and u.src[0].arg == 1 else u)
      elif u.op is Ops.END: stack.pop()
      elif u.op is Ops.LOAD and u.dtype.count > 1 and (inner := next((r for r in reversed(stack) if r is not None), None)) is not None \
           and inner.arg[1] == "reduce" and u.src[0].op is Ops.INDEX \
           and u.src[0].src[0].op is Ops.DEFINE_GLOBAL and any(x.op is Ops.RANGE and x.arg[1] == "global" for x in u.src[0].src[1].toposort()):
        idx = u.src[0].src[1]
        # the average step over the first trips: a sub-block read twice (two 4-bit fields of the same bytes) moves
        # 0 bytes one trip and 32 the next
        n = min(STEP_TRIPS, inner.src[0].arg) if inner.src[0].op is Ops.CONST else STEP_TRIPS
        try: out.append((u, (eval_index(idx, {inner: n}) - eval_index(idx, {})) * u.dtype.scalar().itemsize // n))
        except (ValueError, ZeroDivisionError): continue  # an address loaded from memory: not a stream
    return out

  @staticmethod
  def streamed_loads(uops: list[UOp]) -> set[UOp]:
    """Loads that walk memory forward in small steps (<= 128 bytes per reduce trip) while moving with an output range:
    each output row reads its own data once, so nothing brings it into cache early (the weights of a matrix-vector
    product; not a matmul's column panel, which is reused)."""
    return {u for u, step in ClangRenderer.reduce_load_steps(uops) if 0 < step <= 128}

  @staticmethod
  def strided_loads(uops: list[UOp]) -> dict[UOp, int]:
    """Loads that jump more than a page (4 KiB) per reduce trip while moving with an output range -> their step in
    bytes: e.g. the rows of B in a skinny matmul (B[k, n..n+32] for k = 0, 1, ...). The hardware prefetchers don't
    follow strides across pages, so each such load waits for memory unless prefetched some trips ahead."""
    return {u: step for u, step in ClangRenderer.reduce_load_steps(uops) if 4096 <= step <= (1 << 20)}

  @staticmethod
  def sliding_loops(uops: list[UOp], min_accs: int) -> set[UOp]:
    """Innermost reduce loops of at least SLIDE_MIN_TRIPS trips that update at least `min_accs` vector accumulators
    (a register tile) and read some element again a few trips later through another load of the tile (a weight
    gradient's window x[ow + kw] with the taps kw as the tile's rows: x[ow + 1] is read again at the next ow). clang 19
    tuning for Zen 3 (-march=znver3; the other x86 targets leave the loop rolled) unrolls such a loop by 2 and keeps
    those values in registers across the unrolled trips; with the tile's accumulators live that spills and rotates
    registers every trip (the 128x128 3x3 weight gradient at 28x28: 3.5 ms a core unrolled, 2.3 ms not, clang 14 2.4
    ms). The renderer keeps these loops rolled everywhere (UNROLL_SLIDING=1: not)."""
    out, stack = set(), []   # per open loop: [range, innermost, loads of buffers, vector accumulator updates]
    for u in uops:
      if u.op is Ops.RANGE: stack.append([u, True, [], 0])
      elif u.op is Ops.END:
        r, inner, loads, accs = stack.pop()
        if stack: stack[-1][1] = False
        n = r.src[0].arg if r.src[0].op is Ops.CONST else SLIDE_MIN_TRIPS
        if inner and r.arg[1] == "reduce" and accs >= min_accs and n >= SLIDE_MIN_TRIPS and _slides(r, n, loads): out.add(r)
      elif not stack: continue
      elif u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_GLOBAL: stack[-1][2].append(u)
      elif u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_REG and u.src[1].dtype.count > 1: stack[-1][3] += 1
    return out

  def render(self, name: str, uops: list) -> str:
    self._vtypes: dict[str, tuple[str, int]] = {}
    self._sliding = set() if self.unroll_sliding else self.sliding_loops(uops, max(2, self.caps.vector_regs // 2))
    self._streamed = self.streamed_loads(uops)
    self._strided = {u: step * self.prefetch_trips for u, step in self.strided_loads(uops).items()} if self.prefetch_trips else {}
    self._outer = next((u for u in uops if u.op is Ops.RANGE and u.arg[1] == "global"), None)
    self._vec_loops = self.vectorizable_reduce_loops(uops) if self.caps.vectorizes_reductions else set()
    body = self.render_body(uops)
    gl, vs = [u for u in uops if u.op is Ops.DEFINE_GLOBAL], [u for u in uops if u.op is Ops.DEFINE_VAR]
    params = ", ".join(self.render_params(uops) + ["const int core_id", "const int core_n"])
    guard = [] if self._outer is not None else ["  if (core_id != 0) return;"]
    args = ", ".join([f"({self.ctype(g.dtype)})bufs[{i}]" for i, g in enumerate(gl)] + [f"vals[{i}]" for i in range(len(vs))])
    var_decl = "".join(f"  const int {v.arg[0]} = vals[{i}];\n" for i, v in enumerate(vs))
    split = "1LL" if self._outer is None else (f"{self._outer.src[0].arg}LL" if self._outer.src[0].op is Ops.CONST else
                                               f"(long long){self.work_const(self._outer.src[0])}")
    prelude = ([EXP2F_SRC] if "pg_exp2f(" in "".join(body) else []) + ([pre] if (pre := self.emulation_prelude("".join(body))) else [])
    if self._vtypes: prelude.insert(0, _vector_prelude(self._vtypes, "\n".join(body), self.caps.dot4))
    return "\n".join([*prelude, f"static inline void {name}_k({params}) {{", *guard, *body, "}",
                      f"void {name}(void **bufs, const int *vals, int core_id, int core_n) {{",
                      f"  {name}_k({args}{', ' if args else ''}core_id, core_n);", "}",
                      f"long long {name}_work(const int *vals, long long *split) {{",
                      f"{var_decl}  (void)vals; *split = {split};", f"  return {self.work_expr(uops)};", "}",
                      *([f"const int {name}_work_vars = {len(vs)};"] if vs else []), ""])

  @staticmethod
  def vectorizable_reduce_loops(uops: list[UOp]) -> set[UOp]:
    """Innermost reduce loops that update exactly one scalar accumulator (register-blocked loops are vectorized by
    upcasting, loops with vector accumulators by codegen/vectorize.py)."""
    out, stack = set(), []
    for u in uops:
      if u.op is Ops.RANGE: stack.append([u, True, 0])
      elif u.op is Ops.END:
        r, inner, stores = stack.pop()
        if inner and stores == 1 and r.arg[1] == "reduce": out.add(r)
        if stack: stack[-1][1] = False
      elif u.op is Ops.STORE and stack and u.src[0].src[0].op is Ops.DEFINE_REG:
        stack[-1][2] += 1 if u.src[1].dtype.count == 1 else 2  # a vector accumulator: the loop is vectorized already
    return out

  def work_const(self, x: UOp) -> str:
    """An index expression over the kernel's variables as C (for the outer loop's trip count in `name_work`)."""
    if x.op is Ops.CONST: return str(int(x.arg))
    if x.op is Ops.DEFINE_VAR: return x.arg[0]
    if x.op in self.code_for_op and len(x.src) == 2: return self.code_for_op[x.op](self.work_const(x.src[0]), self.work_const(x.src[1]))
    return str(int(x.vmax))

class ClangCompiler(Compiler):
  """C source -> shared object with clang or gcc (CC overrides): -O2 -march=native (CPU_MARCH) -fPIC -shared, no
  fast-math."""
  FLAGS = ("-O2", "-march=native", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno")

  def __init__(self, cc: str | None = None) -> None:
    self.cc = cc or find_cc()
    if self.cc is None: raise RuntimeError("no C compiler found: install clang or gcc, or set CC")
    ver = subprocess.run([*self.cc.split(), "--version"], capture_output=True, text=True).stdout.splitlines()
    self.version = ver[0] if ver else "?"
    self.flags = tuple(f"-march={cpu_march()}" if f == "-march=native" else f for f in self.FLAGS) + \
      tuple(off for flag, off in WITHOUT_FLAGS.items() if flag in cpu_flags() and self.accepts(off))
    super().__init__(f"cc={self.cc} version={self.version} flags={' '.join(self.flags)}")

  def _probed(self, key: str, probe) -> bool:
    """`probe()` for this compiler, remembered on disk under `key` (with the compiler's identity)."""
    f = cache_dir() / "probe" / hashlib.sha256(f"{self.cc}|{self.version}|{key}".encode()).hexdigest()[:24]
    try:
      if (known := f.read_text()) in ("0", "1"): return known == "1"   # anything else (a torn write): probe again
    except OSError: pass
    ok = probe()
    try:
      f.parent.mkdir(parents=True, exist_ok=True)
      f.write_text("1" if ok else "0")
    except OSError: pass
    return ok

  def accepts(self, flag: str) -> bool:
    """Whether this compiler takes command-line `flag` (cached on disk)."""
    def probe() -> bool:
      with tempfile.TemporaryDirectory(prefix="plugrad-cc-") as d:
        return subprocess.run([*self.cc.split(), flag, "-x", "c", "-c", "-", "-o", os.path.join(d, "probe.o")], input="int pg_probe;\n",
                              capture_output=True, text=True).returncode == 0
    return self._probed(f"{flag}|flag", probe)

  def supports_type(self, ctype: str) -> bool:
    """Whether this compiler has arithmetic on `ctype` (e.g. _Float16) in a library that loads: clang 19 compiles
    __bf16 arithmetic into calls of compiler-rt's __truncsfbf2, which libgcc before GCC 13 lacks (an undefined symbol
    at load). The answer is cached on disk per compiler and flags."""
    def probe() -> bool:
      try: load_library(self.compile(f"{ctype} pg_probe({ctype} a, {ctype} b) {{ return a * b + ({ctype})1; }}\n"), f"the {ctype} probe")
      except (CompileError, RuntimeError): return False
      return True
    return self._probed(f"{' '.join(self.flags)}|{ctype}|loads", probe)

  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="plugrad-cc-") as d:
      out = os.path.join(d, "kernel.so")
      p = subprocess.run([*self.cc.split(), *self.flags, "-x", "c", "-", "-o", out], input=src, capture_output=True, text=True)
      if p.returncode != 0: raise CompileError(f"{self.cc} failed with exit code {p.returncode}", p.stderr, src)
      with open(out, "rb") as f: return f.read()

def load_library(lib: bytes, what: str) -> ctypes.CDLL:
  """dlopen a shared object given as bytes: written to a temporary file that is removed on every path (success or not)
  once loaded; a library the loader rejects is a RuntimeError naming `what`, not a temp file."""
  fd, path = tempfile.mkstemp(suffix=".so", prefix="plugrad-")
  try:
    with os.fdopen(fd, "wb") as f: f.write(lib)
    try: return ctypes.CDLL(path)
    except OSError as e:
      why = str(e).replace(path, "<library>")
      raise RuntimeError(f"CPU: can't load the compiled library of {what} ({len(lib)} bytes): {why}") from None
  finally: os.unlink(path)

class CPUProgram(Program):
  """Loads a shared object with ctypes. Threaded kernels (with `name_work`) go through the C pool; others are called
  directly as `name(*buffer pointers, *int32 vals)`."""
  def __init__(self, dev: Compiled, name: str, lib: bytes) -> None:
    super().__init__(dev, name, b"")   # the loaded library needs its bytes no more (SmolLM2's 79 kernels: 1.3 MB)
    self._dll = load_library(lib, f"kernel {name!r}")
    try: self.fn = getattr(self._dll, name)
    except AttributeError: raise RuntimeError(f"compiled CPU library has no function {name!r}") from None
    self.fn.restype = None
    self.work = getattr(self._dll, name + "_work", None)
    if self.work is not None:
      self._fn_ptr, self._work_ptr = ctypes.cast(self.fn, ctypes.c_void_p).value, ctypes.cast(self.work, ctypes.c_void_p).value
      self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
      self.work.restype, self.work.argtypes = ctypes.c_longlong, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_longlong)]
      self._split = ctypes.c_longlong(1)
      self._arg_cache: dict[tuple, tuple] = {}  # buffer ids -> (weakrefs to the buffers, their pointer array)
      self._no_vals = (ctypes.c_int32 * 1)()
      self._const_work: tuple[int, int] | None = None  # (work, outer trips) when they don't depend on variables
      if not hasattr(self._dll, name + "_work_vars"): self._const_work = (self.work(None, ctypes.byref(self._split)), self._split.value)

  def _args(self, bufs: tuple, vals: tuple[int, ...]) -> tuple[Any, Any]:
    """The C arrays of buffer pointers (reused for the same buffers, by identity, held weakly: a JIT replay launches each
    kernel with the same buffers, and `ndarray.ctypes.data` costs ~1.5 us per buffer) and values."""
    cvals = self._no_vals if not vals else (ctypes.c_int32 * len(vals))(*vals)
    key = tuple(map(id, bufs))
    if (hit := self._arg_cache.get(key)) is not None:
      for w, b in zip(hit[0], bufs):
        if w() is not b: break
      else: return hit[1], cvals
    cbufs = (ctypes.c_void_p * max(len(bufs), 1))(*[b.ctypes.data for b in bufs])
    if len(self._arg_cache) >= 256: self._arg_cache.clear()
    self._arg_cache[key] = (tuple(weakref.ref(b) for b in bufs), cbufs)
    return cbufs, cvals

  def threads_for(self, vals: tuple[int, ...] = (), cvals: Any = None) -> int:
    """How many cores a launch with `vals` uses (estimated work / MIN_WORK_PER_THREAD, capped by CPU_THREADS and the outer loop)."""
    if self.work is None: return 1
    if self._const_work is not None: w, split = self._const_work
    else:
      w = self.work(cvals if cvals is not None else (ctypes.c_int32 * max(len(vals), 1))(*vals), ctypes.byref(self._split))
      split = self._split.value
    return max(1, min(self.dev.threads, w // MIN_WORK_PER_THREAD, split))

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    if local_size is not None or global_size != (1, 1, 1): self.check_launch(global_size, local_size)
    st = time.perf_counter() if wait else 0.0
    if self.work is None: self.fn(*[ctypes.c_void_p(b.ctypes.data) for b in bufs], *[ctypes.c_int32(v) for v in vals])
    else:
      cbufs, cvals = self._args(bufs, vals)
      if (cw := self._const_work) is not None: n = max(1, min(self.dev.threads, cw[0] // MIN_WORK_PER_THREAD, cw[1]))
      else: n = self.threads_for(vals, cvals)
      if n == 1 and not _FTZ[0]: self.fn(cbufs, cvals, 0, 1)  # small kernels never touch the pool: run on the calling thread
      else: self.dev.pool_launch(self._fn_ptr, self._work_ptr, cbufs, cvals, self.dev.threads, MIN_WORK_PER_THREAD)
    return time.perf_counter() - st if wait else None

  def launch(self, *bufs: Any) -> None:
    """`self(*bufs)` without the keyword handling: the realize plans' direct path (threaded kernels of constant work)."""
    if self.work is None or (cw := self._const_work) is None:
      self(*bufs)
      return
    cbufs, cvals = self._args(bufs, ())
    if max(1, min(self.dev.threads, cw[0] // MIN_WORK_PER_THREAD, cw[1])) == 1 and not _FTZ[0]: self.fn(cbufs, cvals, 0, 1)
    else: self.dev.pool_launch(self._fn_ptr, self._work_ptr, cbufs, cvals, self.dev.threads, MIN_WORK_PER_THREAD)

class CPUDevice(Compiled):
  smoke_kernel = "void smoke(int *a) { for (int i = 0; i < 3; i++) a[i] *= 2; }"

  def __init__(self, device: str) -> None:
    # CPU:0, CPU:1, ... are independent devices (own allocator and buffers) sharing the process-wide worker pool, whose
    # launches are serialized: a kernel of any CPU device may use CPU_THREADS cores while it runs; CPU_THREADS_<i> caps CPU:i
    idx = parse_device(device).index
    self.threads = getenv(f"CPU_THREADS_{idx}", getenv("CPU_THREADS", os.cpu_count() or 1))
    if self.threads < 1:
      raise ValueError(f"CPU_THREADS{'_' + str(idx) if os.environ.get(f'CPU_THREADS_{idx}') else ''} must be >= 1, got {self.threads}")
    super().__init__(device, CPUAllocator(), [ClangRenderer], ClangCompiler(), CPUProgram)
    if isinstance(self.renderer, ClangRenderer): self.renderer.caps = host_caps(self.renderer.caps, self.compiler.cc)
    if isinstance(self.renderer, CStyleRenderer):  # 16-bit floats the compiler lacks (clang < 15: _Float16, gcc < 13: __bf16)
      self.renderer.emulated = type(self.renderer).emulated | frozenset(dt for dt, t in ((dtypes.float16, "_Float16"), (dtypes.bfloat16, "__bf16"))
                                         if not self.compiler.supports_type(t))
    if isinstance(self.renderer, ClangRenderer):  # F16C converts float16 vectors: native _Float16 ones, or clang's __fp16
      self.renderer.caps = dataclasses.replace(self.renderer.caps, f16_vectors="f16c" in cpu_flags() and (
        dtypes.float16 not in self.renderer.emulated or "clang" in os.path.basename(self.compiler.cc.split()[0])))

  def _pool_lib(self) -> Any:
    """The process-wide thread pool library for this device's compiler (compiled and loaded on first use)."""
    if (lib := _POOLS.get(self.compiler.cachekey)) is None:
      lib = load_library(self.compiler.compile_cached(POOL_SRC), "the thread pool")
      p = ctypes.c_void_p
      lib.plugrad_pool_launch.restype, lib.plugrad_pool_launch.argtypes = ctypes.c_int, [p, p, p, p, ctypes.c_int, ctypes.c_longlong]
      lib.plugrad_batch_run.restype, lib.plugrad_batch_run.argtypes = None, [p, ctypes.c_int, p, ctypes.c_int, ctypes.c_longlong, p]
      lib.plugrad_pool_set_ftz.restype, lib.plugrad_pool_set_ftz.argtypes = None, [ctypes.c_int]
      lib.plugrad_pool_set_ftz(int(_FTZ[0]))
      lib.plugrad_pool_set_spin_ns.restype, lib.plugrad_pool_set_spin_ns.argtypes = None, [ctypes.c_longlong]
      lib.plugrad_pool_spin_ns.restype, lib.plugrad_pool_spin_ns.argtypes = ctypes.c_longlong, []
      lib.plugrad_pool_set_spin_ns(spin_us() * 1000)
      _POOLS[self.compiler.cachekey] = lib
    return lib

  @property
  def flush_denormals(self) -> bool:
    """Whether kernels run with float32 subnormals flushed to zero (inputs and results; `CPU_FTZ=1` at start). Off by
    default (numpy's results); on, a kernel whose products fall below 1.2e-38 (a training step's tiny gradients) avoids
    the CPU's slow microcode path for them. Process-wide: every CPU device shares the worker pool."""
    return _FTZ[0]

  @flush_denormals.setter
  def flush_denormals(self, on: bool) -> None:
    _FTZ[0] = bool(on)   # (the single-core fast paths then go through the pool, which switches the mode)
    self._pool_lib().plugrad_pool_set_ftz(int(_FTZ[0]))

  @property
  def pool_launch(self) -> Any:
    """`plugrad_pool_launch` of the process-wide thread pool for this device's compiler."""
    return self._pool_lib().plugrad_pool_launch

  def batch_runner(self, items: list) -> CPUBatch | None:
    """A runner of these ExecItems (compiled threaded kernels of this device, in order) as one C call, or None when
    some kernel can't go into a batch (a hand-written kernel without `name_work`). See CPUBatch."""
    if not items or any(ei.runner is None or not isinstance(ei.runner.prg, CPUProgram) or ei.runner.prg.work is None
                        or ei.runner.prg.dev is not self for ei in items): return None
    return CPUBatch(self, items)

class _Entry(ctypes.Structure):
  _fields_ = [("fn", ctypes.c_void_p), ("work", ctypes.c_void_p), ("bufs", ctypes.c_void_p), ("vals", ctypes.c_void_p),
              ("var_idx", ctypes.c_void_p), ("nvars", ctypes.c_longlong), ("work_c", ctypes.c_longlong), ("split_c", ctypes.c_longlong)]

class CPUBatch:
  """Captured kernels run in order by one C call (`plugrad_batch_run`), each on one core or the pool exactly as
  CPUProgram.__call__ would. The kernels' variables are indices into one int array filled per call from `var_vals`;
  `__call__(var_vals, slots)` re-reads the buffer pointers of the (item, buffer) `slots` that may have changed (the
  JIT's input slots); every other buffer pointer is fixed at construction."""
  def __init__(self, dev: CPUDevice, items: list) -> None:
    self.dev, self.items, self._run = dev, items, dev._pool_lib().plugrad_batch_run
    self.var_names = sorted({v.arg[0] for ei in items for v in ei.runner.spec.vars})
    pos = {n: i for i, n in enumerate(self.var_names)}
    self._gvals = (ctypes.c_int32 * max(len(self.var_names), 1))()
    self._entries = (_Entry * len(items))()
    self._bufs, self._keep, self._last = [], [], {}  # per item its pointer array; value/index arrays kept alive; slot -> ndarray
    for e, ei in zip(self._entries, items):
      prg: CPUProgram = ei.runner.prg
      cbufs = (ctypes.c_void_p * max(len(ei.bufs), 1))(*[b._buf.ctypes.data for b in ei.bufs])
      names = [v.arg[0] for v in ei.runner.spec.vars]
      vals, idx = (ctypes.c_int32 * max(len(names), 1))(), (ctypes.c_int32 * max(len(names), 1))(*[pos[n] for n in names])
      w, split = prg._const_work if prg._const_work is not None else (-1, 1)
      e.fn, e.work, e.bufs, e.vals, e.var_idx = prg._fn_ptr, prg._work_ptr, ctypes.addressof(cbufs), ctypes.addressof(vals), ctypes.addressof(idx)
      e.nvars, e.work_c, e.split_c = len(names), w, split
      self._bufs.append(cbufs); self._keep += [vals, idx]

  def __call__(self, var_vals: dict[str, int], slots: list[tuple[int, int]] = (), prof: Any = None) -> None:
    for k, n in enumerate(self.var_names):
      if (v := var_vals.get(n)) is None: raise RuntimeError(f"kernel needs a value for variable {n!r}, which was not bound")
      self._gvals[k] = v
    for i, j in slots:
      arr = self.items[i].bufs[j]._buf
      if self._last.get((i, j)) is not arr: self._bufs[i][j], self._last[(i, j)] = arr.ctypes.data, arr
    self._run(self._entries, len(self.items), self._gvals, self.dev.threads, MIN_WORK_PER_THREAD, prof)

  def profile(self, var_vals: dict[str, int], slots: list[tuple[int, int]] = ()) -> list[tuple[float, int]]:
    """Run once like `__call__`, returning per item (seconds from the end of the previous kernel, cores used): the
    kernels' times in place, with the caches as the replay leaves them (not each kernel warmed up alone)."""
    prof = (ctypes.c_longlong * (2 * len(self.items)))()
    self(var_vals, slots, ctypes.addressof(prof))
    return [(prof[2 * i] * 1e-9, prof[2 * i + 1]) for i in range(len(self.items))]

_FTZ = [bool(getenv("CPU_FTZ", 0))]  # Device.flush_denormals, process-wide like the pool
_POOLS: dict[str | None, Any] = {}  # one pool (one set of worker threads) per compiler per process
