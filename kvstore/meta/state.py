"""The metadata service's tables and the mechanism that keeps them consistent.

MetaState owns the index, the segment table, leases and pins, and the counters; its methods free
space, drop objects and replicas, and never decide anything. The store (API) and the tiering
logic (moves between tiers) both act through it, under the store's one lock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable

from kvstore.meta.index import ObjectIndex
from kvstore.meta.lease import LeaseTable, ReadLeases
from kvstore.meta.segments import Segment, SegmentTable, unpack_location
from kvstore.types import Tier


@dataclass
class Retired:
    """A removed block's space, kept while the read leases `readers` (ids) may still be copying."""

    until: float                      # the last of those leases runs out
    locations: tuple[int, ...]
    size: int
    readers: set[int]


class MetaState:
    def __init__(self) -> None:
        self.index = ObjectIndex()
        self.segments = SegmentTable()
        self.leases = ReadLeases()
        self.pins = LeaseTable()         # client pins
        self.moving: dict[str, int] = {}  # key -> id of its tier move in flight
        # Blocks removed (force) while read-leased: readers may still be copying from their space,
        # which is freed once each of those leases has ended or been released.
        self.retired: list[Retired] = []
        self._retired_by_lease: dict[int, Retired] = {}
        self.counters: Counter[str] = Counter()
        self.tier_counters: Counter[tuple[Tier, str]] = Counter()

    def segment_of(self, location: int) -> Segment:
        return self.segments.by_number(unpack_location(location)[0])

    def tier_of(self, location: int) -> Tier:
        return self.segment_of(location).info.tier

    def usage(self, tier: Tier, daemon_id: str | None = None,
              exclude: frozenset[str] | set[str] = frozenset()) -> tuple[int, int]:
        """(used, capacity) bytes of a tier, optionally on one daemon only, or leaving some out."""
        segs = [s for s in self.segments.segments(tier)
                if (daemon_id is None or s.daemon_id == daemon_id) and s.daemon_id not in exclude]
        return sum(s.allocator.used for s in segs), sum(s.allocator.capacity for s in segs)

    def ssd_daemons(self) -> set[str]:
        """Daemons with an SSD tier: their DRAM blocks are demoted, never dropped, to make room."""
        return {s.daemon_id for s in self.segments.segments(Tier.SSD)}

    def droppable(self, now: float, keep_on: set[str]) -> Callable[[str], bool]:
        """A `protected` predicate for eviction that also spares blocks with a replica on any of
        the daemons in `keep_on`."""
        protected = self.protected(now)
        if not keep_on:
            return protected

        def skip(key: str) -> bool:
            if protected(key):
                return True
            entry = self.index.get(key)
            return any(self.segment_of(loc).daemon_id in keep_on for loc in entry.replicas())
        return skip

    def protected(self, now: float) -> Callable[[str], bool]:
        """Keys that must not be evicted or moved now: read-leased, pinned, or moving."""
        held, pinned, moving = self.leases.held, self.pins.held, self.moving
        return lambda key: held(key, now) or pinned(key, now) or key in moving

    def count_blocks(self, locations: tuple[int, ...], delta: int) -> None:
        for loc in locations:
            self.tier_counters[self.tier_of(loc), "blocks"] += delta

    def free(self, locations: tuple[int, ...], size: int) -> None:
        for loc in locations:
            number, offset = unpack_location(loc)
            self.segments.by_number(number).allocator.free(offset, size)

    def drop(self, key: str, now: float | None = None) -> tuple[int, ...]:
        """COMPLETE -> ABSENT; returns the locations it had. Its space is freed now, or, given
        `now` while read leases on it still run, retired until they end (end_leases, free_retired)."""
        entry = self.index.remove(key)
        running = {i: t for i, t in self.leases.release(key).items() if now is not None and t >= now}
        self.pins.release(key)
        self.moving.pop(key, None)       # a move in flight for it is now void
        locations = entry.replicas()
        self.count_blocks(locations, -1)
        if running:
            retired = Retired(max(running.values()), locations, entry.size, set(running))
            self.retired.append(retired)
            self._retired_by_lease.update(dict.fromkeys(running, retired))
        else:
            self.free(locations, entry.size)
        return locations

    def end_leases(self, lease_ids: Iterable[int]) -> None:
        """Readers are done: end their leases; a retired block's space is freed with its last."""
        for lease_id in lease_ids:
            if self.leases.end(lease_id):
                continue
            retired = self._retired_by_lease.pop(lease_id, None)
            if retired is not None:
                retired.readers.discard(lease_id)
                if not retired.readers:
                    self.retired.remove(retired)
                    self.free(retired.locations, retired.size)

    def free_retired(self, now: float) -> None:
        """Free the space of removed blocks whose readers' leases ran out before `now`."""
        for retired in [r for r in self.retired if r.until < now]:
            self.retired.remove(retired)
            for lease_id in retired.readers:
                del self._retired_by_lease[lease_id]
            self.free(retired.locations, retired.size)

    def evict(self, keys: list[str]) -> None:
        for key in keys:
            for loc in self.drop(key):
                self.tier_counters[self.tier_of(loc), "evictions"] += 1
        self.counters["evictions"] += len(keys)

    def revoke(self, key: str) -> None:
        put = self.index.abandon(key)
        self.free(put.locations, put.size)
        self.counters["revoked_puts"] += 1

    def drop_segment_replicas(self, seg: Segment) -> int:
        """Forget every replica in `seg` (its space goes with the segment); objects left with no
        replica are gone. Returns how many objects lost a replica."""
        in_seg = lambda loc: unpack_location(loc)[0] == seg.number  # noqa: E731
        for retired in self.retired:     # space in `seg` goes with it
            retired.locations = tuple(loc for loc in retired.locations if not in_seg(loc))
        affected = [(k, locs) for k, locs, _ in self.index.all_locations() if any(map(in_seg, locs))]
        for key, locs in affected:
            keep = tuple(loc for loc in locs if not in_seg(loc))
            complete = self.index.is_complete(key)
            if complete:
                self.tier_counters[seg.info.tier, "blocks"] -= len(locs) - len(keep)
            if keep:
                self.index.set_replicas(key, keep)
            elif complete:
                self.index.remove(key)
                self.leases.release(key)
                self.pins.release(key)
                self.moving.pop(key, None)
            else:
                self.index.abandon(key)
        return len(affected)
