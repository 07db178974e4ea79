"""Logging helpers: a line that may come thousands of times a second (one per bad message from
a hostile peer) is logged at most once per interval, with a count of the ones left out."""

from __future__ import annotations

import logging
import sys
import threading
import time


class RateLimited:
    """Thread safe. warning(what, ...) logs the first of each `what` at once, then at most one
    line per `interval_s` saying how many were left out."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self._log = logger
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, what: str, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(what, -self._interval) < self._interval:
                self._dropped[what] = self._dropped.get(what, 0) + 1
                return
            self._last[what] = now
            dropped = self._dropped.pop(what, 0)
        suffix = f" ({dropped} more like it in the last {self._interval:.0f} s)" if dropped else ""
        self._log.warning(message + suffix, *args)


def say_ready(text: str) -> None:
    """Print the readiness line `kvstore ready: TEXT` (launchers and tests wait for it and parse
    it) in one write. print() writes a line and its newline apart when stdout is unbuffered
    (PYTHONUNBUFFERED, as launchers set it), so a log line from another thread on the same pipe
    (stderr merged) could land inside the line, after the address it names."""
    sys.stdout.write(f"kvstore ready: {text}\n")
    sys.stdout.flush()
