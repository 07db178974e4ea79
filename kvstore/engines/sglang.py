"""KVStoreHiCacheStorage: kvstore as SGLang's HiCache storage tier (L3).

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvstore",
            "module_path": "kvstore.engines.sglang", "class_name": "KVStoreHiCacheStorage",
            "interface_v1": 1, "meta": "127.0.0.1:50051"}'

SGLang names pages by chained SHA-256 hex; this backend puts them in the namespace of a
kvstore.engines.keys.KeyScheme (tenant, model, and a layout of shard (TP/PP/CP rank) and the host
pool's page layout), as every engine shim does, so instances that lay out pages differently never
read each other's bytes. Settings (HiCacheConfig) are the extra config's keys, else
$KVSTORE_SGLANG_<FIELD> ($KVSTORE_META for `meta`), read by kvstore.config.load_config. With
`interface_v1` SGLang calls the zero-copy `batch_get_v1` / `batch_set_v1`: each page is moved
straight between the host KV pool and the store as the pool's own buffer regions (K and V, or per layer),
one object per region; otherwise `batch_get` / `batch_set` move one flat object per page.

Nothing raises into SGLang: a failed read is a miss (it recomputes), a failed write is reported as
False. Built by SGLang as `KVStoreHiCacheStorage(storage_config, kwargs)`.
"""

from __future__ import annotations

import ctypes
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from kvstore.client import KVClient, KVStoreError
from kvstore.config import META_ENV, TOKEN_ENV, ClientConfig, load_config
from kvstore.engines.keys import KeyScheme
from kvstore.errors import InvalidArgument

log = logging.getLogger("kvstore.engines.sglang")

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

    SGLANG_BASE = True
