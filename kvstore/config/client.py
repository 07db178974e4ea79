"""A client's settings (KVClient, the engine integrations)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from kvstore.config.common import DEFAULT_UCX_TLS, require


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
    # A new tcp/tls connection to a daemon that is not made within this long fails: a daemon cut off
    # from this client costs a put or get this much, not the call's whole timeout_s.
    connect_timeout_s: float = 1.0
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
        require(self.replica_num >= 1, "replica_num must be at least 1")
        require(self.staging_bytes > 0, "staging_bytes must be positive")
        require(self.link_probe_s >= 0, "link_probe_s must not be negative")
        require(self.timeout_s > 0, "timeout_s must be positive")
        require(self.replica_timeout_s > 0, "replica_timeout_s must be positive")
        require(self.connect_timeout_s > 0, "connect_timeout_s must be positive")
        require(self.transfer_floor_gbps > 0, "transfer_floor_gbps must be positive")
        require(self.location_cache_entries >= 0, "location_cache_entries must be 0 (off) or more")
        require(self.location_cache_ttl_s > 0, "location_cache_ttl_s must be positive")
        require(self.region_bytes >= 0 and self.region_value_max >= 0, "region sizes must be 0 (off) or more")
        require(len(self.transports) > 0, "at least one transport is needed")
        require(bool(self.ucx_tls), "ucx_tls must name UCX transports (e.g. tcp,sysv,posix,self)")

    def transfer_budget_s(self, nbytes: int) -> float:
        """How long a transfer of `nbytes` to or from one replica may take before the next
        replica is tried."""
        return self.replica_timeout_s + nbytes / (self.transfer_floor_gbps * 1e9)
