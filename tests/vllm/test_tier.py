"""kvstore as a vLLM secondary offloading tier, driven by vLLM's own TieringOffloadingManager.

Each Engine is one vLLM instance's offloading side, built by vLLM's OffloadingSpecFactory from a
kv_connector_extra_config naming the tier (tests/vllm/tiering.py), over a real `kvstore serve`.
"""

from __future__ import annotations

import pytest

from kvstore.errors import InvalidArgument
from tests.cluster import Cluster
from tests.vllm.conftest import needs_vllm

pytestmark = [needs_vllm, pytest.mark.timeout(120)]

if not needs_vllm.args[0]:
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    from benchmarks.engines.tiering import CHUNK_BYTES, Engine, offload_keys, payloads, tier_config
    from kvstore.engines.vllm import plugin
    from kvstore.engines.vllm.tier import KVStoreTier


@pytest.fixture(scope="module")
def meta():
    c = Cluster()
    try:
        yield c.serve("256MiB")[1]
    finally:
        c.close()


@pytest.fixture
def engines():
    made: list[Engine] = []

    def make(*tiers, **kwargs) -> Engine:
        made.append(Engine(list(tiers), **kwargs))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def test_the_factory_loads_the_tier_from_its_config(meta, engines):
    engine = engines(tier_config(meta, io_threads=2, client={"timeout_s": 5.0}))
    assert isinstance(engine.tier, KVStoreTier)
    assert engine.tier.tier_type == "KVStoreTier" and engine.tier.medium is Medium.CPU
    assert engine.tier.client.config.timeout_s == 5.0
    assert engine.tier.layout["payload_bytes"] == CHUNK_BYTES < engine.stride  # the padding is not stored


def test_the_plugin_names_the_tier_kvstore(meta, engines):
    found = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)  # vLLM's own discovery, from the entry point
    assert found["kvstore"] is plugin.register
    found["kvstore"]()
    plugin.register()  # vLLM may load plug-ins more than once in a process
    assert SecondaryTierFactory.get_tier_class({"type": "kvstore"}) is KVStoreTier
    engine = engines({"type": "kvstore", "meta": meta})
    assert engine.tier.tier_type == "kvstore"


def test_another_instance_loads_what_one_stored_byte_for_byte(meta, engines):
    a, b = engines(tier_config(meta)), engines(tier_config(meta))
    keys, values = offload_keys(1, 12), payloads(1, 12)
    a.store("a-1", keys, values)
    assert all(a.tier.client.exists_many(a.tier.keys.many(keys)))
    assert b.load("b-1", keys) == values
    assert b.tier._lookups.calls == 1  # twelve chunks asked about in one store call


def test_lookups_take_one_store_call_per_step_across_requests(meta, engines):
    a, b = engines(tier_config(meta)), engines(tier_config(meta))
    keys = offload_keys(2, 40)
    a.store("a-2", keys[:20], payloads(2, 20))
    contexts = [ReqContext(f"b-{i}") for i in range(4)]
    for ctx in contexts:
        b.manager.on_new_request(ctx)
    for i, ctx in enumerate(contexts):  # four requests, ten chunks each, in one step
        assert set(b.lookup(ctx, keys[i * 10 : (i + 1) * 10])) == {LookupResult.RETRY}
    b.step()
    b.settle()
    assert (b.tier._lookups.calls, b.tier._lookups.keys_asked) == (1, 40)
    results = [r for i, ctx in enumerate(contexts) for r in b.lookup(ctx, keys[i * 10 : (i + 1) * 10])]
    assert results == [LookupResult.HIT_PENDING] * 20 + [LookupResult.MISS] * 20  # hits: promotions begin
    stats = b.tier.get_stats()
    assert stats is not None and stats.reduce()["vllm:kv_offload_kvstore_lookup_calls"] == 1
    for ctx in contexts:
        b.manager.on_request_finished(ctx)


