"""clang-19 + ld.lld-19 compile every kernel the conformance suite produces (collected on the NULL device, rendered for
gfx1100, gfx1201, gfx942 and gfx90a) plus a sweep of every ALU op / cast / bitcast over every dtype, to HSA code
objects (ELF, e_machine AMDGPU) with one kernel descriptor per kernel. No GPU needed."""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugrad.codegen import get_program
from plugrad.dtype import dtypes
from plugrad.runtime.compiler import CompileError
from plugrad.uop.ops import Ops, UOp
from plugrad_amd.compiler import EM_AMDGPU, AMDGPUCompiler, elf_machine, elf_symbols, unpack
from plugrad_amd.renderer import AMDGPURenderer

from amd_helpers import compile_batched  # tests/amd is on sys.path (pytest's rootdir-relative import of test modules)

HERE = Path(__file__).parent
ARCHS = ["gfx1100", "gfx1201", "gfx942", "gfx90a"]
pytestmark = pytest.mark.skipif(shutil.which("clang-19") is None or shutil.which("ld.lld-19") is None,
                                reason="clang-19/lld-19 not installed (make sysdeps)")
DTS = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64,
       dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64, dtypes.fp8e4m3, dtypes.fp8e5m2]


def gl(slot: int, size: int, dt) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), arg=slot)


def sweep_asts() -> list[tuple[str, UOp]]:
  """(description, kernel) per (dtype, op): binary/unary ALU, comparisons, where, every cast pair, same-size bitcasts, reduces."""
  i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 64),), arg=(0, "global"))
  def kernel(out_dt, val: UOp) -> UOp:
    return UOp.sink_of(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, gl(0, 64, out_dt).dtype, (gl(0, 64, out_dt), i)), val)))
  def ld(dt, slot: int) -> UOp: return UOp(Ops.LOAD, dt, (UOp(Ops.INDEX, gl(slot, 64, dt).dtype, (gl(slot, 64, dt), i)),))
  out = []
  for dt in DTS:
    a, b = ld(dt, 1), ld(dt, 2)
    isf, isb = dtypes.is_float(dt), dt == dtypes.bool
    cmp = [Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]
    ops = [Ops.ADD, Ops.MUL, Ops.MAX, *cmp] if not isb else [Ops.AND, Ops.OR, Ops.XOR, Ops.MAX, *cmp]
    if isf: ops += [Ops.FDIV, Ops.SUB, Ops.POW]
    elif not isb: ops += [Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.SUB]
    for op in ops: out.append((f"{op.name} {dt}", kernel(dtypes.bool if op in cmp else dt, UOp(op, dtypes.bool if op in cmp else dt, (a, b)))))
    for op in [Ops.NEG] + ([Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC, Ops.RECIPROCAL] if isf else []):
      out.append((f"{op.name} {dt}", kernel(dt, UOp(op, dt, (a,)))))
    if isf: out.append((f"MULACC {dt}", kernel(dt, UOp(Ops.MULACC, dt, (a, b, a)))))
    out.append((f"WHERE {dt}", kernel(dt, UOp(Ops.WHERE, dt, (ld(dtypes.bool, 3), a, b)))))
    for op in (Ops.ADD, Ops.MAX):
      r = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 16),), arg=(1, "reduce"))
      x = UOp(Ops.LOAD, dt, (UOp(Ops.INDEX, gl(1, 1024, dt).dtype, (gl(1, 1024, dt), i * 16 + r)),))
      out.append((f"REDUCE {op.name} {dt}", kernel(dt, UOp(Ops.REDUCE, dt, (x, r), op))))
  for s, d in itertools.product(DTS, DTS):
    if s != d: out.append((f"CAST {s} -> {d}", kernel(d, ld(s, 1).cast(d))))
    if s != d and s.itemsize == d.itemsize and dtypes.bool not in (s, d):
      out.append((f"BITCAST {s} -> {d}", kernel(d, UOp(Ops.BITCAST, d, (ld(s, 1),)))))
  return out


FP8 = (dtypes.fp8e4m3, dtypes.fp8e5m2)


