"""Fuzzed frames on the fast lane and the tcp data plane (hypothesis): each gets a typed error or a
closed connection; the servers keep serving, and no committed byte changes."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.metaclient.client import MetaClient
from kvstore.transport import tcp_wire
from kvstore.wire import frames as fastrpc
from kvstore.wire.calls import ServiceInfo
from tests.cluster import ADMIN_TOKEN, Cluster
from tests.meta_helpers import endpoint_address

COMMITTED = {f"keep/{i}": bytes([i]) * (4096 + i) for i in range(10)}


@pytest.fixture(scope="module")
def target():
    cluster = Cluster()
    _, meta = cluster.serve("64MiB", "--segment-size", "32MiB")
    with KVClient(meta, ClientConfig(transports=("tcp",))) as client:
        client.put_many(list(COMMITTED), list(COMMITTED.values()))
        segment = client.stats().daemons[0].segments[0]
        tcp = endpoint_address(segment, "tcp")
    lane = MetaClient(meta).call(ServiceInfo()).fast_lane_port
    yield meta, lane, tcp
    with KVClient(meta, ClientConfig(transports=("tcp",))) as client:
        assert client.get_many(list(COMMITTED)) == list(COMMITTED.values())
    cluster.close()


def exchange(host: str, port: int, data: bytes) -> None:
    """Send `data`, read whatever comes back until the server closes or goes quiet."""
    with socket.create_connection((host, port), timeout=5) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(2)
            while sock.recv(65536):
                pass
        except OSError:  # reset, closed before we finished, or quiet: each is a refusal
            pass


frames = st.one_of(
    st.binary(max_size=256),
    st.builds(
        lambda n, m, tail: fastrpc.REQUEST.pack(n, m) + tail,
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**16 - 1),
        st.binary(max_size=128),
    ),
    st.builds(lambda tail: fastrpc.hello_frame("fuzz", ADMIN_TOKEN) + tail, st.binary(max_size=256)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=frames)
def test_fuzzed_fast_lane_frames(target, frame):
    meta, lane, _ = target
    exchange(meta.rsplit(":", 1)[0], lane, frame)


requests = st.one_of(
    st.binary(max_size=256),
    st.builds(
        lambda op, id_len, count, tail: (
            tcp_wire.REQUEST_HEADER.pack(tcp_wire.MAGIC, tcp_wire.VERSION, op, id_len, count) + tail
        ),
        st.integers(0, 255),
        st.integers(0, 2**16 - 1),
        st.integers(0, 2**32 - 1),
        st.binary(max_size=512),
    ),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=requests)
def test_fuzzed_tcp_requests(target, request):
    _, _, tcp = target
    host, port = tcp.rsplit(":", 1)
    exchange(host, int(port), request)


def test_after_the_fuzz_everyone_is_served(target):
    meta, _, _ = target
    with KVClient(meta) as client:
        assert client.get_many(list(COMMITTED)) == list(COMMITTED.values())
        client.put("fresh", b"f")
        assert client.get("fresh") == b"f"
