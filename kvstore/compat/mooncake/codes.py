"""Mooncake Store's integer return codes, and the one table that maps kvstore's errors onto them.

Values are Mooncake's `ErrorCode` (mooncake-store/include/types.h); its Python API returns them as
plain ints: 0 or a positive count on success, one of these negatives on failure.
"""

from __future__ import annotations

from enum import IntEnum

from kvstore.errors import ErrorCode as KVCode
from kvstore.errors import KVStoreError


class ErrorCode(IntEnum):
    """The subset of Mooncake's codes that this API can return (names and values as in types.h)."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SEGMENT_NOT_FOUND = -101
    NO_AVAILABLE_HANDLE = -200  # no space, even after eviction
    INVALID_KEY = -400
    INVALID_PARAMS = -600  # also "client is not initialized"
    ILLEGAL_CLIENT = -601
    REPLICA_IS_NOT_READY = -703  # the object is still being written
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706  # being read: remove refuses it unless forced
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900  # the master (kvstore's metadata service) is unreachable
    NOT_SUPPORTED = -1012  # "Operation is not supported in current mode"


# kvstore's per-key outcome -> Mooncake's code. KEY_BUSY is per call: see `code_for`.
_CODE_OF: dict[KVCode, ErrorCode] = {
    KVCode.OK: ErrorCode.OK,
    KVCode.KEY_NOT_FOUND: ErrorCode.OBJECT_NOT_FOUND,
    KVCode.NO_SPACE: ErrorCode.NO_AVAILABLE_HANDLE,
    KVCode.INVALID_ARGUMENT: ErrorCode.INVALID_PARAMS,
    KVCode.KEY_BUSY: ErrorCode.REPLICA_IS_NOT_READY,
    KVCode.ALREADY_EXISTS: ErrorCode.OBJECT_ALREADY_EXISTS,
    KVCode.UNAVAILABLE: ErrorCode.RPC_FAIL,
    KVCode.PERMISSION_DENIED: ErrorCode.ILLEGAL_CLIENT,
    KVCode.CHECKSUM_MISMATCH: ErrorCode.CHECKSUM_MISMATCH,
    KVCode.TRANSPORT_ERROR: ErrorCode.TRANSFER_FAIL,
    KVCode.INTERNAL: ErrorCode.INTERNAL_ERROR,
}


def code_for(err: BaseException, removing: bool = False) -> int:
    """Mooncake's code for a kvstore error (any other exception is INTERNAL_ERROR).

    A busy key means "still being written" to a reader (REPLICA_IS_NOT_READY) and "being read"
    to a remove (OBJECT_HAS_LEASE), as Mooncake's master answers those calls."""
    if not isinstance(err, KVStoreError):
        return int(ErrorCode.INTERNAL_ERROR)
    if removing and err.code == KVCode.KEY_BUSY:
        return int(ErrorCode.OBJECT_HAS_LEASE)
    return int(_CODE_OF.get(err.code, ErrorCode.INTERNAL_ERROR))
