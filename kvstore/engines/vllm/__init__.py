"""kvstore's vLLM KV connector: `kv_connector_module_path: "kvstore.engines.vllm"`,
`kv_connector: "KVStoreConnector"`. Needs vLLM (`pip install kvstore[vllm]` or
scripts/install_vllm.sh for the CPU build)."""

from kvstore.engines.vllm.connector import KVStoreConnector

__all__ = ["KVStoreConnector"]
