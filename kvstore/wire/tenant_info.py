"""Tenants on the wire: kvstore.results.TenantInfo <-> kvstore.v1 TenantInfo (see wire.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvstore.results import TenantInfo
from kvstore.types import Tier
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire.convert import tier_from_pb, tier_to_pb


def _bytes_to_pb(table: Mapping[Tier, int]) -> list[pb.TierBytes]:
    return [pb.TierBytes(tier=tier_to_pb(t), bytes=n) for t, n in sorted(table.items(), key=lambda i: i[0].value)]


def _bytes_from_pb(items: Iterable[pb.TierBytes]) -> dict[Tier, int]:
    return {tier_from_pb(i.tier): i.bytes for i in items}


def tenant_to_pb(t: TenantInfo) -> pb.TenantInfo:
    return pb.TenantInfo(
        name=t.name,
        id=t.id,
        quotas=_bytes_to_pb(t.quotas),
        reserved=_bytes_to_pb(t.reserved),
        evict_own=t.evict_own,
        trust_shm=t.trust_shm,
        admin=t.admin,
        tokens=[
            pb.TokenInfo(token_id=i, created_ms=int(made * 1000), expires_ms=int(until * 1000))
            for i, made, until in t.tokens
        ],
        used=_bytes_to_pb(t.used),
        keys=t.keys,
    )


def tenant_from_pb(m: pb.TenantInfo) -> TenantInfo:
    return TenantInfo(
        name=m.name,
        id=m.id,
        quotas=_bytes_from_pb(m.quotas),
        reserved=_bytes_from_pb(m.reserved),
        evict_own=m.evict_own,
        trust_shm=m.trust_shm,
        admin=m.admin,
        tokens=tuple((t.token_id, t.created_ms / 1000, t.expires_ms / 1000) for t in m.tokens),
        used=_bytes_from_pb(m.used),
        keys=m.keys,
    )
