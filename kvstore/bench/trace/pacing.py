"""Replay at the trace's timestamps, `speed` times faster (--speed X), or as fast as the store
answers (speed 0). The replay is one caller: a request that comes due while an earlier one is still
running starts late, and the lag is reported, never hidden."""

from __future__ import annotations

import time
from collections.abc import Callable


class Pacer:
    def __init__(
        self,
        speed: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if speed < 0:
            raise ValueError("--speed must be positive (or 0: as fast as possible)")
        self.speed = speed
        self._clock = clock
        self._sleep = sleep
        self._start: float | None = None
        self.slept_s = 0.0  # time spent waiting for requests to come due
        self.max_lag_s = 0.0  # how late the latest-started request started
        self.late = 0  # requests that started after their time

    def wait(self, timestamp_ms: int) -> None:
        """Return when the request stamped `timestamp_ms` is due (the first call starts the clock)."""
        if self.speed == 0:
            return
        now = self._clock()
        if self._start is None:
            self._start = now - timestamp_ms / 1000 / self.speed
        delay = self._start + timestamp_ms / 1000 / self.speed - now
        if delay > 0:
            self._sleep(delay)
            self.slept_s += delay
        elif delay < 0:
            self.late += 1
            self.max_lag_s = max(self.max_lag_s, -delay)
