"""Weight files: safetensors (load lazily from DISK, save with copies only) and GGUF (quantized weights dequantized by
Tensor ops that fuse into their consumer). docs/storage.md describes both formats and the checks made on them.

Loaded tensors are views of the file's bytes (BUFFER_VIEWs of a DISK buffer): nothing is read until they are used, and
then only their own byte range is copied to the compute device. Headers are validated against the file size before
anything is allocated, so a lying or truncated file is a ValueError, never a huge allocation or a hang.
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
import struct
import uuid
from typing import Any, Callable, Union

from plugrad.device import Device, canonicalize
from plugrad.dtype import DType, dtypes
from plugrad.engine.realize import buffer_for
from plugrad.uop.buffers import new_buffer
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp

PathOrTensor = Union[str, os.PathLike, Tensor]

# ---------------------------------------------------------------------------- raw bytes of a file or tensor

class _Source:
  """A byte source: a uint8 BUFFER uop (`base`, `offset`, `size` bytes) and a host view of the same bytes for parsing."""
  def __init__(self, src: PathOrTensor):
    if isinstance(src, Tensor):
      if src.dtype != dtypes.uint8 or src.ndim != 1: raise ValueError(f"expected a 1-D uint8 tensor of file bytes, got {src.dtype} {src.shape}")
      u, off = self._raw(src)
      if u.op is not Ops.BUFFER: u, off = self._raw(src := src.contiguous().realize())  # lazy or strided: materialize it once
      self.base, self.offset, self.size = u, off, src.shape[0]
    elif isinstance(src, (str, os.PathLike)):
      path = os.path.abspath(os.fspath(src))
      self.size = _regular_file_size(path)
      self.base, self.offset = new_buffer(canonicalize(f"DISK:{path}"), self.size, dtypes.uint8), 0
    else: raise TypeError(f"expected a path or a uint8 Tensor, got {type(src).__name__}")
    buf = buffer_for(self.base).ensure_allocated() if self.base.arg else None
    host = buf.allocator.as_host(buf._buf) if buf is not None and hasattr(buf.allocator, "as_host") else None
    if buf is not None and host is None: host = buf.copyout()
    self.host = (host if host is not None else memoryview(b""))[self.offset:self.offset + self.size]

  @staticmethod
  def _raw(t: Tensor) -> tuple[UOp, int]:
    """(uint8 BUFFER, byte offset) under a 1-D tensor made of reshapes and slices of one, else (some other uop, 0)."""
    u, off = t.uop, 0
    while u.op in (Ops.RESHAPE, Ops.SHRINK):
      if u.op is Ops.SHRINK: off += u.arg[0][0]
      u = u.src[0]
    if u.op is Ops.BUFFER_VIEW and u.dtype == dtypes.uint8: u, off = u.src[0], off + u.arg[1]
    return (u, off) if u.op is Ops.BUFFER and u.dtype == dtypes.uint8 else (t.uop, 0)

  def tensor(self, start: int, shape: tuple, dtype: DType) -> Tensor:
    """The bytes [start, start + prod(shape)*itemsize) as a tensor of `dtype` and `shape` (a view, nothing read)."""
    n = math.prod(shape)
    view = UOp(Ops.BUFFER_VIEW, dtype, (self.base,), (n, self.offset + start))
    return Tensor(view if tuple(shape) == (n,) else UOp(Ops.RESHAPE, dtype, (view,), tuple(shape)))

_FILE_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}

def _regular_file_size(path: str) -> int:
  """The size of the regular file at `path`: FileNotFoundError if missing, IsADirectoryError for a directory, ValueError
  for anything else that is not a regular file (a FIFO would block, a device has no size)."""
  try: st = os.stat(path)
  except FileNotFoundError: raise FileNotFoundError(errno.ENOENT, f"no such file: {path}", path) from None
  if stat.S_ISDIR(st.st_mode): raise IsADirectoryError(errno.EISDIR, f"{path} is a directory, not a weight file", path)
  if not stat.S_ISREG(st.st_mode):
    kind = _FILE_KINDS.get(stat.S_IFMT(st.st_mode), "special")
    raise ValueError(f"{path} is not a regular file ({kind}); weight files are loaded from regular files")
  return st.st_size

# ---------------------------------------------------------------------------- safetensors

SAFE_DTYPES: dict[str, DType] = {"BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "U16": dtypes.uint16, "I16": dtypes.int16,
                                 "U32": dtypes.uint32, "I32": dtypes.int32, "U64": dtypes.uint64, "I64": dtypes.int64,
                                 "F16": dtypes.float16, "BF16": dtypes.bfloat16, "F32": dtypes.float32, "F64": dtypes.float64,
                                 "F8_E4M3": dtypes.fp8e4m3, "F8_E5M2": dtypes.fp8e5m2}
_SAFE_NAMES = {v: k for k, v in SAFE_DTYPES.items()}
SAFE_MAX_DIMS = 64  # numpy's (and torch's) limit on dims

def _parse_safe_header(host: memoryview, size: int, where: str) -> tuple[dict, int, dict | None]:
  if size < 8: raise ValueError(f"{where}: not a safetensors file: {size} bytes, shorter than the 8-byte header length")
  (n,) = struct.unpack("<Q", host[:8])
  if n > size - 8: raise ValueError(f"{where}: header length {n} is larger than the {size - 8} bytes after it (truncated file?)")
  try: header = json.loads(bytes(host[8:8 + n]).decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e: raise ValueError(f"{where}: malformed safetensors JSON header: {e}") from None
  except RecursionError: raise ValueError(f"{where}: safetensors JSON header is nested too deeply") from None
  if not isinstance(header, dict): raise ValueError(f"{where}: safetensors header must be a JSON object, got {type(header).__name__}")
  meta = header.get("__metadata__")
  if meta is not None and not (isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
    raise ValueError(f"{where}: __metadata__ must map strings to strings")
  data_len, spans = size - 8 - n, []
  for name, info in header.items():
    if name == "__metadata__": continue
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
      raise ValueError(f"{where}: tensor {name!r} needs dtype, shape and data_offsets, got {_short(info)}")
    if not isinstance(info["dtype"], str) or info["dtype"] not in SAFE_DTYPES:
      raise ValueError(f"{where}: tensor {name!r} has unknown dtype {_short(info['dtype'])}")
    shape, offs = info["shape"], info["data_offsets"]
    if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
      raise ValueError(f"{where}: tensor {name!r} has invalid shape {_short(shape)}")
    if len(shape) > SAFE_MAX_DIMS: raise ValueError(f"{where}: tensor {name!r} has {len(shape)} dims, more than {SAFE_MAX_DIMS}")
    if math.prod(s for s in shape if s) * SAFE_DTYPES[info["dtype"]].itemsize >= 2**63:  # even when another dim is 0
      raise ValueError(f"{where}: tensor {name!r} has shape {_short(shape)}: its strides need more than 2**63 bytes "
                       "(dims no tensor can have)")
    if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs) and 0 <= offs[0] <= offs[1] <= data_len):
      raise ValueError(f"{where}: tensor {name!r} data_offsets {_short(offs)} out of range of the {data_len} data bytes")
    if (want := math.prod(shape) * SAFE_DTYPES[info["dtype"]].itemsize) != offs[1] - offs[0]:
      raise ValueError(f"{where}: tensor {name!r} of shape {shape} {info['dtype']} needs {want} bytes, data_offsets {offs} hold {offs[1] - offs[0]}")
    if offs[1] > offs[0]: spans.append((offs[0], offs[1], name))  # an empty tensor occupies no bytes and overlaps nothing
  spans.sort()
  for (_, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):  # sorted by start: each must begin at or after the previous end
    if b1 < e0: raise ValueError(f"{where}: tensors {n0!r} and {n1!r} overlap in the data section")
  return header, 8 + n, meta

def _short(x: Any, limit: int = 200) -> str:
  """repr of a header value for an error message, cut at `limit` characters (headers can be megabytes)."""
  r = repr(x)
  return r if len(r) <= limit else r[:limit] + "..."

def safe_load_metadata(src: PathOrTensor) -> tuple[dict, int, dict | None]:
  """(the JSON header, the byte offset where tensor data starts, the `__metadata__` dict or None), validated."""
  s = _Source(src)
  return _parse_safe_header(s.host, s.size, _where(src))

def safe_load(src: PathOrTensor) -> dict[str, Tensor]:
  """{name: tensor} for a safetensors file: lazy views of the file's bytes (nothing is read until used)."""
  s = _Source(src)
  header, start, _ = _parse_safe_header(s.host, s.size, _where(src))
  return {k: s.tensor(start + v["data_offsets"][0], tuple(v["shape"]), SAFE_DTYPES[v["dtype"]])
          for k, v in header.items() if k != "__metadata__"}

