"""Every metric family of the service, the daemon and the client, after a known workload against a
real `kvstore serve` (its admin and metrics ports on): counts are exact where the workload fixes
them, and the service's figures equal what `kvstore stat` says."""

from __future__ import annotations

import dataclasses
import time

import pytest
from prometheus_client import generate_latest

from kvstore.client import KVClient, PermissionDenied
from kvstore.config import ClientConfig
from kvstore.transport.base import Transfer
from kvstore.wire.calls import Get, PutRevoke, PutStart
from tests.cluster import wait_until
from tests.observability.scrape import Scrape, scrape, serve_observed

KIB = 1 << 10
N = 8
SIZE = 100 * KIB


@pytest.fixture(scope="module")
def workload():
    """One store, one client over tcp, one known workload; what the three faces report after it."""
    cluster, meta, admin, daemon_metrics = serve_observed("64MiB")
    try:
        with KVClient(meta, ClientConfig(transports=("tcp",))) as kv:
            keys = [f"obs/k{i}" for i in range(N)]
            values = [bytes([i]) * SIZE for i in range(N)]
            assert kv.put_many(keys, values) == [True] * N  # PutStart + one write + PutEnd
            assert kv.put_many(keys[:2], values[:2]) == [False, False]  # ALREADY_EXISTS: no write, no PutEnd
            assert kv.get_many(keys) == values  # 8 hits, one read of 800 KiB
            missing = kv.get_many_into(["obs/none1", "obs/none2"], [bytearray(1), bytearray(1)], strict=False)
            assert all(isinstance(m, Exception) for m in missing)  # 2 misses, nothing read
            assert kv.exists_many([*keys, "obs/none1", "obs/none2"]) == [True] * N + [False, False]
            assert kv.match_prefix([*keys[:5], "obs/none1", keys[5]]) == 5  # 5 hit, 2 not
            kv.remove(keys[7])
            assert kv.pin(keys[:2], 60) == [None, None]
            with pytest.raises(Exception, match="positive ttl"):
                kv.pin(keys[:1], 0)  # refused whole: INVALID_ARGUMENT
            reply = kv.meta.call(PutStart(["obs/revoked", "obs/huge"], [KIB, 1 << 40]))
            assert reply.results[1].code.name == "INVALID_ARGUMENT"  # a put refusal
            kv.meta.call(PutRevoke(["obs/revoked"]))  # a revoked put
            # A forged read grant: the daemon refuses it, the client counts the failure.
            good = kv.meta.call(Get([keys[0]])).results[0]
            segment = kv.meta.call(Get([keys[0]])).segments[good.grants[0].segment_id]
            forged = dataclasses.replace(good.grants[0], mac=bytes(len(good.grants[0].mac)))
            with pytest.raises(PermissionDenied):
                kv.transport("tcp").read(segment, [Transfer(forged, memoryview(bytearray(SIZE)))], time.monotonic() + 5)
            assert kv.metrics is not None  # metrics are on by default
            client_text = generate_latest(kv.metrics.registry).decode()
            links = kv.links()
            stats = kv.stats()
            yield Scrape(scrape(admin)), Scrape(scrape(daemon_metrics)), Scrape(client_text), stats, links
    finally:
        cluster.close()


def test_service_calls_by_method_and_status(workload):
    service = workload[0]
    calls = "kvstore_meta_calls_total"
    assert service.value(calls, method="PutStart", status="OK") == 3
    assert service.value(calls, method="PutEnd", status="OK") == 1
    assert service.value(calls, method="Get", status="OK") == 4
    assert service.value(calls, method="Exists", status="OK") == 1
    assert service.value(calls, method="MatchPrefix", status="OK") == 1
    assert service.value(calls, method="Remove", status="OK") == 1
    assert service.value(calls, method="PutRevoke", status="OK") == 1
    assert service.value(calls, method="Pin", status="OK") == 1
    assert service.value(calls, method="Pin", status="INVALID_ARGUMENT") == 1
    assert service.value("kvstore_meta_call_duration_seconds_count", method="Get") == 4
    assert service.value("kvstore_meta_call_duration_seconds_count", method="Pin") == 2
    assert service.value("kvstore_meta_call_duration_seconds_sum", method="Get") > 0


def test_service_hits_misses_and_grants(workload):
    service = workload[0]
    blocks = "kvstore_meta_lookup_blocks_total"
    assert service.value(blocks, call="get", result="hit") == N + 2  # get_many, then the forgery's two Gets
    assert service.value(blocks, call="get", result="miss") == 2
    assert service.value(blocks, call="exists", result="hit") == N
    assert service.value(blocks, call="exists", result="miss") == 2
    assert service.value(blocks, call="match_prefix", result="hit") == 5
    assert service.value(blocks, call="match_prefix", result="miss") == 2
    assert service.value("kvstore_meta_grants_issued_total", mode="write") == N + 1  # + obs/revoked
    assert service.value("kvstore_meta_grants_issued_total", mode="read") == N + 2
    assert service.value("kvstore_meta_put_refusals_total", code="INVALID_ARGUMENT") == 1


