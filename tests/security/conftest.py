from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvstore.metaclient.client import MetaClient
from kvstore.results import TenantInfo
from kvstore.wire.calls import TenantAdd, TenantToken
from tests.cluster import Cluster


@pytest.fixture(scope="module")
def tenants() -> Iterator[tuple[str, dict[str, str]]]:
    """A store with tenants a and b (untrusted with shm) and t (trusted): (address, tokens)."""
    cluster = Cluster()
    _, address = cluster.serve("96MiB", "--segment-size", "32MiB")
    made = {}
    with MetaClient(address) as admin:
        for name, trust in (("a", False), ("b", False), ("t", True)):
            admin.call(TenantAdd(TenantInfo(name, trust_shm=trust)))
            made[name] = admin.call(TenantToken(name))[1]
    yield address, made
    cluster.close()
