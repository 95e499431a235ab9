"""plugrad-tinyfs: a content-addressed tensor store. The hash scheme (docs/tinyfs.md) as a hashlib reference and as
Keccak-f[1600] in Tensor ops (plugrad_tinyfs.hashing), the TCP server (plugrad_tinyfs.server) and the client
(plugrad_tinyfs.client). The plugin adds `Tensor.fs_store()` and `hash_tensor.fs_load(size)` through the
plugrad_tensor_methods hook; `fs_store(t)` / `fs_load(h, size)` are the same functions. The TINYFS device is not written yet."""
from plugrad.plugins import hookimpl
from plugrad_tinyfs.client import TinyFSError, fs_load, fs_store, load_bytes, store_bytes
from plugrad_tinyfs.hashing import CHUNK_SIZE, FANOUT, HASH_SIZE, PIECE_SIZE, root_hash_device, root_hash_ref

__all__ = ["CHUNK_SIZE", "FANOUT", "HASH_SIZE", "PIECE_SIZE", "TinyFSError", "fs_load", "fs_store", "load_bytes", "root_hash_device",
           "root_hash_ref", "store_bytes"]

@hookimpl
def plugrad_tensor_methods() -> dict[str, str]:
  return {"fs_store": "plugrad_tinyfs.client:fs_store", "fs_load": "plugrad_tinyfs.client:fs_load"}
