"""Freed space that must not be handed out yet.

A block's space is reused only when nothing can still touch its bytes there:
  - no reader is still copying: every read lease on it has been handed back (by the reader
    that took it: the space remembers each lease's holder) or has run out;
  - no grant for it can still be honoured by a daemon: every daemon-checked grant (a read grant,
    or a write grant no receipt showed spent) has expired.
Space freed before both hold waits here; each tick frees what has come due. `grace` covers a
request a daemon accepted just before its grant expired, and clock skew between hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvstore.meta.lease import Reader


@dataclass
class Held:
    locations: tuple[int, ...]
    size: int
    readers: dict[int, str]  # read leases that may still be copying: id -> holder
    readers_until: float  # the last of those leases runs out
    grants_until: float  # the last daemon-checked grant over the space expires

    def due(self, now: float, grace: float) -> bool:
        return self.due_at(grace) < now

    def due_at(self, grace: float) -> float:
        """When nothing can touch the space any more (if no reader hands its lease back sooner)."""
        readers_until = self.readers_until if self.readers else 0.0
        return max(readers_until, self.grants_until) + grace


class Quarantine:
    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._held: list[Held] = []
        self._by_reader: dict[int, Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Held]:
        return iter(self._held)

    @property
    def bytes(self) -> int:
        return sum(h.size * len(h.locations) for h in self._held)

    def returning(self, in_scope: Callable[[int], bool]) -> tuple[int, float]:
        """(bytes, when the first of them comes due) of the held space at locations `in_scope`:
        space on its way back, which a caller making room counts as good as free."""
        total, first = 0, float("inf")
        for held in self._held:
            n = sum(1 for loc in held.locations if in_scope(loc))
            if n:
                total += n * held.size
                first = min(first, held.due_at(self.grace))
        return total, first

    def needed(self, readers: dict[int, Reader], grants_until: float, now: float) -> bool:
        """Whether space with these readers (lease id -> until, holder) and grants must wait."""
        return bool(readers) or grants_until + self.grace >= now

    def hold(self, locations: tuple[int, ...], size: int, readers: dict[int, Reader], grants_until: float) -> None:
        until = max((r.until for r in readers.values()), default=0.0)
        held = Held(locations, size, {i: r.holder for i, r in readers.items()}, until, grants_until)
        self._held.append(held)
        self._by_reader.update(dict.fromkeys(readers, held))

    def reader_done(self, lease_id: int, holder: str, now: float) -> Held | None:
        """`holder` handed its lease back; returns the space if that made it due (the caller
        frees it). A lease id named by anyone but the reader that took it changes nothing."""
        held = self._by_reader.get(lease_id)
        if held is None or held.readers[lease_id] != holder:
            return None
        del self._by_reader[lease_id]
        del held.readers[lease_id]
        if held.due(now, self.grace):
            self._release(held)
            return held
        return None

    def take_due(self, now: float) -> list[Held]:
        """Remove and return every held space that has come due (the caller frees it)."""
        due = [h for h in self._held if h.due(now, self.grace)]
        for held in due:
            self._release(held)
        return due

    def forget_segment(self, in_segment: Callable[[int], bool]) -> None:
        """A segment went away: its space goes with it."""
        for held in self._held:
            held.locations = tuple(loc for loc in held.locations if not in_segment(loc))
        for held in [h for h in self._held if not h.locations]:
            self._release(held)

    def _release(self, held: Held) -> None:
        self._held.remove(held)
        for lease_id in held.readers:
            self._by_reader.pop(lease_id, None)