def safe_save(tensors: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
  """Write `tensors` as a safetensors file. The bytes are copied straight into a memory-mapped temporary file (no compute
  kernels for realized contiguous tensors), which is then renamed over `path`, so `path` is never left half written.
  A symbolic link is written through: its target is replaced (atomically, keeping its permissions), the link stays."""
  if not isinstance(tensors, dict): raise TypeError(f"safe_save needs a dict of name -> Tensor, got {type(tensors).__name__}")
  for k, t in tensors.items():
    if not isinstance(k, str) or k == "__metadata__": raise ValueError(f"invalid tensor name {k!r}")
    if not isinstance(t, Tensor): raise TypeError(f"tensor {k!r} is a {type(t).__name__}, not a Tensor")
    if t.dtype not in _SAFE_NAMES: raise ValueError(f"tensor {k!r}: dtype {t.dtype} has no safetensors name")
    if not all(isinstance(s, int) for s in t.shape): raise ValueError(f"tensor {k!r} has a symbolic shape {t.shape}")
  if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise ValueError("safetensors metadata must map strings to strings")
  header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
  off = 0
  for k, t in tensors.items():
    header[k] = {"dtype": _SAFE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + t.nbytes()]}
    off += t.nbytes()
  hjson = json.dumps(header, separators=(",", ":")).encode()
  hjson += b" " * (-(8 + len(hjson)) % 8)  # data starts 8-byte aligned
  start, total = 8 + len(hjson), 8 + len(hjson) + off
  path = _through_links(os.path.abspath(os.fspath(path)))
  _remove_stale_temps(path)
  tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"
  try:
    with open(tmp, "wb") as f:
      f.write(struct.pack("<Q", len(hjson)) + hjson)
      f.flush()
      _reserve(f.fileno(), total, tmp)  # the whole file at its final size: DISK maps it and never resizes a file itself
    if off:
      disk = Tensor.empty(total, dtype=dtypes.uint8, device=f"DISK:{tmp}")
      writes = []
      for k, t in tensors.items():
        b = header[k]["data_offsets"][0] + start
        if t.numel() == 0: continue
        dst = disk[b:b + t.nbytes()].bitcast(t.dtype).reshape(t.shape)
        writes.append(dst.assign(t.to(dst.device)))
      Tensor.realize_all(*writes)
      del disk, writes, dst
      _release_disk(tmp)
    with open(tmp, "rb+") as f: os.fsync(f.fileno())
    try: os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))  # the file it replaces keeps its permissions
    except FileNotFoundError: pass
    os.replace(tmp, path)
  except BaseException:
    _release_disk(tmp)
    if os.path.exists(tmp): os.remove(tmp)
    raise

