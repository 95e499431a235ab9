"""Text form of decoded instructions in LLVM's AMDGPU assembly syntax, for error messages and for the tests that
cross-check the decoder against llvm-objdump. Register tuples are printed by their first register (`v[2:3]` -> `v2`):
operand widths are implied by the mnemonic, so `normalize()` brings llvm-objdump text to the same form."""
from __future__ import annotations

import re

from plugrad_amd.mock.rdna3 import isa
from plugrad_amd.mock.rdna3.compile import VALU
from plugrad_amd.mock.rdna3.decode import DPP_SRC, Inst

_SPECIAL = {106: "vcc_lo", 107: "vcc_hi", 124: "null", 125: "m0", 126: "exec_lo", 127: "exec_hi", 253: "scc", 235: "src_shared_base",
            236: "src_shared_limit", 237: "src_private_base", 238: "src_private_limit"}
_FLOATS = {240: "0.5", 241: "-0.5", 242: "1.0", 243: "-1.0", 244: "2.0", 245: "-2.0", 246: "4.0", 247: "-4.0", 248: "0.15915494"}


def operand(code: int, lit: int | None) -> str:
  if code == DPP_SRC: return "<dpp>"
  if code >= 256: return f"v{code - 256}"
  if code in _SPECIAL: return _SPECIAL[code]
  if code < 106: return f"s{code}"
  if 108 <= code <= 123: return f"ttmp{code - 108}"
  if 128 <= code <= 192: return str(code - 128)
  if 193 <= code <= 208: return str(-(code - 192))
  if code in _FLOATS: return _FLOATS[code]
  if code == 255: return f"{lit:#x}"
  return f"?{code}"


def _mod(s: str, i: int, absm: int, negm: int) -> str:
  if absm >> i & 1: s = f"|{s}|"
  if negm >> i & 1: s = f"-{s}"
  return s


def _dpp_text(inst: Inst) -> list[str]:
  d = inst.dpp["word"]
  if inst.dpp["kind"] == "dpp8":
    return [f"dpp8:[{','.join(str((d >> (8 + 3 * i)) & 7) for i in range(8))}]"] + (["fi:1"] if inst.dpp["fi"] else [])
  ctrl, n = (d >> 8) & 0x1FF, (d >> 8) & 0xF
  if ctrl <= 0xFF: out = [f"quad_perm:[{','.join(str((ctrl >> (2 * i)) & 3) for i in range(4))}]"]
  else:
    names = {0x100: "row_shl", 0x110: "row_shr", 0x120: "row_ror", 0x150: "row_share", 0x160: "row_xmask"}
    out = ["row_mirror" if ctrl == 0x140 else "row_half_mirror" if ctrl == 0x141 else f"{names.get(ctrl & 0x1F0, '?')}:{n}"]
  out += [f"row_mask:{(d >> 28) & 0xF:#x}", f"bank_mask:{(d >> 24) & 0xF:#x}"]
  if d >> 19 & 1: out.append("bound_ctrl:1")
  if d >> 18 & 1: out.append("fi:1")
  return out


def mnemonic(inst: Inst) -> str:
  name = inst.name or f"<{inst.enc} {inst.op}>"
  if getattr(inst, "dpp", None): return name if inst.enc == "VOPC" else name + "_dpp"
  if inst.enc in ("VOP1", "VOP2", "VOPC") and name not in isa.NO_SUFFIX: return name + "_e32"
  if inst.enc in ("VOP3", "VOP3SD") and inst.op < 512 and name not in ("v_readlane_b32",): return name + "_e64"
  return name


def _vop3_srcs(inst: Inst, n: int) -> list[str]:
  return [_mod(operand(s, inst.lit), i, inst.abs, inst.neg) for i, s in enumerate((inst.src0, inst.src1, inst.src2)[:n])]


