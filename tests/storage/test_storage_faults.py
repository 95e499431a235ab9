"""Storage under faults: a read-only filesystem, a full disk, a file truncated under a mapping, dangling symlinks,
failed creates, non-regular paths and impossible shapes. Each case that could kill the interpreter (SIGBUS) runs in a
subprocess; full and read-only filesystems are small tmpfs mounts made in a private mount namespace (`unshare -m`, needs
root), skipped cleanly where that can't be arranged."""
from __future__ import annotations
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import numpy as np
import pytest
from plugrad import Tensor
from plugrad.nn.serialize import safe_load, safe_save

PRELUDE = """
import os, sys, signal, resource
import numpy as np
from plugrad import Tensor
from plugrad.nn.serialize import safe_load, safe_save
d = sys.argv[1]
def report(fn):
  try: fn(); print("OK")
  except Exception as e: print("ERR", type(e).__name__, e)
"""

def _can_mount() -> bool:
  if os.geteuid() != 0 or shutil.which("unshare") is None: return False
  p = subprocess.run(["unshare", "-m", "--propagation", "private", "--", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                     capture_output=True, timeout=30)
  return p.returncode == 0

CAN_MOUNT = _can_mount()
needs_mount = pytest.mark.skipif(not CAN_MOUNT, reason="needs root and mount namespaces (unshare -m) for a small tmpfs")

def run_script(code: str, d, mount: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
  """Run PRELUDE + code with argv[1] = d; `mount` is a shell prefix run first inside a private mount namespace."""
  script = PRELUDE + textwrap.dedent(code)
  cmd = [sys.executable, "-c", script, str(d)]
  if mount: cmd = ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", f'{mount} && exec "$0" "$@"', *cmd]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

def tmpfs(d, size: str, ro: bool = False, prepare: str = "") -> str:
  m = f"mount -t tmpfs -o size={size} tmpfs {d}"
  if prepare: m += f" && {prepare}"
  return m + (f" && mount -o remount,ro {d}" if ro else "")

# ---------------------------------------------------------------------------- read-only filesystem

@needs_mount
def test_load_from_a_read_only_filesystem(tmp_path):
  """safe_load on a read-only filesystem failed with EROFS: the disk plugin opened read-write first."""
  src = tmp_path / "src.safetensors"
  safe_save({"w": Tensor(np.arange(10, dtype=np.float32))}, src)
  d = tmp_path / "ro"
  d.mkdir()
  p = run_script("""
    w = safe_load(f"{d}/m.safetensors")["w"]
    print(w.numpy().tolist())
    report(lambda: w.assign(Tensor(np.zeros(10, np.float32)).to(w.device)).realize())
    report(lambda: Tensor.empty(4, device=f"DISK:{d}/new.bin").numpy())
  """, d, tmpfs(d, "1m", ro=True, prepare=f"cp {src} {d}/m.safetensors"))
  assert p.returncode == 0, p.stderr
  out = p.stdout.splitlines()
  assert out[0] == str([float(i) for i in range(10)])
  assert out[1].startswith("ERR PermissionError") and "read-only" in out[1]
  assert out[2].startswith("ERR OSError") and "Read-only file system" in out[2] and "new.bin" in out[2]

# ---------------------------------------------------------------------------- full disk

@needs_mount
@pytest.mark.parametrize("what", ["safe_save", "disk_create", "disk_write"])
def test_full_disk_is_an_error_not_sigbus(tmp_path, what):
  """Writes through a mapping into a sparse file on a full disk killed the process with SIGBUS (-7)."""
  d = tmp_path / "full"
  d.mkdir()
  code = {
    "safe_save": """
      report(lambda: safe_save({"w": Tensor(np.ones(200_000, np.float32))}, f"{d}/m.safetensors"))
      print(sorted(os.listdir(d)))
      safe_save({"w": Tensor(np.ones(1000, np.float32))}, f"{d}/m.safetensors")  # room for a small one
      print(safe_load(f"{d}/m.safetensors")["w"].numpy().sum(), sorted(os.listdir(d)))
    """,
    "disk_create": """
      report(lambda: Tensor.empty(200_000, device=f"DISK:{d}/raw.bin").numpy())
      print(sorted(os.listdir(d)))
    """,
    "disk_write": """
      with open(f"{d}/sparse.bin", "wb") as f: f.truncate(800_000)  # a sparse file bigger than the filesystem
      t = Tensor.empty(200_000, device=f"DISK:{d}/sparse.bin")
      report(lambda: t.assign(Tensor(np.ones(200_000, np.float32)).to(t.device)).realize())
      print(os.path.getsize(f"{d}/sparse.bin"))
    """}[what]
  p = run_script(code, d, tmpfs(d, "256k"))
  assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr}"
  out = p.stdout.splitlines()
  assert out[0].startswith("ERR OSError") and "No space left on device" in out[0], out
  if what == "safe_save":
    assert out[1] == "[]" and out[2] == "1000.0 ['m.safetensors']"  # the temporary was removed; a later save works
  elif what == "disk_create": assert out[1] == "[]"  # no 0-byte file left behind
  else: assert out[1] == "800000"  # never resized

def test_failed_create_leaves_no_file(tmp_path):
  """A DISK create that failed (here: EFBIG under RLIMIT_FSIZE) left a 0-byte file, so the next try said it was too small."""
  p = run_script("""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    report(lambda: Tensor.empty(100_000, device=f"DISK:{d}/new.bin").numpy())
    print(os.path.exists(f"{d}/new.bin"))
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    print(Tensor.empty(100_000, device=f"DISK:{d}/new.bin").numpy().shape)
  """, tmp_path)
  assert p.returncode == 0, p.stderr
  out = p.stdout.splitlines()
  assert out[0].startswith("ERR OSError") and "File too large" in out[0] and "new.bin" in out[0]
  assert out[1:] == ["False", "(100000,)"]

# ---------------------------------------------------------------------------- truncated under a mapping

@pytest.mark.parametrize("how", ["numpy", "to_cpu", "assign"])
def test_file_truncated_after_load(tmp_path, how):
  """Reading a tensor whose file was truncated after safe_load was a SIGBUS (or zeros, within the last page)."""
  p = run_script(f"""
    safe_save({{"w": Tensor(np.arange(100_000, dtype=np.float32))}}, f"{{d}}/m.safetensors")
    w = safe_load(f"{{d}}/m.safetensors")["w"]
    w[:4].numpy()
    os.truncate(f"{{d}}/m.safetensors", 8)
    how = {how!r}
    if how == "numpy": report(lambda: print(w.numpy()[-3:]))
    elif how == "to_cpu": report(lambda: print(w.to("CPU").realize().numpy()[-3:]))
    else: report(lambda: w[-4:].assign(Tensor(np.zeros(4, np.float32)).to(w.device)).realize())
    print(os.path.getsize(f"{{d}}/m.safetensors"))
  """, tmp_path)
  assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr}"  # was -7 (SIGBUS)
  out = p.stdout.splitlines()
  assert out[0].startswith("ERR OSError") and "m.safetensors" in out[0] and "truncated" in out[0], out
  assert out[1] == "8"  # a write never re-extends it

