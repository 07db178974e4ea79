"""KVStoreConnector: LMCache's RemoteConnector over kvstore's client SDK.

A chunk is one kvstore value under `<key_prefix><CacheEngineKey.to_string()>`. With LMCache's
default `save_chunk_meta` it is LMCache's RemoteMetadata header followed by the chunk's bytes
(the layout of LMCache's own Mooncake Store connector), so a reader needs no shape of its own;
with `save_chunk_meta: False` it is the bytes alone, read straight into the memory object LMCache
allocates (a partial last chunk is sized by the bytes read, as LMCache's connectors do).

Every call is a batch of one kvstore RPC round (exists / match_prefix / get / put), run off
LMCache's event loop in a worker thread. A miss, or any kvstore error on a read, is a miss
(None, False, a shorter prefix): LMCache recomputes. A failed put raises, and LMCache counts it.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvstore.client import KVClient, KVStoreError
from kvstore.config import ClientConfig, load_config

log = logging.getLogger(__name__)
T = TypeVar("T")


class KVStoreConnector(RemoteConnector):
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        local_cpu_backend: Any,
        config: Any,
        metadata: Any,
        meta_address: str,
        key_prefix: str,
        client_config: ClientConfig | None = None,
    ) -> None:
        super().__init__(config, metadata)  # meta_shapes, full_chunk_size_bytes, save_chunk_meta, ...
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.key_prefix = key_prefix
        self.client = KVClient(meta_address, client_config or load_config(ClientConfig))
        log.info(
            "kvstore LMCache connector: metadata service %s, keys under %r, chunk metadata %s",
            meta_address,
            key_prefix,
            "stored" if self.save_chunk_meta else "not stored",
        )

    def _key(self, key: CacheEngineKey) -> str:
        return self.key_prefix + str(key.to_string())

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    # -- lookups ---------------------------------------------------------------------------------

    def exists_sync(self, key: CacheEngineKey) -> bool:
        try:
            return self.client.exists_many([self._key(key)])[0]
        except KVStoreError as exc:
            log.warning("kvstore exists failed: %s", exc)
            return False

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._off_loop(self.exists_sync, key)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: builtins.list[CacheEngineKey]) -> int:
        """How many leading chunks are stored: kvstore's MatchPrefix, one RPC."""
        try:
            return self.client.match_prefix([self._key(k) for k in keys]) if keys else 0
        except KVStoreError as exc:
            log.warning("kvstore match_prefix failed: %s", exc)
            return 0

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(
        self, lookup_id: str, keys: builtins.list[CacheEngineKey], pin: bool = False
    ) -> int:
        return await self._off_loop(self.batched_contains, keys)

    # -- reads -----------------------------------------------------------------------------------

    def support_batched_get(self) -> bool:
        return True

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return (await self.batched_get([key]))[0]

    async def batched_get(self, keys: builtins.list[CacheEngineKey]) -> builtins.list[MemoryObj | None]:
        if not keys:
            return []
        read = self._get_with_meta if self.save_chunk_meta else self._get_into_chunks
        return await self._off_loop(read, keys)

    def _get_into_chunks(self, keys: builtins.list[CacheEngineKey]) -> builtins.list[MemoryObj | None]:
        """Bytes alone: each straight into a full-chunk memory object, then trimmed to what was read."""
        objs = [self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt) for _ in keys]
        idxs = [i for i, o in enumerate(objs) if o is not None]
        out: list[MemoryObj | None] = [None] * len(keys)
        if not idxs:
            log.warning("kvstore get: LMCache could not allocate memory for %d chunks", len(keys))
            return out
        results = self._read([self._key(keys[i]) for i in idxs], [objs[i].byte_array for i in idxs])
        for i, n in zip(idxs, results):
            obj = objs[i]
            if isinstance(n, int) and n > 0:
                try:
                    out[i] = self.reshape_partial_chunk(obj, n)
                    continue
                except ValueError as exc:
                    log.warning("kvstore get: %s holds %d bytes, not a whole number of tokens: %s", keys[i], n, exc)
            obj.ref_count_down()
        return out

    def _get_with_meta(self, keys: builtins.list[CacheEngineKey]) -> builtins.list[MemoryObj | None]:
        """Header and bytes: read into one staging buffer per key, then copied into a memory
        object of the shape the header gives."""
        header = self.remote_metadata_bytes
        staging = [bytearray(header + self.full_chunk_size_bytes) for _ in keys]
        results = self._read([self._key(k) for k in keys], staging)
        out: list[MemoryObj | None] = [None] * len(keys)
        for i, (n, buf) in enumerate(zip(results, staging)):
            if not isinstance(n, int) or n <= header:
                continue
            meta = RemoteMetadata.deserialize(bytes(buf[:header]))
            if meta.length != n - header:
                log.warning("kvstore get: %s is %d bytes, its header says %d", keys[i], n - header, meta.length)
                continue
            obj = self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)
            if obj is None or obj.raw_tensor is None:
                log.warning("kvstore get: LMCache could not allocate memory for %s", keys[i])
                continue
            obj.raw_tensor.copy_(torch.frombuffer(buf, dtype=torch.uint8, offset=header, count=meta.length))
            out[i] = obj
        return out

    def _read(self, store_keys: list[str], buffers: list[Any]) -> list[Any]:
        """Per key the byte count, or the error (a miss is KeyNotFound): never raises."""
        try:
            return self.client.get_many_into(store_keys, buffers, strict=False)
        except KVStoreError as exc:
            log.warning("kvstore get of %d chunks failed: %s", len(store_keys), exc)
            return [exc] * len(store_keys)

    # -- writes ----------------------------------------------------------------------------------

    def support_batched_put(self) -> bool:
        return True

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self.batched_put([key], [memory_obj])

    async def batched_put(self, keys: builtins.list[CacheEngineKey], memory_objs: builtins.list[MemoryObj]) -> None:
        """Store the chunks (a chunk already stored keeps its bytes: equal keys, equal KV).
        Raises the first kvstore error; the chunks that could be written are."""
        if keys:
            values = [self._value(o) for o in memory_objs]
            await self._off_loop(self.client.put_many, [self._key(k) for k in keys], values)

    def _value(self, obj: MemoryObj) -> Any:
        data = obj.byte_array
        if not self.save_chunk_meta:
            return data
        header = RemoteMetadata(len(data), obj.get_shapes(), obj.get_dtypes(), obj.get_memory_format()).serialize()
        value = bytearray(len(header) + len(data))
        value[: len(header)] = header
        value[len(header) :] = data
        return value

    def remove_sync(self, key: CacheEngineKey) -> bool:
        try:
            self.client.remove(self._key(key), force=True)
            return True
        except KVStoreError:
            return False

    # -- the rest --------------------------------------------------------------------------------

    async def list(self) -> builtins.list[str]:
        """Empty: kvstore's client cannot list the store's keys."""
        return []

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        try:
            await self._off_loop(self.client.exists_many, ["lmcache/ping"])
            return 0
        except KVStoreError:
            return 1

    async def close(self) -> None:
        self.client.close()
