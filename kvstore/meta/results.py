"""What the metadata store's operations return, per key, before translation to the wire."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.errors import ErrorCode, KVStoreError
from kvstore.stats import DaemonStats, StoreStats, TierStats  # noqa: F401 - re-exported
from kvstore.types import Grant


@dataclass(frozen=True)
class KeyResult:
    code: ErrorCode = ErrorCode.OK
    message: str = ""

    @classmethod
    def of(cls, err: KVStoreError) -> "KeyResult":
        return cls(err.code, str(err))


OK = KeyResult()


@dataclass(frozen=True)
class PutStartResult:
    code: ErrorCode = ErrorCode.OK
    message: str = ""
    grants: tuple[Grant, ...] = ()
    retry_after_ms: int = 0       # with NO_SPACE: room is being made, retry after this long


@dataclass(frozen=True)
class GetResult:
    code: ErrorCode = ErrorCode.OK
    message: str = ""
    size: int = 0
    checksum: int = 0
    grants: tuple[Grant, ...] = ()
    lease_id: int = 0             # the reader hands it back (GetRequest/RemoveRequest.released) when done
