"""Concurrent requests that share a prefix, on vLLM's CPU build: one batched save step then holds
the shared blocks once per request (the same block ids, or the same hashes in other blocks), and
every block must still reach kvstore once, so a later instance loads the whole prefix instead of
recomputing it (issue 18: the repeated keys made put_many refuse the step's whole batch)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import pytest

from kvstore.client import KVClient
from kvstore.engines.keys import KeyScheme
from tests.cluster import Cluster
from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import Instance, kv_config
from tests.vllm.tiny_model import prompt_ids

pytestmark = [pytest.mark.slow, needs_vllm, pytest.mark.timeout(600)]

BLOCK = 32
PREFIX = prompt_ids(256, 40)  # 8 blocks shared by every prompt
PROMPTS = [PREFIX + prompt_ids(40 + 30 * i, 41 + i) for i in range(4)]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def serve():
    """`kvstore serve`, this module's own."""
    cluster = Cluster()
    try:
        yield cluster.serve("256MiB")[1]
    finally:
        cluster.close()


def _instance(name, tiny_model, meta, role, **settings):
    return Instance(
        name, {"model": tiny_model, "block_size": BLOCK, **settings, "kv_transfer_config": kv_config(role, meta)}
    )


def held_blocks(meta: str, stats: dict[str, Any], prompts: list[list[int]]) -> list[int]:
    """How many leading full blocks of each prompt kvstore holds, under the instance's naming."""
    tenant, model, layout = (unquote(p) for p in stats["namespace"].split("/"))
    scheme = KeyScheme(model=model, layout=layout, block_size=BLOCK, tenant=tenant)
    parts = stats["parts"]
    with KVClient(meta) as kv:
        return [
            kv.match_prefix(scheme.object_keys(scheme.block_hashes(p), parts)) // len(parts or [None]) for p in prompts
        ]


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["shared-blocks", "copied-blocks"])
def test_concurrent_shared_prefix_requests_store_every_block_once(serve, tiny_model, prefix_caching):
    """With vLLM's prefix cache the later requests reuse the first one's blocks in the same step
    (the same block ids twice in a batch); without it each computes its own copy (the same keys
    from other blocks). Either way every block is stored, and a decode instance loads them."""
    producer = _instance(f"producer-{prefix_caching}", tiny_model, serve, "kv_producer", prefix_caching=prefix_caching)
    try:
        out = producer.generate(PROMPTS, 1, batch=True, kv_transfer_params={"do_remote_decode": True})
        worker = out["stats"]["worker"]
        full = [len(p) // BLOCK for p in PROMPTS]
        assert worker["save_failures"] == 0, producer.log()[-3000:]
        assert held_blocks(serve, out["stats"], PROMPTS) == full
        assert [p["kvstore_blocks"] for p in out["kv_transfer_params"]] == full
        # Every distinct block written once: 8 shared + each prompt's own.
        assert worker["save_blocks"] <= len({b for p in PROMPTS for b in _block_ids(p)})
        expected = producer.generate(PROMPTS, MAX_TOKENS)["tokens"]
    finally:
        producer.close()
    consumer = _instance(f"consumer-{prefix_caching}", tiny_model, serve, "kv_consumer")
    try:
        out = consumer.generate(PROMPTS, MAX_TOKENS)
        worker = out["stats"]["worker"]
        assert worker["load_failures"] == 0
        assert worker["load_blocks"] >= full[0]  # the first loads the prefix and its tail
        assert out["tokens"] == expected
    finally:
        consumer.close()


def _block_ids(prompt: list[int]) -> list[tuple[int, ...]]:
    """A block's identity is its whole prefix (chained hashes): the token prefix up to its end."""
    return [tuple(prompt[: (i + 1) * BLOCK]) for i in range(len(prompt) // BLOCK)]
