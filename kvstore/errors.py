"""Every error kvstore raises, and the one table that maps them to and from the wire.

    KVStoreError                  base; .code is the ErrorCode carried on the wire
    ├── KeyNotFound               the key is absent (never written, removed, evicted, or its
    │                             daemon died): recompute the block
    ├── KeyBusy                   the key is being written, or is leased: retry later
    ├── AlreadyExists             the key is already complete (put is content addressed)
    ├── NoSpace                   no segment has room now, even after eviction
    │   └── QuotaExceeded         the caller's tenant is at its quota for the tier
    ├── InvalidArgument           the request can never succeed as written
    ├── PermissionDenied          not allowed: a data-plane request without a valid grant, or a
    │   │                         call outside the caller's role
    │   └── Unauthenticated       no token, or one the service does not know (forged, revoked)
    ├── ChecksumMismatch          bytes read do not match the checksum stored at put
    ├── TransportError            the data plane failed (peer died, connection reset, deadline)
    └── Unavailable               the metadata service or a daemon cannot be reached
        ├── NotLeader             this metadata service is a standby: .leader names the leader
        └── WrongShard            a key belongs to another shard: .map_epoch is the service's map

Foreign errors (grpc.RpcError, OSError, ...) are wrapped into these with ``raise ... from exc``
at the boundary that sees them; callers only ever need to catch this hierarchy.
"""

from __future__ import annotations

from enum import IntEnum
from typing import cast

import grpc


class ErrorCode(IntEnum):
    """Per-key outcome codes; values equal kvstore.v1.ErrorCode on the wire."""

    OK = 0
    KEY_NOT_FOUND = 1
    NO_SPACE = 2
    INVALID_ARGUMENT = 3
    KEY_BUSY = 4
    ALREADY_EXISTS = 5
    UNAVAILABLE = 6
    PERMISSION_DENIED = 7
    CHECKSUM_MISMATCH = 8
    TRANSPORT_ERROR = 9
    INTERNAL = 10
    NOT_LEADER = 11
    UNAUTHENTICATED = 12
    QUOTA_EXCEEDED = 13
    WRONG_SHARD = 14


class KVStoreError(Exception):
    """Base of all kvstore errors."""

    code = ErrorCode.INTERNAL


class KeyNotFound(KVStoreError):
    code = ErrorCode.KEY_NOT_FOUND


class KeyBusy(KVStoreError):
    code = ErrorCode.KEY_BUSY


class AlreadyExists(KVStoreError):
    code = ErrorCode.ALREADY_EXISTS


class NoSpace(KVStoreError):
    code = ErrorCode.NO_SPACE


class QuotaExceeded(NoSpace):
    """The caller's tenant holds its quota of the tier already (and policy, or its own pinned
    and leased blocks, left nothing of its own to evict)."""

    code = ErrorCode.QUOTA_EXCEEDED


class InvalidArgument(KVStoreError):
    code = ErrorCode.INVALID_ARGUMENT


class PermissionDenied(KVStoreError):
    code = ErrorCode.PERMISSION_DENIED


class Unauthenticated(PermissionDenied):
    """The call carried no token, or one the service does not accept (unknown, revoked,
    malformed): set $KVSTORE_TOKEN (or ClientConfig.token) to a token `kvstore tenant token` made."""

    code = ErrorCode.UNAUTHENTICATED


class ChecksumMismatch(KVStoreError):
    code = ErrorCode.CHECKSUM_MISMATCH


class TransportError(KVStoreError):
    code = ErrorCode.TRANSPORT_ERROR


class Unavailable(KVStoreError):
    """`retry_after_ms` > 0: the service did nothing and says when it will take the call (a leader
    waiting out its predecessor's grants); a client whose deadline allows waits and asks again."""

    code = ErrorCode.UNAVAILABLE

    def __init__(self, message: str, retry_after_ms: int = 0) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class NotLeader(Unavailable):
    """The service asked is a standby (or a deposed leader); `leader` is the address of the one
    that leads now, "" while none does (an election is under way)."""

    code = ErrorCode.NOT_LEADER

    def __init__(self, message: str, leader: str = "") -> None:
        super().__init__(message)
        self.leader = leader


