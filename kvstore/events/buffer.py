"""The metadata service's EventSink when KV events are on: it only records.

MetaState reports every change under the store's one lock, on the path of every put, get-driven
promotion and eviction, so recording must cost no more than an append. A BlockFeed thread drains
the buffer and does the rest (see feed.py).

Bounded: if the feed falls more than `limit` changes behind (it died, or the host is starved), new
changes are dropped and counted, and the next drain says so; the feed then tells its listeners to
forget everything (AllBlocksCleared) rather than let them trust a stream with a hole.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from enum import IntEnum
from typing import NamedTuple

from kvstore.types import Tier

DEFAULT_LIMIT = 1 << 20  # changes (almost always one key each)


class Op(IntEnum):
    STORED = 1
    REMOVED = 2
    CLEARED = 3


# (op, keys, tier): a plain tuple, since it is built under the store's lock; tier is None with CLEARED
Change = tuple[Op, Sequence[str], Tier | None]


class Drained(NamedTuple):
    changes: list[Change]
    dropped: int  # changes left out since the last drain (0: the changes are complete)


class Doorbell:
    """Wakes the feed thread once per drain, not once per change: a pipe whose write end is rung
    only when the buffer goes from empty to not empty."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)

    def ring(self) -> None:
        try:
            os.write(self._write_fd, b"\0")
        except (BlockingIOError, OSError):  # full: it is ringing already; closed: shutting down
            pass

    def quiet(self) -> None:
        """Empty the pipe (after waking)."""
        try:
            while os.read(self.read_fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        for fd in (self.read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class EventBuffer:
    """Thread safe without a lock of its own: every stored/removed/cleared call comes under the
    store's lock (one writer at a time) and deque.append / popleft are atomic, so the feed drains
    while the store appends. The doorbell rings when an append finds the queue empty; drain()
    pops until it is empty, so no change waits for a ring that never came."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.doorbell = Doorbell()
        self._limit = limit
        self._changes: deque[Change] = deque()
        self._dropped = 0  # changes dropped, ever (written by the store's side only)
        self._dropped_seen = 0  # ... of which drain() has reported (written by the feed only)

    # stored and removed are the same few lines, not a shared helper: a call fewer per key here.

    def stored(self, keys: Sequence[str], tier: Tier) -> None:
        changes = self._changes
        if self._dropped != self._dropped_seen or len(changes) >= self._limit:
            self._dropped += 1  # once a change is lost, later ones are too, until drained
            return
        changes.append((Op.STORED, keys, tier))
        if len(changes) == 1:
            self.doorbell.ring()

    def removed(self, keys: Sequence[str], tier: Tier) -> None:
        changes = self._changes
        if self._dropped != self._dropped_seen or len(changes) >= self._limit:
            self._dropped += 1
            return
        changes.append((Op.REMOVED, keys, tier))
        if len(changes) == 1:
            self.doorbell.ring()

    def cleared(self) -> None:
        changes = self._changes
        if self._dropped != self._dropped_seen or len(changes) >= self._limit:
            self._dropped += 1
            return
        changes.append((Op.CLEARED, (), None))
        if len(changes) == 1:
            self.doorbell.ring()

    def drain(self) -> Drained:
        """Everything recorded since the last drain, in order (call from one thread only)."""
        out: list[Change] = []
        pop = self._changes.popleft
        try:
            while True:
                out.append(pop())
        except IndexError:
            pass
        dropped = self._dropped - self._dropped_seen
        self._dropped_seen += dropped
        return Drained(out, dropped)

    def close(self) -> None:
        self.doorbell.close()
