"""The link monitor: how fast each path from this client host to a daemon, per transport, is now.

Every real transfer is a sample: its latency (seconds for the call) and, for transfers large
enough that bytes dominate, its bandwidth (bytes over the seconds past the link's latency). Both
are exponentially weighted moving averages; bandwidth is averaged as seconds per byte, so one slow
transfer pulls it down at once (a link that slows is seen on the next transfer; recovering takes
a few), and one nobody used for `stale_s` is reported as stale rather than as fast. An
optional active probe (LinkProbe) times an empty request to each daemon it knows, for latency on
links with no traffic.

Thread safe; time comes from an injected clock.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from kvstore.clock import Clock, SystemClock

log = logging.getLogger(__name__)

BANDWIDTH_MIN_BYTES = 256 << 10  # smaller transfers are latency samples only
LATENCY_MAX_BYTES = 64 << 10  # ... and larger ones are bandwidth samples only


@dataclass(frozen=True)
class LinkConfig:
    alpha: float = 0.3  # weight of the newest sample
    stale_s: float = 60.0  # a link with no sample for this long is stale
    probe_interval_s: float = 0.0  # active probe period; 0: no probe

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"link alpha {self.alpha} must be in (0, 1]")
        if self.stale_s <= 0 or self.probe_interval_s < 0:
            raise ValueError("stale_s must be positive and probe_interval_s not negative")


class LinkKey(NamedTuple):
    host: str  # the client host
    daemon: str
    transport: str


class LinkStats(NamedTuple):
    """One link as measured now. bandwidth/latency are None until a sample of that kind came."""

    host: str
    daemon: str
    transport: str
    bandwidth_bytes_per_s: float | None
    latency_s: float | None
    transfers: int
    bytes: int
    failures: int
    age_s: float  # since the last sample
    stale: bool

    def to_dict(self) -> dict[str, object]:
        return self._asdict()


class _Link:
    __slots__ = ("bytes", "failed", "failures", "last", "latency", "per_byte", "transfers")

    def __init__(self, now: float) -> None:
        self.per_byte: float | None = None  # EWMA of seconds per byte
        self.latency: float | None = None
        self.transfers = 0
        self.bytes = 0
        self.failures = 0
        self.failed: float | None = None  # when the last call failed, if none succeeded since
        self.last = now


def _ewma(old: float | None, sample: float, alpha: float) -> float:
    return sample if old is None else old + alpha * (sample - old)


class LinkMonitor:
    def __init__(self, host: str = "", config: LinkConfig | None = None, clock: Clock | None = None) -> None:
        self.host = host or socket.gethostname()
        self.config = config or LinkConfig()
        self._clock = clock or SystemClock()
        self._links: dict[tuple[str, str], _Link] = {}
        self._lock = threading.Lock()

    def _link(self, daemon: str, transport: str) -> _Link:
        link = self._links.get((daemon, transport))
        if link is None:
            link = self._links[(daemon, transport)] = _Link(self._clock.monotonic())
        return link

    def record(self, daemon: str, transport: str, nbytes: int, seconds: float) -> None:
        """A transfer of `nbytes` to or from `daemon` over `transport` took `seconds`."""
        if seconds <= 0:
            return
        alpha = self.config.alpha
        with self._lock:
            link = self._link(daemon, transport)
            link.transfers += 1
            link.bytes += nbytes
            link.last = self._clock.monotonic()
            link.failed = None
            if nbytes <= LATENCY_MAX_BYTES:
                link.latency = _ewma(link.latency, seconds, alpha)
            if nbytes >= BANDWIDTH_MIN_BYTES:
                moving = max(seconds - (link.latency or 0.0), seconds / 2)  # never credit latency as speed
                link.per_byte = _ewma(link.per_byte, moving / nbytes, alpha)

    def record_latency(self, daemon: str, transport: str, seconds: float) -> None:
        """A probe's round trip (no payload)."""
        with self._lock:
            link = self._link(daemon, transport)
            link.latency = _ewma(link.latency, seconds, self.config.alpha)
            link.last = self._clock.monotonic()
            link.failed = None

    def record_failure(self, daemon: str, transport: str) -> None:
        with self._lock:
            link = self._link(daemon, transport)
            link.failures += 1
            link.failed = self._clock.monotonic()

    def estimate(self, daemon: str, transport: str, nbytes: int) -> float | None:
        """Seconds a transfer of `nbytes` over this link should take now: its latency plus the
        bytes at its bandwidth, each counted where measured. None for a link with no sample yet,
        or none for `stale_s` (what it was is no guide to what it is); infinite for one whose last
        call failed within `stale_s`, until a transfer or a probe succeeds on it."""
        with self._lock:
            link = self._links.get((daemon, transport))
            if link is None:
                return None
            now = self._clock.monotonic()
            if link.failed is not None and now - link.failed <= self.config.stale_s:
                return math.inf
            if now - link.last > self.config.stale_s:
                return None
            if link.latency is None and link.per_byte is None:
                return None
            return (link.latency or 0.0) + nbytes * (link.per_byte or 0.0)

    def links(self) -> list[LinkStats]:
        """Every link seen, sorted by daemon then transport."""
        now = self._clock.monotonic()
        with self._lock:
            items = sorted(self._links.items())
            return [
                LinkStats(
                    self.host,
                    daemon,
                    transport,
                    1.0 / link.per_byte if link.per_byte else None,
                    link.latency,
                    link.transfers,
                    link.bytes,
                    link.failures,
                    now - link.last,
                    now - link.last > self.config.stale_s,
                )
                for (daemon, transport), link in items
            ]


class LinkProbe:
    """Times an empty request to each target every `interval_s`, on its own thread.

    `targets()` names (daemon, transport, ping) where ping() makes one round trip and raises
    OSError (or a KVStoreError) if the daemon does not answer."""

    def __init__(
        self,
        monitor: LinkMonitor,
        targets: Callable[[], list[tuple[str, str, Callable[[], float]]]],
        interval_s: float,
    ) -> None:
        self._monitor = monitor
        self._targets = targets
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvstore-link-probe", daemon=True)

    def start(self) -> LinkProbe:
        self._thread.start()
        return self

    def probe_once(self) -> None:
        for daemon, transport, ping in self._targets():
            try:
                self._monitor.record_latency(daemon, transport, ping())
            except Exception as exc:  # noqa: BLE001 - a dead daemon is a failed probe, not a crash
                log.debug("probe of %s over %s failed: %s", daemon, transport, exc)
                self._monitor.record_failure(daemon, transport)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.probe_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
