"""Mooncake Store's Python API over kvstore: `from kvstore.compat.mooncake import MooncakeDistributedStore`.

The names `mooncake.store` exports that this API implements; code written for Mooncake keeps its
calls, return codes and semantics (docs/compat-mooncake.md lists every method and each
difference). To run such code unchanged, without editing its `from mooncake.store import ...`:

    python -m kvstore.compat.mooncake.run SCRIPT [ARGS...]      (or -m MODULE [ARGS...])
    PYTHONPATH=$(python -m kvstore.compat.mooncake.run --print-path) python SCRIPT

Point the code's `master_server_addr` at the kvstore metadata service (what `kvstore serve`
prints as meta=HOST:PORT), or set KVSTORE_MOONCAKE_META=HOST:PORT.
"""

from kvstore.compat.mooncake.buffers import BufferHandle
from kvstore.compat.mooncake.codes import ErrorCode
from kvstore.compat.mooncake.replicate import ObjectDataType, ReplicateConfig, SoftPinAction
from kvstore.compat.mooncake.store import MooncakeDistributedStore

__all__ = [
    "BufferHandle",
    "ErrorCode",
    "MooncakeDistributedStore",
    "ObjectDataType",
    "ReplicateConfig",
    "SoftPinAction",
]
