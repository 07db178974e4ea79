"""LMCache's own engine (LMCacheEngine, in process, CPU) with kvstore as its remote storage
plug-in, loaded by name from LMCache's configuration, in a process of its own:

    python -m tests.compat.lmcache_engine store|retrieve META [--no-chunk-meta] [--via-mooncake]

`store` fills a paged KV cache with seeded random values and stores a prompt's KV through
LMCache (which chunks it and puts the chunks into kvstore); `retrieve`, in another process,
retrieves the same prompt into an empty paged KV cache and compares it with the same seeded
values. Prints `RESULT {json}`. `--via-mooncake` stores through LMCache's own Mooncake Store
connector instead (run it under the mooncake.store alias, KVSTORE_MOONCAKE_META=META); the
retrieving side then reads those chunks with kvstore's plug-in, keys unprefixed.

LMCache has no CPU connector for vLLM's paged KV cache (its CreateGPUConnector refuses the CPU
device), so `CpuPagedKV` below is the serving engine's side: it copies between a paged KV cache
(per layer [2, blocks, block_size, hidden]) and LMCache's chunk format (KV_2LTD), by slot mapping.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch

LAYERS, HEADS, HEAD_DIM, BLOCK, BLOCKS, CHUNK = 2, 2, 16, 16, 64, 64
HIDDEN = HEADS * HEAD_DIM
TOKENS = list(range(1000, 1000 + 300))  # 4 full chunks of 64 and a partial one of 44
DTYPE = torch.float16


def make_connector():
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    class CpuPagedKV(GPUConnectorInterface):  # type: ignore[misc]  # LMCache ships no types: its base is Any
        """Paged KV on the CPU <-> LMCache memory objects [2, layers, tokens, hidden]."""

        def __init__(self, layers: int, hidden: int) -> None:
            self.layers, self.hidden = layers, hidden

        def _pages(self, kvcaches, layer: int) -> torch.Tensor:
            return kvcaches[layer].view(2, -1, self.hidden)  # [2, slots, hidden]

        def from_gpu(self, memory_obj, start, end, **kwargs):
            slots = kwargs["slot_mapping"][start:end]
            for layer in range(self.layers):
                memory_obj.tensor[:, layer, : end - start] = self._pages(kwargs["kvcaches"], layer)[:, slots]

        def to_gpu(self, memory_obj, start, end, **kwargs):
            slots = kwargs["slot_mapping"][start:end]
            for layer in range(self.layers):
                self._pages(kwargs["kvcaches"], layer)[:, slots] = memory_obj.tensor[:, layer, : end - start]

        def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
            for obj, start, end in zip(memory_objs, starts, ends):
                self.from_gpu(obj, start, end, **kwargs)

        def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
            for obj, start, end in zip(memory_objs, starts, ends):
                self.to_gpu(obj, start, end, **kwargs)

        def get_shape(self, num_tokens: int) -> torch.Size:
            return torch.Size([2, self.layers, num_tokens, self.hidden])

    return CpuPagedKV(LAYERS, HIDDEN)


def plugin_config(meta: str, via_mooncake: bool) -> dict[str, Any]:
    if via_mooncake:  # LMCache's builtin adapter for plugin://mooncakestore
        return {
            "remote_storage_plugins": ["mooncakestore"],
            "extra_config": {
                "mooncake_local_hostname": "127.0.0.1",
                "mooncake_metadata_server": "P2PHANDSHAKE",
                "mooncake_protocol": "tcp",
                "mooncake_master_server_address": meta,
                "mooncake_global_segment_size": "0",
                "mooncake_local_buffer_size": "16777216",
            },
        }
    return {
        "remote_storage_plugins": ["kvstore"],
        "extra_config": {
            "remote_storage_plugin.kvstore.module_path": "kvstore.compat.lmcache.adapter",
            "remote_storage_plugin.kvstore.class_name": "KVStoreConnectorAdapter",
            "kvstore.meta": meta,
        },
    }


def engine(meta: str, chunk_meta: bool, instance: str, via_mooncake: bool = False, key_prefix: str | None = None):
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata

    plugin = plugin_config(meta, via_mooncake)
    plugin["extra_config"]["save_chunk_meta"] = chunk_meta
    if key_prefix is not None:
        plugin["extra_config"]["kvstore.key_prefix"] = key_prefix
    config = LMCacheEngineConfig.from_dict(
        {
            "chunk_size": CHUNK,
            "local_cpu": False,
            "max_local_cpu_size": 0.05,
            "remote_serde": "naive",
            "pre_caching_hash_algorithm": "sha256_cbor",  # equal tokens, equal keys in every process
            "save_unfull_chunk": True,
            **plugin,
        }
    )
    metadata = LMCacheMetadata(
        model_name="org/tiny",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=DTYPE,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_DIM),
        chunk_size=CHUNK,
    )
    eng = LMCacheEngineBuilder.get_or_create(instance, config, metadata, make_connector(), None, None)
    eng.post_init()  # builds the storage manager and its backends
    return eng


def paged_kv(seed: int | None) -> list[torch.Tensor]:
    if seed is None:
        return [torch.zeros(2, BLOCKS, BLOCK, HIDDEN, dtype=DTYPE) for _ in range(LAYERS)]
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, BLOCKS, BLOCK, HIDDEN, generator=generator).to(DTYPE) for _ in range(LAYERS)]


def slot_mapping(first_block: int) -> torch.Tensor:
    """The prompt's tokens in consecutive blocks from `first_block` (another place in each process)."""
    return torch.arange(first_block * BLOCK, first_block * BLOCK + len(TOKENS), dtype=torch.long)


