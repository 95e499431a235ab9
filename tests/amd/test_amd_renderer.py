"""AMDGPU renderer: golden LLVM IR for small kernels, hand-built GPU linear programs (SPECIAL ids, DEFINE_LOCAL,
BARRIER, IF/ENDIF) compiled for every arch and checked in the machine code and kernel descriptor, launch sizes (in
ProgramSpec, never in the source), constants. Values are checked in test_amd_semantics.py."""
from __future__ import annotations

import math
import shutil
import struct

import pytest

from plugrad import Tensor
from plugrad.codegen import get_program
from plugrad.codegen.targets import AMD, AMD_CDNA2, AMD_CDNA3, AMD_RDNA4
from plugrad.dtype import AddrSpace, dtypes
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.upat import PatternMatcher, UPat
from plugrad_amd import f64math
from plugrad_amd.autogen import amdhsa_kd
from plugrad_amd.compiler import AMDGPUCompiler, elf_symbols, unpack
from plugrad_amd.device import load_image
from plugrad_amd.renderer import ARCHS, AMDGPURenderer, fp8_bits, fp8_value, render_const

needs_clang = pytest.mark.skipif(shutil.which("clang-19") is None or shutil.which("ld.lld-19") is None, reason="clang-19/lld-19 not installed")
GPU_ARCHS = ["gfx1100", "gfx1201", "gfx942", "gfx90a"]


def gl(slot: int, size: int, dt=dtypes.float32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), arg=slot)


def elementwise_ast(n: int = 16) -> UOp:
  i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), arg=(0, "global"))
  a = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, gl(1, n).dtype, (gl(1, n), i)),))
  return UOp.sink_of(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, gl(0, n).dtype, (gl(0, n), i)), a * 2.0 + 1.0)))


GOLDEN_ELEMENTWISE = """\
define amdgpu_kernel void @E_16(ptr addrspace(1) noalias align 4 %data0, ptr addrspace(1) noalias align 4 %data1) #0 {
entry:
  %id1 = call i32 @llvm.amdgcn.workitem.id.x()
  %p2 = getelementptr inbounds float, ptr addrspace(1) %data0, i32 %id1
  %p3 = getelementptr inbounds float, ptr addrspace(1) %data1, i32 %id1
  %v4 = load float, ptr addrspace(1) %p3, align 4
  %v5 = fmul float %v4, 0x4000000000000000
  %v6 = fadd float %v5, 0x3FF0000000000000
  store float %v6, ptr addrspace(1) %p2, align 4
  ret void
}"""


def test_golden_elementwise():
  spec = get_program(elementwise_ast(), AMDGPURenderer("gfx1100"))
  src = spec.src
  assert GOLDEN_ELEMENTWISE in src, src
  assert src.startswith('target triple = "amdgcn-amd-amdhsa"\n')
  assert '"target-cpu"="gfx1100"' in src and '"amdgpu-flat-work-group-size"="1,16"' in src
  assert "declare i32 @llvm.amdgcn.workitem.id.x()" in src  # core's GPU codegen: the 16 elements are 16 work-items of one group
  assert spec.global_size == [1, 1, 1] and spec.local_size == [16, 1, 1] and spec.launch_dims() == ((1, 1, 1), (16, 1, 1))


def test_gated_load_never_touches_memory_on_a_false_gate():
  i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 8),), arg=(0, "global"))
  gate = i < 4
  a = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, gl(1, 4).dtype, (gl(1, 4), i, gate)),))
  src = get_program(UOp.sink_of(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, gl(0, 8).dtype, (gl(0, 8), i)), a))), AMDGPURenderer()).src
  body = src[src.index("entry:"):]
  # the load sits in its own block, entered only when the gate holds, and a phi gives 0 otherwise
  then = body[body.index("_then:"):body.index("_join:")]
  assert "load float" in then and "phi float" in body and "0x0000000000000000" in body[body.index("phi float"):]
  assert "load float" not in body[:body.index("_then:")]


