from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, Proc
from tests.redis_server import RedisClusterServer, RedisServer

# Short leases and grants, so a takeover (lease TTL, then the old grants' lifetime) takes seconds.
FAST = {
    "KVSTORE_META_LEADER_TTL_S": "2",
    "KVSTORE_META_LEADER_RENEW_S": "0.3",
    "KVSTORE_META_LEASE_TTL_S": "2",
    "KVSTORE_META_WRITE_GRANT_TTL_S": "2",
    "KVSTORE_META_PUT_LEASE_TTL_S": "4",
    "KVSTORE_META_HEARTBEAT_TTL_S": "6",
    "KVSTORE_META_ADMIN_PORT": "0",
    "KVSTORE_DAEMON_HEARTBEAT_INTERVAL_S": "0.5",
}


@pytest.fixture(params=["redis", "redis-cluster"])
def redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer | RedisClusterServer]:
    """Each durable-metadata test on one Redis and on a 3-master Redis Cluster (with replicas)."""
    server: RedisServer | RedisClusterServer
    if request.param == "redis":
        server = RedisServer(tmp_path / "redis").start()
    else:
        server = RedisClusterServer(tmp_path / "redis-cluster").start()
    yield server
    server.stop()


@pytest.fixture
def ha() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.close()


def meta_on(
    cluster: Cluster, redis: RedisServer | RedisClusterServer, *extra: str, env: dict[str, str] | None = None
) -> tuple[Proc, str, str]:
    """A metadata service on `redis`: (process, address, admin address)."""
    proc, address = cluster.meta({**FAST, "KVSTORE_META_REDIS_URL": redis.url, **(env or {})}, *extra)
    admin = re.search(r"admin=(\S+)", proc.ready_line)
    return proc, address, admin.group(1) if admin else ""
