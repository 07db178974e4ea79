"""The behavioural suite runs once per transport (and, as tiers are added, per tier)."""

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from tests.cluster import Cluster, wait_until

TRANSPORTS = ["shm", "tcp"]
FAST_LIVENESS = {"KVSTORE_META_HEARTBEAT_TTL_S": "1.0", "KVSTORE_META_TICK_INTERVAL_S": "0.1",
                 "KVSTORE_DAEMON_HEARTBEAT_INTERVAL_S": "0.2"}


# The ssd variant demotes every unleased block at once and never promotes, so reads after
# `settle` come from SSD.
ALL_ON_SSD = {"KVSTORE_META_HIGH_WATERMARK": "1e-12", "KVSTORE_META_LOW_WATERMARK": "1e-13",
              "KVSTORE_META_PROMOTE_AFTER_HITS": "1000000000"}


@pytest.fixture(scope="module", params=["dram", "ssd", pytest.param("gpu", marks=pytest.mark.gpu)])
def tier(request):
    return request.param


@pytest.fixture(scope="module")
def shared_cluster(tier, tmp_path_factory):
    c = Cluster()
    if tier == "dram":
        _, address = c.meta()
        c.daemon(address, "640MiB", None, "--segment-size", "128MiB")
    elif tier == "gpu":                      # puts land on the GPU tier first
        _, address = c.meta()
        c.daemon(address, "640MiB", None, "--segment-size", "128MiB", "--gpu", "640MiB")
    else:
        _, address = c.meta(ALL_ON_SSD)
        c.daemon(address, "640MiB", None, "--segment-size", "128MiB",
                 "--ssd-dir", str(tmp_path_factory.mktemp("ssd")), "--ssd", "1GiB")
    yield address
    c.close()


@pytest.fixture
def settle(tier):
    """Wait until the blocks just written have reached the tier under test."""
    def wait(client: KVClient) -> None:
        if tier == "ssd":
            wait_until(lambda: _dram_used(client) == 0, what="every block to be demoted to SSD")
    return wait


def _dram_used(client: KVClient) -> int:
    return next((t.used for t in client.stats().tiers if t.tier.value == "dram"), 0)


@pytest.fixture(params=TRANSPORTS)
def transport(request):
    return request.param


@pytest.fixture
def client(shared_cluster, transport, tier):
    if tier == "gpu" and transport == "shm":
        pytest.skip("GPU segments are not mapped by shm; they are reached over tcp (staged) or mooncake")
    with KVClient(shared_cluster, ClientConfig(transports=(transport,), timeout_s=20)) as c:
        yield c