def test_constants_are_exact():
  assert render_const(0.1, dtypes.float32) == "0x%016X" % struct.unpack("<Q", struct.pack("<d", struct.unpack("<f", struct.pack("<f", 0.1))[0]))[0]
  assert render_const(math.inf, dtypes.float32) == "0x7FF0000000000000" and render_const(-math.inf, dtypes.float64) == "0xFFF0000000000000"
  assert render_const(1.0, dtypes.float16) == "0xH3C00" and render_const(65536.0, dtypes.float16) == "0xH7C00"
  assert render_const(1.0, dtypes.bfloat16) == "0xR3F80" and render_const(math.nan, dtypes.bfloat16) == "0xR7FC0"
  assert render_const(-1, dtypes.uint8) == "-1" and render_const(255, dtypes.uint8) == "-1" and render_const(2**31, dtypes.int32) == "-2147483648"
  assert render_const(True, dtypes.bool) == "true"


@pytest.mark.parametrize("dt", [dtypes.fp8e4m3, dtypes.fp8e5m2])
def test_fp8_constants_round_to_nearest_even(dt):
  for code in range(256):
    v = fp8_value(code, dt)
    if math.isfinite(v) and not (v == 0 and code & 0x80): assert fp8_bits(v, dt) == code, (code, v)
  assert fp8_bits(1.0, dt) == (0x38 if dt == dtypes.fp8e4m3 else 0x3C)
  # out of range, as core converts (and the kernels' own conversions do): e4m3 saturates to 448, e5m2 overflows to inf
  assert fp8_value(fp8_bits(1e6, dt), dt) == 448.0 if dt == dtypes.fp8e4m3 else math.isinf(fp8_value(fp8_bits(1e6, dt), dt))
  assert fp8_bits(1e300, dt) == fp8_bits(math.inf, dt) and fp8_bits(-1e300, dt) == fp8_bits(-math.inf, dt)
  assert fp8_bits(math.nan, dt) == 0x7F


def gpu_program(lsz: int = 128, groups: int = 4) -> list[UOp]:
  """out[g*lsz + l] = in[g*lsz + lsz-1 - l] through LDS (reversed within the workgroup), stored only by lanes l < 32.
  128 threads: more than one wave on every arch, so the barrier is real."""
  i32 = dtypes.int32
  def c(v: int) -> UOp: return UOp.const(i32, v)
  out, inp = gl(0, groups * lsz), gl(1, groups * lsz)
  g = UOp(Ops.SPECIAL, i32, (c(groups),), "gidx0")
  l = UOp(Ops.SPECIAL, i32, (c(lsz),), "lidx0")
  lds = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(lsz, AddrSpace.LOCAL), arg=("temp0", lsz))
  base = UOp(Ops.MUL, i32, (g, c(lsz)))
  gidx = UOp(Ops.ADD, i32, (base, l))
  src_idx = UOp(Ops.INDEX, inp.dtype, (inp, gidx))
  ld = UOp(Ops.LOAD, dtypes.float32, (src_idx,))
  lds_idx = UOp(Ops.INDEX, lds.dtype, (lds, l))
  st = UOp(Ops.STORE, dtypes.void, (lds_idx, ld))
  bar = UOp(Ops.BARRIER, dtypes.void, (st,))
  revidx = UOp(Ops.SUB, i32, (c(lsz - 1), l))
  rev_idx = UOp(Ops.INDEX, lds.dtype, (lds, revidx))
  rev = UOp(Ops.LOAD, dtypes.float32, (rev_idx, bar))
  cond = UOp(Ops.CMPLT, dtypes.bool, (l, c(32)))
  iff = UOp(Ops.IF, dtypes.void, (cond,))
  out_idx = UOp(Ops.INDEX, out.dtype, (out, gidx))
  st2 = UOp(Ops.STORE, dtypes.void, (out_idx, rev))
  endif = UOp(Ops.ENDIF, dtypes.void, (iff,))
  return [out, inp, g, l, lds, base, gidx, src_idx, ld, lds_idx, st, bar, revidx, rev_idx, rev, cond, iff, out_idx, st2, endif]


