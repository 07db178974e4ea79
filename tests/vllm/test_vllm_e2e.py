"""kvstore's vLLM connector end to end, on vLLM's CPU build with a tiny Llama made offline.

Every vLLM instance is its own process (in-process engine mode, ~15-20 s to start), loading the
connector the way vLLM loads any third-party connector (kv_connector_module_path). Four instances
serve the whole module: a plain one for the expected tokens, a prefill (kv_producer), a decode
(kv_consumer) and a kv_both instance with another block size and the other transfer modes.
The daemon-kill test runs last: it takes the store's only daemon down.
"""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from kvstore.client import KVClient
from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import Instance, kv_config
from tests.vllm.tiny_model import prompt_ids

pytestmark = [pytest.mark.slow, needs_vllm, pytest.mark.timeout(600)]

BLOCK = 32
P_PD = prompt_ids(300, 1)  # 9 full blocks of 32 below the last token
P_KILL = prompt_ids(260, 2)
P_CORRUPT = prompt_ids(200, 3)
PREFIX = prompt_ids(256, 4)  # 4 blocks of 64
Y = PREFIX + prompt_ids(40, 5)
X = PREFIX + prompt_ids(70, 6)
MAX_TOKENS = 12


def _instance(name, tiny_model, kv=None, **settings):
    return Instance(
        name, {"model": tiny_model, "block_size": BLOCK, **settings, **({"kv_transfer_config": kv} if kv else {})}
    )


@pytest.fixture(scope="module")
def expected(tiny_model):
    """Tokens of a plain vLLM run, without any connector."""
    plain = _instance("plain", tiny_model)
    try:
        out = plain.generate([P_PD, P_KILL, P_CORRUPT, Y], MAX_TOKENS)["tokens"]
    finally:
        plain.close()
    return dict(zip(["pd", "kill", "corrupt", "y"], out))


@pytest.fixture(scope="module")
def prefill(store, tiny_model):
    inst = _instance("prefill", tiny_model, kv_config("kv_producer", store[0]))
    yield inst
    inst.close()


@pytest.fixture(scope="module")
def decode(store, tiny_model):
    inst = _instance("decode", tiny_model, kv_config("kv_consumer", store[0]))
    yield inst
    inst.close()


def _pd(prefill, decode, prompt):
    """The PD hand-off as a proxy does it: prefill with max_tokens=1, then decode with the
    prefill's kv_transfer_params."""
    first = prefill.generate([prompt], 1, kv_transfer_params={"do_remote_decode": True})
    params = first["kv_transfer_params"][0]
    assert params["kvstore_blocks"] == len(prompt) // BLOCK
    before = decode.call(op="stats")["worker"]
    out = decode.generate([prompt], MAX_TOKENS, kv_transfer_params=params)
    after = out["stats"]["worker"]
    return first, out, {k: after[k] - before[k] for k in after}


def test_decode_loads_prefill_kv_and_matches_plain_vllm(expected, prefill, decode):
    first, out, delta = _pd(prefill, decode, P_PD)
    assert first["tokens"][0] == expected["pd"][:1]
    loaded_blocks = (len(P_PD) - 1) // BLOCK
    assert delta["load_blocks"] == loaded_blocks and delta["load_failures"] == 0
    assert out["stats"]["scheduler"]["hit_tokens"] >= loaded_blocks * BLOCK == 288
    assert out["tokens"][0] == expected["pd"]


def test_decode_really_uses_the_loaded_kv(expected, store, prefill, decode):
    """Replace the stored blocks with zeros: the decode instance loads them and its output changes,
    so the tokens above came from kvstore's KV, not from a silent recompute."""
    first = prefill.generate([P_CORRUPT], 1)
    namespace = prefill.call(op="stats")["namespace"]
    from kvstore.engines.keys import KeyScheme

    tenant, model, layout = (unquote(p) for p in namespace.split("/"))
    scheme = KeyScheme(model=model, layout=layout, block_size=BLOCK, tenant=tenant)
    keys = scheme.object_keys(scheme.block_hashes(P_CORRUPT), [0, 1])
    with KVClient(store[0]) as kv:
        sizes = [len(v) for v in kv.get_many(keys)]
        kv.remove_many(keys, force=True)
        kv.put_many(keys, [bytes(n) for n in sizes])
    out = decode.generate([P_CORRUPT], MAX_TOKENS, kv_transfer_params=first["kv_transfer_params"][0])
    assert out["stats"]["worker"]["load_failures"] == 0
    assert out["tokens"][0] != expected["corrupt"]


def test_kv_both_reuses_a_shared_prefix_and_block_sizes_never_mix(expected, store, tiny_model, prefill):
    """kv_both with block size 64 (whole-block objects, loads before the forward pass): a second
    request sharing a 256-token prefix loads it; blocks stored by the block-32 instance are
    invisible to it, and its blocks to them."""
    prefill.generate([P_PD], 1)  # stored with block size 32 (also by the PD test)
    both = _instance(
        "both",
        tiny_model,
        kv_config("kv_both", store[0], granularity="block", load_async=False),
        block_size=64,
        prefix_caching=False,
    )
    try:
        other = both.generate([P_PD], 1)
        assert other["stats"]["worker"]["load_blocks"] == 0, "read blocks saved with another block size"
        assert other["stats"]["namespace"] != prefill.call(op="stats")["namespace"]
        both.generate([X], 1)  # stores the prefix (and more)
        out = both.generate([Y], MAX_TOKENS)
        stats = out["stats"]["worker"]
        assert stats["load_blocks"] == len(PREFIX) // 64 and stats["load_failures"] == 0
        assert out["tokens"][0] == expected["y"]
        before = prefill.call(op="stats")["worker"]["load_blocks"]
        prefill.generate([Y], 1)  # block 32: no block of `both` fits
        assert prefill.call(op="stats")["worker"]["load_blocks"] == before
    finally:
        both.close()


def test_daemon_killed_between_prefill_and_decode_recomputes(expected, store, prefill, decode):
    """Runs last. The blocks are still listed (the daemon is not yet declared dead), the loads
    fail, vLLM recomputes them (kv_load_failure_policy "recompute"), and the tokens are unchanged."""
    first = prefill.generate([P_KILL], 1)
    assert first["kv_transfer_params"][0]["kvstore_blocks"] == len(P_KILL) // BLOCK
    store[1].kill()
    before = decode.call(op="stats")["worker"]
    out = decode.generate([P_KILL], MAX_TOKENS, kv_transfer_params=first["kv_transfer_params"][0])
    after = out["stats"]["worker"]
    assert out["tokens"][0] == expected["kill"]
    assert after["load_failures"] - before["load_failures"] == 1
    assert after["failed_blocks"] - before["failed_blocks"] == (len(P_KILL) - 1) // BLOCK
    assert "vLLM recomputes" in decode.log()
    assert "Recovered from KV load failure" in decode.log()
