"""Looking at the metadata state without changing it: statistics, and the invariants that tests
check after every step. Called under the store's lock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from kvstore.meta.segments import unpack_location
from kvstore.meta.state import MetaState
from kvstore.meta.tenants import DEFAULT_ID, tenant_of
from kvstore.meta.tiering import Tiering
from kvstore.results import DaemonStats, StoreStats, TierStats
from kvstore.types import Tier

_TIER_COUNTERS = ("blocks", "hits", "evictions", "demotions", "promotions")


def stats(st: MetaState, wall_offset: float) -> StoreStats:
    """`wall_offset`: wall clock minus monotonic clock, to show heartbeats as wall times. The
    daemons are those in service: one gone silent, its segments all set aside until it mounts them
    again or they are dropped (upkeep.drop_silent), is not listed."""
    tiers = []
    for tier in Tier:
        used, capacity = st.usage(tier)
        if capacity or st.tier_counters[tier, "blocks"]:
            counts = {name: st.tier_counters[tier, name] for name in _TIER_COUNTERS}
            tiers.append(TierStats(tier, capacity, used, **counts))
    daemons = tuple(
        DaemonStats(
            d.daemon_id,
            d.last_heartbeat + wall_offset,
            tuple(seg.info for s in sorted(d.segment_ids) if (seg := st.segments.get(s))),
            sum(seg.allocator.used for s in d.segment_ids if (seg := st.segments.get(s))),
        )
        for d in st.segments.daemons()
        if not all((seg := st.segments.get(s)) is not None and seg.set_aside for s in d.segment_ids)
    )
    segs = st.segments.segments()
    return StoreStats(
        keys=len(st.index),
        pending=st.index.pending_count,
        capacity=sum(s.allocator.capacity for s in segs),
        used=sum(s.allocator.used for s in segs),
        evictions=st.counters["evictions"],
        revoked_puts=st.counters["revoked_puts"],
        leased=len(st.leases),
        pinned=len(st.pins),
        tiers=tuple(tiers),
        daemons=daemons,
        under_replicated=len(st.under_replicated),
        quarantined_bytes=st.quarantine.bytes,
    )


def check_invariants(st: MetaState, tiering: Tiering, reserved: Iterable[tuple[int, int]] = ()) -> None:
    """Index consistent; every stored replica in a mounted segment, on distinct daemons;
    allocators agree with the index, the moves in flight, the quarantine and the space regions
    hold uncommitted (`reserved`: location, size)."""
    st.index.check_invariants()
    by_segment: dict[int, list[tuple[int, int]]] = {s.number: [] for s in st.segments.segments()}
    daemon_of = {s.number: s.daemon_id for s in st.segments.segments()}
    for key, locations, size in st.index.all_locations():
        pending = not st.index.is_complete(key)
        numbers = [unpack_location(loc)[0] for loc in locations]
        if pending:  # a put keeps its places in segments that went away; their space went too
            numbers = [n for n in numbers if n in by_segment]
        else:
            assert all(n in by_segment for n in numbers), f"{key}: replica in an unmounted segment"
        assert len({daemon_of[n] for n in numbers}) == len(numbers), f"{key}: two replicas on one daemon"
        for loc in locations:
            number, offset = unpack_location(loc)
            if number in by_segment:
                by_segment[number].append((offset, size))
    st.quarantine.check_invariants()
    held = [(loc, h.size) for h in st.quarantine for loc in h.locations]
    for loc, size in [*tiering.destinations(), *held, *reserved]:
        by_segment[unpack_location(loc)[0]].append((unpack_location(loc)[1], size))
    for seg in st.segments.segments():
        seg.allocator.check_invariants(by_segment[seg.number])
    for table in (st.leases, st.pins):
        for key in table:
            assert st.index.is_complete(key), f"lease or pin on {key!r}, which is not COMPLETE"
    for key in st.moving:
        assert st.index.is_complete(key), f"move of {key!r}, which is not COMPLETE"
    for key in st.under_replicated:
        assert st.index.is_complete(key), f"{key!r} is marked under-replicated but is not COMPLETE"
    _check_tenant_counts(st)


def _check_tenant_counts(st: MetaState) -> None:
    """Each tenant's bytes, blocks, keys and pending bytes, and each tier's blocks, agree with the
    index."""
    usage: Counter[tuple[int, Tier]] = Counter()
    blocks: Counter[tuple[int, Tier]] = Counter()
    keys: Counter[int] = Counter()
    pending: Counter[int] = Counter()
    for key, entry in st.index.least_recent():
        tenant = tenant_of(key)
        keys[tenant] += tenant != DEFAULT_ID
        for loc in entry.replicas():
            usage[tenant, st.tier_of(loc)] += entry.size
            blocks[tenant, st.tier_of(loc)] += 1
    for key, put in st.index.pending_items():
        pending[tenant_of(key)] += put.size * len(put.locations)
    for name, want, have in (
        ("bytes", usage, st.tenants.usage),
        ("blocks", blocks, st.tenants.blocks),
        ("keys", keys, st.index.tenant_keys),
        ("pending bytes", pending, st.index.tenant_pending),
    ):
        counted, found = _nonzero(have), _nonzero(want)
        assert counted == found, f"tenant {name} counted {counted}, the index says {found}"
    per_tier: Counter[Tier] = Counter()
    for (_, tier), n in blocks.items():
        per_tier[tier] += n
    counted = {tier: st.tier_counters[tier, "blocks"] for tier in Tier if st.tier_counters[tier, "blocks"]}
    assert counted == _nonzero(per_tier), f"blocks per tier counted {counted}, the index says {per_tier}"


def _nonzero(counts: Counter[Any]) -> dict[Any, int]:
    return {k: v for k, v in counts.items() if v}
