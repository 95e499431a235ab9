"""Devices: the `Device` registry, the DEV grammar, and the backend interface plugins implement.

Backend interface (see docs/backends.md): a device class derives from `Compiled` and owns an `Allocator`
(usually an `LRUAllocator`), one or more `Renderer` classes, a `Compiler` and a `Program` class. `Buffer` is the
device-independent handle the rest of plugrad uses. GPU plugins build on `plugrad.runtime.hcq`.
"""
from __future__ import annotations
import os
import re
import threading
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence, Union
from plugrad.helpers import getenv
from plugrad.viz import capture
from plugrad.runtime.compiler import CompileError, Compiler, UnsupportedCompiler
from plugrad.runtime.renderer import Renderer, choose_renderer

if TYPE_CHECKING:
  import numpy as np
  from plugrad.dtype import DType
  from plugrad.plugins.loader import DeviceEntry, PluginRegistry

__all__ = ["Device", "DeviceName", "Buffer", "BufferOptions", "Allocator", "LRUAllocator", "Compiled", "Program", "Compiler",
           "CompileError", "Renderer", "DeviceError", "DeviceWarning", "DeviceNotFoundError", "DeviceUnavailableError", "PATH_DEVICES"]

# ---------------------------------------------------------------------------- DEV grammar

DEV_GRAMMAR = "[IFACE+]DEVICE[:index][:RENDERER[:ARCH]]"
PATH_DEVICES = frozenset({"DISK"})
"""Devices whose argument is a file path: everything after 'DISK:' is the path, so ':' in paths is fine."""

# an interface may itself be layered: MOCK+PCI+AMD is the PCI interface on a mock (iface "MOCK+PCI")
_DEV_RE = re.compile(r"(?:(?P<iface>[A-Za-z][A-Za-z0-9_]*(?:\+[A-Za-z][A-Za-z0-9_]*)*)\+)?(?P<device>[A-Za-z][A-Za-z0-9_]*)"
                     r"(?::(?P<index>\d*)(?::(?P<renderer>[A-Za-z0-9_]*)(?::(?P<arch>[A-Za-z0-9_.+-]+))?)?)?")

@dataclass(frozen=True)
class DeviceName:
  """A parsed device string. `canonical` is the cache key: upper-case names, index 0 dropped, arch and path kept as given."""
  device: str
  index: int = 0
  iface: str | None = None
  renderer: str | None = None
  arch: str | None = None
  path: str | None = None

  @property
  def canonical(self) -> str:
    head = (f"{self.iface}+" if self.iface else "") + self.device
    if self.path is not None: return f"{head}:{self.path}"
    tail = [str(self.index) if self.index else "", self.renderer or "", self.arch or ""]
    while tail and not tail[-1]: tail.pop()
    return ":".join([head, *tail])

def _malformed(name: object, why: str) -> ValueError:
  return ValueError(f"malformed device string {name!r} ({why}): expected {DEV_GRAMMAR}, e.g. CPU, NV:1, AMD::gfx1100, PCI+AMD, "
                    "DISK:/path/to/file")

def parse_device(name: str) -> DeviceName:
  """Parse a device string like 'cpu', 'NV:1', 'AMD::gfx1100', 'PCI+AMD', 'CPU::LLVM:x86', 'disk:/tmp/f'."""
  if not isinstance(name, str): raise TypeError(f"device must be a string like 'CPU' or 'NV:1', got {type(name).__name__} {name!r}")
  s = name.strip()
  head, sep, rest = s.partition(":")
  if head.upper() in PATH_DEVICES:
    if sep and not rest: raise _malformed(name, f"empty path after '{head.upper()}:'")
    return DeviceName(head.upper(), path=rest if sep else None)
  if not (m := _DEV_RE.fullmatch(s)): raise _malformed(name, "unexpected characters or structure")
  idx, ren, arch = m["index"], m["renderer"], m["arch"]
  if idx == "" and ren is None: raise _malformed(name, "trailing ':' without an index")
  if ren == "" and arch is None: raise _malformed(name, "empty renderer without an arch")
  return DeviceName(m["device"].upper(), int(idx or 0), m["iface"].upper() if m["iface"] else None, ren.upper() if ren else None, arch)

