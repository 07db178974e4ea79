"""A store of several metadata shards (`kvstore serve --shards S`, and `kvstore meta --shard I/S`
on Redis): every keyed call reaches its key's shard, batches split and come back in order, a
shard refuses a key it does not own (typed), stats add the shards up, tenants live on all."""

from __future__ import annotations

import os

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import KeyNotFound, Unauthenticated, Unavailable, WrongShard
from kvstore.meta.shardmap import RedisShards
from kvstore.metaclient.client import MetaClient
from kvstore.metaclient.rediskeys import Keys
from kvstore.metaclient.sharded import ShardedMetaClient
from kvstore.results import TenantInfo
from kvstore.shards import ShardSpec, shard_of
from kvstore.types import Tier
from kvstore.wire.calls import Describe, Exists, Get, ServiceInfo, TenantAdd, TenantList, TenantRevoke, TenantToken
from tests.cluster import Cluster, wait_until
from tests.redis_server import RedisServer


def shard_addresses(meta: MetaClient | ShardedMetaClient) -> tuple[str, ...]:
    shards = meta.call(ServiceInfo()).shards
    assert shards is not None, "the service is not sharded"
    return shards.addresses


def values(keys: list[str]) -> list[bytes]:
    return [k.encode() + os.urandom(16) * 64 for k in keys]


@pytest.fixture(scope="module")
def sharded():
    cluster = Cluster()
    _, address = cluster.serve("192MiB", "--shards", "3")
    yield address
    cluster.close()


def test_every_call_reaches_its_keys_shard(sharded):
    keys = [f"sh/{i}" for i in range(600)]
    data = values(keys)
    with KVClient(sharded) as client:
        client.put_many(keys, data)
        assert client.meta.shard_count == 3
        assert client.get_many(keys) == data  # split, and back in order
        assert client.exists_many([*keys[:50], "sh/absent"]) == [True] * 50 + [False]
        assert client.match_prefix([*keys[:30], "sh/absent", *keys[30:40]]) == 30
        stats = client.stats()
        assert stats.shards == 3 and [s.shard for s in stats.per_shard] == [0, 1, 2]
        assert sum(s.keys for s in stats.per_shard) == stats.keys >= 600
        assert all(s.capacity > 0 for s in stats.per_shard)  # the daemon offers every shard a slice
        assert len(stats.daemons) == 1 and len(stats.daemons[0].segments) == 3
        owners = [MetaClient(a) for a in shard_addresses(client.meta)]
        try:
            for key in keys[100:130]:  # on its owner, and only there
                assert owners[shard_of(key, 3)].call(Exists([key])) == [True]
                with pytest.raises(WrongShard):
                    owners[(shard_of(key, 3) + 1) % 3].call(Exists([key]))
        finally:
            for owner in owners:
                owner.close()
        page = client.list_keys("sh/1", 7)
        assert list(page.keys) == sorted(k for k in keys if k.startswith("sh/1"))[:7] and page.next_cursor
        assert client.remove_many(keys[:100]) == [None] * 100
        assert client.exists_many(keys[:100]) == [False] * 100
        got = client.get_many_into([*keys[:3], "sh/absent"], [bytearray(2048) for _ in range(4)], strict=False)
        assert isinstance(got[3], KeyNotFound)


def test_a_tagged_chain_lives_on_one_shard_and_match_prefix_is_one_call(sharded):
    chain = [f"t/m/{{chain-a}}/{i:04x}" for i in range(32)]
    with KVClient(sharded) as client:
        client.put_many(chain[:20], values(chain[:20]))
        assert client.match_prefix(chain) == 20
        before = [s.keys for s in client.stats().per_shard]
        client.put_many(chain[20:], values(chain[20:]))
        after = [s.keys for s in client.stats().per_shard]
        grew = [b - a for a, b in zip(before, after)]
        assert sorted(grew) == [0, 0, 12]  # all on the tag's shard


def test_a_shard_refuses_a_key_it_does_not_own_typed(sharded):
    with MetaClient(sharded) as meta:
        addresses = shard_addresses(meta)
    key = next(f"w/{i}" for i in range(100) if shard_of(f"w/{i}", 3) == 0)
    with MetaClient(addresses[1]) as other:
        with pytest.raises(WrongShard) as refused:
            other.call(Exists([key]))
        assert "shard" in str(refused.value)
        assert other.call(Exists([k for k in (f"w/{i}" for i in range(100)) if shard_of(k, 3) == 1][:3])) == [False] * 3


def test_a_get_of_no_keys_hands_every_shards_leases_back(sharded):
    """How a reader hands its leases back when it reads nothing more: a Get of no keys, which
    visits each shard that granted one."""
    keys = [next(k for k in (f"ls/{s}/{i}" for i in range(100)) if shard_of(k, 3) == s) for s in range(3)]
    with KVClient(sharded) as client:
        client.put_many(keys, values(keys))
        got = client.meta.call(Get(keys, client_id="lease-test"))
        assert all(r.lease_id for r in got.results)
        assert all(info.lease_s > 0 for info in client.meta.call(Describe(keys)))
        client.meta.call(Get([], released=[r.lease_id for r in got.results], client_id="lease-test"))
        assert [info.lease_s for info in client.meta.call(Describe(keys))] == [0.0] * 3


