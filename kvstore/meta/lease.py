"""Time-limited holds on keys: pins (a client asked to keep the key cached; LeaseTable) and read
leases (a reader is copying the bytes; ReadLeases). A held key is neither evicted, moved nor
removed."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from os import urandom
from typing import NamedTuple

_IDS = struct.Struct("<512Q")  # read lease ids drawn from the OS at a time (shifted to 63 bits)


class Reader(NamedTuple):
    """A read lease as its key's removal hands it on: it runs until `until` for `holder`."""

    until: float
    holder: str


class LeaseTable:
    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._until)

    def hold(self, key: str, until: float) -> None:
        """Extend the hold on `key` to at least `until` (a shorter hold never shortens it)."""
        if self._until.get(key, 0.0) < until:
            self._until[key] = until

    def held(self, key: str, now: float) -> bool:
        return self._until.get(key, 0.0) >= now

    def until(self, key: str) -> float:
        return self._until.get(key, 0.0)

    def release(self, key: str) -> None:
        self._until.pop(key, None)

    def expire(self, now: float) -> int:
        """Forget holds that ended; returns how many."""
        ended = [k for k, t in self._until.items() if t < now]
        for k in ended:
            del self._until[k]
        return len(ended)

    def __contains__(self, key: object) -> bool:
        return key in self._until

    def __iter__(self) -> Iterator[str]:
        """The keys held (a snapshot: safe to release while iterating)."""
        return iter(list(self._until))


class ReadLeases:
    """Read leases, one per key handed out by a Get. A key with a running lease is neither
    evicted, moved nor removed (without force). A reader that is done ends its lease early by
    its id; one that never says so (it crashed, or does not bother) holds it until it runs out.
    A lease is bound to its holder: only the client that took it can end it, also once its key is
    gone (the quarantine keeps the holder). Ids are drawn from the OS generator, so one client's
    ids say nothing of another's (a seeded Mersenne Twister's next outputs follow from ~20 ids);
    512 at a time (_IDS), as a Get of many keys takes one per key."""

    def __init__(self) -> None:
        self._by_key: dict[str, dict[int, float]] = {}  # key -> {lease id: until}
        self._of: dict[int, tuple[str, str]] = {}  # lease id -> (key, holder)
        self._ids: list[int] = []  # drawn, not handed out yet

    def _new_id(self) -> int:
        if not self._ids:
            self._ids = [v >> 1 or 1 for v in _IDS.unpack(urandom(_IDS.size))]
        return self._ids.pop()

    def __len__(self) -> int:
        return len(self._by_key)

    def hold(self, key: str, until: float, holder: str = "") -> int:
        """A new lease on `key` until `until` for `holder`; returns its id."""
        lease_id = self._new_id()
        while lease_id in self._of:
            lease_id = self._new_id()
        self._by_key.setdefault(key, {})[lease_id] = until
        self._of[lease_id] = (key, holder)
        return lease_id

    def held(self, key: str, now: float) -> bool:
        leases = self._by_key.get(key)
        return leases is not None and max(leases.values()) >= now

    def until(self, key: str) -> float:
        leases = self._by_key.get(key)
        return max(leases.values()) if leases else 0.0

    def holder(self, lease_id: int) -> str | None:
        found = self._of.get(lease_id)
        return None if found is None else found[1]

    def keys_of(self, holder: str, now: float) -> set[str]:
        """The keys `holder` has a running lease on (a walk of every lease: for rare calls)."""
        return {key for i, (key, h) in self._of.items() if h == holder and self._by_key[key][i] >= now}

    def end(self, lease_id: int, holder: str) -> bool:
        """End one lease of `holder`; False if it is not (or no longer) a lease on a stored key,
        or another holder's."""
        found = self._of.get(lease_id)
        if found is None or found[1] != holder:
            return False
        del self._of[lease_id]
        leases = self._by_key[found[0]]
        del leases[lease_id]
        if not leases:
            del self._by_key[found[0]]
        return True

    def release(self, key: str) -> dict[int, Reader]:
        """Forget every lease on `key` (it is going away); returns them, id -> (until, holder)."""
        leases = self._by_key.pop(key, {})
        return {lease_id: Reader(until, self._of.pop(lease_id)[1]) for lease_id, until in leases.items()}

    def expire(self, now: float) -> int:
        """Forget leases that ran out; returns how many."""
        ended = [(i, h) for i, (key, h) in self._of.items() if self._by_key[key][i] < now]
        for lease_id, holder in ended:
            self.end(lease_id, holder)
        return len(ended)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[str]:
        """The keys leased (a snapshot: safe to end leases while iterating)."""
        return iter(list(self._by_key))
