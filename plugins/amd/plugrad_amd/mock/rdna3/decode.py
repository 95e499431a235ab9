"""Decoder of RDNA3 (gfx1100) machine code into `Inst` records: the microcode formats of AMD's RDNA3 ISA reference
guide (SOP1/SOP2/SOPK/SOPC/SOPP, SMEM, VOP1/VOP2/VOPC/VOP3/VOP3SD/VOP3P/VOPD, DS, FLAT/GLOBAL/SCRATCH, MUBUF cache ops).
Operands keep their 9-bit source encoding (0-105 SGPRs, 106 vcc_lo, 124 null, 125 m0, 126 exec_lo, 128-208 inline
integers, 240-248 inline floats, 253 scc, 255 literal, 256-511 VGPRs)."""
from __future__ import annotations

import struct
from typing import Any

from plugrad_amd.mock.rdna3 import isa

LITERAL = 255
DPP_SRC = 1000  # src0 stand-in for a DPP-permuted VGPR (the real register is Inst.dpp_src)


class DecodeError(Exception):
  """Bits that are not an instruction this decoder knows."""


class Inst:
  """One decoded instruction: encoding name, opcode, mnemonic (None if unknown), byte offset, size and its fields."""
  enc: str
  op: Any
  name: str | None
  addr: int
  size: int
  lit: int | None

  def __init__(self, enc: str, op: Any, name: str | None, **fields: Any):
    self.enc, self.op, self.name, self.lit = enc, op, name, None
    self.__dict__.update(fields)

  def __repr__(self) -> str:
    return f"Inst({self.enc} {self.name or self.op} @{self.addr:#x})"


def _bits(w: int, hi: int, lo: int) -> int:
  return (w >> lo) & ((1 << (hi - lo + 1)) - 1)


def _sop(w: int) -> Inst:
  if _bits(w, 31, 23) == 0x17D: return Inst("SOP1", o := _bits(w, 15, 8), isa.SOP1.get(o), sdst=_bits(w, 22, 16), ssrc0=_bits(w, 7, 0))
  if _bits(w, 31, 23) == 0x17E:
    return Inst("SOPC", o := _bits(w, 22, 16), isa.SOPC.get(o), ssrc0=_bits(w, 7, 0), ssrc1=_bits(w, 15, 8))
  if _bits(w, 31, 23) == 0x17F: return Inst("SOPP", o := _bits(w, 22, 16), isa.SOPP.get(o), simm16=_bits(w, 15, 0))
  if _bits(w, 31, 28) == 0xB: return Inst("SOPK", o := _bits(w, 27, 23), isa.SOPK.get(o), sdst=_bits(w, 22, 16), simm16=_bits(w, 15, 0))
  return Inst("SOP2", o := _bits(w, 29, 23), isa.SOP2.get(o), sdst=_bits(w, 22, 16), ssrc0=_bits(w, 7, 0), ssrc1=_bits(w, 15, 8))


def _vop(w: int) -> Inst:
  if _bits(w, 31, 25) == 0x3F:
    return Inst("VOP1", o := _bits(w, 16, 9), isa.VOP1.get(o), vdst=_bits(w, 24, 17), src0=_bits(w, 8, 0))
  if _bits(w, 31, 25) == 0x3E:
    return Inst("VOPC", o := _bits(w, 24, 17), isa.VOPC.get(o), src0=_bits(w, 8, 0), vsrc1=256 + _bits(w, 16, 9))
  return Inst("VOP2", o := _bits(w, 30, 25), isa.VOP2.get(o), vdst=_bits(w, 24, 17), src0=_bits(w, 8, 0), vsrc1=256 + _bits(w, 16, 9))


def _vop3(w: int, w2: int) -> Inst:
  op = _bits(w, 25, 16)
  f = dict(vdst=_bits(w, 7, 0), src0=_bits(w2, 8, 0), src1=_bits(w2, 17, 9), src2=_bits(w2, 26, 18), neg=_bits(w2, 31, 29),
           omod=_bits(w2, 28, 27), clamp=_bits(w, 15, 15))
  if op in isa.VOP3SD: return Inst("VOP3SD", op, isa.VOP3.get(op), sdst=_bits(w, 14, 8), abs=0, opsel=0, **f)
  return Inst("VOP3", op, isa.VOP3.get(op), abs=_bits(w, 10, 8), opsel=_bits(w, 14, 11), **f)


def _vop3p(w: int, w2: int) -> Inst:
  return Inst("VOP3P", o := _bits(w, 22, 16), isa.VOP3P.get(o), vdst=_bits(w, 7, 0), src0=_bits(w2, 8, 0), src1=_bits(w2, 17, 9),
              src2=_bits(w2, 26, 18), neg=_bits(w2, 31, 29), neg_hi=_bits(w, 10, 8), opsel=_bits(w, 13, 11),
              opsel_hi=_bits(w2, 28, 27) | (_bits(w, 14, 14) << 2), clamp=_bits(w, 15, 15))


def _vopd(w: int, w2: int) -> Inst:
  ox, oy = _bits(w, 25, 22), _bits(w, 21, 17)
  vdstx = _bits(w2, 31, 24)
  vdsty = (_bits(w2, 23, 17) << 1) | ((vdstx & 1) ^ 1)
  nx, ny = isa.VOPD_X.get(ox), isa.VOPD_Y.get(oy)
  return Inst("VOPD", (ox, oy), f"{nx}::{ny}" if nx and ny else None, opx=ox, opy=oy, namex=nx, namey=ny, srcx0=_bits(w, 8, 0),
              vsrcx1=256 + _bits(w, 16, 9), vdstx=vdstx, srcy0=_bits(w2, 8, 0), vsrcy1=256 + _bits(w2, 16, 9), vdsty=vdsty)