@needs_clang
@pytest.mark.parametrize("arch", GPU_ARCHS)
def test_special_local_barrier_if_compile(arch: str):
  src = AMDGPURenderer(arch).render("lds_reverse", gpu_program())
  assert "@llvm.amdgcn.workgroup.id.x()" in src and "@llvm.amdgcn.workitem.id.x()" in src
  assert "@temp0 = internal addrspace(3) global [128 x float] undef" in src
  assert 'fence syncscope("workgroup") release\n  call void @llvm.amdgcn.s.barrier()\n  fence syncscope("workgroup") acquire' in src
  assert '"amdgpu-flat-work-group-size"="1,128"' in src and ";" not in src
  c = AMDGPUCompiler(arch)
  lib = c.compile(src)
  meta, elf = unpack(lib)
  assert meta == {"arch": arch}  # the code object's arch travels with it; the launch doesn't
  kd_off = elf_symbols(elf)["lds_reverse.kd"][0]
  kd = amdhsa_kd.struct_kernel_descriptor_t.from_buffer_copy(load_image(elf), kd_off)
  assert kd.group_segment_fixed_size == 512 and kd.private_segment_fixed_size == 0
  if shutil.which("llvm-objdump-19"):
    asm = c.disassemble(lib)
    assert "s_barrier" in asm and ("ds_store" in asm or "ds_write" in asm) and ("ds_load" in asm or "ds_read" in asm)


def test_symbolic_launch_sizes_are_in_the_spec():
  """A kernel over a symbolic length: the workgroup count is an expression of the variable in ProgramSpec (evaluated at
  launch), the source names only the constant workgroup size."""
  n = UOp(Ops.DEFINE_VAR, dtypes.index, arg=("n", 1, 4096))
  i = UOp(Ops.RANGE, dtypes.index, (n,), arg=(0, "global"))
  a = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, gl(1, 4096).dtype, (gl(1, 4096), i)),))
  spec = get_program(UOp.sink_of(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, gl(0, 4096).dtype, (gl(0, 4096), i)), a + 1.0))), AMDGPURenderer())
  (lsz,) = {x for x in spec.local_size if x > 1}
  assert isinstance(spec.global_size[0], UOp) and ";" not in spec.src and f'"amdgpu-flat-work-group-size"="1,{lsz}"' in spec.src
  for v in (1, lsz, lsz + 1, 4096):
    assert spec.launch_dims({"n": v}) == ((-(-v // lsz), 1, 1), tuple(spec.local_size))
  with pytest.raises(RuntimeError, match="launch size needs"): spec.launch_dims({})


def test_renderer_checks_the_ids_it_is_given():
  i32 = dtypes.int32
  def prog(name: str, size: UOp) -> list[UOp]:
    out = gl(0, 64)
    s = UOp(Ops.SPECIAL, i32, (size,), name)
    return [out, s, (idx := UOp(Ops.INDEX, out.dtype, (out, s))), UOp(Ops.STORE, dtypes.void, (idx, UOp.const(dtypes.float32, 1.0)))]
  with pytest.raises(ValueError, match="gidx0..2 or lidx0..2"): AMDGPURenderer().render("k", prog("tid0", UOp.const(i32, 8)))
  with pytest.raises(ValueError, match="exceeds 1024"): AMDGPURenderer().render("k", prog("lidx0", UOp.const(i32, 2048)))
  with pytest.raises(NotImplementedError, match="workgroup size must be a constant"):
    AMDGPURenderer().render("k", prog("lidx0", UOp(Ops.DEFINE_VAR, i32, arg=("n", 1, 8))))
  assert '"amdgpu-flat-work-group-size"="1,1"' in AMDGPURenderer().render("k", prog("gidx0", UOp.const(i32, 8)))


def test_no_comments_in_kernels():
  """No metadata rides in kernel sources (LLVM IR comments start with ';'): hand-built GPU programs and what codegen
  makes for every arch (group sums, tiled tensor cores). The conformance collection is checked in test_amd_compile.py."""
  a, h = Tensor.empty(4096, 1024, device="CPU"), Tensor.empty(256, 256, dtype=dtypes.float16, device="CPU")
  asts = [t.schedule(optimize=False)[-1].ast for t in (a.sum(1), a.sum(), h @ h, a.softmax(1))]
  for arch in GPU_ARCHS:
    srcs = [AMDGPURenderer(arch).render("lds_reverse", gpu_program())] + [get_program(ast, AMDGPURenderer(arch)).src for ast in asts]
    for src in srcs: assert ";" not in src, [ln for ln in src.splitlines() if ";" in ln]


def test_capabilities_per_arch():
  assert AMDGPURenderer("gfx1100").caps.warp_size == 32 and AMDGPURenderer("gfx942").caps.warp_size == 64
  assert AMDGPURenderer("gfx90a").caps.warp_size == 64
  for a in GPU_ARCHS:
    r = AMDGPURenderer(a)
    assert r.caps.has_local and r.caps.has_shared and r.caps.shared_max == 65536 and r.caps.local_max_threads == 1024 and r.arch == a
    assert r.caps == {"gfx1100": AMD, "gfx1201": AMD_RDNA4, "gfx942": AMD_CDNA3, "gfx90a": AMD_CDNA2}[a].caps()   # the target's record
  assert AMDGPURenderer.accepts_arch("gfx942") and not AMDGPURenderer.accepts_arch("sm_90") and set(GPU_ARCHS) <= set(ARCHS)


def test_bad_special_is_a_clear_error():
  bad = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, 4),), "tid")
  with pytest.raises(ValueError, match="SPECIAL 'tid'"): AMDGPURenderer().render("k", [gl(0, 4), bad])


