"""The PYTHON reference device: exact value semantics, bounds-checked gated memory, loops, errors."""
from __future__ import annotations

import gc
import struct

import numpy as np
import pytest

from plugrad.device import CompileError, Device
from plugrad.dtype import dtypes
from plugrad.plugins.python import PythonCompiler, PythonRenderer, alu_fn, bitcast, decode, interpret
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp, exec_alu


@pytest.fixture(autouse=True)
def collect_buffers():
  """Free this test's device buffers while the plugin registry is still loaded. (conftest resets the registry after each
  test; a Buffer collected later, inside the next registry load, re-enters get_registry from Buffer.__del__ and hangs.)"""
  yield
  gc.collect()


def gl(slot, size, dt=dtypes.int32): return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), arg=slot)
def c(v, dt=dtypes.int32): return UOp.const(dt, v)
def idx(buf, i, gate=None): return UOp(Ops.INDEX, buf.dtype, (buf, i) if gate is None else (buf, i, gate))


def with_sources(uops):
  """`uops` with every missing source (constants, indexes, math) inserted before its first use."""
  out, seen = [], set()
  def add(u):
    if u in seen: return
    for s in u.src: add(s)
    seen.add(u)
    out.append(u)
  for u in uops:
    if u.op is Ops.END: seen.add(u); out.append(u)
    else: add(u)
  return out


def run(uops, *arrays, vals=()):
  uops = with_sources(uops)
  bufs = [memoryview(bytearray(a.tobytes())) for a in arrays]
  interpret(decode(uops), bufs, vals)
  return [np.frombuffer(b, a.dtype) for a, b in zip(arrays, bufs)]


def loop(out, n, body):
  """RANGE i < n; body(i) -> list of uops; END."""
  r = UOp(Ops.RANGE, dtypes.int32, (n,), arg=(0, "global"))
  inner = body(r)
  return [r, *inner, UOp(Ops.END, dtypes.void, (r,))]


ALU_CASES = [(dt, op) for dt in (dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.float32, dtypes.float16,
                                   dtypes.bfloat16, dtypes.float64)
             for op in (Ops.ADD, Ops.MUL, Ops.SUB, Ops.MAX, Ops.IDIV, Ops.MOD, Ops.FDIV) if dtypes.is_float(dt) != (op in (Ops.IDIV, Ops.MOD))]


@pytest.mark.parametrize("dt,op", ALU_CASES)
def test_alu_matches_exec_alu(dt, op):
  rng = np.random.default_rng(0)
  a, b = UOp(Ops.DEFINE_VAR, dt, arg=("a", 0, 1)), UOp(Ops.DEFINE_VAR, dt, arg=("b", 0, 1))
  f = alu_fn(UOp(op, dt, (a, b)))
  for _ in range(50):
    x, y = ([int(v) for v in rng.integers(-300, 300, 2)] if dtypes.is_int(dt) else [float(v) for v in rng.normal(0, 1e3, 2)])
    x, y = dtypes.as_const(x, dt), dtypes.as_const(y, dt)
    assert f(x, y) == exec_alu(op, dt, (x, y)) or (f(x, y) != f(x, y) and exec_alu(op, dt, (x, y)) != exec_alu(op, dt, (x, y)))


