"""kvstore's vLLM connector as tests/vllm/instance.py loads it (`kv_connector_module_path:
"tests.vllm.probe"`): the same connector, under the same name, that also records each live
instance by role ("scheduler", "worker"), so the in-process instance can report its counters."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from kvstore.engines.vllm.connector import KVStoreConnector as _Connector

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import KVCacheConfig

# The connectors alive in this process, by role.
LIVE: weakref.WeakValueDictionary[str, _Connector] = weakref.WeakValueDictionary()


class KVStoreConnector(_Connector):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        LIVE[role.name.lower()] = self
