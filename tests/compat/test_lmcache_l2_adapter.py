"""kvstore's L2 adapter for LMCache's multi-process server, driven the way LMCache's store and
prefetch controllers drive it: LMCache's own ObjectKeys, memory objects and Bitmaps, results
collected after polling the adapter's event fds, against a real `kvstore serve`."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import select
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kvstore.client import KVClient
from kvstore.clock import FakeClock
from kvstore.compat.lmcache import l2_settings
from kvstore.compat.lmcache.l2_keys import key_string
from kvstore.config import ClientConfig
from kvstore.errors import InvalidArgument
from kvstore.metaclient.client import MetaClient
from kvstore.results import TenantInfo
from kvstore.wire.calls import TenantAdd, TenantToken

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lmcache") is None, reason="LMCache is not installed: run scripts/install_lmcache.sh"
)
SHAPE = (2, 4, 16, 64)  # a chunk of 16 tokens, 4 layers, fp16: 16 KiB


def chunk_key(i: int, salt: str = "", model: str = "org/model-1b") -> Any:
    from lmcache.v1.distributed.api import ObjectKey

    return ObjectKey(chunk_hash=i.to_bytes(4, "big") * 8, model_name=model, kv_rank=0x01000100, cache_salt=salt)


def memory_obj(fill: int | None = None, shape: tuple[int, ...] = SHAPE) -> Any:
    """An LMCache TensorMemoryObj over a CPU tensor (random values, or zeros)."""
    import torch
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    t = torch.zeros(shape, dtype=torch.float16) if fill is None else torch.randn(shape).to(torch.float16) + fill
    meta = MemoryObjMetadata(shape=t.shape, dtype=t.dtype, address=0, phy_size=t.numel() * 2, ref_count=1)
    meta.fmt = MemoryFormat.KV_2LTD
    return TensorMemoryObj(raw_data=t, metadata=meta, parent_allocator=None)


def await_result(fd: int, collect: Callable[[], Any]) -> Any:
    """What LMCache's controllers do: poll the event fd, drain it, collect; until a result."""
    from lmcache.v1.platform.event_notifier import consume_fd

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        result = collect()
        if result is not None:
            return result
        assert poller.poll(30_000), "the adapter never signalled its event fd"
        consume_fd(fd)


def store(adapter, keys, objs):
    task = adapter.submit_store_task(keys, objs)
    return await_result(adapter.get_store_event_fd(), lambda: adapter.pop_completed_store_tasks().get(task))


def lookup(adapter, keys) -> list[int]:
    task = adapter.submit_lookup_and_lock_task(keys, {})
    fd = adapter.get_lookup_and_lock_event_fd()
    found = await_result(fd, lambda: adapter.query_lookup_and_lock_result(task))
    assert adapter.query_lookup_and_lock_result(task) is None  # a result is handed out once
    return list(found.get_indices_list())


def load(adapter, keys, objs) -> list[int]:
    task = adapter.submit_load_task(keys, objs)
    loaded = await_result(adapter.get_load_event_fd(), lambda: adapter.query_load_result(task))
    assert adapter.query_load_result(task) is None
    return list(loaded.get_indices_list())


def make_adapter(meta: str, **params: Any):
    """Through LMCache's own `--l2-adapter` parsing and plug-in factory, as `lmcache server` does."""
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry

    spec = {
        "type": "plugin",
        "module_path": "kvstore.compat.lmcache.l2_adapter",
        "class_name": "KVStoreL2Adapter",
        "adapter_params": {"meta": meta, **params},
    }
    parser = add_l2_adapters_args(argparse.ArgumentParser())
    config = parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", json.dumps(spec)]))
    return create_l2_adapter_from_registry(config.adapters[0])


@pytest.fixture
def adapters(kvstore_meta):
    made: list[Any] = []

    def new(**params: Any):
        made.append(make_adapter(kvstore_meta, **params))
        return made[-1]

    yield new
    for adapter in made:
        adapter.close()


def test_a_round_trip_through_lmcaches_own_types_and_event_fds(adapters):
    import torch

    writer, reader = adapters(), adapters()  # two LMCache servers (hosts) sharing one pool
    assert type(writer).__name__ == "KVStoreL2Adapter"
    fds = {writer.get_store_event_fd(), writer.get_lookup_and_lock_event_fd(), writer.get_load_event_fd()}
    assert len(fds) == 3
    keys = [chunk_key(i) for i in range(100, 106)]
    objs = [memory_obj(fill=i) for i in range(6)]
    result = store(writer, keys, objs)
    assert result.is_successful() and result.bytes_transferred() == 6 * objs[0].get_size()
    assert writer.get_usage().total_bytes_used == result.bytes_transferred()
    assert store(writer, keys[:2], objs[:2]).bytes_transferred() == 0  # already stored: kept

    asked = [keys[0], keys[1], chunk_key(999), keys[3], keys[4], keys[5]]
    assert lookup(reader, asked) == [0, 1, 3, 4, 5]
    assert reader.report_status()["leases_held"] == 5
    outs = [memory_obj() for _ in asked]
    assert load(reader, asked, outs) == [0, 1, 3, 4, 5]
    for i, want in zip([0, 1, 3, 4, 5], [0, 1, 3, 4, 5]):
        assert torch.equal(outs[i].raw_data, objs[want].raw_data)
    assert not outs[2].raw_data.any()  # the miss left its buffer alone
    reader.submit_unlock(asked)  # the miss holds no lease: skipped
    assert reader.report_status()["leases_held"] == 0 and reader.report_status()["is_healthy"]
    reader.close()
    assert reader.report_status()["leases_released"] == 5


