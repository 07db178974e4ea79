"""One behavioural suite over every transport: byte-identical round trips, batches, concurrency,
dead and restarted daemons, corruption."""

import threading
import time
import uuid

import numpy as np
import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import ChecksumMismatch, KeyNotFound, TransportError
from kvstore.wire.calls import Get
from tests.cluster import wait_until
from tests.conformance.conftest import FAST_LIVENESS, GPU_TIERS, SERVE_ALL, _tls
from tests.inprocess import InProcessStore

SIZES = [1, 7, 4096, 65_539, 1 << 20, (16 << 20) + 5, 64 << 20]


def payload(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def ns() -> str:
    return uuid.uuid4().hex[:8]


@pytest.mark.parametrize("size", SIZES)
def test_round_trip_is_byte_identical(client, settle, size):
    key, data = f"{ns()}/rt", payload(size, size)
    assert client.put(key, data) is True
    settle(client)
    assert client.get(key) == data
    out = np.zeros(size + 3, dtype=np.uint8)
    assert client.get_into(key, out) == size
    assert out[:size].tobytes() == data and not out[size:].any()
    client.remove(key, force=True)


def test_put_of_existing_key_keeps_first_value(client):
    key = f"{ns()}/same"
    assert client.put(key, b"first") is True
    assert client.put(key, b"second") is False
    assert client.get(key) == b"first"


def test_batch_of_1000_small_blocks(client, settle):
    prefix = ns()
    keys = [f"{prefix}/b{i}" for i in range(1000)]
    values = [payload(i, 1 + i % 300) for i in range(1000)]
    assert all(client.put_many(keys, values))
    settle(client)
    assert client.match_prefix(keys) == 1000
    assert client.get_many(keys) == values
    bufs = [bytearray(400) for _ in keys]
    sizes = client.get_many_into(keys, bufs)
    assert all(bytes(b[:n]) == v for b, n, v in zip(bufs, sizes, values))
    assert client.match_prefix([*keys[:10], f"{prefix}/missing", *keys[10:]]) == 10


def test_get_many_into_reports_misses_without_raising(client):
    key = f"{ns()}/present"
    client.put(key, b"x" * 10)
    results = client.get_many_into([key, f"{ns()}/absent"], [bytearray(10), bytearray(10)], strict=False)
    assert results[0] == 10 and isinstance(results[1], KeyNotFound)


def test_eight_concurrent_clients(store, transport, client_config):
    errors = []

    def worker(n: int) -> None:
        try:
            with KVClient(store, client_config()) as c:
                keys = [f"conc-{transport}-{n}-{i}" for i in range(50)]
                values = [payload(n * 1000 + i, 1000 + 37 * i) for i in range(50)]
                c.put_many(keys, values)
                for _ in range(3):
                    assert c.get_many(keys) == values
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_corrupted_replica_is_detected(client, settle, tier):
    if tier in GPU_TIERS:
        pytest.skip(
            "GPU memory is reachable only inside its daemon: tests/integration/test_gpu_tier.py corrupts it in process"
        )
    key = f"{ns()}/corrupt"
    client.put(key, payload(1, 4096))
    settle(client)
    reply = client.meta.call(Get([key]))
    grant = reply.results[0].grants[0]
    seg = reply.segments[grant.segment_id]
    path = seg.endpoint("shm").address.split("|")[-1]
    with open(path, "r+b") as fh:
        fh.seek(grant.offset + 100)
        byte = fh.read(1)
        fh.seek(grant.offset + 100)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ChecksumMismatch):
        client.get(key)


def assert_the_new_daemon_serves(client: KVClient) -> None:
    """After the daemon holding "before" went and another came: its segments are dropped, and
    the same client object is served by the new one."""
    wait_until(
        lambda: len(client.stats().daemons) == 1 and client.stats().keys == 0,
        what="the gone daemon's segments to be dropped",
    )
    with pytest.raises(KeyNotFound):
        client.get("before")
    client.put("after", b"y" * 100_000)
    assert client.get("after") == b"y" * 100_000


def test_stopped_data_plane_fails_fast_and_restart_is_picked_up_in_process():
    """inproc's form of the killed-daemon case (a daemon in the test's own process cannot be
    SIGKILLed): its data plane stops while its segments stay mounted, then it goes and another
    daemon comes."""
    with (
        InProcessStore(FAST_LIVENESS, dram_size=64 << 20) as store,
        KVClient(store.address, ClientConfig(transports=("inproc",), timeout_s=3.0)) as client,
    ):
        client.put("before", b"x" * 100_000)
        for server in store.daemon.servers:
            server.stop()
        with pytest.raises(TransportError):
            client.get("before")  # at once: no replica is reachable
        store.daemon.stop()
        store.add_daemon(dram_size=64 << 20)
        assert_the_new_daemon_serves(client)


def test_killed_daemon_fails_fast_and_restart_is_picked_up(cluster, transport, pki):
    if transport == "inproc":
        pytest.skip(
            "a daemon in the test's own process cannot be SIGKILLed: "
            "test_stopped_data_plane_fails_fast_and_restart_is_picked_up_in_process is its form"
        )
    meta_tls, daemon_tls = _tls(pki)
    _, address = cluster.meta(FAST_LIVENESS, *meta_tls)
    daemon = cluster.daemon(address, "64MiB", FAST_LIVENESS, *SERVE_ALL, *daemon_tls)
    cfg = ClientConfig(transports=(transport,), timeout_s=3.0, tls_ca=pki.ca)
    with KVClient(address, cfg) as client:
        client.put("before", b"x" * 100_000)
        daemon.kill()
        started = time.monotonic()
        with pytest.raises((TransportError, KeyNotFound)):
            client.get("before")
        assert time.monotonic() - started < 2 * cfg.timeout_s  # failed, not hung

        cluster.daemon(address, "64MiB", FAST_LIVENESS, *SERVE_ALL, *daemon_tls)
        assert_the_new_daemon_serves(client)
