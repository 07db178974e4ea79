"""Mooncake keys as kvstore keys: the tenant namespace.

The default tenant's keys are kvstore keys unchanged, so a Mooncake-API client and a native
kvstore client (or engine shim) that use the same key see the same block. Another tenant's keys
live under `mooncake-tenant/<tenant>/`. This is a naming convention, not isolation: kvstore's
tenants (authenticated, enforced by the service) are configured on the client SDK, not here.
Nothing here remembers keys: the keys of a namespace are listed from the store when asked.
"""

from __future__ import annotations

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

    def owns(self, store_key: str) -> bool:
        """Whether a key the store lists under `prefix` is this namespace's: the default tenant's
        namespace holds every key but other tenants' (under TENANT_PREFIX)."""
        return store_key.startswith(self.prefix) and (bool(self.prefix) or not store_key.startswith(TENANT_PREFIX))

    def storable(self, key: object) -> bool:
        """Whether kvstore can hold this key at all (1..1024 UTF-8 bytes once prefixed). A key it
        cannot hold is never stored: reads of it miss, writes of it are INVALID_PARAMS."""
        if not isinstance(key, str) or not key:
            return False
        try:
            return len((self.prefix + key).encode("utf-8")) <= MAX_KEY_BYTES
        except UnicodeEncodeError:
            return False
