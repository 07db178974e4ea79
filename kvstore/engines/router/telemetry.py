"""What the router measures from finished requests: link bandwidth, prefill throughput and
per-instance arrival rates, each over a sliding window on an injected clock (tests never sleep).

Link bandwidth prefers the live figures of the instances' link monitors (each instance's
KVClient measures its path to every daemon: kvstore.metrics.links), which the instances send with
their answers. A client reads each block over its fastest transport to a daemon, from the replica
behind the fastest link (KVClient's replica choice), so per host a daemon counts with its best
transport, and a block stored on `replicas` distinct daemons out of the host's D costs the
expected time of the best of `replicas` daemons drawn at random: sorted by time per byte t1 <=
... <= tD, the i-th is the best one drawn with probability C(D - i, replicas - 1) / C(D,
replicas). With one replica that is the mean time per byte (the harmonic mean of the
bandwidths: a request's blocks spread over the daemons and the slowest dominates); with a
replica on every daemon, the fastest link's. The hosts' times are averaged. Without any figure,
the bandwidth of recent loads stands in, and before anything was measured, the configured
default.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol


class Defaults(Protocol):
    """What telemetry reads of the cost model (router.policy.CostModel): its window and the
    figures to use before anything was measured."""

    @property
    def window_s(self) -> float: ...
    @property
    def default_bandwidth(self) -> float: ...
    @property
    def default_prefill_tps(self) -> float: ...
    @property
    def kv_replicas(self) -> int: ...


class _Rate:
    """amount / seconds over the samples of the last `window_s`, by an injected clock."""

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self._window = window_s
        self._clock = clock
        self._samples: deque[tuple[float, float, float]] = deque()

    def add(self, amount: float, seconds: float) -> None:
        if amount > 0 and seconds > 0:
            self._samples.append((self._clock(), amount, seconds))

    def value(self) -> float | None:
        horizon = self._clock() - self._window
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
        seconds = sum(s for _, _, s in self._samples)
        return sum(a for _, a, _ in self._samples) / seconds if seconds else None


class _Arrivals:
    """Events per second over the last `window_s` (over the time since the first event, if less)."""

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self._window = window_s
        self._clock = clock
        self._first: float | None = None
        self._times: deque[float] = deque()

    def add(self) -> None:
        now = self._clock()
        self._first = now if self._first is None else self._first
        self._times.append(now)

    def rate(self) -> float:
        now = self._clock()
        while self._times and self._times[0] < now - self._window:
            self._times.popleft()
        if self._first is None:
            return 0.0
        span = min(self._window, max(1.0, now - self._first))
        return len(self._times) / span


class Telemetry:
    """Link bandwidth, prefill throughput and per-instance arrival rates, measured from recent
    requests."""

    def __init__(self, model: Defaults, clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self._clock = clock
        self._link = _Rate(model.window_s, clock)
        self._prefill = _Rate(model.window_s, clock)
        self._arrivals: dict[str, _Arrivals] = {}
        self._links: dict[tuple[str, str, str], tuple[float, float]] = {}  # (host, daemon, transport) -> (bw, seen)

    def record_arrival(self, instance: str) -> None:
        """A prompt was sent to `instance` to be computed."""
        self._arrivals.setdefault(instance, _Arrivals(self.model.window_s, self._clock)).add()

    def arrival_rate(self, instance: str) -> float:
        arrivals = self._arrivals.get(instance)
        return arrivals.rate() if arrivals else 0.0

    def record_transfer(self, nbytes: int, seconds: float) -> None:
        self._link.add(nbytes, seconds)

    def record_prefill(self, tokens: int, seconds: float) -> None:
        self._prefill.add(tokens, seconds)

    def record_links(self, links: list[dict[str, Any]]) -> None:
        """An instance's link monitor figures (LinkStats as dicts): the latest per link is kept."""
        now = self._clock()
        for link in links:
            bandwidth = link.get("bandwidth_bytes_per_s")
            if bandwidth and not link.get("stale"):
                self._links[(str(link["host"]), str(link["daemon"]), str(link["transport"]))] = (float(bandwidth), now)

    def links(self) -> dict[str, float]:
        """The fresh links' bandwidth, "host->daemon/transport" -> bytes/s."""
        horizon = self._clock() - self.model.window_s
        self._links = {k: v for k, v in self._links.items() if v[1] >= horizon}
        return {f"{h}->{d}/{t}": bw for (h, d, t), (bw, _) in self._links.items()}

    def bandwidth(self) -> float:
        self.links()  # forgets the stale ones
        best: dict[str, dict[str, float]] = {}  # host -> daemon -> its fastest transport's bandwidth
        for (host, daemon, _), (bw, _) in self._links.items():
            per_host = best.setdefault(host, {})
            per_host[daemon] = max(bw, per_host.get(daemon, 0.0))
        if best:
            seconds = [expected_time(list(d.values()), self.model.kv_replicas) for d in best.values()]
            return len(seconds) / sum(seconds)
        return self._link.value() or self.model.default_bandwidth

    def prefill_tps(self) -> float:
        return self._prefill.value() or self.model.default_prefill_tps


def expected_time(bandwidths: list[float], replicas: int) -> float:
    """Seconds per byte of a block stored on `replicas` of these daemons (distinct, drawn at
    random) and read from the one with the fastest link."""
    times = sorted(1.0 / bw for bw in bandwidths)
    r = min(max(1, replicas), len(times))
    ways = math.comb(len(times), r)
    return sum(t * math.comb(len(times) - i, r - 1) for i, t in enumerate(times, 1)) / ways