def remote_backend(eng):
    backends = eng.storage_manager.storage_backends
    return next(b for name, b in backends.items() if name.startswith("RemoteBackend"))


def main(role: str, meta: str, chunk_meta: bool, via_mooncake: bool) -> dict[str, Any]:
    eng = engine(
        meta, chunk_meta, f"kvstore-compat-{role}", via_mooncake and role == "store", "" if via_mooncake else None
    )
    backend = remote_backend(eng)
    connector = getattr(backend.connection, "_connector", backend.connection)  # inside LMCache's instrumentation
    out: dict[str, Any] = {"remote_backend": type(backend).__name__, "connector": type(connector).__name__}
    tokens = torch.tensor(TOKENS)
    if role == "store":
        kv, slots = paged_kv(7), slot_mapping(2)
        eng.store(tokens, kvcaches=kv, slot_mapping=slots)
        # LMCache puts asynchronously: done when its lookup (kvstore's MatchPrefix) sees every chunk.
        deadline = time.monotonic() + 60
        while eng.lookup(tokens) < len(TOKENS) and time.monotonic() < deadline:
            time.sleep(0.02)
        out["lookup"] = eng.lookup(tokens)
        out["put_failed"] = backend.put_failed_count
    else:
        out["lookup"] = eng.lookup(tokens)
        kv, slots = paged_kv(None), slot_mapping(20)
        mask = eng.retrieve(tokens, kvcaches=kv, slot_mapping=slots)
        out["retrieved_tokens"] = int(mask.sum())
        expected, stored_slots = paged_kv(7), slot_mapping(2)
        same = all(
            torch.equal(kv[layer].view(2, -1, HIDDEN)[:, slots], expected[layer].view(2, -1, HIDDEN)[:, stored_slots])
            for layer in range(LAYERS)
        )
        out["identical"] = same
        out["rest_untouched"] = all(not kv[layer].view(2, -1, HIDDEN)[:, : slots[0]].any() for layer in range(LAYERS))
        out["missing_lookup"] = eng.lookup(torch.tensor([7] * 200))
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    LMCacheEngineBuilder.destroy(f"kvstore-compat-{role}")
    return out


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2], "--no-chunk-meta" not in sys.argv, "--via-mooncake" in sys.argv)
    print("RESULT " + json.dumps(result), flush=True)