def test_int_wraparound_and_c_division():
  a, out = np.array([2**31 - 1, -7, 7, -2**31], np.int32), np.zeros(4, np.int32)
  g0, g1 = gl(0, 4), gl(1, 4)
  def body(i):
    v = UOp(Ops.LOAD, dtypes.int32, (idx(g1, i),))
    s = v + c(1)
    q = UOp(Ops.IDIV, dtypes.int32, (v, c(2)))
    return [v, s, q, UOp(Ops.STORE, dtypes.void, (idx(g0, i), s + q))]
  got, _ = run([g0, g1, *loop(g0, c(4), body)], out, a)
  want = [(-2**31) + (2**31 - 1) // 2, -6 - 3, 8 + 3, (-2**31 + 1) + (-2**30) + 2**32]  # C: -7/2 == -3; int32 wraps
  assert got.tolist() == want


def test_float32_rounding_and_half_storage():
  a = np.array([0.1, 1e-8, 3.0], np.float32)
  out16 = np.zeros(3, np.float16)
  g0, g1 = gl(0, 3, dtypes.float16), gl(1, 3, dtypes.float32)
  def body(i):
    v = UOp(Ops.LOAD, dtypes.float32, (idx(g1, i),))
    s = v + c(1.0, dtypes.float32)
    h = UOp(Ops.CAST, dtypes.float16, (s,))
    return [v, s, h, UOp(Ops.STORE, dtypes.void, (idx(g0, i), h))]
  got, _ = run([g0, g1, *loop(g0, c(3), body)], out16, a)
  np.testing.assert_array_equal(got, (a + np.float32(1)).astype(np.float16))


def test_out_of_bounds_raises_and_gate_protects():
  g0 = gl(0, 3)
  def body(i): return [UOp(Ops.STORE, dtypes.void, (idx(g0, i + c(1)), c(5)))]
  with pytest.raises(IndexError, match=r"data0\[3\], out of bounds for 3 int32"): run([g0, *loop(g0, c(3), body)], np.zeros(3, np.int32))
  def gated(i):
    ok = UOp(Ops.CMPLT, dtypes.bool, (i, c(2)))
    ld = UOp(Ops.LOAD, dtypes.int32, (idx(g0, i + c(5), ok),))  # would be out of bounds, but the gate is false there
    return [ok, ld, UOp(Ops.STORE, dtypes.void, (idx(g0, i, ok), ld + c(1)))]
  with pytest.raises(IndexError): run([g0, *loop(g0, c(3), gated)], np.zeros(3, np.int32))  # gate true at i=0,1: index 5 is out
  def gated_ok(i):
    ok = UOp(Ops.CMPLT, dtypes.bool, (i, c(2)))
    far = UOp(Ops.CMPLT, dtypes.bool, (c(2), i))
    ld = UOp(Ops.LOAD, dtypes.int32, (idx(g0, i + c(5), far),))
    return [ok, far, ld, UOp(Ops.STORE, dtypes.void, (idx(g0, i, ok), ld + c(1)))]
  got, = run([g0, *loop(g0, c(3), gated_ok)], np.full(3, 9, np.int32))
  assert got.tolist() == [1, 1, 9]  # gated loads read 0; the gated store skipped i=2


def test_define_var_loop_bound_and_empty_loop():
  g0, n = gl(0, 4), UOp(Ops.DEFINE_VAR, dtypes.int32, arg=("n", 0, 4))
  def body(i): return [UOp(Ops.STORE, dtypes.void, (idx(g0, i), i * c(10)))]
  prog = [g0, n, *loop(g0, n, body)]
  assert run(prog, np.full(4, -1, np.int32), vals=(3,))[0].tolist() == [0, 10, 20, -1]
  assert run(prog, np.full(4, -1, np.int32), vals=(0,))[0].tolist() == [-1, -1, -1, -1]


def test_bitcast():
  assert bitcast(1.0, dtypes.float32, dtypes.int32) == struct.unpack("i", struct.pack("f", 1.0))[0]
  assert bitcast(-1, dtypes.int16, dtypes.float16) != bitcast(-1, dtypes.int16, dtypes.float16)  # 0xffff is a nan
  assert bitcast(0x3F80, dtypes.uint16, dtypes.bfloat16) == 1.0 and bitcast(1.0, dtypes.bfloat16, dtypes.uint16) == 0x3F80
  t = Tensor(np.array([1.0, -2.5], np.float32), device="PYTHON").bitcast(dtypes.int32)
  np.testing.assert_array_equal(t.numpy(), np.array([1.0, -2.5], np.float32).view(np.int32))


def test_source_listing_and_compiler_errors():
  g0 = gl(0, 3)
  src = PythonRenderer().render("k", [g0])
  assert src.startswith("# PYTHON kernel k: 1 uops") and "DEFINE_GLOBAL" in src
  assert PythonCompiler().compile(src)
  with pytest.raises(CompileError, match="no '#@uops' payload"): PythonCompiler().compile("# nothing\n")
  with pytest.raises(CompileError, match="corrupt"): PythonCompiler().compile("#@uops AAAA\n")


def test_unsupported_and_malformed_programs():
  with pytest.raises(NotImplementedError, match="SPECIAL"): decode([UOp(Ops.SPECIAL, dtypes.int32, (), ("g", 4))])
  r = UOp(Ops.RANGE, dtypes.int32, (c(2),), arg=(0, "global"))
  with pytest.raises(RuntimeError, match="never closed"): decode([c(2), r])
  with pytest.raises(RuntimeError, match="not defined before"): decode([r])


def test_launch_arguments_checked():
  dev = Device["PYTHON"]
  g0 = gl(0, 3)
  prg = dev.load("k", dev.compiler.compile(dev.renderer.render("k", [g0])))
  with pytest.raises(TypeError, match="takes 1 buffers and 0 values, got 0 and 0"): prg()


def test_matches_cpu_on_mixed_dtypes():
  x = np.array([[1.5, 2.25, 3.0], [100.0, 0.001, 7.0]], np.float32)
  def prog(dev):
    t = Tensor(x, device=dev)
    return ((t * 3).cast(dtypes.float64).sqrt().cast(dtypes.float32) + t.cast(dtypes.int8).cast(dtypes.float32)).sum(axis=1).numpy()
  np.testing.assert_array_equal(prog("PYTHON"), prog("CPU"))
