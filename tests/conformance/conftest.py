"""The behavioural suite runs once per transport (and, as tiers are added, per tier)."""

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from tests.cluster import Cluster

TRANSPORTS = ["shm", "tcp"]
FAST_LIVENESS = {"KVSTORE_META_HEARTBEAT_TTL_S": "1.0", "KVSTORE_META_TICK_INTERVAL_S": "0.1",
                 "KVSTORE_DAEMON_HEARTBEAT_INTERVAL_S": "0.2"}


@pytest.fixture(scope="module")
def shared_cluster():
    c = Cluster()
    _, address = c.meta()
    c.daemon(address, "640MiB", None, "--segment-size", "128MiB")
    yield address
    c.close()


@pytest.fixture(params=TRANSPORTS)
def transport(request):
    return request.param


@pytest.fixture
def client(shared_cluster, transport):
    with KVClient(shared_cluster, ClientConfig(transports=(transport,), timeout_s=20)) as c:
        yield c
