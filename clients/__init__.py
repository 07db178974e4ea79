"""The kvstore client SDK: `from kvstore.client import KVClient`."""

from kvstore.client.client import KVClient
from kvstore.errors import (AlreadyExists, ChecksumMismatch, InvalidArgument, KeyBusy, KeyNotFound,
                            KVStoreError, NoSpace, PermissionDenied, TransportError, Unavailable)

__all__ = ["KVClient", "KVStoreError", "KeyNotFound", "KeyBusy", "AlreadyExists", "NoSpace",
           "InvalidArgument", "PermissionDenied", "ChecksumMismatch", "TransportError", "Unavailable"]
