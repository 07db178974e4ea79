"""Plain value types shared by the metadata service, daemons, transports and clients."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from functools import cached_property

MAX_KEY_BYTES = 1024
# The most keys one call may carry. Larger batches are refused (InvalidArgument) rather than
# held against every other caller: the service works through a batch in slices, letting other
# calls in between, and this bounds the memory one request can cost it.
MAX_BATCH_KEYS = 16384


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
    host_id: str = ""  # the daemon's host (kvstore.hostid): who may reach it over shm

    def endpoint(self, transport: str) -> Endpoint | None:
        return self._by_transport.get(transport)

    @cached_property
    def _by_transport(self) -> dict[str, Endpoint]:
        """The first endpoint of each transport (asked per key of every Get, on both sides)."""
        found: dict[str, Endpoint] = {}
        for e in self.endpoints:
            found.setdefault(e.transport, e)
        return found


@dataclass(frozen=True)
class Grant:
    """Permission to read or write [offset, offset+length) of a segment until expires_ms.

    It is also the replica descriptor: where one copy of a block lives. `flags` (kvstore.grant):
    LOCAL marks a grant for same-host shm access only, which daemons refuse.
    """

    segment_id: str
    offset: int
    length: int
    mode: GrantMode
    expires_ms: int
    mac: bytes
    flags: int = 0


def new_grant(
    segment_id: str, offset: int, length: int, mode: GrantMode, expires_ms: int, mac: bytes, flags: int
) -> Grant:
    """Grant(...), made for the hot paths (a grant per key of every Get) by filling the instance's
    dict: a frozen dataclass's __init__ sets each field through object.__setattr__."""
    g: Grant = object.__new__(Grant)
    d = g.__dict__
    d["segment_id"], d["offset"], d["length"], d["mode"] = segment_id, offset, length, mode
    d["expires_ms"], d["mac"], d["flags"] = expires_ms, mac, flags
    return g


class MoveKind(IntEnum):
    """What a move task does: a tier move, a copy for a key that lost replicas, or a deletion for
    a persistent segment's journal (FORGET: no bytes move)."""

    DEMOTE = 1
    PROMOTE = 2
    REPLICATE = 3
    FORGET = 4


@dataclass(frozen=True)
class MoveTask:
    """Copy one block into a segment of the daemon that claims the task: from another of its
    segments (DEMOTE, PROMOTE), or from another daemon's replica (REPLICATE: `source` is a read
    grant on it, `source_segment` where it is). FORGET copies nothing: the block (key, checksum)
    at dst_offset of the persistent segment dst_segment_id is gone, and its journal must say so
    (src_segment_id is empty)."""

    move_id: int
    kind: MoveKind
    key: str
    src_segment_id: str
    src_offset: int
    dst_segment_id: str
    dst_offset: int
    size: int
    checksum: int
    source: Grant | None = None
    source_segment: SegmentInfo | None = None


_SURELY_SHORT = MAX_KEY_BYTES // 4  # UTF-8 takes at most 4 bytes a character
# A stored key may carry its tenant's namespace ("\0<tenant id>\0", kvstore.meta.tenants) ahead
# of the key the tenant named.


class CheckedKeys(list[str]):
    """Keys validate_keys accepted already, put in their tenant's namespace by the service's
    handlers: the store does not check them again."""


def validate_key(key: str, internal: bool = False) -> None:
    """Raise InvalidArgument unless `key` is a usable key: a str of 1 to 1024 UTF-8 bytes with no
    NUL (a lone surrogate has no UTF-8 form, so it is refused). `internal`: a key as the service
    stores it, which may start with a tenant's namespace ("\0<tenant id>\0")."""
    if type(key) is str and 0 < len(key) <= _SURELY_SHORT and key.isascii() and "\0" not in key:
        return  # the common case, without encoding the key
    from kvstore.errors import InvalidArgument

    if not isinstance(key, str):
        raise InvalidArgument(f"keys are str, got {type(key).__name__}")
    if internal and key.startswith("\0"):
        end = key.find("\0", 1)
        if end < 2 or not key[1:end].isdigit():
            raise InvalidArgument(f"key {key[:40]!r} starts with NUL but no tenant namespace")
        key = key[end + 1 :]
    if not key:
        raise InvalidArgument("empty key: keys must be 1 to 1024 UTF-8 bytes")
    if "\0" in key:
        raise InvalidArgument(f"key {key[:40]!r} holds a NUL character: keys are text without NUL")
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"key {key[:40]!r} is not valid Unicode text ({exc.reason}): keys are UTF-8") from None
    if n > MAX_KEY_BYTES:
        raise InvalidArgument(f"key of {n} bytes is over the {MAX_KEY_BYTES}-byte limit; hash long keys")


def validate_keys(keys: Sequence[str], internal: bool = False) -> None:
    """Raise InvalidArgument unless `keys` is a batch of usable keys (validate_key) of at most
    MAX_BATCH_KEYS."""
    if type(keys) is list and len(keys) == 1:  # one ASCII key without NUL: most calls, checked inline
        key = keys[0]
        if type(key) is str and 0 < len(key) <= MAX_KEY_BYTES and key.isascii() and "\0" not in key:
            return
    from kvstore.errors import InvalidArgument

    if isinstance(keys, (str, bytes)):
        raise InvalidArgument("pass a list of keys, not a single string")
    if len(keys) > MAX_BATCH_KEYS:
        raise InvalidArgument(f"a batch of {len(keys)} keys is over the {MAX_BATCH_KEYS}-key limit: split it")
    if type(keys) is CheckedKeys:
        return
    try:  # the common case in C loops: ASCII strings (bytes = characters) without NUL
        joined = "".join(keys)
        if (
            joined.isascii()
            and "\0" not in joined
            and "" not in keys
            and max(map(len, keys), default=0) <= MAX_KEY_BYTES
        ):
            return
    except TypeError:  # something that is not a str: the loop below names it
        pass
    for key in keys:
        validate_key(key, internal)
