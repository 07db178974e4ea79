"""One kvstore client per tenant the adapter stores for: a request's `cache_salt` picks it.

A salt mapped in `salt_token_env` goes through a client holding that tenant's token, so the
service files its chunks in the tenant's namespace and counts them against its quotas; every
other salt goes through the default client (the process's own token). Clients are made on first
use and shared by every thread (KVClient is thread safe).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from kvstore.client import KVClient
from kvstore.compat.lmcache.l2_settings import L2Settings
from kvstore.config import ClientConfig

ClientFactory = Callable[[str, ClientConfig], KVClient]


class TenantClients:
    def __init__(self, cfg: L2Settings, client_config: ClientConfig, factory: ClientFactory = KVClient) -> None:
        self._cfg = cfg
        self._config = client_config
        self._factory = factory
        self._lock = threading.Lock()
        self._by_token: dict[str | None, KVClient] = {}

    def for_salt(self, cache_salt: str) -> KVClient:
        """The client for chunks of `cache_salt`; InvalidArgument if its token variable is unset."""
        token = self._cfg.token_for(cache_salt)
        with self._lock:
            client = self._by_token.get(token)
            if client is None:
                config = self._config if token is None else _with_token(self._config, token)
                client = self._by_token[token] = self._factory(self._cfg.meta, config)
            return client

    def all(self) -> list[KVClient]:
        with self._lock:
            return list(self._by_token.values())

    def close(self) -> None:
        with self._lock:
            clients, self._by_token = list(self._by_token.values()), {}
        for client in clients:
            client.close()


def _with_token(config: ClientConfig, token: str) -> ClientConfig:
    return dataclasses.replace(config, token=token)