def _ds(w: int, w2: int) -> Inst:
  return Inst("DS", o := _bits(w, 25, 18), isa.DS.get(o), offset0=_bits(w, 7, 0), offset1=_bits(w, 15, 8), gds=_bits(w, 17, 17),
              vaddr=_bits(w2, 7, 0), data0=_bits(w2, 15, 8), data1=_bits(w2, 23, 16), vdst=_bits(w2, 31, 24))


def _flat(w: int, w2: int) -> Inst:
  seg, op = _bits(w, 17, 16), _bits(w, 24, 18)
  enc, table = {0: ("FLAT", isa.FLAT), 1: ("SCRATCH", isa.SCRATCH), 2: ("GLOBAL", isa.GLOBAL)}.get(seg, ("FLAT?", {}))
  off = _bits(w, 12, 0)
  return Inst(enc, op, table.get(op), offset=off - (1 << 13) if off & (1 << 12) else off, dlc=_bits(w, 13, 13), glc=_bits(w, 14, 14),
              slc=_bits(w, 15, 15), vaddr=_bits(w2, 7, 0), data=_bits(w2, 15, 8), saddr=_bits(w2, 22, 16), sve=_bits(w2, 23, 23),
              vdst=_bits(w2, 31, 24))


def _smem(w: int, w2: int) -> Inst:
  off = _bits(w2, 20, 0)
  return Inst("SMEM", o := _bits(w, 25, 18), isa.SMEM.get(o), sdata=_bits(w, 12, 6), sbase=_bits(w, 5, 0) * 2, glc=_bits(w, 14, 14),
              dlc=_bits(w, 13, 13), offset=off - (1 << 21) if off & (1 << 20) else off, soffset=_bits(w2, 31, 25))


_TWO_DWORD = {0x35: _vop3, 0x33: _vop3p, 0x32: _vopd, 0x36: _ds, 0x37: _flat, 0x3D: _smem}


def _sources(inst: Inst) -> list[int]:
  if inst.enc in ("SOP1", "SOP2", "SOPC"): return [getattr(inst, k) for k in ("ssrc0", "ssrc1") if hasattr(inst, k)]
  if inst.enc in ("VOP1", "VOP2", "VOPC"): return [inst.src0]
  if inst.enc in ("VOP3", "VOP3SD", "VOP3P"): return [inst.src0, inst.src1, inst.src2]
  if inst.enc == "VOPD": return [inst.srcx0, inst.srcy0]
  return []


def _needs_literal(inst: Inst) -> bool:
  if inst.name in ("v_fmamk_f32", "v_fmaak_f32", "v_fmamk_f16", "v_fmaak_f16"): return True
  if inst.enc == "VOPD" and (inst.opx in (1, 2) or inst.opy in (1, 2)): return True
  return LITERAL in _sources(inst)


def decode_one(code: bytes, pos: int) -> Inst:
  """Decode the instruction starting at byte `pos` of `code`."""
  if pos + 4 > len(code): raise DecodeError(f"code ends inside the instruction at offset {pos:#x}")
  w = struct.unpack_from("<I", code, pos)[0]
  top2, top6 = w >> 30, w >> 26
  fn = _TWO_DWORD.get(top6)
  if top6 == 0x38:  # MUBUF: only the cache invalidations carry no operands we need
    if pos + 8 > len(code): raise DecodeError(f"code ends inside the instruction at offset {pos:#x}")
    inst, size = Inst("MUBUF", o := _bits(w, 25, 18), isa.MUBUF.get(o)), 8
  elif fn is not None:
    if pos + 8 > len(code): raise DecodeError(f"code ends inside the instruction at offset {pos:#x}")
    inst, size = fn(w, struct.unpack_from("<I", code, pos + 4)[0]), 8
  elif top2 == 0b10: inst, size = _sop(w), 4
  elif w >> 31 == 0: inst, size = _vop(w), 4
  else: raise DecodeError(f"unknown RDNA3 encoding {w:#010x} at offset {pos:#x}")
  if inst.enc in ("VOP1", "VOP2", "VOPC") and inst.src0 in (233, 234, 250):  # DPP: one more dword with src0 and the lane pattern
    if pos + size + 4 > len(code): raise DecodeError(f"code ends inside the DPP word of the instruction at offset {pos:#x}")
    d = struct.unpack_from("<I", code, pos + size)[0]
    inst.dpp = {"kind": "dpp16" if inst.src0 == 250 else "dpp8", "word": d, "fi": inst.src0 == 234 or bool(d >> 18 & 1)}
    inst.dpp_src, inst.src0 = 256 + (d & 0xFF), DPP_SRC
    size += 4
  if _needs_literal(inst):
    if pos + size + 4 > len(code): raise DecodeError(f"code ends inside the literal of the instruction at offset {pos:#x}")
    inst.lit = struct.unpack_from("<I", code, pos + size)[0]
    size += 4
  inst.addr, inst.size = pos, size
  return inst


def decode(code: bytes, start: int = 0, end: int | None = None) -> list[Inst]:
  """Decode `code[start:end]` linearly; stops after s_code_end (trailing padding)."""
  out: list[Inst] = []
  pos, end = start, len(code) if end is None else end
  while pos < end:
    inst = decode_one(code, pos)
    if inst.name == "s_code_end": break
    out.append(inst)
    pos += inst.size
  return out
