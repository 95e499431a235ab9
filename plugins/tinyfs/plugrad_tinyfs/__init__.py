"""plugrad-tinyfs: a content-addressed tensor store. The hash scheme (docs/tinyfs.md) as a hashlib reference and as
Keccak-f[1600] in Tensor ops (plugrad_tinyfs.hashing), the TCP server (plugrad_tinyfs.server) and the client
(`fs_store(t)`, `fs_load(hash_tensor, size)`; plugrad_tinyfs.client). The TINYFS device is not written yet."""
from plugrad_tinyfs.client import TinyFSError, fs_load, fs_store, load_bytes, store_bytes
from plugrad_tinyfs.hashing import CHUNK_SIZE, FANOUT, HASH_SIZE, PIECE_SIZE, root_hash_device, root_hash_ref

__all__ = ["CHUNK_SIZE", "FANOUT", "HASH_SIZE", "PIECE_SIZE", "TinyFSError", "fs_load", "fs_store", "load_bytes", "root_hash_device",
           "root_hash_ref", "store_bytes"]
