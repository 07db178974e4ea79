"""The class LMCache's plug-in loader instantiates: a ConnectorAdapter for `plugin://kvstore[.NAME]`
(and `kvstore://HOST:PORT` URLs) that builds the connector with LMCache's context."""

from __future__ import annotations

from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext, extract_plugin_type
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvstore.compat.lmcache import settings

PLUGIN_TYPE = "kvstore"


class KVStoreConnectorAdapter(ConnectorAdapter):
    def __init__(self) -> None:
        super().__init__(settings.SCHEME)

    def can_parse(self, url: str) -> bool:
        if url.startswith(self.schema):
            return True
        return url.startswith("plugin://") and extract_plugin_type(url[len("plugin://") :]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        from kvstore.compat.lmcache.connector import KVStoreConnector

        extra = context.config.extra_config if context.config is not None else None
        url = context.url if context.url.startswith(settings.SCHEME) else None
        return KVStoreConnector(
            loop=context.loop,
            local_cpu_backend=context.local_cpu_backend,
            config=context.config,
            metadata=context.metadata or context.local_cpu_backend.metadata,
            meta_address=settings.meta_address(extra, url),
            key_prefix=settings.key_prefix(extra),
        )