def _through_links(path: str) -> str:
  """The file a save to `path` writes: a symbolic link's target (followed through chains and relative links, created
  when missing, as open() does), so the link stays a link; a loop of links is an OSError."""
  if not os.path.islink(path): return path
  real = os.path.realpath(path)
  if os.path.islink(real): raise OSError(errno.ELOOP, f"safe_save: {path} is a loop of symbolic links", path)
  return real

def _reserve(fd: int, size: int, path: str) -> None:
  """Extend the file to `size` bytes with its blocks reserved, so a full disk is an OSError (ENOSPC) here, before any
  tensor is written, not a failure halfway (or a SIGBUS, through a mapping) later. Sparse where the filesystem can't."""
  try: os.posix_fallocate(fd, 0, size)
  except AttributeError: os.ftruncate(fd, size)  # no posix_fallocate on this platform
  except OSError as e:
    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENODEV, errno.ENOSYS):
      raise OSError(e.errno, f"safe_save: can't reserve {size} bytes for {path}: {os.strerror(e.errno or 0)}; nothing was written") from None
    os.ftruncate(fd, size)

def _remove_stale_temps(path: str) -> None:
  """Delete temporary files a safe_save to `path` left behind when its process was killed (`path.PID.RANDOM.tmp` whose PID
  is no longer running); temps of live processes (a concurrent save) are left alone."""
  d, base = os.path.split(path)
  try: names = os.listdir(d or ".")
  except OSError: return
  for name in names:
    parts = name[len(base) + 1:].split(".") if name.startswith(base + ".") else []
    if len(parts) != 3 or parts[2] != "tmp" or not parts[0].isdigit() or len(parts[1]) != 12: continue
    if _alive(int(parts[0])): continue
    try: os.remove(os.path.join(d, name))
    except OSError: pass

