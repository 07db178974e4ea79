"""LMCache's L2 "lock" as kvstore read leases.

A lookup-and-lock is a Get under this adapter's own holder id: the service answers where each
key is and takes one read lease per found key, so the chunk is neither evicted, moved nor removed
until the lease is handed back or runs out (the service's lease_ttl_s). The adapter keeps, per
ObjectKey, the leases it holds, oldest first (LeaseBook); LMCache's unlock takes one per key and
the Releaser hands them back with one Release call per client.

Why an unlock always succeeds in the end: a lease the service never hears back about ends on its
own when it runs out, so the Releaser retries a failed Release only until then, and then counts
the lease as expired. No unlock blocks LMCache's controller thread.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict, deque
from collections.abc import Hashable, Sequence
from typing import NamedTuple

from kvstore.client import KVClient, KVStoreError
from kvstore.clock import Clock

log = logging.getLogger(__name__)
RETRY_S = 0.05  # first wait before a failed Release is tried again (doubles, up to MAX_RETRY_S)
MAX_RETRY_S = 1.0


class Lease(NamedTuple):
    client: KVClient
    lease_id: int
    expires: float  # on the adapter's clock (monotonic): the service has ended it by then


class LeaseBook:
    """The read leases this adapter holds, per key. Thread safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[Hashable, deque[Lease]] = {}

    def add(self, key: Hashable, lease: Lease) -> None:
        with self._lock:
            self._by_key.setdefault(key, deque()).append(lease)

    def take(self, keys: Sequence[Hashable]) -> list[Lease]:
        """One lease per key named (the oldest); a key with none (a miss, or one already unlocked)
        is skipped."""
        out: list[Lease] = []
        with self._lock:
            for key in keys:
                held = self._by_key.get(key)
                if not held:
                    continue
                out.append(held.popleft())
                if not held:
                    del self._by_key[key]
        return out

    def take_all(self) -> list[Lease]:
        with self._lock:
            held, self._by_key = self._by_key, {}
        return [lease for queue in held.values() for lease in queue]

    def held(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._by_key.values())


class ReleaseStats(NamedTuple):
    released: int
    expired: int  # given up on after the service had ended them itself
    pending: int


class Releaser:
    """Hands leases back in a background thread: `submit` never blocks; `flush` is one pass
    (what the thread runs, and what tests call)."""

    def __init__(self, holder: str, clock: Clock) -> None:
        self.holder = holder
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: list[Lease] = []
        self._released = 0
        self._expired = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvstore-l2-release", daemon=True)
        self._thread.start()

    def submit(self, leases: Sequence[Lease]) -> None:
        if leases:
            with self._lock:
                self._pending += leases
            self._wake.set()

    def flush(self) -> bool:
        """Try to hand back every pending lease, one Release per client; True when none is left."""
        with self._lock:
            pending, self._pending = self._pending, []
        by_client: dict[KVClient, list[Lease]] = defaultdict(list)
        for lease in pending:
            by_client[lease.client].append(lease)
        retry: list[Lease] = []
        released = expired = 0
        for client, leases in by_client.items():
            try:
                client.release([lease.lease_id for lease in leases], self.holder)
                released += len(leases)
            except KVStoreError as exc:
                now = self._clock.monotonic()
                alive = [lease for lease in leases if lease.expires > now]
                expired += len(leases) - len(alive)
                retry += alive
                if alive:
                    log.debug("handing back %d read leases failed (retrying until they run out): %s", len(alive), exc)
        with self._lock:
            self._pending += retry
            self._released += released
            self._expired += expired
            return not self._pending

    def stats(self) -> ReleaseStats:
        with self._lock:
            return ReleaseStats(self._released, self._expired, len(self._pending))

    def close(self) -> None:
        """One last pass, then stop; leases still unreleased run out on their own."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self.flush()

    def _run(self) -> None:
        wait = RETRY_S
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            if self.flush():
                wait = RETRY_S
                continue
            self._stop.wait(wait)  # the service is unreachable: back off, then try again
            wait = min(wait * 2, MAX_RETRY_S)
            self._wake.set()
