"""Conversions between the plain types and their protobuf messages (kvstore.v1)."""

from __future__ import annotations

from typing import Iterable

from kvstore.errors import ErrorCode, KVStoreError, error_for
from kvstore.stats import DaemonStats, StoreStats, TierStats
from kvstore.types import Endpoint, Grant, GrantMode, MoveKind, MoveTask, SegmentInfo, Tier
from kvstore.v1 import meta_pb2 as pb

_TIER_TO_PB = {Tier.GPU: pb.TIER_GPU, Tier.DRAM: pb.TIER_DRAM, Tier.SSD: pb.TIER_SSD}
_TIER_FROM_PB = {v: k for k, v in _TIER_TO_PB.items()}


def tier_to_pb(tier: Tier) -> int:
    return _TIER_TO_PB[tier]


def tier_from_pb(value: int) -> Tier:
    try:
        return _TIER_FROM_PB[value]
    except KeyError:
        from kvstore.errors import InvalidArgument
        raise InvalidArgument(f"unknown tier {value}") from None


def segment_to_pb(seg: SegmentInfo) -> pb.Segment:
    return pb.Segment(segment_id=seg.segment_id, daemon_id=seg.daemon_id, tier=tier_to_pb(seg.tier),
                      capacity=seg.capacity,
                      endpoints=[pb.Endpoint(transport=e.transport, address=e.address) for e in seg.endpoints])


def segment_from_pb(msg: pb.Segment) -> SegmentInfo:
    return SegmentInfo(msg.segment_id, msg.daemon_id, tier_from_pb(msg.tier), msg.capacity,
                       tuple(Endpoint(e.transport, e.address) for e in msg.endpoints))


def grant_to_pb(g: Grant) -> pb.Grant:
    return pb.Grant(segment_id=g.segment_id, offset=g.offset, length=g.length, mode=int(g.mode),
                    expires_ms=g.expires_ms, mac=g.mac)


def grant_from_pb(msg: pb.Grant) -> Grant:
    return Grant(msg.segment_id, msg.offset, msg.length, GrantMode(msg.mode), msg.expires_ms, msg.mac)


def status_to_pb(code: ErrorCode, message: str) -> pb.Status:
    return pb.Status(code=int(code), message=message)


def status_error(msg: pb.Status) -> KVStoreError | None:
    """The error a per-key Status carries, or None for OK."""
    return None if msg.code == ErrorCode.OK else error_for(msg.code, msg.message)


def segments_by_id(msgs: Iterable[pb.Segment]) -> dict[str, SegmentInfo]:
    return {m.segment_id: segment_from_pb(m) for m in msgs}


def stats_to_pb(s: StoreStats) -> pb.StatsResponse:
    return pb.StatsResponse(
        keys=s.keys, pending=s.pending, capacity=s.capacity, used=s.used, evictions=s.evictions,
        revoked_puts=s.revoked_puts, leased=s.leased, pinned=s.pinned,
        tiers=[pb.TierStats(tier=tier_to_pb(t.tier), capacity=t.capacity, used=t.used, blocks=t.blocks,
                            hits=t.hits, evictions=t.evictions, demotions=t.demotions,
                            promotions=t.promotions) for t in s.tiers],
        daemons=[pb.DaemonInfo(daemon_id=d.daemon_id, last_heartbeat_ms=int(d.last_heartbeat * 1000),
                               segments=[segment_to_pb(x) for x in d.segments]) for d in s.daemons])


def stats_from_pb(msg: pb.StatsResponse) -> StoreStats:
    return StoreStats(
        keys=msg.keys, pending=msg.pending, capacity=msg.capacity, used=msg.used, evictions=msg.evictions,
        revoked_puts=msg.revoked_puts, leased=msg.leased, pinned=msg.pinned,
        tiers=tuple(TierStats(tier_from_pb(t.tier), t.capacity, t.used, t.blocks, t.hits, t.evictions,
                              t.demotions, t.promotions) for t in msg.tiers),
        daemons=tuple(DaemonStats(d.daemon_id, d.last_heartbeat_ms / 1000,
                                  tuple(segment_from_pb(s) for s in d.segments)) for d in msg.daemons))


def move_to_pb(t: MoveTask) -> pb.MoveTask:
    return pb.MoveTask(move_id=t.move_id, kind=int(t.kind), key=t.key, src_segment_id=t.src_segment_id,
                       src_offset=t.src_offset, dst_segment_id=t.dst_segment_id, dst_offset=t.dst_offset,
                       size=t.size, checksum=t.checksum)


def move_from_pb(m: pb.MoveTask) -> MoveTask:
    return MoveTask(m.move_id, MoveKind(m.kind), m.key, m.src_segment_id, m.src_offset, m.dst_segment_id,
                    m.dst_offset, m.size, m.checksum)
