"""Helpers shared by the amd tests: batching many rendered kernels into one LLVM module for one clang call."""
from __future__ import annotations

import re
import struct

import plugrad.engine.realize as realize
from plugrad.codegen import get_program
from plugrad.device import Device
from plugrad.codegen.targets import get_target
from plugrad.plugins.python import decode, interpret_gpu

from plugrad.runtime.compiler import CompileError
from plugrad_amd.compiler import AMDGPUCompiler, elf_symbols, pack, unpack

_GLOBAL = re.compile(r"@(?!llvm\.)([A-Za-z_][\w.]*)")


def merge(sources: list[str]) -> str:
  """One LLVM module holding every kernel: kernel k's globals get a k<k>_ prefix and its attribute group number k."""
  decls: set[str] = set()
  body: list[str] = []
  for k, src in enumerate(sources):
    for ln in src.splitlines():
      if ln.startswith("declare "): decls.add(ln)
      elif ln.startswith("target triple") or not ln: continue
      else: body.append(_GLOBAL.sub(lambda m, k=k: f"@k{k}_{m.group(1)}", ln).replace("#0", f"#{k}"))
  return "\n".join(['target triple = "amdgcn-amd-amdhsa"', *sorted(decls), *body, ""])


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


class ReferenceExecutor:
  """A test executor for the mock's dispatch hook that runs the kernel's *linear IR* (found through the realize engine's
  runner cache by kernel-descriptor address) with the PYTHON device's GPU interpreter, on the mock GPU's memory at the
  addresses the kernarg segment holds. It checks that the launch the runtime encoded (workgroups x work-items) is the
  one codegen planned (ProgramSpec.launch_dims with the kernarg's variable values), and records each Dispatch. It is
  independent of the RDNA3 emulator, which executes the machine code itself."""
  def __init__(self) -> None:
    self.dispatches: list = []
    self._linear: dict[int, list] = {}   # kernel-descriptor address -> the runner's linear IR (rendered once)

  def programs(self) -> dict[int, object]:
    return {r.prg.kd_addr: r for r in realize._RUNNERS.values() if hasattr(r.prg, "kd_addr")}

  def linear(self, runner) -> list:
    """The runner's linear IR: runners keep none, so its AST and opts (the runner cache's key) are rendered again the
    way get_runner does, checked to give the same source; once per runner (runners live as long as the process, so
    their descriptor addresses aren't reused)."""
    if (uops := self._linear.get(runner.prg.kd_addr)) is not None: return uops
    ast, opts = next((a, o) for (_, a, o), r in realize._RUNNERS.items() if r is runner)
    ren = Device[runner.device].renderer
    spec = get_program(ast, ren) if opts is None else get_program(ast, ren, list(opts))
    if spec.src != runner.spec.src: raise RuntimeError(f"{runner.spec.name}: rendering its AST again gave another program")
    self._linear[runner.prg.kd_addr] = spec.uops
    return spec.uops

  def __call__(self, mem, d) -> None:
    self.dispatches.append(d)
    runner = self.programs().get(d.kernel_object)
    if runner is None: raise RuntimeError(f"no known kernel at {d.kernel_object:#x}")
    spec = runner.spec
    n_bufs = 1 + max(g.arg for g in spec.globals)
    args = mem.read(d.kernarg_address, 8 * n_bufs + 4 * len(spec.vars))
    addrs = struct.unpack_from(f"<{n_bufs}Q", args)
    vals = struct.unpack_from(f"<{len(spec.vars)}i", args, 8 * n_bufs)
    groups = tuple(-(-g // w) for g, w in zip(d.grid_size, d.workgroup_size))
    want = spec.launch_dims({v.arg[0]: x for v, x in zip(spec.vars, vals)})
    assert (groups, d.workgroup_size) == want, (spec.name, groups, d.workgroup_size, want)
    sizes = {g.arg: g.dtype.size * g.dtype.base.itemsize for g in spec.globals}
    views = [mem.view(a, sizes.get(i, 0)) if i in sizes else None for i, a in enumerate(addrs)]
    interpret_gpu(decode(self.linear(runner), gpu=True), views, tuple(vals), groups, d.workgroup_size, get_target("AMD"))