class TCRenderer(AMDGPURenderer):
  """A CUSTOM uop standing for WMMA, rendered by the renderer's `wmma`: a rule put in front of the renderer's table (how
  a subclass extends the rules)."""
  string_rewrite = PatternMatcher([(UPat(Ops.CUSTOM, name="x"), lambda ctx, x: ctx.wmma(x))]) + AMDGPURenderer.string_rewrite


def tc_program(na: int, nc: int, lanes: int, dt_in) -> list[UOp]:
  """Each lane loads its a/b fragments (na elements) and c (nc floats), runs one tensor-core op, stores the result."""
  i32 = dtypes.int32
  a, b, c, out = gl(1, lanes * na, dt_in), gl(2, lanes * na, dt_in), gl(3, lanes * nc), gl(0, lanes * nc)
  lane = UOp(Ops.SPECIAL, i32, (UOp.const(i32, lanes),), "lidx0")
  prog = [out, a, b, c, lane]
  def frag(buf: UOp, n: int, dt) -> UOp:
    base = UOp(Ops.MUL, i32, (lane, UOp.const(i32, n)))
    prog.append(base)
    vals = []
    for j in range(n):
      idx = UOp(Ops.ADD, i32, (base, UOp.const(i32, j)))
      ix = UOp(Ops.INDEX, buf.dtype, (buf, idx))
      ld = UOp(Ops.LOAD, dt, (ix,))
      prog.extend([idx, ix, ld])
      vals.append(ld)
    v = UOp(Ops.VECTORIZE, dt.vec(n), tuple(vals))
    prog.append(v)
    return v
  va, vb, vc = frag(a, na, dt_in), frag(b, na, dt_in), frag(c, nc, dtypes.float32)
  w = UOp(Ops.CUSTOM, dtypes.float32.vec(nc), (va, vb, vc), "WMMA_16_16_16")
  prog.append(w)
  base = UOp(Ops.MUL, i32, (lane, UOp.const(i32, nc)))
  prog.append(base)
  for j in range(nc):
    g = UOp(Ops.GEP, dtypes.float32, (w,), (j,))
    idx = UOp(Ops.ADD, i32, (base, UOp.const(i32, j)))
    ix = UOp(Ops.INDEX, out.dtype, (out, idx))
    prog.extend([g, idx, ix, UOp(Ops.STORE, dtypes.void, (ix, g))])
  return prog