class WrongShard(Unavailable):
    """A key of the call belongs to another shard than the one asked (the client's shard map is
    older than the service's, whose epoch is `map_epoch`): read the map again and resend."""

    code = ErrorCode.WRONG_SHARD

    def __init__(self, message: str, map_epoch: int = 0) -> None:
        super().__init__(message)
        self.map_epoch = map_epoch


_BY_CODE: dict[ErrorCode, type[KVStoreError]] = {
    cls.code: cls
    for cls in (
        KeyNotFound,
        KeyBusy,
        AlreadyExists,
        NoSpace,
        InvalidArgument,
        PermissionDenied,
        ChecksumMismatch,
        TransportError,
        Unavailable,
    )
}
_BY_CODE[ErrorCode.INTERNAL] = KVStoreError
_BY_CODE[ErrorCode.NOT_LEADER] = NotLeader
_BY_CODE[ErrorCode.UNAUTHENTICATED] = Unauthenticated
_BY_CODE[ErrorCode.QUOTA_EXCEEDED] = QuotaExceeded
_BY_CODE[ErrorCode.WRONG_SHARD] = WrongShard

# One table between the domain and gRPC status codes, used in both directions.
_GRPC_OF: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.KEY_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.NO_SPACE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.KEY_BUSY: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.CHECKSUM_MISMATCH: grpc.StatusCode.DATA_LOSS,
    ErrorCode.TRANSPORT_ERROR: grpc.StatusCode.ABORTED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.NOT_LEADER: grpc.StatusCode.UNAVAILABLE,  # the exact code travels in ErrorDetail
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.QUOTA_EXCEEDED: grpc.StatusCode.RESOURCE_EXHAUSTED,  # as NO_SPACE; exact in ErrorDetail
    ErrorCode.WRONG_SHARD: grpc.StatusCode.FAILED_PRECONDITION,  # the exact code travels in ErrorDetail
}
_CODE_OF_GRPC: dict[grpc.StatusCode, ErrorCode] = {
    v: k
    for k, v in _GRPC_OF.items()
    if k not in (ErrorCode.NOT_LEADER, ErrorCode.QUOTA_EXCEEDED, ErrorCode.WRONG_SHARD)
}
_CODE_OF_GRPC[grpc.StatusCode.DEADLINE_EXCEEDED] = ErrorCode.UNAVAILABLE


def error_for(code: ErrorCode | int, message: str) -> KVStoreError:
    """The exception for a per-key code received from the wire."""
    return _BY_CODE.get(ErrorCode(code), KVStoreError)(message)


def to_grpc_status(err: KVStoreError) -> grpc.StatusCode:
    return _GRPC_OF.get(err.code, grpc.StatusCode.INTERNAL)


def from_rpc_error(exc: grpc.RpcError, what: str) -> KVStoreError:
    """Translate a failed gRPC call into the domain error; `what` names the call for the message."""
    call = cast(grpc.Call, exc)  # what a failed call raises is both an RpcError and a Call
    try:
        return from_status(call.code(), call.details() or "", what)
    except AttributeError:  # an RpcError raised by something other than a call
        return from_status(grpc.StatusCode.UNKNOWN, str(exc), what)


def from_status(status: grpc.StatusCode, details: str, what: str) -> KVStoreError:
    """The domain error for a failed call's status code (from gRPC or the fast lane)."""
    code = _CODE_OF_GRPC.get(status)
    if code is None:
        return KVStoreError(f"{what} failed with {status.name}: {details}")
    if code is ErrorCode.UNAVAILABLE:
        return Unavailable(
            f"{what}: metadata service unreachable or too slow ({status.name}: {details}); "
            "check that `kvstore meta` (or `kvstore serve`) is running at the address given"
        )
    return _BY_CODE[code](details)
