"""NVRTC compiles every kernel the conformance suite produces (collected on the NULL device, rendered for sm_90), a
sweep of every ALU op / cast / bitcast over every dtype, and the hand-built GPU programs (SPECIAL ids, shared memory,
barriers, IF, mma.sync f16/bf16 tensor cores: gpu_programs.py), to a cubin and through PTX + ptxas. No GPU needed;
skipped when the NVRTC wheel (plugins/nv[test]) isn't installed."""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugrad.codegen import get_program
from plugrad.dtype import dtypes
from plugrad.runtime.compiler import CompileError
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp
from plugrad_nv.renderer import CUDARenderer

sys.path.insert(0, str(Path(__file__).parent))
from gpu_programs import group_sum_program, scale_program, wmma_program

HERE = Path(__file__).parent
BATCH = 120  # kernels per NVRTC translation unit (one big compile is much faster than many small ones)


def nvrtc_compiler(ptx: bool = False):
  from plugrad_nv.compiler import NVRTCCompiler
  try: return NVRTCCompiler("sm_90", ptx=ptx)
  except OSError as e: pytest.skip(f"NVRTC not installed ({e}); pip install -e 'plugins/nv[test]'")


def gl(slot: int, size: int, dt) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), arg=slot)


def sweep_asts() -> list[UOp]:
  """One kernel per (dtype, op): binary/unary ALU, comparisons, where, every cast pair, same-size bitcasts, sum/max reduce."""
  dts = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64,
         dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64, dtypes.fp8e4m3, dtypes.fp8e5m2]
  i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 64),), arg=(0, "global"))
  def kernel(out_dt, val: UOp) -> UOp:
    return UOp.sink_of(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, gl(0, 64, out_dt).dtype, (gl(0, 64, out_dt), i)), val)))
  def ld(dt, slot: int) -> UOp: return UOp(Ops.LOAD, dt, (UOp(Ops.INDEX, gl(slot, 64, dt).dtype, (gl(slot, 64, dt), i)),))
  asts = []
  for dt in dts:
    a, b = ld(dt, 1), ld(dt, 2)
    isf, isb = dtypes.is_float(dt), dt == dtypes.bool
    cmp = [Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]
    ops = [Ops.ADD, Ops.MUL, Ops.MAX, *cmp] if not isb else [Ops.AND, Ops.OR, Ops.XOR, Ops.MAX, *cmp]
    if isf: ops += [Ops.FDIV, Ops.SUB]
    elif not isb: ops += [Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.SUB]
    for op in ops:
      out = dtypes.bool if op in cmp else dt
      asts.append(kernel(out, UOp(op, out, (a, b))))
    unary = [Ops.NEG] + ([Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC, Ops.RECIPROCAL] if isf else [])
    for op in unary: asts.append(kernel(dt, UOp(op, dt, (a,))))
    if isf: asts.append(kernel(dt, UOp(Ops.MULACC, dt, (a, b, a))))
    asts.append(kernel(dt, UOp(Ops.WHERE, dt, (ld(dtypes.bool, 3), a, b))))
    for op in (Ops.ADD, Ops.MAX):
      r = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 16),), arg=(1, "reduce"))
      x = UOp(Ops.LOAD, dt, (UOp(Ops.INDEX, gl(1, 1024, dt).dtype, (gl(1, 1024, dt), i * 16 + r)),))
      asts.append(kernel(dt, UOp(Ops.REDUCE, dt, (x, r), op)))
  for s, d in itertools.product(dts, dts):
    if s != d: asts.append(kernel(d, ld(s, 1).cast(d)))
    if s != d and s.itemsize == d.itemsize and dtypes.bool not in (s, d): asts.append(kernel(d, UOp(Ops.BITCAST, d, (ld(s, 1),))))
  return asts


def rename(src: str, k: int) -> str:
  return re.sub(r'(void __launch_bounds__\(\d+\) )(\w+)\(', lambda m: f"{m.group(1)}k{k}_{m.group(2)}(", src, count=1)


def compile_all(sources: list[str], ptx: bool) -> None:
  """Compile in batches; a failing batch is retried kernel by kernel so the failure names the kernel with NVRTC's log."""
  c = nvrtc_compiler(ptx)
  failures = []
  for start in range(0, len(sources), BATCH):
    chunk = [rename(s, k) for k, s in enumerate(sources[start:start + BATCH], start)]
    try:
      out = c.nvrtc_compile("\n".join(chunk), ptx=ptx)
      if ptx: kind, out = c.assemble(out, "")
      assert out[:4] == b"\x7fELF", "expected a cubin (ELF)"
    except CompileError:
      for s in chunk:
        try: c.compile(s)
        except CompileError as e: failures.append(str(e)[:4000])
  assert not failures, f"{len(failures)} kernel(s) failed to compile; first:\n{failures[0]}"


@pytest.fixture(scope="module")
def conformance_sources(tmp_path_factory) -> list[str]:
  nvrtc_compiler()
  out = tmp_path_factory.mktemp("nvk") / "kernels.json"
  env = {**os.environ, "DEV": "NULL", "PYTEST_XDIST_WORKER": ""}
  p = subprocess.run([sys.executable, str(HERE / "collect_kernels.py"), str(out), "--pyargs", "plugrad.testing", "-p", "no:xdist"],
                     capture_output=True, text=True, env=env, timeout=300)
  assert out.exists(), f"kernel collection failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
  data = json.loads(out.read_text())
  assert not data["errors"], f"CUDA renderer failed on conformance kernels: {data['errors'][:3]}"
  assert len(data["kernels"]) > 100, f"only {len(data['kernels'])} kernels collected:\n{p.stdout[-2000:]}"
  ren = CUDARenderer()
  return [s for _, s in data["kernels"]] + [get_program(a, ren).src for a in sweep_asts()] + gpu_program_sources()


