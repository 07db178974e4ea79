"""Each durability mode is kept by the Redis underneath, or the service refuses to start (or, run
with durability_unchecked, says so in stat and /metrics); the fence cannot repeat across a Redis
failover that lost the epoch's INCR. Real redis-server and `kvstore meta` processes."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.errors import KVStoreError
from kvstore.meta.journal import Changes
from kvstore.meta.redisdb import RedisRecords
from kvstore.metaclient.client import MetaClient
from kvstore.metaclient.rediskeys import Keys, connect
from kvstore.wire.calls import Stats
from tests.cluster import Cluster, wait_until
from tests.ha.conftest import meta_on
from tests.redis_server import RedisServer


@pytest.fixture
def bare_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A stock Redis as many run it: RDB snapshots only, no AOF."""
    server = RedisServer(tmp_path / "redis").start(20.0, "--appendonly", "no")
    yield server
    server.stop()


@pytest.fixture
def aof_everysec(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def test_a_redis_without_its_aof_is_refused_naming_the_way_out(ha: Cluster, bare_redis):
    with pytest.raises(RuntimeError, match=r"appendonly no.*durability-unchecked"):
        meta_on(ha, bare_redis)


def test_durability_always_on_an_aof_fsynced_everysec_is_refused(ha: Cluster, aof_everysec):
    with pytest.raises(RuntimeError, match="fsyncs its AOF everysec, not always"):
        meta_on(ha, aof_everysec, env={"KVSTORE_META_DURABILITY": "always"})


def test_replicas_that_redis_does_not_have_are_refused(ha: Cluster, aof_everysec):
    with pytest.raises(RuntimeError, match="has 0 replicas, not 1"):
        meta_on(ha, aof_everysec, env={"KVSTORE_META_DURABILITY": "replicas:1"})


def test_run_unchecked_it_says_so_in_stat_and_metrics(ha: Cluster, bare_redis):
    _, address, admin = meta_on(ha, bare_redis, env={"KVSTORE_META_DURABILITY_UNCHECKED": "1"})
    with MetaClient(address, timeout_s=2) as meta:
        wait_until(lambda: _stats(meta) is not None and meta.call(Stats()).role == "leader", 30, "a leader")
        stats = meta.call(Stats())
    assert "durability everysec UNCHECKED" in stats.redis and "appendonly no" in stats.redis
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as response:
        assert "kvstore_meta_durability_unchecked 1.0" in response.read().decode()


def _stats(meta: MetaClient):
    try:
        return meta.call(Stats())
    except KVStoreError:
        return None


def test_a_writer_whose_epoch_repeats_after_a_lost_incr_is_fenced_by_its_lease_token(aof_everysec):
    """An asynchronous Redis failover can lose the epoch's INCR: the next leader is handed the
    epoch the deposed one writes under. The lease token tells them apart."""
    client = connect(aof_everysec.url)
    keys = Keys("default")
    records = RedisRecords(client, keys)
    client.set(keys.epoch, 7)
    client.hset(keys.leader, mapping={"addr": "new:1", "epoch": 7, "token": "successor"})
    change = Changes(objects={"k": b"record"})
    with pytest.raises(Exception, match="FENCED"):
        records.writer(7, "deposed")(change)
    assert client.hget(keys.obj, "k") is None
    records.writer(7, "successor")(change)
    assert client.hget(keys.obj, "k") == b"record"
    client.delete(keys.leader)  # the lease ran out and nobody holds it: nobody writes
    with pytest.raises(Exception, match="FENCED"):
        records.writer(7, "successor")(Changes(objects={"k2": b"x"}))
