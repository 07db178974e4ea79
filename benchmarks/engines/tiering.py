"""One vLLM instance's offloading side (for tests/vllm/test_tier.py and benchmarks.engines.tier),
as vLLM's OffloadingConnector builds and drives it: the spec made by OffloadingSpecFactory from
kv_connector_extra_config, its TieringOffloadingManager (a CPU primary tier in a shared mmap
region, plus the configured secondary tiers), called the way the scheduler calls it, step by step.
What vLLM's GPU worker would do (copy a block's KV from the GPU into its primary-tier slot, and
back) is done here on the primary tier's memory directly: that copy is the one part that needs
CUDA."""

from __future__ import annotations

import itertools
import mmap
import os
from typing import Any

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from kvstore.engines.vllm.tier import KVStoreTier

PAGE = mmap.PAGESIZE
CHUNK_BYTES = 60_000  # one chunk's KV, not a multiple of the page: the primary tier pads it
_ids = itertools.count()
SINGLE_WORKER = OffloadingParallelConfig(
    rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, data_parallel_index=0,
    data_parallel_size=1, data_parallel_rank_local=None, is_parallelism_agnostic=True,
)  # fmt: skip
SINGLE_WORKER = OffloadingParallelConfig(
    rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, data_parallel_index=0,
    data_parallel_size=1, data_parallel_rank_local=None, is_parallelism_agnostic=True,
)  # fmt: skip
STEP = ScheduleEndContext((), ())


def offload_keys(seed: int, n: int, group: int = 0) -> list[OffloadKey]:
    return [make_offload_key(bytes([seed % 256, i % 256, i // 256]) * 8, group) for i in range(n)]


def payloads(seed: int, n: int, size: int = CHUNK_BYTES) -> list[bytes]:
    """Distinct bytes per chunk."""
    return [os.urandom(8) + bytes([seed % 256, i % 256]) * ((size - 8) // 2) + bytes(size % 2) for i in range(n)]


class Engine:
    def __init__(
        self,
        tiers: list[dict[str, Any]],
        *,
        dtype: str = "float16",
        events: bool = False,
        chunks: int = 64,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.engine_id = f"kvstore-test-{os.getpid()}-{next(_ids)}"
        extra = {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": chunks * -(-chunk_bytes // PAGE) * PAGE,
            "secondary_tiers": tiers,
        }
        config = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layers.0", "layers.1"), group_id=0),),
            worker_kv_bytes_per_block=chunk_bytes,
            enable_kv_cache_events=events,
            extra_config=extra,
            engine_id=self.engine_id,
            model=OffloadingModelConfig(name="tiny-test-model", dtype=dtype),
            cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=SINGLE_WORKER,
        )
        self.spec = OffloadingSpecFactory.create_spec(config)
        manager = self.spec.get_manager()
        assert isinstance(manager, TieringOffloadingManager)
        self.manager = manager
        self.memory = manager.primary_tier.get_kv_memoryview()
        assert self.memory.strides is not None
        self.stride = self.memory.strides[0]
        self.chunk_bytes = chunk_bytes

    @property
    def tier(self) -> KVStoreTier:
        tier = self.manager.secondary_tiers[0]
        assert isinstance(tier, KVStoreTier)
        return tier

    def step(self) -> None:
        self.manager.on_schedule_end(STEP)

    def settle(self) -> None:
        """Wait for the tier's in-flight lookups and jobs (a real signal, not a sleep)."""
        assert self.tier._lookups.wait(30), "lookups did not finish"
        self.tier.drain_jobs()

    def _slot(self, chunk_id: int) -> memoryview:
        flat = self.memory.cast("B")
        return flat[chunk_id * self.stride : chunk_id * self.stride + self.chunk_bytes]

    def store(self, req_id: str, keys: list[OffloadKey], values: list[bytes]) -> None:
        """A request's blocks offloaded: GPU -> primary (here: written in), then vLLM cascades
        them to the secondary tiers; returns once the cascades finished."""
        ctx = ReqContext(req_id)
        self.manager.on_new_request(ctx)
        out = self.manager.prepare_store(keys, ctx)
        assert out is not None and isinstance(out.store_spec, CPULoadStoreSpec)
        by_key = dict(zip(keys, values))
        for key, chunk_id in zip(out.keys_to_store, out.store_spec.chunk_ids):
            self._slot(int(chunk_id))[:] = by_key[key]
        self.manager.complete_store(keys, ctx)
        self.manager.on_request_finished(ctx)
        self.step()  # the end of the step that stored
        self.settle()
        self.step()  # the next one collects the finished cascades

    def lookup(self, ctx: ReqContext, keys: list[OffloadKey]) -> list[LookupResult]:
        return [self.manager.lookup(k, ctx) for k in keys]

    def load(self, req_id: str, keys: list[OffloadKey], rounds: int = 6) -> list[bytes | None]:
        """Look keys up step by step until every one is a hit or a miss (promoting from the
        secondary tiers on the way), then read the hits' primary slots (primary -> GPU)."""
        ctx = ReqContext(req_id)
        self.manager.on_new_request(ctx)
        for _ in range(rounds):
            results = self.lookup(ctx, keys)
            if all(r in (LookupResult.HIT, LookupResult.MISS) for r in results):
                break
            self.step()
            self.settle()
        else:
            raise AssertionError(f"lookups unresolved after {rounds} steps: {results}")
        hits = [k for k, r in zip(keys, results) if r is LookupResult.HIT]
        out: dict[OffloadKey, bytes] = {}
        if hits:
            spec = self.manager.prepare_load(hits, ctx)
            assert isinstance(spec, CPULoadStoreSpec)
            out = {k: bytes(self._slot(int(c))) for k, c in zip(hits, spec.chunk_ids)}
            self.manager.complete_load(hits, ctx)
        self.manager.on_request_finished(ctx)
        self.step()
        return [out.get(k) for k in keys]

    def close(self) -> None:
        self.memory.release()
        self.manager.shutdown()
        region = self.spec._scheduler_mmap  # type: ignore[attr-defined]
        if region is not None:
            region.cleanup()


def tier_config(meta: str, **settings: Any) -> dict[str, Any]:
    return {"type": "KVStoreTier", "module_path": "kvstore.engines.vllm.tier", "meta": meta, **settings}