_CANONICAL: dict[str, str] = {}  # canonicalize is pure string work: remembered per name (every Buffer asks)


def canonicalize(name: str) -> str:
  """Canonical form of a device string: 'cpu:0' -> 'CPU', 'nv:1' -> 'NV:1', 'disk:/x' -> 'DISK:/x'. Pure string work."""
  if type(name) is str and (c := _CANONICAL.get(name)) is not None: return c
  c = parse_device(name).canonical
  if len(_CANONICAL) < 4096: _CANONICAL[name] = c
  return c

# ---------------------------------------------------------------------------- memory

@dataclass(frozen=True)
class BufferOptions:
  """Allocation flags. Devices ignore the ones that mean nothing to them."""
  host: bool = False              # host-visible memory (staging buffers)
  cpu_access: bool = False        # device memory mapped for CPU access
  uncached: bool = False          # bypass CPU caches (signal pages, doorbells)
  nolru: bool = False             # never keep in the LRU cache; free immediately
  external_ptr: int | None = None # wrap memory someone else owns
  zeroed: bool = False            # reads as zero when allocated (an allocator that can't promise it gets it zero-filled)

DEFAULT_OPTIONS = BufferOptions()

MAX_BUFFER_BYTES = 2**63 - 1  # byte offsets are int64 everywhere: no device can address a larger buffer

def human_bytes(n: int) -> str:
  """n bytes as '1.5 GiB' (binary units), for error messages."""
  for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
    if n < 1024: return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
  return f"{n:.1f} EiB"

class Allocator:
  """Device memory. Subclasses implement `_alloc/_free/_copyin/_copyout` and optionally `_offset` and `_transfer`.

  Opaque handles returned by `alloc` are passed back to the same allocator and to the device's Program class.
  """
  external_memory: bool = False  # True where `BufferOptions(external_ptr=...)` wraps host memory (Tensor.from_blob)
  zeroes_memory: bool = False    # True where `BufferOptions(zeroed=True)` allocations already read as zero

  def __init__(self, dev: Compiled | None = None) -> None: self.dev = dev

  def alloc(self, size: int, options: BufferOptions | None = None) -> Any:
    if not isinstance(size, int) or size < 0: raise ValueError(f"allocation size must be a non-negative int of bytes, got {size!r}")
    return self._alloc(size, options or DEFAULT_OPTIONS)
  def free(self, opaque: Any, size: int, options: BufferOptions | None = None) -> None: self._free(opaque, size, options or DEFAULT_OPTIONS)
  def release(self, opaque: Any, size: int, options: BufferOptions | None = None) -> None:
    """Free memory for good: a caching allocator's `free` keeps it for the next allocation of that size."""
    self._free(opaque, size, options or DEFAULT_OPTIONS)
  def copyin(self, dest: Any, src: memoryview) -> None: self._copyin(dest, src)
  def copyout(self, dest: memoryview, src: Any) -> None: self._copyout(dest, src)
  def discard(self, opaque: Any, size: int, offset: int = 0) -> None:
    """Bytes [offset, offset+size) of `opaque` hold nothing anyone will read: the device may take their memory back
    (the buffer stays allocated, and those bytes read as anything until written again). By default it keeps it."""
  def as_host(self, opaque: Any) -> memoryview | None:
    """The buffer's bytes as a host memoryview (no copy) when the memory is host-visible (DISK's mmap), else None."""
    return None
  def offset(self, opaque: Any, size: int, offset: int) -> Any:
    """A handle to bytes [offset, offset+size) of `opaque`, sharing its memory."""
    if not self.supports_offset: raise NotImplementedError(f"{type(self).__name__} does not support offset views")
    return self._offset(opaque, size, offset)
  def transfer(self, dest: Any, src: Any, nbytes: int, src_dev: Compiled, dest_dev: Compiled) -> None:
    """Device-to-device copy without going through the host; only when `supports_transfer`."""
    if not self.supports_transfer: raise NotImplementedError(f"{type(self).__name__} does not support device-to-device transfer")
    self._transfer(dest, src, nbytes, src_dev, dest_dev)

  @property
  def supports_offset(self) -> bool: return type(self)._offset is not Allocator._offset
  @property
  def supports_transfer(self) -> bool: return type(self)._transfer is not Allocator._transfer

  def _alloc(self, size: int, options: BufferOptions) -> Any: raise NotImplementedError
  def _free(self, opaque: Any, size: int, options: BufferOptions) -> None: pass
  def _copyin(self, dest: Any, src: memoryview) -> None: raise NotImplementedError
  def _copyout(self, dest: memoryview, src: Any) -> None: raise NotImplementedError
  def _offset(self, opaque: Any, size: int, offset: int) -> Any: raise NotImplementedError
  def _transfer(self, dest: Any, src: Any, nbytes: int, src_dev: Compiled, dest_dev: Compiled) -> None: raise NotImplementedError

