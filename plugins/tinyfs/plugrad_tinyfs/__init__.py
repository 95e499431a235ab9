"""plugrad-tinyfs: a content-addressed tensor store. So far: the hash scheme (docs/tinyfs.md) as a hashlib reference and
as Keccak-f[1600] in Tensor ops (plugrad_tinyfs.hashing). The server, client and TINYFS device are not written yet."""
from plugrad_tinyfs.hashing import CHUNK_SIZE, FANOUT, HASH_SIZE, PIECE_SIZE, root_hash_device, root_hash_ref

__all__ = ["CHUNK_SIZE", "FANOUT", "HASH_SIZE", "PIECE_SIZE", "root_hash_device", "root_hash_ref"]
