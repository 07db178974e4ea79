"""Quotas and reserved shares through real processes: a put over quota is QuotaExceeded (a
NoSpace) or evicts the tenant's own oldest blocks, as its policy says; one tenant's put storm
leaves another its reserved bytes; usage is per tenant."""

from __future__ import annotations

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import NoSpace, QuotaExceeded
from kvstore.metaclient.client import MetaClient
from kvstore.results import TenantInfo
from kvstore.types import Tier
from kvstore.wire.calls import TenantAdd, TenantToken
from tests.cluster import Cluster

MIB = 1 << 20
BLOCK = 256 << 10


@pytest.fixture(scope="module")
def store():
    cluster = Cluster()
    _, address = cluster.serve("32MiB", "--segment-size", "32MiB")
    yield address
    cluster.close()


def tenant(address: str, name: str, **settings) -> KVClient:
    with MetaClient(address) as admin:
        admin.call(TenantAdd(TenantInfo(name, **settings)))
        token = admin.call(TenantToken(name))[1]
    return KVClient(address, ClientConfig(token=token, transports=("tcp",)))


def blocks(prefix: str, n: int) -> tuple[list[str], list[bytes]]:
    keys = [f"{prefix}/{i}" for i in range(n)]
    return keys, [bytes([i % 251]) * BLOCK for i in range(n)]


def test_a_tenant_refused_over_quota_gets_quota_exceeded_and_keeps_what_it_has(store):
    with tenant(store, "strict", quotas={Tier.DRAM: 1 * MIB}, evict_own=False) as c:
        keys, values = blocks("strict", 4)
        c.put_many(keys, values)
        with pytest.raises(QuotaExceeded) as info:
            c.put("strict/over", b"x" * BLOCK)
        assert isinstance(info.value, NoSpace) and "quota" in str(info.value)
        assert c.get_many(keys) == values
        assert c.stats().used == 1 * MIB


def test_a_tenant_over_quota_evicts_its_own_oldest_blocks_first(store):
    with tenant(store, "rolling", quotas={Tier.DRAM: 1 * MIB}) as c, tenant(store, "bystander") as other:
        other.put("bystander/1", b"b" * BLOCK)
        keys, values = blocks("rolling", 8)
        for key, value in zip(keys, values):
            c.put(key, value)
        assert c.exists_many(keys) == [False] * 4 + [True] * 4
        assert other.get("bystander/1") == b"b" * BLOCK


def test_a_put_storm_leaves_another_tenant_its_reserved_share(store):
    with tenant(store, "steady", reserved={Tier.DRAM: 4 * MIB}) as steady, tenant(store, "storm") as storm:
        keys, values = blocks("steady", 16)  # 4 MiB
        steady.put_many(keys, values)
        for i in range(3 * 32 * MIB // BLOCK):  # three times the store
            storm.put(f"storm/{i}", bytes([i % 251]) * BLOCK)
        assert steady.get_many(keys) == values
        assert steady.stats().used == 4 * MIB