def test_a_tenant_made_on_some_shards_only_is_completed_by_an_update(sharded):
    """An admin call that stopped part way (a shard down) leaves the tenant on some shards; the
    same call with --update makes it on the rest."""
    with KVClient(sharded) as admin:
        addresses = shard_addresses(admin.meta)
        with MetaClient(addresses[0]) as first:
            first.call(TenantAdd(TenantInfo("partial", quotas={Tier.DRAM: 3 << 20})))
        admin.meta.call(TenantAdd(TenantInfo("partial", quotas={Tier.DRAM: 30 << 20}), update=True))
        for address in addresses:
            with MetaClient(address) as shard:
                found = {t.name: t for t in shard.call(TenantList())}
                assert found["partial"].quotas[Tier.DRAM] == 10 << 20  # a third of it on each
        _, token = admin.meta.call(TenantToken("partial"))
    keys = [f"part/{i}" for i in range(30)]
    with KVClient(sharded, ClientConfig(token=token, transports=("tcp",))) as tenant:
        tenant.put_many(keys, values(keys))  # every shard knows the tenant
        assert tenant.exists_many(keys) == [True] * 30


def test_tenants_exist_on_every_shard_with_one_token(sharded):
    with KVClient(sharded) as admin:
        admin.meta.call(TenantAdd(TenantInfo("sharded", quotas={Tier.DRAM: 30 << 20})))
        _, token = admin.meta.call(TenantToken("sharded"))
        listed = {t.name: t for t in admin.meta.call(TenantList())}["sharded"]
        assert listed.quotas[Tier.DRAM] >= 30 << 20  # each shard holds a third of it
    keys = [f"ten/{i}" for i in range(60)]
    data = values(keys)
    with KVClient(sharded, ClientConfig(token=token, transports=("tcp",))) as tenant:
        tenant.put_many(keys, data)
        assert tenant.get_many(keys) == data
    with KVClient(sharded) as admin:
        assert admin.exists_many(keys) == [False] * 60  # the tenant's own namespace
        assert admin.meta.call(TenantRevoke("sharded")) == 1
    with (
        KVClient(sharded, ClientConfig(token=token, transports=("tcp",))) as revoked,
        pytest.raises(Unauthenticated),
    ):
        revoked.get_many(keys)


@pytest.mark.slow
def test_shards_on_redis_each_restart_with_their_own_keys(tmp_path):
    redis = RedisServer(tmp_path / "redis").start()
    cluster = Cluster()
    fast = {
        "KVSTORE_META_REDIS_URL": redis.url,
        "KVSTORE_META_LEADER_TTL_S": "2",
        "KVSTORE_META_LEADER_RENEW_S": "0.3",
        "KVSTORE_DAEMON_HEARTBEAT_INTERVAL_S": "0.5",
    }
    try:
        procs = [cluster.meta(fast, "--shard", f"{i}/2") for i in range(2)]
        url = f"{redis.url}?cluster=default"
        cluster.daemon(url, "64MiB", fast)
        keys = [f"r/{i}" for i in range(200)]
        data = values(keys)
        with KVClient(url) as client:
            wait_until(lambda: _writable(client), timeout=60, what="both shards open")
            client.put_many(keys, data)
        proc, address = procs[1]
        proc.kill()  # shard 1 dies; shard 0 serves on
        with KVClient(url, ClientConfig(timeout_s=3)) as client:
            mine = [k for k in keys if shard_of(k, 2) == 0]
            assert client.get_many(mine) == [d for k, d in zip(keys, data) if shard_of(k, 2) == 0]
        cluster.meta(fast, "--shard", "1/2", "--port", address.rsplit(":", 1)[1])
        with KVClient(url) as client:
            wait_until(lambda: _writable(client), timeout=60, what="shard 1 back")
            assert client.get_many(keys) == data  # every committed key of both
    finally:
        cluster.close()
        redis.stop()


def _writable(client: KVClient) -> bool:
    try:
        stats = client.stats()
        return stats.shards == 2 and all(s.writes_open and s.reconciling == 0 for s in stats.per_shard)
    except Exception:  # noqa: BLE001 - not up yet
        return False


def test_the_shard_map_in_redis_outlives_redis_or_is_a_typed_error(tmp_path):
    """With Redis gone a shard answers ServiceInfo from the map it read last; one that never read
    it says Unavailable (retry), not a raw Redis error."""
    import redis

    server = RedisServer(tmp_path).start()
    try:
        client = redis.Redis.from_url(server.url)
        client.hset(Keys.of_shard("m", 1).leader, "addr", "127.0.0.1:7001")
        seen, unseen = (RedisShards(client, "m", ShardSpec.parse("0/2")) for _ in range(2))
        read = seen.current()
        assert read.addresses == ("", "127.0.0.1:7001") and read.missing(0) == []
        server.kill()
        assert seen.current() == read
        with pytest.raises(Unavailable, match="Redis"):
            unseen.current()
    finally:
        server.kill()
