"""Plain value types shared by the metadata service, daemons, transports and clients."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

MAX_KEY_BYTES = 1024


class Tier(str, Enum):
    GPU = "gpu"
    DRAM = "dram"
    SSD = "ssd"


class GrantMode(IntEnum):
    READ = 1
    WRITE = 2


@dataclass(frozen=True)
class Endpoint:
    """How to reach a segment over one transport; `address` is transport specific."""

    transport: str
    address: str


@dataclass(frozen=True)
class SegmentInfo:
    """A contiguous region of one daemon's memory or disk, as the metadata service knows it."""

    segment_id: str
    daemon_id: str
    tier: Tier
    capacity: int
    endpoints: tuple[Endpoint, ...]

    def endpoint(self, transport: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.transport == transport), None)


@dataclass(frozen=True)
class Grant:
    """Permission to read or write [offset, offset+length) of a segment until expires_ms.

    It is also the replica descriptor: where one copy of a block lives.
    """

    segment_id: str
    offset: int
    length: int
    mode: GrantMode
    expires_ms: int
    mac: bytes


class MoveKind(IntEnum):
    """Direction of a tier move."""

    DEMOTE = 1
    PROMOTE = 2


@dataclass(frozen=True)
class MoveTask:
    """Copy one block between two segments of the same daemon (claimed by that daemon)."""

    move_id: int
    kind: MoveKind
    key: str
    src_segment_id: str
    src_offset: int
    dst_segment_id: str
    dst_offset: int
    size: int
    checksum: int


_SURELY_SHORT = MAX_KEY_BYTES // 4     # UTF-8 takes at most 4 bytes a character


def validate_key(key: str) -> None:
    """Raise InvalidArgument unless `key` is a usable key."""
    if type(key) is str and 0 < len(key) <= _SURELY_SHORT:
        return                           # the common case, without encoding the key
    from kvstore.errors import InvalidArgument

    if not isinstance(key, str):
        raise InvalidArgument(f"keys are str, got {type(key).__name__}")
    if not key:
        raise InvalidArgument("empty key: keys must be 1 to 1024 UTF-8 bytes")
    n = len(key.encode("utf-8", "surrogatepass"))
    if n > MAX_KEY_BYTES:
        raise InvalidArgument(f"key of {n} bytes is over the {MAX_KEY_BYTES}-byte limit; hash long keys")
