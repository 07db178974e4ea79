"""Configuration: frozen dataclasses validated on construction, built in one place.

`load_config(cls, toml_path, env, overrides)` (kvstore/configload.py) layers, lowest to highest
precedence: the dataclass defaults, a TOML file (the table named cls.SECTION), environment variables, then explicit
overrides (the CLI flags a user gave; kvstore.configflags makes one flag per field). A field's
environment variable is KVSTORE_<SECTION>_<FIELD>, except the settings several parts share,
which have one name everywhere (cls.ENV: KVSTORE_SECRET, KVSTORE_META). Values from TOML and env
are converted to the field's declared type. A new field gets its TOML key, env variable and flag
from its declaration alone; the comment on its line is its help text.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from dataclasses import dataclass
from typing import ClassVar

from kvstore.configload import (  # re-exported: callers load settings through this module
    convert_value,
    env_name,
    field_types,
    load_config,
    parse_size,
    read_toml,
    section_of,
)
from kvstore.connlimit import Limits
from kvstore.errors import InvalidArgument
from kvstore.shards import ShardSpec
from kvstore.tokens import TOKEN_ENV as TOKEN_ENV  # a client's bearer token, read by kvstore.tokens

__all__ = [
    "ClientConfig",
    "DaemonConfig",
    "MetaConfig",
    "convert_value",
    "env_name",
    "field_types",
    "load_config",
    "parse_size",
    "random_secret",
    "read_toml",
    "resolve_secret",
    "section_of",
]

DEFAULT_META_PORT = 50051
# UCX over tcp only. Its shared-memory transports are 4-6x faster on one host (where kvstore's own shm
# transport is preferred anyway) but a peer killed mid-transfer can wedge the survivor's UCX worker
# (sysv, posix), or abort the survivor (cma): see kvstore/transport/ucx_client.py.
DEFAULT_UCX_TLS = "tcp,self"
# Used only when no secret is configured; kvstore warns loudly whenever it is in effect.
INSECURE_DEV_SECRET = "kvstore-insecure-development-secret"
# Settings that several parts share have one environment name, whatever the section.
SECRET_ENV = "KVSTORE_SECRET"
META_ENV = "KVSTORE_META"


def _require_tls(cert: str, key: str, ca: str) -> None:
    _require(bool(cert) == bool(key), "give tls_cert and tls_key together")
    _require(not ca or bool(cert), "tls_ca (mutual TLS) needs tls_cert and tls_key: the service speaks TLS first")


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidArgument(message)


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
    heartbeat_ttl_s: float = 10.0  # a daemon silent this long loses its segments
    high_watermark: float = 0.95  # DRAM: start evicting (or demoting) past used/capacity
    low_watermark: float = 0.85  # DRAM: stop evicting (or demoting) once below this
    ssd_high_watermark: float = 0.95  # SSD: delete least recently used blocks past this
    ssd_low_watermark: float = 0.90  # SSD: stop deleting once below this
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
    indexer: bool = True  # the KV indexer API (docs/indexer.md) on the admin port, when that is on

    def __post_init__(self) -> None:
        _require(0 <= self.port < 65536, f"meta port {self.port} out of range")
        _require(
            0.0 < self.low_watermark < self.high_watermark <= 1.0,
            f"need 0 < low_watermark ({self.low_watermark}) < high_watermark ({self.high_watermark}) <= 1",
        )
        _require(
            0.0 < self.ssd_low_watermark < self.ssd_high_watermark <= 1.0,
            "need 0 < ssd_low_watermark < ssd_high_watermark <= 1",
        )
        _require(0.0 <= self.pin_cap <= 1.0, "pin_cap is a share of capacity, 0..1")
        _require(self.promote_after_hits >= 1, "promote_after_hits must be at least 1")
        _require(
            self.durability in ("everysec", "always") or self.durability.startswith("replicas:"),
            f"durability {self.durability!r}: one of everysec, always, replicas:N",
        )
        _require(0 < self.leader_renew_s < self.leader_ttl_s, "need 0 < leader_renew_s < leader_ttl_s")
        _require_tls(self.tls_cert, self.tls_key, self.tls_ca)
        ShardSpec.parse(self.shard)  # InvalidArgument for a malformed one
        _require(
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
            _require(getattr(self, name) > 0, f"{name} must be positive")
        for name in ("admin_port", "events_port", "events_replay_port"):
            _require(-1 <= getattr(self, name) < 65536, f"{name} {getattr(self, name)} out of range (-1 off, 0 any)")
        _require(self.admin_request_timeout_s > 0, "admin_request_timeout_s must be positive")
        _require(self.admin_max_connections >= 1, "admin_max_connections must be at least 1")
        _require(self.events_replay_batches >= 1, "events_replay_batches must be at least 1")
        _require(self.events_block_size >= 0, "events_block_size must not be negative")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connection_limits(self) -> Limits:
        return _limits(self.max_connections, self.max_connections_per_peer, self.idle_timeout_s, self.header_timeout_s)


@dataclass(frozen=True)
class DaemonConfig:
    SECTION: ClassVar[str] = "daemon"
    ENV: ClassVar[dict[str, str]] = {"secret": SECRET_ENV, "meta_address": META_ENV}

    meta_address: str = f"127.0.0.1:{DEFAULT_META_PORT}"  # the metadata service to offer memory to
    host: str = "127.0.0.1"  # address the data plane listens on
    tcp_port: int = 0  # tcp transport's port (0: any free port)
    daemon_id: str = ""  # this daemon's name (none: generated, unique per start)
    secret: str = ""  # grant key shared with the metadata service
    dram_size: int = 1 << 30  # bytes of DRAM this daemon offers
    segment_size: int = 256 << 20  # DRAM is offered as segments of this size
    shm_dir: str = "/dev/shm"  # where DRAM segment files live (removed at stop)
    heartbeat_interval_s: float = 2.0  # how often the daemon tells the service it is alive
    # Opt in to mooncake and ucx (`--transports shm,mooncake,ucx,tcp`): each is served if its library
    # is installed. Not by default: Mooncake's engine listens on every interface and cannot check
    # grants (see README "Transports"), and UCX adds ~0.5 s to start-up.
    transports: tuple[str, ...] = ("shm", "tcp")
    mooncake_protocol: str = "tcp"  # Mooncake Transfer Engine protocol: tcp, or rdma in production
    mooncake_device: str = ""  # its device names, e.g. "mlx5_0,mlx5_1" for rdma
    ucx_tls: str = DEFAULT_UCX_TLS  # UCX transports the daemon serves over
    ssd_dir: str = ""  # directory of the SSD tier's files (none: no SSD tier)
    ssd_size: int = 4 << 30  # bytes of disk offered in ssd_dir
    ssd_segment_size: int = 1 << 30  # the SSD tier is offered as files of this size
    gpu_size: int = 0  # bytes of GPU memory to offer (0: no GPU tier)
    gpu_device: int = 0  # CUDA device index of the GPU tier
    move_poll_s: float = 0.05  # how often an idle daemon asks for tier moves
    move_batch_bytes: int = 64 << 20  # bytes of tier moves claimed at once
    max_connections: int = 1024  # data-plane (tcp) connections open at once (each has a thread)
    max_connections_per_peer: int = 256  # data-plane connections from one peer host
    idle_timeout_s: float = 600.0  # a connection with no request for this long is closed
    header_timeout_s: float = 10.0  # a request's header and grants must arrive this soon after it starts
    # TLS: the "tls" transport (tcp in TLS, `--transports shm,tls`) serves with tls_cert; the same
    # certificate is this daemon's identity to a service that asks for one (mutual TLS).
    tls_port: int = 0  # the tls transport's port (0: any free port)
    tls_cert: str = ""  # PEM certificate (chain) of this daemon
    tls_key: str = ""  # PEM private key of tls_cert
    tls_ca: str = ""  # PEM CA bundle (or the service's own certificate) the metadata service is checked against
    metrics_port: int = -1  # HTTP /metrics of this daemon: -1 off, 0 any free port
    metrics_host: str = "127.0.0.1"  # address /metrics listens on (an operators' network, reachable by the service)

    def __post_init__(self) -> None:
        _require(self.dram_size > 0, "dram_size must be positive")
        _require(0 <= self.tls_port < 65536, f"tls_port {self.tls_port} out of range")
        _require(bool(self.tls_cert) == bool(self.tls_key), "give tls_cert and tls_key together")
        _require("tls" not in self.transports or bool(self.tls_cert), "the tls transport needs tls_cert and tls_key")
        _require(-1 <= self.metrics_port < 65536, f"metrics_port {self.metrics_port} out of range (-1: off)")
        _require(not self.ssd_dir or self.ssd_size >= 4096, "ssd_size must be at least 4 KiB")
        _require(self.ssd_segment_size >= 4096, "ssd_segment_size must be at least 4 KiB")
        _require(self.segment_size > 0, "segment_size must be positive")
        _require(self.heartbeat_interval_s > 0, "heartbeat_interval_s must be positive")
        _require(0 <= self.tcp_port < 65536, f"tcp_port {self.tcp_port} out of range")
        _require(len(self.transports) > 0, "at least one transport is needed")
        _require(bool(self.mooncake_protocol), "mooncake_protocol must name a protocol (tcp, rdma)")
        _require(bool(self.ucx_tls), "ucx_tls must name UCX transports (e.g. tcp,sysv,posix,self)")

    @property
    def connection_limits(self) -> Limits:
        return _limits(self.max_connections, self.max_connections_per_peer, self.idle_timeout_s, self.header_timeout_s)

    @property
    def segment_sizes(self) -> list[int]:
        return split_sizes(self.dram_size, self.segment_size)

    @property
    def ssd_segment_sizes(self) -> list[int]:
        return split_sizes(self.ssd_size, self.ssd_segment_size) if self.ssd_dir else []


def _limits(total: int, per_peer: int, idle_s: float, header_s: float) -> Limits:
    try:
        return Limits(total, per_peer, idle_s, header_s)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from exc


def split_sizes(total: int, piece: int) -> list[int]:
    """`total` bytes as segments of `piece` (a last, smaller one if it is at least 4 KiB)."""
    full, rest = divmod(total, piece)
    return [piece] * full + ([rest] if rest >= 4096 else [])


@dataclass(frozen=True)
class ClientConfig:
    SECTION: ClassVar[str] = "client"

    replica_num: int = 1  # replicas of each put, on distinct daemons
    # Preference order; those whose library is not installed are skipped.
    transports: tuple[str, ...] = ("shm", "mooncake", "ucx", "tcp", "tls")
    timeout_s: float = 10.0  # metadata RPCs and each data-plane transfer
    # A transfer from (or to) a replica that has another behind it gets replica_timeout_s plus its
    # bytes at transfer_floor_gbps, then the next replica is tried: a stopped daemon costs that.
    replica_timeout_s: float = 2.0  # plus the bytes at transfer_floor_gbps: then the next replica is tried
    transfer_floor_gbps: float = 0.1  # the slowest transfer rate counted on before trying the next replica
    verify_checksums: bool = True  # check each read's xxh3 (reads from cached locations always are)
    fast_lane: bool = True  # use the service's fast lane when it has one
    # Keys whose location the client keeps after reading them (kvstore/client/locations.py), so a
    # read of one again needs no metadata call; 0 turns the cache off. An entry lives until its
    # grants (the service's read lease) are about to expire, and at most location_cache_ttl_s.
    location_cache_entries: int = 65536
    location_cache_ttl_s: float = 5.0  # a cached location is used at most this long
    # Values up to region_value_max bytes, put over shm, go into a region this client reserved in
    # advance (kvstore/client/regions.py): one metadata call per put instead of two. A region
    # grows to region_bytes; reserved space counts as used until committed or handed back.
    region_bytes: int = 4 << 20  # 0: no regions
    region_value_max: int = 256 << 10  # larger values take the PutStart path
    mooncake_device: str = ""  # rdma device names for this client's engine
    ucx_tls: str = DEFAULT_UCX_TLS  # UCX transports this client uses
    staging_bytes: int = 256 << 20  # pinned host memory a call stages CUDA tensors through at once (more: chunks)
    # Who this client is, and how it checks whom it talks to (docs/security.md).
    token: str = dataclasses.field(default="", repr=False)  # bearer token (none: $KVSTORE_TOKEN, else the token file)
    tls_ca: str = ""  # PEM CA bundle, or the service's own certificate (pinned): speak TLS, checking it
    tls_cert: str = ""  # PEM certificate of this client, for a service that asks for one (mutual TLS)
    tls_key: str = ""  # PEM private key of tls_cert
    tls_server_name: str = ""  # the name the service's certificate must carry (default: the host dialled)
    metrics: bool = True  # count transfers and measure links (KVClient.metrics, KVClient.links())
    link_probe_s: float = 0.0  # active link probe period over tcp; 0: measure real transfers only

    def __post_init__(self) -> None:
        _require(self.replica_num >= 1, "replica_num must be at least 1")
        _require(self.staging_bytes > 0, "staging_bytes must be positive")
        _require(self.link_probe_s >= 0, "link_probe_s must not be negative")
        _require(self.timeout_s > 0, "timeout_s must be positive")
        _require(self.replica_timeout_s > 0, "replica_timeout_s must be positive")
        _require(self.transfer_floor_gbps > 0, "transfer_floor_gbps must be positive")
        _require(self.location_cache_entries >= 0, "location_cache_entries must be 0 (off) or more")
        _require(self.location_cache_ttl_s > 0, "location_cache_ttl_s must be positive")
        _require(self.region_bytes >= 0 and self.region_value_max >= 0, "region sizes must be 0 (off) or more")
        _require(len(self.transports) > 0, "at least one transport is needed")
        _require(bool(self.ucx_tls), "ucx_tls must name UCX transports (e.g. tcp,sysv,posix,self)")

    def transfer_budget_s(self, nbytes: int) -> float:
        """How long a transfer of `nbytes` to or from one replica may take before the next
        replica is tried."""
        return self.replica_timeout_s + nbytes / (self.transfer_floor_gbps * 1e9)


def resolve_secret(configured: str) -> tuple[bytes, bool]:
    """(secret bytes, is_insecure_default): the configured secret, else $KVSTORE_SECRET, else the
    development default."""
    secret = configured or os.environ.get(SECRET_ENV, "")
    if secret:
        return secret.encode(), False
    return INSECURE_DEV_SECRET.encode(), True


def random_secret() -> str:
    return secrets.token_hex(16)