TC_CASES = [("gfx1100", 16, 8, 32, "v_wmma_f32_16x16x16_f16", "v_wmma_f32_16x16x16_bf16"),
            ("gfx1201", 8, 8, 32, "v_wmma_f32_16x16x16_f16", "v_wmma_f32_16x16x16_bf16"),
            ("gfx942", 4, 4, 64, "v_mfma_f32_16x16x16_f16", "v_mfma_f32_16x16x16_bf16"),
            ("gfx90a", 4, 4, 64, "v_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x16bf16_1k")]


@needs_clang
@pytest.mark.skipif(shutil.which("llvm-objdump-19") is None, reason="llvm-objdump-19 not installed")
@pytest.mark.parametrize("arch,na,nc,lanes,f16_ins,bf16_ins", TC_CASES)
def test_tensor_core_instructions(arch: str, na: int, nc: int, lanes: int, f16_ins: str, bf16_ins: str):
  c = AMDGPUCompiler(arch)
  for dt, ins in ((dtypes.float16, f16_ins), (dtypes.bfloat16, bf16_ins)):
    src = TCRenderer(arch).render("tc", tc_program(na, nc, lanes, dt))
    asm = c.disassemble(c.compile(src))
    assert ins in asm, f"{arch} {dt}: {ins} not in\n{asm[:3000]}"
  with pytest.raises(NotImplementedError, match="no tensor core"): TCRenderer(arch).render("tc", tc_program(na * 2, nc, lanes, dtypes.float16))


def test_two_over_pi_chunks_for_the_sin_reduction():
  """The float32 sin's large-argument reduction: 2/pi in eight 28-bit chunks (each exact times a 24-bit mantissa),
  computed from Machin's formula; the leading bits agree with the published hex expansion of 2/pi."""
  assert f"{f64math._TOP:X}".startswith("A2F9836E4E441529FC2757D1F534DDC0DB6295993C439041FE5163")
  for i, c in enumerate(f64math.TWO_OVER_PI_CHUNKS):
    m = c * 2.0 ** (28 * (i + 1))
    assert m == int(m) and 0 <= m < 2**28
  assert abs(sum(f64math.TWO_OVER_PI_CHUNKS) - 2 / math.pi) < 1e-16


# ---- the renderer is rule tables (PatternMatchers), like the C and CUDA renderers

def one_op_program(op: Ops, dt, n_src: int) -> list[UOp]:
  """out[0] = op(in1[0], ...) over `n_src` loaded sources of `dt`."""
  i = UOp.const(dtypes.int32, 0)
  out, ins = gl(0, 4, dt), [gl(k + 1, 4, dt) for k in range(n_src)]
  ixs = [UOp(Ops.INDEX, g.dtype, (g, i)) for g in ins]
  lds = [UOp(Ops.LOAD, dt, (ix,)) for ix in ixs]
  v = UOp(op, dt, tuple(lds))
  ox = UOp(Ops.INDEX, out.dtype, (out, i))
  return [out, *ins, *ixs, *lds, v, ox, UOp(Ops.STORE, dtypes.void, (ox, v))]


