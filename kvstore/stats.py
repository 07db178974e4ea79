"""Store statistics as plain values: built by the metadata service, returned by the client."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.types import SegmentInfo, Tier


@dataclass(frozen=True)
class TierStats:
    tier: Tier
    capacity: int = 0
    used: int = 0
    blocks: int = 0
    hits: int = 0
    evictions: int = 0
    demotions: int = 0
    promotions: int = 0


@dataclass(frozen=True)
class DaemonStats:
    daemon_id: str
    last_heartbeat: float
    segments: tuple[SegmentInfo, ...]


@dataclass(frozen=True)
class StoreStats:
    keys: int
    pending: int
    capacity: int
    used: int
    evictions: int
    revoked_puts: int
    leased: int
    pinned: int = 0
    tiers: tuple[TierStats, ...] = ()
    daemons: tuple[DaemonStats, ...] = ()
