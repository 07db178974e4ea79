"""Metadata on a real Redis Cluster: a master killed in a put stream (its replica takes over the
slot) loses no put that was acknowledged with durability replicas:1. The promoted replica has no
replica of its own until the dead node comes back (as its replica): until then no write can be
acknowledged with replicas:1, and the service refuses writes (typed Unavailable) rather than
acknowledge one that rests on a single copy."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvstore.client import KVClient
from kvstore.metaclient.rediskeys import Keys
from tests.cluster import Cluster, wait_until
from tests.ha.conftest import FAST, meta_on
from tests.ha.test_ha import PutStream, value, writes_open
from tests.redis_server import RedisClusterServer


@pytest.fixture
def redis_cluster(tmp_path: Path):
    server = RedisClusterServer(tmp_path / "redis-cluster").start()
    yield server
    server.stop()


@pytest.mark.slow
def test_killing_the_records_master_loses_no_put_acknowledged_with_replicas_1(ha: Cluster, redis_cluster):
    master = redis_cluster.master_of(Keys("default").obj)
    meta, address, _ = meta_on(ha, redis_cluster, env={"KVSTORE_META_DURABILITY": "replicas:1"})
    port = address.rsplit(":", 1)[1]
    ha.daemon(address, "64MiB", FAST)
    wait_until(lambda: writes_open(address), timeout=30, what="writes open")
    stream = PutStream(address, "c", 4)
    acked = stream.acked
    wait_until(lambda: len(acked) >= 100, timeout=60, what="puts before the kill")
    master.kill()
    killed_at = time.monotonic()
    survivors = [n for n in redis_cluster.nodes if n is not master]
    wait_until(lambda: all(n.cluster_ok() for n in survivors), timeout=60, what="the replica promoted")
    # The promoted replica has no replica: writes are refused (typed), none acknowledged.
    promoted_acked, failed = len(acked), len(stream.failed)
    wait_until(lambda: len(stream.failed) > failed, timeout=60, what="a put refused on the lone promoted replica")
    assert len(acked) == promoted_acked
    master.start_cluster_node()  # the operator restarts the dead node: it rejoins as a replica
    wait_until(master.cluster_ok, timeout=60, what="the old master back as a replica")
    before = len(acked)
    wait_until(lambda: len(acked) > before + 8, timeout=90, what="puts acknowledged after the failover")
    print(f"Redis Cluster failover: puts acknowledged again {time.monotonic() - killed_at:.1f} s after the kill")
    stream.stop()
    # Every acknowledged put is in the promoted replica's records: a fresh service loads them all.
    meta.kill()
    meta_on(ha, redis_cluster, "--port", port, env={"KVSTORE_META_DURABILITY": "replicas:1"})
    wait_until(lambda: writes_open(address), timeout=60, what="the fresh service to take over")
    with KVClient(address) as client:
        assert all(client.exists_many(acked))
        assert client.get_many(acked) == [value(k) for k in acked]
