"""The metadata service looking at itself over time: samples of its statistics every few seconds,
from which the dashboard reads rates and recent activity, and the structured events an operator
wants in the log (daemon up and down, eviction pressure).

A sample also reads each daemon's /metrics (the `metrics` endpoint it advertises with its
segments) for its transfer bytes, and each registered router's /router/state for TTFT, TPOT and
fallbacks: what the service itself never sees. Those reads are bounded by a short timeout and a
failure leaves the figure out; the service's own work is never waited on them.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvstore.clock import Clock, SystemClock
from kvstore.jsonlog import event
from kvstore.observe import METRICS_ENDPOINT
from kvstore.results import StoreStats
from kvstore.types import Tier

log = logging.getLogger("kvstore.meta.sink")
_FETCH_TIMEOUT_S = 1.0
_MAX_EVENTS = 200
MAX_ROUTERS = 64  # each is fetched every sample


@dataclass(frozen=True)
class DaemonTraffic:
    """Bytes a daemon's transports moved so far (from its /metrics), by direction."""

    bytes_in: float
    bytes_out: float
    requests: float


@dataclass(frozen=True)
class Sample:
    time: float
    stats: StoreStats
    lookups: dict[tuple[str, str], float]
    traffic: dict[str, DaemonTraffic] = field(default_factory=dict)  # daemon id -> its counters
    routers: dict[str, dict[str, Any]] = field(default_factory=dict)  # url -> its /router/state


@dataclass(frozen=True)
class Event:
    time: float
    kind: str  # eviction, demotion, promotion, daemon_up, daemon_down, eviction_pressure
    detail: str
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"time": self.time, "kind": self.kind, "detail": self.detail, "count": self.count}


def fetch_text(url: str, timeout_s: float = _FETCH_TIMEOUT_S) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        body: bytes = resp.read()
    return body.decode()


def parse_traffic(text: str) -> DaemonTraffic:
    """A daemon's transfer counters out of its Prometheus text. Reads only the lines it needs (the
    service's sampler runs beside the hot path; a full parse of every family costs milliseconds)."""
    by_direction = {"in": 0.0, "out": 0.0}
    requests = 0.0
    for line in text.splitlines():
        if not line.startswith("kvstore_daemon_transfer_"):
            continue
        name, _, rest = line.partition("{")
        labels, _, value = rest.rpartition("} ")
        if name == "kvstore_daemon_transfer_bytes_total":
            by_direction["in" if 'direction="in"' in labels else "out"] += float(value)
        elif name == "kvstore_daemon_transfer_requests_total":
            requests += float(value)
    return DaemonTraffic(by_direction["in"], by_direction["out"], requests)


class History:
    """Thread safe. `sample()` takes one sample now (the service's thread calls it every
    `interval_s`; tests call it directly)."""

    def __init__(
        self,
        stats: Callable[[], StoreStats | None],
        lookups: Callable[[], dict[tuple[str, str], float]],
        high_watermark: float,
        clock: Clock | None = None,
        keep: int = 120,
        fetch: Callable[[str], str] = fetch_text,
    ) -> None:
        self._stats = stats
        self._lookups = lookups
        self._high = high_watermark
        self._clock = clock or SystemClock()
        self._fetch = fetch
        self._samples: deque[Sample] = deque(maxlen=keep)
        self._events: deque[Event] = deque(maxlen=_MAX_EVENTS)
        self.routers: dict[str, None] = {}  # registered router URLs, in order
        self._pressure = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register_router(self, url: str) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"router url {url!r} must start with http:// or https://")
        with self._lock:
            if url.rstrip("/") not in self.routers and len(self.routers) >= MAX_ROUTERS:
                raise ValueError(f"already {MAX_ROUTERS} routers registered")
            self.routers[url.rstrip("/")] = None

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def sample(self) -> Sample | None:
        """None, and nothing kept, while there is no store to read (a standby)."""
        stats = self._stats()
        if stats is None:
            return None
        now = self._clock.now()
        traffic = {}
        for daemon in stats.daemons:
            url = next((e.address for s in daemon.segments for e in s.endpoints if e.transport == METRICS_ENDPOINT), "")
            if url:
                try:
                    traffic[daemon.daemon_id] = parse_traffic(self._fetch(f"{url}/metrics"))
                except (OSError, ValueError) as exc:
                    log.debug("cannot read %s/metrics: %s", url, exc)
        routers = {}
        for url in list(self.routers):
            try:
                routers[url] = json.loads(self._fetch(f"{url}/router/state"))
            except (OSError, ValueError) as exc:
                log.debug("cannot read %s/router/state: %s", url, exc)
        current = Sample(now, stats, self._lookups(), traffic, routers)
        with self._lock:
            previous = self._samples[-1] if self._samples else None
            self._samples.append(current)
            if previous is not None:
                self._note_changes(previous, current)
        return current

    def _note_changes(self, old: Sample, new: Sample) -> None:
        before = {d.daemon_id for d in old.stats.daemons}
        after = {d.daemon_id for d in new.stats.daemons}
        for daemon in sorted(after - before):
            self._events.append(Event(new.time, "daemon_up", daemon))
            event(log, "daemon_up", daemon_id=daemon)
        for daemon in sorted(before - after):
            self._events.append(Event(new.time, "daemon_down", daemon))
            event(log, "daemon_down", logging.WARNING, daemon_id=daemon)
        old_tiers = {t.tier: t for t in old.stats.tiers}
        evicted = 0
        for t in new.stats.tiers:
            was = old_tiers.get(t.tier)
            for kind, attr in (("eviction", "evictions"), ("demotion", "demotions"), ("promotion", "promotions")):
                delta = getattr(t, attr) - (getattr(was, attr) if was else 0)
                if delta > 0:
                    self._events.append(Event(new.time, kind, t.tier.value, delta))
                    evicted += delta if kind == "eviction" else 0
        dram = next((t for t in new.stats.tiers if t.tier is Tier.DRAM), None)
        full = dram is not None and dram.capacity > 0 and dram.used > dram.capacity * self._high
        pressure = full or evicted > 0
        if pressure and not self._pressure:
            detail = f"{evicted} evicted" if evicted else "DRAM above its high watermark"
            self._events.append(Event(new.time, "eviction_pressure", detail))
            fill = dram.used / dram.capacity if dram is not None and dram.capacity else 0.0
            event(log, "eviction_pressure", logging.WARNING, evicted=evicted, dram_fill=round(fill, 4))
        self._pressure = pressure

    def start(self, interval_s: float) -> History:
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="meta-history", daemon=True)
        self._thread.start()
        return self

    def _loop(self, interval_s: float) -> None:
        while True:
            try:
                self.sample()
            except Exception:
                log.exception("sampling the service's statistics failed")
            if self._stop.wait(interval_s):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)
