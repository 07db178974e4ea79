"""KVStoreConnector: vLLM's v1 KV connector API over kvstore.

Loaded by vLLM like any out-of-tree connector:

    --kv-transfer-config '{"kv_connector": "KVStoreConnector",
                           "kv_connector_module_path": "kvstore.engines.vllm",
                           "kv_role": "kv_producer" | "kv_consumer" | "kv_both",
                           "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"meta": "127.0.0.1:50051"}}'

vLLM builds it twice: in the scheduler (role SCHEDULER, `SchedulerSide`) and in each worker
(role WORKER, `WorkerSide`). Roles: kv_producer saves (and loads a cached prefix), kv_consumer
only loads, kv_both does both (prefix reuse across requests and restarts). Each worker names its
blocks from the cache tensors it is given and reports that naming to the scheduler through vLLM's
handshake metadata, so both sides use identical keys.

Hybrid models (several KV cache groups: sliding-window or Mamba layers beside full attention) are
supported through vLLM's hybrid memory allocator (`SupportsHMA`): blocks arrive as one list per
group, each chunk of `lcm(block sizes)` tokens is stored as one object holding every group's blocks
(staged_codec.py), and a lookup applies each group's own needs (groups.py). Such a model loads
asynchronously only (vLLM takes a multi-group load failure only by request, in `failed_recving`,
which exists for async loads) and saves synchronously (vLLM frees sliding-window blocks while
the request runs, so a save must end within its step).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvstore.engines.keys import Granularity, Shard
from kvstore.engines.vllm.config import BlockNames, ConnectorConfig
from kvstore.engines.vllm.groups import GroupLayout
from kvstore.engines.vllm.metadata import NamingHandshake, StepMetadata, TransferPromMetrics, TransferStats
from kvstore.engines.vllm.scheduler import SchedulerSide
from kvstore.engines.vllm.worker import WorkerSide
from kvstore.errors import InvalidArgument

log = logging.getLogger("vllm.kvstore.connector")

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import PromMetric, PromMetricT
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


class KVStoreConnector(KVConnectorBase_V1, SupportsHMA):
    _cache_hit_source = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = self._kv_transfer_config
        model = vllm_config.model_config
        self.config = ConnectorConfig.from_extra(
            ktc.kv_connector_extra_config, _served_name(model.served_model_name) or model.model
        )
        groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
        self.block_size = groups[0].kv_cache_spec.block_size if groups else vllm_config.cache_config.block_size
        self.groups = GroupLayout.from_kv_cache_config(kv_cache_config) if len(groups) > 1 else None
        if self.groups is not None:
            _check_hybrid(self.config, self.groups)
        if self.config.block_names is BlockNames.VLLM:
            _check_vllm_names(self.groups, getattr(kv_cache_config, "hash_block_size", None), self.block_size)
        self.scheduler: SchedulerSide | None = None
        self.worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            # Every role loads what kvstore holds; producers (kv_producer, kv_both) also save.
            self.scheduler = SchedulerSide(
                self.config, self.block_size, load=True, save=ktc.is_kv_producer, groups=self.groups
            )
        else:
            shard = _shard(vllm_config, kv_cache_config)
            self.worker = WorkerSide(
                self.config,
                self.block_size,
                kv_cache_config.num_blocks,
                _layout_suffix(shard),
                groups=self.groups,
                shard=shard,
            )

    def _worker_side(self) -> WorkerSide:
        if self.worker is None:
            raise RuntimeError("kvstore connector: a worker-side call on the scheduler's connector")
        return self.worker

    def _scheduler_side(self) -> SchedulerSide:
        if self.scheduler is None:
            raise RuntimeError("kvstore connector: a scheduler-side call on a worker's connector")
        return self.scheduler

    # -- worker side -----------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker_side().register(kv_caches, self.config.model_id)

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return self.worker.handshake if self.worker is not None else None

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        idle = forward_context is None or getattr(forward_context, "attn_metadata", None) is None
        self._worker_side().start_loads(self._meta(), idle)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads finish before the forward (sync) or between steps (async)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        self._worker_side().save_layer(self._meta(), layer_name)

    def wait_for_save(self) -> None:
        self._worker_side().end_step(self._meta())

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(kv_connector_metadata, StepMetadata) and kv_connector_metadata.preempted:
            self._worker_side().drain_saves()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._worker_side().finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        results = super().get_transfer_results(finished_req_ids)
        results.failed_recving = self._worker_side().failed_loads()
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker_side().load_errors()

    def get_kv_connector_stats(self) -> TransferStats | None:
        """This side's counters since the last call; vLLM sums the scheduler's and the workers'."""
        side = self.worker if self.worker is not None else self.scheduler
        return side.take_interval_stats() if side is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> TransferStats:
        return TransferStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> TransferPromMetrics:
        return TransferPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        for side in (self.worker, self.scheduler):
            if side is not None:
                side.close()

    def _meta(self) -> StepMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, StepMetadata)
        return meta

    # -- scheduler side --------------------------------------------------------------------------

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        self._scheduler_side().set_naming({r: m for r, m in metadata.items() if isinstance(m, NamingHandshake)})

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._scheduler_side().num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            ids = blocks.get_block_ids()
            self._scheduler_side().after_alloc(request, ids if self.groups is not None else ids[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        manager = self._kv_cache_manager

        def block_ids_of(req_id: str) -> tuple[list[int], ...] | list[int]:
            if manager is None:  # vLLM's scheduler binds its cache manager before the first step
                raise RuntimeError("kvstore connector: no KV cache manager bound")
            ids = manager.get_block_ids(req_id)
            return ids if self.groups is not None else ids[0]

        return self._scheduler_side().build_meta(scheduler_output, block_ids_of)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._scheduler_side().load_errors(connector_output.invalid_block_ids or set())
        self._scheduler_side().failed_loads(connector_output.failed_recving or set())

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler_side().finished(request)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler_side().finished(request)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped save is a later cache miss, never a lost request

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        granularity: object = extra_config.get("granularity", "layer")
        return granularity == "layer"


def _check_hybrid(config: ConnectorConfig, groups: GroupLayout) -> None:
    if not config.load_async:
        raise InvalidArgument(
            "kvstore connector: a model with several KV cache groups needs load_async=true "
            "(vLLM recovers from a failed load of such a model only for asynchronous loads)"
        )
    if config.save_async:
        raise InvalidArgument(
            "kvstore connector: a model with several KV cache groups needs save_async=false "
            "(vLLM frees sliding-window blocks while a request runs, under an unfinished save)"
        )
    if config.granularity is Granularity.LAYER:
        log.info(
            "kvstore: %d KV cache groups (%s): each chunk of %d tokens is stored as one object "
            "holding all groups (granularity 'layer' applies to single-group models)",
            len(groups.groups),
            groups.tag,
            groups.chunk_tokens,
        )


def _check_vllm_names(groups: GroupLayout | None, hash_block_size: int | None, block_size: int) -> None:
    """block_names "vllm" names each block by vLLM's hash of exactly that block."""
    if groups is not None:
        raise InvalidArgument(
            "kvstore connector: block_names 'vllm' needs a model with one KV cache group "
            "(a hybrid model's chunks span several of vLLM's blocks)"
        )
    if hash_block_size not in (None, block_size):
        raise InvalidArgument(
            f"kvstore connector: block_names 'vllm' needs one vLLM block hash per block "
            f"(vLLM hashes every {hash_block_size} tokens, blocks hold {block_size})"
        )


def _served_name(name: Any) -> str:
    if isinstance(name, (list, tuple)):
        return name[0] if name else ""
    return name or ""


def _shard(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig | None) -> Shard:
    """This worker's tensor/pipeline shard, and how many TP ranks hold the same KV: vLLM's
    `kv_tp_replicas` (the whole TP group for an MLA model), so that they store it once."""
    par = vllm_config.parallel_config
    tp_rank = pp_rank = 0
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        tp_rank, pp_rank = get_tp_group().rank_in_group, get_pp_group().rank_in_group
    except (AssertionError, AttributeError, ImportError):
        pass
    replicas = int(getattr(kv_cache_config, "kv_tp_replicas", 1) or 1)
    if replicas < 1 or par.tensor_parallel_size % replicas:
        replicas = 1  # not a layout vLLM describes: store every rank's KV apart, as before
    return Shard(tp_rank, par.tensor_parallel_size, pp_rank, par.pipeline_parallel_size, replicas)


def _layout_suffix(shard: Shard) -> str:
    """What else decides the bytes of a block besides the tensor shapes: the device kind and vLLM
    version (the attention kernel's in-block layout), and this worker's shard."""
    import vllm
    from vllm.platforms import current_platform

    version = ".".join(vllm.__version__.split(".")[:2])
    return f"{current_platform.device_type}-vllm{version}-{shard.tag}"
