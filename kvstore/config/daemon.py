"""A storage daemon's settings (`kvstore daemon`, and the daemon half of `kvstore serve`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvstore.config.common import DEFAULT_META_PORT, DEFAULT_UCX_TLS, META_ENV, SECRET_ENV, limits, require, split_sizes
from kvstore.connlimit import Limits


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
    map_dram_pages: bool = True  # map all DRAM pages into the daemon at start (~0.3 s/GiB): no faults in transfers
    heartbeat_interval_s: float = 2.0  # how often the daemon tells the service it is alive
    # Opt in to mooncake, nixl and ucx (`--transports shm,mooncake,nixl,ucx,tcp`): each is served if
    # its library is installed. Not by default: Mooncake's engine and NIXL's agent listen on every
    # interface and cannot check grants (see README "Transports", docs/transports.md), and UCX adds
    # ~0.5 s to start-up.
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
        require(self.dram_size > 0, "dram_size must be positive")
        require(0 <= self.tls_port < 65536, f"tls_port {self.tls_port} out of range")
        require(bool(self.tls_cert) == bool(self.tls_key), "give tls_cert and tls_key together")
        require("tls" not in self.transports or bool(self.tls_cert), "the tls transport needs tls_cert and tls_key")
        require(-1 <= self.metrics_port < 65536, f"metrics_port {self.metrics_port} out of range (-1: off)")
        require(not self.ssd_dir or self.ssd_size >= 4096, "ssd_size must be at least 4 KiB")
        require(self.ssd_segment_size >= 4096, "ssd_segment_size must be at least 4 KiB")
        require(self.segment_size > 0, "segment_size must be positive")
        require(self.heartbeat_interval_s > 0, "heartbeat_interval_s must be positive")
        require(0 <= self.tcp_port < 65536, f"tcp_port {self.tcp_port} out of range")
        require(len(self.transports) > 0, "at least one transport is needed")
        require(bool(self.mooncake_protocol), "mooncake_protocol must name a protocol (tcp, rdma)")
        require(bool(self.ucx_tls), "ucx_tls must name UCX transports (e.g. tcp,sysv,posix,self)")

    @property
    def connection_limits(self) -> Limits:
        return limits(self.max_connections, self.max_connections_per_peer, self.idle_timeout_s, self.header_timeout_s)

    @property
    def segment_sizes(self) -> list[int]:
        return split_sizes(self.dram_size, self.segment_size)

    @property
    def ssd_segment_sizes(self) -> list[int]:
        return split_sizes(self.ssd_size, self.ssd_segment_size) if self.ssd_dir else []
