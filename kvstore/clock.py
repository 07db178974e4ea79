"""Time as an injected dependency, so leases, heartbeats and eviction are tested without sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the unix epoch; comparable across processes on one host (grants and
        leases expire by it)."""

    def monotonic(self) -> float:
        """Seconds that only ever move forward, for how long something has been silent: a wall
        clock that jumps must not make every daemon look dead."""


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._mono = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        """Time passes."""
        with self._lock:
            self._now += seconds
            self._mono += seconds

    def jump(self, seconds: float) -> None:
        """The wall clock is set (forward or back); no time passes."""
        with self._lock:
            self._now += seconds


def now_ms(clock: Clock) -> int:
    return int(clock.now() * 1000)
