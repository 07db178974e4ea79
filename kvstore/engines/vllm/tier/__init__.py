"""kvstore as a vLLM secondary offloading tier (TieringOffloadingSpec): module_path
"kvstore.engines.vllm.tier", type "KVStoreTier" (or "kvstore", registered by the vLLM plug-in
kvstore installs). Needs vLLM 0.32 or later."""

from kvstore.engines.vllm.tier.manager import KVStoreTier

__all__ = ["KVStoreTier"]
