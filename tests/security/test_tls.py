"""TLS on the control plane (gRPC and the fast lane) and on the data plane (the tls transport),
with certificates openssl made: the right CA works on both lanes, a pinned self-signed
certificate works, the wrong CA, a plaintext client of a TLS service and a TLS client of a
plaintext one fail typed, mutual TLS refuses a client without a certificate; the service keeps
serving through all of it."""

from __future__ import annotations

import dataclasses

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import TransportError, Unavailable
from kvstore.metaclient.client import MetaClient
from kvstore.tls import TlsFiles
from kvstore.wire.calls import Stats
from tests.cluster import Cluster


@pytest.fixture(scope="module")
def tls_store(pki):
    """`kvstore serve` speaking TLS on gRPC and the fast lane, its daemon offering tls and tcp."""
    cluster = Cluster()
    _, address = cluster.serve(
        "64MiB", "--tls-cert", pki.server_cert, "--tls-key", pki.server_key,
        "--transports", "shm,tcp,tls", "--daemon-tls-cert", pki.server_cert, "--daemon-tls-key", pki.server_key,
        "--daemon-tls-ca", pki.ca,
    )  # fmt: skip
    yield address
    cluster.close()


@pytest.mark.parametrize("lane", [True, False], ids=["fast-lane", "grpc"])
def test_a_client_trusting_the_ca_works_on_both_lanes_and_the_tls_transport(tls_store, pki, lane):
    config = ClientConfig(tls_ca=pki.ca, fast_lane=lane, transports=("tls",))
    with KVClient(tls_store, config) as client:
        value = bytes(range(256)) * 4096  # 1 MiB through TLS records
        client.put(f"tls/{lane}", value)
        assert client.get(f"tls/{lane}") == value
        assert bool(client.meta.fast_lane_port) is lane


@pytest.mark.parametrize(
    "config",
    [ClientConfig(), ClientConfig(fast_lane=False)],
    ids=["plaintext-fast-lane", "plaintext-grpc"],
)
def test_a_plaintext_client_of_a_tls_service_fails_typed(tls_store, pki, config):
    with pytest.raises(Unavailable), KVClient(tls_store, dataclasses.replace(config, timeout_s=3)) as c:
        c.exists_many(["k"])
    _still_serving(tls_store, pki)


@pytest.mark.parametrize("lane", [True, False], ids=["fast-lane", "grpc"])
def test_the_wrong_ca_fails_typed(tls_store, pki, lane):
    with (
        pytest.raises(Unavailable),
        KVClient(tls_store, ClientConfig(tls_ca=pki.other_ca, fast_lane=lane, timeout_s=3)) as c,
    ):
        c.exists_many(["k"])
    _still_serving(tls_store, pki)


def test_a_tls_daemon_the_clients_ca_did_not_sign_is_refused_typed(cluster, pki):
    _, address = cluster.serve(
        "64MiB", "--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--transports", "tls",
        "--daemon-tls-cert", pki.pinned_cert, "--daemon-tls-key", pki.pinned_key, "--daemon-tls-ca", pki.ca,
    )  # fmt: skip
    with MetaClient(address, tls=TlsFiles(ca=pki.ca)) as meta:
        assert meta.call(Stats()).daemons  # the service is trusted; its daemon's certificate is not
    config = ClientConfig(tls_ca=pki.ca, transports=("tls",), timeout_s=3, replica_timeout_s=1)
    with pytest.raises(TransportError), KVClient(address, config) as client:
        client.put("tls/untrusted-daemon", b"x")


def test_a_tls_client_of_a_plaintext_service_fails_typed(cluster, pki):
    _, address = cluster.serve("64MiB")
    for lane in (True, False):
        with (
            pytest.raises(Unavailable),
            KVClient(address, ClientConfig(tls_ca=pki.ca, fast_lane=lane, timeout_s=3)) as c,
        ):
            c.exists_many(["k"])
    with KVClient(address) as plain:
        plain.put("plain", b"still")


def test_a_pinned_self_signed_certificate_works(cluster, pki):
    _, address = cluster.serve("64MiB", "--tls-cert", pki.pinned_cert, "--tls-key", pki.pinned_key)
    for lane in (True, False):
        with KVClient(address, ClientConfig(tls_ca=pki.pinned_cert, fast_lane=lane)) as client:
            client.put(f"pinned/{lane}", b"ok")
            assert client.get(f"pinned/{lane}") == b"ok"


def test_mutual_tls_refuses_a_client_without_a_certificate(cluster, pki):
    _, address = cluster.serve("64MiB", "--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-ca", pki.ca)
    for lane in (True, False):
        with (
            pytest.raises(Unavailable),
            KVClient(address, ClientConfig(tls_ca=pki.ca, fast_lane=lane, timeout_s=3)) as c,
        ):
            c.exists_many(["k"])
        mutual = ClientConfig(tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key, fast_lane=lane)
        with KVClient(address, mutual) as client:
            client.put(f"mutual/{lane}", b"ok")
            assert client.get(f"mutual/{lane}") == b"ok"


def _still_serving(address: str, pki) -> None:
    with KVClient(address, ClientConfig(tls_ca=pki.ca, transports=("tcp",))) as client:
        if not client.exists_many(["tls/still"])[0]:
            client.put("tls/still", b"serving")
        assert client.get("tls/still") == b"serving"
