"""Configuration: frozen dataclasses validated on construction, built in one place.

`load_config(cls, toml_path, env, overrides)` layers, lowest to highest precedence: the dataclass
defaults, a TOML file (the table named cls.SECTION), environment variables
KVSTORE_<SECTION>_<FIELD>, then explicit overrides (CLI flags). Values from TOML and env are
converted to the field's declared type.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, TypeVar

from kvstore.errors import InvalidArgument

DEFAULT_META_PORT = 50051
# UCX over tcp only. Its shared-memory transports are 4-6x faster on one host (where kvstore's own shm
# transport is preferred anyway) but a peer killed mid-transfer can wedge the survivor's UCX worker
# (sysv, posix), or abort the survivor (cma): see kvstore/transport/ucx.py.
DEFAULT_UCX_TLS = "tcp,self"
# Used only when no secret is configured; kvstore warns loudly whenever it is in effect.
INSECURE_DEV_SECRET = "kvstore-insecure-development-secret"


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidArgument(message)


def parse_size(value: str | int) -> int:
    """'64MiB', '1G', '4096' -> bytes."""
    if isinstance(value, int):
        return value
    text = value.strip().lower().replace(" ", "")
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
             "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
             "kb": 1000, "mb": 10**6, "gb": 10**9, "b": 1}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


@dataclass(frozen=True)
class MetaConfig:
    SECTION = "meta"

    host: str = "127.0.0.1"
    port: int = DEFAULT_META_PORT
    secret: str = ""
    lease_ttl_s: float = 5.0            # read lease: blocks a get returned are not evicted/moved
    put_lease_ttl_s: float = 30.0       # an unfinished put is revoked after this
    heartbeat_ttl_s: float = 10.0       # a daemon silent this long loses its segments
    high_watermark: float = 0.95        # DRAM: start evicting (or demoting) past used/capacity
    low_watermark: float = 0.85         # ... and stop once below this
    ssd_high_watermark: float = 0.95    # SSD: delete least recently used blocks past this
    ssd_low_watermark: float = 0.90
    promote_after_hits: int = 2         # reads of an SSD-resident block that bring it back to DRAM
    pin_cap: float = 0.5                # share of a tier's capacity that pins may hold
    move_timeout_s: float = 30.0        # a claimed tier move not reported by then is abandoned
    tick_interval_s: float = 0.5
    workers: int = 8
    fast_lane: bool = True              # also serve the hot calls over a plain socket (fastrpc)
    fast_lane_port: int = 0             # 0: any free port (clients learn it from ServiceInfo)

    def __post_init__(self) -> None:
        _require(0 <= self.port < 65536, f"meta port {self.port} out of range")
        _require(0.0 < self.low_watermark < self.high_watermark <= 1.0,
                 f"need 0 < low_watermark ({self.low_watermark}) < high_watermark ({self.high_watermark}) <= 1")
        _require(0.0 < self.ssd_low_watermark < self.ssd_high_watermark <= 1.0,
                 "need 0 < ssd_low_watermark < ssd_high_watermark <= 1")
        _require(0.0 <= self.pin_cap <= 1.0, "pin_cap is a share of capacity, 0..1")
        _require(self.promote_after_hits >= 1, "promote_after_hits must be at least 1")
        for name in ("lease_ttl_s", "put_lease_ttl_s", "heartbeat_ttl_s", "tick_interval_s", "move_timeout_s"):
            _require(getattr(self, name) > 0, f"{name} must be positive")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class DaemonConfig:
    SECTION = "daemon"

    meta_address: str = f"127.0.0.1:{DEFAULT_META_PORT}"
    host: str = "127.0.0.1"
    tcp_port: int = 0
    daemon_id: str = ""                 # default: generated, unique per start
    secret: str = ""
    dram_size: int = 1 << 30            # bytes of DRAM this daemon offers
    segment_size: int = 256 << 20       # DRAM is offered as segments of this size
    shm_dir: str = "/dev/shm"
    heartbeat_interval_s: float = 2.0
    # Opt in to mooncake and ucx (`--transports shm,mooncake,ucx,tcp`): each is served if its library
    # is installed. Not by default: Mooncake's engine listens on every interface and cannot check
    # grants (see README "Transports"), and UCX adds ~0.5 s to start-up.
    transports: tuple[str, ...] = ("shm", "tcp")
    mooncake_protocol: str = "tcp"      # Mooncake Transfer Engine protocol: tcp, or rdma in production
    mooncake_device: str = ""           # its device names, e.g. "mlx5_0,mlx5_1" for rdma
    ucx_tls: str = DEFAULT_UCX_TLS
    ssd_dir: str = ""                   # empty: no SSD tier
    ssd_size: int = 4 << 30             # bytes of disk offered in ssd_dir
    ssd_segment_size: int = 1 << 30
    gpu_size: int = 0                   # bytes of GPU memory to offer (0: no GPU tier)
    gpu_device: int = 0
    move_poll_s: float = 0.05           # how often an idle daemon asks for tier moves
    move_batch_bytes: int = 64 << 20    # bytes of tier moves claimed at once

    def __post_init__(self) -> None:
        _require(self.dram_size > 0, "dram_size must be positive")
        _require(not self.ssd_dir or self.ssd_size >= 4096, "ssd_size must be at least 4 KiB")
        _require(self.ssd_segment_size >= 4096, "ssd_segment_size must be at least 4 KiB")
        _require(self.segment_size > 0, "segment_size must be positive")
        _require(self.heartbeat_interval_s > 0, "heartbeat_interval_s must be positive")
        _require(0 <= self.tcp_port < 65536, f"tcp_port {self.tcp_port} out of range")
        _require(len(self.transports) > 0, "at least one transport is needed")
        _require(bool(self.mooncake_protocol), "mooncake_protocol must name a protocol (tcp, rdma)")
        _require(bool(self.ucx_tls), "ucx_tls must name UCX transports (e.g. tcp,sysv,posix,self)")

    @property
    def segment_sizes(self) -> list[int]:
        return _split(self.dram_size, self.segment_size)

    @property
    def ssd_segment_sizes(self) -> list[int]:
        return _split(self.ssd_size, self.ssd_segment_size) if self.ssd_dir else []


def _split(total: int, piece: int) -> list[int]:
    full, rest = divmod(total, piece)
    return [piece] * full + ([rest] if rest >= 4096 else [])


@dataclass(frozen=True)
class ClientConfig:
    SECTION = "client"

    replica_num: int = 1
    # Preference order; those whose library is not installed are skipped.
    transports: tuple[str, ...] = ("shm", "mooncake", "ucx", "tcp")
    timeout_s: float = 10.0                         # metadata RPCs and each data-plane transfer
    verify_checksums: bool = True
    fast_lane: bool = True                          # use the service's fast lane when it has one
    mooncake_device: str = ""                       # rdma device names for this client's engine
    ucx_tls: str = DEFAULT_UCX_TLS

    def __post_init__(self) -> None:
        _require(self.replica_num >= 1, "replica_num must be at least 1")
        _require(self.timeout_s > 0, "timeout_s must be positive")
        _require(len(self.transports) > 0, "at least one transport is needed")
        _require(bool(self.ucx_tls), "ucx_tls must name UCX transports (e.g. tcp,sysv,posix,self)")


def resolve_secret(configured: str) -> tuple[bytes, bool]:
    """(secret bytes, is_insecure_default): the configured secret, else $KVSTORE_SECRET, else the
    development default."""
    secret = configured or os.environ.get("KVSTORE_SECRET", "")
    if secret:
        return secret.encode(), False
    return INSECURE_DEV_SECRET.encode(), True


def random_secret() -> str:
    return secrets.token_hex(16)


C = TypeVar("C")


def _convert(value: Any, target: Any) -> Any:
    kind = target if isinstance(target, type) else None
    text = str(target)
    if isinstance(value, str):
        if kind is bool or text == "bool":
            return value.strip().lower() in ("1", "true", "yes", "on")
        if kind is int or text == "int":
            return parse_size(value)
        if kind is float or text == "float":
            return float(value)
        if text.startswith("tuple"):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value
    if text.startswith("tuple") and isinstance(value, list):
        return tuple(value)
    if text == "int" and isinstance(value, str):
        return parse_size(value)
    return value


def load_config(cls: type[C], toml_path: str | Path | None = None,
                env: Mapping[str, str] | None = None, **overrides: Any) -> C:
    """Build `cls` from defaults < TOML file < KVSTORE_<SECTION>_<FIELD> env < overrides."""
    env = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    if toml_path:
        with open(toml_path, "rb") as fh:
            table = tomllib.load(fh).get(cls.SECTION, {})
        unknown = set(table) - set(fields)
        _require(not unknown, f"unknown [{cls.SECTION}] settings in {toml_path}: {sorted(unknown)}")
        values.update(table)
    prefix = f"KVSTORE_{cls.SECTION.upper()}_"
    for name in fields:
        if prefix + name.upper() in env:
            values[name] = env[prefix + name.upper()]
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(values) - set(fields)
    _require(not unknown, f"unknown {cls.SECTION} settings: {sorted(unknown)}")
    try:
        converted = {k: _convert(v, fields[k].type) for k, v in values.items()}
    except ValueError as exc:
        raise InvalidArgument(f"bad {cls.SECTION} setting: {exc}") from exc
    return cls(**converted)


