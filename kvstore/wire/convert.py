"""Conversions between the plain types and their protobuf messages (kvstore.v1).

Protobuf stays here: the servicer, the metadata client and everything above them see the
dataclasses of kvstore.types, kvstore.results, never a generated message.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from kvstore.errors import ErrorCode, InvalidArgument, KVStoreError, NotLeader, Unavailable, WrongShard, error_for
from kvstore.results import (
    OK,
    Block,
    GetReply,
    GetResult,
    HeartbeatReply,
    KeyResult,
    MoveOutcome,
    PutEndReply,
    PutStartReply,
    PutStartResult,
    PutWritten,
    Reserved,
    ServiceInfoReply,
)
from kvstore.shards import ShardMap
from kvstore.types import Endpoint, Grant, GrantMode, MoveKind, MoveTask, SegmentInfo, Tier
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire import packed

_TIER_TO_PB = {Tier.GPU: pb.TIER_GPU, Tier.DRAM: pb.TIER_DRAM, Tier.SSD: pb.TIER_SSD}
_TIER_FROM_PB = {v: k for k, v in _TIER_TO_PB.items()}
_CODES = frozenset(int(c) for c in ErrorCode)
ERROR_DETAIL_KEY = "kvstore-error-bin"  # gRPC trailing metadata: the ErrorDetail of a failed call


def tier_to_pb(tier: Tier) -> pb.Tier.ValueType:
    return _TIER_TO_PB[tier]


def tier_from_pb(value: int) -> Tier:
    try:
        return _TIER_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(f"unknown tier {value}") from None


def _code_to_pb(code: ErrorCode) -> pb.ErrorCode.ValueType:
    return pb.ErrorCode.ValueType(code)


def code_from_pb(value: int) -> ErrorCode:
    """An ErrorCode off the wire; a code this version does not know reads as INTERNAL."""
    return ErrorCode(value) if value in _CODES else ErrorCode.INTERNAL


# -- segments and grants ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def segment_to_pb(seg: SegmentInfo) -> pb.Segment:
    """The message for a segment; one per SegmentInfo (immutable), built once: every put and get
    reply names its segments. Callers copy it into their messages and never change it."""
    return pb.Segment(
        segment_id=seg.segment_id,
        daemon_id=seg.daemon_id,
        tier=tier_to_pb(seg.tier),
        capacity=seg.capacity,
        endpoints=[pb.Endpoint(transport=e.transport, address=e.address) for e in seg.endpoints],
        host_id=seg.host_id,
    )


def segment_from_pb(msg: pb.Segment) -> SegmentInfo:
    """The SegmentInfo of a message; one per distinct message, kept (every reply carries the
    segments its grants name, and they rarely change)."""
    return _segment_from_bytes(msg.SerializeToString())


@functools.lru_cache(maxsize=4096)
def _segment_from_bytes(data: bytes) -> SegmentInfo:
    msg = pb.Segment.FromString(data)
    return SegmentInfo(
        msg.segment_id,
        msg.daemon_id,
        tier_from_pb(msg.tier),
        msg.capacity,
        tuple(Endpoint(e.transport, e.address) for e in msg.endpoints),
        msg.host_id,
    )


def segments_by_id(msgs: Iterable[pb.Segment]) -> dict[str, SegmentInfo]:
    return {m.segment_id: segment_from_pb(m) for m in msgs}


def grant_to_pb(g: Grant) -> pb.Grant:
    return pb.Grant(
        segment_id=g.segment_id,
        offset=g.offset,
        length=g.length,
        mode=pb.GrantMode.ValueType(g.mode),
        expires_ms=g.expires_ms,
        mac=g.mac,
        flags=g.flags,
    )


def grant_from_pb(msg: pb.Grant) -> Grant:
    try:
        mode = GrantMode(msg.mode)
    except ValueError:
        raise InvalidArgument(f"unknown grant mode {msg.mode}") from None
    return Grant(msg.segment_id, msg.offset, msg.length, mode, msg.expires_ms, msg.mac, msg.flags)


# -- per-key results -------------------------------------------------------------------------------


def status_to_pb(code: ErrorCode, message: str) -> pb.Status:
    return pb.Status(code=_code_to_pb(code), message=message)


def status_error(msg: pb.Status) -> KVStoreError | None:
    """The error a per-key Status carries, or None for OK."""
    return None if msg.code == pb.OK else error_for(code_from_pb(msg.code), msg.message)


def key_results_wire(results: Iterable[KeyResult], field: int) -> bytes:
    """The results as the encoded field number `field` (repeated Status) of a response, to be
    parsed in one call: building a Status message per key costs about a microsecond in Python, and
    an OK's encoding is two constant bytes (the field's tag, an empty message)."""
    tag = _varint(field << 3 | 2)  # wire type 2: length-delimited
    ok = tag + b"\0"
    parts = []
    for r in results:
        if r.code:
            body = pb.Status(code=_code_to_pb(r.code), message=r.message).SerializeToString()
            parts.append(tag + _varint(len(body)) + body)
        else:
            parts.append(ok)
    return b"".join(parts)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key_results_from_pb(msgs: Iterable[pb.Status]) -> list[KeyResult]:
    return [KeyResult(code_from_pb(m.code), m.message) if m.code else OK for m in msgs]


def put_start_reply_to_pb(reply: PutStartReply) -> pb.PutStartResponse:
    return pb.PutStartResponse(
        results=[
            pb.PutStartResult(
                status=status_to_pb(r.code, r.message),
                replicas=[grant_to_pb(g) for g in r.grants],
                retry_after_ms=r.retry_after_ms,
            )
            for r in reply.results
        ],
        segments=[segment_to_pb(s) for s in reply.segments.values()],
    )


def put_start_reply_from_pb(msg: pb.PutStartResponse) -> PutStartReply:
    results = tuple(
        PutStartResult(
            code_from_pb(r.status.code),
            r.status.message,
            tuple(grant_from_pb(g) for g in r.replicas),
            r.retry_after_ms,
        )
        for r in msg.results
    )
    return PutStartReply(results, segments_by_id(msg.segments))


def reserved_to_pb(r: Reserved) -> pb.ReserveResponse:
    if r.code is not ErrorCode.OK or r.grant is None or r.segment is None:
        return pb.ReserveResponse(status=status_to_pb(r.code, r.message))
    return pb.ReserveResponse(
        region_id=r.region_id, grant=grant_to_pb(r.grant), segment=segment_to_pb(r.segment), alignment=r.alignment
    )


def reserved_from_pb(msg: pb.ReserveResponse) -> Reserved:
    if msg.status.code != pb.OK or not msg.HasField("grant") or not msg.HasField("segment"):
        code = code_from_pb(msg.status.code) if msg.status.code != pb.OK else ErrorCode.INTERNAL
        return Reserved(code, msg.status.message or "a region without a grant")
    return Reserved(
        region_id=msg.region_id,
        grant=grant_from_pb(msg.grant),
        segment=segment_from_pb(msg.segment),
        alignment=max(1, msg.alignment),
    )


def put_written_to_pb(written: PutWritten) -> pb.PutWritten:
    return pb.PutWritten(failed=written.failed, receipts=written.receipts)


def put_written_from_pb(msg: pb.PutWritten) -> PutWritten:
    return PutWritten(msg.failed, tuple(msg.receipts))


def put_end_reply_to_pb(reply: PutEndReply) -> pb.PutEndResponse:
    msg = pb.PutEndResponse.FromString(key_results_wire(reply.results, pb.PutEndResponse.RESULTS_FIELD_NUMBER))
    msg.replicas.extend(reply.replicas)
    return msg


def put_end_reply_from_pb(msg: pb.PutEndResponse) -> PutEndReply:
    return PutEndReply(tuple(key_results_from_pb(msg.results)), tuple(msg.replicas))


def get_reply_to_pb(reply: GetReply) -> pb.GetResponse:
    segments = [segment_to_pb(s) for s in reply.segments.values()]
    if reply.packed:
        columns = packed.pack(reply.results, reply.packed)
        return pb.GetResponse(packed=columns, segments=segments, lease_ms=reply.lease_ms)
    grant = grant_to_pb  # a message per key, for a caller that did not ask for columns
    return pb.GetResponse(  # an unset status reads as OK (code 0): most results leave it out
        results=[
            pb.GetResult(size=r.size, checksum=r.checksum, replicas=[grant(g) for g in r.grants], lease_id=r.lease_id)
            if r.code is ErrorCode.OK
            else pb.GetResult(status=status_to_pb(r.code, r.message))
            for r in reply.results
        ],
        segments=segments,
        lease_ms=reply.lease_ms,
    )


def get_reply_from_pb(msg: pb.GetResponse) -> GetReply:
    if msg.HasField("packed"):
        results = packed.unpack(msg.packed, _CODES)
    else:  # a message per key: the caller did not ask for columns, or the service predates them
        grant = grant_from_pb
        results = tuple(
            GetResult(size=r.size, checksum=r.checksum, grants=tuple(grant(g) for g in r.replicas), lease_id=r.lease_id)
            if r.status.code == pb.OK
            else GetResult(code_from_pb(r.status.code), r.status.message)
            for r in msg.results
        )
    layout = packed.MESSAGES
    if msg.HasField("packed"):
        layout = packed.ROWS if packed.is_rows(msg.packed) else packed.COLUMNS
    return GetReply(results, segments_by_id(msg.segments), msg.lease_ms, layout)


# -- daemons ---------------------------------------------------------------------------------------


def heartbeat_reply_to_pb(reply: HeartbeatReply) -> pb.HeartbeatResponse:
    return pb.HeartbeatResponse(unknown_segment_ids=reply.unknown_segment_ids, ttl_ms=reply.ttl_ms)


def heartbeat_reply_from_pb(msg: pb.HeartbeatResponse) -> HeartbeatReply:
    return HeartbeatReply(tuple(msg.unknown_segment_ids), msg.ttl_ms)


def move_to_pb(t: MoveTask) -> pb.MoveTask:
    return pb.MoveTask(
        move_id=t.move_id,
        kind=pb.MoveKind.ValueType(t.kind),
        key=t.key,
        src_segment_id=t.src_segment_id,
        src_offset=t.src_offset,
        dst_segment_id=t.dst_segment_id,
        dst_offset=t.dst_offset,
        size=t.size,
        checksum=t.checksum,
        source=grant_to_pb(t.source) if t.source is not None else None,
        source_segment=segment_to_pb(t.source_segment) if t.source_segment is not None else None,
    )


def move_from_pb(m: pb.MoveTask) -> MoveTask:
    return MoveTask(
        m.move_id, MoveKind(m.kind), m.key, m.src_segment_id, m.src_offset, m.dst_segment_id, m.dst_offset, m.size,
        m.checksum, grant_from_pb(m.source) if m.HasField("source") else None,
        segment_from_pb(m.source_segment) if m.HasField("source_segment") else None,
    )  # fmt: skip


def move_outcomes_to_pb(outcomes: Sequence[MoveOutcome]) -> list[pb.MoveResult]:
    return [pb.MoveResult(move_id=o.move_id, ok=o.ok, error=o.error) for o in outcomes]


def move_outcomes_from_pb(msgs: Iterable[pb.MoveResult]) -> list[MoveOutcome]:
    return [MoveOutcome(m.move_id, m.ok, m.error) for m in msgs]


def blocks_to_pb(blocks: Iterable[Block]) -> list[pb.AnnouncedBlock]:
    return [pb.AnnouncedBlock(key=b.key, offset=b.offset, size=b.size, checksum=b.checksum) for b in blocks]


def blocks_from_pb(msgs: Iterable[pb.AnnouncedBlock]) -> list[Block]:
    return [Block(m.key, m.offset, m.size, m.checksum) for m in msgs]


def service_info_to_pb(info: ServiceInfoReply) -> pb.ServiceInfoResponse:
    shards = info.shards
    return pb.ServiceInfoResponse(
        version=info.version,
        fast_lane_port=info.fast_lane_port,
        role=info.role,
        epoch=info.epoch,
        leader=info.leader,
        shard=info.shard,
        shards=shards.count if shards is not None else 1,
        shard_addresses=shards.addresses if shards is not None else (),
        map_epoch=shards.epoch if shards is not None else 0,
    )


def service_info_from_pb(msg: pb.ServiceInfoResponse) -> ServiceInfoReply:
    addresses = tuple(msg.shard_addresses) + ("",) * (msg.shards - len(msg.shard_addresses))  # not all known yet
    shards = ShardMap(addresses, msg.map_epoch) if msg.shards > 1 else None
    return ServiceInfoReply(msg.version, msg.fast_lane_port, msg.role, msg.epoch, msg.leader, msg.shard, shards)


# -- errors ----------------------------------------------------------------------------------------


def error_to_pb(err: KVStoreError) -> pb.ErrorDetail:
    return pb.ErrorDetail(
        code=_code_to_pb(err.code),
        message=str(err),
        leader=getattr(err, "leader", ""),
        map_epoch=getattr(err, "map_epoch", 0),
        retry_after_ms=getattr(err, "retry_after_ms", 0),
    )


def error_from_pb(msg: pb.ErrorDetail) -> KVStoreError:
    code = code_from_pb(msg.code)
    if code is ErrorCode.NOT_LEADER:
        return NotLeader(msg.message, msg.leader)
    if code is ErrorCode.WRONG_SHARD:
        return WrongShard(msg.message, msg.map_epoch)
    if code is ErrorCode.UNAVAILABLE:
        return Unavailable(msg.message, msg.retry_after_ms)
    return error_for(code, msg.message)