class LRUAllocator(Allocator):
  """An allocator that keeps freed buffers and hands them out again for the same (size, options).

  On MemoryError the cache is released and the allocation retried once. LRU=0 in the environment disables caching.
  """
  def __init__(self, dev: Compiled | None = None) -> None:
    super().__init__(dev)
    self.cache: dict[tuple[int, BufferOptions], list[Any]] = defaultdict(list)

  def alloc(self, size: int, options: BufferOptions | None = None) -> Any:
    opts = options or DEFAULT_OPTIONS
    if not opts.zeroed and (hit := self.cache.get((size, opts))): return hit.pop()   # (a freed buffer is no longer zero)
    try: return super().alloc(size, opts)
    except MemoryError:
      self.free_cache()
      return super().alloc(size, opts)

  def free(self, opaque: Any, size: int, options: BufferOptions | None = None) -> None:
    opts = options or DEFAULT_OPTIONS
    if getenv("LRU", True) and not opts.nolru and not opts.zeroed and opts.external_ptr is None: self.cache[(size, opts)].append(opaque)
    else: super().free(opaque, size, opts)

  def free_cache(self) -> None:
    """Really free every cached buffer."""
    for (size, opts), handles in self.cache.items():
      for h in handles: self._free(h, size, opts)
    self.cache.clear()

  @property
  def cached_bytes(self) -> int: return sum(size * len(hs) for (size, _), hs in self.cache.items())

def _as_bytes(src: Any) -> memoryview:
  """A flat byte view of bytes/bytearray/memoryview/numpy data; anything else is a TypeError."""
  if hasattr(src, "__array_interface__") and not isinstance(src, memoryview):
    import numpy as np
    src = np.ascontiguousarray(src)
  try: mv = memoryview(src)
  except TypeError: raise TypeError(f"expected bytes, bytearray, memoryview or a numpy array, got {type(src).__name__}") from None
  if not mv.c_contiguous: raise ValueError("buffer data must be C-contiguous")
  return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv

