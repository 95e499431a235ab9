"""Helpers shared by the amd tests: batching many rendered kernels into one LLVM module for one clang call."""
from __future__ import annotations

import re

from plugrad.runtime.compiler import CompileError
from plugrad_amd.compiler import AMDGPUCompiler, elf_symbols, pack, unpack
from plugrad_amd.renderer import LAUNCH_TAG

_GLOBAL = re.compile(r"@(?!llvm\.)([A-Za-z_][\w.]*)")


def merge(sources: list[str]) -> str:
  """One LLVM module holding every kernel: kernel k's globals get a k<k>_ prefix and its attribute group number k."""
  decls: set[str] = set()
  body: list[str] = []
  for k, src in enumerate(sources):
    for ln in src.splitlines():
      if ln.startswith("declare "): decls.add(ln)
      elif ln.startswith(("target triple", ";")) or not ln: continue
      else: body.append(_GLOBAL.sub(lambda m, k=k: f"@k{k}_{m.group(1)}", ln).replace("#0", f"#{k}"))
  meta = '; ' + LAUNCH_TAG + ' {"grid":[1,1,1],"block":[1,1,1],"vars":[]}'
  return "\n".join(['target triple = "amdgcn-amd-amdhsa"', *sorted(decls), *body, meta, ""])


def compile_batched(sources: list[str], arch: str, batch: int = 200) -> tuple[int, list[str]]:
  """Compile in batches (one clang call each); a failing batch is retried kernel by kernel so failures carry the log.
  Returns (kernel descriptors found, failure messages)."""
  c = AMDGPUCompiler(arch)
  found, failures = 0, []
  for start in range(0, len(sources), batch):
    chunk = sources[start:start + batch]
    try: found += sum(1 for s in elf_symbols(unpack(c.compile(merge(chunk)))[1]) if s.endswith(".kd"))
    except CompileError:
      for s in chunk:
        try: found += sum(1 for n in elf_symbols(unpack(c.compile(s))[1]) if n.endswith(".kd"))
        except CompileError as e: failures.append(str(e)[:4000])
  return found, failures


__all__ = ["merge", "compile_batched", "pack"]
