"""Prefix-aware routing: the PrefixAffinity choice of instance, and the PrefixIndex that learns
instances' caches from vLLM's own KV event publisher and the store's from kvstore's events."""

from __future__ import annotations

import time

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.engines.keys import KeyScheme
from kvstore.engines.router.affinity import PrefixAffinity
from kvstore.engines.router.policy import CostModel, FixedPolicy, InstanceLoad, Pools, Route, RouteRequest
from kvstore.engines.router.prefix_index import EventSource, PrefixIndex
from tests.cluster import found, wait_until

COLOCATED = Pools(colocated=("A", "B", "C"))
PD = Pools(prefill=("P1", "P2"), decode=("D1", "D2"))


def colocated():
    return PrefixAffinity(FixedPolicy(Route.COLOCATED, CostModel()))


def test_the_instance_holding_the_prefix_gets_the_request():
    d = colocated().decide(RouteRequest(1000, 0, {"B": 960}), COLOCATED, {})
    assert (d.route, d.target) == (Route.COLOCATED, "B")
    assert "prefix affinity: B holds 960 of 1000 tokens" in d.reason


def test_without_cached_prefixes_it_is_the_wrapped_policy():
    inner = FixedPolicy(Route.COLOCATED, CostModel())
    loads = {"A": InstanceLoad(2, 300), "B": InstanceLoad(1, 100)}
    assert colocated().decide(RouteRequest(1000), COLOCATED, loads) == inner.decide(
        RouteRequest(1000), COLOCATED, loads
    )
    assert colocated().decide(RouteRequest(1000, 0, {"A": 0}), COLOCATED, loads).target == "C"


def test_a_long_queue_outweighs_a_cached_prefix():
    loads = {"B": InstanceLoad(4, 2000)}
    assert colocated().decide(RouteRequest(1000, 0, {"B": 960}), COLOCATED, loads).target == "A"
    loads = {"B": InstanceLoad(1, 500)}  # 40 + 500 to do on B < 1000 elsewhere
    assert colocated().decide(RouteRequest(1000, 0, {"B": 960}), COLOCATED, loads).target == "B"


def test_what_the_store_holds_any_instance_can_load():
    # kvstore holds 900 of the prompt: A (no own cache) loads it, B has 960 in its own cache.
    cheap_loads = PrefixAffinity(FixedPolicy(Route.COLOCATED, CostModel()), lambda: 0.1)
    req = RouteRequest(1000, 900, {"B": 960})
    assert cheap_loads.decide(req, COLOCATED, {}).target == "B"  # 40 to compute vs 100 + 0.1 * 900
    busy_b = {"B": InstanceLoad(1, 200)}
    assert cheap_loads.decide(req, COLOCATED, busy_b).target == "A"  # B's queue outweighs a cheap load
    storeless = Pools(colocated=("A", "B", "C"), storeless=frozenset({"A", "C"}))
    assert cheap_loads.decide(req, storeless, busy_b).target == "B"  # A and C would compute all 1000


def test_pd_picks_the_prefill_and_the_decode_instance_by_their_caches():
    policy = PrefixAffinity(FixedPolicy(Route.PD, CostModel()))
    d = policy.decide(RouteRequest(2000, 0, {"P2": 1500, "D2": 800}), PD, {})
    assert (d.route, d.prefill, d.target) == (Route.PD, "P2", "D2")
    assert policy.name == "pd+prefix"


def test_bad_event_sources_are_refused():
    assert EventSource.parse("tcp://h:1,tcp://h:2") == EventSource("tcp://h:1", "tcp://h:2")
    for bad in ("", "h:1", "tcp://h:1,tcp://h:2,tcp://h:3"):
        with pytest.raises(ValueError):
            EventSource.parse(bad)


def test_the_index_learns_an_instance_from_vllms_publisher_and_the_store_from_kvstores(cluster):
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    from tests.vllm.harness import free_port

    proc, meta = cluster.meta({"KVSTORE_META_EVENTS_PORT": "0", "KVSTORE_LOG_LEVEL": "INFO"})
    endpoint, replay = found(r"KV events: epoch \d+ on (\S+) \(replay (\S+)\)", "".join(proc.lines)).groups()
    cluster.daemon(meta, "64MiB")
    port, replay_port = free_port(), free_port()
    publisher = kv_events.ZmqEventPublisher(0, endpoint=f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay_port}")
    index = PrefixIndex(block_size=4)
    index.watch_instance("http://a", EventSource(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"))
    index.watch_store(EventSource(endpoint, replay))
    tokens = list(range(500, 532))
    scheme = KeyScheme(model="tiny/model", layout="f32-2p-x-layer", block_size=4)
    try:
        with KVClient(meta, ClientConfig()) as client:
            hashes = scheme.block_hashes(tokens)

            def store_learned() -> bool:
                client.put_many(scheme.object_keys(hashes[:6], [0, 1]), [b"v" * 128] * 12)  # idempotent
                return index.lookup(tokens, "tiny/model").store_tokens == 24

            wait_until(store_learned, what="the store's events to reach the router")

            def instance_learned() -> bool:
                publisher.publish(
                    kv_events.KVEventBatch(
                        ts=time.time(),
                        events=[
                            kv_events.BlockStored(
                                block_hashes=[11, 12],
                                parent_block_hash=None,
                                token_ids=tokens[:8],
                                block_size=4,
                                lora_id=None,
                                medium="GPU",
                                lora_name=None,
                            )
                        ],
                    )
                )
                return index.lookup(tokens, "tiny/model").instance_tokens == {"http://a": 8}

            wait_until(instance_learned, what="vLLM's events to reach the router")
            assert index.lookup(tokens, "another-model").store_tokens == 0
            client.remove_many(scheme.object_keys(hashes[:1], [0]))  # a part gone: the block is still half there
            client.remove_many(scheme.object_keys(hashes[:1], [1]))
            wait_until(lambda: index.lookup(tokens, "tiny/model").store_tokens == 0, what="the removal")
    finally:
        index.close()
        publisher.shutdown()
