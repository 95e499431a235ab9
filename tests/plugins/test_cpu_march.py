"""CPU_MARCH: the -march CPU kernels compile for, and the capability record (vector lanes and registers, byte dot
products) that follows from the instruction sets the compiler enables for it, checked against the host's; and
`simd_caps` for named flag sets (what the `cpu_host` fixture applies)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import plugrad_cpu.device as cpu

X86 = "avx2" in cpu.host_flags()
needs_x86 = pytest.mark.skipif(not X86, reason="x86-64 -march targets need an x86 host with AVX2")


def test_simd_caps_of_each_host_kind():
  assert cpu.simd_caps(cpu.HOST_KINDS["avx2"]) == {"vector_lanes": 8, "vector_regs": 16, "dot4": 127}
  assert cpu.simd_caps(cpu.HOST_KINDS["avx512"]) == {"vector_lanes": 16, "vector_regs": 32, "dot4": 255}
  assert cpu.simd_caps(frozenset({"asimd"})) == {"vector_lanes": 4, "vector_regs": 32, "dot4": 0}
  assert cpu.simd_caps(frozenset({"avx2", "avx_vnni"}))["dot4"] == 255   # AVX-VNNI without AVX-512


@needs_x86
def test_march_flags_follow_the_compiler(monkeypatch):
  monkeypatch.setenv("CPU_MARCH", "x86-64-v3")
  flags = cpu.cpu_flags()
  assert {"avx2", "fma", "f16c"} <= flags and not flags & {"avx512f", "avx512_vnni", "avx_vnni"}
  assert cpu.simd_caps() == cpu.simd_caps(cpu.HOST_KINDS["avx2"])
  cc = cpu.ClangCompiler()
  assert "-march=x86-64-v3" in cc.flags and "-march=x86-64-v3" in cc.cachekey
  monkeypatch.delenv("CPU_MARCH")
  assert cpu.cpu_flags() == cpu.host_flags() and cpu.ClangCompiler().cachekey != cc.cachekey


@needs_x86
def test_a_target_the_host_cannot_run_is_refused(monkeypatch):
  monkeypatch.setattr(cpu, "host_flags", lambda: cpu.HOST_KINDS["avx2"])
  monkeypatch.setenv("CPU_MARCH", "x86-64-v4")
  with pytest.raises(ValueError, match=r"CPU_MARCH=x86-64-v4 needs avx512f.*which this CPU lacks"): cpu.cpu_flags()


@pytest.mark.parametrize("march,why", [("no-such-cpu", "rejects -march=no-such-cpu"), ("a b", "must be a compiler -march name"),
                                       ("-O0", "must be a compiler -march name")])
def test_bad_targets_are_refused_with_their_name(march, why, monkeypatch):
  monkeypatch.setenv("CPU_MARCH", march)
  with pytest.raises(ValueError, match=why): cpu.cpu_flags()


@needs_x86
def test_an_avx2_device_runs_avx2_code():
  """A process with CPU_MARCH=x86-64-v3: the device's record is AVX2's and a quantized product through its byte and
  pair dot products gives numpy's value (its kernels hold no AVX-512 instruction: they'd still run here, but the
  compiler was told the host lacks them)."""
  code = ("import numpy as np; from plugrad import Tensor, Device; r = Device['CPU'].renderer.caps\n"
          "a = np.arange(64, dtype=np.float32).reshape(8, 8) / 7\n"
          "print(r.vector_lanes, r.vector_regs, r.dot4, float(np.abs((Tensor(a) @ Tensor(a)).numpy() - a @ a).max()))")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, "CPU_MARCH": "x86-64-v3"})
  assert p.returncode == 0, p.stderr
  lanes, regs, dot4, err = p.stdout.split()
  assert (lanes, regs, dot4) == ("8", "16", "127") and float(err) < 1e-4


def test_opening_the_device_with_a_bad_target_says_why():
  p = subprocess.run([sys.executable, "-c", "from plugrad import Tensor; Tensor([1.0]).realize()"], capture_output=True, text=True,
                     timeout=120, env={**os.environ, "CPU_MARCH": "no-such-cpu", "DEV": "CPU"})
  assert p.returncode != 0 and "CPU_MARCH=no-such-cpu" in p.stderr and "rejects -march=no-such-cpu" in p.stderr


@pytest.mark.skipif(shutil.which("clang-19") is None, reason="clang-19 is not installed")
def test_bfloat16_with_a_compiler_whose_bf16_needs_a_runtime_library(tmp_path):
  """Regression: clang 19 compiles __bf16 arithmetic into calls of compiler-rt's __truncsfbf2, which libgcc before
  GCC 13 (Debian 12's) lacks, so the type probe passed (it only compiled) and every bfloat16 kernel then failed to load
  ("undefined symbol: __truncsfbf2"). The probe now loads what it compiled: bfloat16 is emulated where the library
  doesn't load, and a round trip through bfloat16 is numpy's round-to-nearest-even of the top 16 bits either way."""
  code = ("import numpy as np; from plugrad import Tensor; from plugrad.dtype import dtypes; "
          "x = np.random.default_rng(0).standard_normal(4096).astype(np.float32); "
          "print(Tensor(x).cast(dtypes.bfloat16).cast(dtypes.float32).numpy().view(np.uint32).tobytes().hex())")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                     env={**os.environ, "CC": "clang-19", "PLUGRAD_CACHE_DIR": str(tmp_path)})
  assert p.returncode == 0, p.stderr[-2000:]
  x = np.random.default_rng(0).standard_normal(4096).astype(np.float32).view(np.uint32)
  want = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16 << 16).astype(np.uint32)   # (finite inputs: no NaN rounding to handle)
  np.testing.assert_array_equal(np.frombuffer(bytes.fromhex(p.stdout.strip()), np.uint32), want)


def test_the_newest_versioned_clang_is_the_default(tmp_path, monkeypatch):
  """Without CC the CPU device compiles with the newest clang-NN on PATH (Debian 12's plain `clang` is clang 14, whose
  unrolling spilled the 4-row decode product's accumulators: 2x its time), else clang, else gcc; CC still wins."""
  from plugrad_cpu import find_cc
  for name in ("clang", "clang-14", "clang-19", "clang-9", "clang-format-19", "gcc"):
    (f := tmp_path / name).write_text("#!/bin/sh\n"); f.chmod(0o755)
  (tmp_path / "clang-21").write_text("not executable")
  monkeypatch.delenv("CC", raising=False)
  monkeypatch.setenv("PATH", str(tmp_path))
  assert find_cc() == "clang-19"
  monkeypatch.setenv("CC", "gcc")
  assert find_cc() == "gcc"
  monkeypatch.delenv("CC")
  for name in ("clang-14", "clang-19", "clang-9"): (tmp_path / name).unlink()
  monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep)   # (another PATH string: not the remembered listing)
  assert find_cc() == "clang"


@needs_x86
def test_kernels_are_built_without_avx512_bf16(monkeypatch):
  """A host with AVX512-BF16 (Zen 4, Sapphire Rapids) gets -mno-avx512bf16: clang casts float to __bf16 with
  vcvtneps2bf16 there, which flushes subnormals to zero (the conformance kit's bfloat16 specials read 0 for 9.18e-41
  on Zen 4 before). On this host, whatever it is, a subnormal and a rounding case cast to bfloat16 as ml_dtypes does."""
  monkeypatch.setattr(cpu, "cpu_flags", lambda: cpu.HOST_KINDS["avx512"] | {"avx512_bf16"})
  assert "-mno-avx512bf16" in cpu.ClangCompiler().flags
  monkeypatch.setattr(cpu, "cpu_flags", lambda: cpu.HOST_KINDS["avx512"])
  assert "-mno-avx512bf16" not in cpu.ClangCompiler().flags
  monkeypatch.undo()
  ml_dtypes = pytest.importorskip("ml_dtypes")
  from plugrad import Tensor
  x = np.array([9.183549615799121e-41, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -3.4e38, 1e-45], np.float32)
  got = Tensor(x, device="CPU").cast("bfloat16").cast("float32").numpy()
  np.testing.assert_array_equal(got, x.astype(ml_dtypes.bfloat16).astype(np.float32))


@needs_x86
def test_avx512_kernels_are_built_without_scatters(monkeypatch, tmp_path):
  """An AVX-512 target gets -mno-scatter where the compiler takes it (clang 18 on): clang vectorized a stride-2 input
  gradient's interleave (stores two a step apart) into vscatterqps, microcoded (Zen 4: 1.91 ms against 0.84). An
  AVX2 target has no scatters and no flag; a compiler that rejects the flag (gcc 12) gets none. On an AVX-512 host
  with such a clang, the interleave kernel's machine code has no scatter and its values are the product's."""
  cc = cpu.ClangCompiler()
  monkeypatch.setattr(cpu, "cpu_flags", lambda: cpu.HOST_KINDS["avx2"])
  assert "-mno-scatter" not in cpu.ClangCompiler().flags
  monkeypatch.setattr(cpu, "cpu_flags", lambda: cpu.HOST_KINDS["avx512"])
  assert ("-mno-scatter" in cpu.ClangCompiler().flags) is cc.accepts("-mno-scatter")
  assert not cc.accepts("-mno-such-switch-plugrad")
  monkeypatch.undo()
  if "avx512f" not in cpu.cpu_flags() or "-mno-scatter" not in cc.flags or not shutil.which("objdump"):
    pytest.skip("needs an AVX-512 host, a compiler with -mno-scatter and objdump")
  from plugrad import Tensor
  from plugrad.engine.realize import runner_of
  rng = np.random.default_rng(0)
  w, dy = rng.standard_normal((16, 8, 3, 3)).astype(np.float32), rng.standard_normal((2, 16, 14, 14)).astype(np.float32)
  x = Tensor.zeros(2, 8, 28, 28, requires_grad=True)   # (14 positions a phase row: vectorized with 32 scatters before)
  x.conv2d(Tensor(w), stride=2, padding=1).backward(Tensor(dy))
  items = [it for it in x.grad.schedule() if it.ast.op.name == "SINK"]
  interleave = items[-1]   # (the last kernel: the phases interleaved into the input's positions)
  lib = cc.compile(runner_of(interleave).spec.src)
  (tmp_path / "k.so").write_bytes(lib)
  asm = subprocess.run(["objdump", "-d", str(tmp_path / "k.so")], capture_output=True, text=True).stdout
  assert "vscatter" not in asm
  torch = pytest.importorskip("torch")
  xt = torch.zeros(2, 8, 28, 28, requires_grad=True)
  torch.nn.functional.conv2d(xt, torch.tensor(w), stride=2, padding=1).backward(torch.tensor(dy))
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