def test_a_lock_is_a_read_lease_each_unlock_hands_one_back(adapters, kvstore_meta):
    adapter = adapters()
    keys = [chunk_key(200), chunk_key(201)]
    assert store(adapter, keys, [memory_obj(1), memory_obj(2)]).is_successful()
    assert lookup(adapter, keys) == [0, 1]
    assert lookup(adapter, keys[:1]) == [0]  # locked twice by two prefetches
    with KVClient(kvstore_meta) as client:
        held = [info.lease_s for info in client.describe([key_string("lmcache/", k) for k in keys])]
        assert all(s > 0 for s in held)
        adapter.submit_unlock(keys)
        assert adapter.report_status()["leases_held"] == 1  # the second lock on keys[0] still holds
        adapter.submit_unlock(keys[:1])
        adapter.submit_unlock(keys[:1])  # an unlock too many is nothing
        adapter.close()
        assert [info.lease_s for info in client.describe([key_string("lmcache/", k) for k in keys])] == [0, 0]


def test_per_key_failures_are_reported_in_the_bitmaps(adapters):
    adapter = adapters()
    keys = [chunk_key(300), chunk_key(301), chunk_key(302)]
    assert store(adapter, keys, [memory_obj(i) for i in range(3)]).is_successful()
    small = memory_obj(shape=(1, *SHAPE[1:]))  # a buffer of another size: not this chunk
    assert load(adapter, keys, [memory_obj(), small, memory_obj()]) == [0, 2]
    assert adapter.report_status()["failed_keys"] == 1


def test_cache_salts_map_onto_tenants(kvstore_meta, adapters, monkeypatch):
    with MetaClient(kvstore_meta) as admin:
        for name in ("salt-a", "salt-b"):
            admin.call(TenantAdd(TenantInfo(name, trust_shm=True)))
            monkeypatch.setenv(f"KVSTORE_TOKEN_{name[-1].upper()}", admin.call(TenantToken(name))[1])
    adapter = adapters(salt_token_env={"a": "KVSTORE_TOKEN_A", "b": "KVSTORE_TOKEN_B"})
    same = [chunk_key(400, "a"), chunk_key(400, "b"), chunk_key(400, "c"), chunk_key(400)]
    assert store(adapter, same[:1], [memory_obj(1)]).is_successful()
    assert lookup(adapter, same) == [0]  # equal tokens, another salt: not shared
    assert store(adapter, same[1:], [memory_obj(2), memory_obj(3), memory_obj(4)]).is_successful()
    assert adapter.get_usage().bytes_by_cache_salt["a"] == memory_obj().get_size()
    tenant_a = ClientConfig(token=os.environ["KVSTORE_TOKEN_A"])
    with KVClient(kvstore_meta, tenant_a) as client, KVClient(kvstore_meta) as default:
        assert list(client.iter_keys("lmcache/")) == [key_string("lmcache/", same[0])]  # its namespace only
        assert default.exists_many([key_string("lmcache/", k) for k in same]) == [False, False, True, True]
    adapter.submit_unlock(same)


def test_a_salt_mapped_to_an_unset_token_fails_its_keys_not_the_others(adapters, monkeypatch):
    monkeypatch.delenv("KVSTORE_TOKEN_NOPE", raising=False)
    adapter = adapters(salt_token_env={"x": "KVSTORE_TOKEN_NOPE"})
    keys = [chunk_key(500, "x"), chunk_key(501)]
    result = store(adapter, keys, [memory_obj(1), memory_obj(2)])
    assert not result.is_successful()  # LMCache's store result is per task
    assert lookup(adapter, keys) == [1]  # the other key was written all the same
    assert adapter.report_status()["failed_keys"] == 1
    adapter.submit_unlock(keys)


def collect_all(fd: int, tasks: list[int], query: Callable[[int], Any]) -> dict[int, Any]:
    """One controller with several tasks in flight: each wake-up, ask for every one still out."""
    out: dict[int, Any] = {}

    def step() -> dict[int, Any] | None:
        for task in tasks:
            if task not in out and (result := query(task)) is not None:
                out[task] = result
        return out if len(out) == len(tasks) else None

    return await_result(fd, step)


