"""The KV indexer API on the metadata service's admin face, over real HTTP: what the store holds by
token ids and by hash, an engine registered by its vLLM event endpoint, and bad input refused."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from kvstore import blockhash
from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.engines.keys import KeyScheme
from tests.cluster import ADMIN_TOKEN, found, wait_until

ENV = {"KVSTORE_META_ADMIN_PORT": "0", "KVSTORE_LOG_LEVEL": "INFO"}
SCHEME = KeyScheme(model="tiny", layout="f32-2p", block_size=4)
TOKENS = list(range(1000, 1030))  # 7 full blocks and 2 tokens


def admin_of(proc) -> str:
    return "http://" + found(r"admin \(HTTP\) on (\S+)", "".join(proc.lines)).group(1)


def post(url: str, body, token: str | None = None) -> tuple[int, dict[str, Any]]:
    """POST `body`; `token` (for the operator's calls: /register, /unregister) as a bearer token."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method="POST"), timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def service(cluster):
    proc, meta = cluster.meta(ENV)
    cluster.daemon(meta, "64MiB")
    with KVClient(meta, ClientConfig()) as client:
        yield admin_of(proc), client


def test_the_store_answers_by_tokens_and_by_hash(service):
    admin, client = service
    hashes = SCHEME.block_hashes(TOKENS)
    client.put_many(SCHEME.object_keys(hashes[:5], [0, 1]), [b"k" * 256] * 10)  # per-layer parts
    query = {"model": "tiny", "token_ids": TOKENS, "block_size": 4}

    def store_tokens() -> int:
        return post(f"{admin}/query", query)[1]["default"]["kvstore"]["longest_matched"]

    wait_until(lambda: store_tokens() == 20, what="the indexer to see the blocks")
    status, answer = post(f"{admin}/query", query)
    assert status == 200
    assert answer == {"default": {"kvstore": {"longest_matched": 20, "GPU": 0, "CPU": 20, "DISK": 0, "DP": {}}}}
    by_hash = {"model": "tiny", "block_size": 4, "seq_hashes": [blockhash.short(h) for h in hashes]}
    assert post(f"{admin}/query_by_hash", by_hash)[1]["default"]["kvstore"]["longest_matched"] == 20

    # Other identities see nothing: another tenant, another model, another salt or seed.
    for other in ({"tenant_id": "t2"}, {"model": "other"}, {"cache_salt": "s"}, {"seed": 3}):
        assert (
            post(f"{admin}/query", {**query, **other})[1][str(other.get("tenant_id", "default"))]["kvstore"][
                "longest_matched"
            ]
            == 0
        )
    client.remove_many(SCHEME.object_keys(hashes[2:3], [0, 1]))
    wait_until(lambda: store_tokens() == 8, what="the removal to reach the indexer")


def test_a_registered_vllm_publisher_is_indexed_by_its_instance(service):
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    from tests.vllm.harness import free_port

    admin, _ = service
    port, replay = free_port(), free_port()
    publisher = kv_events.ZmqEventPublisher(0, endpoint=f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay}")
    registration = {
        "endpoint": f"tcp://127.0.0.1:{port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay}",
        "type": "vLLM",
        "modelname": "tiny",
        "tenant_id": "default",
        "instance_id": "decode-0",
        "block_size": 4,
        "dp_rank": 1,
    }
    try:
        assert post(f"{admin}/register", registration, ADMIN_TOKEN) == (
            200,
            {"status": "registered successfully", "instance_id": "decode-0"},
        )
        query = {"model": "tiny", "token_ids": TOKENS, "block_size": 4}

        def engine_tokens() -> int:
            # vLLM names the blocks by its own hashes (here 7001...); the indexer places them by
            # their tokens. Published until seen: the subscription joins asynchronously.
            publisher.publish(
                kv_events.KVEventBatch(
                    ts=time.time(),
                    events=[
                        kv_events.BlockStored(
                            block_hashes=[7001, 7002, 7003],
                            parent_block_hash=None,
                            token_ids=TOKENS[:12],
                            block_size=4,
                            lora_id=None,
                            medium="GPU",
                            lora_name=None,
                        )
                    ],
                )
            )
            return post(f"{admin}/query", query)[1]["default"].get("decode-0", {}).get("longest_matched", 0)

        wait_until(lambda: engine_tokens() == 12, what="the indexer to consume the engine's events")
        answer = post(f"{admin}/query", {**query, "instance_id": "decode-0"})[1]
        assert answer == {
            "default": {"decode-0": {"longest_matched": 12, "GPU": 12, "CPU": 0, "DISK": 0, "DP": {"1": 12}}}
        }
        assert post(f"{admin}/unregister", {"instance_id": "decode-0", "tenant_id": "default"}, ADMIN_TOKEN) == (
            200,
            {"status": "unregistered successfully", "removed_instances": ["decode-0|default|1"]},
        )
        assert "decode-0" not in post(f"{admin}/query", query)[1]["default"]
        assert post(f"{admin}/unregister", {"instance_id": "decode-0"}, ADMIN_TOKEN)[0] == 404
    finally:
        publisher.shutdown()


def test_bad_requests_are_refused_with_the_reason_and_the_service_keeps_serving(service):
    admin, _ = service
    cases = [
        (b"not json", "JSON"),
        (b"[1, 2]", "JSON object"),
        ({"token_ids": [1], "block_size": 4}, "'model' is required"),
        ({"model": "m", "token_ids": "abc", "block_size": 4}, "'token_ids' must be a list of integers"),
        ({"model": "m", "token_ids": [1], "block_size": 0}, "'block_size' must be positive"),
        ({"model": "m", "token_ids": [1], "block_size": True}, "'block_size' must be an integer"),
    ]
    for body, reason in cases:
        status, answer = post(f"{admin}/query", body)
        assert status == 400 and reason in answer["error"], (body, answer)
    assert post(f"{admin}/query_by_hash", {"model": "m", "block_size": 4, "seq_hashes": [-1]})[0] == 400
    status, answer = post(
        f"{admin}/register",
        {"endpoint": "nonsense", "instance_id": "x", "modelname": "m", "block_size": 4},
        ADMIN_TOKEN,
    )
    assert status == 400 and "cannot subscribe" in answer["error"]
    status, answer = post(
        f"{admin}/register",
        {"endpoint": "tcp://127.0.0.1:1", "instance_id": "kvstore", "modelname": "m", "block_size": 4},
        ADMIN_TOKEN,
    )
    assert status == 400 and "store's own" in answer["error"]
    assert post(f"{admin}/nope", {})[0] == 404
    assert post(f"{admin}/query", {"model": "m", "token_ids": [1, 2, 3, 4], "block_size": 4})[0] == 200