# ---------------------------------------------------------------------------- paths

def test_dangling_symlink_is_a_clear_error(tmp_path):
  """A DISK path that is a dangling symlink recursed until RecursionError."""
  os.symlink(tmp_path / "nowhere", tmp_path / "link")
  with pytest.raises(FileNotFoundError, match=r"symbolic link to .*nowhere.*does not exist"):
    Tensor.empty(10, device=f"DISK:{tmp_path}/link").numpy()
  assert not (tmp_path / "nowhere").exists()

@pytest.mark.parametrize("kind", ["dir", "fifo"])
def test_safe_load_of_a_directory_or_fifo(tmp_path, kind):
  """safe_load of a directory or a FIFO said 'no such file'."""
  p = tmp_path / "x"
  if kind == "dir": p.mkdir()
  else: os.mkfifo(p)
  err = IsADirectoryError if kind == "dir" else ValueError
  with pytest.raises(err, match="is a directory" if kind == "dir" else "not a regular file.*FIFO"): safe_load(p)
  with pytest.raises(err): Tensor.empty(4, device=f"DISK:{p}").numpy()

# ---------------------------------------------------------------------------- impossible shapes

def _st_file(path, shape, dtype="F32"):
  h = json.dumps({"a": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}}).encode()
  path.write_bytes(struct.pack("<Q", len(h)) + h)

@pytest.mark.parametrize("shape", [[2**62, 0], [0, 2**63 - 1], [2**40, 2**40, 0], [0, 10**20], [1] * 70 + [0]])
def test_impossible_safetensors_shape(tmp_path, shape):
  """Shapes no tensor can have loaded, then failed later in numpy without the file's name."""
  p = tmp_path / "s.safetensors"
  _st_file(p, shape)
  with pytest.raises(ValueError, match=rf"{p}.*tensor 'a'.*(dims|bytes)"): safe_load(p)

def test_large_empty_shapes_that_fit_still_load(tmp_path):
  p = tmp_path / "s.safetensors"
  _st_file(p, [2**40, 0])
  t = safe_load(p)["a"]
  assert t.shape == (2**40, 0) and t.to("CPU").numpy().shape == (2**40, 0)

# ---------------------------------------------------------------------------- safe_save through symbolic links

def _tensors(v: float) -> dict: return {"w": Tensor(np.full(8, v, np.float32))}

def test_safe_save_onto_a_symlink_writes_its_target(tmp_path):
  """safe_save onto a symlink replaced the link with a file; it now writes the target atomically, keeping its mode."""
  (tmp_path / "models").mkdir()
  target = tmp_path / "models" / "real.safetensors"
  safe_save(_tensors(1.), target)
  os.chmod(target, 0o640)
  os.symlink("models/real.safetensors", tmp_path / "link")  # relative, as `ln -s` makes them
  os.symlink(tmp_path / "link", tmp_path / "link2")  # a chain
  safe_save(_tensors(2.), tmp_path / "link2")
  assert (tmp_path / "link").is_symlink() and (tmp_path / "link2").is_symlink()
  assert safe_load(target)["w"].numpy().tolist() == [2.] * 8
  assert safe_load(tmp_path / "link")["w"].numpy().tolist() == [2.] * 8
  assert (os.stat(target).st_mode & 0o777) == 0o640
  assert sorted(os.listdir(tmp_path / "models")) == ["real.safetensors"] and sorted(os.listdir(tmp_path)) == ["link", "link2", "models"]

def test_safe_save_onto_a_dangling_symlink_creates_its_target(tmp_path):
  os.symlink(tmp_path / "new.safetensors", tmp_path / "link")
  safe_save(_tensors(3.), tmp_path / "link")
  assert (tmp_path / "link").is_symlink() and safe_load(tmp_path / "new.safetensors")["w"].numpy().tolist() == [3.] * 8

def test_safe_save_onto_a_symlink_loop_is_an_error(tmp_path):
  os.symlink(tmp_path / "b", tmp_path / "a")
  os.symlink(tmp_path / "a", tmp_path / "b")
  with pytest.raises(OSError, match="symbolic link"): safe_save(_tensors(1.), tmp_path / "a")
  assert sorted(os.listdir(tmp_path)) == ["a", "b"] and (tmp_path / "a").is_symlink()
