"""The behavioural suite runs once per transport and per tier. Every transport but `inproc` runs
against real `kvstore meta` and `kvstore daemon` processes; `inproc` runs the same cases against
the same store in this process (tests/inprocess.py), in milliseconds."""

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import Unavailable
from kvstore.transport import registry
from tests.cluster import Cluster, wait_until
from tests.inprocess import InProcessStore

TRANSPORTS = ["shm", "tcp", "mooncake", "nixl", "ucx", "tls", "inproc"]
# Transports whose transfers are one-sided (no daemon code runs per request, so no receipts).
ONE_SIDED = ("mooncake", "nixl")
# Daemons offer shm and tcp unless told otherwise; these serve every process-level transport whose library is
# installed (a missing one is skipped with a warning naming its extra). The service speaks TLS
# too (a client trusting a CA for tls daemons checks the service against it as well).
SERVE_ALL = ("--transports", ",".join(t for t in TRANSPORTS if t != "inproc"))


def _tls(pki) -> tuple[list[str], list[str]]:
    """(service flags, daemon flags) for TLS with the test CA's server certificate."""
    cert = ["--tls-cert", pki.server_cert, "--tls-key", pki.server_key]
    return cert, [*cert, "--tls-ca", pki.ca]


FAST_LIVENESS = {
    "KVSTORE_META_HEARTBEAT_TTL_S": "1.0",
    "KVSTORE_META_SILENT_GRACE_S": "0.5",  # the daemons these tests stop are gone, not cut off
    "KVSTORE_META_TICK_INTERVAL_S": "0.1",
    "KVSTORE_DAEMON_HEARTBEAT_INTERVAL_S": "0.2",
}


# The ssd variant demotes every unleased block at once and never promotes, so reads after
# `settle` come from SSD.
ALL_ON_SSD = {
    "KVSTORE_META_HIGH_WATERMARK": "1e-12",
    "KVSTORE_META_LOW_WATERMARK": "1e-13",
    "KVSTORE_META_PROMOTE_AFTER_HITS": "1000000000",
}


# gpu-host: the GPU tier's code path with its segment in host memory (gpu_device=-1), on any host.
GPU_TIERS = ("gpu", "gpu-host")


@pytest.fixture(scope="module", params=["dram", "ssd", "gpu-host", pytest.param("gpu", marks=pytest.mark.gpu)])
def tier(request):
    return request.param


@pytest.fixture(scope="module")
def shared_cluster(tier, tmp_path_factory, pki):
    c = Cluster()
    meta_tls, daemon_tls = _tls(pki)
    if tier == "dram":
        _, address = c.meta(None, *meta_tls)
        c.daemon(address, "640MiB", None, "--segment-size", "128MiB", *SERVE_ALL, *daemon_tls)
    elif tier in GPU_TIERS:  # puts land on the GPU tier first
        _, address = c.meta(None, *meta_tls)
        env = {"KVSTORE_DAEMON_GPU_DEVICE": "-1"} if tier == "gpu-host" else None
        c.daemon(address, "640MiB", env, "--segment-size", "128MiB", "--gpu", "640MiB", *SERVE_ALL, *daemon_tls)
    else:
        _, address = c.meta(ALL_ON_SSD, *meta_tls)
        c.daemon(
            address,
            "640MiB",
            None,
            "--segment-size",
            "128MiB",
            *SERVE_ALL,
            *daemon_tls,
            "--ssd-dir",
            str(tmp_path_factory.mktemp("ssd")),
            "--ssd",
            "1GiB",
        )
    yield address
    c.close()


@pytest.fixture(scope="module")
def in_process_store(tier, tmp_path_factory):
    """The store of shared_cluster, in this process: what the inproc cases run against."""
    settings: dict[str, object] = {"dram_size": 640 << 20, "segment_size": 128 << 20}
    if tier in GPU_TIERS:  # as shared_cluster: puts land on the GPU tier first
        settings["gpu_size"] = 640 << 20
        if tier == "gpu-host":
            settings["gpu_device"] = -1
    if tier == "ssd":
        settings.update(ssd_dir=str(tmp_path_factory.mktemp("ssd-inproc")), ssd_size=1 << 30)
    with InProcessStore(ALL_ON_SSD if tier == "ssd" else None, **settings) as store:
        yield store.address


@pytest.fixture
def store(request, transport, tier) -> str:
    """The address of the store this transport's cases run against on `tier` (started once per
    module; `tier` is named so that every case using it runs on every tier)."""
    return request.getfixturevalue("in_process_store" if transport == "inproc" else "shared_cluster")


@pytest.fixture
def client_config(transport, pki):
    """A ClientConfig for `transport`: the inproc store speaks plain gRPC, the processes TLS."""

    def make(**settings) -> ClientConfig:
        tls_ca = "" if transport == "inproc" else pki.ca
        return ClientConfig(transports=(transport,), tls_ca=tls_ca, **settings)

    return make


@pytest.fixture
def settle(tier):
    """Wait until the blocks just written have reached the tier under test."""

    def wait(client: KVClient) -> None:
        if tier == "ssd":  # blocks, not bytes: a shm writer's region keeps its DRAM reserved until it lapses
            wait_until(lambda: _dram_blocks(client) == 0, what="every block to be demoted to SSD")

    return wait


def _dram_blocks(client: KVClient) -> int:
    return next((t.blocks for t in client.stats().tiers if t.tier.value == "dram"), 0)


@pytest.fixture(params=TRANSPORTS)
def transport(request):
    try:
        registry.client_class(request.param)
    except Unavailable as exc:
        pytest.skip(str(exc))
    tier = request.getfixturevalue("tier") if "tier" in request.fixturenames else None
    if tier == "ssd" and request.param in ONE_SIDED:
        pytest.skip(
            f"SSD segments are not memory, so {request.param} (one-sided: no daemon code runs per "
            "request) does not offer them; they are reached over shm, tcp or ucx"
        )
    if tier in GPU_TIERS and request.param in ("shm", *ONE_SIDED):
        pytest.skip(
            f"GPU segments are not offered over {request.param}; they are reached over tcp "
            "or ucx (staged through host memory)"
        )
    return request.param


@pytest.fixture
def client(store, client_config):
    with KVClient(store, client_config(timeout_s=20)) as c:
        yield c
