"""Where the metadata service writes what its callers may observe, before it answers them.

A call changes MetaState under the store's lock, then submits the records of what it changed
(still under the lock, so the journal sees changes in the order they were made) and, with the
lock released, waits until they are durable. Waiting callers commit as a group: whoever finds
its changes not yet written writes every queued change in one batch (one Redis round trip for
many calls). Once a write fails, every later one fails too (Unavailable) until the journal is
reset: the service then refuses changes, since it can no longer promise to keep them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kvstore.errors import Unavailable

log = logging.getLogger(__name__)


@dataclass
class Changes:
    """Records to write (bytes) or delete (None), per table."""

    objects: dict[str, bytes | None] = field(default_factory=dict)
    segments: dict[str, bytes | None] = field(default_factory=dict)
    pins: dict[str, bytes | None] = field(default_factory=dict)
    tenants: dict[str, bytes | None] = field(default_factory=dict)
    holds: dict[str, bytes | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.objects or self.segments or self.pins or self.tenants or self.holds)

    def merge(self, later: Changes) -> None:
        """Fold a later batch in: for a record changed in both, the later state wins."""
        self.objects.update(later.objects)
        self.segments.update(later.segments)
        self.pins.update(later.pins)
        self.tenants.update(later.tenants)
        self.holds.update(later.holds)


class Journal(Protocol):
    durable: bool  # False: nothing is kept (the in-memory default)

    def submit(self, changes: Changes) -> int:
        """Queue `changes` (called under the store's lock); returns a ticket to wait on."""

    def wait(self, ticket: int) -> None:
        """Return once the changes of `ticket` and of every earlier one are durable; Unavailable
        if they cannot be made so."""


class NoJournal:
    """Memory only: nothing is written, nothing survives the process."""

    durable = False

    def submit(self, changes: Changes) -> int:
        return 0

    def wait(self, ticket: int) -> None:
        pass


class GroupCommit:
    """An ordered journal over `write(changes)`, which makes one merged batch durable (or raises).
    Thread safe."""

    durable = True

    def __init__(self, write: Callable[[Changes], None], what: str) -> None:
        self._write = write
        self._what = what
        self._queue = Changes()
        self._submitted = 0
        self._written = 0
        self._failed: Unavailable | None = None
        self._queue_lock = threading.Lock()
        self._write_lock = threading.Lock()

    @property
    def failed(self) -> Unavailable | None:
        return self._failed

    def submit(self, changes: Changes) -> int:
        with self._queue_lock:
            if changes:
                self._queue.merge(changes)
            self._submitted += 1
            return self._submitted

    def wait(self, ticket: int) -> None:
        while self._written < ticket:
            with self._write_lock:
                if self._written >= ticket:
                    return
                if self._failed is not None:
                    raise self._failed
                with self._queue_lock:
                    batch, self._queue = self._queue, Changes()
                    upto = self._submitted
                try:
                    if batch:
                        self._write(batch)
                except Exception as exc:
                    self._failed = Unavailable(
                        f"the metadata journal ({self._what}) refused a write ({exc}); changes are refused "
                        "until it is back"
                    )
                    log.error("%s", self._failed)
                    raise self._failed from exc
                self._written = upto
