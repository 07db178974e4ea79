"""10^4 fuzzed HELLO frames on the fast lane (hypothesis): every one is answered with an error
frame and a closed connection (never a WELCOME for a token the service did not make), the
service keeps serving, and no tenant's byte or existence bit changes or leaks."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import ErrorCode
from kvstore.metaclient.client import MetaClient
from kvstore.v1 import meta_pb2 as pb
from kvstore.version import __version__
from kvstore.wire import frames as fastrpc
from kvstore.wire.calls import ServiceInfo

pytestmark = pytest.mark.faults

SECRETS = {f"hs/{i}": b"tenant a's %d" % i for i in range(8)}


@pytest.fixture(scope="module")
def lane(tenants):
    address, made = tenants
    with KVClient(address, ClientConfig(token=made["a"])) as a:
        a.put_many(list(SECRETS), list(SECRETS.values()))
    yield MetaClient(address).call(ServiceInfo()).fast_lane_port
    with KVClient(address, ClientConfig(token=made["a"], transports=("tcp",))) as a:
        assert a.get_many(list(SECRETS)) == list(SECRETS.values())
    with KVClient(address, ClientConfig(token=made["b"])) as b:
        assert b.exists_many(list(SECRETS)) == [False] * len(SECRETS)


def _hello(protocol: int, version: str, token: str) -> bytes:
    payload = pb.FastLaneHello(protocol=protocol, client_version=version, token=token).SerializeToString()
    return fastrpc.REQUEST.pack(len(payload), fastrpc.HELLO) + payload


tokens = st.one_of(
    st.text(max_size=80),
    st.from_regex(r"kvst_[0-9a-f]{8}_[A-Za-z0-9_-]{43}", fullmatch=True),
    st.from_regex(r"kvs[adt]_[A-Za-z0-9_-]{0,60}", fullmatch=True),
)
frames = st.one_of(
    st.builds(_hello, st.just(fastrpc.PROTOCOL), st.just(__version__), tokens),
    st.builds(_hello, st.integers(0, 2**32 - 1), st.text(max_size=20), tokens),
    st.builds(lambda body: fastrpc.REQUEST.pack(len(body), fastrpc.HELLO) + body, st.binary(max_size=200)),
    st.builds(
        lambda n, body: fastrpc.REQUEST.pack(n, fastrpc.HELLO) + body, st.integers(0, 5000), st.binary(max_size=64)
    ),
    st.builds(
        lambda m, body: fastrpc.REQUEST.pack(len(body), m) + body, st.integers(1, 2**16 - 1), st.binary(max_size=64)
    ),
)


def _answer(port: int, frame: bytes) -> tuple[int | None, bool]:
    """(status of the first response frame or None, whether the service closed after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)  # a frame announcing more than it carries ends here
            (_, status), _ = fastrpc.recv_frame(sock, fastrpc.RESPONSE)
        except (EOFError, OSError):
            return None, True
        try:
            return status, sock.recv(1) == b""
        except OSError:
            return status, True


@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(frame=frames)
def test_fuzzed_hellos_are_refused_and_the_connection_closed(lane, frame):
    status, closed = _answer(lane, frame)
    assert status != fastrpc.OK, "a WELCOME for a token the service never made"
    assert closed
    assert status in (None, ErrorCode.UNAUTHENTICATED, ErrorCode.INVALID_ARGUMENT)
