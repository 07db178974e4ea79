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
    used: int = 0  # bytes allocated in its segments (filled in by the service; not on the wire)


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
    under_replicated: int = 0  # keys with fewer replicas than they were put with
    quarantined_bytes: int = 0  # freed space waiting until no grant or reader can touch it
    # The service that answered, and its election (on Redis; "" / 0 in memory).
    role: str = ""
    epoch: int = 0
    leader: str = ""
    standbys: tuple[str, ...] = ()
    redis: str = ""  # "ok", or the last error Redis gave (and "durability ... UNCHECKED: why" if run so)
    durability_unchecked: bool = False  # Redis cannot keep the configured durability (run with durability_unchecked)
    reconciling: int = 0  # segments loaded after a takeover, not yet mounted again
    writes_open: bool = True
    tenant: str = ""  # set when the caller is a tenant: the figures are its own keys' only
    shard: int = 0  # the answering shard (of `shards`); a sharded client's stats add every shard's
    shards: int = 1
    per_shard: tuple[StoreStats, ...] = ()  # a sharded client's: each shard's own figures
