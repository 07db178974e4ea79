"""The kvstore tier under vLLM's real GPU <-> CPU copies (needs CUDA and vLLM's CUDA build; run by
the device check, docs/gpu.md). On the CPU build vLLM refuses the OffloadingConnector's worker
("CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"); everything short of
that copy is tests/vllm/test_tier.py.

Two vLLM instances one after the other, over one `kvstore serve`: the first computes a prompt and
offloads its blocks (GPU -> CPU primary tier -> kvstore); the second, with an empty primary tier,
finds them in kvstore, promotes them, loads them onto its GPU and must answer with the same tokens.
"""

from __future__ import annotations

import pytest

from tests.cluster import Cluster
from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import Instance
from tests.vllm.tiny_model import prompt_ids

pytestmark = [pytest.mark.gpu, pytest.mark.slow, needs_vllm, pytest.mark.timeout(600)]

PROMPT = prompt_ids(320, 7)  # ten blocks of 32 tokens


def _offloading(meta: str) -> dict[str, object]:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 256 << 20,
            "secondary_tiers": [{"type": "kvstore", "meta": meta}],
        },
    }


def test_a_second_instance_loads_the_first_ones_kv_through_kvstore(tiny_model):
    c = Cluster()
    try:
        _, meta = c.serve("1GiB")
        settings = {"model": tiny_model, "block_size": 32, "kv_transfer_config": _offloading(meta)}
        first = Instance("tier-first", settings)
        try:
            expected = first.generate([PROMPT], 8)["tokens"][0]
            first.generate([prompt_ids(64, 8)], 8)  # more steps: the offloads finish and cascade
        finally:
            first.close()
        second = Instance("tier-second", settings)
        try:
            out = second.generate([PROMPT], 8)
        finally:
            second.close()
        assert out["tokens"][0] == expected
        assert out["cached_tokens"][0] >= 32 * 9  # the prompt's full blocks came from kvstore
    finally:
        c.close()
