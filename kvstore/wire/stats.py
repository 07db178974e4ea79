"""The store's statistics (Stats) to and from their message."""

from __future__ import annotations

from kvstore.results import DaemonStats, StoreStats, TierStats
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire.convert import segment_from_pb, segment_to_pb, tier_from_pb, tier_to_pb


def stats_to_pb(s: StoreStats) -> pb.StatsResponse:
    return pb.StatsResponse(
        keys=s.keys,
        pending=s.pending,
        capacity=s.capacity,
        used=s.used,
        evictions=s.evictions,
        revoked_puts=s.revoked_puts,
        leased=s.leased,
        pinned=s.pinned,
        under_replicated=s.under_replicated,
        quarantined_bytes=s.quarantined_bytes,
        role=s.role,
        epoch=s.epoch,
        leader=s.leader,
        standbys=s.standbys,
        redis=s.redis,
        reconciling=s.reconciling,
        writes_open=s.writes_open,
        tenant=s.tenant,
        shard=s.shard,
        shards=s.shards,
        tiers=[
            pb.TierStats(
                tier=tier_to_pb(t.tier),
                capacity=t.capacity,
                used=t.used,
                blocks=t.blocks,
                hits=t.hits,
                evictions=t.evictions,
                demotions=t.demotions,
                promotions=t.promotions,
            )
            for t in s.tiers
        ],
        daemons=[
            pb.DaemonInfo(
                daemon_id=d.daemon_id,
                last_heartbeat_ms=int(d.last_heartbeat * 1000),
                segments=[segment_to_pb(x) for x in d.segments],
            )
            for d in s.daemons
        ],
    )


def stats_from_pb(msg: pb.StatsResponse) -> StoreStats:
    return StoreStats(
        keys=msg.keys,
        pending=msg.pending,
        capacity=msg.capacity,
        used=msg.used,
        evictions=msg.evictions,
        revoked_puts=msg.revoked_puts,
        leased=msg.leased,
        pinned=msg.pinned,
        under_replicated=msg.under_replicated,
        quarantined_bytes=msg.quarantined_bytes,
        role=msg.role,
        epoch=msg.epoch,
        leader=msg.leader,
        standbys=tuple(msg.standbys),
        redis=msg.redis,
        reconciling=msg.reconciling,
        writes_open=msg.writes_open,
        tenant=msg.tenant,
        shard=msg.shard,
        shards=msg.shards or 1,
        tiers=tuple(
            TierStats(
                tier_from_pb(t.tier), t.capacity, t.used, t.blocks, t.hits, t.evictions, t.demotions, t.promotions
            )
            for t in msg.tiers
        ),
        daemons=tuple(
            DaemonStats(d.daemon_id, d.last_heartbeat_ms / 1000, tuple(segment_from_pb(s) for s in d.segments))
            for d in msg.daemons
        ),
    )
