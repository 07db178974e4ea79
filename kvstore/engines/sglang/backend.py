"""KVStoreHiCacheStorage: kvstore as SGLang's HiCache storage tier (L3), every interface SGLang calls.

- flat (`batch_get` / `batch_set`): one object per page, moved through a tensor;
- v1 zero copy (`interface_v1`; `batch_get_v1` / `batch_set_v1`): each KV page moved straight
  between the host pool and the store as the pool's own buffer regions, one object per region;
- v2 (`batch_exists_v2`, `batch_get_v2` / `batch_set_v2`), for models with several host pools
  (DeepSeek's indexer, Mamba / SWA state): every pool's pages zero copy, named per pool, one
  metadata round and one transfer batch for all pools of a call; a prefix is a hit only when
  every pool has what it needs of it (hits.py).

Nothing raises into SGLang: a failed read is a miss (it recomputes), a failed write is reported as
False. Built by SGLang as `KVStoreHiCacheStorage(storage_config, kwargs)`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from kvstore.client import KVClient, KVStoreError
from kvstore.config import ClientConfig
from kvstore.engines.sglang.base import KV_POOL, HiCacheStorage, PoolTransferResult
from kvstore.engines.sglang.config import HiCacheConfig
from kvstore.engines.sglang.hits import PoolNeed, fold, leading
from kvstore.engines.sglang.naming import Placement, StoredPool

log = logging.getLogger("kvstore.engines.sglang")


class KVStoreHiCacheStorage(HiCacheStorage):  # type: ignore[misc]  # SGLang's base is untyped
    def __init__(self, storage_config: Any, kwargs: dict[str, Any] | None = None) -> None:
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        config = HiCacheConfig.from_extra(extra)
        self.zero_copy = bool(int(extra.get("interface_v1", 0)))
        self.client = KVClient(
            config.meta, ClientConfig(timeout_s=config.timeout_s, transports=config.transports, token=config.token)
        )
        self._tenant = config.tenant
        self._model = str(getattr(storage_config, "model_name", None) or "model")
        self.placement = Placement.of(storage_config)
        self._kv: StoredPool | None = None  # the anchor pool, once registered
        self._pools: dict[str, StoredPool] = {}  # the other pools, by SGLang's pool name
        self.mem_pool_host: Any = None
        self.stats = {"get_pages": 0, "get_hits": 0, "set_pages": 0, "set_failures": 0, "set_skipped": 0}

    # -- pools -----------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """The anchor (KV) pool; its page layout names its pages."""
        super().register_mem_pool_host(mem_pool_host)
        self._kv = StoredPool.of(KV_POOL, mem_pool_host, self.placement, self._model, self._tenant, self.zero_copy)
        log.info("kvstore HiCache backend: pages named %s", self._kv.scheme.named("<hash>"))

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Another pool of a hybrid model (v2); its pages always move zero copy."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        if name != KV_POOL:  # the anchor came through register_mem_pool_host
            self._pools[name] = StoredPool.of(name, host_pool, self.placement, self._model, self._tenant)

    def _pool(self, name: Any) -> StoredPool | None:
        return self._kv if str(name) == KV_POOL else self._pools.get(str(name))

    def _anchor(self) -> StoredPool:
        if self._kv is None:
            raise RuntimeError("kvstore HiCache backend: register_mem_pool_host first")
        return self._kv

    # -- existence -------------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading pages are stored whole: one MatchPrefix for the batch."""
        if not keys:
            return 0
        kv = self._anchor()
        try:
            return self.client.match_prefix(kv.keys(keys)) // max(kv.parts, 1)
        except KVStoreError as exc:
            log.warning("kvstore HiCache backend: exists failed (%s); treating pages as absent", exc)
            return 0

    def batch_exists_v2(self, keys: list[str], pool_transfers: Any = None, extra_info: Any = None) -> Any:
        """The usable prefix of `keys` over the KV and every transfer's pool, by each pool's hit
        policy: one Exists call for all of them."""
        transfers = list(pool_transfers or [])
        if not keys:
            return PoolTransferResult(0, {}, [])
        pools = [self._kv, *(self._pool(t.name) for t in transfers)]
        asked = [p.keys(keys) if p is not None and p.physical else [] for p in pools]
        try:
            flags = self.client.exists_many([k for ks in asked for k in ks])
        except KVStoreError as exc:
            log.warning("kvstore HiCache backend: exists failed (%s); treating pages as absent", exc)
            return PoolTransferResult(0, {}, [])
        present: list[list[bool]] = []
        for pool, ks in zip(pools, asked):
            mine, flags = flags[: len(ks)], flags[len(ks) :]
            if pool is None:  # a pool never registered: nothing of it can be stored
                present.append([False] * len(keys))
            else:  # a logical pool (no bytes of its own) has every page
                present.append(pool.pages_whole(mine) if pool.physical else [True] * len(keys))
        needs = [
            PoolNeed(str(t.name), str(getattr(t.hit_policy, "value", t.hit_policy)), len(t.keys or ()))
            for t in transfers
        ]
        hits = fold(KV_POOL, leading(present[0]), list(zip(needs, present[1:])))
        return PoolTransferResult(hits.kv_hit_pages, hits.pool_hit_pages, hits.restorable)

    # -- flat pages (SGLang's generic path) --------------------------------------------------------

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        """Read each page into its target tensor (or a new uint8 tensor); None where it missed."""
        if not keys:
            return []
        names = self._anchor().keys(keys)
        given: list[torch.Tensor | None] = (
            list(target_locations) if target_locations is not None else [None] * len(keys)
        )
        out: list[torch.Tensor | None] = [None] * len(keys)
        self.stats["get_pages"] += len(keys)
        try:
            if any(t is None for t in given):
                values = self.client.get_many(names)
                targets = [
                    t if t is not None else torch.frombuffer(bytearray(v), dtype=torch.uint8)
                    for t, v in zip(given, values)
                ]
                results: list[Any] = [t.numel() * t.element_size() for t in targets]
            else:
                targets = [t for t in given if t is not None]  # every one given
                results = self.client.get_many_into(names, targets, strict=False)
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
        if not self.placement.writes(KV_POOL):
            self.stats["set_skipped"] += len(keys)
            return True
        values = [v.contiguous() if isinstance(v, torch.Tensor) else v for v in values]
        return all(self._put(self._anchor().keys(keys), values, len(keys)))

    # -- zero copy: v1 (the KV pool) and v2 (every pool) -----------------------------------------

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Read KV pages straight into the host pool's memory at `host_indices` (page-aligned)."""
        return self._move([(KV_POOL, keys, host_indices)], put=False)[KV_POOL]

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Store KV pages straight from the host pool's memory at `host_indices`."""
        return self._move([(KV_POOL, keys, host_indices)], put=True)[KV_POOL]

    def batch_get_v2(self, transfers: list[Any], extra_info: Any = None) -> dict[str, list[bool]]:
        """Read each transfer's pages into its pool at its host indices; per pool, per page."""
        return self._move([(str(t.name), list(t.keys or ()), t.host_indices) for t in transfers], put=False)

    def batch_set_v2(self, transfers: list[Any], extra_info: Any = None) -> dict[str, list[bool]]:
        """Store each transfer's pages from its pool; a replicated pool on a rank that is not its
        writer is left to the writer (reported stored)."""
        return self._move([(str(t.name), list(t.keys or ()), t.host_indices) for t in transfers], put=True)

    def _move(self, work: Sequence[tuple[str, list[str], torch.Tensor | None]], put: bool) -> dict[str, list[bool]]:
        """Every pool's pages in one batch: per pool name (in order), per page, whether it moved."""
        out: dict[str, list[bool]] = {}
        batch: list[tuple[str, int, int, int]] = []  # pool name, pages, first object, parts
        names: list[str] = []
        buffers: list[memoryview] = []
        for name, pages, indices in work:
            pool = self._pool(name)
            if not pages:
                out.setdefault(name, [])
                continue
            if put and pool is not None and not self.placement.writes(name):
                self.stats["set_skipped"] += len(pages)
                out.setdefault(name, []).extend([True] * len(pages))
                continue
            if (
                pool is None
                or not pool.physical
                or pool.flat
                or indices is None
                or indices.numel() != len(pages) * pool.page_tokens
            ):
                log.warning("kvstore HiCache backend: pool %s cannot move %d pages zero copy", name, len(pages))
                out.setdefault(name, []).extend([False] * len(pages))
                continue
            batch.append((name, len(pages), len(names), pool.parts))
            names += pool.keys(pages)
            buffers += pool.regions(indices)
        total = sum(b[1] for b in batch)
        moved = self._put(names, buffers, total) if put else self._get(names, buffers, total)
        for name, count, first, parts in batch:
            flags = moved[first : first + count * parts]
            whole = [all(flags[i : i + parts]) for i in range(0, len(flags), parts)]
            out.setdefault(name, []).extend(whole)
            if not put:
                self.stats["get_hits"] += sum(whole)
        return out

    def _get(self, names: list[str], buffers: list[memoryview], pages: int) -> list[bool]:
        if not names:
            return []
        self.stats["get_pages"] += pages
        try:
            results = self.client.get_many_into(names, buffers, strict=False)
        except KVStoreError as exc:
            log.warning("kvstore HiCache backend: get of %d objects failed (%s)", len(names), exc)
            return [False] * len(names)
        return [not isinstance(r, KVStoreError) and r == len(b) for r, b in zip(results, buffers)]

    def _put(self, names: list[str], values: list[Any], pages: int) -> list[bool]:
        if not names:
            return []
        self.stats["set_pages"] += pages
        first = {n: i for i, n in reversed(list(enumerate(names)))}  # a name twice is put once
        unique = sorted(first.values())
        try:
            self.client.put_many([names[i] for i in unique], [values[i] for i in unique])
            return [True] * len(names)
        except KVStoreError as exc:
            # put_many commits what it could before raising; ask which keys made it.
            log.warning("kvstore HiCache backend: set of %d pages failed (%s)", pages, exc)
            self.stats["set_failures"] += pages
            try:
                return self.client.exists_many(names)
            except KVStoreError:
                return [False] * len(names)

    # -- lifecycle -------------------------------------------------------------------------------

    def clear(self) -> None:
        """Nothing to drop locally: kvstore's own eviction manages the bytes (shared by instances)."""

    def get_stats(self) -> dict[str, int]:
        return dict(self.stats)

    def close(self) -> None:
        self.client.close()
