"""Listing and describing keys on the wire: kvstore.results KeyListing / KeyInfo <-> kvstore.v1 (see wire.py)."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.results import KeyInfo, KeyListing, KeyState, ReplicaInfo
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire.convert import code_from_pb, status_to_pb, tier_from_pb, tier_to_pb

_STATE_TO_PB = {KeyState.PENDING: pb.KEY_PENDING, KeyState.COMPLETE: pb.KEY_COMPLETE}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}


def listing_to_pb(listing: KeyListing) -> pb.ListKeysResponse:
    return pb.ListKeysResponse(keys=listing.keys, sizes=listing.sizes, next_cursor=listing.next_cursor)


def listing_from_pb(msg: pb.ListKeysResponse) -> KeyListing:
    if len(msg.sizes) != len(msg.keys):
        raise InvalidArgument(f"ListKeys answered {len(msg.keys)} keys but {len(msg.sizes)} sizes")
    return KeyListing(tuple(msg.keys), tuple(msg.sizes), msg.next_cursor)


def key_info_to_pb(info: KeyInfo) -> pb.KeyInfo:
    if info.state is KeyState.ABSENT:
        return pb.KeyInfo(status=status_to_pb(ErrorCode.KEY_NOT_FOUND, f"{info.key!r} is not stored"))
    return pb.KeyInfo(
        state=_STATE_TO_PB[info.state],
        size=info.size,
        checksum=info.checksum,
        replicas=[
            pb.ReplicaInfo(segment_id=r.segment_id, daemon_id=r.daemon_id, tier=tier_to_pb(r.tier))
            for r in info.replicas
        ],
        wanted_replicas=info.wanted_replicas,
        lease_ms=int(info.lease_s * 1000),
        pin_ms=int(info.pin_s * 1000),
        moving=info.moving,
    )


def key_infos_from_pb(keys: Sequence[str], msgs: Sequence[pb.KeyInfo]) -> list[KeyInfo]:
    if len(msgs) != len(keys):
        raise InvalidArgument(f"Describe of {len(keys)} keys answered {len(msgs)}")
    out = []
    for key, m in zip(keys, msgs):
        if code_from_pb(m.status.code) is not ErrorCode.OK or m.state not in _STATE_FROM_PB:
            out.append(KeyInfo(key, KeyState.ABSENT))
            continue
        replicas = tuple(ReplicaInfo(r.segment_id, r.daemon_id, tier_from_pb(r.tier)) for r in m.replicas)
        out.append(
            KeyInfo(
                key,
                _STATE_FROM_PB[m.state],
                m.size,
                m.checksum,
                replicas,
                m.wanted_replicas,
                m.lease_ms / 1000,
                m.pin_ms / 1000,
                m.moving,
            )
        )
    return out
