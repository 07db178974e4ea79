"""kvstore's vLLM KV connector: `kv_connector_module_path: "kvstore.engines.vllm"`,
`kv_connector: "KVStoreConnector"`. Needs vLLM (scripts/install_vllm.sh installs its CPU build).
kvstore as a secondary tier of vLLM's own KV offloading: kvstore.engines.vllm.tier."""

from kvstore.engines.vllm.connector import KVStoreConnector

__all__ = ["KVStoreConnector"]
