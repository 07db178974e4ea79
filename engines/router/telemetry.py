"""What the router measures from finished requests: link bandwidth, prefill throughput and
per-instance arrival rates, each over a sliding window on an injected clock (tests never sleep)."""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from kvstore.engines.router.policy import CostModel


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

    def __init__(self, model: "CostModel", clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self._clock = clock
        self._link = _Rate(model.window_s, clock)
        self._prefill = _Rate(model.window_s, clock)
        self._arrivals: dict[str, _Arrivals] = {}

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

    def bandwidth(self) -> float:
        return self._link.value() or self.model.default_bandwidth

    def prefill_tps(self) -> float:
        return self._prefill.value() or self.model.default_prefill_tps
