"""Replica choice follows the measured links: a key's replicas are read over the link the client's
link monitor expects to be fastest for its bytes, the others behind it in order; a link whose last
call failed goes last, a link not measured yet is tried first (that read measures it), and links
of about the same speed keep the service's order. On an injected clock, through Transports.rank."""

from __future__ import annotations

import math

import pytest

from kvstore.client.transports import Transports
from kvstore.clock import FakeClock
from kvstore.config import ClientConfig
from kvstore.metrics.client import ClientMetrics
from kvstore.metrics.links import LinkConfig, LinkMonitor
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo, Tier

MIB = 1 << 20


def _segment(n: int) -> SegmentInfo:
    return SegmentInfo(f"seg-{n}", f"daemon-{n}", Tier.DRAM, 1 << 30, (Endpoint("tcp", f"10.0.0.{n}:7000"),))


def _grant(n: int, length: int) -> Grant:
    return Grant(f"seg-{n}", 0, length, GrantMode.READ, 0, b"")


def _order(transports: Transports, length: int, replicas: int = 3) -> list[str]:
    segments = {f"seg-{n}": _segment(n) for n in range(replicas)}
    ranked = transports.rank([_grant(n, length) for n in range(replicas)], segments, {})
    return [seg.daemon_id for seg, _ in ranked]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def transports(clock: FakeClock):
    config = ClientConfig(transports=("tcp",))
    made = Transports(config, clock, ClientMetrics(clock, LinkConfig(stale_s=30)))
    yield made
    made.close()


def _links(transports: Transports) -> LinkMonitor:
    assert transports._metrics is not None
    return transports._metrics.links


def _measure(links: LinkMonitor, daemon: str, bytes_per_s: float, latency_s: float = 1e-4) -> None:
    links.record(daemon, "tcp", 4096, latency_s)
    links.record(daemon, "tcp", 8 * MIB, latency_s + 8 * MIB / bytes_per_s)


def test_unmeasured_links_keep_the_services_order(transports):
    assert _order(transports, MIB) == ["daemon-0", "daemon-1", "daemon-2"]


def test_the_fastest_measured_link_is_read_first_and_the_rest_follow_in_speed_order(transports):
    links = _links(transports)
    _measure(links, "daemon-0", 100e6)  # an 800 Mbit link
    _measure(links, "daemon-1", 10e9)
    _measure(links, "daemon-2", 1e9)
    assert _order(transports, MIB) == ["daemon-1", "daemon-2", "daemon-0"]


def test_links_of_about_the_same_speed_keep_the_services_order(transports):
    links = _links(transports)
    _measure(links, "daemon-0", 1.0e9)
    _measure(links, "daemon-1", 1.1e9)
    _measure(links, "daemon-2", 0.95e9)
    assert _order(transports, 8 * MIB) == ["daemon-0", "daemon-1", "daemon-2"]


def test_an_unmeasured_link_is_tried_first_and_then_ranked_by_what_that_read_measured(transports):
    links = _links(transports)
    _measure(links, "daemon-0", 100e6)
    _measure(links, "daemon-1", 1e9)
    assert _order(transports, MIB) == ["daemon-2", "daemon-1", "daemon-0"]
    _measure(links, "daemon-2", 200e6)
    assert _order(transports, MIB) == ["daemon-1", "daemon-2", "daemon-0"]


def test_a_link_whose_last_call_failed_goes_last_until_it_works_again_or_the_failure_is_stale(transports, clock):
    links = _links(transports)
    for n in range(3):
        _measure(links, f"daemon-{n}", 1e9)
    links.record_failure("daemon-0", "tcp")
    assert links.estimate("daemon-0", "tcp", MIB) == math.inf
    assert _order(transports, MIB) == ["daemon-1", "daemon-2", "daemon-0"]
    links.record_latency("daemon-0", "tcp", 1e-4)  # a probe answered
    assert _order(transports, MIB) == ["daemon-0", "daemon-1", "daemon-2"]
    links.record_failure("daemon-0", "tcp")
    clock.advance(31)  # every sample is stale now: back to the service's order
    assert links.estimate("daemon-0", "tcp", MIB) is None
    assert _order(transports, MIB) == ["daemon-0", "daemon-1", "daemon-2"]


def test_small_reads_are_ranked_by_latency(transports):
    links = _links(transports)
    _measure(links, "daemon-0", 10e9, latency_s=5e-3)
    _measure(links, "daemon-1", 1e9, latency_s=1e-4)
    assert _order(transports, 4096, replicas=2) == ["daemon-1", "daemon-0"]
    assert _order(transports, 64 * MIB, replicas=2) == ["daemon-0", "daemon-1"]


def test_without_metrics_the_services_order_stands(clock):
    made = Transports(ClientConfig(transports=("tcp",), metrics=False), clock)
    try:
        assert _order(made, MIB) == ["daemon-0", "daemon-1", "daemon-2"]
    finally:
        made.close()
