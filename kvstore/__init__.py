"""kvstore: a KVCache-centric store for disaggregated LLM serving.

    from kvstore import KVClient, ClientConfig, KeyNotFound

The public names are loaded on first use (module __getattr__), so `import kvstore` stays cheap and
the server side never pulls in the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    "__version__",
]
_ERRORS = frozenset(__all__) - {"ClientConfig", "KVClient", "__version__"}

if TYPE_CHECKING:
    from kvstore.client import KVClient
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
    from kvstore.version import __version__


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from kvstore.version import __version__

        return __version__
    if name == "KVClient":
        from kvstore.client import KVClient

        return KVClient
    if name == "ClientConfig":
        from kvstore.config import ClientConfig

        return ClientConfig
    if name in _ERRORS:
        from kvstore import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'kvstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
