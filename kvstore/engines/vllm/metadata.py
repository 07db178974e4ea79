"""What the scheduler-side connector tells the workers each step, what a worker tells the scheduler
once at start-up, and the transfer counters vLLM aggregates and logs.

All of it crosses process boundaries (pickled by vLLM's executors): plain dataclasses only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from prometheus_client import Counter
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata, KVConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.v1.metrics.utils import create_metric_per_engine


@dataclass(frozen=True)
class BlockJob:
    """Blocks of one request to move: block_ids[i] holds the block whose chained hash is hashes[i].
    A hybrid model's job names chunks instead (groups.py): chunks[i] lists every KV cache group's
    blocks of chunk hashes[i], and block_ids is empty."""

    req_id: str
    hashes: tuple[bytes, ...]
    block_ids: tuple[int, ...]
    chunks: tuple[tuple[int, ...], ...] = ()

    def refs(self) -> tuple[tuple[int, ...], ...]:
        """What holds each hash: its chunk's block ids, or the one block (as a 1-tuple)."""
        return self.chunks or tuple((b,) for b in self.block_ids)

    def all_block_ids(self) -> set[int]:
        return {b for ref in self.refs() for b in ref}


@dataclass(frozen=True)
class LoadJob(BlockJob):
    asynchronous: bool = True  # finished via get_finished, else before this step's forward


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
    parts: list[int] | None  # per-block objects (codec.object_parts); None: one per block
    fingerprint: str
    block_nbytes: int


_HELP = {
    "loads": "KV loads from kvstore (one per request)",
    "load_blocks": "blocks loaded from kvstore",
    "load_bytes": "bytes loaded from kvstore",
    "load_failures": "loads that fell short; vLLM recomputed",
    "failed_blocks": "blocks that failed to load and were recomputed",
    "saves": "save batches to kvstore",
    "save_blocks": "blocks stored in kvstore",
    "save_bytes": "bytes stored in kvstore",
    "save_failures": "save batches that failed",
    "save_deduped": "blocks left out of a save: the same step or a save in flight already had them",
    "load_s": "seconds spent loading KV",
    "save_s": "seconds spent saving KV",
    # the scheduler side's: what a request was told to expect, and what it found
    "lookups": "kvstore lookups (how much of a prompt is stored)",
    "lookup_failures": "lookups kvstore did not answer; those requests were treated as uncached",
    "lookups_skipped": "lookups not made because kvstore failed moments before (lookup_backoff_s)",
    "recomputed_tokens": "prompt tokens recomputed because KV kvstore was to provide (promised by a "
    "prefill, or listed by a lookup) did not arrive",
    "unsaved_blocks": "blocks of finished PD prefills that kvstore did not hold (a save failed)",
}
_COUNTERS = (
    "loads",
    "load_blocks",
    "load_bytes",
    "load_failures",
    "failed_blocks",
    "saves",
    "save_blocks",
    "save_bytes",
    "save_failures",
    "save_deduped",
    "lookups",
    "lookup_failures",
    "lookups_skipped",
    "recomputed_tokens",
    "unsaved_blocks",
)
_SECONDS = ("load_s", "save_s")
# The store client's transfers travel as data keys "client|TRANSPORT|DAEMON|DIRECTION|FIELD".
_CLIENT, _CLIENT_KEY = "client", "|"
_CLIENT_HELP = {
    "calls": "store client transfer calls",
    "bytes": "bytes the store client moved",
    "seconds": "seconds the store client spent moving bytes",
}


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

    def add_client(self, key: tuple[str, str, str], calls: float, nbytes: float, seconds: float) -> None:
        """The store client's transfers on (transport, daemon, direction) in this interval."""
        for what, value in (("calls", calls), ("bytes", nbytes), ("seconds", seconds)):
            if value:
                name = _CLIENT_KEY.join((_CLIENT, *key, what))
                self.data[name] = self.data.get(name, 0) + value

    def reset(self) -> None:
        self.data = {}
        self.__post_init__()

    def aggregate(self, other: KVConnectorStats) -> TransferStats:
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

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        # vLLM hands its counter class (prometheus' Counter or a stand-in with its interface) under
        # Counter; its annotation widens that to any of Gauge, Counter and Histogram.
        counter = cast("type[Counter]", self._counter_cls)
        self.counters = {
            name: _per_engine(
                counter(name=f"vllm:kvstore_{name}", documentation=_HELP[name], labelnames=labelnames),
                per_engine_labelvalues,
            )
            for name in _COUNTERS + _SECONDS
        }
        # As kvstore's own client names them (kvstore_client_transfer_*), under vLLM's prefix.
        self.client = {
            field: counter(
                name=f"vllm:kvstore_client_transfer_{field}",
                documentation=doc,
                labelnames=[*labelnames, "transport", "daemon", "direction"],
            )
            for field, doc in _CLIENT_HELP.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, by_engine in self.counters.items():
            value = transfer_stats_data.get(name, 0)
            if value:
                by_engine[engine_idx].inc(value)
        for name, value in transfer_stats_data.items():
            if value and name.startswith(_CLIENT + _CLIENT_KEY):
                _, transport, daemon, direction, field = name.split(_CLIENT_KEY)
                self.client[field].labels(*self.per_engine_labelvalues[engine_idx], transport, daemon, direction).inc(
                    value
                )


def _per_engine(counter: Counter, per_engine_labelvalues: dict[int, list[object]]) -> dict[int, Counter]:
    """vLLM's create_metric_per_engine for a counter: its children (`counter.labels(...)`) are of
    the counter's class, which vLLM's annotation widens to any metric."""
    return cast("dict[int, Counter]", create_metric_per_engine(counter, per_engine_labelvalues))
