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

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kvstore.meta.lease import Reader
from kvstore.meta.segments import unpack_location


@dataclass(eq=False)
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
    """The held spaces, and per segment (by number) their bytes and a heap of when they come
    due, so what a put asks on its way (`returning`) costs O(the segments it asks about), not
    O(everything held): a store read over tcp holds every removed or evicted block's space for
    its grants' life, thousands of them under load."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._held: dict[int, Held] = {}  # by id(held), in the order held
        self._by_reader: dict[int, Held] = {}
        self._bytes: Counter[int] = Counter()  # segment number -> bytes held there
        # segment number -> (due_at when pushed, tie, held): an entry is stale once its held space
        # is released or comes due sooner (a reader handed its lease back); stale tops are popped
        self._due: dict[int, list[tuple[float, int, Held]]] = {}
        self._tie = itertools.count()

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Held]:
        return iter(self._held.values())

    @property
    def bytes(self) -> int:
        return sum(self._bytes.values())

    def returning(self, numbers: Iterable[int]) -> tuple[int, float]:
        """(bytes, when the first of them comes due) of the held space in the segments numbered
        `numbers`: space on its way back, which a caller making room counts as good as free."""
        total, first = 0, float("inf")
        for n in numbers:
            held = self._bytes.get(n, 0)
            if held:
                total += held
                first = min(first, self._first_due(n))
        return total, first

    def _first_due(self, number: int) -> float:
        heap = self._due[number]
        while heap:
            if self._live(number, heap[0]):
                return heap[0][0]
            heapq.heappop(heap)
        return float("inf")

    def _live(self, number: int, entry: tuple[float, int, Held]) -> bool:
        due, _, held = entry
        return self._held.get(id(held)) is held and number in _numbers(held) and due == held.due_at(self.grace)

    def check_invariants(self) -> None:
        """The per-segment bytes and first due times agree with the held spaces."""
        want: Counter[int] = Counter()
        first: dict[int, float] = {}
        for held in self._held.values():
            for loc in held.locations:
                n = unpack_location(loc)[0]
                want[n] += held.size
                first[n] = min(first.get(n, float("inf")), held.due_at(self.grace))
        assert self._bytes == want, f"quarantined bytes per segment {dict(self._bytes)}, held {dict(want)}"
        for n, due in first.items():
            assert self.returning((n,)) == (want[n], due), f"segment {n}: {self.returning((n,))} != {(want[n], due)}"

    def needed(self, readers: dict[int, Reader], grants_until: float, now: float) -> bool:
        """Whether space with these readers (lease id -> until, holder) and grants must wait."""
        return bool(readers) or grants_until + self.grace >= now

    def hold(self, locations: tuple[int, ...], size: int, readers: dict[int, Reader], grants_until: float) -> None:
        until = max((r.until for r in readers.values()), default=0.0)
        held = Held(locations, size, {i: r.holder for i, r in readers.items()}, until, grants_until)
        self._held[id(held)] = held
        self._by_reader.update(dict.fromkeys(readers, held))
        self._count(locations, size, +1)
        self._note_due(held)

    def _note_due(self, held: Held) -> None:
        due = held.due_at(self.grace)
        for n in _numbers(held):
            heapq.heappush(self._due.setdefault(n, []), (due, next(self._tie), held))

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
        if not held.readers:  # due sooner now: only its grants keep it
            self._note_due(held)
        return None

    def take_due(self, now: float) -> list[Held]:
        """Remove and return every held space that has come due (the caller frees it)."""
        due = [h for h in self._held.values() if h.due(now, self.grace)]
        for held in due:
            self._release(held)
        if sum(map(len, self._due.values())) > 2 * len(self._held) + 64:  # stale entries behind live tops
            for n, heap in self._due.items():
                heap[:] = [e for e in heap if self._live(n, e)]
                heapq.heapify(heap)
        return due

    def forget_segment(self, in_segment: Callable[[int], bool]) -> None:
        """A segment went away: its space goes with it."""
        for held in list(self._held.values()):
            lost = tuple(loc for loc in held.locations if in_segment(loc))
            if not lost:
                continue
            self._count(lost, held.size, -1)
            held.locations = tuple(loc for loc in held.locations if not in_segment(loc))
            if not held.locations:
                self._release(held)

    def _count(self, locations: tuple[int, ...], size: int, sign: int) -> None:
        for loc in locations:
            n = unpack_location(loc)[0]
            self._bytes[n] += sign * size
            if not self._bytes[n]:  # nothing held there: its due times go too
                del self._bytes[n]
                self._due.pop(n, None)

    def _release(self, held: Held) -> None:
        del self._held[id(held)]
        self._count(held.locations, held.size, -1)
        for lease_id in held.readers:
            self._by_reader.pop(lease_id, None)


def _numbers(held: Held) -> set[int]:
    return {unpack_location(loc)[0] for loc in held.locations}
