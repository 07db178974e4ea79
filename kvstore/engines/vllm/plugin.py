"""vLLM's general plug-in hook (entry point group `vllm.general_plugins`): names kvstore's secondary
offloading tier "kvstore", so a tier config may say `{"type": "kvstore", "meta": ...}` without a
module_path. vLLM calls it in every process, possibly more than once; the tier itself is imported
only when a config names it."""

from __future__ import annotations

try:
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
except ImportError:  # a vLLM older than secondary tiers: nothing to register
    SecondaryTierFactory = None  # type: ignore[assignment,misc]

TIER_NAME = "kvstore"


def register() -> None:
    if SecondaryTierFactory is not None and TIER_NAME not in SecondaryTierFactory._registry:
        SecondaryTierFactory.register_tier(TIER_NAME, "kvstore.engines.vllm.tier.manager", "KVStoreTier")