class Buffer:
  """`size` elements of `dtype` on `device`, allocated lazily. A view (`base` + byte `offset`) shares its base's memory.

  Memory is returned to the allocator when the base Buffer is garbage collected or `deallocate()`d; views keep
  their base alive, so no refcounting is needed. `internal`: an intermediate of one schedule that no tensor can see
  once that schedule ran (set by the scheduler's memory planner); a TinyJit capture may move it into its arena.
  """
  internal: bool = False

  def __init__(self, device: str, size: int, dtype: DType, options: BufferOptions | None = None, *, base: Buffer | None = None,
               offset: int = 0, opaque: Any = None) -> None:
    if not isinstance(size, int) or size < 0: raise ValueError(f"Buffer size must be a non-negative int of elements, got {size!r}")
    self.device, self.size, self.dtype, self.options = canonicalize(device), size, dtype, options
    self._base: Buffer | None = None
    self.offset, self._buf, self._owned = offset, None, False
    if base is not None:
      if base._base is not None: base, offset = base._base, offset + base.offset
      if base.device != self.device: raise ValueError(f"view on {self.device} of a buffer on {base.device}")
      if offset < 0 or offset + self.nbytes > base.nbytes:
        raise ValueError(f"view of {self.nbytes} bytes at offset {offset} does not fit in base buffer of {base.nbytes} bytes")
      self._base, self.offset = base, offset
    if opaque is not None: self.allocate(opaque)

  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def base(self) -> Buffer: return self._base if self._base is not None else self
  @property
  def is_allocated(self) -> bool: return self._buf is not None
  @property
  def allocator(self) -> Allocator:
    if (a := self.__dict__.get("_allocator")) is None: a = self.__dict__["_allocator"] = Device[self.device].allocator
    return a  # kept once looked up, so freeing a buffer (possibly from gc) never touches the device registry

  def allocate(self, opaque: Any = None) -> Buffer:
    """Allocate device memory (or adopt `opaque`); a view allocates its base and takes an offset handle."""
    if self._buf is not None: raise RuntimeError(f"{self!r} is already allocated")
    if self._base is not None:
      self._base.ensure_allocated()
      self._buf = self.allocator.offset(self._base._buf, self.nbytes, self.offset)
    else:
      self._buf = opaque if opaque is not None else self._alloc()
      self._owned = opaque is None
      if self._owned and self.options is not None and self.options.zeroed and not self.allocator.zeroes_memory:
        self.copyin(memoryview(bytearray(self.nbytes)))   # BufferOptions.zeroed on an allocator that can't promise it
      if capture.PROFILE and self._owned:  # PROFILE=1: memory in use
        capture.TRACE.mem_change(self.device, self.nbytes)
        self._mem_epoch = capture.TRACE.mem_epoch
    return self

  def ensure_allocated(self) -> Buffer: return self if self._buf is not None else self.allocate()

  def _alloc(self) -> Any:
    """The allocator's handle for this buffer; a MemoryError naming device, size and buffer when there is no memory."""
    try:
      if self.nbytes > MAX_BUFFER_BYTES: raise MemoryError("more than any device can address")
      return self.allocator.alloc(self.nbytes, self.options)
    except MemoryError as e:
      raise MemoryError(f"{self.device}: can't allocate {human_bytes(self.nbytes)} ({self.nbytes} bytes) for {self!r}: {e}") from None

  def deallocate(self, cache: bool = True) -> None:
    """Give the memory back to the allocator (`cache=False`: past its cache, to the device); a view only drops its handle."""
    if self._buf is not None and self._owned and self._base is None:
      a = self.__dict__["_allocator"]
      (a.free if cache else a.release)(self._buf, self.nbytes, self.options)
      if capture.PROFILE and self.__dict__.get("_mem_epoch") == capture.TRACE.mem_epoch:  # counted in by this recording
        capture.TRACE.mem_change(self.device, -self.nbytes)
    self._buf = None

  def __del__(self) -> None:
    try: self.deallocate()
    except Exception: pass

  def discard(self, offset: int = 0, nbytes: int | None = None) -> None:
    """Its bytes [offset, offset+nbytes) (default: to the end) are dead, scratch between uses: let the device reclaim
    their memory where it can (`Allocator.discard`; the CPU's pages come back zeroed when next written)."""
    nbytes = self.nbytes - offset if nbytes is None else nbytes
    if not 0 <= offset <= offset + nbytes <= self.nbytes: raise ValueError(f"discard of bytes [{offset}, {offset + nbytes}) of {self!r}")
    if self._buf is not None and nbytes: self.allocator.discard(self._buf, nbytes, offset)

  def copyin(self, src: Any) -> Buffer:
    """Copy host data (bytes-like or numpy, exactly nbytes long) into the buffer."""
    mv = _as_bytes(src)
    if mv.nbytes != self.nbytes: raise ValueError(f"copyin of {mv.nbytes} bytes into {self!r} of {self.nbytes} bytes")
    self.ensure_allocated()
    st = capture.now() if capture.PROFILE else 0
    self.allocator.copyin(self._buf, mv)
    if st: capture.TRACE.event(capture.ProfileEvent("copy", f"copyin {self.device}", self.device, st, capture.now(), self.nbytes))
    return self

  def copyout(self, dest: memoryview | None = None) -> memoryview:
    """Copy the buffer to host memory (a new bytearray unless `dest` is given); returns a byte memoryview."""
    mv = memoryview(bytearray(self.nbytes)) if dest is None else _as_bytes(dest)
    if mv.nbytes != self.nbytes: raise ValueError(f"copyout of {self!r} ({self.nbytes} bytes) into {mv.nbytes} bytes")
    if mv.readonly: raise ValueError("copyout destination is read-only")
    self.ensure_allocated()
    Device[self.device].synchronize()
    st = capture.now() if capture.PROFILE else 0
    self.allocator.copyout(mv, self._buf)
    if st: capture.TRACE.event(capture.ProfileEvent("copy", f"copyout {self.device}", self.device, st, capture.now(), self.nbytes))
    return mv

  def numpy(self) -> np.ndarray:
    """The contents as a 1-D numpy array of this dtype."""
    import numpy as np
    if getattr(self.dtype, "np", None) is None: raise TypeError(f"dtype {self.dtype} has no numpy equivalent")
    return np.frombuffer(self.copyout(), dtype=self.dtype.np)

  def view(self, size: int, dtype: DType, offset: int = 0) -> Buffer:
    """A Buffer of `size` `dtype` elements starting `offset` bytes into this one, sharing memory."""
    return Buffer(self.device, size, dtype, self.options, base=self, offset=offset)

  def copy_from(self, src: Buffer) -> Buffer:
    """Copy another buffer's contents here: device transfer when both sides are the same device type, else via host."""
    if src.nbytes != self.nbytes: raise ValueError(f"copy of {src!r} ({src.nbytes} bytes) into {self!r} ({self.nbytes} bytes)")
    dst_dev, src_dev = Device[self.device], Device[src.device]
    if parse_device(self.device).device == parse_device(src.device).device and self.allocator.supports_transfer:
      self.ensure_allocated().allocator.transfer(self._buf, src.ensure_allocated()._buf, self.nbytes, src_dev, dst_dev)
    elif (mv := src.ensure_allocated().allocator.as_host(src._buf)) is not None: self.copyin(mv)  # one copy, no staging
    else: self.copyin(src.copyout())
    return self

  def __repr__(self) -> str:
    v = f" view@{self.offset}" if self._base is not None else ""
    return f"<Buffer {self.device} {self.size} {getattr(self.dtype, 'name', self.dtype)}{v}{'' if self.is_allocated else ' unallocated'}>"