def test_instances_of_another_layout_never_read_each_others_chunks(meta, engines):
    a = engines(tier_config(meta))
    other_dtype = engines(tier_config(meta), dtype="bfloat16")
    other_size = engines(tier_config(meta), chunk_bytes=CHUNK_BYTES // 2)
    keys, values = offload_keys(3, 4), payloads(3, 4)
    a.store("a-3", keys, values)
    assert other_dtype.load("d-3", keys) == [None] * 4
    assert other_size.load("s-3", keys) == [None] * 4
    assert len({a.tier.keys.prefix, other_dtype.tier.keys.prefix, other_size.tier.keys.prefix}) == 3


def test_a_chunk_gone_before_its_load_fails_alone_and_is_recomputed(meta, engines):
    a, b = engines(tier_config(meta)), engines(tier_config(meta))
    keys, values = offload_keys(4, 6), payloads(4, 6)
    a.store("a-4", keys, values)
    ctx = ReqContext("b-4")
    b.manager.on_new_request(ctx)
    assert set(b.lookup(ctx, keys)) == {LookupResult.RETRY}
    b.step()
    b.settle()
    assert set(b.lookup(ctx, keys)) == {LookupResult.HIT_PENDING}  # promotions allocated
    gone = a.tier.keys.many(keys[::2])
    assert a.tier.client.remove_many(gone, force=True) == [None] * 3  # evicted between lookup and load
    b.step()  # submits the load job
    b.settle()
    results = b.lookup(ctx, keys)
    assert results == [LookupResult.MISS, LookupResult.HIT] * 3  # the missing three recompute
    b.manager.on_request_finished(ctx)
    b.step()
    assert b.load("b-4b", keys[1::2]) == values[1::2]


def test_a_dead_daemon_fails_the_load_and_the_request_recomputes(engines):
    c = Cluster()
    try:
        _, meta = c.meta({"KVSTORE_META_HEARTBEAT_TTL_S": "120"})  # the dead daemon's blocks stay listed
        daemon = c.daemon(meta, "64MiB")
        settings = {"client": {"timeout_s": 3.0, "replica_timeout_s": 0.5}}
        a, b = engines(tier_config(meta, **settings)), engines(tier_config(meta, **settings))
        keys, values = offload_keys(5, 4), payloads(5, 4)
        a.store("a-5", keys, values)
        ctx = ReqContext("b-5")
        b.manager.on_new_request(ctx)
        b.lookup(ctx, keys)
        b.step()
        b.settle()
        assert set(b.lookup(ctx, keys)) == {LookupResult.HIT_PENDING}
        daemon.kill()
        b.step()  # the load job starts against a dead daemon
        b.settle()  # and finishes: it must not hang
        assert b.lookup(ctx, keys) == [LookupResult.MISS] * 4  # reported failed: recompute
        b.manager.on_request_finished(ctx)
        b.step()
        assert not b.manager.has_pending_work()
    finally:
        c.close()


def test_events_report_what_the_tier_stored_and_lost(meta, engines):
    a = engines(tier_config(meta, enable_kv_events=True), events=True)
    b = engines(tier_config(meta, enable_kv_events=True), events=True)
    keys = offload_keys(6, 3)
    a.store("a-6", keys, payloads(6, 3))
    tier_events = [e for e in a.manager.take_events() if e.locality is not None]  # the primary's have none
    assert [(e.keys, e.removed, e.locality.value) for e in tier_events] == [(keys, False, "REMOTE")]
    ctx = ReqContext("b-6")
    b.manager.on_new_request(ctx)
    b.lookup(ctx, keys)
    b.step()
    b.settle()
    assert set(b.lookup(ctx, keys)) == {LookupResult.HIT_PENDING}
    a.tier.client.remove_many(a.tier.keys.many(keys[:1]), force=True)
    b.step()
    b.settle()
    b.lookup(ctx, keys)  # collects the load's result
    b.manager.on_request_finished(ctx)
    b.step()
    tier_events = [e for e in b.manager.take_events() if e.locality is not None]
    assert [(e.keys, e.removed) for e in tier_events] == [(keys[:1], True)]  # the store had lost it


def test_bad_settings_are_refused_with_a_clear_error(meta, monkeypatch):
    monkeypatch.delenv("KVSTORE_META", raising=False)
    with pytest.raises(InvalidArgument, match="needs the metadata service"):
        Engine([tier_config("")])
    with pytest.raises(InvalidArgument, match="client settings"):
        Engine([tier_config(meta, client={"no_such_setting": 1})])
    with pytest.raises(InvalidArgument, match="io_threads"):
        Engine([tier_config(meta, io_threads=0)])
