"""Running PTX on the interpreter directly (no driver): a mock GPU memory arena, modules from PTX text or from CUDA C
compiled by NVRTC, launches with numpy arrays in and out. Also `alu_kernel`, which wraps one instruction in a kernel
that loads its operands per thread from memory and stores its results (the ALU tests)."""
from __future__ import annotations

import numpy as np

from plugrad_nv.mock.memory import Arena
from plugrad_nv.mock.ptx import LoadedModule, compile_ptx

_ARENA: Arena | None = None


def arena() -> Arena:
  global _ARENA
  if _ARENA is None: _ARENA = Arena(1 << 28)
  return _ARENA


def nvrtc_ptx(src: str, arch: str = "sm_90") -> str:
  from plugrad_nv.compiler import NVRTCCompiler
  return NVRTCCompiler(arch, keep_ptx=True).nvrtc_compile(src, ptx=True).decode()


def load(ptx: str, cc: tuple[int, int] = (9, 0)) -> LoadedModule:
  return LoadedModule(compile_ptx(ptx), arena(), 0, cc)


def run(mod: LoadedModule, name: str, grid, block, *args) -> list[np.ndarray]:
  """Launch `name` with numpy arrays (copied to mock GPU memory; their values after the kernel are returned, in order)
  and Python ints (int32 parameters) / np.integer scalars (their own width)."""
  ar = arena()
  f = mod.prog.functions[name]
  params = bytearray(f.param_size)
  bufs = []
  try:
    for p, a in zip(f.params, args):
      if isinstance(a, np.ndarray):
        addr = ar.alloc(max(a.nbytes, 1), "device", 0)
        ar.host_view(addr, a.nbytes)[:] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        bufs.append((addr, a))
        raw = np.uint64(addr).tobytes()
      else: raw = (a if isinstance(a, np.generic) else np.int32(a)).tobytes()
      params[p.offset:p.offset + len(raw)] = raw
    mod.launch(name, tuple(grid), tuple(block), bytes(params))
    return [ar.host_view(addr, a.nbytes).view(a.dtype).reshape(a.shape).copy() for addr, a in bufs]
  finally:
    for addr, _ in bufs: ar.free(addr)


# ---------------------------------------------------------------------------- one instruction per thread

REG = {"pred": ("%p", "pred"), "b16": ("%h", "b16"), "u16": ("%h", "b16"), "s16": ("%h", "b16"), "f16": ("%h", "b16"),
       "bf16": ("%h", "b16"), "s8": ("%h", "b16"), "u8": ("%h", "b16"), "e4m3x2": ("%h", "b16"), "e5m2x2": ("%h", "b16"),
       "b32": ("%r", "b32"), "u32": ("%r", "b32"), "s32": ("%r", "b32"), "f16x2": ("%r", "b32"), "f32": ("%f", "f32"),
       "b64": ("%x", "b64"), "u64": ("%x", "b64"), "s64": ("%x", "b64"), "f64": ("%fd", "f64")}
NPT = {"pred": np.uint8, "b16": np.uint16, "u16": np.uint16, "s16": np.int16, "f16": np.uint16, "bf16": np.uint16, "s8": np.int8,
       "u8": np.uint8, "e4m3x2": np.uint16, "e5m2x2": np.uint16, "b32": np.uint32, "u32": np.uint32, "s32": np.int32,
       "f16x2": np.uint32, "f32": np.float32, "b64": np.uint64, "u64": np.uint64, "s64": np.int64, "f64": np.float64}
LDT = {"pred": "u8", "s8": "s8", "u8": "u8", "f16": "b16", "bf16": "b16", "e4m3x2": "b16", "e5m2x2": "b16", "f16x2": "b32"}


def alu_kernel(template: str, ins: list[str], outs: list[str], arch: str = "sm_90") -> str:
  """PTX of kernel `t(out0.., in0..)`: thread i loads element i of each input (typed per `ins`), runs `template`
  ({a}, {b}, {c}, {f} the inputs, {d}, {e} the outputs), stores element i of each output."""
  lines, regs = [], {}
  counts: dict[str, int] = {}
  def reg(t: str) -> str:
    pre = REG[t][0]
    counts[pre] = counts.get(pre, 0) + 1
    return f"{pre}{counts[pre]}"
  params = [f"\t.param .u64 t_param_{i}" for i in range(len(outs) + len(ins))]
  body = ["mov.u32 %tid, %tid.x;", "cvt.u64.u32 %tid64, %tid;"]
  for k, t in enumerate(ins):
    r = reg(t)
    regs["abcf"[k]] = r
    size = np.dtype(NPT[t]).itemsize
    body += [f"ld.param.u64 %ad{k}, [t_param_{len(outs) + k}];", f"mul.lo.u64 %off, %tid64, {size};", f"add.u64 %ad{k}, %ad{k}, %off;"]
    if t == "pred": body += [f"ld.global.u8 %hp, [%ad{k}];", f"setp.ne.b16 {r}, %hp, 0;"]
    else: body.append(f"ld.global.{LDT.get(t, t)} {r}, [%ad{k}];")
  for k, t in enumerate(outs): regs["de"[k]] = reg(t)
  body.append(template.format(**regs) + ";")
  for k, t in enumerate(outs):
    size = np.dtype(NPT[t]).itemsize
    body += [f"ld.param.u64 %ao, [t_param_{k}];", f"mul.lo.u64 %off, %tid64, {size};", "add.u64 %ao, %ao, %off;"]
    if t == "pred": body += [f"selp.u16 %hp, 1, 0, {regs['de'[k]]};", "st.global.u8 [%ao], %hp;"]
    else: body.append(f"st.global.{LDT.get(t, t)} [%ao], {regs['de'[k]]};")
  decl = ["\t.reg .b32 %tid;", "\t.reg .b64 %tid64, %off, %ao, %ad<4>;", "\t.reg .b16 %hp;"]
  decl += [f"\t.reg .{cls} {pre}<{counts[pre] + 1}>;" for pre, cls in {v[0]: v[1] for v in REG.values()}.items() if pre in counts]
  lines = [".version 8.0", f".target {arch}", ".address_size 64", ".visible .entry t(", ",\n".join(params), ")", "{", *decl,
           *[f"\t{b}" for b in body], "\tret;", "}"]
  return "\n".join(lines) + "\n"


def run_alu(template: str, ins: list[str], outs: list[str], inputs: list[np.ndarray], arch: str = "sm_90") -> list[np.ndarray]:
  n = len(inputs[0]) if inputs else 32
  mod = load(alu_kernel(template, ins, outs, arch), (int(arch[3]), int(arch[4])))
  res = run(mod, "t", (1, 1, 1), (n, 1, 1), *[np.zeros(n, NPT[t]) for t in outs],
            *[np.asarray(a).astype(NPT[t]) for a, t in zip(inputs, ins)])
  return res[:len(outs)]
