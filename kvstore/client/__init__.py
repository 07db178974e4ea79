"""The kvstore client SDK: `from kvstore.client import KVClient`."""

from kvstore.client.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import (
    AlreadyExists,
    ChecksumMismatch,
    InvalidArgument,
    KeyBusy,
    KeyNotFound,
    KVStoreError,
    NoSpace,
    PermissionDenied,
    TransportError,
    Unavailable,
)

__all__ = [
    "AlreadyExists",
    "ChecksumMismatch",
    "ClientConfig",
    "InvalidArgument",
    "KVClient",
    "KVStoreError",
    "KeyBusy",
    "KeyNotFound",
    "NoSpace",
    "PermissionDenied",
    "TransportError",
    "Unavailable",
]