def test_every_op_has_a_rule():
  ren = AMDGPURenderer
  ruled = set(ren.string_rewrite.pdict) | set(ren.alu_rewrite.pdict) | set(ren.alu_decomps.pdict)
  program_ops = {Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST, Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.DEFINE_REG, Ops.AFTER, Ops.INDEX,
                 Ops.LOAD, Ops.STORE, Ops.RANGE, Ops.END, Ops.IF, Ops.ENDIF, Ops.BARRIER, Ops.VECTORIZE, Ops.GEP, Ops.WMMA, Ops.NOOP}
  alu = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC, Ops.RECIPROCAL, Ops.NEG, Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV,
         Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.MAX, Ops.WHERE, Ops.MULACC, Ops.POW}
  assert program_ops <= set(ren.string_rewrite.pdict) and alu <= set(ren.alu_rewrite.pdict) <= set(GroupOp.ALU)
  assert {Ops.CAST, Ops.BITCAST} <= set(ren.alu_decomps.pdict) and program_ops | alu <= ruled


def test_an_op_without_a_rule_is_a_clear_error():
  with pytest.raises(NotImplementedError, match="can't render Ops.CUSTOM"):
    AMDGPURenderer().render("k", [gl(0, 4), UOp(Ops.CUSTOM, dtypes.float32, (), "x")])
  with pytest.raises(NotImplementedError, match="can't render Ops.EXP2 on dtypes.int32"):
    AMDGPURenderer().render("k", one_op_program(Ops.EXP2, dtypes.int32, 1))


def test_bf16_and_fp8_arithmetic_is_the_float32_rule():
  """The decomposition rules: a bfloat16 add is a float add between bit conversions (shl 16 in, round-to-nearest-even
  shifts out), an fp8 add a float add between the bit-level fp8 conversions; float16 has its own add."""
  bf = AMDGPURenderer().render("k", one_op_program(Ops.ADD, dtypes.bfloat16, 2))
  assert "fadd float" in bf and "shl i32" in bf and "add i32 %v" in bf and "fadd bfloat" not in bf
  f8 = AMDGPURenderer().render("k", one_op_program(Ops.ADD, dtypes.fp8e4m3, 2))
  assert "fadd float" in f8 and "@llvm.rint.f32" in f8 and "trunc i32" in f8
  assert "fadd half" in AMDGPURenderer().render("k", one_op_program(Ops.ADD, dtypes.float16, 2))


class PowIntrinsicRenderer(AMDGPURenderer):
  """A renderer that replaces the pow decomposition by LLVM's intrinsic: one rule in front of the ALU table."""
  alu_rewrite = PatternMatcher([(UPat(Ops.POW, dtypes.float32, name="x"),
                                 lambda ctx, x: ctx.intrinsic("pow", x.dtype, [ctx.val(s) for s in x.src]))]) + AMDGPURenderer.alu_rewrite


def test_a_rule_in_front_replaces_a_decomposition():
  prog = one_op_program(Ops.POW, dtypes.float32, 2)
  base, mine = AMDGPURenderer().render("k", prog), PowIntrinsicRenderer().render("k", prog)
  assert "@llvm.exp2.f32" in base and "@llvm.log2.f32" in base and "@llvm.pow" not in base  # exp2(y*log2|x|) with sign rules
  assert "call float @llvm.pow.f32(" in mine and "@llvm.exp2" not in mine
  f64 = one_op_program(Ops.POW, dtypes.float64, 2)
  assert PowIntrinsicRenderer().render("k", f64) == AMDGPURenderer().render("k", f64)  # the rule matches float32 only


@needs_clang
def test_rule_rendered_kernels_compile_for_every_arch():
  for arch in GPU_ARCHS:
    c = AMDGPUCompiler(arch)
    for op, dt, n in ((Ops.ADD, dtypes.bfloat16, 2), (Ops.MUL, dtypes.fp8e5m2, 2), (Ops.POW, dtypes.float16, 2), (Ops.SIN, dtypes.float16, 1),
                      (Ops.MAX, dtypes.float32, 2), (Ops.MULACC, dtypes.int32, 3), (Ops.IDIV, dtypes.int64, 2)):
      assert c.compile(AMDGPURenderer(arch).render("k", one_op_program(op, dt, n)))
