"""A storage daemon's metrics, served on its own HTTP port (`DaemonConfig.metrics_host`, `metrics_port`).

The transports report each request they serve (TransferObserver: bytes, requests and latency per
transport, direction and size class), the grant checker each refusal, the SSD tier its reads,
writes and journal lag (SsdIoObserver); segment capacity and connections are read at scrape time.
Transfers over shm and mooncake never reach the daemon (the client moves the bytes itself), so
they are counted by the client only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvstore.admin.http import AdminServer, Response
from kvstore.metrics.client import TRANSFER_SECONDS
from kvstore.metrics.fast import Tally, Timed, counter_family, histogram_family
from kvstore.storage.base import SegmentStorage
from kvstore.types import GrantMode

disable_created_metrics()  # type: ignore[no-untyped-call]  # a server process: *_created series only double the scrape
SIZE_CLASSES = ((64 << 10, "le_64KiB"), (1 << 20, "le_1MiB"), (16 << 20, "le_16MiB"))
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def size_class(nbytes: int) -> str:
    return next((name for limit, name in SIZE_CLASSES if nbytes <= limit), "gt_16MiB")


def _direction(mode: GrantMode) -> str:
    return "in" if mode is GrantMode.WRITE else "out"


class DaemonMetrics:
    """TransferObserver and SsdIoObserver of one daemon. Thread safe."""

    def __init__(
        self,
        daemon_id: str,
        segments: Callable[[], Sequence[SegmentStorage]],
        connections: Callable[[], dict[str, int]],
    ) -> None:
        self.daemon_id = daemon_id
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._transfers: dict[tuple[str, ...], Timed] = {}  # (transport, direction, size class) -> bytes, times
        self._untimed = Tally()  # (transport, direction) -> [requests, bytes] of transports that cannot time
        self._refusals = Counter(
            "kvstore_daemon_grant_refusals", "requests refused by the grant check", ["mode", "reason"], registry=r
        )
        self._ssd_bytes = Counter("kvstore_daemon_ssd_bytes", "bytes read from / written to SSD", ["op"], registry=r)
        self._ssd_seconds = Counter(
            "kvstore_daemon_ssd_io_seconds", "seconds spent in SSD reads / writes", ["op"], registry=r
        )
        self._journal_lag = Histogram(
            "kvstore_daemon_ssd_journal_lag_seconds",
            "time written SSD bytes waited for the journal record that makes them recoverable",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=r,
        )
        r.register(_SegmentCollector(daemon_id, segments, connections, self._transfer_families))

    # -- TransferObserver ------------------------------------------------------------------------

    def admit(self, transport: str, mode: GrantMode, nbytes: int) -> None:
        pass

    def transferred(self, transport: str, mode: GrantMode, nbytes: int, seconds: float | None) -> None:
        direction = _direction(mode)
        if seconds is None:
            self._untimed.add(((transport, direction, "requests"), 1), ((transport, direction, "bytes"), nbytes))
            return
        key = (transport, direction, size_class(nbytes))
        timed = self._transfers.get(key)
        if timed is None:
            timed = self._transfers.setdefault(key, Timed(TRANSFER_SECONDS))
        timed.add(seconds, nbytes)

    def _transfer_families(self) -> Iterator[Metric]:
        requests: dict[tuple[str, ...], float] = {}
        moved: dict[tuple[str, ...], float] = {}
        series = dict(self._transfers)
        for (transport, direction, _), timed in series.items():
            requests[(transport, direction)] = requests.get((transport, direction), 0) + timed.count
            moved[(transport, direction)] = moved.get((transport, direction), 0) + timed.bytes
        for (transport, direction, what), n in self._untimed.items():
            into = requests if what == "requests" else moved
            into[(transport, direction)] = into.get((transport, direction), 0) + n
        labels = ["transport", "direction"]
        yield counter_family("kvstore_daemon_transfer_requests", "requests served", labels, iter(requests.items()))
        yield counter_family(
            "kvstore_daemon_transfer_bytes", "payload bytes moved (in: written)", labels, iter(moved.items())
        )
        yield histogram_family(
            "kvstore_daemon_transfer_duration_seconds",
            "time moving one request's payload",
            [*labels, "size_class"],
            series,
        )

    def refused(self, mode: GrantMode, reason: str) -> None:
        self._refusals.labels(mode.name.lower(), reason).inc()

    # -- SsdIoObserver ---------------------------------------------------------------------------

    def io(self, op: str, nbytes: int, seconds: float) -> None:
        self._ssd_bytes.labels(op).inc(nbytes)
        self._ssd_seconds.labels(op).inc(seconds)

    def journal_lag(self, seconds: float) -> None:
        self._journal_lag.observe(seconds)

    # -- HTTP ------------------------------------------------------------------------------------

    def mount(self, admin: AdminServer) -> None:
        admin.route(
            "GET", "/metrics", lambda query, body: Response(200, PROMETHEUS_TEXT, generate_latest(self.registry))
        )


class _SegmentCollector(Collector):
    def __init__(
        self,
        daemon_id: str,
        segments: Callable[[], Sequence[SegmentStorage]],
        connections: Callable[[], dict[str, int]],
        transfers: Callable[[], Iterator[Metric]],
    ) -> None:
        self._daemon_id = daemon_id
        self._segments = segments
        self._connections = connections
        self._transfers = transfers

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._transfers()
        info = GaugeMetricFamily("kvstore_daemon_info", "this daemon (always 1)", labels=["daemon"])
        info.add_metric([self._daemon_id], 1)
        yield info
        capacity = GaugeMetricFamily(
            "kvstore_daemon_segment_capacity_bytes", "bytes a segment offers", labels=["segment", "tier"]
        )
        for seg in self._segments():
            capacity.add_metric([seg.segment_id, seg.tier.value], seg.capacity)
        yield capacity
        conns = GaugeMetricFamily("kvstore_daemon_connections", "data-plane connections open", labels=["transport"])
        for transport, n in self._connections().items():
            conns.add_metric([transport], n)
        yield conns