def test_service_tiers_and_state_match_kvstore_stat(workload):
    service, _, _, stats, _ = workload
    assert service.value("kvstore_meta_keys") == stats.keys == N - 1
    assert service.value("kvstore_meta_pins") == stats.pinned == 2
    assert service.value("kvstore_meta_read_leases") == stats.leased
    assert service.value("kvstore_meta_daemons") == len(stats.daemons) == 1
    assert service.value("kvstore_meta_revoked_puts_total") == stats.revoked_puts == 1
    assert service.value("kvstore_meta_evictions_total") == stats.evictions == 0
    assert service.value("kvstore_meta_pending_puts") == stats.pending == 0
    assert service.value("kvstore_meta_under_replicated_keys") == 0
    assert service.value("kvstore_meta_quarantined_bytes") == stats.quarantined_bytes
    (dram,) = stats.tiers
    assert service.value("kvstore_meta_tier_blocks", tier="dram") == dram.blocks == N - 1
    assert service.value("kvstore_meta_tier_hits_total", tier="dram") == dram.hits == N + 2
    assert service.value("kvstore_meta_tier_used_bytes", tier="dram") == dram.used
    assert service.value("kvstore_meta_tier_capacity_bytes", tier="dram") == dram.capacity == 64 << 20
    for name in ("evictions", "demotions", "promotions"):
        assert service.value(f"kvstore_meta_tier_{name}_total", tier="dram") == 0
    (daemon,) = stats.daemons
    assert service.value("kvstore_meta_daemon_capacity_bytes", daemon=daemon.daemon_id) == 64 << 20
    assert service.value("kvstore_meta_daemon_used_bytes", daemon=daemon.daemon_id) == dram.used


def test_daemon_transfers_refusals_and_segments(workload):
    _, daemon, _, stats, _ = workload
    requests, moved = "kvstore_daemon_transfer_requests_total", "kvstore_daemon_transfer_bytes_total"
    assert daemon.value(requests, transport="tcp", direction="in") == 1
    assert daemon.value(moved, transport="tcp", direction="in") == N * SIZE
    assert daemon.value(requests, transport="tcp", direction="out") == 1
    assert daemon.value(moved, transport="tcp", direction="out") == N * SIZE
    seconds = "kvstore_daemon_transfer_duration_seconds_count"
    assert daemon.value(seconds, transport="tcp", direction="in", size_class="le_1MiB") == 1
    assert daemon.value(seconds, transport="tcp", direction="out", size_class="le_1MiB") == 1
    assert daemon.value("kvstore_daemon_grant_refusals_total", mode="read", reason="invalid") == 1
    (d,) = stats.daemons
    assert daemon.value("kvstore_daemon_info", daemon=d.daemon_id) == 1
    (segment,) = d.segments
    assert daemon.value("kvstore_daemon_segment_capacity_bytes", segment=segment.segment_id, tier="dram") == 64 << 20
    assert daemon.value("kvstore_daemon_connections", transport="tcp") >= 0


def test_client_transfers_failures_and_links(workload):
    _, _, client, stats, links = workload
    daemon_id = stats.daemons[0].daemon_id
    moved = "kvstore_client_transfer_bytes_total"
    assert client.value(moved, transport="tcp", daemon=daemon_id, direction="put") == N * SIZE
    assert client.value(moved, transport="tcp", daemon=daemon_id, direction="get") == N * SIZE
    count = "kvstore_client_transfer_duration_seconds_count"
    assert client.value(count, transport="tcp", daemon=daemon_id, direction="put") == 1
    assert client.value(count, transport="tcp", daemon=daemon_id, direction="get") == 1
    assert (
        client.value(
            "kvstore_client_transfer_failures_total",
            transport="tcp",
            daemon=daemon_id,
            direction="get",
            error="PermissionDenied",
        )
        == 1
    )
    (link,) = links
    assert (link.daemon, link.transport, link.transfers, link.bytes, link.failures) == (
        daemon_id,
        "tcp",
        2,
        2 * N * SIZE,
        1,
    )
    assert link.bandwidth_bytes_per_s > 0 and not link.stale
    bandwidth = client.value(
        "kvstore_client_link_bandwidth_bytes_per_second", host=link.host, daemon=daemon_id, transport="tcp"
    )
    assert bandwidth == pytest.approx(link.bandwidth_bytes_per_s, rel=0.5)


@pytest.mark.slow
def test_evictions_demotions_promotions_and_ssd(tmp_path):
    """A DRAM tier too small for the workload, with an SSD below it: blocks are demoted (the
    daemon writes SSD and journals it) and read back from SSD; the figures equal stat's."""
    cluster, meta, admin, daemon_metrics = serve_observed("4MiB", "--ssd-dir", str(tmp_path / "ssd"), "--ssd", "64MiB")
    try:
        with KVClient(meta, ClientConfig(transports=("tcp",))) as kv:
            keys = [f"tier/k{i}" for i in range(32)]  # 8 MiB into 4 MiB of DRAM
            for key in keys:
                kv.put(key, key.encode() * (256 * KIB // len(key)))
            wait_until(lambda: sum(t.demotions for t in kv.stats().tiers) >= 16, what="demotions")
            for _ in range(2):  # reads served from SSD
                assert all(isinstance(n, int) for n in kv.get_many_into(keys, [bytearray(256 * KIB) for _ in keys]))
            stats = kv.stats()
        service, daemon = Scrape(scrape(admin)), Scrape(scrape(daemon_metrics))
        for t in stats.tiers:
            for name in ("demotions", "promotions", "evictions", "hits"):
                assert service.value(f"kvstore_meta_tier_{name}_total", tier=t.tier.value) == getattr(t, name)
        assert service.value("kvstore_meta_evictions_total") == stats.evictions
        assert daemon.value("kvstore_daemon_ssd_bytes_total", op="write") > 0
        assert daemon.value("kvstore_daemon_ssd_io_seconds_total", op="write") > 0
        assert daemon.value("kvstore_daemon_ssd_journal_lag_seconds_count") > 0
        assert daemon.value("kvstore_daemon_ssd_bytes_total", op="read") > 0  # the tcp reads of SSD blocks
    finally:
        cluster.close()
