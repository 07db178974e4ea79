"""KVStoreTier: kvstore as a secondary tier of vLLM's native KV offloading.

vLLM's `OffloadingConnector` with `TieringOffloadingSpec` copies KV between the GPU and a CPU
primary tier itself (hybrid groups, TP layouts and preemption stay on vLLM's side) and cascades
every chunk it stores there to its secondary tiers; a chunk missing from the primary tier is
looked up in them and promoted back. This tier is kvstore behind that interface:

    "secondary_tiers": [{"type": "KVStoreTier", "module_path": "kvstore.engines.vllm.tier",
                         "meta": "127.0.0.1:50051"}]      # or "type": "kvstore" (the plug-in name)

Everything here runs in vLLM's scheduler process and returns at once: lookups are batched into one
store call per step (StepLookups), and stores and loads move bytes on a thread pool between the
primary tier's memory and the store (Jobs). Chunks are named by content (TierKeys), so a chunk
stored by one vLLM instance is a hit for every other instance of the same deployment.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvstore.client import KVClient
from kvstore.config import META_ENV, ClientConfig
from kvstore.engines.vllm.tier.jobs import Jobs
from kvstore.engines.vllm.tier.lookups import StepLookups
from kvstore.engines.vllm.tier.naming import TierKeys, layout_digest, layout_fields
from kvstore.errors import InvalidArgument
from kvstore.types import MAX_BATCH_KEYS

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

log = logging.getLogger(__name__)

LOOKUP_CALLS = "vllm:kv_offload_kvstore_lookup_calls"
LOOKUP_KEYS = "vllm:kv_offload_kvstore_lookup_keys"
LOAD_MISSING = "vllm:kv_offload_kvstore_load_missing_chunks"


class KVStoreTier(SecondaryTierManager):
    medium: ClassVar[Medium] = Medium.CPU  # the store's DRAM tier (its SSD tier sits behind it)
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        meta: str = "",
        tenant: str = "default",
        io_threads: int = 4,
        client: dict[str, Any] | None = None,
        enable_kv_events: bool = False,
        locality: str | None = "REMOTE",
        backpressure_detector: BackpressureDetector | None = None,
    ) -> None:
        """meta: the metadata service (else $KVSTORE_META); tenant: the key namespace; io_threads:
        concurrent store/load jobs; client: KVClient settings (kvstore.config.ClientConfig's fields;
        the token comes from $KVSTORE_TOKEN or the token file, never from vLLM's logged config);
        enable_kv_events: report stored and vanished chunks as vLLM KV events."""
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        address = meta or os.environ.get(META_ENV, "")
        if not address:
            raise InvalidArgument(
                f'the kvstore tier needs the metadata service: set "meta" in its secondary_tiers entry (or ${META_ENV})'
            )
        if io_threads < 1:
            raise InvalidArgument("the kvstore tier's io_threads must be at least 1")
        try:
            settings = ClientConfig(**(client or {}))
        except TypeError as exc:
            raise InvalidArgument(f"the kvstore tier's client settings: {exc}") from None
        self.locality = Locality(locality) if locality is not None else None
        payload = _payload_bytes(offloading_spec, self.block_size_bytes)
        self.layout = layout_fields(offloading_spec, payload)
        self.keys = TierKeys(tenant, layout_digest(self.layout))
        self.client = KVClient(address, settings)
        self._jobs = Jobs(self.client, self.keys, primary_kv_view, payload, io_threads)
        self._lookups = StepLookups(self._exists)
        self._events: list[OffloadingEvent] | None = None
        if enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events:
            self._events = []
        elif enable_kv_events:
            log.warning("kvstore tier: enable_kv_events is set but vLLM's KV cache events are off; none are sent")
        self._reported = (0, 0)  # lookup calls and keys already reported by get_stats
        self._missing = 0

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return {
            LOOKUP_CALLS: OffloadingCounterMetadata(
                documentation="kvstore calls made for tier lookups (one per step)."
            ),
            LOOKUP_KEYS: OffloadingCounterMetadata(documentation="Chunks asked about by kvstore tier lookups."),
            LOAD_MISSING: OffloadingCounterMetadata(
                documentation="Chunks a load found gone from kvstore (evicted or removed after the lookup)."
            ),
        }

    def _exists(self, keys: Sequence[OffloadKey]) -> list[bool]:
        names = self.keys.many(list(keys))
        found: list[bool] = []
        for at in range(0, len(names), MAX_BATCH_KEYS):
            found += self.client.exists_many(names[at : at + MAX_BATCH_KEYS])
        return found

    # -- the interface -----------------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context.req_id)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._jobs.submit(job_metadata)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._jobs.submit(job_metadata)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = []
        for done in self._jobs.finished():
            results.append(done.result)
            if done.failed:  # a failed load is a miss from now on: the request recomputes
                self._lookups.mark_missing(done.failed)
            self._missing += len(done.missing)
            if self._events is not None and (done.stored or done.missing):
                keys = list(done.stored or done.missing)
                self._events.append(OffloadingEvent(keys, self.medium, not done.stored, self.locality))
        return results

    def has_pending_work(self) -> bool:
        return bool(self._jobs.running or self._lookups.busy)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return events

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.forget(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        self._jobs.wait_idle()

    def shutdown(self) -> None:
        self._jobs.close()
        self._lookups.close()
        self.client.close()

    def get_stats(self) -> OffloadingConnectorStats | None:
        calls, keys = self._lookups.calls, self._lookups.keys_asked
        if (calls, keys) == self._reported and not self._missing:
            return None
        stats = OffloadingConnectorStats()
        stats.increase_counter(LOOKUP_CALLS, calls - self._reported[0])
        stats.increase_counter(LOOKUP_KEYS, keys - self._reported[1])
        stats.increase_counter(LOAD_MISSING, self._missing)
        self._reported, self._missing = (calls, keys), 0
        return stats


def _payload_bytes(spec: OffloadingSpec, row_bytes: int) -> int:
    """The bytes of one chunk without the primary tier's page-alignment padding: every worker's
    share of the chunk (one share under a replicated layout)."""
    config = spec.config
    copies = 1 if spec.replicated_layout else max(1, config.parallel.world_size)
    real = config.worker_kv_bytes_per_block * copies * spec.blocks_per_chunk
    return real if 0 < real <= row_bytes else row_bytes