def _nsrc(name: str) -> int:
  if name in VALU: return len(VALU[name][0])
  if name.startswith(("v_cmp", "v_cndmask")) or name in ("v_readlane_b32", "v_writelane_b32", "v_mbcnt_lo_u32_b32", "v_mbcnt_hi_u32_b32",
                                                         "v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32"):
    return 3 if name.startswith("v_cndmask") else 2
  return 3


def operands(inst: Inst) -> list[str]:
  """Operand list (without the mnemonic) in llvm-objdump's order."""
  e, lit = inst.enc, inst.lit
  if e == "SOP1": return [operand(inst.sdst, lit), operand(inst.ssrc0, lit)] if inst.name not in ("s_getpc_b64", "s_setpc_b64") else (
    [operand(inst.sdst, lit)] if inst.name == "s_getpc_b64" else [operand(inst.ssrc0, lit)])
  if e == "SOP2": return [operand(inst.sdst, lit), operand(inst.ssrc0, lit), operand(inst.ssrc1, lit)]
  if e == "SOPC": return [operand(inst.ssrc0, lit), operand(inst.ssrc1, lit)]
  if e == "SOPK": return [operand(inst.sdst, lit), f"{inst.simm16:#x}"]
  if e == "SOPP":
    return [str(inst.simm16)] if inst.name and "branch" in inst.name else []
  if e == "SMEM":
    off = operand(inst.soffset, None) if inst.soffset != 124 else (f"{inst.offset:#x}" if inst.offset else "null")
    return [f"s{inst.sdata}", f"s{inst.sbase}", off]
  if e == "VOP1":
    if inst.name == "v_nop": return []
    return [operand(inst.vdst, None) if inst.name == "v_readfirstlane_b32" else f"v{inst.vdst}", operand(inst.src0, lit)]
  if e == "VOP2":
    d, a, b = f"v{inst.vdst}", operand(inst.src0, lit), operand(inst.vsrc1, lit)
    if inst.name in ("v_add_co_ci_u32", "v_sub_co_ci_u32", "v_subrev_co_ci_u32"): return [d, "vcc_lo", a, b, "vcc_lo"]
    if inst.name == "v_cndmask_b32": return [d, a, b, "vcc_lo"]
    if inst.name in ("v_fmamk_f32", "v_fmamk_f16"): return [d, a, f"{lit:#x}", b]
    if inst.name in ("v_fmaak_f32", "v_fmaak_f16"): return [d, a, b, f"{lit:#x}"]
    return [d, a, b]
  if e == "VOPC":
    srcs = [operand(inst.src0, lit), operand(inst.vsrc1, lit)]
    return srcs if inst.name and inst.name.startswith("v_cmpx") else ["vcc_lo", *srcs]
  if e in ("VOP3", "VOP3SD"):
    name = inst.name or ""
    n = _nsrc(name)
    srcs = _vop3_srcs(inst, n)
    if e == "VOP3SD": out = [f"v{inst.vdst}", operand(inst.sdst, None), *srcs]
    elif name.startswith("v_cmpx"): out = srcs
    elif name.startswith("v_cmp") or name in ("v_readlane_b32", "v_readfirstlane_b32"): out = [operand(inst.vdst, None), *srcs]
    else: out = [f"v{inst.vdst}", *srcs]
    if inst.opsel: out.append(f"op_sel:[{','.join(str(inst.opsel >> i & 1) for i in range(min(n, 3)))},{inst.opsel >> 3 & 1}]")
    if inst.clamp: out.append("clamp")
    if inst.omod: out.append({1: "mul:2", 2: "mul:4", 3: "div:2"}[inst.omod])
    return out
  if e == "VOP3P":
    name = inst.name or ""
    three = name.startswith(("v_wmma", "v_dot", "v_fma_mix", "v_pk_fma", "v_pk_mad"))
    n = 3 if three else 2
    out = [f"v{inst.vdst}", *(operand(s, lit) for s in (inst.src0, inst.src1, inst.src2)[:n])]
    bits = lambda v: "[" + ",".join(str(v >> i & 1) for i in range(n)) + "]"
    mix = name.startswith("v_fma_mix")
    if inst.opsel: out.append(f"op_sel:{bits(inst.opsel)}")
    full = (1 << n) - 1
    if ((inst.opsel_hi & full) != full and not mix and not name.startswith("v_wmma")) or (mix and inst.opsel_hi):
      out.append(f"op_sel_hi:{bits(inst.opsel_hi)}")
    if inst.neg: out.append(f"neg_lo:{bits(inst.neg)}")
    if inst.neg_hi: out.append(f"neg_hi:{bits(inst.neg_hi)}")
    if inst.clamp: out.append("clamp")
    return out
  if e == "VOPD":
    def half(op: int, d: int, s0: int, s1: int) -> list[str]:
      if op == 8: return [f"v{d}", operand(s0, lit)]
      if op == 1: return [f"v{d}", operand(s0, lit), operand(s1, lit), f"{lit:#x}"]
      if op == 2: return [f"v{d}", operand(s0, lit), f"{lit:#x}", operand(s1, lit)]
      return [f"v{d}", operand(s0, lit), operand(s1, lit)]
    return half(inst.opx, inst.vdstx, inst.srcx0, inst.vsrcx1) + ["::"] + half(inst.opy, inst.vdsty, inst.srcy0, inst.vsrcy1)
  if e == "DS":
    name = inst.name or ""
    out = []
    if "load" in name or "_rtn_" in name or "permute" in name: out.append(f"v{inst.vdst}")
    out.append(f"v{inst.vaddr}")
    if "store" in name or "_rtn_" in name or "permute" in name or name.startswith("ds_") and "load" not in name: out.append(f"v{inst.data0}")
    if "store_2addr" in name: out.append(f"v{inst.data1}")
    if "2addr" in name:
      if inst.offset0: out.append(f"offset0:{inst.offset0}")
      if inst.offset1: out.append(f"offset1:{inst.offset1}")
    elif inst.offset0 | inst.offset1 << 8: out.append(f"offset:{inst.offset0 | inst.offset1 << 8}")
    return out
  if e in ("GLOBAL", "FLAT", "SCRATCH"):
    name = inst.name or ""
    out = [f"v{inst.vdst}"] if "load" in name or (inst.glc and "atomic" in name) else []
    if e == "SCRATCH": out.append(f"v{inst.vaddr}" if inst.sve else "off")
    else: out.append(f"v{inst.vaddr}")
    if "store" in name or "atomic" in name: out.append(f"v{inst.data}")
    if e != "FLAT": out.append(operand(inst.saddr, None) if inst.saddr != 124 else "off")
    if inst.offset: out.append(f"offset:{inst.offset}")
    if inst.glc: out.append("glc")
    if inst.slc: out.append("slc")
    if inst.dlc: out.append("dlc")
    return out
  return []


_KEYWORDS = ("clamp", "glc", "slc", "dlc")


def text(inst: Inst) -> str:
  if getattr(inst, "dpp", None):
    ops = [t.replace("<dpp>", f"v{inst.dpp_src - 256}") for t in operands(inst)]
    return " ".join([mnemonic(inst) + " " + ", ".join(ops), *_dpp_text(inst)])
  if inst.enc == "VOPD":
    toks = operands(inst)
    cut = toks.index("::")
    return f"{inst.namex} {', '.join(toks[:cut])} :: {inst.namey} {', '.join(toks[cut + 1:])}"
  toks = operands(inst)
  ops = [t for t in toks if not (t in _KEYWORDS or (":" in t and t != "::"))]
  mods = [t for t in toks if t not in ops]
  return " ".join([mnemonic(inst) + " " + ", ".join(ops), *mods]).strip().replace(", ::, ", " :: ")


_RANGE = re.compile(r"\b([sv])\[(\d+):\d+\]")


def normalize(line: str) -> str:
  """llvm-objdump instruction text -> the form `text()` produces."""
  line = line.split("//")[0].strip()
  line = _RANGE.sub(lambda m: f"{m.group(1)}{m.group(2)}", line)
  line = re.sub(r"\s+", " ", line)
  return line
