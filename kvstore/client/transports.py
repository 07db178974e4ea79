"""Which data-plane transport a client uses for a segment: the first of its preferred transports
that the segment offers and that can reach it from here. Transports are made once per client."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kvstore.clock import Clock
from kvstore.config import ClientConfig
from kvstore.errors import TransportError, Unavailable
from kvstore.hostid import host_id
from kvstore.transport import registry
from kvstore.transport.base import Transport
from kvstore.types import Grant, SegmentInfo

if TYPE_CHECKING:  # prometheus_client loads only for a client with metrics
    from kvstore.metrics.client import ClientMetrics

log = logging.getLogger(__name__)


class Transports:
    """Thread safe."""

    def __init__(self, config: ClientConfig, clock: Clock, metrics: ClientMetrics | None = None) -> None:
        self.config = config
        self.clock = clock
        self._metrics = metrics  # when set, every transport is made metered
        self.preferred = installed(config.transports)
        self._made: dict[str, Transport] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def host(self) -> str:
        """This host's id, when this client may use shm (the service then grants LOCAL)."""
        return host_id() if "shm" in self.preferred else ""

    def usable(self, segment: SegmentInfo) -> tuple[str, ...]:
        """The transports that may move `segment`'s bytes, in preference order: only shm where
        the service grants LOCAL (this client may use shm, and the segment is on its host and
        offers shm; kvstore.meta.segments' local_to), since no daemon honours a LOCAL grant."""
        if self.host and segment.host_id == self.host and segment.endpoint("shm") is not None:
            return ("shm",)
        return self.preferred

    def for_segment(self, segment: SegmentInfo) -> Transport:
        name = self._reachable(segment)
        if name is not None:
            return self.get(name)
        raise TransportError(
            f"segment {segment.segment_id} offers {[e.transport for e in segment.endpoints]}, none of which this "
            f"client can reach with {list(self.usable(segment))}"
        )

    def rank(
        self, grants: Sequence[Grant], segments: Mapping[str, SegmentInfo], reach: dict[str, int | None]
    ) -> list[tuple[SegmentInfo, Grant]]:
        """The replicas this client can reach, best transport first (then in the service's order,
        which puts replicas on daemons it suspects last). `reach` caches each segment's rank for
        one call."""
        if len(grants) == 1:  # one replica, the common case: no sorting, fewer objects per key
            g = grants[0]
            seg = segments.get(g.segment_id)
            if seg is None:
                return []
            if g.segment_id not in reach:
                reach[g.segment_id] = self._preference(seg)
            return [] if reach[g.segment_id] is None else [(seg, g)]
        ranked = []
        for order, g in enumerate(grants):
            seg = segments.get(g.segment_id)
            if seg is None:
                continue
            if g.segment_id not in reach:
                reach[g.segment_id] = self._preference(seg)
            if (rank := reach[g.segment_id]) is not None:
                ranked.append((rank, order, seg, g))
        if self._metrics is not None and len(ranked) > 1:
            ranked = self._by_link(ranked)
        ranked.sort(key=lambda r: (r[0], r[1]))
        return [(seg, g) for _, _, seg, g in ranked]

    def _by_link(self, ranked: list[tuple[int, int, SegmentInfo, Grant]]) -> list[tuple[int, int, SegmentInfo, Grant]]:
        """The replicas of one key reordered by how long the link monitor expects each transfer
        to take (latency plus bytes at the link's measured bandwidth): the fastest link first,
        a link whose last call failed last. Links within LINK_TOLERANCE of each other count as
        equal and keep the service's order. A link not measured yet (or stale) goes first, in
        the service's order: reading over it is what measures it, once."""
        assert self._metrics is not None
        monitor = self._metrics.links
        estimates = [monitor.estimate(seg.daemon_id, self.preferred[rank], g.length) for rank, _, seg, g in ranked]
        out = []
        for (rank, order, seg, g), est in zip(ranked, estimates, strict=True):
            out.append((rank, _speed_class(0.0 if est is None else est), order, seg, g))
        out.sort(key=lambda r: (r[0], r[1], r[2]))
        return [(rank, n, seg, g) for n, (rank, _, _, seg, g) in enumerate(out)]

    def _preference(self, segment: SegmentInfo) -> int | None:
        name = self._reachable(segment)
        return None if name is None else self.preferred.index(name)

    def _reachable(self, segment: SegmentInfo) -> str | None:
        """The first usable transport that the segment offers and that reaches it from here."""
        for name in self.usable(segment):
            if segment.endpoint(name) is not None and self.get(name).can_reach(segment):
                return name
        return None

    def get(self, name: str) -> Transport:
        with self._lock:
            if self._closed:
                raise TransportError("this client is closed")
            transport = self._made.get(name)
            if transport is None:
                transport = registry.client_class(name).from_config(self.config, self.clock)
                if self._metrics is not None:
                    transport = self._metrics.wrap(transport)
                self._made[name] = transport
            return transport

    def close(self) -> None:
        with self._lock:
            self._closed = True
            made, self._made = list(self._made.values()), {}
        for transport in made:
            transport.close()


def installed(names: Sequence[str]) -> tuple[str, ...]:
    """The transports of `names` whose libraries are installed, in order. A missing optional one
    is skipped (logged once per process); Unavailable, naming the extras, if none is left."""
    usable, missing = [], []
    for name in names:
        try:
            registry.client_class(name)  # unknown names raise InvalidArgument here
            usable.append(name)
        except Unavailable as exc:
            missing.append(exc)
            if name not in _REPORTED_MISSING:
                _REPORTED_MISSING.add(name)
                log.info("transport %s skipped: %s", name, exc)
    if not usable:
        raise Unavailable("; ".join(str(e) for e in missing))
    return tuple(usable)


_REPORTED_MISSING: set[str] = set()
LINK_TOLERANCE = 1.25  # links whose expected transfer times differ by less than this are equal


def _speed_class(seconds: float) -> float:
    """Expected seconds on a log scale of step LINK_TOLERANCE (inf stays inf)."""
    if seconds <= 0 or math.isinf(seconds):
        return -math.inf if seconds <= 0 else math.inf
    return math.floor(math.log(seconds, LINK_TOLERANCE))
