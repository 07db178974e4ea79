"""A client's metrics: bytes, latency and failures of its transfers per transport and destination
daemon, and the link monitor they feed. Each KVClient has its own registry (`KVClient.metrics.
registry`), which an engine mounts on its own /metrics or folds into its host's registry."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvstore.clock import Clock
from kvstore.errors import KVStoreError
from kvstore.metrics.fast import Tally, Timed, counter_family, histogram_family
from kvstore.metrics.links import LinkConfig, LinkMonitor
from kvstore.transport.base import Transfer, Transport, Written
from kvstore.types import Grant, SegmentInfo

_R = TypeVar("_R")

TRANSFER_SECONDS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class _Links(Collector):
    """The link monitor's figures as gauges, read at scrape time."""

    def __init__(self, monitor: LinkMonitor) -> None:
        self._monitor = monitor

    def collect(self) -> list[GaugeMetricFamily]:
        labels = ["host", "daemon", "transport"]
        bandwidth = GaugeMetricFamily(
            "kvstore_client_link_bandwidth_bytes_per_second",
            "EWMA bandwidth of real transfers on the link (client host -> daemon, transport)",
            labels=labels,
        )
        latency = GaugeMetricFamily(
            "kvstore_client_link_latency_seconds",
            "EWMA latency of small transfers and probes on the link",
            labels=labels,
        )
        age = GaugeMetricFamily(
            "kvstore_client_link_age_seconds", "seconds since the link's last sample", labels=labels
        )
        for link in self._monitor.links():
            key = [link.host, link.daemon, link.transport]
            if link.bandwidth_bytes_per_s is not None:
                bandwidth.add_metric(key, link.bandwidth_bytes_per_s)
            if link.latency_s is not None:
                latency.add_metric(key, link.latency_s)
            age.add_metric(key, link.age_s)
        return [bandwidth, latency, age]


class ClientMetrics:
    """Thread safe."""

    def __init__(self, clock: Clock, links: LinkConfig | None = None, host: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.links = LinkMonitor(host, links, clock)
        self._transfers: dict[tuple[str, ...], Timed] = {}  # (transport, daemon, direction) -> bytes, times
        self._failures = Tally()  # (transport, daemon, direction, error) -> calls
        self.registry.register(_Transfers(self))
        self.registry.register(_Links(self.links))
        self.seen: dict[str, SegmentInfo] = {}  # daemon -> a segment of it this client moved bytes with

    def transferred(self, transport: str, daemon: str, direction: str, nbytes: int, seconds: float) -> None:
        """One successful transfer call (also a sample for the link monitor)."""
        key = (transport, daemon, direction)
        timed = self._transfers.get(key)
        if timed is None:
            timed = self._transfers.setdefault(key, Timed(TRANSFER_SECONDS))
        timed.add(seconds, nbytes)
        self.links.record(daemon, transport, nbytes, seconds)

    def failed(self, transport: str, daemon: str, direction: str, error: KVStoreError) -> None:
        self._failures.add(((transport, daemon, direction, type(error).__name__), 1))
        self.links.record_failure(daemon, transport)

    def wrap(self, transport: Transport) -> Transport:
        return MeteredTransport(transport, self)

    def totals(self) -> dict[tuple[str, str, str], tuple[int, int, float]]:
        """(transport, daemon, direction) -> (calls, bytes, seconds) so far: for a host that
        carries counters across processes itself (vLLM's connector stats)."""
        return {(k[0], k[1], k[2]): (t.count, t.bytes, t.sum) for k, t in list(self._transfers.items())}


class _Transfers(Collector):
    def __init__(self, metrics: ClientMetrics) -> None:
        self._m = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        labels = ["transport", "daemon", "direction"]
        series = dict(self._m._transfers)
        yield counter_family(
            "kvstore_client_transfer_bytes",
            "bytes moved to (put) or from (get) daemons",
            labels,
            ((k, float(t.bytes)) for k, t in series.items()),
        )
        yield histogram_family(
            "kvstore_client_transfer_duration_seconds",
            "time of one transfer call (one or more blocks of one segment)",
            labels,
            series,
        )
        yield counter_family(
            "kvstore_client_transfer_failures",
            "transfer calls that failed, by error type",
            [*labels, "error"],
            iter(self._m._failures.items()),
        )


class MeteredTransport(Transport):
    """A transport whose every call is timed and counted in ClientMetrics."""

    def __init__(self, inner: Transport, metrics: ClientMetrics) -> None:
        super().__init__(inner.config, inner.clock)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]  # the wrapped transport's name, per instance
        self._metrics = metrics

    def can_reach(self, segment: SegmentInfo) -> bool:
        return self.inner.can_reach(segment)

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> Written:
        nbytes = sum(t.grant.length for t in transfers)
        return self._metered(segment, "put", nbytes, lambda: self.inner.write(segment, transfers, deadline))

    def write_pieces(
        self, segment: SegmentInfo, grant: Grant, pieces: Sequence[tuple[int, memoryview]], deadline: float
    ) -> Written:
        nbytes = sum(b.nbytes for _, b in pieces)
        return self._metered(segment, "put", nbytes, lambda: self.inner.write_pieces(segment, grant, pieces, deadline))

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int] | None:
        nbytes = sum(t.grant.length for t in transfers)
        return self._metered(segment, "get", nbytes, lambda: self.inner.read(segment, transfers, deadline))

    def _metered(self, segment: SegmentInfo, direction: str, nbytes: int, move: Callable[[], _R]) -> _R:
        """move(), timed and counted (or its failure counted) against the segment's daemon."""
        begun = time.perf_counter()
        try:
            done = move()
        except KVStoreError as exc:
            self._metrics.failed(self.name, segment.daemon_id, direction, exc)
            raise
        self._metrics.seen[segment.daemon_id] = segment
        self._metrics.transferred(self.name, segment.daemon_id, direction, nbytes, time.perf_counter() - begun)
        return done

    def forget(self, segment_id: str) -> None:
        self.inner.forget(segment_id)

    def close(self) -> None:
        self.inner.close()


