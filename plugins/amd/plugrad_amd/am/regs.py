"""Registers of the GPU's IP blocks, built from the generated bindings and the IP discovery table.

A register of an IP block lives at `base[segment] + offset` dwords in the MMIO BAR: the offset and segment (`regNAME`,
`regNAME_BASE_IDX`) and the fields (`NAME__FIELD__SHIFT`, `NAME__FIELD_MASK`) come from the generated module of the
block's version (plugrad_amd.autogen.gc_11_0_0, ...), the segment bases from the discovery table. `IPRegs(name,
module, bases, mmio).CP_HQD_ACTIVE` is a `Reg` with read/write/update and field encoding by lower-case field name.
`MMIO` is how registers are reached: dword reads and writes of the BAR, and registers beyond the BAR through the
NBIO's RSMU index/data pair (set up by the driver once the NBIO block is known).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

MASK32 = (1 << 32) - 1


class RegisterError(RuntimeError, ValueError):
  """A register or field that the bindings of the block's version don't have, or a value that doesn't fit a field."""


class MMIO(Protocol):
  """Dword access to the register space: `addr` is the register's absolute dword address."""
  def read32(self, addr: int) -> int: ...
  def write32(self, addr: int, value: int) -> None: ...


@functools.lru_cache(None)
def field_table(module: ModuleType) -> dict[str, dict[str, tuple[int, int]]]:
  """{register name: {lower-case field: (shift, mask)}} of a generated register module."""
  out: dict[str, dict[str, tuple[int, int]]] = {}
  names = vars(module)
  for n, v in names.items():
    if not (m := re.fullmatch(r"(\w+?)__(\w+)__SHIFT", n)): continue
    mask = names.get(f"{m.group(1)}__{m.group(2)}_MASK")
    if mask is not None: out.setdefault(m.group(1), {})[m.group(2).lower()] = (v, mask)
  return out


def register_offsets(module: ModuleType) -> dict[str, tuple[int, int]]:
  """{register name: (offset, segment)} of a generated register module."""
  names = vars(module)
  return {n[3:]: (v, names[f"{n}_BASE_IDX"]) for n, v in names.items()
          if n.startswith("reg") and not n.endswith("_BASE_IDX") and f"{n}_BASE_IDX" in names}


@dataclass(frozen=True)
class Reg:
  """One register of one IP instance."""
  ip: str
  name: str
  addr: int  # absolute dword address
  fields: dict[str, tuple[int, int]]
  mmio: Any

  def encode(self, **values: int) -> int:
    out = 0
    for k, v in values.items():
      if k not in self.fields: raise RegisterError(f"{self.ip} register {self.name} has no field {k} (it has {', '.join(sorted(self.fields))})")
      shift, mask = self.fields[k]
      if (v << shift) & ~mask: raise RegisterError(f"{self.ip} {self.name}.{k} = {v:#x} does not fit the field (mask {mask:#x})")
      out |= v << shift
    return out

  def decode(self, value: int) -> dict[str, int]: return {k: (value & mask) >> shift for k, (shift, mask) in self.fields.items()}
  def read(self) -> int: return self.mmio.read32(self.addr)
  def field(self, name: str) -> int: return self.decode(self.read())[name]
  def write(self, value: int = 0, **fields: int) -> None: self.mmio.write32(self.addr, (value | self.encode(**fields)) & MASK32)

  def update(self, **fields: int) -> None:
    """Read-modify-write of the named fields."""
    v = self.read()
    for k in fields:
      if k not in self.fields: self.encode(**{k: 0})  # raises naming the field
      v &= ~self.fields[k][1]
    self.write(v | self.encode(**fields))


class IPRegs:
  """The registers of one IP instance by name without the `reg` prefix: `gc.CP_HQD_ACTIVE`."""
  def __init__(self, ip: str, module: ModuleType, bases: tuple[int, ...], mmio: Any) -> None:
    self.ip, self.module, self.bases, self.mmio = ip, module, bases, mmio
    self._offsets = register_offsets(module)
    self._fields = field_table(module)
    self._regs: dict[str, Reg] = {}

  def has(self, name: str) -> bool: return name in self._offsets

  def __getattr__(self, name: str) -> Reg:
    if name.startswith("_"): raise AttributeError(name)
    if (r := self._regs.get(name)) is not None: return r
    if name not in self._offsets: raise RegisterError(f"{self.ip} ({self.module.__name__.rsplit('.', 1)[-1]}) has no register {name}")
    off, seg = self._offsets[name]
    if seg >= len(self.bases) or (seg and not self.bases[seg]):
      raise RegisterError(f"{self.ip} register {name} is in segment {seg}, which the discovery table doesn't give ({self.bases})")
    self._regs[name] = r = Reg(self.ip, name, self.bases[seg] + off, self._fields.get(name, {}), self.mmio)
    return r

  def pair(self, lo: str, hi: str, value: int) -> None:
    """Write a 64-bit value into a LO/HI register pair."""
    getattr(self, lo).write(value & MASK32)
    getattr(self, hi).write(value >> 32)
