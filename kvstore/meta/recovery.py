"""A service that takes over loads the journal's records into an empty MetaState.

Every segment comes back unconfirmed: nothing is read from it, nothing is placed in it, until
its daemon mounts it again (a daemon that outlived the old leader does so on its next heartbeat,
which answers that the segment is unknown). Segments never mounted again within the reconcile
window are dropped with their replicas (MetaStore.tick). Each object's ranges are reserved in
its segments' allocators, so space the journal says is used is never handed out; a record
naming a segment that is gone, or a range that another record claims, loses that replica (and
the object, with its last one). Pins come back with their deadline; leases, puts in progress
and LRU order do not. Whatever the predecessor held outside its objects (holds.py: puts in
progress, regions, moves' destinations, quarantined space) and no object took is reserved and
quarantined until `hold_until`, when no grant the predecessor signed can reach it any more; the
rest of the free space can be handed out at once.

A record that cannot be read (it does not decode, names no valid tenant, or a segment no daemon
could have mounted) is skipped, logged and counted (`Restored.unreadable`), never raised: one bad
record must not keep every service from leading. It stays in the journal, for an operator to
look at; the space it claimed is not reserved, since nothing can be served from it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

from kvstore.errors import InvalidArgument
from kvstore.meta.holds import HoldRecord
from kvstore.meta.records import ObjectRecord, SegmentRecord, Unreadable
from kvstore.meta.segments import pack_location, unpack_location
from kvstore.meta.state import MetaState
from kvstore.meta.tenants import Tenant, check_name

log = logging.getLogger(__name__)
_NAMED = 20  # unreadable records logged one by one; past that, only counted


class Restored(NamedTuple):
    segments: int
    objects: int
    replicas_dropped: int  # records naming a missing segment or a range taken twice
    objects_dropped: int
    unreadable: int = 0  # records skipped because they could not be read (each logged)
    held: int = 0  # bytes the predecessor held outside its objects, quarantined until its grants expire


class _Skipped:
    """Counts (and logs) the records a restore skips."""

    def __init__(self) -> None:
        self.count = 0

    def skip(self, record: Unreadable) -> None:
        self.count += 1
        if self.count <= _NAMED:
            log.error("restore: skipped the unreadable %s record %r: %s", record.table, record.key, record.why)


def restore(
    st: MetaState,
    segments: Iterable[SegmentRecord | Unreadable],
    objects: Iterable[tuple[str, ObjectRecord] | Unreadable],
    pins: Iterable[tuple[str, float] | Unreadable],
    tenants: dict[str, bytes],
    now: float,
    mono: float,
    holds: Iterable[HoldRecord | Unreadable] = (),
    hold_until: float = 0.0,
) -> Restored:
    skipped = _Skipped()
    for name, data in tenants.items():
        try:
            check_name(name)
            Tenant.decode(name, data)
        except InvalidArgument as exc:
            skipped.skip(Unreadable("ten", name, str(exc)))
            continue
        st.tenants.load({name: data})
    n_segments = 0
    for seg in segments:
        if isinstance(seg, Unreadable):
            skipped.skip(seg)
            continue
        try:
            st.segments.mount(seg.info, mono, number=seg.number, confirmed=False)
        except InvalidArgument as exc:  # no capacity, no endpoint, a number taken twice
            skipped.skip(Unreadable("seg", seg.info.segment_id, str(exc)))
            continue
        n_segments += 1
    records: list[tuple[str, ObjectRecord]] = []
    for item in objects:
        if isinstance(item, Unreadable):
            skipped.skip(item)
        else:
            records.append(item)
    # Each segment's ranges are reserved together, in record order: one reserve() per replica
    # would scan the free list each time, quadratic in the blocks of a segment.
    claims: dict[int, list[tuple[int, int]]] = {}  # segment number -> (offset, size) per replica
    for _, record in records:
        for loc in record.locations:
            number, offset = unpack_location(loc)
            if st.segments.has_number(number):
                claims.setdefault(number, []).append((offset, record.size))
    reserved = {n: iter(st.segments.by_number(n).allocator.reserve_all(ranges)) for n, ranges in claims.items()}
    kept = replicas_dropped = objects_dropped = 0
    for key, record in records:
        locations = []
        for loc in record.locations:
            number = unpack_location(loc)[0]
            if number in reserved and next(reserved[number]):
                locations.append(loc)
            else:
                replicas_dropped += 1
        if not locations:
            objects_dropped += 1
            st.changed_keys.add(key)  # gone: the journal forgets it too
            continue
        st.index.insert_complete(key, tuple(locations), record.size, record.checksum)
        for loc in locations:
            st.tier_counters[st.tier_of(loc), "blocks"] += 1
            st.tenants.count(key, st.tier_of(loc), 1, record.size)
        if len(locations) < record.wanted:
            st.under_replicated[key] = record.wanted
        if len(locations) < len(record.locations):
            st.changed_keys.add(key)
        kept += 1
    held = _keep_holds(st, holds, hold_until, skipped)
    for pin in pins:
        if isinstance(pin, Unreadable):
            skipped.skip(pin)
        elif pin[1] > now and st.index.is_complete(pin[0]):
            st.pins.hold(*pin)
    if replicas_dropped:
        log.warning("restore: %d replicas named a missing segment or a range taken twice; dropped", replicas_dropped)
    if skipped.count:
        log.error("restore: %d unreadable records skipped (the first %d named above)", skipped.count, _NAMED)
    return Restored(n_segments, kept, replicas_dropped, objects_dropped, skipped.count, held)


def _keep_holds(st: MetaState, holds: Iterable[HoldRecord | Unreadable], until: float, skipped: _Skipped) -> int:
    """Reserve the free space inside the predecessor's holds (after the objects took theirs) and
    quarantine it until `until`; the records are rewritten as this store's holds. Returns bytes."""
    spans: dict[int, list[tuple[int, int]]] = {}  # segment number -> (offset, size) held
    for hold in holds:
        if isinstance(hold, Unreadable):
            skipped.skip(hold)
            continue
        st.segments.holds.replaced(hold)
        number, offset = unpack_location(hold.location)
        if st.segments.has_number(number):
            spans.setdefault(number, []).append((offset, hold.size))
    total = 0
    for number, ranges in spans.items():
        for offset, size in st.segments.by_number(number).allocator.reserve_free_within(ranges):
            location = pack_location(number, offset)
            st.segments.holds.hold(location, size)
            st.quarantine.hold((location,), size, {}, until)
            total += size
    return total