def tcp_probe_targets(
    metrics: ClientMetrics, tcp: Callable[[], Transport], timeout_s: float
) -> Callable[[], list[tuple[str, str, Callable[[], float]]]]:
    """LinkProbe targets: every daemon this client has moved bytes with that serves tcp, pinged
    with an empty tcp request (its daemon checks no grant and moves no byte)."""

    def targets() -> list[tuple[str, str, Callable[[], float]]]:
        found: list[tuple[str, str, Callable[[], float]]] = []
        for daemon, segment in list(metrics.seen.items()):
            transport = tcp()
            inner = transport.inner if isinstance(transport, MeteredTransport) else transport
            ping = getattr(inner, "ping", None)
            if segment.endpoint("tcp") is not None and ping is not None:
                found.append((daemon, "tcp", partial(_ping, ping, segment, timeout_s)))
        return found

    return targets


def _ping(ping: Callable[[SegmentInfo, float], float], segment: SegmentInfo, timeout_s: float) -> float:
    return ping(segment, time.monotonic() + timeout_s)


class _Exported(Collector):
    """Every exported client's families, each sample labelled with its client's `side`, merged by
    family name so that several clients in one process never register the same name twice."""

    def __init__(self) -> None:
        self.clients: dict[str, CollectorRegistry] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for side, registry in list(self.clients.items()):
            for family in registry.collect():
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for s in family.samples:
                    out.samples.append(s._replace(labels={**s.labels, "side": side}))
        yield from merged.values()


_EXPORTED: dict[int, _Exported] = {}


def export(metrics: ClientMetrics, side: str, into: CollectorRegistry | None = None) -> None:
    """Serve this client's metrics from `into` (prometheus_client's default REGISTRY, which an
    engine such as vLLM serves at its own /metrics), labelled side=`side`. Idempotent per side."""
    from prometheus_client import REGISTRY

    target = REGISTRY if into is None else into
    exported = _EXPORTED.get(id(target))
    if exported is None:
        exported = _EXPORTED[id(target)] = _Exported()
        target.register(exported)
    exported.clients[side] = metrics.registry
