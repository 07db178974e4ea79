"""A hybrid model (sliding-window and full-attention layers: two KV cache groups) through kvstore's
connector, end to end on vLLM's CPU build: a PD hand-off through the store and a repeated-prefix
request on a fresh instance give plain vLLM's greedy tokens, and the store's hits are counted.

The model is a tiny Llama whose `layer_types` make some layers sliding-window; its shape comes from
$KVSTORE_TEST_HYBRID (JSON: {"layer_types": [...], "sliding_window": N}) when set, so any hybrid
pattern can be run through the same test. vLLM's CPU build runs no Mamba / linear-attention model
with prefix caching (see test_hybrid_groups.py), so the state-group path is covered at unit level.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from kvstore.client import KVClient
from kvstore.engines.keys import KeyScheme
from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import Instance, kv_config
from tests.vllm.tiny_model import prompt_ids

pytestmark = [pytest.mark.slow, needs_vllm, pytest.mark.timeout(900)]

BLOCK = 32
# Window 48: a hit needs the sliding-window group's last two chunks (47 tokens), not only one.
DEFAULT_SHAPE: dict[str, Any] = {
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "sliding_window": 48,
}
P = prompt_ids(300, 71)  # 9 full chunks below the last token
PREFIX = P[:256]  # 8 chunks
Q = PREFIX + prompt_ids(40, 72)  # the repeated-prefix request
Q2 = PREFIX + prompt_ids(50, 74)  # another: what vLLM's own prefix cache finds after P
R = prompt_ids(200, 73)  # its stored chunks are spoilt before the decode loads them
MAX_TOKENS = 12


def _shape() -> dict[str, Any]:
    shape: dict[str, Any] = json.loads(os.environ.get("KVSTORE_TEST_HYBRID", "null")) or DEFAULT_SHAPE
    return shape


@pytest.fixture(scope="module")
def hybrid_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.vllm.tiny_model import build_tiny_hybrid

    shape = _shape()
    path: Path = tmp_path_factory.mktemp("tiny-hybrid")
    return str(build_tiny_hybrid(path, **shape))


def _instance(name: str, model: str, kv: dict[str, Any] | None = None) -> Instance:
    return Instance(name, {"model": model, "block_size": BLOCK, **({"kv_transfer_config": kv} if kv else {})})


@pytest.fixture(scope="module")
def plain(hybrid_model: str) -> dict[str, Any]:
    """Plain vLLM (no connector): the expected tokens, the hit on Q of a fresh instance (none),
    and of vLLM's own prefix cache on a request sharing P's prefix, run after P."""
    inst = _instance("plain", hybrid_model)
    try:
        fresh_q = inst.generate([Q], MAX_TOKENS)
        p_out = inst.generate([P], MAX_TOKENS)
        r_out = inst.generate([R], MAX_TOKENS)
        local_q = inst.generate([Q2], MAX_TOKENS)
    finally:
        inst.close()
    return {
        "p": p_out["tokens"][0],
        "r": r_out["tokens"][0],
        "q": fresh_q["tokens"][0],
        "q_fresh_cached": fresh_q["cached_tokens"][0],
        "q_local_cached": local_q["cached_tokens"][0],
    }


def test_hybrid_pd_and_repeated_prefix_match_plain_vllm(
    store: tuple[str, Any], hybrid_model: str, plain: dict[str, Any]
) -> None:
    meta = store[0]
    prefill = _instance("prefill", hybrid_model, kv_config("kv_producer", meta))
    try:
        first = prefill.generate([P], 1, kv_transfer_params={"do_remote_decode": True})
        params = first["kv_transfer_params"][0]
        assert params["kvstore_blocks"] == len(P) // BLOCK, prefill.log()[-3000:]
        assert "kvstore_save_error" not in params
        assert first["tokens"][0] == plain["p"][:1]
        assert first["stats"]["worker"]["save_failures"] == 0
        # Named as a hybrid layout: one group tag per KV cache group (groups.py), one object a chunk.
        layout = unquote(first["stats"]["namespace"].split("/")[2])
        assert f"s{BLOCK}w{_shape()['sliding_window']}" in layout and f"f{BLOCK}" in layout, layout
        assert first["stats"]["parts"] is None
    finally:
        prefill.close()

    decode = _instance("decode", hybrid_model, kv_config("kv_consumer", meta))
    try:
        out = decode.generate([P], MAX_TOKENS, kv_transfer_params=params)
        worker = out["stats"]["worker"]
        assert worker["load_failures"] == 0 and worker["load_blocks"] == (len(P) - 1) // BLOCK
        assert out["cached_tokens"][0] == (len(P) - 1) // BLOCK * BLOCK
        assert out["tokens"][0] == plain["p"]
    finally:
        decode.close()

    # A fresh kv_both instance: its prefix cache is empty, so Q's hit is the store's alone.
    both = _instance("both", hybrid_model, kv_config("kv_both", meta))
    try:
        out = both.generate([Q], MAX_TOKENS)
        hit = out["cached_tokens"][0]
        print(
            f"repeated-prefix request on a fresh instance: {hit} hit tokens with kvstore, "
            f"{plain['q_fresh_cached']} without; vLLM's own prefix cache, same instance: {plain['q_local_cached']}"
        )
        assert out["stats"]["worker"]["load_failures"] == 0
        assert hit == len(PREFIX) == plain["q_local_cached"] and plain["q_fresh_cached"] == 0
        assert out["tokens"][0] == plain["q"]
    finally:
        both.close()


def test_hybrid_load_failure_is_recomputed_by_request(
    store: tuple[str, Any], hybrid_model: str, plain: dict[str, Any]
) -> None:
    """Chunks listed by the lookup but unreadable (replaced by objects of the wrong size): the load
    fails, the worker reports the request in failed_recving (vLLM refuses block-level failures
    for several groups), and vLLM recomputes it: plain vLLM's tokens, no crash."""
    meta = store[0]
    prefill = _instance("prefill-2", hybrid_model, kv_config("kv_producer", meta))
    try:
        first = prefill.generate([R], 1, kv_transfer_params={"do_remote_decode": True})
        namespace = first["stats"]["namespace"]
    finally:
        prefill.close()
    tenant, model, layout = (unquote(p) for p in namespace.split("/"))
    scheme = KeyScheme(model=model, layout=layout, block_size=BLOCK, tenant=tenant)
    keys = scheme.object_keys(scheme.block_hashes(R))
    with KVClient(meta) as kv:
        kv.remove_many(keys, force=True)
        kv.put_many(keys, [b"x" * 64 for _ in keys])
    decode = _instance("decode-2", hybrid_model, kv_config("kv_consumer", meta))
    try:
        out = decode.generate([R], MAX_TOKENS, kv_transfer_params=first["kv_transfer_params"][0])
        assert out["stats"]["worker"]["load_failures"] == 1
        assert out["tokens"][0] == plain["r"]
        assert "could not load its chunks" in decode.log()
    finally:
        decode.close()