# ---------------------------------------------------------------------------- programs and devices

class Program:
  """A loaded kernel. Call it with allocator handles: prg(*bufs, global_size=..., local_size=..., vals=..., wait=...)."""
  def __init__(self, dev: Compiled, name: str, lib: bytes) -> None: self.dev, self.name, self.lib = dev, name, lib

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    """Launch; with wait=True block until done and return elapsed seconds, else return None."""
    raise NotImplementedError(f"{type(self).__name__} cannot launch")

  def launch(self, *bufs: Any) -> None:
    """`self(*bufs)`: a launch with no sizes, variables or timing (the direct path of realize plans, engine/plan.py),
    which a device may make cheaper."""
    self(*bufs)

  @staticmethod
  def check_launch(global_size: Sequence[int], local_size: Sequence[int] | None) -> None:
    """Validate launch dimensions: up to 3 positive ints each."""
    for what, dims in (("global_size", global_size), ("local_size", local_size)):
      if dims is None and what == "local_size": continue
      if not (isinstance(dims, (tuple, list)) and 1 <= len(dims) <= 3 and all(isinstance(d, int) and d >= 1 for d in dims)):
        raise ValueError(f"{what} must be 1 to 3 positive ints, got {dims!r}")

CompilerArg = Union[Compiler, Callable[[Renderer], Compiler], None]