def _alive(pid: int) -> bool:
  if pid == os.getpid(): return True
  try: os.kill(pid, 0)
  except ProcessLookupError: return False
  except (PermissionError, OverflowError): return True  # someone else's process (or an absurd pid): don't touch its file
  return True

def _release_disk(path: str) -> None:
  """Forget the DISK device of a temporary file (its mapping closes when the last buffer on it is gone)."""
  dev = Device.opened().get(canonicalize(f"DISK:{path}"))
  if dev is not None and hasattr(dev, "release"): dev.release()

def _where(src: PathOrTensor) -> str: return os.fspath(src) if isinstance(src, (str, os.PathLike)) else "tensor"

# ---------------------------------------------------------------------------- GGUF

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4

class _Reader:
  """Bounds-checked little-endian reads from a memoryview: running off the end is a ValueError, never a large allocation."""
  def __init__(self, mv: memoryview, where: str): self.mv, self.pos, self.where = mv, 0, where
  def need(self, n: int, what: str) -> None:
    if n < 0 or self.pos + n > len(self.mv):
      raise ValueError(f"{self.where}: truncated or malformed GGUF: {what} needs {n} bytes at offset {self.pos}, file has {len(self.mv)}")
  def scalar(self, fmt: str, what: str) -> Any:
    n = struct.calcsize(fmt)
    self.need(n, what)
    (v,) = struct.unpack_from(fmt, self.mv, self.pos)
    self.pos += n
    return v
  def string(self, what: str) -> str:
    n = self.scalar("<Q", what + " length")
    self.need(n, what)
    s = bytes(self.mv[self.pos:self.pos + n])
    self.pos += n
    try: return s.decode("utf-8")
    except UnicodeDecodeError: raise ValueError(f"{self.where}: {what} at offset {self.pos - n} is not valid UTF-8") from None
  def value(self, vtype: int, what: str, depth: int = 0) -> Any:
    if vtype in _GGUF_SCALARS: return self.scalar(_GGUF_SCALARS[vtype], what)
    if vtype == 8: return self.string(what)
    if vtype == 9:
      if depth > 8: raise ValueError(f"{self.where}: {what}: arrays nested too deeply")
      et, n = self.scalar("<I", what + " element type"), self.scalar("<Q", what + " count")
      if et in _GGUF_SCALARS:  # fixed size: check the whole array fits before reading it
        fmt = _GGUF_SCALARS[et]
        self.need(n * struct.calcsize(fmt), f"{what} ({n} elements)")
        vals = list(struct.unpack_from(f"<{n}{fmt[1]}", self.mv, self.pos))
        self.pos += n * struct.calcsize(fmt)
        return vals
      if et not in (8, 9): raise ValueError(f"{self.where}: {what}: unknown array element type {et}")
      self.need(n * 8, f"{what} ({n} elements)")  # every string or array element takes at least 8 bytes
      return [self.value(et, f"{what}[{i}]", depth + 1) for i in range(n)]
    raise ValueError(f"{self.where}: {what}: unknown GGUF metadata value type {vtype}")

# ggml type id -> (name, elements per block, bytes per block, dtype for plain types or None)
GGML_TYPES: dict[int, tuple[str, int, int, DType | None]] = {
  0: ("F32", 1, 4, dtypes.float32), 1: ("F16", 1, 2, dtypes.float16), 30: ("BF16", 1, 2, dtypes.bfloat16),
  24: ("I8", 1, 1, dtypes.int8), 25: ("I16", 1, 2, dtypes.int16), 26: ("I32", 1, 4, dtypes.int32), 27: ("I64", 1, 8, dtypes.int64),
  28: ("F64", 1, 8, dtypes.float64),
  2: ("Q4_0", 32, 18, None), 3: ("Q4_1", 32, 20, None), 6: ("Q5_0", 32, 22, None), 7: ("Q5_1", 32, 24, None),
  8: ("Q8_0", 32, 34, None), 10: ("Q2_K", 256, 84, None), 11: ("Q3_K", 256, 110, None), 12: ("Q4_K", 256, 144, None),
  13: ("Q5_K", 256, 176, None), 14: ("Q6_K", 256, 210, None)}

