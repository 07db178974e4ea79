"""The metadata service's metrics.

Two sources. Every call through MetaHandlers (gRPC and fast lane alike) is counted by method and
status and timed, and the answers of the lookups and puts are read for hits, misses and grants
(`wrap`, applied by MetaHandlers.handler). What the store holds (keys, bytes and blocks per tier,
evictions, demotions, promotions, revoked puts, leases, pins, daemons) is read from
MetaStore.stats() at scrape time (`_StoreCollector`), so the store keeps one set of counters and
the two faces (`kvstore stat` and /metrics) cannot disagree. A standby has no store: its scrape
has the call families only (its leader's has the rest).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvstore.errors import ErrorCode, KVStoreError
from kvstore.metrics.fast import CallStats, Tally, counter_family
from kvstore.results import StoreStats
from kvstore.wire import packed

disable_created_metrics()  # type: ignore[no-untyped-call]  # a server process: *_created series only double the scrape
Handler = Callable[..., Any]  # a MetaHandlers method: (request, caller) -> response
CALL_SECONDS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_OK, _NOT_FOUND, _BUSY, _EXISTS = (
    int(c) for c in (ErrorCode.OK, ErrorCode.KEY_NOT_FOUND, ErrorCode.KEY_BUSY, ErrorCode.ALREADY_EXISTS)
)


_LOOKUP_CALLS = {"Get": "get", "Exists": "exists", "MatchPrefix": "match_prefix"}
_GRANT_MODES = {"Get": "read", "PutStart": "write"}
Counts = tuple[int, int, int, int]  # keys hit, missed, busy; grants issued


class ServiceMetrics:
    """Thread safe. `stats` is the store's statistics call (read at every scrape; None: no store)."""

    def __init__(self, stats: Callable[[], StoreStats | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._methods: dict[str, CallStats] = {}
        self._refused = Tally()  # (code,) -> keys a PutStart refused
        self.registry.register(_CallCollector(self))
        self.registry.register(_StoreCollector(stats))
        self._readers: dict[str, Callable[[Any, Any], Counts]] = {
            "Get": _read_get,
            "Exists": _read_exists,
            "MatchPrefix": _read_match,
            "PutStart": self._read_put_start,
        }

    def lookups(self) -> dict[tuple[str, str], float]:
        """(call, result) -> keys so far (for the dashboard)."""
        out: dict[tuple[str, str], float] = {}
        for method, call in _LOOKUP_CALLS.items():
            stats = self._methods.get(method)
            if stats is not None:
                out.update({(call, "hit"): stats.hit, (call, "miss"): stats.miss})
                if method == "Get":
                    out[(call, "busy")] = stats.busy
        return out

    def wrap(self, name: str, method: Handler) -> Handler:
        """`method` (the handler of RPC `name`), counted and timed: two clock reads and one locked
        update a call (what a lookup's or a put's answer says included). Arguments after the
        request pass through untouched."""
        stats = self._methods.setdefault(name, CallStats(CALL_SECONDS))
        read = self._readers.get(name)

        def call(request: Any, *rest: Any) -> Any:
            begun = time.perf_counter()
            try:
                response = method(request, *rest)
            except KVStoreError as exc:
                stats.error(time.perf_counter() - begun, exc.code.name)
                raise
            except Exception:
                stats.error(time.perf_counter() - begun, "INTERNAL")
                raise
            if read is None:
                stats.add(time.perf_counter() - begun)
            else:
                stats.add(time.perf_counter() - begun, *read(request, response))
            return response

        return call

    def _read_put_start(self, request: Any, response: Any) -> Counts:
        grants = 0
        for result in response.results:
            code = result.status.code
            if code == _OK:
                grants += len(result.replicas)
            elif code != _EXISTS:
                self._refused.add(((ErrorCode(code).name,), 1))
        return 0, 0, 0, grants


def _read_get(request: Any, response: Any) -> Counts:
    hits = misses = busy = grants = 0
    if response.HasField("packed"):  # the results as rows or columns (kvstore.wire.packed)
        codes, replicas = packed.counts(response.packed)
        hits, busy = codes.count(_OK), codes.count(_BUSY)
        grants = sum(n for code, n in zip(codes, replicas) if code == _OK)
        return hits, len(codes) - hits - busy, busy, grants
    for result in response.results:
        code = result.status.code
        if code == _OK:
            hits += 1
            grants += len(result.replicas)
        elif code == _BUSY:
            busy += 1
        else:
            misses += 1
    return hits, misses, busy, grants


def _read_exists(request: Any, response: Any) -> Counts:
    hits = sum(response.exists)
    return hits, len(response.exists) - hits, 0, 0


def _read_match(request: Any, response: Any) -> Counts:
    hits = response.count
    return hits, len(request.keys) - hits, 0, 0


class _CallCollector(Collector):
    def __init__(self, metrics: ServiceMetrics) -> None:
        self._m = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        methods = dict(self._m._methods)
        yield counter_family(
            "kvstore_meta_calls",
            "calls by method and status",
            ["method", "status"],
            (((name, status), n) for name, s in methods.items() for status, n in s.statuses().items()),
        )
        latency = HistogramMetricFamily(
            "kvstore_meta_call_duration_seconds", "time to answer a call", labels=["method"]
        )
        for name, s in methods.items():
            latency.add_metric([name], s.buckets(), sum_value=s.sum)
        yield latency
        lookups = []
        for name, call in _LOOKUP_CALLS.items():
            if (found := methods.get(name)) is not None:
                lookups += [((call, "hit"), found.hit), ((call, "miss"), found.miss)]
                if name == "Get":
                    lookups.append(((call, "busy"), found.busy))
        yield counter_family(
            "kvstore_meta_lookup_blocks",
            "keys looked up by Get, Exists and MatchPrefix, by result (hit, miss; busy: being written)",
            ["call", "result"],
            iter(lookups),
        )
        yield counter_family(
            "kvstore_meta_grants_issued",
            "grants handed out",
            ["mode"],
            (((mode,), methods[name].grants) for name, mode in _GRANT_MODES.items() if name in methods),
        )
        yield counter_family(
            "kvstore_meta_put_refusals",
            "keys a PutStart gave no grant, by code",
            ["code"],
            iter(self._m._refused.items()),
        )


class _StoreCollector(Collector):
    def __init__(self, stats: Callable[[], StoreStats | None]) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        return []  # families are read at scrape time: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        if s is None:  # a standby: zeros here would read as an empty store
            return

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"kvstore_meta_{name}", doc, value=value)

        yield gauge("keys", "complete keys stored", s.keys)
        yield gauge("pending_puts", "puts started and not yet ended", s.pending)
        yield gauge("read_leases", "read leases held", s.leased)
        yield gauge("pins", "keys pinned", s.pinned)
        yield gauge("daemons", "daemons alive (mounted and heartbeating)", len(s.daemons))
        yield gauge("under_replicated_keys", "keys with fewer replicas than they were put with", s.under_replicated)
        yield gauge(
            "durability_unchecked",
            "1 while Redis cannot keep the configured durability (the service runs with durability_unchecked)",
            float(s.durability_unchecked),
        )
        yield gauge(
            "quarantined_bytes", "freed bytes waiting until no grant or reader can touch them", s.quarantined_bytes
        )
        yield CounterMetricFamily("kvstore_meta_revoked_puts", "puts revoked (asked, or expired)", value=s.revoked_puts)
        yield CounterMetricFamily("kvstore_meta_evictions", "blocks deleted to make room, all tiers", value=s.evictions)
        per_tier = {
            "capacity_bytes": (GaugeMetricFamily, "bytes offered", "capacity"),
            "used_bytes": (GaugeMetricFamily, "bytes allocated", "used"),
            "blocks": (GaugeMetricFamily, "block replicas held", "blocks"),
            "hits": (CounterMetricFamily, "reads granted from replicas in the tier", "hits"),
            "evictions": (CounterMetricFamily, "blocks deleted from the tier to make room", "evictions"),
            "demotions": (CounterMetricFamily, "blocks moved down into the tier", "demotions"),
            "promotions": (CounterMetricFamily, "blocks moved up into the tier", "promotions"),
        }
        for name, (kind, doc, attr) in per_tier.items():
            family = kind(f"kvstore_meta_tier_{name}", doc, labels=["tier"])
            for t in s.tiers:
                family.add_metric([t.tier.value], getattr(t, attr))
            yield family
        capacity = GaugeMetricFamily("kvstore_meta_daemon_capacity_bytes", "bytes a daemon offers", labels=["daemon"])
        used = GaugeMetricFamily("kvstore_meta_daemon_used_bytes", "bytes allocated on a daemon", labels=["daemon"])
        for d in s.daemons:
            capacity.add_metric([d.daemon_id], sum(seg.capacity for seg in d.segments))
            used.add_metric([d.daemon_id], d.used)
        yield capacity
        yield used