def test_the_store_and_prefetch_controllers_run_at_once_with_many_tasks_in_flight(adapters):
    """LMCache calls an adapter from two threads (its store and prefetch controllers), each with
    several tasks out; every task's result reaches its caller exactly once."""
    adapter = adapters(num_workers=3)
    ready = [[chunk_key(1000 + 10 * n + i) for i in range(4)] for n in range(6)]
    for keys in ready:
        assert store(adapter, keys, [memory_obj(i) for i in range(4)]).is_successful()

    def store_controller() -> None:
        batches = [[chunk_key(2000 + 10 * n + i) for i in range(4)] for n in range(6)]
        tasks = [adapter.submit_store_task(keys, [memory_obj(i) for i in range(4)]) for keys in batches]
        done: dict[int, Any] = {}

        def all_done() -> bool | None:
            done.update(adapter.pop_completed_store_tasks())
            return len(done) >= len(tasks) or None

        await_result(adapter.get_store_event_fd(), all_done)
        assert sorted(done) == sorted(tasks) and all(r.is_successful() for r in done.values())

    def prefetch_controller() -> None:
        fd = adapter.get_lookup_and_lock_event_fd()
        tasks = [adapter.submit_lookup_and_lock_task(keys, {}) for keys in ready]
        found = collect_all(fd, tasks, adapter.query_lookup_and_lock_result)
        assert [found[t].get_indices_list() for t in tasks] == [[0, 1, 2, 3]] * 6
        tasks = [adapter.submit_load_task(keys, [memory_obj() for _ in keys]) for keys in ready]
        loaded = collect_all(adapter.get_load_event_fd(), tasks, adapter.query_load_result)
        assert [loaded[t].get_indices_list() for t in tasks] == [[0, 1, 2, 3]] * 6
        for keys in ready:
            adapter.submit_unlock(keys)

    with ThreadPoolExecutor(2) as controllers:  # .result() raises what failed in its thread
        for running in [controllers.submit(store_controller), controllers.submit(prefetch_controller)]:
            running.result()
    status = adapter.report_status()
    assert status["leases_held"] == 0 and status["tasks_running"] == 0 and status["failed_keys"] == 0


def test_a_store_that_is_down_is_a_miss_and_unlocks_still_end(cluster):
    proc, meta = cluster.serve("32MiB")
    clock = FakeClock()
    from kvstore.compat.lmcache.l2_adapter import KVStoreL2Adapter

    adapter = KVStoreL2Adapter({"meta": meta}, client_config=ClientConfig(timeout_s=1), clock=clock)
    try:
        keys = [chunk_key(600), chunk_key(601)]
        assert store(adapter, keys, [memory_obj(1), memory_obj(2)]).is_successful()
        assert lookup(adapter, keys) == [0, 1]
        adapter._releaser.close()  # the background thread stops: this test steps its passes
        proc.kill()
        assert not store(adapter, [chunk_key(602)], [memory_obj(3)]).is_successful()
        assert lookup(adapter, keys) == [] and load(adapter, keys, [memory_obj(), memory_obj()]) == []
        assert not adapter.report_status()["is_healthy"]  # LMCache's /status shows it
        adapter.submit_unlock(keys)
        assert not adapter._releaser.flush()  # unreachable: kept while the leases could still hold
        assert adapter.report_status()["leases_pending_release"] == 2
        clock.advance(3600)  # the service has ended them on its own by now
        assert adapter._releaser.flush()
        status = adapter.report_status()
        assert status["leases_expired"] == 2 and status["leases_pending_release"] == 0
    finally:
        adapter.close()


def test_adapter_params_are_checked():
    assert l2_settings.parse({"meta": "h:1"}).key_prefix == "lmcache/"
    with pytest.raises(InvalidArgument, match="unknown"):
        l2_settings.parse({"meta": "h:1", "metta": "h:2"})
    with pytest.raises(InvalidArgument, match="num_workers"):
        l2_settings.parse({"meta": "h:1", "num_workers": 0})
    with pytest.raises(InvalidArgument, match="salt_token_env"):
        l2_settings.parse({"meta": "h:1", "salt_token_env": {"a": 1}})
    with pytest.raises(ValueError, match="num_workers"):  # as LMCache's own config classes raise
        make_adapter("h:1", num_workers="4")


def test_keys_are_lmcaches_native_l2_key_strings_behind_the_prefix():
    """The form LMCache's native L2 connectors (its Mooncake Store adapter among them) give an
    ObjectKey, so `key_prefix: ""` names the very keys they use."""
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import _object_key_to_string

    for key in (chunk_key(7), chunk_key(8, "team-a"), chunk_key(9, model="Qwen/Qwen3-8B")):
        assert key_string("", key) == _object_key_to_string(key)
        assert key_string("lmcache/", key) == "lmcache/" + _object_key_to_string(key)
