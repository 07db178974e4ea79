"""The metadata service's settings (`kvstore meta`, and the service half of `kvstore serve`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvstore.config.common import DEFAULT_META_PORT, SECRET_ENV, limits, require, require_tls
from kvstore.config.tierspec import parse_tiers
from kvstore.connlimit import Limits
from kvstore.shards import ShardSpec
from kvstore.types import Tier

EVICTIONS = ("lru", "arc")  # kvstore/meta/eviction.py
ADMISSIONS = ("all", "reused")  # kvstore/meta/admission.py
DEMOTED_INTO = (Tier.DRAM, Tier.SSD)  # the tiers an admission applies to: nothing is demoted into GPU


@dataclass(frozen=True)
class MetaConfig:
    SECTION: ClassVar[str] = "meta"
    ENV: ClassVar[dict[str, str]] = {"secret": SECRET_ENV}

    host: str = "127.0.0.1"  # address to listen on
    port: int = DEFAULT_META_PORT  # gRPC port (0: any free port)
    secret: str = ""  # grant key shared by the service and every daemon
    lease_ttl_s: float = 5.0  # read lease: blocks a get returned are not evicted/moved
    put_lease_ttl_s: float = 30.0  # an unfinished put is revoked after this
    write_grant_ttl_s: float = 10.0  # a put's bytes must be written this soon after PutStart
    suspect_ttl_s: float = 10.0  # a daemon a client saw fail gets no new blocks for this long
    heartbeat_ttl_s: float = 10.0  # a daemon silent this long has its segments set aside (not read, not placed)
    # ...and this much longer, its DRAM and GPU segments are dropped with their replicas (SSD ones at
    # once: its journal announces them again). 0: dropped at once, acknowledged DRAM puts with them.
    silent_grace_s: float = 60.0
    high_watermark: float = 0.95  # DRAM: start evicting (or demoting) past used/capacity
    low_watermark: float = 0.85  # DRAM: stop evicting (or demoting) once below this
    ssd_high_watermark: float = 0.95  # SSD: delete least recently used blocks past this
    ssd_low_watermark: float = 0.90  # SSD: stop deleting once below this
    # Which blocks go first, per tier: lru | arc (fewer misses on the Mooncake traces), one for every
    # tier or TIER=NAME items (`lru,ssd=arc`); docs/traces.md.
    eviction: str = "lru"
    # Which blocks DRAM and SSD take when the tier above demotes them: all | reused (read since
    # stored), for both or TIER=NAME items (`ssd=reused`); puts are always admitted. docs/traces.md.
    admission: str = "all"
    promote_after_hits: int = 2  # reads of an SSD-resident block that bring it back to DRAM
    pin_cap: float = 0.5  # share of a tier's capacity that pins may hold
    move_timeout_s: float = 30.0  # a claimed tier move not reported by then is abandoned
    tick_interval_s: float = 0.5  # upkeep (expiry, eviction) runs this often
    workers: int = 8  # gRPC worker threads
    fast_lane: bool = True  # also serve the hot calls over a plain socket (fastrpc)
    fast_lane_port: int = 0  # the fast lane's port (0: any free one; clients learn it from ServiceInfo)
    max_connections: int = 1024  # fast-lane connections open at once (each has a thread)
    max_connections_per_peer: int = 256  # fast-lane connections from one peer host
    idle_timeout_s: float = 600.0  # a fast-lane connection with no call for this long is closed
    header_timeout_s: float = 10.0  # a call's frame must arrive this soon after its first byte
    # The operator's faces listen on hosts of their own, never `host` (docs/security.md): loopback
    # unless told otherwise. Their writes and /debug/invariants take the admin's token.
    admin_port: int = -1  # HTTP admin face (metrics, dashboard, indexer API): -1 off, 0 any free port
    admin_host: str = "127.0.0.1"  # address the admin face listens on (an operators' network, not the tenants')
    admin_request_timeout_s: float = 10.0  # an admin connection's whole request and response must fit in this
    admin_max_connections: int = 32  # admin requests handled at once (a thread each); more are answered 503
    metrics: bool = True  # count calls, hits and tiers (served at the admin face's /metrics)
    # Durable, highly available metadata (docs/ha.md): records in Redis, a leader elected through a
    # Redis lease, standbys that answer NOT_LEADER. Empty: in memory only.
    redis_url: str = ""  # redis://HOST:PORT/DB (a Redis Cluster node works too)
    cluster: str = "default"  # names this store's records in Redis (several stores may share one)
    leader_ttl_s: float = 5.0  # the leader's lease; a standby takes over this long after it dies
    leader_renew_s: float = 1.0  # how often the lease is renewed (and standbys try to take it)
    durability: str = "everysec"  # what an acknowledged change rests on: everysec | always | replicas:N
    durability_unchecked: bool = False  # start although Redis cannot keep `durability` (stat and /metrics say so)
    advertise: str = ""  # the address other processes use to reach this service (default host:port)
    # Sharded metadata (docs/sharding.md): this service owns shard I of S of the key space.
    shard: str = ""  # I/S, e.g. 0/4 (none: the only shard)
    shard_map: str = ""  # without Redis: every shard's address by index, comma-separated ("" for this one)
    # Who may call (docs/security.md): every call carries a bearer token (a tenant's, the admin's
    # from $KVSTORE_TOKEN or the token file, or a daemon's, derived from the secret).
    auth: bool = True  # refuse calls without a known token (off: every caller is the admin; trusted networks only)
    tls_cert: str = ""  # PEM certificate (chain) of the service: gRPC and the fast lane then speak TLS only
    tls_key: str = ""  # PEM private key of tls_cert
    tls_ca: str = ""  # PEM CA bundle: callers must present a certificate it signed (mutual TLS)
    # KV events in vLLM's ZMQ format (docs/kv-events.md).
    events_port: int = -1  # KV events' PUB socket: -1 off, 0 any free port (unauthenticated: see events_host)
    events_host: str = "127.0.0.1"  # address the KV events' PUB and replay sockets listen on (operators' network)
    events_replay_port: int = -1  # replay (ROUTER) socket: -1 = events_port + 1 (any free port with 0)
    events_topic: str = ""  # the first frame of every event message (subscribers match it as a prefix)
    events_replay_batches: int = 10_000  # batches kept for replay
    events_block_size: int = 0  # the block_size events carry; the store cannot know it (0: unknown)
    # publish llm-d's KV event form as this pool's (topics kv@pool:<name>@<model>); "": vLLM's form on events_topic
    events_pool: str = ""
    indexer: bool = True  # the KV indexer API (docs/indexer.md) on the admin port, when that is on

    def __post_init__(self) -> None:
        require(0 <= self.port < 65536, f"meta port {self.port} out of range")
        require(
            0.0 < self.low_watermark < self.high_watermark <= 1.0,
            f"need 0 < low_watermark ({self.low_watermark}) < high_watermark ({self.high_watermark}) <= 1",
        )
        require(
            0.0 < self.ssd_low_watermark < self.ssd_high_watermark <= 1.0,
            "need 0 < ssd_low_watermark < ssd_high_watermark <= 1",
        )
        require(0.0 <= self.pin_cap <= 1.0, "pin_cap is a share of capacity, 0..1")
        parse_tiers(self.eviction, EVICTIONS, "lru", "eviction")  # InvalidArgument for a bad one
        parse_tiers(self.admission, ADMISSIONS, "all", "admission", DEMOTED_INTO)
        require(self.promote_after_hits >= 1, "promote_after_hits must be at least 1")
        require(
            self.durability in ("everysec", "always") or self.durability.startswith("replicas:"),
            f"durability {self.durability!r}: one of everysec, always, replicas:N",
        )
        require(0 < self.leader_renew_s < self.leader_ttl_s, "need 0 < leader_renew_s < leader_ttl_s")
        require_tls(self.tls_cert, self.tls_key, self.tls_ca)
        ShardSpec.parse(self.shard)  # InvalidArgument for a malformed one
        require(
            self.write_grant_ttl_s <= self.put_lease_ttl_s,
            f"write_grant_ttl_s ({self.write_grant_ttl_s}) must not exceed put_lease_ttl_s ({self.put_lease_ttl_s})",
        )
        for name in (
            "lease_ttl_s",
            "put_lease_ttl_s",
            "write_grant_ttl_s",
            "suspect_ttl_s",
            "heartbeat_ttl_s",
            "tick_interval_s",
            "move_timeout_s",
        ):
            require(getattr(self, name) > 0, f"{name} must be positive")
        for name in ("admin_port", "events_port", "events_replay_port"):
            require(-1 <= getattr(self, name) < 65536, f"{name} {getattr(self, name)} out of range (-1 off, 0 any)")
        require(self.silent_grace_s >= 0, "silent_grace_s must not be negative")
        require(self.admin_request_timeout_s > 0, "admin_request_timeout_s must be positive")
        require(self.admin_max_connections >= 1, "admin_max_connections must be at least 1")
        require(self.events_replay_batches >= 1, "events_replay_batches must be at least 1")
        require(self.events_block_size >= 0, "events_block_size must not be negative")
        require("@" not in self.events_pool, "events_pool must not contain '@' (llm-d splits topics on it)")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connection_limits(self) -> Limits:
        return limits(self.max_connections, self.max_connections_per_peer, self.idle_timeout_s, self.header_timeout_s)