def gpu_program_sources() -> list[str]:
  n = UOp(Ops.DEFINE_VAR, dtypes.int32, arg=("n", 1, 4096))
  progs = [scale_program(300), scale_program(n), group_sum_program(9), wmma_program(dtypes.float16), wmma_program(dtypes.bfloat16)]
  return [CUDARenderer().render("gpu_program", uops) for uops, _, _ in progs]


def test_gpu_ops_compile_and_use_tensor_cores():
  """The GPU ops compile for sm_90 one by one; the mma helpers really become HMMA instructions (the PTX shows mma.sync)."""
  c = nvrtc_compiler(ptx=True)
  for src in gpu_program_sources():
    ptx = c.nvrtc_compile(src, ptx=True).decode()
    if "pg_wmma" in src: assert "mma.sync.aligned.m16n8k16.row.col.f32" in ptx
    if "__syncthreads" in src: assert "bar.sync" in ptx
    if "__shared__" in src: assert ".shared" in ptx
    assert nvrtc_compiler().compile(src)[8:] != b""


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_tiled_tensor_core_matmul_compiles(dt):
  """The GPU heuristic's matmul (2 x 2 warps, 4 x 8 mma tiles each, A/B and the output staged in shared memory) for
  sm_90: 16-byte global loads and stores, 16-byte shared stores of A/B, one bar.sync per K step (and one before the
  output is written) and 32 mma.sync per warp and step in the PTX."""
  a = Tensor.empty(256, 256, dtype=dt, device="CPU")
  spec = get_program((a @ a).schedule(optimize=False)[-1].ast, CUDARenderer())
  assert spec.global_size == [2, 2, 1] and spec.local_size == [32, 2, 2]
  ptx = nvrtc_compiler(ptx=True).nvrtc_compile(spec.src, ptx=True).decode()
  pats = (r"ld\.global(\.nc)?\.v4\.u32", r"st\.global\.v4\.u32", r"st\.shared\.v4\.u32", r"bar\.sync", r"mma\.sync\.aligned\.m16n8k16")
  count = {p: len(re.findall(p, ptx)) for p in pats}
  assert list(count.values()) == [4, 16, 4, 2, 32], count
  if dt == dtypes.float16: assert nvrtc_compiler().compile(spec.src)[8:] != b""  # and to a cubin (bf16: the PTX above is the check)


def test_conformance_kernels_compile_to_cubin(conformance_sources: list[str]):
  compile_all(conformance_sources, ptx=False)


@pytest.mark.parametrize("assembler", ["ptxas", "nvjitlink"])
def test_conformance_kernels_compile_via_ptx(conformance_sources: list[str], assembler: str, monkeypatch: pytest.MonkeyPatch):
  """NVRTC -> PTX for compute_90, assembled to an sm_90 cubin by ptxas (CUDA toolkit) or nvJitLink (wheel)."""
  if assembler == "ptxas" and not (os.environ.get("PTXAS") or shutil.which("ptxas")): pytest.skip("ptxas not on PATH (CUDA toolkit); set PTXAS")
  if assembler == "nvjitlink":
    if os.environ.get("PTXAS") or shutil.which("ptxas"): pytest.skip("ptxas covers the PTX path here (test budget)")
    from plugrad_nv.libload import LazyLibrary
    if not LazyLibrary("libnvJitLink", ("libnvJitLink.so.13", "libnvJitLink.so.12")).available: pytest.skip("nvJitLink wheel not installed")
    import plugrad_nv.compiler
    monkeypatch.delenv("PTXAS", raising=False)
    monkeypatch.setattr(plugrad_nv.compiler.shutil, "which", lambda name: None)
  compile_all(conformance_sources, ptx=True)


def test_ptx_via_nvjitlink():
  from plugrad_nv.compiler import jitlink_ptx
  c = nvrtc_compiler(ptx=True)
  src = get_program(sweep_asts()[0], CUDARenderer()).src
  try: cubin = jitlink_ptx(c.nvrtc_compile(src, ptx=True), "sm_90")
  except OSError as e: pytest.skip(f"nvJitLink not installed: {e}")
  assert cubin[:4] == b"\x7fELF"


def test_compile_error_shows_log_and_source():
  c = nvrtc_compiler()
  bad = 'extern "C" __global__ void __launch_bounds__(1) k(float* data0) { data0[0] = undefined_thing; }\n'
  with pytest.raises(CompileError) as ei: c.compile(bad)
  msg = str(ei.value)
  assert "NVRTC" in msg and "sm_90" in msg and "undefined_thing" in ei.value.log and "1 | extern" in msg


def test_compile_cache_and_packing(tmp_path, monkeypatch):
  from plugrad_nv.compiler import unpack
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  c = nvrtc_compiler()
  src = get_program(sweep_asts()[1], CUDARenderer()).src
  lib = c.compile_cached(src)
  assert c.compile_cached(src) == lib and c.hits == 1 and c.misses == 1
  meta, binary = unpack(lib)
  assert meta == {"kind": "cubin", "arch": "sm_90"} and binary[:4] == b"\x7fELF"
  assert "nvrtc=" in c.cachekey and "sm_90" in c.cachekey
