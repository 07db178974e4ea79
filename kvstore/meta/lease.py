"""Time-limited holds on keys: pins (a client asked to keep the key cached; LeaseTable) and read
leases (a reader is copying the bytes; ReadLeases). A held key is neither evicted, moved nor
removed."""

from __future__ import annotations

import itertools


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

    def keys(self) -> list[str]:
        return list(self._until)


class ReadLeases:
    """Read leases, one per key handed out by a Get. A key with a running lease is neither
    evicted, moved nor removed (without force). A reader that is done ends its lease early by
    its id; one that never says so (it crashed, or does not bother) holds it until it runs out."""

    def __init__(self) -> None:
        self._by_key: dict[str, dict[int, float]] = {}     # key -> {lease id: until}
        self._key_of: dict[int, str] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_key)

    def hold(self, key: str, until: float) -> int:
        """A new lease on `key` until `until`; returns its id."""
        lease_id = next(self._ids)
        self._by_key.setdefault(key, {})[lease_id] = until
        self._key_of[lease_id] = key
        return lease_id

    def held(self, key: str, now: float) -> bool:
        leases = self._by_key.get(key)
        return leases is not None and max(leases.values()) >= now

    def until(self, key: str) -> float:
        leases = self._by_key.get(key)
        return max(leases.values()) if leases else 0.0

    def end(self, lease_id: int) -> bool:
        """End one lease; False if it is not (or no longer) a lease on a stored key."""
        key = self._key_of.pop(lease_id, None)
        if key is None:
            return False
        leases = self._by_key[key]
        del leases[lease_id]
        if not leases:
            del self._by_key[key]
        return True

    def release(self, key: str) -> dict[int, float]:
        """Forget every lease on `key` (it is going away); returns them, id -> until."""
        leases = self._by_key.pop(key, {})
        for lease_id in leases:
            del self._key_of[lease_id]
        return leases

    def expire(self, now: float) -> int:
        """Forget leases that ran out; returns how many."""
        ended = [i for i, key in self._key_of.items() if self._by_key[key][i] < now]
        for lease_id in ended:
            self.end(lease_id)
        return len(ended)

    def keys(self) -> list[str]:
        return list(self._by_key)
