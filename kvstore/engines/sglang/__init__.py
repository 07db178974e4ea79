"""kvstore as SGLang's HiCache storage tier (L3), loaded by SGLang's `dynamic` backend:

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvstore",
            "module_path": "kvstore.engines.sglang", "class_name": "KVStoreHiCacheStorage",
            "interface_v1": 1, "meta": "127.0.0.1:50051"}'

base.py: SGLang's interface (its classes, or stand-ins where it is absent); config.py: the
settings; naming.py: how each rank names each pool's pages and which it writes (MLA stored once);
hits.py: the prefix hit over several pools; backend.py: the backend SGLang calls.
"""

from kvstore.engines.sglang.backend import KVStoreHiCacheStorage
from kvstore.engines.sglang.base import SGLANG_BASE
from kvstore.engines.sglang.config import HiCacheConfig

__all__ = ["SGLANG_BASE", "HiCacheConfig", "KVStoreHiCacheStorage"]
