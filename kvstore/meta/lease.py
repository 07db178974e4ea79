"""Time-limited holds on keys: read leases (a reader is copying the bytes) and pins (a client
asked to keep the key cached). A held key is neither evicted, moved nor removed."""

from __future__ import annotations


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
