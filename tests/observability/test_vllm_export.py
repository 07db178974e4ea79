"""The vLLM connector's path for the store client's metrics across vLLM's processes: the worker
folds its client's transfers into the interval's TransferStats, vLLM aggregates them, and
TransferPromMetrics puts them on vLLM's /metrics with transport, daemon and direction."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvstore.clock import FakeClock
from kvstore.engines.vllm.metadata import TransferPromMetrics, TransferStats
from kvstore.metrics.client import ClientMetrics


def test_client_transfers_reach_vllms_metrics():
    client = ClientMetrics(FakeClock())
    client.transferred("tcp", "d1", "get", 1000, 0.5)
    client.transferred("tcp", "d1", "get", 500, 0.25)
    seen: dict[tuple[str, str, str], tuple[int, int, float]] = {}
    interval = TransferStats()
    interval.add(loads=1)
    for key, now in client.totals().items():  # what WorkerSide._fold_client_totals does
        before = seen.get(key, (0, 0, 0.0))
        seen[key] = now
        interval.add_client(key, *(a - b for a, b in zip(now, before)))
    other_worker = TransferStats()
    other_worker.add_client(("tcp", "d1", "get"), 1, 100, 0.1)
    merged = interval.aggregate(other_worker)  # vLLM sums the workers' stats

    registry = CollectorRegistry()
    types = {
        Counter: partial(Counter, registry=registry),
        Gauge: partial(Gauge, registry=registry),
        Histogram: partial(Histogram, registry=registry),
    }
    # vLLM hands its own metric classes' factories (typed as classes); partials stand in here.
    prom = TransferPromMetrics(
        SimpleNamespace(kv_transfer_config=None),
        types,  # type: ignore[arg-type]
        ["model_name", "engine"],
        {0: ["tiny", "0"]},
    )
    prom.observe(merged.data, 0)
    text = generate_latest(registry).decode()
    labels = 'daemon="d1",direction="get",engine="0",model_name="tiny",transport="tcp"'
    assert f"vllm:kvstore_client_transfer_bytes_total{{{labels}}} 1600.0" in text
    assert f"vllm:kvstore_client_transfer_calls_total{{{labels}}} 3.0" in text
    assert f"vllm:kvstore_client_transfer_seconds_total{{{labels}}} 0.85" in text
    assert 'vllm:kvstore_loads_total{engine="0",model_name="tiny"} 1.0' in text