except ImportError:  # SGLang absent (it cannot be installed whole without CUDA): same interface
    SGLANG_BASE = False

    class HiCacheStorage(ABC):  # type: ignore[no-redef]
        """The methods of sglang.srt.mem_cache.hicache_storage.HiCacheStorage this backend provides."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

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


_OWN_KEYS = {"backend_name", "module_path", "class_name", "interface_v1"}  # SGLang's own


@dataclass(frozen=True)
class HiCacheConfig:
    SECTION: ClassVar[str] = "sglang"
    ENV: ClassVar[dict[str, str]] = {"meta": META_ENV, "token": TOKEN_ENV}

    meta: str = ""  # the kvstore metadata service
    tenant: str = "default"  # key namespace: tenants never share pages
    transports: tuple[str, ...] = ("shm", "mooncake", "ucx", "tcp")  # client transports, preferred first
    timeout_s: float = 10.0  # metadata calls and transfers
    token: str = field(default="", repr=False)  # bearer token ($KVSTORE_TOKEN; none: the token file)

    def __post_init__(self) -> None:
        if not self.meta:
            raise InvalidArgument(
                'set "meta" in --hicache-storage-backend-extra-config (or $KVSTORE_META) '
                "to the kvstore metadata service address"
            )


class KVStoreHiCacheStorage(HiCacheStorage):
    def __init__(self, storage_config: Any, kwargs: dict[str, Any] | None = None) -> None:
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        try:
            config = load_config(HiCacheConfig, None, None, **{k: v for k, v in extra.items() if k not in _OWN_KEYS})
        except InvalidArgument as exc:
            raise InvalidArgument(f"kvstore HiCache backend: {exc}") from None
        self.zero_copy = bool(int(extra.get("interface_v1", 0)))
        self.client = KVClient(
            config.meta, ClientConfig(timeout_s=config.timeout_s, transports=config.transports, token=config.token)
        )
        self._tenant = config.tenant
        self._model = str(getattr(storage_config, "model_name", None) or "model")
        self._shard = _shard(storage_config)
        self._scheme = KeyScheme(self._model, f"sglang-{self._shard}-unregistered", 1, self._tenant)
        self._parts = 1
        self.mem_pool_host: Any = None
        self.stats = {"get_pages": 0, "get_hits": 0, "set_pages": 0, "set_failures": 0}

    # -- naming ----------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Name pages by the host pool's layout: dtype, page size, layout and the regions a page
        spans (zero copy) or its flat size."""
        super().register_mem_pool_host(mem_pool_host)
        page = int(mem_pool_host.page_size)
        dtype = str(getattr(mem_pool_host, "dtype", "raw")).removeprefix("torch.")
        if self.zero_copy:
            _, sizes = mem_pool_host.get_page_buffer_meta(torch.arange(page))
            self._parts = len(sizes)
            shape = f"v1-{len(sizes)}x{sizes[0]}"
        else:
            shape = f"flat{mem_pool_host.get_dummy_flat_data_page().nbytes}"
        layout = f"sglang-{self._shard}-{dtype}-p{page}-{getattr(mem_pool_host, 'layout', 'layout')}-{shape}"
        self._scheme = KeyScheme(self._model, layout, page, self._tenant)
        log.info("kvstore HiCache backend: pages named %s", self._scheme.named("<hash>"))

    def _key(self, key: str) -> str:
        return self._scheme.named(key)

    def _part_keys(self, keys: list[str]) -> list[str]:
        if not self.zero_copy:
            return [self._key(k) for k in keys]
        return [self._scheme.named(k, p) for k in keys for p in range(self._parts)]

    # -- existence -------------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading pages are stored whole: one MatchPrefix for the batch."""
        if not keys:
            return 0
        try:
            return self.client.match_prefix(self._part_keys(keys)) // (self._parts if self.zero_copy else 1)
        except KVStoreError as exc:
            log.warning("kvstore HiCache backend: exists failed (%s); treating pages as absent", exc)
            return 0

    # -- flat pages (SGLang's generic path) --------------------------------------------------------

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        """Read each page into its target tensor (or a new uint8 tensor); None where it missed."""
        if not keys:
            return []
        given: list[torch.Tensor | None] = (
            list(target_locations) if target_locations is not None else [None] * len(keys)
        )
        out: list[torch.Tensor | None] = [None] * len(keys)
        self.stats["get_pages"] += len(keys)
        try:
            if any(t is None for t in given):
                values = self.client.get_many([self._key(k) for k in keys])
                targets = [
                    t if t is not None else torch.frombuffer(bytearray(v), dtype=torch.uint8)
                    for t, v in zip(given, values)
                ]
                results: list[Any] = [t.numel() * t.element_size() for t in targets]
            else:
                targets = [t for t in given if t is not None]  # every one given
                results = self.client.get_many_into([self._key(k) for k in keys], targets, strict=False)
        except KVStoreError as exc:
            log.warning("kvstore HiCache backend: get of %d pages failed (%s)", len(keys), exc)
            return out
        for i, (target, got) in enumerate(zip(targets, results)):
            if not isinstance(got, KVStoreError) and got == target.numel() * target.element_size():
                out[i] = target
        self.stats["get_hits"] += sum(o is not None for o in out)
        return out

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        """Store each page (a stored key keeps its first value: equal keys mean equal bytes)."""
        if not keys:
            return True
        return all(self._put([self._key(k) for k in keys], [_contiguous(v) for v in values], len(keys)))

    # -- zero copy (interface_v1) ----------------------------------------------------------------

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Read pages straight into the host pool's memory at `host_indices` (page-aligned)."""
        if not keys:
            return []
        buffers = self._regions(host_indices)
        self.stats["get_pages"] += len(keys)
        try:
            results = self.client.get_many_into(self._part_keys(keys), buffers, strict=False)
        except KVStoreError as exc:
            log.warning("kvstore HiCache backend: get of %d pages failed (%s)", len(keys), exc)
            return [False] * len(keys)
        ok = [not isinstance(r, KVStoreError) and r == len(b) for r, b in zip(results, buffers)]
        pages = [all(ok[i * self._parts : (i + 1) * self._parts]) for i in range(len(keys))]
        self.stats["get_hits"] += sum(pages)
        return pages

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Store pages straight from the host pool's memory at `host_indices`."""
        if not keys:
            return []
        ok = self._put(self._part_keys(keys), self._regions(host_indices), len(keys))
        return [all(ok[i * self._parts : (i + 1) * self._parts]) for i in range(len(keys))]

    def _regions(self, host_indices: torch.Tensor) -> list[memoryview]:
        """The host pool's memory for these pages, as writable views in object-key order."""
        if self.mem_pool_host is None:
            raise RuntimeError("kvstore HiCache backend: zero copy needs register_mem_pool_host first")
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        return [
            np.ctypeslib.as_array((ctypes.c_ubyte * size).from_address(ptr)).data  # memoryview(array)
            for ptr, size in zip(ptrs, sizes)
        ]

    def _put(self, keys: list[str], values: list[Any], pages: int) -> list[bool]:
        self.stats["set_pages"] += pages
        try:
            self.client.put_many(keys, values)
            return [True] * len(keys)
        except KVStoreError as exc:
            # put_many commits what it could before raising; ask which keys made it.
            log.warning("kvstore HiCache backend: set of %d pages failed (%s)", pages, exc)
            self.stats["set_failures"] += pages
            try:
                return self.client.exists_many(keys)
            except KVStoreError:
                return [False] * len(keys)

    # -- lifecycle -------------------------------------------------------------------------------

    def clear(self) -> None:
        """Nothing to drop locally: kvstore's own eviction manages the bytes (shared by instances)."""

    def get_stats(self) -> dict[str, int]:
        return dict(self.stats)

    def close(self) -> None:
        self.client.close()


def _shard(cfg: Any) -> str:
    if getattr(cfg, "is_mla_model", False):
        shard = "mla"  # MLA KV is the same on every TP rank
    else:
        shard = f"tp{getattr(cfg, 'tp_rank', 0)}of{getattr(cfg, 'tp_size', 1)}"
    if getattr(cfg, "pp_size", 1) > 1:
        shard += f"-pp{cfg.pp_rank}of{cfg.pp_size}"
    if getattr(cfg, "attn_cp_size", 1) > 1:
        shard += f"-cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}"
    return shard


def _contiguous(value: Any) -> Any:
    return value.contiguous() if isinstance(value, torch.Tensor) else value