class Compiled:
  """Base of every device. `device` is the canonical name it was opened with; renderer/arch fields of it pick the renderer.

  compute: False for devices that cannot run kernels (DISK) or do not really (NULL).
  storage: True for devices that only hold buffers (DISK): the scheduler turns work on them into byte-range copies or raises.
  smoke_kernel: optional source (in this device's kernel language) of `smoke(int32 *a)` doubling a[0..2] in place; used by
  `plugrad-devices` until the Tensor front end can run `[1,2,3]*2` itself.
  """
  compute: ClassVar[bool] = True
  storage: ClassVar[bool] = False
  smoke_kernel: ClassVar[str | None] = None

  def __init__(self, device: str, allocator: Allocator, renderers: Sequence[type[Renderer]] = (), compiler: CompilerArg = None,
               runtime: Callable[[Compiled, str, bytes], Program] | None = None) -> None:
    self.device, self.dname = device, parse_device(device)
    self.allocator = allocator
    if allocator.dev is None: allocator.dev = self
    self.renderers = tuple(renderers)
    self.renderer = choose_renderer(device, self.renderers, self.dname.renderer, self.dname.arch)
    if compiler is None: compiler = UnsupportedCompiler(device, "it has no compiler")
    self.compiler: Compiler = compiler if isinstance(compiler, Compiler) else compiler(self.renderer)
    self.runtime = runtime

  def load(self, name: str, lib: bytes) -> Program:
    """Load a compiled binary as a Program."""
    if self.runtime is None: raise RuntimeError(f"device {self.device} cannot run kernels")
    return self.runtime(self, name, lib)

  def synchronize(self) -> None:
    """Block until all work submitted to this device has finished."""

  def finalize(self) -> None:
    """Release device resources at exit; optional."""

  def __repr__(self) -> str: return f"<{type(self).__name__} {self.device}>"

# ---------------------------------------------------------------------------- the registry

class DeviceWarning(UserWarning):
  """The default device is a fallback: a slow reference device, or not the highest-priority one because that failed to open."""

_python_warned = False

def _warn_python_default(skipped: list[str]) -> None:
  """Once per process: the default is the PYTHON reference interpreter because no other compute device is available."""
  global _python_warned
  if _python_warned: return
  _python_warned = True
  why = "; ".join(skipped) if skipped else "no compute device plugin is installed"
  warnings.warn(f"plugrad: the default device is PYTHON, a slow reference interpreter meant for testing ({why}). Install a "
                "compute backend, e.g. `pip install plugrad-cpu` (needs a C compiler: clang or gcc, or set CC), or pick a device "
                "with DEV=...", DeviceWarning, stacklevel=5)

class DeviceError(RuntimeError):
  """A device was requested that cannot be used."""
class DeviceNotFoundError(DeviceError):
  """No installed plugin provides the requested device."""
class DeviceUnavailableError(DeviceError):
  """The device is installed but its probe says no, or its plugin targets an incompatible API."""

def _report(reg: PluginRegistry, head: str, wanted: str) -> str:
  """Error text: the problem, a did-you-mean, every installed device with availability, and skipped plugins."""
  import difflib
  entries = reg.by_priority()
  avail = [e.name for e in entries if e.availability().ok and not (e.spec.fake or e.spec.storage)]  # what a default could be
  close = difflib.get_close_matches(wanted, [e.name for e in entries if e.name != wanted], n=1, cutoff=0.5)
  if close: lines = [head, f"did you mean {close[0]}?"]
  else: lines = [head] + ([f"did you mean {avail[0]} (the best available device)?"] if avail else [])
  lines.append("installed devices:")
  for e in entries:
    a = e.availability()
    lines.append(f"  {e.name:<8} from {e.dist.name} {e.dist.version}: " + ("available" if a.ok else f"unavailable: {a.reason}"))
  for d in reg.plugin_dists():
    if d.status != "loaded": lines.append(f"  (plugin distribution {d.name} {d.version} {d.status}{': ' + d.error if d.error else ''})")
  lines.append(f"select a device with DEV={DEV_GRAMMAR}")
  return "\n".join(lines)

