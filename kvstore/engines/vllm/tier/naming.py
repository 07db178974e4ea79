"""Store keys for vLLM's offload keys: `{tenant}/vllm-tier/{layout digest}/{block hash}.g{group}`.

vLLM names an offloaded chunk by its content (a chained block hash, equal in every instance that
hashes prompts the same way) plus its KV cache group. What makes two instances' bytes for the same
chunk incompatible is everything else: the model, the KV dtype, tokens per block and per chunk, the
groups' specs, the parallel layout and the chunk's byte size. The digest covers all of them, taken
from the same fields vLLM's own file-system tier names its folders by, so two deployments never
read each other's layouts, while two instances of one deployment share every chunk.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any
from urllib.parse import quote

from vllm.v1.kv_offload.base import OffloadingSpec, OffloadKey, get_offload_block_hash, get_offload_group_idx
from vllm.v1.kv_offload.file_mapper import FileMapper

LAYOUT_VERSION = 1


def layout_fields(spec: OffloadingSpec, payload_bytes: int) -> dict[str, Any]:
    """What decides whether two instances' bytes for one chunk are interchangeable."""
    mapper = FileMapper.from_offloading_spec(
        root_dir="", offloading_spec=spec, blocks_per_file=spec.blocks_per_chunk, parallel_agnostic=True
    )
    return {**mapper.get_run_config(), "payload_bytes": payload_bytes, "kvstore_tier": LAYOUT_VERSION}


def layout_digest(fields: dict[str, Any]) -> str:
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class TierKeys:
    """Maps vLLM's OffloadKeys to this deployment's store keys."""

    def __init__(self, tenant: str, digest: str) -> None:
        self.prefix = f"{quote(tenant, safe='')}/vllm-tier/{digest}/"

    def of(self, key: OffloadKey) -> str:
        return f"{self.prefix}{get_offload_block_hash(key).hex()}.g{get_offload_group_idx(key)}"

    def many(self, keys: list[OffloadKey]) -> list[str]:
        return [self.of(k) for k in keys]
