"""A service that takes over loads the journal's records into an empty MetaState.

Every segment comes back unconfirmed: nothing is read from it, nothing is placed in it, until
its daemon mounts it again (a daemon that outlived the old leader does so on its next heartbeat,
which answers that the segment is unknown). Segments never mounted again within the reconcile
window are dropped with their replicas (MetaStore.tick). Each object's ranges are reserved in
its segments' allocators, so space the journal says is used is never handed out; a record
naming a segment that is gone, or a range that another record claims, loses that replica (and
the object, with its last one). Pins come back with their deadline; leases, puts in progress
and LRU order do not.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

from kvstore.meta.records import ObjectRecord, SegmentRecord
from kvstore.meta.segments import unpack_location
from kvstore.meta.state import MetaState

log = logging.getLogger(__name__)


class Restored(NamedTuple):
    segments: int
    objects: int
    replicas_dropped: int  # records naming a missing segment or a range taken twice
    objects_dropped: int


def restore(
    st: MetaState,
    segments: Iterable[SegmentRecord],
    objects: Iterable[tuple[str, ObjectRecord]],
    pins: Iterable[tuple[str, float]],
    tenants: dict[str, bytes],
    now: float,
    mono: float,
) -> Restored:
    st.tenants.load(tenants)
    n_segments = 0
    for seg in segments:
        st.segments.mount(seg.info, mono, number=seg.number, confirmed=False)
        n_segments += 1
    records = list(objects)
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
    for key, until in pins:
        if until > now and st.index.is_complete(key):
            st.pins.hold(key, until)
    if replicas_dropped:
        log.warning("restore: %d replicas named a missing segment or a range taken twice; dropped", replicas_dropped)
    return Restored(n_segments, kept, replicas_dropped, objects_dropped)
