"""The pieces on their own, on injected clocks: the link monitor's averages and staleness, the
service's history (events, rates), exporting a client's metrics into a host registry, the router's
TTFT split and summary."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvstore.clock import FakeClock
from kvstore.engines.metrics import MetricsSink, RequestMetrics
from kvstore.engines.router.policy import CostModel
from kvstore.engines.router.telemetry import Telemetry
from kvstore.metrics.client import ClientMetrics, export
from kvstore.metrics.history import DaemonTraffic, History, parse_traffic
from kvstore.metrics.links import LinkConfig, LinkMonitor
from kvstore.results import DaemonStats, StoreStats, TierStats
from kvstore.types import Endpoint, SegmentInfo, Tier

MIB = 1 << 20


def test_link_bandwidth_and_latency_are_ewmas_of_real_transfers():
    clock = FakeClock()
    links = LinkMonitor("host-a", LinkConfig(alpha=0.5, stale_s=10), clock)
    links.record("d1", "tcp", 4096, 0.001)  # a latency sample
    links.record("d1", "tcp", 10 * MIB, 0.011)  # 10 MiB in 10 ms past the latency: ~1 GB/s
    (link,) = links.links()
    assert link.latency_s == pytest.approx(0.001)
    assert link.bandwidth_bytes_per_s == pytest.approx(10 * MIB / 0.010)
    links.record("d1", "tcp", 10 * MIB, 1.001)  # one slow transfer pulls it down at once
    slow = links.links()[0].bandwidth_bytes_per_s
    assert slow is not None and slow < 2 * (10 * MIB / 1.0)
    assert (link.transfers, links.links()[0].transfers) == (2, 3)
    clock.advance(11)
    assert links.links()[0].stale and links.links()[0].age_s == pytest.approx(11)
    links.record_failure("d2", "shm")
    assert [(x.daemon, x.transport, x.failures, x.bandwidth_bytes_per_s) for x in links.links()][1] == (
        "d2",
        "shm",
        1,
        None,
    )


def test_link_config_is_validated():
    with pytest.raises(ValueError):
        LinkConfig(alpha=0)
    with pytest.raises(ValueError):
        LinkConfig(stale_s=0)


def _stats(daemons: tuple[str, ...], evictions: int = 0, used: int = 0) -> StoreStats:
    dram = TierStats(Tier.DRAM, capacity=100, used=used, blocks=1, evictions=evictions)
    ds = tuple(
        DaemonStats(d, 0.0, (SegmentInfo(f"{d}-s", d, Tier.DRAM, 100, (Endpoint("metrics", f"http://{d}"),), "h"),))
        for d in daemons
    )
    return StoreStats(
        keys=1,
        pending=0,
        capacity=100,
        used=used,
        evictions=evictions,
        revoked_puts=0,
        leased=0,
        tiers=(dram,),
        daemons=ds,
    )


def test_history_notes_daemons_evictions_and_pressure_and_reads_daemon_traffic():
    clock = FakeClock()
    state = {"stats": _stats(("a",))}
    served = {"http://a/metrics": 'kvstore_daemon_transfer_bytes_total{transport="tcp",direction="out"} 100\n'}
    history = History(lambda: state["stats"], dict, 0.95, clock, fetch=lambda url: served[url])
    history.sample()
    clock.advance(2)
    state["stats"] = _stats(("b",), evictions=3, used=50)  # a left, b came, 3 evicted
    served["http://b/metrics"] = served.pop("http://a/metrics")
    history.sample()
    kinds = [(e.kind, e.detail, e.count) for e in history.events()]
    assert ("daemon_up", "b", 1) in kinds and ("daemon_down", "a", 1) in kinds
    assert ("eviction", "dram", 3) in kinds and ("eviction_pressure", "3 evicted", 1) in kinds
    clock.advance(2)
    state["stats"] = _stats(("b",), evictions=3, used=50)
    history.sample()  # pressure is noted once, not per sample
    assert [e.kind for e in history.events()].count("eviction_pressure") == 1
    assert history.samples()[-1].traffic["b"].bytes_out == 100


def test_parse_traffic_sums_transports():
    text = (
        'kvstore_daemon_transfer_bytes_total{transport="tcp",direction="in"} 5\n'
        'kvstore_daemon_transfer_bytes_total{transport="ucx",direction="in"} 7\n'
        'kvstore_daemon_transfer_requests_total{transport="tcp",direction="in"} 2\n'
    )
    assert parse_traffic(text) == DaemonTraffic(12.0, 0.0, 2.0)


def test_client_metrics_export_into_a_host_registry_by_side():
    host = CollectorRegistry()
    worker, scheduler = ClientMetrics(FakeClock()), ClientMetrics(FakeClock())
    worker.transferred("tcp", "d1", "get", 100, 0.01)
    scheduler.transferred("tcp", "d1", "get", 5, 0.01)
    export(worker, "worker", host)
    export(scheduler, "scheduler", host)
    export(worker, "worker", host)  # idempotent
    text = generate_latest(host).decode()
    assert (
        'kvstore_client_transfer_bytes_total{daemon="d1",direction="get",side="worker",transport="tcp"} 100.0' in text
    )
    assert 'side="scheduler"' in text and text.count("# HELP kvstore_client_transfer_bytes_total") == 1


def test_ttft_split_and_summary():
    sink = MetricsSink("router")
    for i in range(10):
        m = RequestMetrics(
            f"r{i}",
            "pd",
            queue_s=0.01,
            prefill_compute_s=0.1,
            kv_save_s=0.02,
            kv_load_s=0.03,
            recompute_s=0.005,
            ttft_s=0.2 + i / 100,
            tpot_s=0.01,
            fallback="miss" if i == 0 else None,
        )
        m.ttft_phases = m.split_ttft()
        sink.observe(m)
    phases = m.ttft_phases
    assert phases == {
        "queue": 0.01,
        "prefill": 0.1,
        "batch": 0.0,
        "kv_put": 0.02,
        "kv_get": 0.03,
        "first_step": 0.005,
        "other": pytest.approx(0.29 - 0.165),
    }
    summary = sink.summary()
    assert summary["requests"] == 10 and summary["fallback_rate"] == 0.1
    assert summary["ttft_p50_s"] == pytest.approx(0.24) and summary["ttft_p99_s"] == pytest.approx(0.29)
    text = sink.exposition().decode()
    assert 'kvstore_router_ttft_phase_seconds_count{phase="kv_get",route="pd"} 10.0' in text


def test_router_bandwidth_is_the_harmonic_mean_of_fresh_links():
    now = [0.0]
    telemetry = Telemetry(CostModel(window_s=60, default_bandwidth=123.0), clock=lambda: now[0])
    assert telemetry.bandwidth() == 123.0
    telemetry.record_links(
        [
            {"host": "h", "daemon": "a", "transport": "tcp", "bandwidth_bytes_per_s": 1e9},
            {"host": "h", "daemon": "b", "transport": "tcp", "bandwidth_bytes_per_s": 1e8},
            {"host": "h", "daemon": "c", "transport": "tcp", "bandwidth_bytes_per_s": 5.0, "stale": True},
        ]
    )
    assert telemetry.bandwidth() == pytest.approx(2 / (1 / 1e9 + 1 / 1e8))
    now[0] = 61.0
    assert telemetry.bandwidth() == 123.0 and telemetry.links() == {}


def _links(*figures: tuple[str, str, str, float]) -> list[dict[str, object]]:
    return [{"host": h, "daemon": d, "transport": t, "bandwidth_bytes_per_s": bw} for h, d, t, bw in figures]


def test_router_bandwidth_counts_a_daemon_by_its_fastest_transport():
    """A client reads a daemon over its best transport: a slow tcp figure beside fast shm to the
    same daemon is not the link a load takes."""
    telemetry = Telemetry(CostModel(window_s=60), clock=lambda: 0.0)
    telemetry.record_links(_links(("h", "a", "tcp", 1e8), ("h", "a", "shm", 1e10)))
    assert telemetry.bandwidth() == pytest.approx(1e10)


@pytest.mark.parametrize(
    "replicas,expected",
    [
        (1, 3 / (1 / 1e9 + 1 / 1e8 + 1 / 1e7)),  # each block on one daemon: the mean time per byte
        (2, 1 / ((2 / 1e9 + 1 / 1e8) / 3)),  # the best of 2 of 3: a, a, b by pairs (a,b) (a,c) (b,c)
        (3, 1e9),  # on every daemon: the fastest link
        (5, 1e9),  # more replicas than daemons: as many as there are daemons
    ],
)
def test_router_bandwidth_reads_each_block_from_its_fastest_replica(replicas, expected):
    """The transfer estimate follows KVClient's replica choice: a block with replicas is read over
    the fastest link among the daemons holding it (issue 29)."""
    telemetry = Telemetry(CostModel(window_s=60, kv_replicas=replicas), clock=lambda: 0.0)
    telemetry.record_links(_links(("h", "a", "tcp", 1e9), ("h", "b", "tcp", 1e8), ("h", "c", "tcp", 1e7)))
    assert telemetry.bandwidth() == pytest.approx(expected)


def test_router_bandwidth_averages_the_hosts_times():
    telemetry = Telemetry(CostModel(window_s=60, kv_replicas=2), clock=lambda: 0.0)
    telemetry.record_links(_links(("p", "a", "tcp", 1e9), ("p", "b", "tcp", 1e8), ("d", "a", "tcp", 1e8)))
    assert telemetry.bandwidth() == pytest.approx(2 / (1 / 1e9 + 1 / 1e8))  # p: the best of both; d: its only