class _DeviceRegistry:
  """`Device`: opens devices by name (one cached instance per canonical name) and knows the default."""

  def __init__(self) -> None:
    self._opened: dict[str, Compiled] = {}
    self._default: str | None = None
    self._watching = False  # registered with the plugin loader for registry changes (on first registry use)
    self._lock = threading.RLock()

  parse = staticmethod(parse_device)
  canonicalize = staticmethod(canonicalize)

  @property
  def registry(self) -> PluginRegistry:
    # lazy plugin loading (documented in docs/architecture.md): the loader imports pluggy and reads entry points, so
    # `import plugrad` must not import it; it is imported on the first use of Device
    from plugrad.plugins.loader import get_registry, on_registry_change
    if not self._watching:
      on_registry_change(self._reset)
      self._watching = True
    return get_registry()

  def entry(self, name: str) -> DeviceEntry:
    """The registry entry for a device string; raises DeviceNotFoundError/DeviceUnavailableError with a full report."""
    dname = parse_device(name)
    reg = self.registry
    if (e := reg.devices.get(dname.device)) is None:
      raise DeviceNotFoundError(_report(reg, f"device {name!r}: no installed plugin provides {dname.device}", dname.device))
    if not (a := e.availability(dname.iface)).ok:
      raise DeviceUnavailableError(_report(reg, f"device {name!r} is unavailable: {a.reason}", dname.device))
    return e

  def __getitem__(self, name: str) -> Compiled:
    canon = canonicalize(name)
    with self._lock:
      if (dev := self._opened.get(canon)) is not None: return dev
      e = self.entry(canon)
      try: dev = e.spec.load_factory()(canon)
      except KeyboardInterrupt: raise
      except BaseException as ex:  # a plugin calling sys.exit() (or raising any BaseException) while opening must not end the program
        raise DeviceError(f"opening device {canon} (from {e.dist.name} {e.dist.version}, factory {e.spec.factory!r}) failed: "
                          f"{type(ex).__name__}: {ex}") from ex
      if not isinstance(dev, Compiled): raise DeviceError(f"factory {e.spec.factory!r} for {canon} returned {dev!r}, not a Compiled device")
      self._opened[canon] = dev
      return dev

  @property
  def DEFAULT(self) -> str:
    """Canonical name of the default device: $DEV if set (checked strictly), else the highest-priority available compute
    device that opens (never a fake or storage-only one; PYTHON, with a one-time warning, when no other is available)."""
    with self._lock:
      if self._default is None:
        if (dev := os.environ.get("DEV", "").strip()): self._default = self._checked_default(dev, "DEV")
        else: self._default = self._pick_default()
      return self._default

  @DEFAULT.setter
  def DEFAULT(self, name: str) -> None:
    self._default = self._checked_default(name, "Device.DEFAULT")

  def _checked_default(self, name: str, via: str) -> str:
    """An explicitly requested default: it must exist and be available, and not be a storage-only device."""
    e = self.entry(name)
    if e.spec.storage:
      raise DeviceError(f"{via}={name!r}: {e.name} is a storage-only device and can't be the default device (tensors created "
                        f"without a device would be written into its file). Pick a compute device (e.g. {via}=CPU) and use "
                        f"{e.name} explicitly: t.to('{e.name}:/path'), safe_load, safe_save")
    return canonicalize(name)

  def _pick_default(self) -> str:
    """The first compute device, by priority, that is available and whose factory works; failures are warned about."""
    skipped: list[str] = []
    for e in self.registry.by_priority():
      if e.spec.fake or e.spec.storage: continue
      if not (a := e.availability()).ok:
        skipped.append(f"{e.name} (from {e.dist.name} {e.dist.version}) is unavailable: {a.reason}")
        continue
      try: dev = self[e.name]
      except DeviceError as ex:
        warnings.warn(f"plugrad: {str(ex).splitlines()[0]}; falling back to the next available device", DeviceWarning, stacklevel=4)
        skipped.append(f"{e.name} (from {e.dist.name} {e.dist.version}) failed to open")
        continue
      if dev.storage: continue
      if e.name == "PYTHON": _warn_python_default(skipped)
      return e.name
    raise DeviceUnavailableError(_report(self.registry, "no compute device is available" + "".join(f"; {s}" for s in skipped), ""))

  def default(self) -> Compiled:
    """The default device instance."""
    return self[self.DEFAULT]

  def installed(self) -> list[str]:
    """Names of all registered devices, highest priority first."""
    return [e.name for e in self.registry.by_priority()]

  def available(self) -> list[str]:
    """Names of the devices whose probe succeeds, highest priority first."""
    return [e.name for e in self.registry.by_priority() if e.availability().ok]

  def opened(self) -> dict[str, Compiled]: return dict(self._opened)

  def _reset(self) -> None:
    with self._lock: self._opened.clear(); self._default = None

Device = _DeviceRegistry()
