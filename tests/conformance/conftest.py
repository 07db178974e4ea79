"""The behavioural suite runs once per transport (and, as tiers are added, per tier)."""

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import Unavailable
from kvstore.transport import registry
from tests.cluster import Cluster, wait_until

TRANSPORTS = ["shm", "tcp", "mooncake", "ucx"]
# Daemons offer shm and tcp unless told otherwise; these serve every transport whose library is
# installed (a missing one is skipped with a warning naming its extra).
SERVE_ALL = ("--transports", ",".join(TRANSPORTS))
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
        c.daemon(address, "640MiB", None, "--segment-size", "128MiB", *SERVE_ALL)
    elif tier == "gpu":                      # puts land on the GPU tier first
        _, address = c.meta()
        c.daemon(address, "640MiB", None, "--segment-size", "128MiB", "--gpu", "640MiB", *SERVE_ALL)
    else:
        _, address = c.meta(ALL_ON_SSD)
        c.daemon(address, "640MiB", None, "--segment-size", "128MiB", *SERVE_ALL,
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
    try:
        registry.client_class(request.param)
    except Unavailable as exc:
        pytest.skip(str(exc))
    tier = request.getfixturevalue("tier") if "tier" in request.fixturenames else None
    if tier == "ssd" and request.param == "mooncake":
        pytest.skip("SSD segments are not memory, so mooncake (one-sided: no daemon code runs per "
                    "request) does not offer them; they are reached over shm, tcp or ucx")
    if tier == "gpu" and request.param in ("shm", "mooncake"):
        pytest.skip(f"GPU segments are not offered over {request.param}; they are reached over tcp "
                    "or ucx (staged through host memory)")
    return request.param


@pytest.fixture
def client(shared_cluster, transport, tier):
    with KVClient(shared_cluster, ClientConfig(transports=(transport,), timeout_s=20)) as c:
        yield c
