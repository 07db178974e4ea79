"""The metadata service's tables and the mechanism that keeps them consistent.

MetaState owns the index, the segment table, leases and pins, the quarantine of freed space and
the counters; its methods free space, drop objects and replicas, and never decide anything. The
store (API) and the tiering logic (moves between tiers) both act through it, under the store's
one lock.

Space is never handed out while something can still touch it (see quarantine.py): `horizon`
keeps, per key, the latest expiry of the daemon-checked grants issued for it, and freeing a
block's space consults it and the read leases still running.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from kvstore.meta.index import ObjectIndex
from kvstore.meta.journal import Changes
from kvstore.meta.lease import LeaseTable, Reader, ReadLeases
from kvstore.meta.quarantine import Quarantine
from kvstore.meta.records import ObjectRecord, SegmentRecord, encode_object, encode_pin, encode_segment
from kvstore.meta.segments import Segment, SegmentTable, unpack_location
from kvstore.meta.sink import EventSink, NoEvents
from kvstore.meta.tenants import TenantRegistry
from kvstore.types import Tier

# A freed block's space waits this long past its last grant or reader, so a transfer a daemon
# accepted just before expiry (or a clock a little behind) cannot meet another key's bytes.
GRACE_S = 2.0


class MetaState:
    def __init__(self, grant_ceiling: Callable[[], float] | None = None) -> None:
        # The latest expiry (wall-clock seconds) a daemon-checked grant signed now may carry.
        self.grant_ceiling: Callable[[], float] = grant_ceiling or (lambda: float("inf"))
        # After a takeover: when the predecessor's last grant expires (wall clock). Space freed
        # before then waits for it, since any block may have been read or written under one.
        self.inherited_until = 0.0
        self.index = ObjectIndex()
        self.segments = SegmentTable()
        self.leases = ReadLeases()
        self.pins = LeaseTable()  # client pins
        self.moving: dict[str, int] = {}  # key -> id of its tier move (or copy) in flight
        self.quarantine = Quarantine(GRACE_S)
        self.horizon: dict[str, float] = {}  # key -> latest expiry of a daemon-checked grant for it
        self.under_replicated: dict[str, int] = {}  # key -> replicas it was put with (it has fewer)
        self.events: EventSink = NoEvents()
        self.tenants = TenantRegistry()  # and the bytes each holds per tier
        # What changed since the journal was last handed the changes (only with a durable one).
        self.tracking = False
        self.changed_keys: set[str] = set()
        self.changed_pins: set[str] = set()
        self.changed_segments: set[str] = set()
        self.counters: Counter[str] = Counter()
        self.tier_counters: Counter[tuple[Tier, str]] = Counter()

    def segment_of(self, location: int) -> Segment:
        return self.segments.by_number(unpack_location(location)[0])

    def tier_of(self, location: int) -> Tier:
        return self.segment_of(location).info.tier

    def usage(
        self, tier: Tier, daemon_id: str | None = None, exclude: frozenset[str] | set[str] = frozenset()
    ) -> tuple[int, int]:
        """(used, capacity) bytes of a tier, optionally on one daemon only, or leaving some out."""
        if daemon_id is None and not exclude:
            all_of = self.segments.segments(tier)
            return sum(s.allocator.used for s in all_of), sum(s.allocator.capacity for s in all_of)
        segs = [
            s
            for s in self.segments.segments(tier)
            if (daemon_id is None or s.daemon_id == daemon_id) and s.daemon_id not in exclude
        ]
        return sum(s.allocator.used for s in segs), sum(s.allocator.capacity for s in segs)

    def returning(self, numbers: set[int]) -> tuple[int, float]:
        """(bytes, when the first comes due) of quarantined space in the segments numbered
        `numbers`: freed, not yet reusable, and on its way back without any further eviction."""
        return self.quarantine.returning(numbers)

    def ssd_daemons(self) -> frozenset[str]:
        """Daemons with an SSD tier: their DRAM blocks are demoted, never dropped, to make room."""
        return self.segments.daemons_with(Tier.SSD)

    def droppable(self, now: float, keep_on: frozenset[str] | set[str]) -> Callable[[str], bool]:
        """A `protected` predicate for eviction that also spares blocks with a replica on any of
        the daemons in `keep_on`."""
        protected = self.protected(now)
        if not keep_on:
            return protected

        def skip(key: str) -> bool:
            entry = self.index.get(key)
            if protected(key) or entry is None:
                return True
            return any(self.segment_of(loc).daemon_id in keep_on for loc in entry.replicas())

        return skip

    def protected(self, now: float) -> Callable[[str], bool]:
        """Keys that must not be evicted or moved now: read-leased, pinned, or moving."""
        held, pinned, moving = self.leases.held, self.pins.held, self.moving
        return lambda key: held(key, now) or pinned(key, now) or key in moving

    def held(self, key: str, locations: tuple[int, ...], delta: int, size: int) -> None:
        """`key` (of `size` bytes) gained (+1) or lost (-1) the replicas at `locations`: count
        them per tier and per tenant, and tell the event sink, once per replica (so it can tell
        when a tier holds the key no more)."""
        report = self.events.stored if delta > 0 else self.events.removed
        holds = self.segments.holds
        for loc in locations:
            if delta > 0:
                holds.owned(loc, size)
            else:
                holds.hold(loc, size)  # until the release below frees it
            tier = self.tier_of(loc)
            self.tier_counters[tier, "blocks"] += delta
            self.tenants.count(key, tier, delta, size)
            report((key,), tier)
        if self.tracking:
            self.changed_keys.add(key)

    def gained(self, keys: Sequence[str], locations: Sequence[int], sizes: Sequence[int], tier: Tier) -> None:
        """held(key, (location,), +1, size) for each key, every location in one segment of `tier`
        (a batch of new one-replica objects), its tier and its sink told once."""
        owned, count = self.segments.holds.owned, self.tenants.count
        for key, loc, size in zip(keys, locations, sizes, strict=True):
            owned(loc, size)
            count(key, tier, 1, size)
        self.tier_counters[tier, "blocks"] += len(keys)
        if keys:
            self.events.stored(keys, tier)
        if self.tracking:
            self.changed_keys.update(keys)

    def attach_events(self, sink: EventSink) -> None:
        """Report block changes to `sink` from now on (under the store's lock: it must only
        record), starting with every replica held now, so a sink attached to a loaded store (or
        to the store a takeover built) knows it all."""
        self.events = sink
        for key, entry in self.index.least_recent():
            for loc in entry.replicas():
                sink.stored((key,), self.tier_of(loc))

    def note_grant(self, key: str, until: float) -> None:
        """A daemon-checked grant for `key` may be honoured until `until`."""
        if self.horizon.get(key, 0.0) < until:
            self.horizon[key] = until

    # -- freeing space ---------------------------------------------------------------------------

    def release(
        self, locations: tuple[int, ...], size: int, now: float, grants_until: float, readers: dict[int, Reader]
    ) -> None:
        """Free the space now, or hold it until the readers (lease id -> until, holder) and the grants
        (daemon-checked, until `grants_until`) can no longer touch it."""
        grants_until = max(grants_until, self.inherited_until)
        if self.quarantine.needed(readers, grants_until, now):
            self.quarantine.hold(locations, size, readers, grants_until)
        else:
            self._free(locations, size)

    def _free(self, locations: Iterable[int], size: int) -> None:
        for loc in locations:
            number, offset = unpack_location(loc)
            self.segments.by_number(number).allocator.free(offset, size)
            self.segments.holds.ended(loc)

    def drop(self, key: str, now: float) -> tuple[int, ...]:
        """COMPLETE -> ABSENT; returns the locations it had. Their space is freed once no reader
        and no grant can touch it."""
        entry = self.index.remove(key)
        readers = {i: r for i, r in self.leases.release(key).items() if r.until >= now}
        if key in self.pins and self.tracking:
            self.changed_pins.add(key)
        self.pins.release(key)
        self.moving.pop(key, None)  # a move in flight for it is now void
        self.under_replicated.pop(key, None)
        locations = entry.replicas()
        self.held(key, locations, -1, entry.size)
        self.release(locations, entry.size, now, self.horizon.pop(key, 0.0), readers)
        return locations

    def drop_replicas(self, key: str, lost: tuple[int, ...], now: float) -> None:
        """Forget some replicas of a COMPLETE key (it keeps at least one)."""
        entry = self.index.get(key)
        assert entry is not None, f"{key!r} is not COMPLETE"
        keep = tuple(loc for loc in entry.replicas() if loc not in lost)
        assert keep, f"dropping every replica of {key!r}"
        self.index.set_replicas(key, keep)
        self.held(key, lost, -1, entry.size)
        self.release(lost, entry.size, now, self.horizon.get(key, 0.0), {})

    def end_leases(self, lease_ids: Iterable[int], holder: str, now: float) -> None:
        """Readers are done: end their leases; a dropped block's space is freed with its last."""
        for lease_id in lease_ids:
            if self.leases.end(lease_id, holder):
                continue
            held = self.quarantine.reader_done(lease_id, holder, now)
            if held is not None:
                self._free(held.locations, held.size)

    def expire(self, now: float) -> None:
        """Free held space that came due; forget grant horizons that passed."""
        for held in self.quarantine.take_due(now):
            self._free(held.locations, held.size)
        if self.horizon:
            self.horizon = {k: t for k, t in self.horizon.items() if t + GRACE_S >= now}

    def evict(self, keys: list[str], now: float) -> None:
        for key in keys:
            for loc in self.drop(key, now):
                self.tier_counters[self.tier_of(loc), "evictions"] += 1
        self.counters["evictions"] += len(keys)

    def revoke(self, key: str, now: float) -> None:
        """PENDING -> ABSENT. Its space waits for its write grants to expire, unless every one of
        them was LOCAL (no daemon would take it)."""
        put = self.index.abandon(key)
        grants_until = put.grant_until_ms / 1000 if put.checked else 0.0
        self.release(self.live(put.locations), put.size, now, grants_until, {})
        self.counters["revoked_puts"] += 1

    def take_changes(self) -> Changes:
        """The records of every key, pin and segment changed since the last call, as they are now
        (None where gone); the change sets are emptied."""
        changes = Changes()
        for key in self.changed_keys:
            entry = self.index.get(key)
            if entry is None:
                changes.objects[key] = None
                continue
            wanted = max(len(entry.replicas()), self.under_replicated.get(key, 0))
            changes.objects[key] = encode_object(ObjectRecord(entry.size, entry.checksum, wanted, entry.replicas()))
        for key in self.changed_pins:
            until = self.pins.until(key)
            changes.pins[key] = encode_pin(until) if until else None
        for segment_id in self.changed_segments:
            seg = self.segments.get(segment_id)
            changes.segments[segment_id] = encode_segment(SegmentRecord(seg.number, seg.info)) if seg else None
        self.changed_keys, self.changed_pins, self.changed_segments = set(), set(), set()
        changes.tenants = self.tenants.take_changes()
        changes.holds = self.segments.holds.take_changes()
        return changes

    def unmount(self, seg: Segment) -> int:
        """Forget a segment and every replica in it; returns how many objects lost a replica."""
        dropped = self.drop_segment_replicas(seg)
        self.segments.unmount(seg.segment_id)
        if self.tracking:
            self.changed_segments.add(seg.segment_id)
        return dropped

    def live(self, locations: tuple[int, ...]) -> tuple[int, ...]:
        """The locations whose segment is still mounted (numbers are never reused)."""
        return tuple(loc for loc in locations if self.segments.has_number(unpack_location(loc)[0]))

    def drop_segment_replicas(self, seg: Segment) -> int:
        """Forget every replica in `seg` (its space goes with the segment); objects left with no
        replica are gone, those left with fewer are under-replicated. A put in progress keeps its
        locations (its writer reports replicas by position); the dead ones are skipped when it
        ends. Returns how many stored objects lost a replica."""

        def in_seg(loc: int) -> bool:
            return unpack_location(loc)[0] == seg.number

        self.quarantine.forget_segment(in_seg)
        affected = list(self.index.least_recent_in((seg.number,)))  # O(the segment's keys)
        for key, entry in affected:
            locs = entry.replicas()
            keep = tuple(loc for loc in locs if not in_seg(loc))
            self.tier_counters[seg.info.tier, "blocks"] -= len(locs) - len(keep)
            self.tenants.count(key, seg.info.tier, len(keep) - len(locs), entry.size)
            for _ in range(len(locs) - len(keep)):
                self.events.removed((key,), seg.info.tier)
            if self.tracking:
                self.changed_keys.add(key)
            if keep:
                self.index.set_replicas(key, keep)
                self.under_replicated[key] = max(self.under_replicated.get(key, 0), len(locs))
                continue
            self.index.remove(key)
            self.leases.release(key)
            self.pins.release(key)
            self.moving.pop(key, None)
            self.under_replicated.pop(key, None)
            self.horizon.pop(key, None)
        return len(affected)
