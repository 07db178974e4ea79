"""Admission of connections to a server: a cap in all and per peer host, so no one client can
take every thread (each connection is served by one) and others are refused with a clear error
rather than left hanging. Used by the tcp data plane and the metadata fast lane."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_connections: int = 1024  # open connections in all
    max_per_peer: int = 256  # open connections from one peer host
    idle_timeout_s: float = 600.0  # a connection with no request for this long is closed
    header_timeout_s: float = 10.0  # a request's header and table must arrive this soon after it starts

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_peer < 1:
            raise ValueError("connection limits must be at least 1")
        if self.idle_timeout_s <= 0 or self.header_timeout_s <= 0:
            raise ValueError("connection timeouts must be positive")


class Admission:
    """Counts open connections; thread safe."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._open: Counter[str] = Counter()
        self._total = 0
        self._lock = threading.Lock()

    def admit(self, peer: str) -> str:
        """Empty if a connection from `peer` may open (and it is counted); else why not."""
        with self._lock:
            if self._total >= self.limits.max_connections:
                return f"the server has {self._total} connections open, its limit: try again later"
            if self._open[peer] >= self.limits.max_per_peer:
                return f"{self._open[peer]} connections from {peer} are open, its limit: reuse them"
            self._open[peer] += 1
            self._total += 1
            return ""

    def release(self, peer: str) -> None:
        with self._lock:
            self._open[peer] -= 1
            self._total -= 1
            if not self._open[peer]:
                del self._open[peer]

    @property
    def open(self) -> int:
        return self._total


def peer_host(address: object) -> str:
    """The host part of a socket peer address (what limits are counted by)."""
    return str(address[0]) if isinstance(address, tuple) and address else str(address)