def gguf_load(src: PathOrTensor, device: str | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:
  """(metadata, {name: tensor}) of a GGUF file (version 2 or 3). Plain tensors keep their dtype; quantized ones are float32
  computed lazily on `device` (default device) from their raw blocks, so the dequantization fuses into whatever uses them."""
  s, where = _Source(src), _where(src)
  r = _Reader(s.host, where)
  if s.size < 4 or bytes(s.host[:4]) != b"GGUF": raise ValueError(f"{where}: not a GGUF file (bad magic {bytes(s.host[:4])!r})")
  r.pos = 4
  if (version := r.scalar("<I", "version")) not in (2, 3): raise ValueError(f"{where}: unsupported GGUF version {version} (2 and 3 are)")
  n_tensors, n_kv = r.scalar("<Q", "tensor count"), r.scalar("<Q", "metadata count")
  if n_kv * 13 > s.size or n_tensors * 24 > s.size:  # smallest KV: 8+1 key, 4 type, 1 value; smallest tensor info 8+4+4+8
    raise ValueError(f"{where}: header claims {n_tensors} tensors and {n_kv} metadata entries, more than a {s.size}-byte file holds")
  meta: dict[str, Any] = {}
  for i in range(n_kv):
    key = r.string(f"metadata key {i}")
    meta[key] = r.value(r.scalar("<I", f"type of {key!r}"), f"metadata {key!r}")
  infos = []
  for i in range(n_tensors):
    name = r.string(f"tensor {i} name")
    nd = r.scalar("<I", f"tensor {name!r} dims")
    if not 0 < nd <= _MAX_DIMS: raise ValueError(f"{where}: tensor {name!r} has {nd} dims (1 to {_MAX_DIMS} allowed)")
    dims = [r.scalar("<Q", f"tensor {name!r} dim") for _ in range(nd)]
    ttype, off = r.scalar("<I", f"tensor {name!r} type"), r.scalar("<Q", f"tensor {name!r} offset")
    if ttype not in GGML_TYPES: raise ValueError(f"{where}: tensor {name!r} has unsupported ggml type {ttype}")
    if name in (x[0] for x in infos): raise ValueError(f"{where}: duplicate tensor name {name!r}")
    infos.append((name, dims, ttype, off))
  align = meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
  if not isinstance(align, int) or align <= 0 or align & (align - 1): raise ValueError(f"{where}: general.alignment {align!r} is not a power of 2")
  data_start = r.pos + (-r.pos % align)
  dev = canonicalize(device) if device is not None else Device.DEFAULT
  out: dict[str, Tensor] = {}
  for name, dims, ttype, off in infos:
    tname, bsize, tsize, dt = GGML_TYPES[ttype]
    n = math.prod(dims)
    if dims[0] % bsize: raise ValueError(f"{where}: tensor {name!r} ({tname}) has row length {dims[0]}, not a multiple of its block size {bsize}")
    nbytes = n // bsize * tsize
    if off % align or data_start + off + nbytes > s.size:
      raise ValueError(f"{where}: tensor {name!r} ({tname}, dims {dims}) needs bytes [{data_start + off}, {data_start + off + nbytes}) "
                       f"(aligned to {align}), beyond the {s.size}-byte file or misaligned")
    if (big := max(dims)) > s.size * bsize // tsize:  # even with another dim 0, no real tensor has a dim this long
      raise ValueError(f"{where}: tensor {name!r} ({tname}) has dim {big}, more elements than the {s.size}-byte file can hold")
    shape = tuple(reversed(dims))
    if dt is not None: out[name] = s.tensor(data_start + off, shape, dt).to(dev)
    else: out[name] = dequantize(s.tensor(data_start + off, (n // bsize, tsize), dtypes.uint8).to(dev), tname).reshape(shape)
  return meta, out

# ---------------------------------------------------------------------------- dequantization as Tensor ops

def _cols(b: Tensor, lo: int, hi: int) -> Tensor: return b.shrink(((0, b.shape[0]), (lo, hi)))

def _uint(b: Tensor, off: int, nbytes: int) -> Tensor:
  """Little-endian unsigned int of `nbytes` bytes at column `off` of each block row, shape (N, 1)."""
  dt = {2: dtypes.uint16, 4: dtypes.uint32}[nbytes]
  v = _cols(b, off, off + 1).cast(dt)
  for i in range(1, nbytes): v = v | (_cols(b, off + i, off + i + 1).cast(dt) << (8 * i))
  return v

def _f16(b: Tensor, off: int) -> Tensor:
  """The float16 at column `off` of each block row as float32 (N, 1), decoded with integer ops (exact, incl. subnormals,
  inf and nan), which compiles on every backend, unlike a bitcast to a native half type."""
  h = _uint(b, off, 2).cast(dtypes.uint32)
  e, m, sign = (h >> 10) & 0x1F, h & 0x3FF, (h >> 15) << 31
  normal = (sign | ((e == 31).where(255, e + 112) << 23) | (m << 13)).bitcast(dtypes.float32)
  sub = m.cast(dtypes.float32) * 2.0 ** -24 * (sign != 0).where(-1.0, 1.0)
  return (e == 0).where(sub, normal)

def _shr(x: Tensor, shifts: list[int], shape: tuple) -> Tensor:
  """x >> shifts with the shift amounts (< bit width) laid out along `shape` (an arange, so no buffer is read)."""
  step = shifts[1] - shifts[0] if len(shifts) > 1 else 0
  s = (Tensor.arange(len(shifts), device=x.device) * step).cast(x.dtype).reshape(shape)
  a, b = x._broadcasted(s)
  return a._alu(Ops.SHR, b)

def _nibbles(qs: Tensor, groups: int, width: int) -> Tensor:
  """qs (N, groups*width) -> (N, groups, 2, width): low nibbles then high nibbles of each group of `width` bytes."""
  return _shr(qs.reshape(qs.shape[0], groups, 1, width), [0, 4], (1, 1, 2, 1)) & 0x0F

def _bits(qh: Tensor, nbits: int, width: int) -> Tensor:
  """qh (N, width) -> (N, nbits, width): bit k of each byte in row k."""
  return _shr(qh.reshape(qh.shape[0], 1, width), list(range(nbits)), (1, nbits, 1)) & 1

def _q4_0(b: Tensor) -> Tensor:
  q = _nibbles(_cols(b, 2, 18), 1, 16).reshape(-1, 32).cast(dtypes.int8) - 8
  return _f16(b, 0) * q.cast(dtypes.float32)

def _q4_1(b: Tensor) -> Tensor:
  return _f16(b, 0) * _nibbles(_cols(b, 4, 20), 1, 16).reshape(-1, 32).cast(dtypes.float32) + _f16(b, 2)

def _q5(b: Tensor, off: int) -> Tensor:
  """The 5-bit values of a Q5_0/Q5_1 block whose qh starts at column `off`."""
  qh = _shr(_uint(b, off, 4), list(range(32)), (1, 32)) & 1
  ql = _nibbles(_cols(b, off + 4, off + 20), 1, 16).reshape(-1, 32)
  return ql | (qh.cast(dtypes.uint8) << 4)

def _q5_0(b: Tensor) -> Tensor: return _f16(b, 0) * (_q5(b, 2).cast(dtypes.int8) - 16).cast(dtypes.float32)
def _q5_1(b: Tensor) -> Tensor: return _f16(b, 0) * _q5(b, 4).cast(dtypes.float32) + _f16(b, 2)
def _q8_0(b: Tensor) -> Tensor: return _cols(b, 2, 34).bitcast(dtypes.int8).cast(dtypes.float32) * _f16(b, 0)

def _q2_k(b: Tensor) -> Tensor:
  sc = _cols(b, 0, 16)
  dl = (_f16(b, 80) * (sc & 0x0F).cast(dtypes.float32)).reshape(-1, 16, 1)
  ml = (_f16(b, 82) * (sc >> 4).cast(dtypes.float32)).reshape(-1, 16, 1)
  q = _shr(_cols(b, 16, 80).reshape(-1, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)) & 3
  return (dl * q.reshape(-1, 16, 16).cast(dtypes.float32) - ml).reshape(-1, 256)

def _q3_k(b: Tensor) -> Tensor:
  sc = _cols(b, 96, 108)
  lo = _shr(_cols(sc, 0, 8).reshape(-1, 1, 8), [0, 4], (1, 2, 1)).reshape(-1, 16)
  hi = _shr(_cols(sc, 8, 12).reshape(-1, 1, 4), [0, 2, 4, 6], (1, 4, 1)).reshape(-1, 16)
  scale = (((lo & 0x0F) | ((hi & 3) << 4)).cast(dtypes.int8) - 32).cast(dtypes.float32)
  dl = (_f16(b, 108) * scale).reshape(-1, 16, 1)
  ql = (_shr(_cols(b, 32, 96).reshape(-1, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)).reshape(-1, 16, 16) & 3).cast(dtypes.int8)
  qh = (_bits(_cols(b, 0, 32), 8, 32).reshape(-1, 16, 16) ^ 1) << 2  # the -4 offset applies where the mask bit is 0
  return (dl * (ql - qh.cast(dtypes.int8)).cast(dtypes.float32)).reshape(-1, 256)

def _k_scales(b: Tensor) -> tuple[Tensor, Tensor]:
  """The 8 6-bit (scale, min) pairs of a Q4_K/Q5_K block (12 bytes at column 4), as float32 (N, 8, 1)."""
  s = _cols(b, 4, 16).reshape(-1, 3, 4)
  d, m, md = (s.shrink(((0, s.shape[0]), (i, i + 1), (0, 4))).reshape(-1, 4) for i in range(3))
  sc = (d & 0x3F).cat((md & 0x0F) | ((d >> 2) & 0x30), dim=1)
  mn = (m & 0x3F).cat((md >> 4) | ((m >> 2) & 0x30), dim=1)
  return ((_f16(b, 0) * sc.cast(dtypes.float32)).reshape(-1, 8, 1), (_f16(b, 2) * mn.cast(dtypes.float32)).reshape(-1, 8, 1))

def _q4_k(b: Tensor) -> Tensor:
  d, dm = _k_scales(b)
  q = _nibbles(_cols(b, 16, 144), 4, 32).reshape(-1, 8, 32).cast(dtypes.float32)
  return (d * q - dm).reshape(-1, 256)

def _q5_k(b: Tensor) -> Tensor:
  d, dm = _k_scales(b)
  ql = _nibbles(_cols(b, 48, 176), 4, 32).reshape(-1, 8, 32)
  q = (ql | (_bits(_cols(b, 16, 48), 8, 32) << 4)).cast(dtypes.float32)
  return (d * q - dm).reshape(-1, 256)

def _q6_k(b: Tensor) -> Tensor:
  d = (_f16(b, 208) * _cols(b, 192, 208).bitcast(dtypes.int8).cast(dtypes.float32)).reshape(-1, 16, 1)
  ql = _nibbles(_cols(b, 0, 128), 2, 64).reshape(-1, 8, 32)
  qh = _shr(_cols(b, 128, 192).reshape(-1, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)).reshape(-1, 8, 32) & 3
  q = ((ql | (qh << 4)).cast(dtypes.int8) - 32).reshape(-1, 16, 16).cast(dtypes.float32)
  return (d * q).reshape(-1, 256)

DEQUANTIZE: dict[str, Callable[[Tensor], Tensor]] = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
                                                      "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}

def dequantize(blocks: Tensor, qtype: str) -> Tensor:
  """float32 (N, block elements) from uint8 blocks (N, block bytes) of ggml type `qtype`, as lazy Tensor ops."""
  if qtype not in DEQUANTIZE: raise ValueError(f"unsupported quantization {qtype!r}; supported: {', '.join(DEQUANTIZE)}")
  tsize = next(t for n, _, t, _ in GGML_TYPES.values() if n == qtype)
  if blocks.dtype != dtypes.uint8 or blocks.ndim != 2 or blocks.shape[1] != tsize:
    raise ValueError(f"{qtype} blocks must be uint8 of shape (N, {tsize}), got {blocks.dtype} {blocks.shape}")
  return DEQUANTIZE[qtype](blocks)

__all__ = ["safe_load", "safe_save", "safe_load_metadata", "gguf_load", "dequantize", "GGML_TYPES", "SAFE_DTYPES"]
