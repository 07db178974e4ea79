"""What metadata calls return, as plain values: built by the metadata service, carried by the
wire format (kvstore.wire.convert), and returned to its callers (kvstore.metaclient.client) unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import NamedTuple

from kvstore.errors import ErrorCode, KVStoreError, error_for
from kvstore.shards import ShardMap
from kvstore.types import Grant, SegmentInfo, Tier


@dataclass(frozen=True)
class KeyResult:
    """The outcome of a call for one key."""

    code: ErrorCode = ErrorCode.OK
    message: str = ""

    @classmethod
    def of(cls, err: KVStoreError) -> KeyResult:
        return cls(err.code, str(err))

    def error(self) -> KVStoreError | None:
        """The typed error this result carries, or None for OK."""
        return None if self.code is ErrorCode.OK else error_for(self.code, self.message)


OK = KeyResult()


@dataclass(frozen=True)
class PutStartResult:
    """Space reserved for one key: a write grant per replica (empty unless OK)."""

    code: ErrorCode = ErrorCode.OK
    message: str = ""
    grants: tuple[Grant, ...] = ()
    retry_after_ms: int = 0  # with NO_SPACE: room is being made, retry after this long

    def error(self) -> KVStoreError | None:
        return None if self.code is ErrorCode.OK else error_for(self.code, self.message)


@dataclass(frozen=True)
class GetResult:
    """Where one key's replicas are, with a read grant for each and the read lease's id."""

    code: ErrorCode = ErrorCode.OK
    message: str = ""
    size: int = 0
    checksum: int = 0
    grants: tuple[Grant, ...] = ()
    lease_id: int = 0  # the reader hands it back (`released` of a later Get or Remove) when done

    def error(self) -> KVStoreError | None:
        return None if self.code is ErrorCode.OK else error_for(self.code, self.message)


def found(size: int, checksum: int, grants: tuple[Grant, ...], lease_id: int) -> GetResult:
    """GetResult(size=..., ...) of a key found, made for the hot paths as new_grant makes a Grant."""
    r: GetResult = object.__new__(GetResult)
    d = r.__dict__
    d["code"], d["message"], d["size"], d["checksum"], d["grants"], d["lease_id"] = (
        ErrorCode.OK, "", size, checksum, grants, lease_id
    )  # fmt: skip
    return r


@dataclass(frozen=True)
class PutStartReply:
    results: tuple[PutStartResult, ...]
    segments: Mapping[str, SegmentInfo] = field(default_factory=dict)  # every segment a grant names


@dataclass(frozen=True)
class Reserved:
    """A region (Reserve): space in one segment for many small values, committed one by one."""

    code: ErrorCode = ErrorCode.OK
    message: str = ""
    region_id: int = 0
    grant: Grant | None = None  # a LOCAL write grant over the whole region
    segment: SegmentInfo | None = None
    alignment: int = 1  # every value starts at a multiple of this

    def error(self) -> KVStoreError | None:
        return None if self.code is ErrorCode.OK else error_for(self.code, self.message)


@dataclass(frozen=True)
class PutWritten:
    """What a writer did with one key's replicas, in the order of its PutStart grants."""

    failed: int = 0  # bit i set: replica i was not written
    receipts: tuple[bytes, ...] = ()  # replica i's daemon receipt, or b"" (shm, mooncake, failed)


@dataclass(frozen=True)
class PutEndReply:
    results: tuple[KeyResult, ...]
    replicas: tuple[int, ...] = ()  # per key: replicas committed


@dataclass(frozen=True)
class GetReply:
    results: tuple[GetResult, ...]
    segments: Mapping[str, SegmentInfo] = field(default_factory=dict)  # every segment a grant names
    lease_ms: int = 0  # how long the read leases hold the blocks in place
    # How it travels (GetRequest.packed, kvstore.wire.packed): a message per key (0), columns (1) or
    # rows (2), as the caller asked; not part of what the reply says.
    packed: int = field(default=0, compare=False)


@dataclass(frozen=True)
class HeartbeatReply:
    unknown_segment_ids: tuple[str, ...]  # not mounted (the service restarted, or gave the daemon up)
    ttl_ms: int  # a daemon silent this long loses its segments


@dataclass(frozen=True)
class ServiceInfoReply:
    version: str
    fast_lane_port: int  # 0: the service offers no fast lane
    role: str = ""  # "leader", "standby", or "" (in memory: no election)
    epoch: int = 0  # the leader's fencing epoch
    leader: str = ""  # the leader's address, as the service knows it
    shard: int = 0  # the answering service's shard
    shards: ShardMap | None = None  # with more than one shard: the map to route by


@dataclass(frozen=True)
class MoveOutcome:
    """A daemon's report on one tier move it claimed."""

    move_id: int
    ok: bool
    error: str = ""


class Block(NamedTuple):
    """A block a daemon holds in a persistent segment: key, place, size and checksum."""

    key: str
    offset: int
    size: int
    checksum: int


@dataclass(frozen=True)
class KeyListing:
    """One page of ListKeys: complete keys in byte order, their sizes, and where the next page
    starts ("" when there is none)."""

    keys: tuple[str, ...]
    sizes: tuple[int, ...]
    next_cursor: str = ""


class KeyState(Enum):
    ABSENT = "absent"
    PENDING = "pending"  # being written: between PutStart and PutEnd
    COMPLETE = "complete"


@dataclass(frozen=True)
class ReplicaInfo:
    segment_id: str
    daemon_id: str
    tier: Tier


@dataclass(frozen=True)
class KeyInfo:
    """What the service knows of one key (Describe); an ABSENT key has nothing else."""

    key: str
    state: KeyState
    size: int = 0
    checksum: int = 0
    replicas: tuple[ReplicaInfo, ...] = ()
    wanted_replicas: int = 0  # replicas it was put with, when it has fewer now
    lease_s: float = 0.0  # a read lease holds it this much longer
    pin_s: float = 0.0  # a pin holds it this much longer
    moving: bool = False  # a tier move or copy is in flight

    @property
    def tiers(self) -> tuple[Tier, ...]:
        return tuple(dict.fromkeys(r.tier for r in self.replicas))


@dataclass(frozen=True)
class TenantInfo:
    """A tenant as the admin sees it (TenantList), or the settings of one to add (TenantAdd)."""

    name: str
    id: int = 0
    quotas: dict[Tier, int] = field(default_factory=dict)  # most bytes per tier (absent: no quota)
    reserved: dict[Tier, int] = field(default_factory=dict)  # bytes per tier others cannot evict
    evict_own: bool = True  # over quota: its own least recently used blocks go first (else refused)
    trust_shm: bool = False  # offered shm and mooncake (transports that check no grant per range)
    admin: bool = False  # its tokens may manage tenants and daemons too
    tokens: tuple[tuple[str, float, float], ...] = ()  # (token id, unix time made, expires or 0)
    used: dict[Tier, int] = field(default_factory=dict)  # bytes it holds per tier
    keys: int = 0

    def share(self, count: int) -> TenantInfo:
        """This tenant with each of `count` shards' share of its quotas and reserves (rounded up:
        no share is 0)."""
        return replace(
            self,
            quotas={t: -(-n // count) for t, n in self.quotas.items()},
            reserved={t: -(-n // count) for t, n in self.reserved.items()},
        )


# -- store statistics: built by the metadata service (Stats), returned by the client --------------------


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
