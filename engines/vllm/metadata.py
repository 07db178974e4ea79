"""What the scheduler-side connector tells the workers each step, what a worker tells the scheduler
once at start-up, and the transfer counters vLLM aggregates and logs.

All of it crosses process boundaries (pickled by vLLM's executors): plain dataclasses only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorHandshakeMetadata,
                                                                KVConnectorMetadata)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.v1.metrics.utils import create_metric_per_engine


@dataclass(frozen=True)
class BlockJob:
    """Blocks of one request to move: block_ids[i] holds the block whose chained hash is hashes[i]."""

    req_id: str
    hashes: tuple[bytes, ...]
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class LoadJob(BlockJob):
    asynchronous: bool = True       # finished via get_finished, else before this step's forward


@dataclass
class StepMetadata(KVConnectorMetadata):
    loads: list[LoadJob] = field(default_factory=list)
    saves: list[BlockJob] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)


@dataclass
class NamingHandshake(KVConnectorHandshakeMetadata):
    """A worker's naming of its blocks, read from its KV cache tensors at registration; the
    scheduler builds its lookup keys from rank 0's."""

    model: str
    layout: str
    block_size: int
    tenant: str
    seed: int
    parts: list[int] | None         # per-block objects (codec.object_parts); None: one per block
    fingerprint: str
    block_nbytes: int


_HELP = {"loads": "KV loads from kvstore (one per request)", "load_blocks": "blocks loaded from kvstore",
         "load_bytes": "bytes loaded from kvstore", "load_failures": "loads that fell short; vLLM recomputed",
         "failed_blocks": "blocks that failed to load and were recomputed", "saves": "save batches to kvstore",
         "save_blocks": "blocks stored in kvstore", "save_bytes": "bytes stored in kvstore",
         "save_failures": "save batches that failed", "load_s": "seconds spent loading KV",
         "save_s": "seconds spent saving KV"}
_COUNTERS = ("loads", "load_blocks", "load_bytes", "load_failures", "failed_blocks", "saves",
             "save_blocks", "save_bytes", "save_failures")
_SECONDS = ("load_s", "save_s")


@dataclass
class TransferStats(KVConnectorStats):
    """Counters since the last report (vLLM sums them across workers and logs them as
    `KV Transfer metrics: ...`). `data` maps each counter to a number."""

    def __post_init__(self) -> None:
        for name in _COUNTERS + _SECONDS:
            self.data.setdefault(name, 0)

    def add(self, **values: float) -> None:
        for name, value in values.items():
            self.data[name] += value

    def reset(self) -> None:
        self.data = {}
        self.__post_init__()

    def aggregate(self, other: KVConnectorStats) -> "TransferStats":
        out = TransferStats(data=dict(self.data))
        for name, value in other.data.items():
            out.data[name] = out.data.get(name, 0) + value
        return out

    def reduce(self) -> dict[str, int | float]:
        d = self.data
        out: dict[str, Any] = {name: int(d[name]) for name in _COUNTERS}
        for kind in ("load", "save"):
            secs = d[f"{kind}_s"]
            out[f"{kind}_s"] = round(secs, 4)
            out[f"{kind}_GBps"] = round(d[f"{kind}_bytes"] / secs / 1e9, 3) if secs else 0.0
        return out

    def is_empty(self) -> bool:
        return not any(self.data.get(name) for name in _COUNTERS)


class TransferPromMetrics(KVConnectorPromMetrics):
    """The same counters on vLLM's /metrics, as vllm:kvstore_<name>_total."""

    def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {
            name: create_metric_per_engine(
                self._counter_cls(name=f"vllm:kvstore_{name}", documentation=_HELP[name], labelnames=labelnames),
                per_engine_labelvalues)
            for name in _COUNTERS + _SECONDS}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, by_engine in self.counters.items():
            value = transfer_stats_data.get(name, 0)
            if value:
                by_engine[engine_idx].inc(value)
