"""Mooncake keys as kvstore keys: the tenant namespace, and the keys a store instance wrote.

The default tenant's keys are kvstore keys unchanged, so a Mooncake-API client and a native
kvstore client (or engine shim) that use the same key see the same block. Another tenant's keys
live under `mooncake-tenant/<tenant>/`. This is a naming convention, not isolation: kvstore's
tenants (authenticated, enforced by the service) are configured on the client SDK, not here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from kvstore.types import MAX_KEY_BYTES

DEFAULT_TENANT = "default"
TENANT_PREFIX = "mooncake-tenant/"


class KeyNamespace:
    def __init__(self, tenant_id: str = DEFAULT_TENANT) -> None:
        tenant = tenant_id.strip() or DEFAULT_TENANT
        self.prefix = "" if tenant == DEFAULT_TENANT else f"{TENANT_PREFIX}{tenant}/"

    def to_store(self, key: str) -> str:
        return self.prefix + key

    def from_store(self, key: str) -> str:
        return key[len(self.prefix) :]

    def storable(self, key: object) -> bool:
        """Whether kvstore can hold this key at all (1..1024 UTF-8 bytes once prefixed). A key it
        cannot hold is never stored: reads of it miss, writes of it are INVALID_PARAMS."""
        if not isinstance(key, str) or not key:
            return False
        try:
            return len((self.prefix + key).encode("utf-8")) <= MAX_KEY_BYTES
        except UnicodeEncodeError:
            return False


class WrittenKeys:
    """The kvstore keys this store instance has written and not removed: what remove_all and
    remove_by_regex can reach, since kvstore's client cannot list the store's keys. Thread safe;
    grows with the keys written (about 100 bytes a key)."""

    def __init__(self) -> None:
        self._keys: dict[str, None] = {}  # insertion ordered
        self._lock = threading.Lock()

    def add(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.update((k, None) for k in keys)

    def discard(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                self._keys.pop(k, None)

    def snapshot(self) -> Sequence[str]:
        with self._lock:
            return list(self._keys)
