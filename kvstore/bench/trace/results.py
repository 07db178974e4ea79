"""What one capacity point of a trace replay measured, as frozen values (and their JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvstore.bench.trace.format import Request


@dataclass(frozen=True)
class Latency:
    calls: int
    p50_us: float
    p99_us: float
    mean_us: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        if not seconds:
            return cls(0, 0.0, 0.0, 0.0)
        us = np.asarray(seconds) * 1e6
        return cls(len(us), float(np.percentile(us, 50)), float(np.percentile(us, 99)), float(us.mean()))


@dataclass(frozen=True)
class HitRates:
    """Prompt tokens found in the cache over prompt tokens, for the store and the simulators."""

    store: float
    lru: float
    infinite: float

    @property
    def store_vs_lru(self) -> float:
        return self.store / self.lru if self.lru else float("nan")

    @property
    def store_vs_infinite(self) -> float:
        return self.store / self.infinite if self.infinite else float("nan")

    @property
    def lru_vs_infinite(self) -> float:
        return self.lru / self.infinite if self.infinite else float("nan")


@dataclass(frozen=True)
class Window:
    """One stretch of trace time: its requests' hit rates."""

    start_s: float
    end_s: float
    requests: int
    hit: HitRates


@dataclass(frozen=True)
class Throughput:
    """The replay's pace and where its time went (pacing sleep excluded from both shares)."""

    replay_s: float
    store_s: float  # inside the lookup, load and store calls
    own_s: float  # the replay's own work: keys, values, checks, bookkeeping
    stats_s: float  # the periodic stats() samples
    paced_sleep_s: float
    max_lag_s: float
    late_requests: int
    requests_per_s: float
    calls_per_s: float
    server_cpu_s: float | None  # metadata service + daemon, when the bench started them

    @property
    def store_share(self) -> float:
        busy = self.store_s + self.own_s + self.stats_s
        return self.store_s / busy if busy else 0.0

    @property
    def own_share(self) -> float:
        busy = self.store_s + self.own_s + self.stats_s
        return self.own_s / busy if busy else 0.0


@dataclass(frozen=True)
class PointResult:
    capacity_tokens: int  # as asked (--capacity), or the store's own with --meta
    capacity_blocks: int  # what the store holds, and what the LRU simulation is given
    capacity_bytes: int  # the store's DRAM
    requests: int
    prompt_tokens: int
    hit: HitRates
    lookup: Latency
    load: Latency
    store: Latency
    bytes_loaded: int
    bytes_stored: int
    evictions: int  # the store's, from its stats
    lru_evictions: int
    used_bytes: int  # at the end
    peak_used_bytes: int  # the most of the samples taken during the replay
    already_stored: int
    lost_between: int
    bad_loads: int
    failed_puts: int
    failed_loads: int
    first_error: str
    throughput: Throughput
    timeline: tuple[Window, ...]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["hit"].update(
            store_vs_lru=self.hit.store_vs_lru,
            store_vs_infinite=self.hit.store_vs_infinite,
            lru_vs_infinite=self.hit.lru_vs_infinite,
        )
        doc["throughput"].update(store_share=self.throughput.store_share, own_share=self.throughput.own_share)
        return doc


def rate(hit: Sequence[int], requests: Sequence[Request]) -> float:
    total = sum(r.input_length for r in requests)
    return sum(hit) / total if total else 0.0


def timeline(
    requests: Sequence[Request], store: Sequence[int], lru: Sequence[int], infinite: Sequence[int], windows: int = 24
) -> tuple[Window, ...]:
    """Hit rates over `windows` equal stretches of trace time (by timestamp; empty ones left out)."""
    if not requests:
        return ()
    first, last = requests[0].timestamp_ms, requests[-1].timestamp_ms
    span = max(1, last - first)
    edges: list[list[int]] = [[] for _ in range(windows)]
    for i, r in enumerate(requests):
        edges[min(windows - 1, (r.timestamp_ms - first) * windows // span)].append(i)
    out = []
    for w, idx in enumerate(edges):
        if not idx:
            continue
        part = [requests[i] for i in idx]
        hits = HitRates(*(rate([h[i] for i in idx], part) for h in (store, lru, infinite)))
        start = (first + span * w / windows) / 1000
        out.append(Window(start, (first + span * (w + 1) / windows) / 1000, len(idx), hits))
    return tuple(out)
