"""The metadata fast lane: same answers as gRPC, a version handshake, bad frames refused, gRPC as
the fallback, and a service that restarted on another lane port found again."""

import socket

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import ErrorCode, InvalidArgument, KeyNotFound
from kvstore.metaclient.client import MetaClient
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire import frames as fastrpc
from kvstore.wire.calls import Exists, PutStart, ServiceInfo
from tests.cluster import ADMIN_TOKEN, Cluster, wait_until


@pytest.fixture(scope="module")
def served():
    c = Cluster()
    _, address = c.serve("64MiB")
    yield address
    c.close()


def lane_port(address: str) -> int:
    with MetaClient(address) as meta:
        return meta.call(ServiceInfo()).fast_lane_port


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """(status, payload) of one response frame, or (-1, b"") if the service closed first."""
    try:
        (_, status), body = fastrpc.recv_frame(sock, fastrpc.RESPONSE)
    except (EOFError, ConnectionResetError):
        return -1, b""
    return status, body


def greeted(address: str) -> socket.socket:
    host, _ = address.rsplit(":", 1)
    sock = socket.create_connection((host, lane_port(address)), timeout=5)
    sock.sendall(fastrpc.hello_frame("tests", ADMIN_TOKEN))
    status, body = read_frame(sock)
    assert status == fastrpc.OK and pb.FastLaneWelcome.FromString(body).protocol == fastrpc.PROTOCOL
    return sock


def test_both_lanes_give_the_same_answers(served):
    keys = [f"lane/{i}" for i in range(50)]
    with (
        KVClient(served, ClientConfig(fast_lane=True)) as fast,
        KVClient(served, ClientConfig(fast_lane=False)) as slow,
    ):
        fast.put_many(keys[:25], [bytes([i]) * 100 for i in range(25)])
        slow.put_many(keys[25:], [bytes([i]) * 100 for i in range(25, 50)])
        for c in (fast, slow):
            assert c.match_prefix(keys) == 50
            assert c.get_many(keys) == [bytes([i]) * 100 for i in range(50)]
            with pytest.raises(KeyNotFound):
                c.get("lane/missing")
            with pytest.raises(InvalidArgument):
                c.meta.call(PutStart(["x"], []))
        assert fast.meta.fast_lane_port == lane_port(served) and slow.meta.fast_lane_port == 0


@pytest.mark.parametrize(
    "frame",
    [
        b"garbage!",
        fastrpc.REQUEST.pack(10, 999) + bytes(10),  # no such method
        fastrpc.REQUEST.pack(1 << 31, fastrpc.METHOD_IDS["Get"]),  # absurd length
        fastrpc.REQUEST.pack(5, fastrpc.METHOD_IDS["Get"]) + b"\xff" * 5,  # not a GetRequest
        fastrpc.REQUEST.pack(2, fastrpc.HELLO) + b"\xff\xff",  # a second hello
    ],
)
def test_bad_frames_are_refused_and_the_lane_keeps_serving(served, frame):
    with greeted(served) as s:
        s.sendall(frame)
        status, body = read_frame(s)
        assert status != fastrpc.OK
        if status != -1:
            assert status == ErrorCode.INVALID_ARGUMENT and pb.ErrorDetail.FromString(body).message
    with KVClient(served) as c:
        assert c.exists("lane/never") is False


@pytest.mark.parametrize("first", [fastrpc.REQUEST.pack(0, fastrpc.METHOD_IDS["Exists"]), b"\x01" * 16])
def test_a_call_before_the_hello_is_refused_and_closed(served, first):
    host, _ = served.rsplit(":", 1)
    with socket.create_connection((host, lane_port(served)), timeout=5) as s:
        s.sendall(first)
        status, _ = read_frame(s)
        assert status == ErrorCode.INVALID_ARGUMENT
        assert read_frame(s) == (-1, b"")  # and the connection is closed


def test_a_client_of_another_protocol_is_refused_and_falls_back_to_grpc(served, monkeypatch):
    monkeypatch.setattr(fastrpc, "PROTOCOL", fastrpc.PROTOCOL + 1)  # this process is "another version"
    with KVClient(served) as c:
        c.put("lane/other-version", b"v")
        assert c.get("lane/other-version") == b"v"
        assert c.meta.fast_lane_port == 0


def test_a_restarted_service_is_found_on_its_new_lane_port(tmp_path):
    cluster = Cluster()
    try:
        proc, address = cluster.meta()
        port = address.rsplit(":", 1)[1]
        with MetaClient(address, timeout_s=2) as meta:
            assert meta.call(Exists(["k"])) == [False]
            first = meta.fast_lane_port
            assert first
            proc.kill()
            cluster.meta(None, "--port", port)  # same gRPC port, a new fast-lane port
            wait_until(lambda: _answers(meta), what="the restarted service to answer")
            wait_until(
                lambda: meta.call(Exists(["k"])) == [False] and meta.fast_lane_port not in (0, first),
                timeout=20,
                what="the client to find the new fast lane",
            )
            assert meta.fast_lane_port == lane_port(address)
    finally:
        cluster.close()


def _answers(meta: MetaClient) -> bool:
    try:
        meta.call(Exists(["k"]))
        return True
    except Exception:  # noqa: BLE001 - not yet
        return False