@pytest.fixture(scope="module")
def conformance(tmp_path_factory) -> dict:
  out = tmp_path_factory.mktemp("amdk") / "kernels.json"
  env = {**os.environ, "DEV": "NULL", "PYTEST_XDIST_WORKER": ""}
  p = subprocess.run([sys.executable, str(HERE / "collect_kernels.py"), str(out), ",".join(ARCHS), "--pyargs", "plugrad.testing", "-p", "no:xdist"],
                     capture_output=True, text=True, env=env, timeout=600)
  assert out.exists(), f"kernel collection failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
  return json.loads(out.read_text())


@pytest.mark.parametrize("arch", ARCHS)
def test_conformance_kernels_compile(conformance: dict, arch: str):
  kernels, errors = conformance["kernels"][arch], conformance["errors"][arch]
  assert not errors, f"AMDGPU renderer ({arch}) failed on conformance kernels: {errors[:3]}"
  assert len(kernels) > 100, f"only {len(kernels)} kernels collected"
  found, failures = compile_batched([s for _, s in kernels], arch)
  assert not failures, f"{len(failures)} kernel(s) failed to compile for {arch}; first:\n{failures[0]}"
  assert found == len(kernels)


def test_no_metadata_comments_in_conformance_kernels(conformance: dict):
  """No kernel source of the conformance collection, for any arch, carries metadata in a comment (LLVM IR comments
  start with ';', and no rendered line has one anywhere): launch sizes travel in ProgramSpec, the arch in the
  `target-cpu` attribute and the code object's packing."""
  for arch, kernels in conformance["kernels"].items():
    assert len(kernels) > 100, f"only {len(kernels)} kernels collected for {arch}"
    for name, src in kernels:
      assert ";" not in src, (arch, name, [ln for ln in src.splitlines() if ";" in ln][:3])
      assert f'"target-cpu"="{arch}"' in src, (arch, name)


@pytest.mark.parametrize("arch", ARCHS)
def test_op_and_cast_sweep_compiles(arch: str):
  """Every op/dtype/cast renders and compiles on every arch, fp8 included (software conversions, no refusals)."""
  ren = AMDGPURenderer(arch)
  srcs = [get_program(ast, ren).src for _, ast in sweep_asts()]
  found, failures = compile_batched(srcs, arch)
  assert not failures, f"{len(failures)} sweep kernel(s) failed on {arch}; first:\n{failures[0]}"
  assert found == len(srcs)


def test_code_object_is_amdgpu_elf_with_descriptor(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  c = AMDGPUCompiler("gfx1100")
  src = get_program(sweep_asts()[0][1], AMDGPURenderer("gfx1100")).src
  lib = c.compile_cached(src)
  assert c.compile_cached(src) == lib and c.hits == 1 and c.misses == 1
  meta, elf = unpack(lib)
  assert elf[:4] == b"\x7fELF" and elf_machine(elf) == EM_AMDGPU == 224
  syms = elf_symbols(elf)
  name = next(s for s in syms if s.endswith(".kd"))
  assert syms[name][1] == 64 and meta == {"arch": "gfx1100"}  # no launch sizes: they travel in ProgramSpec
  assert "gfx1100" in c.cachekey and "clang" in c.cachekey
  if shutil.which("llvm-objdump-19"): assert "s_endpgm" in c.disassemble(lib)


def test_compile_error_shows_log_and_source():
  c = AMDGPUCompiler("gfx1100")
  bad = ('target triple = "amdgcn-amd-amdhsa"\ndefine amdgpu_kernel void @k(ptr addrspace(1) %data0) {\nentry:\n  store float %undefined_thing, '
         'ptr addrspace(1) %data0\n  ret void\n}\n')
  with pytest.raises(CompileError) as ei: c.compile(bad)
  msg = str(ei.value)
  assert "clang-19 failed for gfx1100" in msg and "undefined_thing" in ei.value.log and "2 | define amdgpu_kernel" in msg
  with pytest.raises(CompileError, match="defines no amdgpu_kernel"): c.compile('target triple = "amdgcn-amd-amdhsa"\n')


def test_unknown_arch_is_a_clear_error():
  with pytest.raises(ValueError, match="gfx1100"): AMDGPUCompiler("gfx1")
  with pytest.raises(ValueError, match="AMDGPU arch must be one of"): AMDGPURenderer("sm_90")
