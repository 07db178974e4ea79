"""Counters and histograms for the hot path, cheaper than prometheus_client's own.

prometheus_client spends a few microseconds per labelled update (a lock per value, Python-level
method layers); the metadata service's Get and a client's get pay several updates per call, which
was about 10 % of a 4 KiB shm get. These keep one lock per label set, take it once per update of
all its values, and are turned into standard metric families only at scrape time (`families`).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric


class Timed:
    """One label set's histogram of seconds, with a count of bytes beside it. Thread safe."""

    __slots__ = ("_bounds", "_counts", "_lock", "bytes", "count", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound
        self._lock = threading.Lock()
        self.count = 0
        self.sum = 0.0
        self.bytes = 0

    def add(self, seconds: float, nbytes: int = 0) -> None:
        i = bisect_left(self._bounds, seconds)  # the first bucket whose upper bound (le) holds it
        with self._lock:
            self._counts[i] += 1
            self.count += 1
            self.sum += seconds
            self.bytes += nbytes

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, +Inf last, as exposition wants them."""
        with self._lock:
            counts = list(self._counts)
        out, running = [], 0
        for bound, n in zip(self._bounds, counts):
            running += n
            out.append((repr(float(bound)), float(running)))
        out.append(("+Inf", float(running + counts[-1])))
        return out


class Tally:
    """Counters keyed by label values, updated several at a time under one lock. Thread safe."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def add(self, *pairs: tuple[tuple[str, ...], float]) -> None:
        with self._lock:
            for key, n in pairs:
                if n:
                    self._counts[key] = self._counts.get(key, 0) + n

    def items(self) -> list[tuple[tuple[str, ...], float]]:
        with self._lock:
            return list(self._counts.items())


def histogram_family(name: str, doc: str, labels: Sequence[str], series: dict[tuple[str, ...], Timed]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for key, timed in list(series.items()):
        family.add_metric(list(key), timed.buckets(), sum_value=timed.sum)
    return family


def counter_family(
    name: str, doc: str, labels: Sequence[str], items: Iterator[tuple[tuple[str, ...], float]]
) -> Metric:
    """`name` without _total: the family adds it."""
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for key, value in items:
        family.add_metric(list(key), value)
    return family


class CallStats:
    """One RPC method's calls: a histogram of their times, errors by status, and what its answers
    said (keys hit, missed, busy; grants issued), all updated by one locked call. Thread safe."""

    __slots__ = ("_bounds", "_counts", "_lock", "busy", "count", "errors", "grants", "hit", "miss", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(self._bounds) + 1)
        self._lock = threading.Lock()
        self.count = 0
        self.sum = 0.0
        self.errors: dict[str, int] = {}
        self.hit = self.miss = self.busy = self.grants = 0

    def add(self, seconds: float, hit: int = 0, miss: int = 0, busy: int = 0, grants: int = 0) -> None:
        i = bisect_left(self._bounds, seconds)
        with self._lock:
            self._counts[i] += 1
            self.count += 1
            self.sum += seconds
            self.hit += hit
            self.miss += miss
            self.busy += busy
            self.grants += grants

    def error(self, seconds: float, status: str) -> None:
        i = bisect_left(self._bounds, seconds)
        with self._lock:
            self._counts[i] += 1
            self.count += 1
            self.sum += seconds
            self.errors[status] = self.errors.get(status, 0) + 1

    def statuses(self) -> dict[str, int]:
        """status -> calls ("OK" for those that answered)."""
        with self._lock:
            out = dict(self.errors)
            ok = self.count - sum(out.values())
        return {"OK": ok, **out} if ok else out

    def buckets(self) -> list[tuple[str, float]]:
        with self._lock:
            counts = list(self._counts)
        out, running = [], 0
        for bound, n in zip(self._bounds, counts):
            running += n
            out.append((repr(float(bound)), float(running)))
        out.append(("+Inf", float(running + counts[-1])))
        return out
