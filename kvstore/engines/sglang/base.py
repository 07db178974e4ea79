"""SGLang's HiCache storage interface: its own classes when its package imports, else stand-ins.

SGLang cannot be installed whole without CUDA. Where it is absent the backend still loads (and its
tests run) against these stand-ins, which carry the same method and field names as SGLang 0.5.23's
`sglang.srt.mem_cache.hicache_storage`. Anything SGLang itself hands the backend (PoolTransfer,
HiCacheStorageExtraInfo) is read by field name only, so either kind works.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KV_POOL", "MAMBA_POOL", "SGLANG_BASE", "HiCacheStorage", "PoolTransferResult"]

KV_POOL = "kv"  # PoolName.KV: the anchor pool, registered by register_mem_pool_host
MAMBA_POOL = "mamba"  # PoolName.MAMBA: state sharded by TP rank even when the KV is MLA

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolTransferResult

    SGLANG_BASE = True
except ImportError:
    SGLANG_BASE = False

    @dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        """What batch_exists_v2 answers: the usable prefix, each pool's own boundary, and every
        prefix length that can be restored (trailing pools leave holes)."""

        kv_hit_pages: int
        extra_pool_hit_pages: dict[str, int]
        restorable_prefix_pages: list[int] | None = field(default=None)

    class HiCacheStorage(ABC):  # type: ignore[no-redef]
        """The methods of SGLang's HiCacheStorage this backend provides."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def on_host_pools_registered(self) -> None:
            pass

        @abstractmethod
        def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any: ...

        @abstractmethod
        def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> Any: ...

        @abstractmethod
        def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool: ...

        @abstractmethod
        def batch_set(
            self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
        ) -> bool: ...

        @abstractmethod
        def exists(self, key: str) -> bool: ...

        def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
            for i, key in enumerate(keys):
                if not self.exists(key):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self) -> Any:
            return None
